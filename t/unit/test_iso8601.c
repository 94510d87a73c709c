/* test_iso8601.c - the duration and time parsers: the values each form
 * stands for, and every way a value is refused, with its reason. That
 * PostgreSQL takes whatever they take is t/db/test_iso8601's. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/iso8601.h"

#define S  1000000LL
#define MI (60 * S)
#define H  (3600 * S)
#define D  (86400 * S)

Test(duration, each_part_counts_in_its_unit)
{
	static const struct {
		const char *s;
		long long us;
	} cases[] = {
		{ "PT30S", 30 * S },
		{ "PT0S", 0 },
		{ "P0D", 0 },
		{ "P1D", D },
		{ "PT1H", H },
		{ "PT1M", MI },
		{ "PT1H30M", H + 30 * MI },
		{ "P1DT2H3M4S", D + 2 * H + 3 * MI + 4 * S },
		{ "P1DT2H3M4.123456S", D + 2 * H + 3 * MI + 4 * S + 123456 },
		{ "PT1.5S", S + 500000 },
		{ "PT0.000001S", 1 },
		{ "PT1M30.000001S", MI + 30 * S + 1 },
		{ "P3650D", 3650 * D },
		{ "PT999999999H", 999999999LL * H },
		{ "P99999999D", 99999999LL * D },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int64_t us = -1;
		char why[128] = "";

		cr_assert_eq(iso8601_duration(cases[i].s, &us, why, sizeof(why)), 0, "%s: %s",
		             cases[i].s, why);
		cr_assert_eq(us, cases[i].us, "%s: %lld, not %lld", cases[i].s, (long long)us,
		             cases[i].us);
	}
}

#define SYNTAX "expected an ISO 8601 duration such as \"PT30S\" or \"P1DT2H\""

Test(duration, every_malformed_form_is_refused_with_its_reason)
{
	static const struct {
		const char *s, *why;
	} cases[] = {
		{ "", SYNTAX },
		{ "P", SYNTAX },
		{ "PT", SYNTAX },
		{ "30s", SYNTAX },
		{ "pt30s", SYNTAX },
		{ "PT30s", SYNTAX },
		{ "PT1S1M", SYNTAX },
		{ "PT1M1H", SYNTAX },
		{ "PT1H1H", SYNTAX },
		{ "PT1S1S", SYNTAX },
		{ "P1DT", SYNTAX },
		{ "P1D1D", SYNTAX },
		{ "PT1D", SYNTAX },
		{ "P1H", SYNTAX },
		{ "P1S", SYNTAX },
		{ "P1.5D", SYNTAX },
		{ "PT-1S", SYNTAX },
		{ "PT+1S", SYNTAX },
		{ "PT1S ", SYNTAX },
		{ " PT1S", SYNTAX },
		{ "PTT1S", SYNTAX },
		{ "PT1234567890S", SYNTAX }, /* ten digits */
		{ "P1M", "months have no fixed length: use days" },
		{ "P1Y", "use days, hours, minutes and seconds only (P1DT2H3M4S)" },
		{ "P1W", "use days, hours, minutes and seconds only (P1DT2H3M4S)" },
		{ "PT1.5H", "only seconds take a fraction, of 1 to 6 digits" },
		{ "PT1.S", "only seconds take a fraction, of 1 to 6 digits" },
		{ "PT1.1234567S", "only seconds take a fraction, of 1 to 6 digits" },
		/* 999999999 days are 8.6e19 microseconds: more than int64 holds. */
		{ "P999999999D", "too long a duration" },
		{ "P99999999DT999999999H", "too long a duration" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char why[128] = "";

		cr_assert_eq(iso8601_duration(cases[i].s, NULL, why, sizeof(why)), -1, "%s",
		             cases[i].s);
		cr_assert_str_eq(why, cases[i].why, "for \"%s\"", cases[i].s);
	}
}

