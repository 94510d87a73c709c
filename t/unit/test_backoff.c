/*
 * test_backoff.c - the dispatcher's retry delays: the step of the backoff
 * list an attempt uses, and the +-20% jitter around it (its bounds and
 * its spread), so that dispatchers that failed together do not retry
 * together.
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include "dispatch/dispatch.h"

#define DRAWS 20000

Test(backoff, each_attempt_uses_its_step_and_the_last_step_after_the_list)
{
	const long delays[] = { 1000, 60000, 3600000 };
	unsigned seed = 1;

	for (int attempt = 0; attempt <= 6; attempt++) {
		long base = delays[attempt <= 1 ? 0 : attempt - 1 < 3 ? attempt - 1 : 2];
		for (int i = 0; i < 200; i++) {
			long d = dispatch_backoff_delay(delays, 3, attempt, &seed);
			cr_assert(d >= base * 8 / 10 && d <= base * 12 / 10,
			          "attempt %d: %ld ms, step %ld ms", attempt, d, base);
		}
	}
}

Test(backoff, the_jitter_stays_within_20_percent_and_covers_the_range)
{
	const long delays[] = { 10000 };
	unsigned seed = 12345;
	long min = -1, max = -1, buckets[4] = { 0 };
	double sum = 0;

	for (int i = 0; i < DRAWS; i++) {
		long d = dispatch_backoff_delay(delays, 1, 1, &seed);
		cr_assert(d >= 8000 && d <= 12000, "draw %d: %ld ms, outside 10 s +-20%%", i, d);
		min = min < 0 || d < min ? d : min;
		max = d > max ? d : max;
		sum += (double)d;
		buckets[d >= 12000 ? 3 : (d - 8000) / 1000]++;
	}
	/* Spread: both ends reached, centred on the step, each quarter of
	 * the range drawn about equally often. */
	cr_assert_lt(min, 8100, "smallest delay %ld ms", min);
	cr_assert_gt(max, 11900, "largest delay %ld ms", max);
	cr_assert(sum / DRAWS > 9900 && sum / DRAWS < 10100, "mean %.0f ms", sum / DRAWS);
	for (int b = 0; b < 4; b++)
		cr_assert(buckets[b] > DRAWS / 4 * 9 / 10 && buckets[b] < DRAWS / 4 * 11 / 10,
		          "quarter %d of the range drawn %ld times of %d", b, buckets[b], DRAWS);
}

Test(backoff, two_dispatchers_with_different_seeds_do_not_retry_together)
{
	const long delays[] = { 5000 };
	unsigned a = 1001, b = 2002;
	int same = 0;

	for (int i = 0; i < 1000; i++)
		same += dispatch_backoff_delay(delays, 1, 1, &a) ==
		        dispatch_backoff_delay(delays, 1, 1, &b);
	cr_assert_lt(same, 20, "%d of 1000 delays equal", same);
}

/* The list is read with the configuration's one duration parser: its
 * units, a space after each comma, and each delay at least 1 ms. */
Test(backoff, the_list_is_read_as_the_configuration_reads_durations)
{
	long d[4] = { 0 };
	struct err e = { 0 };

	cr_assert_eq(dispatch_backoff_parse("500ms, 5s,10m,1d", d, 4, &e), 4, "%s", e.msg);
	cr_assert_eq(d[0], 500);
	cr_assert_eq(d[1], 5000);
	cr_assert_eq(d[2], 600000);
	cr_assert_eq(d[3], 86400000);
	cr_assert_eq(dispatch_backoff_parse("7", d, 4, &e), 1, "no unit: seconds");
	cr_assert_eq(d[0], 7000);
}

Test(backoff, a_bad_list_names_itself_and_the_form_expected)
{
	static const char *const bad[] = { "0", "1s,0ms", "5x", "-1s", "1 s", "1s,2s,3s,4s,5s" };
	long d[4];
	struct err e = { 0 };
	char want[256];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert_eq(dispatch_backoff_parse(bad[i], d, 4, &e), -1, "%s", bad[i]);
		cr_assert_eq(e.code, ERR_CONFIG);
		snprintf(want, sizeof(want),
		         "invalid value \"%s\" for \"backoff\": expected up to 4 durations "
		         "separated by commas, such as 5s,5m,30m,2h",
		         bad[i]);
		cr_assert_str_eq(e.msg, want);
	}
	cr_assert_eq(dispatch_backoff_parse(",", d, 4, &e), -1);
	cr_assert_str_eq(e.msg, "invalid value \",\" for \"backoff\": no delays");
}
