/* test_utf8.c - the one rule for well-formed UTF-8 (RFC 3629) that the
 * request JSON, the log's JSON form and the dispatcher's stored errors
 * share, and the hexadecimal digits of escapes. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/utf8.h"

static size_t len_of(const char *s)
{
	return utf8_len((const unsigned char *)s, strlen(s));
}

Test(utf8_len, each_well_formed_sequence_has_its_length)
{
	cr_assert_eq(len_of("a"), 1);
	cr_assert_eq(len_of("\x7f"), 1);
	cr_assert_eq(len_of("\xc2\x80"), 2, "U+0080, the first of two bytes");
	cr_assert_eq(len_of("\xdf\xbf"), 2, "U+07FF");
	cr_assert_eq(len_of("\xe0\xa0\x80"), 3, "U+0800, the first of three bytes");
	cr_assert_eq(len_of("\xed\x9f\xbf"), 3, "U+D7FF, below the surrogates");
	cr_assert_eq(len_of("\xee\x80\x80"), 3, "U+E000, above them");
	cr_assert_eq(len_of("\xef\xbf\xbd"), 3, "U+FFFD");
	cr_assert_eq(len_of("\xf0\x90\x80\x80"), 4, "U+10000, the first of four bytes");
	cr_assert_eq(len_of("\xf4\x8f\xbf\xbf"), 4, "U+10FFFF, the last code point");
	/* Only the first sequence counts. */
	cr_assert_eq(len_of("\xc3\xa9\xc3\xa9"), 2);
}

Test(utf8_len, what_is_not_utf8_is_zero)
{
	static const char *const bad[] = {
		"\x80",             /* a continuation byte alone */
		"\xbf",             /* another */
		"\xc0\xaf",         /* overlong '/' */
		"\xc1\xbf",         /* overlong U+007F */
		"\xe0\x80\xaf",     /* overlong '/', three bytes */
		"\xe0\x9f\xbf",     /* overlong U+07FF */
		"\xf0\x80\x80\xaf", /* overlong '/', four bytes */
		"\xf0\x8f\xbf\xbf", /* overlong U+FFFF */
		"\xed\xa0\x80",     /* U+D800, a surrogate */
		"\xed\xbf\xbf",     /* U+DFFF */
		"\xf4\x90\x80\x80", /* U+110000, above the last code point */
		"\xf5\x80\x80\x80", /* a lead byte that can begin nothing */
		"\xff",
		"\xc3"
		"a",            /* a lead byte, then no continuation */
		"\xe2\x82",     /* cut short: two of three bytes */
		"\xf0\x9f\x98", /* three of four */
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(len_of(bad[i]), 0, "case %zu", i);
}

Test(utf8_len, reads_no_further_than_left)
{
	/* A whole sequence in memory, but only part of it is the caller's. */
	cr_assert_eq(utf8_len((const unsigned char *)"\xe2\x82\xac", 2), 0);
	cr_assert_eq(utf8_len((const unsigned char *)"\xe2\x82\xac", 3), 3);
}

Test(utf8_copy, cuts_between_characters_and_replaces_bytes_that_are_not_utf8)
{
	char out[8];

	/* "ab" then U+00E9 twice: 6 bytes, 7 of room: the cut falls after it. */
	cr_assert_eq(utf8_copy(out, 6, "ab\xc3\xa9\xc3\xa9"), 4);
	cr_assert_str_eq(out, "ab\xc3\xa9");
	cr_assert_eq(utf8_copy(out, 8, "ab\xc3\xa9\xc3\xa9"), 6);
	cr_assert_str_eq(out, "ab\xc3\xa9\xc3\xa9");
	/* A stray byte, a truncated sequence and a surrogate: U+FFFD each byte. */
	cr_assert_eq(utf8_copy(out, 8,
	                       "\xff"
	                       "a"),
	             4);
	cr_assert_str_eq(out, "\xef\xbf\xbd"
	                      "a");
	cr_assert_eq(utf8_copy(out, 8, "\xc3"), 3);
	cr_assert_str_eq(out, "\xef\xbf\xbd");
	cr_assert_eq(utf8_copy(out, 8, "\xed\xa0\x80"), 6, "two replacements fit, not three");
	cr_assert_str_eq(out, "\xef\xbf\xbd\xef\xbf\xbd");
	cr_assert_eq(utf8_copy(out, 1, "abc"), 0);
	cr_assert_str_eq(out, "");
}

Test(utf8_hex_digit, every_digit_in_both_cases_and_nothing_else)
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < 16; i++) {
		cr_assert_eq(utf8_hex_digit(digits[i]), i, "%c", digits[i]);
		if (i >= 10)
			cr_assert_eq(utf8_hex_digit((char)(digits[i] - 'a' + 'A')), i);
	}
	for (int c = 1; c < 256; c++)
		if (strchr("0123456789abcdefABCDEF", c) == NULL)
			cr_assert_eq(utf8_hex_digit((char)c), -1, "byte %d", c);
	cr_assert_eq(utf8_hex_digit('\0'), -1);
}
