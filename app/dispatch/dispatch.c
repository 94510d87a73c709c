/* dispatch.c - the outbox dispatcher (see dispatch.h). */
#include "dispatch/dispatch.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/db.h"
#include "core/log.h"
#include "core/utf8.h"
#include "dispatch/dmetrics.h"
#include "dispatch/fanout.h"
#include "dispatch/queries.h"

struct dispatcher {
	const struct conf *c;
	struct sink *sink;
	struct db *db;
	char owner[128];      /* host:pid */
	char appname[96];     /* the connection's application_name: db keeps a pointer */
	unsigned long claims; /* claims made: each leases under owner:n */
	char lease[32];
	long delays[DISPATCH_BACKOFF_MAX];
	int ndelays;
	unsigned seed;
	int chunk; /* events handed to the sink at a time */
	struct timespec started;
	unsigned long listening; /* db_reconnects() when LISTEN was last sent, + 1 */
	struct fanout fan;       /* the tenant endpoints; fan.sink NULL: not ours */
};

static volatile sig_atomic_t dispatch_stopping;
static volatile int fanout_stopping; /* dispatch_stopping, as fanout_round reads it */

void dispatch_stop(void)
{
	dispatch_stopping = 1;
	fanout_stopping = 1;
}

int dispatch_backoff_parse(const char *spec, long *delays, int max, struct err *e)
{
	char *copy = strdup(spec), *save = NULL, *tok;
	int n = 0;

	if (copy == NULL)
		return err_set(e, ERR_INTERNAL, "out of memory");
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		/* The configuration's durations; a delay is at least 1 ms. */
		if (n == max || conf_duration(tok, &delays[n]) < 0 || delays[n] < 1) {
			err_set(e, ERR_CONFIG,
			        "invalid value \"%s\" for \"backoff\": expected up to %d durations "
			        "separated by commas, such as 5s,5m,30m,2h",
			        spec, max);
			n = -1;
			goto out;
		}
		n++;
	}
	if (n == 0) {
		err_set(e, ERR_CONFIG, "invalid value \"%s\" for \"backoff\": no delays", spec);
		n = -1;
	}
out:
	free(copy);
	return n;
}

long dispatch_backoff_delay(const long *delays, int n, int attempt, unsigned *seed)
{
	long base = delays[attempt - 1 < n ? (attempt < 1 ? 0 : attempt - 1) : n - 1];
	/* +-20%: dispatchers that failed together do not retry together. */
	double f = 0.8 + 0.4 * ((double)rand_r(seed) / (double)RAND_MAX);

	return (long)((double)base * f);
}

/* --loop: LISTEN on this session unless it already does. Also the round
 * trip that reconnects after the database went away. */
static int listen_again(struct dispatcher *d, struct err *e)
{
	PGresult *res;

	if (d->listening == db_reconnects(d->db) + 1)
		return 0;
	res = db_run(d->db, DQ_LISTEN, DQ_LISTEN__N, NULL, e);
	if (res == NULL)
		return -1;
	PQclear(res);
	d->listening = db_reconnects(d->db) + 1;
	return 0;
}

struct dispatcher *dispatch_new(const struct conf *c, struct sink *s, struct sink *es,
                                struct err *e)
{
	struct dispatcher *d = calloc(1, sizeof(*d));
	char host[64] = "localhost";
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
	/* A chunk must finish within `timeout`: one round of parallel
	 * requests (http), one confirm wait (amqp), one deadline for its
	 * acknowledgements (nats), one command (exec). */
	if (strcmp(s->name, "http") == 0)
		d->chunk = c->parallel;
	else if (strcmp(s->name, "amqp") == 0 || strcmp(s->name, "nats") == 0)
		d->chunk = c->batch;
	else
		d->chunk = 1;
	if ((double)c->lease / 1e3 < (double)c->timeout / 1e3 + 2 * DISPATCH_LEASE_MARGIN_S) {
		err_set(e, ERR_CONFIG,
		        "invalid value for \"lease\": %ld ms leaves no time to deliver with a "
		        "timeout of %ld ms; make it at least timeout + %d s",
		        c->lease, c->timeout, 2 * DISPATCH_LEASE_MARGIN_S);
		goto fail;
	}
	gethostname(host, sizeof(host) - 1);
	snprintf(d->owner, sizeof(d->owner), "%s:%ld", host, (long)getpid());
	snprintf(d->lease, sizeof(d->lease), "%ld milliseconds", c->lease);
	snprintf(d->appname, sizeof(d->appname), "%s-dispatch-%ld", c->application_name,
	         (long)getpid());
	d->seed = (unsigned)getpid() ^ (unsigned)time(NULL);
	clock_gettime(CLOCK_MONOTONIC, &d->started);

