/* rcache.c - a worker's replay cache (see rcache.h). */
#include "server/rcache.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

long long rcache_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void drop(struct rcache_entry *en)
{
	PQclear(en->row);
	en->row = NULL;
}

void rcache_free(struct rcache *rc)
{
	if (rc->slots != NULL)
		for (size_t i = 0; i < RCACHE_SLOTS; i++)
			drop(&rc->slots[i]);
	free(rc->slots);
	rc->slots = NULL;
}

/* FNV-1a over the key, started from the token's digest (already uniform). */
static struct rcache_entry *slot(struct rcache *rc, const uint8_t token[FP_LEN], const char *key)
{
	uint32_t h = 2166136261u ^ ((uint32_t)token[0] | (uint32_t)token[1] << 8 |
	                            (uint32_t)token[2] << 16 | (uint32_t)token[3] << 24);

	for (const unsigned char *p = (const unsigned char *)key; *p; p++)
		h = (h ^ *p) * 16777619u;
	return &rc->slots[h & (RCACHE_SLOTS - 1)];
}

PGresult *rcache_get(struct rcache *rc, const uint8_t token[FP_LEN], const char *key, long long now)
{
	struct rcache_entry *en;

	if (rc->slots == NULL || key == NULL)
		return NULL;
	en = slot(rc, token, key);
	if (en->row == NULL || memcmp(en->token, token, FP_LEN) != 0 || strcmp(en->key, key) != 0)
		return NULL;
	if (now >= en->deadline) {
		drop(en);
		return NULL;
	}
	rc->hits++;
	return PQcopyResult(en->row, PG_COPYRES_ATTRS | PG_COPYRES_TUPLES);
}

/* The row's values in bytes, or SIZE_MAX when it is not a held row's shape. */
static size_t row_bytes(const PGresult *row)
{
	size_t n = 0;

	if (PQresultStatus(row) != PGRES_TUPLES_OK || PQntuples(row) != 1 ||
	    PQnfields(row) < RCACHE_NCOLS)
		return (size_t)-1;
	for (int i = 0; i < PQnfields(row); i++)
		n += (size_t)PQgetlength(row, 0, i);
	return n;
}

int rcache_put(struct rcache *rc, const uint8_t token[FP_LEN], const char *key, const PGresult *row,
               long ttl_ms, long long asked_at)
{
	struct rcache_entry *en;
	PGresult *copy;
	long long life;
	char *end;

	if (ttl_ms <= 0 || key == NULL || strlen(key) > IDEM_KEY_MAX || row == NULL ||
	    row_bytes(row) > RCACHE_MAX_ROW)
		return 0;
	/* Only a whole, live key row: one written and committed with its
	 * response (not 0, a claim; not 1, a command's rows waiting for
	 * theirs, through a proxy), and not expired. */
	if (PQgetisnull(row, 0, KEY_COL_FP) || PQgetisnull(row, 0, KEY_COL_MS_LEFT) ||
	    strcmp(PQgetvalue(row, 0, KEY_COL_STATUS), "0") == 0 ||
	    strcmp(PQgetvalue(row, 0, KEY_COL_STATUS), "1") == 0 ||
	    strcmp(PQgetvalue(row, 0, KEY_COL_EXPIRED), "f") != 0)
		return 0;
	life = strtoll(PQgetvalue(row, 0, KEY_COL_MS_LEFT), &end, 10);
	if (*end != '\0' || life <= 0)
		return 0;
	if (life > ttl_ms)
		life = ttl_ms;
	if (rc->slots == NULL && (rc->slots = calloc(RCACHE_SLOTS, sizeof(*rc->slots))) == NULL)
		return 0;
	copy = PQcopyResult(row, PG_COPYRES_ATTRS | PG_COPYRES_TUPLES);
	if (copy == NULL)
		return 0;
	en = slot(rc, token, key);
	drop(en);
	en->row = copy;
	en->deadline = asked_at + life;
	memcpy(en->token, token, FP_LEN);
	strcpy(en->key, key); /* at most IDEM_KEY_MAX bytes, checked above */
	rc->puts++;
	return 1;
}
