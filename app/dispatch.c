/* dispatch.c - the outbox dispatcher (see dispatch.h). */
#include "dispatch.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "db.h"
#include "log.h"

enum {
	D_CLAIM,
	D_DONE,
	D_FAIL,
	D_STATS,
	D__COUNT
};

static const struct db_stmt dispatch_stmts[D__COUNT] = {
	/* $1 batch, $2 owner, $3 lease (interval). The attempt is counted
	 * when it starts, so a dispatcher that dies mid-delivery still
	 * leaves the attempt on record. */
	[D_CLAIM] = {"d_claim",
		     "WITH due AS ("
		     "  SELECT o.id FROM outbox o"
		     "   WHERE o.published_at IS NULL AND o.dead_at IS NULL"
		     "     AND o.next_attempt_at <= now()"
		     "     AND (o.lease_until IS NULL OR o.lease_until < now())"
		     "     AND NOT EXISTS (SELECT 1 FROM outbox p"
		     "                      WHERE p.workflow_id = o.workflow_id AND p.seq < o.seq"
		     "                        AND p.published_at IS NULL)"
		     "   ORDER BY o.next_attempt_at, o.id"
		     "   LIMIT $1"
		     "   FOR UPDATE SKIP LOCKED)"
		     " UPDATE outbox o SET lease_owner = $2, lease_until = now() + $3::interval,"
		     "        attempts = o.attempts + 1"
		     "   FROM due WHERE o.id = due.id"
		     " RETURNING o.id, o.event_id, o.type, o.workflow_id, o.attempts, o.payload"},
	/* $1 ids (bigint[]), $2 owner */
	[D_DONE] = {"d_done",
		    "UPDATE outbox SET published_at = now(), lease_owner = NULL, lease_until = NULL"
		    " WHERE id = ANY($1::bigint[]) AND lease_owner = $2"},
	/* $1 ids, $2 owner, $3 errors (text[]), $4 delays in ms (bigint[]),
	 * $5 dead (bool[]) */
	[D_FAIL] = {"d_fail",
		    "UPDATE outbox o SET last_error = f.err,"
		    "       next_attempt_at = now() + f.delay_ms * interval '1 millisecond',"
		    "       dead_at = CASE WHEN f.dead THEN now() END,"
		    "       lease_owner = NULL, lease_until = NULL"
		    "  FROM unnest($1::bigint[], $3::text[], $4::bigint[], $5::bool[])"
		    "       AS f(id, err, delay_ms, dead)"
		    " WHERE o.id = f.id AND o.lease_owner = $2"},
	[D_STATS] = {"d_stats",
		     "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)"
		     "  FROM outbox WHERE published_at IS NULL AND dead_at IS NULL"},
};

struct dispatcher {
	const struct conf *c;
	struct sink *sink;
	struct db *db;
	char owner[128];
	char lease[32];
	long delays[DISPATCH_BACKOFF_MAX];
	int ndelays;
	unsigned seed;
	struct timespec started;
};

static volatile sig_atomic_t dispatch_stopping;

void dispatch_stop(void)
{
	dispatch_stopping = 1;
}

int dispatch_backoff_parse(const char *spec, long *delays, int max, struct err *e)
{
	char *copy = strdup(spec), *save = NULL, *tok;
	struct conf *scratch = conf_new();
	int n = 0;

	if (copy == NULL || scratch == NULL) {
		free(copy);
		conf_free(scratch);
		return err_set(e, ERR_INTERNAL, "out of memory");
	}
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		/* Reuse the one duration parser through a scratch config. */
		if (n == max || conf_set(scratch, "timeout", tok, "backoff", e) < 0) {
			err_set(e, ERR_CONFIG,
				"invalid value \"%s\" for \"backoff\": expected up to %d durations "
				"separated by commas, such as 5s,5m,30m,2h",
				spec, max);
			n = -1;
			goto out;
		}
		delays[n++] = scratch->timeout;
	}
	if (n == 0) {
		err_set(e, ERR_CONFIG, "invalid value \"%s\" for \"backoff\": no delays", spec);
		n = -1;
	}
out:
	free(copy);
	conf_free(scratch);
	return n;
}

long dispatch_backoff_delay(const long *delays, int n, int attempt, unsigned *seed)
{
	long base = delays[attempt - 1 < n ? (attempt < 1 ? 0 : attempt - 1) : n - 1];
	/* +-20%: dispatchers that failed together do not retry together. */
	double f = 0.8 + 0.4 * ((double)rand_r(seed) / (double)RAND_MAX);

	return (long)((double)base * f);
}

struct dispatcher *dispatch_new(const struct conf *c, struct sink *s, struct err *e)
{
	struct dispatcher *d = calloc(1, sizeof(*d));
	char host[64] = "localhost", appname[96];
	struct db_settings ds;