	ds = (struct db_settings){ .conninfo = c->db,
		                   .application_name = d->appname,
		                   .lock_timeout_ms = 0,
		                   .statement_timeout_ms = c->statement_timeout,
		                   .stmts = dispatch_queries,
		                   .nstmts = DQ__COUNT };
	d->db = db_open(&ds, e);
	if (d->db == NULL || e->code != ERR_NONE)
		goto fail;
	if (c->loop && listen_again(d, e) < 0)
		goto fail;
	d->fan = (struct fanout){ .c = c,
		                  .db = d->db,
		                  .sink = es,
		                  .delays = d->delays,
		                  .ndelays = d->ndelays,
		                  .seed = &d->seed,
		                  .backoff = dispatch_backoff_delay,
		                  .lease_margin_s = DISPATCH_LEASE_MARGIN_S,
		                  .owner = d->owner };
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

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A claimed batch, from its claim to the statements that record it. */
struct batch {
	PGresult *res;   /* the claim's rows; the events point into it */
	char owner[160]; /* the lease owner of this claim alone */
	int n;
	double lease_end; /* when our lease on these events runs out (monotonic s) */
	struct sink_event *evs;
	struct sink_outcome *outs;
	int *attempted;
	/* The outcome, as array literals for DQ_DONE, DQ_FAIL and DQ_RELEASE. */
	struct buf done, ids, errs, delays, deads, release;
	int ndone, nfail, nrelease;
};

static void batch_free(struct batch *b)
{
	PQclear(b->res);
	free(b->evs);
	free(b->outs);
	free(b->attempted);
	buf_free(&b->done);
	buf_free(&b->ids);
	buf_free(&b->errs);
	buf_free(&b->delays);
	buf_free(&b->deads);
	buf_free(&b->release);
	memset(b, 0, sizeof(*b));
}

/* Take over a claim's result (res is owned by b from now on). */
static int batch_init(struct batch *b, const struct dispatcher *d, PGresult *res, const char *owner,
                      double claimed_at, struct err *e)
{
	memset(b, 0, sizeof(*b));
	b->res = res;
	snprintf(b->owner, sizeof(b->owner), "%s", owner);
	b->n = PQntuples(res);
	/* The lease was granted by the database a moment after claimed_at:
	 * counting from claimed_at errs on the safe side. */
	b->lease_end = claimed_at + (double)d->c->lease / 1e3;
	if (b->n == 0)
		return 0;
	b->evs = calloc((size_t)b->n, sizeof(*b->evs));
	b->outs = calloc((size_t)b->n, sizeof(*b->outs));
	b->attempted = calloc((size_t)b->n, sizeof(*b->attempted));
	if (b->evs == NULL || b->outs == NULL || b->attempted == NULL)
		return err_set(e, ERR_INTERNAL, "out of memory");
	for (int i = 0; i < b->n; i++) {
		b->evs[i] = (struct sink_event){
			.event_id = PQgetvalue(res, i, 1),
			.type = PQgetvalue(res, i, 2),
			.workflow_id = PQgetvalue(res, i, 3),
			.attempt = atoi(PQgetvalue(res, i, 4)),
			.max_attempts = d->c->max_attempts,
			.payload = PQgetvalue(res, i, 5),
			.payload_len = (size_t)PQgetlength(res, i, 5),
			.traceparent = PQgetisnull(res, i, 6) ? NULL : PQgetvalue(res, i, 6),
			.tracestate = PQgetisnull(res, i, 7) ? NULL : PQgetvalue(res, i, 7)
		};
		b->outs[i].retry_after_s = -1;
	}
	return 0;
}

/*
 * Deliver the batch in chunks that each end within `timeout`, and stop
 * before a chunk could outlive the lease: the events not attempted are
 * released, so another dispatcher can never deliver an event this one
 * still holds. Returns 0, or -1 when the sink failed.
 */
static int batch_deliver(struct dispatcher *d, struct batch *b, struct err *e)
{
	const struct conf *c = d->c;
	int chunk = d->chunk;

	for (int i = 0; i < b->n; i += chunk) {
		int m = b->n - i < chunk ? b->n - i : chunk;
		if (dispatch_stopping ||
		    now_s() + (double)c->timeout / 1e3 + DISPATCH_LEASE_MARGIN_S > b->lease_end)
			break;
		double t0 = now_s();
		if (d->sink->deliver(d->sink, b->evs + i, (size_t)m, b->outs + i, e) < 0)
			return -1; /* the leases run out; the events are delivered later */
		double ms = (now_s() - t0) * 1e3;
		for (int j = i; j < i + m; j++) {
			b->attempted[j] = 1;
			if (b->outs[j].latency_ms <= 0)
				b->outs[j].latency_ms = ms / m;
		}
	}
	return 0;
}

/* Turn the outcomes into the recording statements' parameters; log one
 * line per attempt; count. */
static void batch_outcome(struct dispatcher *d, struct batch *b, struct dispatch_stats *st)
{
	const struct conf *c = d->c;

	for (int i = 0; i < b->n; i++) {
		struct sink_outcome *o = &b->outs[i];
		const char *id = PQgetvalue(b->res, i, 0);
		int dead;
		char num[32], line[1024];
		size_t ll = 0;

		if (!b->attempted[i]) {
			buf_putc(&b->release, b->release.len ? ',' : '{');
			buf_puts(&b->release, id);
			b->nrelease++;
			continue;
		}
		dead = o->result == SINK_DEAD ||
		       (o->result == SINK_RETRY && b->evs[i].attempt >= c->max_attempts);
		dmetrics_outcome(&b->evs[i], o, dead);
		if (o->result == SINK_OK) {
			buf_putc(&b->done, b->done.len ? ',' : '{');
			buf_puts(&b->done, id);
			b->ndone++;
			st->published++;
			if (o->duplicate)
				st->broker_duplicates++;
		} else {
			long delay = dispatch_backoff_delay(d->delays, d->ndelays,
			                                    b->evs[i].attempt, &d->seed);
			char trunc[201];

			if (o->retry_after_s >= 0 && o->retry_after_s * 1000 > delay)
				delay = o->retry_after_s * 1000;
			buf_putc(&b->ids, b->ids.len ? ',' : '{');
			buf_puts(&b->ids, id);
			/* last_error is for humans: keep it short. The text may quote
			 * a receiver's bytes, and one byte that is not UTF-8 would
			 * fail the recording of the whole batch, on every run. */
			utf8_copy(trunc, sizeof(trunc), o->error[0] ? o->error : "failed");
			array_elem(&b->errs, trunc);
			buf_printf(&b->delays, "%s%ld", b->delays.len ? "," : "{",
			           dead ? 0 : delay);
			buf_printf(&b->deads, "%s%s", b->deads.len ? "," : "{", dead ? "t" : "f");
			b->nfail++;
			if (dead)
				st->dead++;
			else
				st->retried++;
		}
		if (o->result == SINK_OK && log_min_level > LOG_INFO)
			continue; /* skip the formatting nobody will read */
		log_kv(line, sizeof(line), &ll, "event_id", b->evs[i].event_id);
		log_kv(line, sizeof(line), &ll, "type", b->evs[i].type);
		log_kv(line, sizeof(line), &ll, "workflow", b->evs[i].workflow_id);
		snprintf(num, sizeof(num), "%d/%d", b->evs[i].attempt, c->max_attempts);
		log_kv(line, sizeof(line), &ll, "attempt", num);
		log_kv(line, sizeof(line), &ll, "outcome", outcome_name(o->result, dead));
		snprintf(num, sizeof(num), "%.3f", o->latency_ms);
		log_kv(line, sizeof(line), &ll, "latency_ms", num);
		if (o->status) {
			snprintf(num, sizeof(num), "%d", o->status);
			log_kv(line, sizeof(line), &ll, "status", num);
		}
		/* The broker already held it: an earlier attempt got through. */
		if (o->result == SINK_OK && o->duplicate)
			log_kv(line, sizeof(line), &ll, "duplicate", "true");
		if (o->result != SINK_OK)
			log_kv(line, sizeof(line), &ll, "error", o->error);
		if (dead)
			log_error("event is dead", "%s", line);
		else if (o->result != SINK_OK)
			log_warning("delivery failed", "%s", line);
		else
			log_info("delivered", "%s", line);
	}
	array_end(&b->done);
	array_end(&b->ids);
	array_end(&b->errs);
	array_end(&b->delays);
	array_end(&b->deads);
	array_end(&b->release);
}

/*
 * The pipeline. While the sink delivers batch k, PostgreSQL records batch
 * k-1 and claims batch k+1: both go out in one libpq pipeline before the
 * delivery starts, so the database and the network work at the same time.
 *
 * They are two transactions (a sync point after the recording): a claim
 * that fails never takes a recording with it. And a reader thread takes
 * the claim's rows off the socket while the sink works: a claim whose rows
 * outgrow the socket buffers would otherwise stop mid-statement, its
 * transaction open, until the delivery ends, and a delivery longer than
 * statement_timeout would cancel it. The main thread does not touch the
 * connection until it has joined the reader.
 *
 * The claim of k+1 cannot take a later event of a workflow in batch k:
 * batch k is not recorded yet, so its events still count as undelivered.
 */
struct step {
	int nrecord;     /* recording statements, before the first sync */
	int has_claim;   /* a claim follows, after its own sync */
	double claim_at; /* when it was sent */
	/* The claim's lease owner: host:pid:n, new for every claim. With one
	 * owner per process, a claim could take over events of the batch
	 * before it whose lease ran out, and that batch's release (WHERE
	 * lease_owner = $2) would then clear the new lease while the events
	 * are being delivered. */
	char owner[160];
	/* What the reader found. */
	PGresult *claimed; /* the claim's rows, whenever the claim went through */
	int recorded;      /* the recording (if any) went through */
	int rc;
	struct err e;
	pthread_t reader;
	int reading; /* the reader thread runs */
};

/* Queue one statement of the table; a count that is not the table's is a
 * bug, and nothing is sent (as db_run() does). */
static int send_stmt(struct dispatcher *d, enum dispatch_query_id stmt, int n, const char *const *p,
                     struct err *e)
{
	const struct db_stmt *st = &dispatch_queries[stmt];
	PGconn *conn = db_conn(d->db);

