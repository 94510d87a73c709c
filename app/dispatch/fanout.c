/* fanout.c - the tenant endpoints' delivery loop (see fanout.h). */
#include "dispatch/fanout.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/buf.h"
#include "core/log.h"
#include "core/utf8.h"
#include "dispatch/dmetrics.h"
#include "dispatch/queries.h"

/* The ledger keeps the first 4 KiB of every answer (delivery_attempts.response). */
#define FANOUT_RESPONSE_MAX 4096

/* The claim's columns (DQ_FCLAIM). */
enum {
	COL_TENANT,
	COL_ENDPOINT,
	COL_WORKFLOW,
	COL_SEQ,
	COL_ATTEMPTS,
	COL_EVENT_ID,
	COL_TYPE,
	COL_PAYLOAD,
	COL_TRACEPARENT,
	COL_TRACESTATE,
	COL_URL,
	COL_SECRET,
	COL_PREVIOUS
};

static double mono_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double wall_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Append one element to a PostgreSQL array literal: quoted (text), or as
 * it is (numbers, uuids, booleans). */
static void elem(struct buf *b, const char *s, int quote)
{
	buf_putc(b, b->len > 0 ? ',' : '{');
	if (!quote) {
		buf_puts(b, s);
		return;
	}
	buf_putc(b, '"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			buf_putc(b, '\\');
		buf_putc(b, *s);
	}
	buf_putc(b, '"');
}

static void end(struct buf *b)
{
	if (b->len == 0)
		buf_putc(b, '{');
	buf_putc(b, '}');
}

/* The recording's arrays (DQ_FRECORD) and the release's (DQ_FRELEASE). */
enum {
	A_TENANT,
	A_ENDPOINT,
	A_WORKFLOW,
	A_SEQ,
	A_EVENT_ID,
	A_STARTED,
	A_DURATION,
	A_STATUS,
	A_OUTCOME,
	A_RESPONSE,
	A_ERROR,
	A_DELAY,
	A_DEAD,
	R_TENANT,
	R_ENDPOINT,
	R_WORKFLOW,
	R_SEQ,
	A__COUNT
};

/* Log one attempt, as dispatch.c logs an event's. */
static void log_attempt(const struct sink_event *ev, const char *endpoint,
                        const struct sink_outcome *o, int attempt, int max, int dead)
{
	char line[1024], num[32];
	size_t ll = 0;

	if (o->result == SINK_OK && log_min_level > LOG_INFO)
		return;
	log_kv(line, sizeof(line), &ll, "event_id", ev->event_id);
	log_kv(line, sizeof(line), &ll, "endpoint", endpoint);
	log_kv(line, sizeof(line), &ll, "workflow", ev->workflow_id);
	snprintf(num, sizeof(num), "%d/%d", attempt, max);
	log_kv(line, sizeof(line), &ll, "attempt", num);
	log_kv(line, sizeof(line), &ll, "outcome", o->cls);
	snprintf(num, sizeof(num), "%.3f", o->latency_ms);
	log_kv(line, sizeof(line), &ll, "latency_ms", num);
	if (o->status) {
		snprintf(num, sizeof(num), "%d", o->status);
		log_kv(line, sizeof(line), &ll, "status", num);
	}
	if (o->result != SINK_OK)
		log_kv(line, sizeof(line), &ll, "error", o->error);
	if (dead)
		log_error("delivery is dead", "%s", line);
	else if (o->result != SINK_OK)
		log_warning("delivery to an endpoint failed", "%s", line);
	else
		log_info("delivered to an endpoint", "%s", line);
}

/* A claimed batch, from its claim to its recording. */
struct fbatch {
	PGresult *res; /* the claim's rows; the events point into them */
	char owner[192];
	int n;
	double lease_end; /* monotonic s */
	struct sink_event *evs;
	struct sink_outcome *outs;
	int *attempted;
	double *started; /* unix s */
	char *bodies;
	struct buf a[A__COUNT]; /* the recording's and the release's arrays */
	int nrec, nrel;
};

static void fbatch_free(struct fbatch *b)
{
	PQclear(b->res);
	free(b->evs);
	free(b->outs);
	free(b->attempted);
	free(b->started);
	free(b->bodies);
	for (int k = 0; k < A__COUNT; k++)
		buf_free(&b->a[k]);
	memset(b, 0, sizeof(*b));
}

