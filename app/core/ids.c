/* ids.c - workflow ids, tokens and timestamps (see ids.h). */
#include "core/ids.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

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
 * The random bits of ids come from a pool read POOL_BYTES at a time, one
 * getrandom(2) per 32 workflow ids (or 10 requests' trace and span ids)
 * instead of one per id. The pool is a page of its own that a fork leaves
 * zeroed in the child (MADV_WIPEONFORK, Linux 4.14): a worker forked from
 * the supervisor, or from a worker, finds it empty and reads its own, so
 * no two processes ever hand out the same bytes. Bytes are erased once
 * taken. Where the page cannot be had, each id reads its own bytes.
 */
#define POOL_BYTES 256
struct pool {
	size_t left; /* unread bytes, at the end of bytes[]; 0 after a fork */
	uint8_t bytes[POOL_BYTES];
};

static struct pool *pool;
static int no_pool;

static struct pool *pool_get(void)
{
	long page = sysconf(_SC_PAGESIZE);
	void *p;

	if (pool != NULL || no_pool)
		return pool;
	if (page < (long)sizeof(struct pool)) {
		no_pool = 1;
		return NULL;
	}
	p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		no_pool = 1;
		return NULL;
	}
	if (madvise(p, (size_t)page, MADV_WIPEONFORK) != 0) {
		munmap(p, (size_t)page);
		no_pool = 1;
		return NULL;
	}
	pool = p;
	return pool;
}

int ids_random_id(void *buf, size_t n)
{
	struct pool *pl = pool_get();
	uint8_t *from;

	if (pl == NULL || n > IDS_RANDOM_ID_MAX)
		return ids_random(buf, n);
	if (pl->left < n) {
		if (ids_random(pl->bytes, sizeof(pl->bytes)) < 0)
			return -1;
		pl->left = sizeof(pl->bytes);
	}
	from = pl->bytes + sizeof(pl->bytes) - pl->left;
	memcpy(buf, from, n);
	memset(from, 0, n);
	pl->left -= n;
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
/* The last timestamp handed out (ms << 12 | fraction): the process's own,
 * or the pool's once ids_share_clock() pointed it into shared memory. */
static atomic_ullong own_floor;
static atomic_ullong *floor_of = &own_floor;

void ids_share_clock(atomic_ullong *floor)
{
	unsigned long long mine = atomic_load(&own_floor), shared = atomic_load(floor);

	/* Whatever this process made already stays below what comes next. */
	while (shared < mine && !atomic_compare_exchange_weak(floor, &shared, mine))
		;
	floor_of = floor;
}

int ids_uuid7(char *out)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ids_uuid7_at(out, &ts);
}

int ids_uuid7_at(char *out, const struct timespec *now)
{
	uint8_t b[16];
	unsigned long long t, last; /* atomic_ullong's type, which clang holds to */

	/* Bytes 0 to 7 are the time and the version; 8 to 15 random. */
	if (ids_random_id(b + 8, 8) < 0)
		return -1;
	t = ((uint64_t)now->tv_sec * 1000 + (uint64_t)now->tv_nsec / 1000000) << 12 |
	    ((uint64_t)now->tv_nsec % 1000000) * 4096 / 1000000;
	last = atomic_load(floor_of);
	do {
		if (t <= last)
			t = last + 1; /* the clock stood still or stepped back */
	} while (!atomic_compare_exchange_weak(floor_of, &last, t));
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