	if (n != st->nparams)
		return err_set(e, ERR_INTERNAL,
		               "statement \"%s\" called with %d parameters, its table says %d",
		               st->name, n, st->nparams);
	if (!PQsendQueryPrepared(conn, st->name, n, p, NULL, NULL, 0))
		return db_classify(conn, NULL, e);
	return 0;
}

/* Queue batch b's recording (if any) and, when claim, the next claim,
 * each followed by a sync: two transactions, one round trip. */
static int step_send(struct dispatcher *d, struct batch *b, int claim, struct step *s,
                     struct err *e)
{
	PGconn *conn = db_conn(d->db);
	char batch[16];

	memset(s, 0, sizeof(*s));
	if (!PQenterPipelineMode(conn))
		return db_classify(conn, NULL, e);
	if (b != NULL && b->ndone) {
		const char *p[DQ_DONE__N] = {
			[DQ_DONE_IDS] = b->done.data, [DQ_DONE_OWNER] = b->owner
		};
		if (send_stmt(d, DQ_DONE, DQ_DONE__N, p, e) < 0)
			return -1;
		s->nrecord++;
	}
	if (b != NULL && b->nfail) {
		const char *p[DQ_FAIL__N] = { [DQ_FAIL_IDS] = b->ids.data,
			                      [DQ_FAIL_OWNER] = b->owner,
			                      [DQ_FAIL_ERRORS] = b->errs.data,
			                      [DQ_FAIL_DELAYS_MS] = b->delays.data,
			                      [DQ_FAIL_DEAD] = b->deads.data };
		if (send_stmt(d, DQ_FAIL, DQ_FAIL__N, p, e) < 0)
			return -1;
		s->nrecord++;
	}
	if (b != NULL && b->nrelease) {
		const char *p[DQ_RELEASE__N] = {
			[DQ_RELEASE_IDS] = b->release.data, [DQ_RELEASE_OWNER] = b->owner
		};
		if (send_stmt(d, DQ_RELEASE, DQ_RELEASE__N, p, e) < 0)
			return -1;
		s->nrecord++;
	}
	if (s->nrecord && !PQpipelineSync(conn))
		return db_classify(conn, NULL, e);
	if (claim) {
		snprintf(batch, sizeof(batch), "%d", d->c->batch);
		snprintf(s->owner, sizeof(s->owner), "%s:%lu", d->owner, ++d->claims);
		const char *p[DQ_CLAIM__N] = { [DQ_CLAIM_BATCH] = batch,
			                       [DQ_CLAIM_OWNER] = s->owner,
			                       [DQ_CLAIM_LEASE] = d->lease };
		s->claim_at = now_s();
		if (send_stmt(d, DQ_CLAIM, DQ_CLAIM__N, p, e) < 0)
			return -1;
		s->has_claim = 1;
		if (!PQpipelineSync(conn))
			return db_classify(conn, NULL, e);
	}
	return 0;
}

/* Read n statements' results and the sync that ends their transaction.
 * With keep, the last statement's result goes to *kept. Returns 0, or -1
 * with e filled from the first failure (the rest of the segment is read
 * all the same, so the connection stays in step). */
static int read_segment(PGconn *conn, int n, int keep, PGresult **kept, struct err *e)
{
	PGresult *res;
	int rc = 0;

	for (int q = 0; q < n; q++) {
		res = PQgetResult(conn);
		ExecStatusType st = PQresultStatus(res);
		if (res == NULL || (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)) {
			if (rc == 0)
				db_classify(conn, res, e);
			rc = -1;
		} else if (keep && q == n - 1) {
			*kept = res;
			res = NULL;
		}
		PQclear(res);
		while ((res = PQgetResult(conn)) != NULL) /* the end of this query's results */
			PQclear(res);
	}
	res = PQgetResult(conn); /* PGRES_PIPELINE_SYNC */
	if (res == NULL || PQresultStatus(res) != PGRES_PIPELINE_SYNC) {
		if (rc == 0)
			db_classify(conn, res, e);
		rc = -1;
	}
	PQclear(res);
	return rc;
}

/* Read the step's results into s: the claim's rows (if any) to
 * s->claimed. The recording is read first and stands whatever the claim
 * does. A claim that went through keeps its rows even when the recording
 * failed: they are leased, and must be handed back. */
static void step_read(PGconn *conn, struct step *s)
{
	int rc = 0;

	err_clear(&s->e);
	s->claimed = NULL;
	s->recorded = 1;
	if (s->nrecord && read_segment(conn, s->nrecord, 0, NULL, &s->e) < 0) {
		s->recorded = 0;
		rc = -1;
	}
	if (s->has_claim &&
	    read_segment(conn, 1, 1, &s->claimed, rc == 0 ? &s->e : &(struct err){ 0 }) < 0)
		rc = -1;
	if (!PQexitPipelineMode(conn)) {
		/* Out of step: nothing more can be sent on it. */
		if (rc == 0)
			db_classify(conn, NULL, &s->e);
		rc = -1;
		PQclear(s->claimed);
		s->claimed = NULL;
	}
	s->rc = rc;
}

struct reader_arg {
	PGconn *conn;
	struct step *s;
};

static void *reader_main(void *arg)
{
	struct reader_arg *a = arg;

	step_read(a->conn, a->s);
	free(a);
	return NULL;
}

/* Start reading the step's results on a thread of its own; when no thread
 * can be had, read them here and now (the delivery then waits for the
 * database instead of running beside it). Signals stay with the main
 * thread, whose sleeps they cut short. */
static void step_read_async(struct dispatcher *d, struct step *s)
{
	struct reader_arg *a = malloc(sizeof(*a));
	sigset_t all, old;

	if (a != NULL) {
		*a = (struct reader_arg){ .conn = db_conn(d->db), .s = s };
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &old);
		s->reading = pthread_create(&s->reader, NULL, reader_main, a) == 0;
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (s->reading)
			return;
		free(a);
	}
	step_read(db_conn(d->db), s);
}