/* Take over a claim's rows (res is b's from now on). */
static int fbatch_init(const struct fanout *f, struct fbatch *b, PGresult *res, const char *owner,
                       double lease_end, struct err *e)
{
	const struct conf *c = f->c;
	int n = PQntuples(res);

	memset(b, 0, sizeof(*b));
	b->res = res;
	b->n = n;
	b->lease_end = lease_end;
	snprintf(b->owner, sizeof(b->owner), "%s", owner);
	if (n == 0)
		return 0;
	b->evs = calloc((size_t)n, sizeof(*b->evs));
	b->outs = calloc((size_t)n, sizeof(*b->outs));
	b->attempted = calloc((size_t)n, sizeof(*b->attempted));
	b->started = calloc((size_t)n, sizeof(*b->started));
	b->bodies = malloc((size_t)n * FANOUT_RESPONSE_MAX);
	if (b->evs == NULL || b->outs == NULL || b->attempted == NULL || b->started == NULL ||
	    b->bodies == NULL)
		return err_set(e, ERR_INTERNAL, "out of memory");
	for (int i = 0; i < n; i++) {
		b->evs[i] = (struct sink_event){
			.event_id = PQgetvalue(res, i, COL_EVENT_ID),
			.type = PQgetvalue(res, i, COL_TYPE),
			.workflow_id = PQgetvalue(res, i, COL_WORKFLOW),
			.attempt = atoi(PQgetvalue(res, i, COL_ATTEMPTS)),
			.max_attempts = c->max_attempts,
			.payload = PQgetvalue(res, i, COL_PAYLOAD),
			.payload_len = (size_t)PQgetlength(res, i, COL_PAYLOAD),
			.traceparent = PQgetisnull(res, i, COL_TRACEPARENT)
			                   ? NULL
			                   : PQgetvalue(res, i, COL_TRACEPARENT),
			.tracestate = PQgetisnull(res, i, COL_TRACESTATE)
			                  ? NULL
			                  : PQgetvalue(res, i, COL_TRACESTATE),
			.url = PQgetvalue(res, i, COL_URL),
			.secret = PQgetvalue(res, i, COL_SECRET),
			.secret_previous = PQgetisnull(res, i, COL_PREVIOUS)
			                       ? NULL
			                       : PQgetvalue(res, i, COL_PREVIOUS),
		};
		b->outs[i].retry_after_s = -1;
		b->outs[i].body = b->bodies + (size_t)i * FANOUT_RESPONSE_MAX;
		b->outs[i].body_cap = FANOUT_RESPONSE_MAX;
	}
	return 0;
}

/* Claim a batch into b. Returns its size, or -1. */
static int fbatch_claim(struct fanout *f, struct fbatch *b, struct err *e)
{
	const struct conf *c = f->c;
	char owner[192], batch[16], lease[32];
	double lease_end;
	PGresult *res;

	snprintf(owner, sizeof(owner), "%s:f%lu", f->owner, ++f->claims);
	snprintf(batch, sizeof(batch), "%d", c->batch);
	snprintf(lease, sizeof(lease), "%ld milliseconds", c->lease);
	const char *p[DQ_FCLAIM__N] = {
		[DQ_FCLAIM_BATCH] = batch, [DQ_FCLAIM_OWNER] = owner, [DQ_FCLAIM_LEASE] = lease
	};
	/* Counted from before the claim was sent: errs on the safe side. */
	lease_end = mono_s() + (double)c->lease / 1e3;
	res = db_run(f->db, DQ_FCLAIM, DQ_FCLAIM__N, p, e);
	if (res == NULL)
		return -1;
	if (fbatch_init(f, b, res, owner, lease_end, e) < 0)
		return -1;
	return b->n;
}

/* Deliver in chunks that each end within `timeout`, never past the lease
 * (as dispatch.c's batch_deliver). Requests of one chunk run in parallel:
 * the claim never holds two deliveries of one endpoint and workflow with
 * ordering 'workflow'. Returns 0, or -1 when the sink failed. */
static int fbatch_deliver(struct fanout *f, struct fbatch *b, volatile const int *stopping,
                          struct err *e)
{
	const struct conf *c = f->c;

	for (int i = 0; i < b->n; i += c->parallel) {
		int m = b->n - i < c->parallel ? b->n - i : c->parallel;
		double t0, w0, ms;

		if (*stopping ||
		    mono_s() + (double)c->timeout / 1e3 + f->lease_margin_s > b->lease_end)
			break;
		t0 = mono_s();
		w0 = wall_s();
		if (f->sink->deliver(f->sink, b->evs + i, (size_t)m, b->outs + i, e) < 0)
			return -1;
		ms = (mono_s() - t0) * 1e3;
		for (int j = i; j < i + m; j++) {
			b->attempted[j] = 1;
			if (b->outs[j].latency_ms <= 0)
				b->outs[j].latency_ms = ms / m;
			b->started[j] = w0; /* the requests of a chunk start together */
		}
	}
	return 0;
}

