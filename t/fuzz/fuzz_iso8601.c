/*
 * fuzz_iso8601.c - the duration and time parsers (core/iso8601.h).
 *
 * The input, cut at its first NUL, is read as a duration and as a time.
 * Either may refuse it, always with a reason; what is taken must be in
 * range: a duration is never negative, a time lies within the years 0001
 * and 9999, and written back in UTC ("...Z", six decimals) it reads as the
 * same instant. That PostgreSQL reads the same values the same way is
 * t/db/test_iso8601's.
 */
#include <inttypes.h>
#include <string.h>

#include "core/iso8601.h"
#include "fuzz.h"

/* us (within the range) as "YYYY-MM-DDTHH:MM:SS.ffffffZ". */
static void utc(int64_t us, char *out, size_t len)
{
	int64_t secs = us / 1000000, frac = us % 1000000, days, rem, z, era, doe, yoe, doy, mp;
	long y, m, d;

	if (frac < 0) {
		frac += 1000000;
		secs--;
	}
	days = secs / 86400;
	rem = secs % 86400;
	if (rem < 0) {
		rem += 86400;
		days--;
	}
	/* The inverse of the parser's days_from_civil. */
	z = days + 719468;
	era = (z >= 0 ? z : z - 146096) / 146097;
	doe = z - era * 146097;
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	d = (long)(doy - (153 * mp + 2) / 5 + 1);
	m = (long)(mp < 10 ? mp + 3 : mp - 9);
	y = (long)(yoe + era * 400 + (m <= 2));
	snprintf(out, len, "%04ld-%02ld-%02ldT%02ld:%02ld:%02ld.%06" PRId64 "Z", y, m, d,
	         (long)(rem / 3600), (long)(rem / 60 % 60), (long)(rem % 60), frac);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char s[128], why[128], back[64], why2[128];
	int64_t v, v2;
	size_t n = size < sizeof(s) - 1 ? size : sizeof(s) - 1;

	memcpy(s, data, n);
	s[n] = '\0';
	why[0] = '\0';
	if (iso8601_duration(s, &v, why, sizeof(why)) == 0)
		FUZZ_CHECK(v >= 0, "\"%s\": %" PRId64, s, v);
	else
		FUZZ_CHECK(why[0] != '\0', "\"%s\": refused without a reason", s);
	why[0] = '\0';
	if (iso8601_time(s, &v, why, sizeof(why)) == 0) {
		FUZZ_CHECK(v >= ISO8601_TIME_MIN_US && v <= ISO8601_TIME_MAX_US, "\"%s\": %" PRId64,
		           s, v);
		utc(v, back, sizeof(back));
		FUZZ_CHECK(iso8601_time(back, &v2, why2, sizeof(why2)) == 0 && v2 == v,
		           "\"%s\" is %" PRId64 ", written back \"%s\"", s, v, back);
	} else {
		FUZZ_CHECK(why[0] != '\0', "\"%s\": refused without a reason", s);
	}
	return 0;
}
