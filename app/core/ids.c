/* ids.c - workflow ids, tokens and timestamps (see ids.h). */
#include "core/ids.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/time.h>
#include <time.h>

int ids_random(void *buf, size_t n)
{
	uint8_t *p = buf;

	while (n > 0) {
		ssize_t r = getrandom(p, n, 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/*
 * The 12 bits after the version hold the fraction of the millisecond
 * (RFC 9562, 6.2 method 3, in steps of 1/4096 ms, about 244 ns), and the
 * process never hands out the same or a smaller timestamp twice. Ids made
 * on one host in sequence (a create answered before the next one starts,
 * whichever worker makes it) therefore sort in the order they were made:
 * the list promises that order, and random bits within a millisecond
 * would break it.
 */
int ids_uuid7(char *out)
{
	static uint64_t last; /* ms << 12 | fraction, of this process */
	uint8_t b[16];
	struct timespec ts;
	uint64_t t;

	if (ids_random(b, sizeof(b)) < 0)
		return -1;
	clock_gettime(CLOCK_REALTIME, &ts);
	t = ((uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000) << 12 |
	    ((uint64_t)ts.tv_nsec % 1000000) * 4096 / 1000000;
	if (t <= last)
		t = last + 1; /* the clock stood still or stepped back */
	last = t;
	for (int i = 0; i < 6; i++)
		b[i] = (uint8_t)(t >> (12 + 8 * (5 - i)));
	b[6] = (uint8_t)(0x70 | ((t >> 8) & 0x0f)); /* version 7 */
	b[7] = (uint8_t)t;
	b[8] = (uint8_t)(0x80 | (b[8] & 0x3f)); /* RFC 9562 variant */
	/* 8-4-4-4-12 lowercase hex digits. */
	for (int i = 0, o = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			out[o++] = '-';
		out[o++] = "0123456789abcdef"[b[i] >> 4];
		out[o++] = "0123456789abcdef"[b[i] & 0x0f];
	}
	out[IDS_UUID_LEN] = '\0';
	return 0;
}

int ids_is_uuid(const char *s)
{
	for (int i = 0; i < IDS_UUID_LEN; i++) {
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (s[i] != '-')
				return 0;
		} else if (!isxdigit((unsigned char)s[i])) {
			return 0;
		}
	}
	return s[IDS_UUID_LEN] == '\0';
}

int ids_token(char *out)
{
	static const char b64[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	uint8_t r[33]; /* 32 bytes of entropy; one pad byte makes 44 sextets */
	size_t o = 4;

	if (ids_random(r, 32) < 0)
		return -1;
	r[32] = 0;
	memcpy(out, "idf_", 4);
	for (size_t i = 0; i < 33; i += 3) {
		uint32_t v = (uint32_t)r[i] << 16 | (uint32_t)r[i + 1] << 8 | r[i + 2];
		out[o++] = b64[(v >> 18) & 63];
		out[o++] = b64[(v >> 12) & 63];
		out[o++] = b64[(v >> 6) & 63];
		out[o++] = b64[v & 63];
	}
	out[IDS_TOKEN_LEN] = '\0'; /* drop the sextet that is only padding */
	return 0;
}

void ids_now(char *out)
{
	struct timeval tv;
	struct tm tm;
	unsigned long us;

	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	strftime(out, IDS_TS_LEN + 1, "%Y-%m-%dT%H:%M:%S", &tm); /* 19 characters */
	us = (unsigned long)tv.tv_usec % 1000000;
	out[19] = '.';
	for (int i = 25; i >= 20; i--, us /= 10)
		out[i] = (char)('0' + us % 10);
	out[26] = 'Z';
	out[27] = '\0';
}