/* The outcomes as the recording's arrays; log and count each attempt. */
static void fbatch_outcome(struct fanout *f, struct fbatch *b, struct fanout_stats *st)
{
	const struct conf *c = f->c;
	PGresult *res = b->res;
	struct buf *a = b->a;
	char text[FANOUT_RESPONSE_MAX + 1], clean[FANOUT_RESPONSE_MAX + 1];

	for (int i = 0; i < b->n; i++) {
		struct sink_outcome *o = &b->outs[i];
		const char *endpoint = PQgetvalue(res, i, COL_ENDPOINT);
		char num[64], err[201];
		int dead;
		long delay;

		if (!b->attempted[i]) {
			elem(&a[R_TENANT], PQgetvalue(res, i, COL_TENANT), 0);
			elem(&a[R_ENDPOINT], endpoint, 0);
			elem(&a[R_WORKFLOW], PQgetvalue(res, i, COL_WORKFLOW), 0);
			elem(&a[R_SEQ], PQgetvalue(res, i, COL_SEQ), 0);
			b->nrel++;
			continue;
		}
		if (o->cls == NULL)
			o->cls = o->result == SINK_OK ? "succeeded" : "other";
		if (o->status < 0 || o->status > 999)
			o->status = 0; /* the column's range */
		dead = o->result == SINK_DEAD ||
		       (o->result == SINK_RETRY && b->evs[i].attempt >= c->max_attempts);
		delay = f->backoff(f->delays, f->ndelays, b->evs[i].attempt, f->seed);
		if (o->result != SINK_OK && o->retry_after_s >= 0 &&
		    o->retry_after_s * 1000 > delay)
			delay = o->retry_after_s * 1000;
		elem(&a[A_TENANT], PQgetvalue(res, i, COL_TENANT), 0);
		elem(&a[A_ENDPOINT], endpoint, 0);
		elem(&a[A_WORKFLOW], b->evs[i].workflow_id, 0);
		elem(&a[A_SEQ], PQgetvalue(res, i, COL_SEQ), 0);
		elem(&a[A_EVENT_ID], b->evs[i].event_id, 1);
		snprintf(num, sizeof(num), "%.6f", b->started[i]);
		elem(&a[A_STARTED], num, 0);
		snprintf(num, sizeof(num), "%.3f", o->latency_ms);
		elem(&a[A_DURATION], num, 0);
		snprintf(num, sizeof(num), "%d", o->status);
		elem(&a[A_STATUS], num, 0);
		elem(&a[A_OUTCOME], o->cls, 1);
		/* The answer as text: a NUL ends it, and what is not UTF-8
		 * becomes U+FFFD, within the 4 KiB the column holds. */
		memcpy(text, o->body, o->body_len);
		text[o->body_len] = '\0';
		utf8_copy(clean, sizeof(clean), text);
		elem(&a[A_RESPONSE], clean, 1);
		utf8_copy(err, sizeof(err),
		          o->result == SINK_OK ? ""
		          : o->error[0]        ? o->error
		                               : "failed");
		elem(&a[A_ERROR], err, 1);
		snprintf(num, sizeof(num), "%ld", o->result == SINK_OK || dead ? 0 : delay);
		elem(&a[A_DELAY], num, 0);
		elem(&a[A_DEAD], dead ? "t" : "f", 0);
		b->nrec++;
		if (o->result == SINK_OK)
			st->delivered++;
		else if (dead)
			st->dead++;
		else
			st->retried++;
		dmetrics_endpoint_attempt(o->cls, dead);
		log_attempt(&b->evs[i], endpoint, o, b->evs[i].attempt, c->max_attempts, dead);
	}
	for (int k = 0; k < A__COUNT; k++)
		end(&a[k]);
}

/* Record b's attempts and hand back what it did not attempt. Returns the
 * endpoints disabled, or -1. */
