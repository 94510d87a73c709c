/*
 * fp.h - BLAKE2b digests: request fingerprints and token hashes.
 *
 * libb2's one-shot blake2b() takes its arguments in a different order from
 * the BLAKE2 reference code; everything here goes through fp_hash so the
 * order is written down exactly once.
 */
#ifndef IDF_FP_H
#define IDF_FP_H

#include <stddef.h>
#include <stdint.h>

#define FP_LEN 32 /* BLAKE2b-256 */

/* out[FP_LEN] = BLAKE2b-256 of the n parts (ptr, len pairs), each part
 * preceded by its length so that part boundaries cannot be shifted. */
void fp_hash(uint8_t out[FP_LEN], size_t nparts, const void *const *parts, const size_t *lens);

/* The fingerprint of a request: method, path and canonical body. */
void fp_request(uint8_t out[FP_LEN], const char *method, const char *path, const char *canon_body,
                size_t body_len);

/* The same over the body exactly as received (another tag: the two are
 * never compared with each other). */
void fp_request_bytes(uint8_t out[FP_LEN], const char *method, const char *path, const char *body,
                      size_t body_len);

/* The stored form of a bearer token: plain BLAKE2b-256 of its text. */
void fp_token(uint8_t out[FP_LEN], const char *token, size_t len);

/* Write 2*n lowercase hex digits plus NUL into out. */
void fp_hex(char *out, const uint8_t *p, size_t n);

#endif