	if (d == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	d->c = c;
	d->sink = s;
	d->ndelays = dispatch_backoff_parse(c->backoff, d->delays, DISPATCH_BACKOFF_MAX, e);
	if (d->ndelays < 0)
		goto fail;
	gethostname(host, sizeof(host) - 1);
	snprintf(d->owner, sizeof(d->owner), "%s:%ld", host, (long)getpid());
	snprintf(d->lease, sizeof(d->lease), "%ld milliseconds", c->lease);
	snprintf(appname, sizeof(appname), "%s-dispatch-%ld", c->application_name, (long)getpid());
	d->seed = (unsigned)getpid() ^ (unsigned)time(NULL);
	clock_gettime(CLOCK_MONOTONIC, &d->started);

	ds = (struct db_settings){.conninfo = c->db,
				  .application_name = appname,
				  .lock_timeout_ms = 0,
				  .statement_timeout_ms = 60000,
				  .stmts = dispatch_stmts,
				  .nstmts = D__COUNT};
	d->db = db_open(&ds, e);
	if (d->db == NULL || e->code != ERR_NONE)
		goto fail;
	if (c->loop) {
		PGresult *res = db_exec(db_conn(d->db), "LISTEN idemflow_outbox", 0, NULL, e);
		if (res == NULL)
			goto fail;
		PQclear(res);
	}
	return d;
fail:
	dispatch_free(d);
	return NULL;
}

void dispatch_free(struct dispatcher *d)
{
	if (d == NULL)
		return;
	db_close(d->db);
	free(d);
}

static double elapsed_s(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Append s to a PostgreSQL array literal as one quoted element. */
static void array_elem(struct buf *b, const char *s)
{
	buf_putc(b, b->len > 1 ? ',' : '{');
	buf_putc(b, '"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			buf_putc(b, '\\');
		buf_putc(b, *s);
	}
	buf_putc(b, '"');
}

static void array_end(struct buf *b)
{
	if (b->len == 0)
		buf_putc(b, '{');
	buf_putc(b, '}');
}

static const char *outcome_name(enum sink_result r, int dead)
{
	if (r == SINK_OK)
		return "published";
	return dead ? "dead" : "retry";
}

/* One claim, delivery and record. Returns the number of events claimed,
 * or -1 with e filled. */
static int dispatch_batch(struct dispatcher *d, struct dispatch_stats *st, struct err *e)
{
	const struct conf *c = d->c;
	char batch[16];
	PGresult *res;
	int n, rc = -1;
	struct sink_event *evs = NULL;
	struct sink_outcome *outs = NULL;
	struct buf done = BUF_INIT, ids = BUF_INIT, errs = BUF_INIT, delays = BUF_INIT,
		   deads = BUF_INIT;
	int nfail = 0, ndone = 0;

	snprintf(batch, sizeof(batch), "%d", c->batch);
	const char *cp[3] = {batch, d->owner, d->lease};
	res = db_run(d->db, D_CLAIM, 3, cp, e);
	if (res == NULL)
		return -1;
	n = PQntuples(res);
	if (n == 0) {
		PQclear(res);
		return 0;
	}
	st->claimed += n;
	evs = calloc((size_t)n, sizeof(*evs));
	outs = calloc((size_t)n, sizeof(*outs));
	if (evs == NULL || outs == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		evs[i] = (struct sink_event){.event_id = PQgetvalue(res, i, 1),
					     .type = PQgetvalue(res, i, 2),
					     .workflow_id = PQgetvalue(res, i, 3),
					     .attempt = atoi(PQgetvalue(res, i, 4)),
					     .max_attempts = c->max_attempts,
					     .payload = PQgetvalue(res, i, 5),
					     .payload_len = (size_t)PQgetlength(res, i, 5)};
		outs[i].retry_after_s = -1;
	}

	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (d->sink->deliver(d->sink, evs, (size_t)n, outs, e) < 0)
		goto out; /* the leases run out; the events are delivered later */
	double batch_ms = elapsed_s(&t0) * 1e3;

	for (int i = 0; i < n; i++) {
		struct sink_outcome *o = &outs[i];
		int dead = o->result == SINK_DEAD ||
			   (o->result == SINK_RETRY && evs[i].attempt >= c->max_attempts);
		char num[32], line[1024];
		size_t ll = 0;

		if (o->result == SINK_OK) {
			buf_putc(&done, done.len ? ',' : '{');
			buf_puts(&done, PQgetvalue(res, i, 0));
			ndone++;
		} else {
			long delay = dispatch_backoff_delay(d->delays, d->ndelays, evs[i].attempt,
							    &d->seed);
			if (o->retry_after_s >= 0 && o->retry_after_s * 1000 > delay)
				delay = o->retry_after_s * 1000;
			buf_putc(&ids, ids.len ? ',' : '{');
			buf_puts(&ids, PQgetvalue(res, i, 0));
			/* last_error is for humans: keep it short. */
			char trunc[201];
			snprintf(trunc, sizeof(trunc), "%s", o->error[0] ? o->error : "failed");
			array_elem(&errs, trunc);
			buf_printf(&delays, "%s%ld", delays.len ? "," : "{", dead ? 0 : delay);
			buf_printf(&deads, "%s%s", deads.len ? "," : "{", dead ? "t" : "f");
			nfail++;
		}
		log_kv(line, sizeof(line), &ll, "event_id", evs[i].event_id);
		log_kv(line, sizeof(line), &ll, "type", evs[i].type);
		log_kv(line, sizeof(line), &ll, "workflow", evs[i].workflow_id);
		snprintf(num, sizeof(num), "%d/%d", evs[i].attempt, c->max_attempts);
		log_kv(line, sizeof(line), &ll, "attempt", num);
		log_kv(line, sizeof(line), &ll, "outcome", outcome_name(o->result, dead));
		snprintf(num, sizeof(num), "%.3f", o->latency_ms > 0 ? o->latency_ms : batch_ms / n);
		log_kv(line, sizeof(line), &ll, "latency_ms", num);
		if (o->status) {
			snprintf(num, sizeof(num), "%d", o->status);
			log_kv(line, sizeof(line), &ll, "status", num);
		}
		if (o->result != SINK_OK)
			log_kv(line, sizeof(line), &ll, "error", o->error);
		if (dead)
			log_error("event is dead", "%s", line);
		else if (o->result != SINK_OK)
			log_warning("delivery failed", "%s", line);
		else
			log_info("delivered", "%s", line);
		if (o->result == SINK_OK)
			st->published++;
		else if (dead)
			st->dead++;
		else
			st->retried++;
	}
	if (ndone) {
		array_end(&done);
		const char *p[2] = {done.data, d->owner};
		PGresult *r = db_run(d->db, D_DONE, 2, p, e);
		if (r == NULL)
			goto out;
		PQclear(r);
	}
	if (nfail) {
		array_end(&ids);
		array_end(&errs);
		array_end(&delays);
		array_end(&deads);
		const char *p[5] = {ids.data, d->owner, errs.data, delays.data, deads.data};
		PGresult *r = db_run(d->db, D_FAIL, 5, p, e);
		if (r == NULL)
			goto out;
		PQclear(r);
	}
	rc = n;
out:
	PQclear(res);
	free(evs);
	free(outs);
	buf_free(&done);
	buf_free(&ids);
	buf_free(&errs);
	buf_free(&delays);
	buf_free(&deads);
	return rc;
}

/* --loop: sleep until a notification, the poll interval, the end of the
 * run or a stop signal. */
static int wait_for_work(struct dispatcher *d, struct err *e)
{
	const struct conf *c = d->c;
	PGconn *conn = db_conn(d->db);
	long wait = c->poll_interval;
	struct pollfd pfd;
	PGnotify *nt;

	if (c->max_runtime > 0) {
		long left = c->max_runtime - (long)(elapsed_s(&d->started) * 1e3);
		if (left < wait)
			wait = left > 0 ? left : 0;
	}
	pfd.fd = PQsocket(conn);
	pfd.events = POLLIN;
	pfd.revents = 0;
	if (poll(&pfd, 1, (int)wait) < 0 && errno != EINTR)
		return err_set(e, ERR_INTERNAL, "poll: %s", strerror(errno));
	if (pfd.revents && !PQconsumeInput(conn))
		return db_classify(conn, NULL, e);
	while ((nt = PQnotifies(conn)) != NULL)
		PQfreemem(nt);
	return 0;
}

static int out_of_time(const struct dispatcher *d)
{
	return d->c->max_runtime > 0 && elapsed_s(&d->started) * 1e3 >= (double)d->c->max_runtime;
}

int dispatch_run(struct dispatcher *d, struct dispatch_stats *st, struct err *e)
{
	int rc = 0;
	PGresult *res;

	memset(st, 0, sizeof(*st));
	err_clear(e);
	while (!dispatch_stopping && !out_of_time(d)) {
		int n = dispatch_batch(d, st, e);
		if (n < 0) {
			rc = -1;
			break;
		}
		if (n > 0)
			continue;
		if (!d->c->loop)
			break;
		if (wait_for_work(d, e) < 0) {
			rc = -1;
			break;
		}
	}
	st->duration_s = elapsed_s(&d->started);
	if (rc == 0) {
		res = db_run(d->db, D_STATS, 0, NULL, e);
		if (res == NULL)
			return -1;
		st->pending = atol(PQgetvalue(res, 0, 0));
		st->oldest_pending_s = atof(PQgetvalue(res, 0, 1));
		PQclear(res);
	}
	return rc;
}