/* Wait for the step's results; the claim's rows (if any) go to *claimed,
 * also when the step failed otherwise. */
static int step_recv(struct step *s, PGresult **claimed, struct err *e)
{
	if (s->reading) {
		pthread_join(s->reader, NULL);
		s->reading = 0;
	}
	*claimed = s->claimed;
	s->claimed = NULL;
	if (s->rc < 0)
		*e = s->e;
	return s->rc;
}

/* Record b (if any) and claim the next batch into *next (when claim). */
static int step_sync(struct dispatcher *d, struct batch *b, int claim, struct batch *next,
                     struct err *e)
{
	struct step s;
	PGresult *res;

	if (step_send(d, b, claim, &s, e) < 0)
		return -1;
	step_read(db_conn(d->db), &s);
	if (step_recv(&s, &res, e) < 0) {
		PQclear(res);
		return -1;
	}
	if (!claim)
		return 0;
	return batch_init(next, d, res, s.owner, s.claim_at, e);
}

static int out_of_time(const struct dispatcher *d)
{
	return d->c->max_runtime > 0 && elapsed_s(&d->started) * 1e3 >= (double)d->c->max_runtime;
}

/*
 * The step sent with batch k's delivery failed (its recording of k-1 or
 * its claim of k+1), or the sink did (deliver() returned -1): the run
 * ends, but first, on a connection still in step, it records what it
 * knows. Batch k-1 again if its recording failed (each statement holds
 * only under its claim's owner: recording twice changes nothing); batch
 * k, whose delivered events would otherwise be claimed and delivered
 * again once the lease ran out, the rest of it released; and the batch
 * claimed ahead (ahead, owned from now on), released untouched, its
 * attempt taken back. What fails here is logged; the run's error stays
 * the first one.
 */