Test(time, an_instant_is_counted_from_the_epoch_after_its_offset)
{
	static const struct {
		const char *s;
		long long us;
	} cases[] = {
		{ "1970-01-01T00:00:00Z", 0 },
		{ "1970-01-01T00:00:00.5Z", 500000 },
		{ "1970-01-01T00:00:00.000001Z", 1 },
		{ "1970-01-01T01:00:00+01:00", 0 },
		{ "1969-12-31T23:00:00-01:00", 0 },
		{ "2026-12-01T20:00:00Z", 1796155200LL * S },
		{ "2024-02-29T00:00:00Z", 1709164800LL * S },
		{ "2000-02-29T12:00:00Z", 951825600LL * S },
		{ "2026-01-01T00:00:00+15:59", 1767225600LL * S - (15 * 3600 + 59 * 60) * S },
		{ "2026-01-01T00:00:00-15:59", 1767225600LL * S + (15 * 3600 + 59 * 60) * S },
		{ "0001-01-01T00:00:00Z", ISO8601_TIME_MIN_US },
		{ "9999-12-31T23:59:59.999999Z", ISO8601_TIME_MAX_US },
		{ "0001-01-01T15:59:00+15:59", ISO8601_TIME_MIN_US },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int64_t us = -1;
		char why[128] = "";

		cr_assert_eq(iso8601_time(cases[i].s, &us, why, sizeof(why)), 0, "%s: %s",
		             cases[i].s, why);
		cr_assert_eq(us, cases[i].us, "%s: %lld, not %lld", cases[i].s, (long long)us,
		             cases[i].us);
	}
}

#define TSYNTAX "expected an RFC 3339 time such as \"2026-12-01T20:00:00Z\""
#define NODATE  "no such date or time"
#define OFFSET  "the offset must be within -15:59 and +15:59"
#define YEARS   "the time must fall within the years 0001 and 9999 in UTC"

Test(time, every_malformed_or_impossible_time_is_refused_with_its_reason)
{
	static const struct {
		const char *s, *why;
	} cases[] = {
		{ "", TSYNTAX },
		{ "2026-12-01", TSYNTAX },
		{ "2026-12-01 20:00:00Z", TSYNTAX },
		{ "2026-12-01T20:00:00", TSYNTAX },
		{ "2026-12-01t20:00:00Z", TSYNTAX },
		{ "2026-12-01T20:00:00z", TSYNTAX },
		{ "2026-12-01T20:00Z", TSYNTAX },
		{ "2026-12-1T20:00:00Z", TSYNTAX },
		{ "26-12-01T20:00:00Z", TSYNTAX },
		{ "12026-12-01T20:00:00Z", TSYNTAX },
		{ "2026-12-01T20:00:00.Z", TSYNTAX },
		{ "2026-12-01T20:00:00.1234567Z", TSYNTAX },
		{ "2026-12-01T20:00:00+0200", TSYNTAX },
		{ "2026-12-01T20:00:00+2:00", TSYNTAX },
		{ "2026-12-01T20:00:00+24:00", TSYNTAX },
		{ "2026-12-01T20:00:00+02:60", TSYNTAX },
		{ "2026-12-01T20:00:00Z ", TSYNTAX },
		{ "2026-02-29T00:00:00Z", NODATE },
		{ "1900-02-29T00:00:00Z", NODATE },
		{ "2026-04-31T00:00:00Z", NODATE },
		{ "2026-13-01T00:00:00Z", NODATE },
		{ "2026-00-01T00:00:00Z", NODATE },
		{ "2026-12-00T00:00:00Z", NODATE },
		{ "2026-12-01T24:00:00Z", NODATE },
		{ "2026-12-01T23:60:00Z", NODATE },
		{ "2026-12-31T23:59:60Z", NODATE }, /* no leap second */
		{ "0000-01-01T00:00:00Z", NODATE },
		/* PostgreSQL: "time zone displacement out of range". */
		{ "2026-01-01T00:00:00+16:00", OFFSET },
		{ "2026-01-01T00:00:00-16:00", OFFSET },
		{ "2026-01-01T00:00:00+23:59", OFFSET },
		{ "0001-01-01T00:00:00+00:01", YEARS },
		{ "9999-12-31T23:59:59-00:01", YEARS },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char why[128] = "";

		cr_assert_eq(iso8601_time(cases[i].s, NULL, why, sizeof(why)), -1, "%s",
		             cases[i].s);
		cr_assert_str_eq(why, cases[i].why, "for \"%s\"", cases[i].s);
	}
}
