/*
 * fuzz_canon.c - request bodies: strict parsing, the canonical form and the
 * fingerprint (canon_parse, canon_write, fp_request).
 *
 * The input is a request body, as a client sends it. For every body that
 * parses, the canonical form must be strict JSON again, its own canonical
 * form (so a replay of the stored input fingerprints the same), free of
 * whitespace outside strings, with every object's keys strictly ascending;
 * no integer may have been silently clamped to a 64-bit limit, and no
 * string may have held U+0000.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "core/canon.h"
#include "core/fp.h"
#include "fuzz.h"

#define DEPTH 64 /* the default max_depth */

/* Every object's keys ascend strictly: walks the value parsed back from
 * the canonical form. */
static void check_keys(struct json_object *v)
{
	switch (json_object_get_type(v)) {
	case json_type_object: {
		const char *prev = NULL;
		json_object_object_foreach(v, key, val)
		{
			FUZZ_CHECK(prev == NULL || strcmp(prev, key) < 0, "keys \"%s\", \"%s\"",
			           prev, key);
			prev = key;
			check_keys(val);
		}
		break;
	}
	case json_type_array:
		for (size_t i = 0; i < json_object_array_length(v); i++)
			check_keys(json_object_array_get_idx(v, i));
		break;
	default: break;
	}
}

/* json-c saturates integers it cannot hold to a 64-bit limit: an integer
 * at a limit in the value parsed from the body must be written so in the
 * body (larger ones are read as doubles). */
static void check_ints(struct json_object *v, const char *body, size_t len)
{
	char lit[32];
	int64_t i;

	switch (json_object_get_type(v)) {
	case json_type_object: {
		json_object_object_foreach(v, key, val)
		{
			(void)key;
			check_ints(val, body, len);
		}
		break;
	}
	case json_type_array:
		for (size_t k = 0; k < json_object_array_length(v); k++)
			check_ints(json_object_array_get_idx(v, k), body, len);
		break;
	case json_type_int:
		i = json_object_get_int64(v);
		if (i == INT64_MIN)
			snprintf(lit, sizeof(lit), "%" PRId64, i);
		else if (i == INT64_MAX && json_object_get_uint64(v) == UINT64_MAX)
			snprintf(lit, sizeof(lit), "%" PRIu64, UINT64_MAX);
		else
			break;
		FUZZ_CHECK(memmem(body, len, lit, strlen(lit)) != NULL,
		           "%s in the parsed body, not in its text", lit);
		break;
	default: break;
	}
}

/* No insignificant whitespace: none outside strings. */
static void check_compact(const char *s, size_t n)
{
	int in_string = 0;

	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (in_string) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_string = 0;
		} else if (c == '"') {
			in_string = 1;
		} else {
			FUZZ_CHECK(c != ' ' && c != '\n' && c != '\r' && c != '\t',
			           "whitespace at byte %zu of %.*s", i, (int)n, s);
		}
	}
}

/* 1 when a string in the body (which parsed, so is well-formed) holds the
 * escape \u0000, which the README promises to refuse. */
static int has_nul_escape(const char *s, size_t n)
{
	int in_string = 0;

	for (size_t i = 0; i < n; i++) {
		if (!in_string) {
			in_string = s[i] == '"';
		} else if (s[i] == '"') {
			in_string = 0;
		} else if (s[i] == '\\' && i + 1 < n) {
			if (n - i >= 6 && memcmp(s + i, "\\u0000", 6) == 0)
				return 1;
			i++;
		}
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *body = (const char *)data;
	struct buf canon = BUF_INIT, again = BUF_INIT;
	struct json_object *v, *w = NULL;
	uint8_t fp1[FP_LEN], fp2[FP_LEN];
	struct err e = { 0 };

	v = canon_parse(body, size, DEPTH, &e);
	if (v == NULL) {
		/* Refused, or the JSON null document: always with a reason. */
		FUZZ_CHECK(e.code == ERR_INPUT && e.msg[0] != '\0', "code %d", (int)e.code);
		return 0;
	}
	if (canon_write(&canon, v, &e) < 0) {
		FUZZ_CHECK(e.code == ERR_INPUT, "canon_write: code %d: %s", (int)e.code, e.msg);
		goto out;
	}
	FUZZ_CHECK(!canon.oom, "out of memory");
	FUZZ_CHECK(!has_nul_escape(body, size), "U+0000 accepted: %.*s", (int)canon.len,
	           canon.data);
	check_compact(canon.data, canon.len);

	w = canon_parse(canon.data, canon.len, DEPTH, &e);
	FUZZ_CHECK(w != NULL, "the canonical form %.*s does not parse: %s", (int)canon.len,
	           canon.data, e.msg);
	FUZZ_CHECK(canon_write(&again, w, &e) == 0, "%s", e.msg);
	FUZZ_CHECK(again.len == canon.len && memcmp(again.data, canon.data, canon.len) == 0,
	           "not its own canonical form: %.*s -> %.*s", (int)canon.len, canon.data,
	           (int)again.len, again.data);
	check_keys(w);
	check_ints(v, body, size);

	/* What a replay of the stored input fingerprints is what this one did;
	 * moving a byte from the body to the path changes the fingerprint. */
	fp_request(fp1, "POST", "/v1/workflows", canon.data, canon.len);
	fp_request(fp2, "POST", "/v1/workflows", again.data, again.len);
	FUZZ_CHECK(memcmp(fp1, fp2, FP_LEN) == 0, "fingerprints differ");
	if (canon.len > 0 && canon.data[0] != '\0') {
		char path[32];
		snprintf(path, sizeof(path), "/v1/workflows%c", canon.data[0]);
		fp_request(fp2, "POST", path, canon.data + 1, canon.len - 1);
		FUZZ_CHECK(memcmp(fp1, fp2, FP_LEN) != 0,
		           "a shifted boundary kept the fingerprint");
	}
out:
	json_object_put(v);
	json_object_put(w);
	buf_free(&canon);
	buf_free(&again);
	return 0;
}
