/* keystats.c - per-key replay and conflict counts (see keystats.h). */
#include "server/keystats.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/queries.h"

int keystats_init(struct keystats *ks)
{
	memset(ks, 0, sizeof(*ks));
	ks->slots = calloc(KEYSTATS_SLOTS, sizeof(*ks->slots));
	ks->order = calloc(KEYSTATS_MAX_KEYS, sizeof(*ks->order));
	clock_gettime(CLOCK_MONOTONIC, &ks->last_flush);
	if (ks->slots == NULL || ks->order == NULL) {
		keystats_free(ks);
		return -1;
	}
	return 0;
}

void keystats_free(struct keystats *ks)
{
	free(ks->slots);
	free(ks->order);
	ks->slots = NULL;
	ks->order = NULL;
	ks->n = 0;
	for (size_t i = 0; i < sizeof(ks->arr) / sizeof(ks->arr[0]); i++)
		buf_free(&ks->arr[i]);
}

/* FNV-1a over the tenant id and the key. */
static uint32_t slot_hash(long tenant_id, const char *key)
{
	uint32_t h = 2166136261u;
	unsigned long t = (unsigned long)tenant_id;

	for (size_t i = 0; i < sizeof(t); i++, t >>= 8)
		h = (h ^ (t & 0xff)) * 16777619u;
	for (const unsigned char *p = (const unsigned char *)key; *p; p++)
		h = (h ^ *p) * 16777619u;
	return h;
}

static void add_sat(int *counter)
{
	if (*counter < INT_MAX)
		(*counter)++;
}

void keystats_note(struct keystats *ks, long tenant_id, const char *key, enum idem_outcome o)
{
	struct keystats_entry *en;
	uint32_t i;

	if (o != IDEM_REPLAYED && o != IDEM_CONFLICT && o != IDEM_IN_FLIGHT)
		return;
	if (ks->slots == NULL || tenant_id <= 0 || key == NULL || !idem_key_valid(key))
		return;
	/* Linear probing in a table kept at most three quarters full, so a
	 * free slot always ends the search. */
	for (i = slot_hash(tenant_id, key) & (KEYSTATS_SLOTS - 1);;
	     i = (i + 1) & (KEYSTATS_SLOTS - 1)) {
		en = &ks->slots[i];
		if (en->tenant_id == 0)
			break;
		if (en->tenant_id == tenant_id && strcmp(en->key, key) == 0)
			goto count;
	}
	if (ks->n >= KEYSTATS_MAX_KEYS) {
		ks->dropped++;
		return;
	}
	en->tenant_id = tenant_id;
	strcpy(en->key, key); /* idem_key_valid: at most IDEM_KEY_MAX bytes */
	en->replays = en->conflicts = en->in_flight = 0;
	ks->order[ks->n++] = (int)i;
count:
	if (o == IDEM_REPLAYED)
		add_sat(&en->replays);
	else if (o == IDEM_CONFLICT)
		add_sat(&en->conflicts);
	else
		add_sat(&en->in_flight);
}

static long since_ms(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (long)(now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

long keystats_wait_ms(const struct keystats *ks)
{
	long left;

	if (ks->n == 0)
		return -1;
	left = KEYSTATS_INTERVAL_MS - since_ms(&ks->last_flush);
	return left > 0 ? left : 0;
}

/* qsort context is not portable; the slots are reached through a static
 * pointer set just before sorting (a worker is single-threaded). */
static const struct keystats_entry *sort_slots;

static int by_tenant_key(const void *a, const void *b)
{
	const struct keystats_entry *x = &sort_slots[*(const int *)a];
	const struct keystats_entry *y = &sort_slots[*(const int *)b];

	if (x->tenant_id != y->tenant_id)
		return x->tenant_id < y->tenant_id ? -1 : 1;
	return strcmp(x->key, y->key);
}

/* An element of a text[] literal: always quoted, with " and \ escaped
 * (a key may contain both, and braces and commas). */
static void put_quoted(struct buf *b, const char *s)
{
	buf_putc(b, '"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			buf_putc(b, '\\');
		buf_putc(b, *s);
	}
	buf_putc(b, '"');
}

int keystats_flush(struct keystats *ks, struct db *db, struct err *e)
{
	struct buf *a = ks->arr;
	PGresult *res;
	int rc = -1;

	err_clear(e);
	if (ks->n == 0)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &ks->last_flush);
	/* Same lock order in every worker: see Q_KEYSTATS_FLUSH. */
	sort_slots = ks->slots;
	qsort(ks->order, (size_t)ks->n, sizeof(*ks->order), by_tenant_key);
	for (int k = 0; k < 5; k++) {
		buf_reset(&a[k]);
		buf_putc(&a[k], '{');
	}
	for (int i = 0; i < ks->n; i++) {
		const struct keystats_entry *en = &ks->slots[ks->order[i]];
		const char *sep = i > 0 ? "," : "";

		buf_printf(&a[0], "%s%ld", sep, en->tenant_id);
		buf_puts(&a[1], sep);
		put_quoted(&a[1], en->key);
		buf_printf(&a[2], "%s%d", sep, en->replays);
		buf_printf(&a[3], "%s%d", sep, en->conflicts);
		buf_printf(&a[4], "%s%d", sep, en->in_flight);
	}
	for (int k = 0; k < 5; k++) {
		buf_putc(&a[k], '}');
		if (a[k].oom) {
			err_set(e, ERR_INTERNAL, "out of memory");
			goto out;
		}
	}
	const char *p[KEYSTATS_FLUSH__N] = { [KEYSTATS_FLUSH_TENANTS] = a[0].data,
		                             [KEYSTATS_FLUSH_KEYS] = a[1].data,
		                             [KEYSTATS_FLUSH_REPLAYS] = a[2].data,
		                             [KEYSTATS_FLUSH_CONFLICTS] = a[3].data,
		                             [KEYSTATS_FLUSH_IN_FLIGHT] = a[4].data };
	res = db_run(db, Q_KEYSTATS_FLUSH, KEYSTATS_FLUSH__N, p, e);
	if (res == NULL)
		goto out; /* keep the counts: the next attempt carries them */
	PQclear(res);
	for (int i = 0; i < ks->n; i++)
		ks->slots[ks->order[i]].tenant_id = 0;
	ks->n = 0;
	rc = 1;
out:
	return rc;
}

int keystats_flush_due(struct keystats *ks, struct db *db, struct err *e)
{
	long wait = keystats_wait_ms(ks);

	err_clear(e);
	if (wait != 0)
		return 0;
	return keystats_flush(ks, db, e);
}

unsigned long keystats_dropped(const struct keystats *ks)
{
	return ks->dropped;
}
