/* fp.c - BLAKE2b fingerprints and token hashes (see fp.h). */
#include "core/fp.h"

#include <blake2.h>

void fp_hash(uint8_t out[FP_LEN], size_t nparts, const void *const *parts, const size_t *lens)
{
	blake2b_state st;

	blake2b_init(&st, FP_LEN);
	for (size_t i = 0; i < nparts; i++) {
		uint8_t len8[8];
		uint64_t l = lens[i];
		for (int b = 0; b < 8; b++)
			len8[b] = (uint8_t)(l >> (8 * b));
		blake2b_update(&st, len8, sizeof(len8));
		blake2b_update(&st, parts[i], lens[i]);
	}
	blake2b_final(&st, out, FP_LEN);
}

static void request_hash(uint8_t out[FP_LEN], const char *tag, size_t tag_len, const char *method,
                         const char *path, const char *body, size_t body_len)
{
	size_t ml = 0, pl = 0;

	while (method[ml])
		ml++;
	while (path[pl])
		pl++;
	const void *parts[] = { tag, method, path, body };
	const size_t lens[] = { tag_len, ml, pl, body_len };
	fp_hash(out, 4, parts, lens);
}

void fp_request_bytes(uint8_t out[FP_LEN], const char *method, const char *path, const char *body,
                      size_t body_len)
{
	static const char tag[] = "idemflow request bytes v1";

	request_hash(out, tag, sizeof(tag) - 1, method, path, body, body_len);
}

void fp_request(uint8_t out[FP_LEN], const char *method, const char *path, const char *canon_body,
                size_t body_len)
{
	static const char tag[] = "idemflow request v1";

	request_hash(out, tag, sizeof(tag) - 1, method, path, canon_body, body_len);
}

void fp_token(uint8_t out[FP_LEN], const char *token, size_t len)
{
	blake2b_state st;

	/* Plain BLAKE2b-256, so an operator can check a hash with b2sum -l 256. */
	blake2b_init(&st, FP_LEN);
	blake2b_update(&st, (const uint8_t *)token, len);
	blake2b_final(&st, out, FP_LEN);
}

void fp_hex(char *out, const uint8_t *p, size_t n)
{
	static const char hex[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = hex[p[i] >> 4];
		out[2 * i + 1] = hex[p[i] & 15];
	}
	out[2 * n] = '\0';
}
