/* test_whsig.c - Standard Webhooks signatures: the published vector, rejection, secrets. */
#include <criterion/criterion.h>
#include <string.h>

#include "dispatch/whsig.h"

/*
 * The specification's test vector, used by its reference libraries' own
 * tests (and checked independently with Python's hmac module and
 * `openssl dgst -sha256 -mac HMAC`).
 */
#define V_SECRET  "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define V_ID      "msg_p5jXN8AQM9LWM0D4loKWxJek"
#define V_TS      1614265330L
#define V_TS_TEXT "1614265330"
#define V_BODY    "{\"test\": 2432232314}"
#define V_B64     "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
#define V_SIG     "v1," V_B64

static uint8_t key[WHSIG_KEY_MAX];
static size_t keylen;

static void load(const char *secret)
{
	struct err e = { 0 };

	cr_assert_eq(whsig_key(secret, key, &keylen, &e), 0, "%s", e.msg);
}

static int verify(const char *id, const char *ts, const char *body, const char *header)
{
	struct err e = { 0 };

	return whsig_verify(key, keylen, id, ts, body, strlen(body), header, V_TS,
	                    WHSIG_TOLERANCE_S, &e);
}

Test(whsig, signs_the_published_vector_exactly)
{
	char sig[WHSIG_MAX];
	struct err e = { 0 };

	load(V_SECRET);
	cr_assert_eq(keylen, 24);
	cr_assert_eq(whsig_sign(key, keylen, V_ID, V_TS, V_BODY, strlen(V_BODY), sig, &e), 0, "%s",
	             e.msg);
	cr_assert_str_eq(sig, V_SIG);
	cr_assert_eq(strlen(sig), WHSIG_MAX - 1);
}

Test(whsig, verifies_the_published_vector)
{
	load(V_SECRET);
	cr_assert_eq(verify(V_ID, V_TS_TEXT, V_BODY, V_SIG), 0);
}

Test(whsig, accepts_a_match_among_several_signatures)
{
	/* During a secret rotation the header lists one entry per secret. */
	load(V_SECRET);
	cr_assert_eq(verify(V_ID, V_TS_TEXT, V_BODY,
	                    "v1,Pf9DdkatdXEIVGuiT2TxOTPqp4RBXVrSPbCVRGzN9Qs= " V_SIG),
	             0);
	cr_assert_eq(verify(V_ID, V_TS_TEXT, V_BODY, "v1a,abc " V_SIG " v2,xyz"), 0);
}

Test(whsig, wrong_secret_fails_verification)
{
	struct err e = { 0 };

	load("whsec_c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQ=");
	cr_assert_eq(whsig_verify(key, keylen, V_ID, V_TS_TEXT, V_BODY, strlen(V_BODY), V_SIG, V_TS,
	                          WHSIG_TOLERANCE_S, &e),
	             -1);
	cr_assert_eq(e.code, ERR_INPUT);
	cr_assert_str_eq(e.msg, "no v1 signature in webhook-signature matches");
}

Test(whsig, tampered_body_fails_verification)
{
	load(V_SECRET);
	cr_assert_eq(verify(V_ID, V_TS_TEXT, "{\"test\": 2432232315}", V_SIG), -1);
	cr_assert_eq(verify(V_ID, V_TS_TEXT, "{\"test\":2432232314}", V_SIG), -1);
	cr_assert_eq(verify(V_ID, V_TS_TEXT, "", V_SIG), -1);
}

Test(whsig, wrong_id_or_timestamp_fails_verification)
{
	load(V_SECRET);
	cr_assert_eq(verify("msg_p5jXN8AQM9LWM0D4loKWxJel", V_TS_TEXT, V_BODY, V_SIG), -1);
	cr_assert_eq(verify(V_ID, "1614265331", V_BODY, V_SIG), -1);
}

