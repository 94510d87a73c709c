/* test_idem.c - Idempotency-Key syntax and stored-row decisions. */
#include <criterion/criterion.h>
#include <string.h>

#include "idem.h"

Test(idem, keys_of_printable_ascii_up_to_255_are_valid)
{
	char k[256];

	cr_assert(idem_key_valid("a"));
	cr_assert(idem_key_valid("0b7d6e8c-5c6f-4d8a-9d43-0c3b7f7f2f11"));
	cr_assert(idem_key_valid("order:42/attempt#1~!"));
	memset(k, 'k', 255);
	k[255] = '\0';
	cr_assert(idem_key_valid(k), "255 characters is the maximum");
}

Test(idem, empty_long_spaced_and_control_keys_are_invalid)
{
	char k[257];

	memset(k, 'k', 256);
	k[256] = '\0';
	cr_assert_not(idem_key_valid(k), "256 characters");
	cr_assert_not(idem_key_valid(""));
	cr_assert_not(idem_key_valid(NULL));
	cr_assert_not(idem_key_valid("a b"));
	cr_assert_not(idem_key_valid("a\tb"));
	cr_assert_not(idem_key_valid("a\x7f"));
	cr_assert_not(idem_key_valid("caf\xc3\xa9"));
	cr_assert_not(idem_key_valid("a\r\nX-Injected: 1"));
}

Test(idem, stored_fingerprint_decides_replay_or_conflict)
{
	uint8_t a[FP_LEN], b[FP_LEN];
	char ta[IDEM_FP_TEXT], tb[IDEM_FP_TEXT];

	memset(a, 0xab, sizeof(a));
	memset(b, 0xab, sizeof(b));
	b[31] = 0xac;
	idem_fp_text(ta, a);
	idem_fp_text(tb, b);
	cr_assert_eq(strncmp(ta, "\\xabab", 6), 0, "bytea text form");
	cr_assert_eq(strlen(ta), 66);
	cr_assert_eq(idem_compare(ta, ta), IDEM_REPLAYED);
	cr_assert_eq(idem_compare(ta, tb), IDEM_CONFLICT);
}

Test(idem, outcomes_have_log_names)
{
	cr_assert_str_eq(idem_outcome_name(IDEM_CREATED), "created");
	cr_assert_str_eq(idem_outcome_name(IDEM_REPLAYED), "replayed");
	cr_assert_str_eq(idem_outcome_name(IDEM_CONFLICT), "conflict");
	cr_assert_str_eq(idem_outcome_name(IDEM_IN_FLIGHT), "in_flight");
	cr_assert_str_eq(idem_outcome_name(IDEM_NONE), "none");
}
