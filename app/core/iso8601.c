/* iso8601.c - ISO 8601 durations and RFC 3339 times (see iso8601.h). */
#include "core/iso8601.h"

#include <stdio.h>

#define US_PER_S   1000000LL
#define S_PER_DAY  86400LL
#define PART_DIGIT 9 /* digits a duration's part may have */

/* Read 1 to maxd digits at *p as a number into *v, advancing *p; -1 when
 * there are none or more than maxd. */
static int digits(const char **p, int maxd, long long *v)
{
	int n = 0;

	*v = 0;
	while (**p >= '0' && **p <= '9' && n < maxd) {
		*v = *v * 10 + (**p - '0');
		(*p)++;
		n++;
	}
	return n > 0 && !(**p >= '0' && **p <= '9') ? 0 : -1;
}

/* Exactly n digits at *p (a field of a time), advancing *p. */
static int field(const char **p, int n, long long *v)
{
	const char *start = *p;

	return digits(p, n, v) == 0 && *p - start == n ? 0 : -1;
}

/* A fraction of 1 to 6 digits after the '.' at *p, as microseconds. */
static int fraction(const char **p, long long *us)
{
	const char *start = *p;

	if (digits(p, 6, us) < 0)
		return -1;
	for (long n = *p - start; n < 6; n++)
		*us *= 10;
	return 0;
}

int iso8601_duration(const char *s, int64_t *usecs, char *why, size_t wlen)
{
	static const long long unit_us[] = { ['D'] = S_PER_DAY * US_PER_S,
		                             ['H'] = 3600 * US_PER_S,
		                             ['M'] = 60 * US_PER_S,
		                             ['S'] = US_PER_S };
	const char *p = s;
	long long v, frac, total = 0, part;
	int parts = 0, in_time = 0;
	char last = 0;

	if (*p++ != 'P')
		goto syntax;
	while (*p != '\0') {
		if (*p == 'T' && !in_time) {
			in_time = 1;
			last = 0;
			if (*++p == '\0')
				goto syntax;
			continue;
		}
		if (digits(&p, PART_DIGIT, &v) < 0)
			goto syntax;
		frac = 0;
		if (*p == '.' && in_time) {
			p++;
			if (fraction(&p, &frac) < 0 || *p != 'S') {
				snprintf(why, wlen,
				         "only seconds take a fraction, of 1 to 6 digits");
				return -1;
			}
		}
		switch (*p) {
		case 'D':
			if (in_time || last != 0)
				goto syntax;
			break;
		case 'H':
			if (!in_time || last != 0)
				goto syntax;
			break;
		case 'M':
			if (!in_time) {
				snprintf(why, wlen, "months have no fixed length: use days");
				return -1;
			}
			if (last != 0 && last != 'H')
				goto syntax;
			break;
		case 'S':
			if (!in_time || last == 'S')
				goto syntax;
			break;
		case 'Y':
		case 'W':
			snprintf(why, wlen,
			         "use days, hours, minutes and seconds only (P1DT2H3M4S)");
			return -1;
		default: goto syntax;
		}
		/* Nine digits of days are 8.6e19 us: past int64, so check. */
		if (__builtin_mul_overflow(v, unit_us[(unsigned char)*p], &part) ||
		    __builtin_add_overflow(total, part + frac, &total)) {
			snprintf(why, wlen, "too long a duration");
			return -1;
		}
		last = *p++;
		parts++;
	}
	if (parts == 0)
		goto syntax;
	if (usecs != NULL)
		*usecs = total;
	return 0;
syntax:
	snprintf(why, wlen, "expected an ISO 8601 duration such as \"PT30S\" or \"P1DT2H\"");
	return -1;
}

/* Days from 1970-01-01 to y-m-d of the proleptic Gregorian calendar. */
static long long days_from_civil(long long y, long long m, long long d)
{
	long long era, yoe, doy, doe;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = y - era * 400;
	doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

int iso8601_time(const char *s, int64_t *unix_us, char *why, size_t wlen)
{
	static const int mdays[12] = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	const char *p = s;
	long long y, mo, d, h, mi, sec, frac = 0, oh = 0, om = 0, us;
	int sign = 0;

	if (field(&p, 4, &y) < 0 || *p++ != '-' || field(&p, 2, &mo) < 0 || *p++ != '-' ||
	    field(&p, 2, &d) < 0 || *p++ != 'T' || field(&p, 2, &h) < 0 || *p++ != ':' ||
	    field(&p, 2, &mi) < 0 || *p++ != ':' || field(&p, 2, &sec) < 0)
		goto syntax;
	if (*p == '.' && (p++, fraction(&p, &frac) < 0))
		goto syntax;
	if (*p == 'Z') {
		p++;
	} else if (*p == '+' || *p == '-') {
		sign = *p++ == '+' ? 1 : -1;
		if (field(&p, 2, &oh) < 0 || *p++ != ':' || field(&p, 2, &om) < 0 || oh > 23 ||
		    om > 59)
			goto syntax;
	} else {
		goto syntax;
	}
	if (*p != '\0')
		goto syntax;
	if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] ||
	    (mo == 2 && d == 29 && !(y % 4 == 0 && (y % 100 != 0 || y % 400 == 0))) || h > 23 ||
	    mi > 59 || sec > 59) {
		snprintf(why, wlen, "no such date or time");
		return -1;
	}
	if (oh * 60 + om > ISO8601_OFFSET_MAX_MIN) {
		snprintf(why, wlen, "the offset must be within -15:59 and +15:59");
		return -1;
	}
	us = ((days_from_civil(y, mo, d) * S_PER_DAY + h * 3600 + mi * 60 + sec -
	       sign * (oh * 3600 + om * 60)) *
	      US_PER_S) +
	     frac;
	if (us < ISO8601_TIME_MIN_US || us > ISO8601_TIME_MAX_US) {
		snprintf(why, wlen, "the time must fall within the years 0001 and 9999 in UTC");
		return -1;
	}
	if (unix_us != NULL)
		*unix_us = us;
	return 0;
syntax:
	snprintf(why, wlen, "expected an RFC 3339 time such as \"2026-12-01T20:00:00Z\"");
	return -1;
}
