/* test_canon.c - the canonical JSON form that request fingerprints cover. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/canon.h"

/* Parse text and return its canonical form (static buffer), or NULL. */
static const char *canon_of(const char *text, char *errmsg, size_t errlen)
{
	static struct buf out;
	struct err e = { 0 };
	struct json_object *v = canon_parse(text, strlen(text), 64, &e);

	buf_reset(&out);
	if (v == NULL || canon_write(&out, v, &e) < 0) {
		json_object_put(v);
		if (errmsg)
			snprintf(errmsg, errlen, "%s", e.msg);
		return NULL;
	}
	json_object_put(v);
	return out.data;
}

struct pair {
	const char *in;
	const char *want;
};

/* Table-driven in one test: Criterion's parameterized tests would need the
 * strings copied into shared memory. */
Test(canon, equivalent_texts_share_one_form)
{
	static const struct pair cases[] = {
		{ "{\"b\":2,\"a\":1}", "{\"a\":1,\"b\":2}" },
		{ " { \"a\" : 1 ,\n\t\"b\" : [ 1 , 2 ] } ", "{\"a\":1,\"b\":[1,2]}" },
		{ "{\"z\":{\"y\":1,\"x\":2},\"a\":null}", "{\"a\":null,\"z\":{\"x\":2,\"y\":1}}" },
		{ "[true,false,null]", "[true,false,null]" },
		{ "1.0", "1" },
		{ "-0.0", "0" },
		{ "1e3", "1000" },
		{ "0.1", "0.1" },
		{ "1.5e300", "1.5e+300" },
		{ "-12345678901234", "-12345678901234" },
		{ "18446744073709551615", "18446744073709551615" },
		{ "-9223372036854775808", "-9223372036854775808" },
		{ "[100000000000000000000.0,1e30]", "[100000000000000000000,1e+30]" },
		/* Beyond 64 bits an integer is the double it reads as (json-c
		 * alone would clamp it to the nearest 64-bit limit). */
		{ "18446744073709551616", "18446744073709551616" },
		{ "{\"a\":[1,99999999999999999999]}", "{\"a\":[1,100000000000000000000]}" },
		{ "-9223372036854775809", "-9223372036854775808" },
		{ "1844674400000000000008378362954752323327", "1.8446744e+39" },
		{ "[-100000000000000000000000,1.0e22]", "[-1e+23,1e+22]" },
		{ "\"99999999999999999999\"", "\"99999999999999999999\"" },
		{ "123456789012345678901.5", "123456789012345683968" },
		{ "[1e-05,1E-01,-0e1]", "[1e-05,0.1,0]" },
		{ "\"\\u00e9\"", "\"\xc3\xa9\"" },
		{ "\"a\\/b\"", "\"a/b\"" },
		{ "\"\\u001f\\n\\t\"", "\"\\u001f\\n\\t\"" },
		{ "\"q\\\"b\\\\\"", "\"q\\\"b\\\\\"" },
		{ "{\"a\":1,\"a\":2}", "{\"a\":2}" },
		{ "{\"\xc3\xa9\":1,\"z\":2,\"A\":3}", "{\"A\":3,\"z\":2,\"\xc3\xa9\":1}" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct pair *p = &cases[i];
		char msg[256] = "";
		const char *got = canon_of(p->in, msg, sizeof(msg));

		cr_assert_not_null(got, "%s rejected: %s", p->in, msg);
		cr_assert_str_eq(got, p->want, "canonical form of %s", p->in);
	}
}

Test(canon, malformed_input_is_rejected)
{
	static const char *cases[] = {
		"",
		"{",
		"{\"a\":}",
		"{\"a\":1,}",
		"[1,2",
		"{\"a\":1} x",
		"{'a':1}",
		"\"\xff\"",
		"\"\xc3\"",
		"nul",
		"{\"a\":1}{}",
		"\"\\u0000\"",
		"01",
		"NaN",
		"null",
		/* json-c in strict mode refuses "01" but takes these. */
		"-01",
		"[1,-007]",
		"{\"a\":-012.5}",
		"-000000000000000000000018446744073709551615",
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char msg[256] = "";

		cr_assert_null(canon_of(cases[i], msg, sizeof(msg)), "accepted: %s", cases[i]);
		cr_assert_neq(msg[0], '\0', "no error message for %s", cases[i]);
	}
}

/* json-c cuts a key at U+0000: {"a\u0000x":1} must not turn into {"a":1}. */
Test(canon, u0000_in_an_object_key_is_rejected_like_in_a_value)
{
	static const char *cases[] = {
		"{\"a\\u0000x\":1}",
		"{\"a\":{\"\\u0000\":1}}",
		"{\"a\":1,\"a\\u0000\":2}",
		"[\"\\u0000\"]",
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char msg[256] = "";

		cr_assert_null(canon_of(cases[i], msg, sizeof(msg)), "accepted: %s", cases[i]);
		cr_assert(strstr(msg, "U+0000") != NULL, "%s: %s", cases[i], msg);
	}
	cr_assert_str_eq(canon_of("{\"a\\\\u0000\":1}", NULL, 0), "{\"a\\\\u0000\":1}",
	                 "an escaped backslash before u0000 is no U+0000");
}

Test(canon, nesting_beyond_the_limit_is_rejected)
{
	char deep[200];
	struct err e = { 0 };
	struct json_object *v;

	memset(deep, '[', 100);
	memset(deep + 100, ']', 100);
	v = canon_parse(deep, sizeof(deep), 64, &e);
	cr_assert_null(v);
	cr_assert(strstr(e.msg, "too deep") != NULL, "message: %s", e.msg);
	v = canon_parse(deep + 40, 120, 64, &e);
	cr_assert_not_null(v, "60 levels fit in a limit of 64");
	json_object_put(v);
}

Test(canon, a_nul_byte_inside_the_body_is_rejected)
{
	const char text[] = "{\"a\":1}\0{}";
	struct err e = { 0 };

	cr_assert_null(canon_parse(text, sizeof(text) - 1, 64, &e));
}

Test(canon, strings_are_escaped_minimally)
{
	struct buf b = BUF_INIT;

	canon_write_string(&b, "a\"\\\b\f\n\r\t\x01/\xe2\x82\xac", 13);
	cr_assert_str_eq(b.data, "\"a\\\"\\\\\\b\\f\\n\\r\\t\\u0001/\xe2\x82\xac\"");
	buf_free(&b);
}

/* json-c saturates integers it cannot hold, which stored a different
 * number and made two numbers one fingerprint. Integers within 64 bits are
 * exact; beyond, they are doubles, as every number is in RFC 8785. */
Test(canon, integers_beyond_64_bits_are_doubles_not_saturated)
{
	static const struct pair cases[] = {
		{ "-9223372036854775808", "-9223372036854775808" },
		{ "18446744073709551615", "18446744073709551615" },
		{ "-9223372036854775809", "-9223372036854775808" },
		{ "18446744073709551616", "18446744073709551616" },
		{ "18446744073709551617", "18446744073709551616" },
		{ "18446744073709551616.0", "18446744073709551616" },
		{ "100000000000000000000", "100000000000000000000" },
		{ "123456789012345678901234567890", "1.2345678901234568e+29" },
		{ "{\"a\":[1,-99999999999999999999,2]}", "{\"a\":[1,-100000000000000000000,2]}" },
		{ "[-0,0]", "[0,0]" },
		{ "1e-400", "0" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char msg[256] = "";
		const char *got = canon_of(cases[i].in, msg, sizeof(msg));

		cr_assert_not_null(got, "%s rejected: %s", cases[i].in, msg);
		cr_assert_str_eq(got, cases[i].want, "canonical form of %s", cases[i].in);
	}
}

/* The canonical form must read back as itself: GET parses what POST stored. */
Test(canon, the_canonical_form_of_a_large_number_reads_back_as_itself)
{
	static const char *cases[] = { "1e20", "1e300", "18446744073709551616.5", "-1e25" };
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char once[128], msg[256] = "";
		const char *got = canon_of(cases[i], msg, sizeof(msg));

		cr_assert_not_null(got, "%s: %s", cases[i], msg);
		snprintf(once, sizeof(once), "%s", got);
		got = canon_of(once, msg, sizeof(msg));
		cr_assert_not_null(got, "%s, canonical %s: %s", cases[i], once, msg);
		cr_assert_str_eq(got, once);
	}
}

Test(canon, a_300_digit_integer_is_a_double_and_one_beyond_1e308_is_refused)
{
	char big[420];
	char msg[256] = "";
	const char *got;

	memset(big, '9', 300);
	big[300] = '\0';
	got = canon_of(big, msg, sizeof(msg));
	cr_assert_not_null(got, "%s", msg);
	cr_assert_str_eq(got, "1e+300");
	memset(big, '9', 400);
	big[400] = '\0';
	cr_assert_null(canon_of(big, msg, sizeof(msg)));
	cr_assert(strstr(msg, "must fit in a double") != NULL, "%s", msg);
	cr_assert_null(canon_of("[1e400]", msg, sizeof(msg)));
	cr_assert(strstr(msg, "must fit in a double") != NULL, "%s", msg);
	cr_assert_null(canon_of("-1e400", msg, sizeof(msg)));
	cr_assert(strstr(msg, "must fit in a double") != NULL, "%s", msg);
}

Test(canon, nan_infinity_and_leading_zeros_are_refused)
{
	static const char *cases[] = {
		"NaN", "[Infinity]", "{\"a\":-Infinity}", "[-01]", "-00", "[1,-0123]",
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char msg[256] = "";

		cr_assert_null(canon_of(cases[i], msg, sizeof(msg)), "accepted: %s", cases[i]);
		cr_assert(strstr(msg, "not valid JSON") != NULL, "%s: %s", cases[i], msg);
	}
}

/* json-c's UTF-8 check lets these through; PostgreSQL refuses them, which
 * made a client's mistake a 500. */
Test(canon, overlong_forms_surrogates_and_code_points_above_10ffff_are_refused)
{
	static const char *bad[] = {
		"\"\xc0\xaf\"",         /* overlong '/' */
		"\"\xe0\x80\xaf\"",     /* overlong '/', three bytes */
		"\"\xf0\x80\x80\xaf\"", /* overlong '/', four bytes */
		"\"\xed\xa0\x80\"",     /* U+D800, a surrogate, encoded */
		"\"\xed\xbf\xbf\"",     /* U+DFFF */
		"\"\xf4\x90\x80\x80\"", /* U+110000 */
		"\"\xf5\x80\x80\x80\"", /* no such lead byte */
		"{\"\xc1\xbf\":1}",     /* in a key */
		"\"a\xe2\x82\"",        /* cut short */
	};
	static const struct pair good[] = {
		{ "\"\xe2\x82\xac\"", "\"\xe2\x82\xac\"" },
		{ "\"\xf0\x9f\x98\x80\"", "\"\xf0\x9f\x98\x80\"" },
		{ "\"\xef\xbf\xbf\xf4\x8f\xbf\xbf\"", "\"\xef\xbf\xbf\xf4\x8f\xbf\xbf\"" },
		{ "\"\xed\x9f\xbf\xee\x80\x80\"", "\"\xed\x9f\xbf\xee\x80\x80\"" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char msg[256] = "";

		cr_assert_null(canon_of(bad[i], msg, sizeof(msg)), "accepted case %zu", i);
		cr_assert(strstr(msg, "not valid JSON") != NULL, "case %zu: %s", i, msg);
	}
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char msg[256] = "";
		const char *got = canon_of(good[i].in, msg, sizeof(msg));

		cr_assert_not_null(got, "case %zu rejected: %s", i, msg);
		cr_assert_str_eq(got, good[i].want);
	}
}

/* json-c cut a key at \u0000 ({"a\u0000b":1} became {"a":1}) and turned a
 * lone surrogate into U+FFFD: both changed what the client sent. */
Test(canon, nul_escapes_lone_surrogates_and_raw_controls_are_refused)
{
	static const struct {
		const char *in;
		const char *msg;
	} bad[] = {
		{ "{\"a\\u0000b\":1}", "U+0000" },
		{ "{\"a\":{\"\\u0000\":1}}", "U+0000" },
		{ "[\"x\\u0000\"]", "U+0000" },
		{ "\"\\ud800\"", "unpaired UTF-16 surrogate \\ud800" },
		{ "\"\\ud800x\"", "unpaired" },
		{ "\"\\ud800\\u0041\"", "unpaired" },
		{ "\"\\udc00\"", "unpaired UTF-16 surrogate \\udc00" },
		{ "{\"\\udfff\":1}", "unpaired" },
		{ "\"a\x01\"", "control character U+0001" },
		{ "\"a\tb\"", "control character U+0009" },
		{ "{\"k\nk\":1}", "control character U+000A" },
	};
	static const struct pair good[] = {
		{ "\"\\ud83d\\ude00\"", "\"\xf0\x9f\x98\x80\"" },
		{ "\"\\uD83D\\uDE00\\u0001\"", "\"\xf0\x9f\x98\x80\\u0001\"" },
		{ "{\"\\u0061\":\"\\\\u0000\"}", "{\"a\":\"\\\\u0000\"}" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char msg[256] = "";

		cr_assert_null(canon_of(bad[i].in, msg, sizeof(msg)), "accepted: %s", bad[i].in);
		cr_assert(strstr(msg, bad[i].msg) != NULL, "%s: %s", bad[i].in, msg);
	}
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char msg[256] = "";
		const char *got = canon_of(good[i].in, msg, sizeof(msg));

		cr_assert_not_null(got, "%s rejected: %s", good[i].in, msg);
		cr_assert_str_eq(got, good[i].want);
	}
}

Test(canon, a_body_cut_short_names_its_end_as_the_error_offset)
{
	char msg[256] = "";

	cr_assert_null(canon_of("{\"type\":\"x\",\"input", msg, sizeof(msg)));
	cr_assert_str_eq(msg, "the body is not valid JSON: unexpected end of data at byte 18");
	cr_assert_null(canon_of("[1,2", msg, sizeof(msg)));
	cr_assert_str_eq(msg, "the body is not valid JSON: unexpected end of data at byte 4");
}

/*
 * Where this form differs from RFC 8785 (JCS), on purpose: it is what every
 * stored key's fingerprint was computed from, and changing it would turn a
 * retry across an upgrade into idempotency-key-reused (README, "What the
 * same request means"). Each case: the RFC's output, then ours.
 *  - keys sort by UTF-8 bytes (code points), not UTF-16 code units: U+FFFD
 *    sorts before U+1F600 here, after it in JCS (its surrogate D83D is
 *    below FFFD);
 *  - integers up to 64 bits are exact, where JCS rounds to a double;
 *  - exponents are C's (two digits at least, 1e-07), and numbers below
 *    1e-4 use one, where ECMAScript writes 0.00001 and 1e-7.
 */
Test(canon, the_documented_differences_from_rfc_8785_hold)
{
	static const struct pair cases[] = {
		/* JCS: {"\ud83d\ude00":1,"\ufffd":2} */
		{ "{\"\\ufffd\":2,\"\\ud83d\\ude00\":1}",
		  "{\"\xef\xbf\xbd\":2,\"\xf0\x9f\x98\x80\":1}" },
		/* JCS: 9007199254740992 */
		{ "9007199254740993", "9007199254740993" },
		{ "18446744073709551615", "18446744073709551615" },
		/* JCS: 1e-7 and 0.00001 */
		{ "1e-7", "1e-07" },
		{ "0.00001", "1e-05" },
		/* Alike: */
		{ "0.0001", "0.0001" },
		{ "1e21", "1e+21" },
		{ "1e20", "100000000000000000000" },
		{ "-0.0", "0" },
		{ "4.5", "4.5" },
		{ "0.1", "0.1" },
	};
	char err[256];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *got = canon_of(cases[i].in, err, sizeof(err));
		cr_assert_not_null(got, "%s: %s", cases[i].in, err);
		cr_assert_str_eq(got, cases[i].want, "%s", cases[i].in);
	}
}

