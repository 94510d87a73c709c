/* test_fp.c - fingerprints, token hashes and generated identifiers. */
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "core/fp.h"
#include "core/ids.h"

static void hex_of(char out[2 * FP_LEN + 1], const char *m, const char *p, const char *body)
{
	uint8_t d[FP_LEN];

	fp_request(d, m, p, body, strlen(body));
	fp_hex(out, d, FP_LEN);
}

Test(fp, blake2b_matches_the_reference_vector)
{
	/* Tokens are hashed as plain BLAKE2b-256, so `b2sum -l 256` checks them. */
	uint8_t d[FP_LEN];
	char hex[2 * FP_LEN + 1];
	fp_token(d, "abc", 3);
	fp_hex(hex, d, FP_LEN);
	cr_assert_str_eq(hex, "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
}

Test(fp, same_request_same_fingerprint)
{
	char a[65], b[65];

	hex_of(a, "POST", "/v1/workflows", "{\"type\":\"x\"}");
	hex_of(b, "POST", "/v1/workflows", "{\"type\":\"x\"}");
	cr_assert_str_eq(a, b);
}

Test(fp, method_path_and_body_each_change_the_fingerprint)
{
	char base[65], other[65];

	hex_of(base, "POST", "/v1/workflows", "{\"type\":\"x\"}");
	hex_of(other, "PUT", "/v1/workflows", "{\"type\":\"x\"}");
	cr_assert_str_neq(base, other);
	hex_of(other, "POST", "/v1/workflow", "{\"type\":\"x\"}");
	cr_assert_str_neq(base, other);
	hex_of(other, "POST", "/v1/workflows", "{\"type\":\"y\"}");
	cr_assert_str_neq(base, other);
}

Test(fp, part_boundaries_cannot_be_shifted)
{
	char a[65], b[65];

	/* Without length prefixes both would hash "POST/v1/x{}". */
	hex_of(a, "POST", "/v1/x", "{}");
	hex_of(b, "POST/", "v1/x", "{}");
	cr_assert_str_neq(a, b);
}

Test(ids, uuid7_is_well_formed_and_time_ordered)
{
	char a[IDS_UUID_LEN + 1], b[IDS_UUID_LEN + 1];

	cr_assert_eq(ids_uuid7(a), 0);
	usleep(2000);
	cr_assert_eq(ids_uuid7(b), 0);
	cr_assert(ids_is_uuid(a) && ids_is_uuid(b));
	cr_assert_eq(a[14], '7', "version nibble");
	cr_assert(strchr("89ab", a[19]) != NULL, "variant nibble");
	cr_assert_lt(strncmp(a, b, 13), 0, "later ids sort later");
}

Test(ids, is_uuid_rejects_near_misses)
{
	cr_assert(ids_is_uuid("01a2279f-dc8e-7184-b6f4-7b518175cea0"));
	cr_assert_not(ids_is_uuid("01a2279f-dc8e-7184-b6f4-7b518175cea"));
	cr_assert_not(ids_is_uuid("01a2279f-dc8e-7184-b6f4-7b518175cea00"));
	cr_assert_not(ids_is_uuid("01a2279fxdc8e-7184-b6f4-7b518175cea0"));
	cr_assert_not(ids_is_uuid("not-a-uuid"));
	cr_assert_not(ids_is_uuid(""));
}

Test(ids, tokens_are_unique_and_url_safe)
{
	char a[IDS_TOKEN_LEN + 1], b[IDS_TOKEN_LEN + 1];

	cr_assert_eq(ids_token(a), 0);
	cr_assert_eq(ids_token(b), 0);
	cr_assert_eq(strlen(a), IDS_TOKEN_LEN);
	cr_assert_eq(strncmp(a, "idf_", 4), 0);
	cr_assert_eq(
	    strspn(a + 4, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
	    IDS_TOKEN_LEN - 4);
	cr_assert_str_neq(a, b);
}

Test(ids, timestamps_are_utc_with_microseconds)
{
	char ts[IDS_TS_LEN + 1];

	ids_now(ts);
	cr_assert_eq(strlen(ts), IDS_TS_LEN);
	cr_assert_eq(ts[10], 'T');
	cr_assert_eq(ts[19], '.');
	cr_assert_eq(ts[26], 'Z');
}