static void drain_settle(struct dispatcher *d, const struct step *s, struct batch *prev,
                         struct batch *cur, PGresult *ahead, struct dispatch_stats *st)
{
	PGconn *conn = db_conn(d->db);
	struct batch next;
	struct err e;

	if (PQstatus(conn) != CONNECTION_OK || PQpipelineStatus(conn) != PQ_PIPELINE_OFF ||
	    PQtransactionStatus(conn) != PQTRANS_IDLE) {
		PQclear(ahead);
		return;
	}
	if (prev->res != NULL && !s->recorded && step_sync(d, prev, 0, NULL, &e) < 0)
		log_warning("could not record a delivered batch", "error=%s", LOG_Q(e.msg));
	batch_outcome(d, cur, st);
	if (step_sync(d, cur, 0, NULL, &e) < 0)
		log_warning("could not record a delivered batch", "error=%s", LOG_Q(e.msg));
	if (ahead == NULL)
		return;
	if (batch_init(&next, d, ahead, s->owner, s->claim_at, &e) == 0 && next.n > 0) {
		batch_outcome(d, &next, st); /* nothing attempted: all released */
		if (step_sync(d, &next, 0, NULL, &e) < 0)
			log_warning("could not release a claimed batch", "error=%s", LOG_Q(e.msg));
	}
	batch_free(&next);
}