/* What the server reads back from jsonb (its own spacing, its own key
 * order) is answered in the canonical form, appended to what is there. */
Test(canon, recanon_appends_the_canonical_form_of_stored_text)
{
	static const char stored[] =
	    "{\"b\": 2, \"a\": {\"y\": [1, 2.50, 1e2], \"x\": \"\\u00e9\"}}";
	struct buf out = BUF_INIT;
	struct err e = { 0 };

	buf_puts(&out, "\"input\":");
	cr_assert_eq(canon_recanon(&out, stored, strlen(stored), &e), 0, "%s", e.msg);
	buf_putc(&out, '\0');
	cr_assert_str_eq(out.data,
	                 "\"input\":{\"a\":{\"x\":\"\xc3\xa9\",\"y\":[1,2.5,100]},\"b\":2}");
	buf_free(&out);
}

/* len bytes are read, not up to a NUL: a value inside a larger buffer. */
Test(canon, recanon_reads_len_bytes_only)
{
	static const char text[] = "[1, 2]garbage";
	struct buf out = BUF_INIT;
	struct err e = { 0 };

	cr_assert_eq(canon_recanon(&out, text, 6, &e), 0, "%s", e.msg);
	cr_assert_eq(out.len, 5);
	cr_assert_eq(memcmp(out.data, "[1,2]", 5), 0);
	buf_free(&out);
}

/* Text that is not JSON is an error, not an empty answer; nesting up to
 * CANON_STORED_DEPTH is read, one level more is refused. */
Test(canon, recanon_refuses_what_is_not_json_and_nesting_past_its_depth)
{
	static char deep[2 * (CANON_STORED_DEPTH + 1)];
	struct buf out = BUF_INIT;
	struct err e = { 0 };

	cr_assert_eq(canon_recanon(&out, "{\"a\": ", 6, &e), -1);
	cr_assert(e.msg[0] != '\0');
	memset(deep, '[', CANON_STORED_DEPTH + 1);
	memset(deep + CANON_STORED_DEPTH + 1, ']', CANON_STORED_DEPTH + 1);
	buf_reset(&out);
	cr_assert_eq(canon_recanon(&out, deep + 1, 2 * CANON_STORED_DEPTH, &e), 0, "%s", e.msg);
	cr_assert_eq(out.len, 2 * CANON_STORED_DEPTH);
	buf_reset(&out);
	cr_assert_eq(canon_recanon(&out, deep, sizeof(deep), &e), -1);
	cr_assert(strstr(e.msg, "too deep") != NULL, "message: %s", e.msg);
	buf_free(&out);
}