Test(whsig, wrong_version_or_truncated_signature_fails_verification)
{
	load(V_SECRET);
	/* The right bytes under another version, cut short, or without a version. */
	cr_assert_eq(verify(V_ID, V_TS_TEXT, V_BODY, "v2," V_B64), -1);
	cr_assert_eq(
	    verify(V_ID, V_TS_TEXT, V_BODY, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE"), -1);
	cr_assert_eq(verify(V_ID, V_TS_TEXT, V_BODY, V_B64), -1);
	cr_assert_eq(verify(V_ID, V_TS_TEXT, V_BODY, ""), -1);
}

Test(whsig, stale_or_future_timestamp_fails_verification)
{
	struct err e = { 0 };

	load(V_SECRET);
	cr_assert_eq(whsig_verify(key, keylen, V_ID, V_TS_TEXT, V_BODY, strlen(V_BODY), V_SIG,
	                          V_TS + 301, 300, &e),
	             -1);
	cr_assert_str_eq(e.msg,
	                 "webhook-timestamp 1614265330 is more than 300 s from now (1614265631)");
	cr_assert_eq(whsig_verify(key, keylen, V_ID, V_TS_TEXT, V_BODY, strlen(V_BODY), V_SIG,
	                          V_TS - 301, 300, &e),
	             -1);
	cr_assert_eq(whsig_verify(key, keylen, V_ID, V_TS_TEXT, V_BODY, strlen(V_BODY), V_SIG,
	                          V_TS + 300, 300, &e),
	             0, "the edge of the window is inside");
	cr_assert_eq(whsig_verify(key, keylen, V_ID, V_TS_TEXT, V_BODY, strlen(V_BODY), V_SIG,
	                          V_TS + 86400, -1, &e),
	             0, "a negative tolerance skips the check");
}

Test(whsig, timestamp_that_is_not_unix_seconds_fails_verification)
{
	struct err e = { 0 };

	load(V_SECRET);
	cr_assert_eq(whsig_verify(key, keylen, V_ID, "+1614265330", V_BODY, strlen(V_BODY), V_SIG,
	                          V_TS, -1, &e),
	             -1);
	cr_assert_str_eq(e.msg, "webhook-timestamp \"+1614265330\" is not unix seconds");
	cr_assert_eq(verify(V_ID, "1614265330 ", V_BODY, V_SIG), -1);
	cr_assert_eq(verify(V_ID, "", V_BODY, V_SIG), -1);
}

Test(whsig, raw_secret_is_used_as_key_bytes)
{
	char sig[WHSIG_MAX];
	struct err e = { 0 };

	/* Not whsec_: the text itself is the key, even when it looks like base64. */
	load("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
	cr_assert_eq(keylen, 32);
	cr_assert_eq(memcmp(key, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", 32), 0);

	/* python3 -c 'import hmac,hashlib,base64; print(base64.b64encode(hmac.new(
	 *   b"my raw secret of 24 byte", b"evt_1.1700000000.{}", hashlib.sha256).digest()))' */
	load("my raw secret of 24 byte");
	cr_assert_eq(whsig_sign(key, keylen, "evt_1", 1700000000L, "{}", 2, sig, &e), 0, "%s",
	             e.msg);
	cr_assert_str_eq(sig, "v1,hp0wKcUpEBLeKGHiQhTImEUAx6Q1yW0VCVeJtDJiRhI=");
	cr_assert_eq(whsig_verify(key, keylen, "evt_1", "1700000000", "{}", 2, sig, 1700000000L,
	                          WHSIG_TOLERANCE_S, &e),
	             0);
}

Test(whsig, bad_base64_after_whsec_is_a_config_error)
{
	static const char *const bad[] = {
		"whsec_",                                  /* nothing after the prefix */
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",   /* length not a multiple of 4 */
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS!",  /* not in the alphabet */
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2La=aSw",  /* padding in the middle */
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa=w",  /* "=x" at the end */
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw ", /* trailing space */
		"whsec_ MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", /* leading space */
		"whsec_MfKQ9r8GKYqrTwjU_D8ILPZIo2LaLaSw",  /* URL-safe alphabet */
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct err e = { 0 };

		keylen = 99;
		cr_assert_eq(whsig_key(bad[i], key, &keylen, &e), -1, "%s", bad[i]);
		cr_assert_eq(e.code, ERR_CONFIG, "%s", bad[i]);
		cr_assert_str_eq(e.msg, "secret: the text after \"whsec_\" is not valid base64",
		                 "%s", bad[i]);
	}
}

Test(whsig, padding_is_not_part_of_the_key)
{
	/* EVP_DecodeBlock counts padding as decoded zero bytes; the key must not. */
	load("whsec_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eQ==");
	cr_assert_eq(keylen, 25);
	cr_assert_eq(memcmp(key, "abcdefghijklmnopqrstuvwxy", 25), 0);
	load("whsec_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXo=");
	cr_assert_eq(keylen, 26);
	cr_assert_eq(memcmp(key, "abcdefghijklmnopqrstuvwxyz", 26), 0);
	load("whsec_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4");
	cr_assert_eq(keylen, 24);
	cr_assert_eq(memcmp(key, "abcdefghijklmnopqrstuvwx", 24), 0);
}

Test(whsig, empty_or_oversized_secret_is_a_config_error)
{
	char big[WHSIG_KEY_MAX + 2];
	struct err e = { 0 };

	cr_assert_eq(whsig_key("", key, &keylen, &e), -1);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, "secret is empty");

	memset(big, 'k', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	cr_assert_eq(whsig_key(big, key, &keylen, &e), -1);
	cr_assert_str_eq(e.msg, "secret is longer than 256 bytes");
	big[WHSIG_KEY_MAX] = '\0';
	cr_assert_eq(whsig_key(big, key, &keylen, &e), 0, "%s", e.msg);
	cr_assert_eq(keylen, WHSIG_KEY_MAX);
}

Test(whsig, a_key_shorter_than_24_bytes_is_a_config_error)
{
	struct err e = { 0 };

	/* 23 bytes, raw and decoded; 24 is the shortest accepted. */
	cr_assert_eq(whsig_key("abcdefghijklmnopqrstuvw", key, &keylen, &e), -1);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, "secret is 23 bytes, shorter than 24: use 24 or more random bytes, "
	                        "e.g. whsec_ and the base64 of 32 (openssl rand -base64 32)");
	cr_assert_eq(whsig_key_named("secret_previous",
	                             "whsec_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnc=", key, &keylen, &e),
	             -1);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg,
	                 "secret_previous: the decoded key is 23 bytes, shorter than 24: use "
	                 "24 or more random bytes (openssl rand -base64 32)");
	cr_assert_eq(whsig_key("whsec_", key, &keylen, &e), -1);
	cr_assert_str_eq(e.msg, "secret: the text after \"whsec_\" is not valid base64");
	cr_assert_eq(whsig_key("abcdefghijklmnopqrstuvwx", key, &keylen, &e), 0, "%s", e.msg);
	cr_assert_eq(keylen, 24);
}

Test(whsig, a_rotation_signs_with_both_secrets_in_one_header)
{
	/* The new secret's entry first, then the previous one's, one space
	 * between, as Standard Webhooks writes several signatures:
	 * python3 -c 'import hmac,hashlib,base64; print(base64.b64encode(hmac.new(
	 *   b"secret-of-another-endpoint",
	 *   b"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{\"test\": 2432232314}",
	 *   hashlib.sha256).digest()))' */
	uint8_t prev[WHSIG_KEY_MAX];
	size_t prevlen;
	char header[WHSIG_HEADER_MAX];
	struct err e = { 0 };

	cr_assert_eq(whsig_key("whsec_c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQ=", prev, &prevlen, &e), 0,
	             "%s", e.msg);
	load(V_SECRET);
	cr_assert_eq(whsig_sign_header(key, keylen, prev, prevlen, V_ID, V_TS, V_BODY,
	                               strlen(V_BODY), header, &e),
	             0, "%s", e.msg);
	cr_assert_str_eq(header, V_SIG " v1,1L8HhWnhZJdyF7wZDthm11UOUO4iIt+LLPWMeW/O+lU=");
	cr_assert_eq(strlen(header), WHSIG_HEADER_MAX - 1);
	/* Each secret alone verifies the header. */
	cr_assert_eq(verify(V_ID, V_TS_TEXT, V_BODY, header), 0);
	cr_assert_eq(whsig_verify(prev, prevlen, V_ID, V_TS_TEXT, V_BODY, strlen(V_BODY), header,
	                          V_TS, WHSIG_TOLERANCE_S, &e),
	             0, "%s", e.msg);
	/* Without a previous key: the one entry. */
	cr_assert_eq(
	    whsig_sign_header(key, keylen, NULL, 0, V_ID, V_TS, V_BODY, strlen(V_BODY), header, &e),
	    0, "%s", e.msg);
	cr_assert_str_eq(header, V_SIG);
}