/* Claim, deliver and record until a claim comes back empty. Returns the
 * number of events claimed, or -1. */
static int drain(struct dispatcher *d, struct dispatch_stats *st, struct err *e)
{
	long claimed = st->claimed;
	struct batch cur, next, prev;
	struct step s;
	PGresult *res;
	int rc = -1;

	memset(&prev, 0, sizeof(prev));
	memset(&next, 0, sizeof(next));
	if (step_sync(d, NULL, 1, &cur, e) < 0)
		return -1;
	while (cur.n > 0) {
		int more = !dispatch_stopping && !out_of_time(d);
		int delivered;

		st->claimed += cur.n;
		/* PostgreSQL: record k-1, claim k+1 ... */
		if (step_send(d, prev.res ? &prev : NULL, more, &s, e) < 0)
			goto out;
		step_read_async(d, &s);
		/* ... while the sink delivers k. */
		delivered = batch_deliver(d, &cur, e);
		if (step_recv(&s, &res, delivered < 0 ? &(struct err){ 0 } : e) < 0 ||
		    delivered < 0) {
			drain_settle(d, &s, &prev, &cur, res, st);
			goto out;
		}
		batch_free(&prev);
		if (more) {
			if (batch_init(&next, d, res, s.owner, s.claim_at, e) < 0)
				goto out;
		} else {
			memset(&next, 0, sizeof(next));
		}
		batch_outcome(d, &cur, st);
		prev = cur;
		cur = next;
		memset(&next, 0, sizeof(next));
	}
	/* The last delivered batch is recorded on its own. */
	if (prev.res != NULL && step_sync(d, &prev, 0, NULL, e) < 0)
		goto out;
	rc = st->claimed - claimed > 0;
out:
	batch_free(&cur);
	batch_free(&prev);
	batch_free(&next);
	return rc;
}