static long fbatch_record(struct fanout *f, struct fbatch *b, struct err *e)
{
	const struct conf *c = f->c;
	struct buf *a = b->a;
	char maxf[16], after[32];
	PGresult *res;
	long disabled = 0;

	snprintf(maxf, sizeof(maxf), "%d", c->endpoint_disable_failures);
	snprintf(after, sizeof(after), "%ld milliseconds", c->endpoint_disable_after);
	if (b->nrec > 0) {
		const char *p[DQ_FRECORD__N] = {
			[DQ_FRECORD_OWNER] = b->owner,
			[DQ_FRECORD_TENANTS] = a[A_TENANT].data,
			[DQ_FRECORD_ENDPOINTS] = a[A_ENDPOINT].data,
			[DQ_FRECORD_WORKFLOWS] = a[A_WORKFLOW].data,
			[DQ_FRECORD_SEQS] = a[A_SEQ].data,
			[DQ_FRECORD_EVENT_IDS] = a[A_EVENT_ID].data,
			[DQ_FRECORD_STARTED] = a[A_STARTED].data,
			[DQ_FRECORD_DURATIONS] = a[A_DURATION].data,
			[DQ_FRECORD_STATUSES] = a[A_STATUS].data,
			[DQ_FRECORD_OUTCOMES] = a[A_OUTCOME].data,
			[DQ_FRECORD_RESPONSES] = a[A_RESPONSE].data,
			[DQ_FRECORD_ERRORS] = a[A_ERROR].data,
			[DQ_FRECORD_DELAYS_MS] = a[A_DELAY].data,
			[DQ_FRECORD_DEAD] = a[A_DEAD].data,
			[DQ_FRECORD_MAX_FAILURES] = maxf,
			[DQ_FRECORD_AFTER] = after,
		};
		res = db_run(f->db, DQ_FRECORD, DQ_FRECORD__N, p, e);
		if (res == NULL)
			return -1;
		disabled = atol(PQgetvalue(res, 0, 1));
		PQclear(res);
	}
	if (b->nrel > 0) {
		const char *p[DQ_FRELEASE__N] = {
			[DQ_FRELEASE_TENANTS] = a[R_TENANT].data,
			[DQ_FRELEASE_ENDPOINTS] = a[R_ENDPOINT].data,
			[DQ_FRELEASE_WORKFLOWS] = a[R_WORKFLOW].data,
			[DQ_FRELEASE_SEQS] = a[R_SEQ].data,
			[DQ_FRELEASE_OWNER] = b->owner,
		};
		res = db_run(f->db, DQ_FRELEASE, DQ_FRELEASE__N, p, e);
		if (res == NULL)
			return -1;
		PQclear(res);
	}
	return disabled;
}

static void count_disabled(struct fanout_stats *st, long disabled)
{
	if (disabled <= 0)
		return;
	st->disabled += disabled;
	dmetrics_endpoints_disabled(disabled);
	log_warning("endpoints disabled for failing", "count=%ld", disabled);
}

/* The database's half of a step, on a thread of its own while the main
 * thread delivers: record the batch before (if any), then claim the next
 * (if asked). The main thread does not touch the connection meanwhile. */
struct fstep {
	struct fanout *f;
	struct fbatch *prev; /* NULL: nothing to record */
	struct fbatch *next; /* NULL: no claim */
	long disabled;
	int rc;
	struct err e;
};

static void fstep_run(struct fstep *s)
{
	err_clear(&s->e);
	s->rc = 0;
	s->disabled = 0;
	if (s->prev != NULL) {
		s->disabled = fbatch_record(s->f, s->prev, &s->e);
		if (s->disabled < 0) {
			s->rc = -1;
			return;
		}
	}
	if (s->next != NULL && fbatch_claim(s->f, s->next, &s->e) < 0)
		s->rc = -1;
}

static void *fstep_main(void *arg)
{
	fstep_run(arg);
	return NULL;
}

int fanout_drain(struct fanout *f, struct fanout_stats *st, volatile const int *stopping,
                 int (*more)(void *arg), void *arg, struct err *e)
{
	struct fbatch prev, cur, next;
	long claimed = 0;
	int rc = -1;

	memset(&prev, 0, sizeof(prev));
	memset(&next, 0, sizeof(next));
	if (fbatch_claim(f, &cur, e) < 0)
		goto out;
	while (cur.n > 0) {
		struct fstep s = { .f = f, .prev = prev.res ? &prev : NULL };
		int go_on = !*stopping && more(arg);
		pthread_t th;
		sigset_t all, old;
		int threaded, delivered;

		st->claimed += cur.n;
		claimed += cur.n;
		s.next = go_on ? &next : NULL;
		/* PostgreSQL records the batch before and claims the next while
		 * the sink delivers this one. The next claim cannot take a later
		 * delivery of an endpoint and workflow in this one: those are
		 * still pending. */
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &old);
		threaded = pthread_create(&th, NULL, fstep_main, &s) == 0;
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (!threaded)
			fstep_run(&s);
		delivered = fbatch_deliver(f, &cur, stopping, e);
		if (threaded)
			pthread_join(th, NULL);
		if (s.rc < 0) {
			if (delivered == 0)
				*e = s.e;
			goto out; /* the leases run out; those deliveries are sent again */
		}
		count_disabled(st, s.disabled);
		if (delivered < 0)
			goto out;
		fbatch_free(&prev);
		fbatch_outcome(f, &cur, st);
		prev = cur;
		if (go_on) {
			cur = next;
			memset(&next, 0, sizeof(next));
		} else {
			memset(&cur, 0, sizeof(cur));
		}
	}
	/* The last delivered batch is recorded on its own. */
	if (prev.res != NULL) {
		long disabled = fbatch_record(f, &prev, e);
		if (disabled < 0)
			goto out;
		count_disabled(st, disabled);
	}
	rc = claimed > 0;
out:
	fbatch_free(&prev);
	fbatch_free(&cur);
	fbatch_free(&next);
	return rc;
}
