/*
 * openapi.h - the API's contract, doc/openapi.yaml, as JSON: the bytes
 * GET /v1/openapi.json answers with.
 *
 * Made at build time by scripts/embed-openapi (app/server/openapi_json.c,
 * generated): the server carries the document, so it answers without a
 * data directory, and always with the contract of the build it runs.
 */
#ifndef IDF_OPENAPI_H
#define IDF_OPENAPI_H

#include <stddef.h>

/* The document, openapi_json_len bytes of ASCII JSON (NUL-terminated). */
extern const char openapi_json[];
extern const size_t openapi_json_len;

/* The base the document's problem type URIs are written with (its
 * x-problem-base-uri, the default problem_base_uri): GET /v1/openapi.json
 * answers with the configured base in its place. */
extern const char openapi_problem_base[];

#endif