/* fanout_drain's "more": while the run has time. */
static int fanout_more(void *arg)
{
	return !out_of_time(arg);
}

/* The tenant endpoints' due deliveries, batch after batch until none is
 * due. Returns 1 when something was claimed, 0 when nothing, or -1. */
static int drain_endpoints(struct dispatcher *d, struct dispatch_stats *st, struct err *e)
{
	struct fanout_stats fs = { 0 };
	int n;

	if (d->fan.sink == NULL || dispatch_stopping || out_of_time(d))
		return 0;
	n = fanout_drain(&d->fan, &fs, &fanout_stopping, fanout_more, d, e);
	st->ep_claimed += fs.claimed;
	st->ep_delivered += fs.delivered;
	st->ep_retried += fs.retried;
	st->ep_dead += fs.dead;
	st->ep_disabled += fs.disabled;
	return n;
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
	pfd.fd = conn != NULL ? PQsocket(conn) : -1; /* -1: poll() only sleeps */
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

/* Sleep up to a second, less when stopped or out of time. */
static void idle(struct dispatcher *d)
{
	const struct conf *c = d->c;
	long ms = c->poll_interval < 1000 ? c->poll_interval : 1000;
	struct timespec ts;

	if (c->max_runtime > 0) {
		long left = c->max_runtime - (long)(elapsed_s(&d->started) * 1e3);
		if (left < ms)
			ms = left > 0 ? left : 0;
	}
	ts.tv_sec = ms / 1000;
	ts.tv_nsec = ms % 1000 * 1000000;
	if (!dispatch_stopping)
		nanosleep(&ts, NULL); /* a stop signal cuts it short */
}

int dispatch_run(struct dispatcher *d, struct dispatch_stats *st, struct err *e)
{
	int rc = 0;
	PGresult *res;

	memset(st, 0, sizeof(*st));
	err_clear(e);
	while (!dispatch_stopping && !out_of_time(d)) {
		dmetrics_round(); /* --loop: the textfile after every round */
		int n = d->c->loop ? listen_again(d, e) : 0;
		if (n == 0)
			n = drain(d, st, e);
		/* Then the endpoints: the outbox's own order stays as it was,
		 * and a receiver of the operator's that is slow or down never
		 * holds the tenants' deliveries back for longer than a drain. */
		if (n >= 0) {
			int m = drain_endpoints(d, st, e);
			if (m < 0)
				n = -1;
			else if (m > 0)
				n = 1;
		}
		if (n < 0 && d->c->loop && e->code == ERR_DB_DOWN) {
			/* A long-running dispatcher outlives a database restart:
			 * wait a poll interval (or until stopped), reconnect, and
			 * go on. Events claimed before are leased, never lost. */
			log_warning("lost the database; reconnecting", "error=%s", LOG_Q(e->msg));
			err_clear(e);
			db_reset(d->db);
			d->listening = 0; /* LISTEN again, reconnecting first */
			idle(d);
			continue;
		}
		if (n < 0) {
			rc = -1;
			break;
		}
		/* Recording the last batch may have unblocked later events of
		 * its workflows: look again before deciding nothing is due. */
		if (n > 0)
			continue;
		if (!d->c->loop)
			break;
		if (wait_for_work(d, e) < 0) {
			if (e->code == ERR_DB_DOWN) {
				log_warning("lost the database; reconnecting", "error=%s",
				            LOG_Q(e->msg));
				err_clear(e);
				db_reset(d->db);
				d->listening = 0;
				continue;
			}
			rc = -1;
			break;
		}
	}
	st->duration_s = elapsed_s(&d->started);
	if (rc == 0) {
		res = db_run(d->db, DQ_STATS, DQ_STATS__N, NULL, e);
		if (res == NULL)
			return -1;
		st->pending = atol(PQgetvalue(res, 0, 0));
		st->oldest_pending_s = atof(PQgetvalue(res, 0, 1));
		PQclear(res);
	}
	return rc;
}
