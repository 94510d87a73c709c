/* worker.c - the FastCGI accept loop of one worker (see worker.h). */
#include "server/worker.h"

#include <errno.h>
#include <malloc.h>
#include <sys/epoll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/db.h"
#include "core/fp.h"
#include "core/log.h"
#include "core/problem.h"
#include "server/api.h"
#include "server/http.h"
#include "server/keystats.h"
#include "server/metrics.h"
#include "server/notify.h"
#include "server/queries.h"
#include "server/rcache.h"
#include "server/route.h"
#include "server/scoreboard.h"

static volatile sig_atomic_t worker_stop;

/*
 * FCGX_Finish_r, without its lingering close. libfcgi shuts the write side
 * down and then waits (up to 2 s) for the peer to close its end, so that
 * no unread request data turns the close into a reset: one more sleep and
 * wakeup, and three more system calls, per request. When the request has
 * been read to its end there is nothing left to lose, so the answer is
 * flushed (with FCGI_END_REQUEST) and the connection closed at once. A
 * request with more than FINISH_DRAIN_MAX bytes still unread (a body too
 * large to read), or a kept connection, gets libfcgi's own finish.
 */
#define FINISH_DRAIN_MAX 65536

/*
 * Memory a worker keeps between requests. Its buffers keep up to
 * BUF_KEEP bytes each and give back more (buf_shrink), and every
 * allocation from MMAP_FLOOR up is a mapping of its own, returned to the
 * system when freed: glibc would otherwise raise that threshold after the
 * first big free, serve later big pages from the heap, and keep the heap's
 * high-water mark. So a worker that answered a 4 MiB page returns to its
 * usual size (t/e2e/test_stores.c measures it).
 */
#define BUF_KEEP   (64 * 1024)
#define MMAP_FLOOR (128 * 1024)

static void finish_request(FCGX_Request *f)
{
	char scratch[4096];
	int drained = 0, n, fd;

	if (f->in == NULL || f->keepConnection) {
		FCGX_Finish_r(f);
		return;
	}
	while (drained < FINISH_DRAIN_MAX && (n = FCGX_GetStr(scratch, sizeof(scratch), f->in)) > 0)
		drained += n;
	if (!FCGX_HasSeenEOF(f->in) || FCGX_GetError(f->in)) {
		FCGX_Finish_r(f);
		return;
	}
	FCGX_FClose(f->err);
	FCGX_FClose(f->out);
	fd = f->ipcFd;
	FCGX_Free(f, 0);
	f->ipcFd = -1;
	if (fd >= 0)
		close(fd);
}

static void on_stop(int sig)
{
	worker_stop = 1;
}

/*
 * Dispatchers in --loop wait for NOTIFY idemflow_outbox. A NOTIFY inside
 * the create's own transaction would serialize every create on the
 * database-wide notify lock, so the worker sends one afterwards, on its
 * own, at most every NOTIFY_EVERY_MS: a dispatcher wakes within that much
 * of a create, and the notify costs nothing per request under load.
 */
#define NOTIFY_EVERY_MS 100

struct notifier {
	int pending;
	struct timespec last;
};

/* ms until a pending notify is due (0 = now), or -1 when none is pending. */
static long notify_wait_ms(const struct notifier *n)
{
	struct timespec now;
	long since;

	if (!n->pending)
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &now);
	since = (now.tv_sec - n->last.tv_sec) * 1000 + (now.tv_nsec - n->last.tv_nsec) / 1000000;
	return since >= NOTIFY_EVERY_MS ? 0 : NOTIFY_EVERY_MS - since;
}

static void notify_if_due(struct notifier *n, struct db *db)
{
	struct err e;
	PGresult *res;

	if (notify_wait_ms(n) != 0)
		return;
	res = db_run(db, Q_NOTIFY, 0, NULL, &e);
	if (res == NULL) {
		/* The dispatcher's poll is the fallback; try again later. */
		log_debug("could not notify dispatchers", "error=%s", LOG_Q(e.msg));
	}
	PQclear(res);
	n->pending = 0;
	clock_gettime(CLOCK_MONOTONIC, &n->last);
}

static double elapsed_ms(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* v as decimal text ending just before end (which gets the NUL), with
 * its last three digits as thousandths when thousandths is set; returns
 * its start. (snprintf was most of the cost of a request's log line.) */
static char *decimal(char *end, unsigned long v, int thousandths)
{
	char *p = end;

	*--p = '\0';
	if (thousandths) {
		for (int i = 0; i < 3; i++, v /= 10)
			*--p = (char)('0' + v % 10);
		*--p = '.';
	}
	return buf_utoa(p, v);
}

/* A job completion that ran (not a replay): completed, or skipped by the
 * lease check (metrics.h). */
static void count_completion(const struct handler_ctx *ctx, const struct http_resp *resp)
{
	/* A 5xx stored nothing, whatever the command had answered. */
	if (ctx->route != ROUTE_JOB_COMPLETE || ctx->idem == IDEM_REPLAYED || resp->status >= 500)
		return;
	if (resp->status == 200) {
		metrics_job_completion(MC_COMPLETED);
		return;
	}
	switch (ctx->refused) {
	case P_LEASE_EXPIRED: metrics_job_completion(MC_SKIPPED_LEASE_EXPIRED); break;
	case P_NOT_LEASE_HOLDER: metrics_job_completion(MC_SKIPPED_NOT_LEASE_HOLDER); break;
	case P_JOB_NOT_ACTIVE: metrics_job_completion(MC_SKIPPED_NOT_ACTIVE); break;
	default: break;
	}
}

static void log_request(const struct handler_ctx *ctx, const struct http_req *req,
                        const struct http_resp *resp, double ms)
{
	char line[1024];
	size_t n = 0;
	char num[48];

	log_kv(line, sizeof(line), &n, "request_id", req->request_id);
	if (ctx->trace.trace_id[0] != '\0') {
		log_kv(line, sizeof(line), &n, "trace_id", ctx->trace.trace_id);
		log_kv(line, sizeof(line), &n, "span_id", ctx->trace.span_id);
	}
	log_kv(line, sizeof(line), &n, "method", req->method);
	log_kv(line, sizeof(line), &n, "path", req->path);
	log_kv(line, sizeof(line), &n, "route", route_name(ctx->route));
	log_kv(line, sizeof(line), &n, "status",
	       decimal(num + sizeof(num), (unsigned long)resp->status, 0));
	log_kv(line, sizeof(line), &n, "tenant",
	       decimal(num + sizeof(num), (unsigned long)ctx->tenant_id, 0));
	/* Who asked: the token's id, never the token (sql/014_actor.sql). */
	if (ctx->actor[0] != '\0')
		log_kv(line, sizeof(line), &n, "actor", ctx->actor);
	log_kv(line, sizeof(line), &n, "idem", idem_outcome_name(ctx->idem));
	if (ctx->cached)
		log_kv(line, sizeof(line), &n, "cache", "hit");
	if (req->idem_key != NULL) {
		/* Enough to follow one key through the logs (printf %s KEY |
		 * b2sum -l 256), never the key itself: keys may carry meaning. */
		uint8_t h[FP_LEN];
		char hex[2 * FP_LEN + 1];
		fp_token(h, req->idem_key, strlen(req->idem_key));
		fp_hex(hex, h, FP_LEN);
		hex[12] = '\0';
		log_kv(line, sizeof(line), &n, "key_fp", hex);
	}
	log_kv(line, sizeof(line), &n, "duration_ms",
	       decimal(num + sizeof(num), ms < 0 ? 0 : (unsigned long)(ms * 1000 + 0.5), 1));
	if (ctx->err.code != ERR_NONE) {
		log_kv(line, sizeof(line), &n, "sqlstate", ctx->err.sqlstate);
		log_kv(line, sizeof(line), &n, "error", ctx->err.msg);
	}
	if (resp->status >= 500)
		log_error("request failed", "%s", line);
	else
		log_info("request", "%s", line);
}

/*
 * The readiness report (notify.h): under a service manager, the
 * supervisor says READY=1 once every worker holds its database
 * connection. A worker that started without one tries again while idle,
 * every READY_PROBE_MS (db.h paces the connects themselves), with a
 * statement that proves the connection and the prepared statements, and
 * reports once it succeeds. Without a service manager nothing is probed.
 */
#define READY_PROBE_MS 100

struct readiness {
	int pending; /* not reported yet */
	struct timespec last;
};

/* ms until the next probe is due (0 = now), or -1 when none is pending. */
static long ready_wait_ms(const struct readiness *r)
{
	struct timespec now;
	long since;

	if (!r->pending)
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &now);
	since = (now.tv_sec - r->last.tv_sec) * 1000 + (now.tv_nsec - r->last.tv_nsec) / 1000000;
	return since >= READY_PROBE_MS ? 0 : READY_PROBE_MS - since;
}

static void ready_report(struct readiness *r)
{
	notify_worker_ready();
	r->pending = 0;
}

static void ready_probe_if_due(struct readiness *r, struct db *db)
{
	struct err e;
	PGresult *res;

	if (ready_wait_ms(r) != 0)
		return;
	res = db_run(db, Q_SCHEMA_VERSION, 0, NULL, &e);
	if (res != NULL)
		ready_report(r);
	PQclear(res);
	clock_gettime(CLOCK_MONOTONIC, &r->last);
}

/* Flush the per-key counts when due (or now, at exit). An outage is
 * already visible as 503s; only other failures are worth a line. */
static void flush_keystats(struct keystats *ks, struct db *db, int now)
{
	struct err e;

	if ((now ? keystats_flush(ks, db, &e) : keystats_flush_due(ks, db, &e)) < 0 &&
	    e.code != ERR_DB_DOWN)
		log_warning("could not store idempotency key counts", "error=%s", LOG_Q(e.msg));
}

/* What a worker holds from its start to its exit. */
struct worker {
	const struct conf *conf;
	char appname[128]; /* the connection's application_name: db.h borrows
	                    * it for every reconnect */
	struct handler_ctx ctx;
	struct http_resp resp;
	FCGX_Request freq;
	int freq_ready; /* freq was initialised: FCGX_Free() it */
	struct keystats ks;
	int ks_ready; /* ks was initialised: keystats_free() it */
	struct rcache rcache;
	struct notifier nt;
	struct readiness rd;
	int ep;            /* the epoll set with the listening socket, or -1 */
	sigset_t waitmask; /* the mask while waiting: the stop signals open */
};

/*
 * The worker's signals: SIGTERM and SIGINT stop it, SIGUSR1 reopens the
 * log (the supervisor forwards it), the rest are ignored or the default.
 * The three are blocked from here on, except in waitmask, the mask while
 * waiting for a connection.
 */
static void worker_signals(sigset_t *waitmask)
{
	struct sigaction sa;
	sigset_t stopset;

	/* No SA_RESTART: a stop must interrupt epoll_pwait(). */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sa.sa_handler = SIG_DFL;
	sigaction(SIGCHLD, &sa, NULL);
	sigaction(SIGALRM, &sa, NULL);
	sa.sa_handler = log_reopen_on_signal; /* SIGUSR1, from the supervisor */
	sigaction(SIGUSR1, &sa, NULL);

	sigemptyset(&stopset);
	sigaddset(&stopset, SIGTERM);
	sigaddset(&stopset, SIGINT);
	sigaddset(&stopset, SIGUSR1);
	sigprocmask(SIG_SETMASK, &stopset, waitmask);
	sigdelset(waitmask, SIGTERM);
	sigdelset(waitmask, SIGINT);
	sigdelset(waitmask, SIGUSR1);
}

/*
 * Open what the worker serves with: its database connection (a database
 * that is down is no failure: the worker answers 503 until it is back),
 * its key counts, libfcgi and the epoll set. Returns 0, or -1 after
 * logging why; w's resources are freed by worker_close() either way.
 */
static int worker_open(struct worker *w, int listen_fd)
{
	const struct conf *c = w->conf;
	struct db_settings ds;
	struct err e;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = listen_fd };

	snprintf(w->appname, sizeof(w->appname), "%s-worker-%ld", c->application_name,
	         (long)getpid());
	ds = (struct db_settings){ .conninfo = c->db,
		                   .application_name = w->appname,
		                   .lock_timeout_ms = c->idempotency_wait,
		                   .statement_timeout_ms = c->statement_timeout,
		                   .stmts = queries_for(c->routing),
		                   .nstmts = Q__COUNT };
	w->ctx.conf = c;
	w->ctx.rcache = &w->rcache;
	w->ctx.db = db_open(&ds, &e);
	if (w->ctx.db == NULL || keystats_init(&w->ks) < 0) {
		log_error("could not start worker", "error=\"out of memory\"");
		return -1;
	}
	w->ks_ready = 1;
	if (e.code != ERR_NONE)
		log_warning("database unavailable at start; answering 503 until it is back",
		            "error=%s", LOG_Q(e.msg));

	if (FCGX_Init() != 0 ||
	    FCGX_InitRequest(&w->freq, listen_fd, FCGI_FAIL_ACCEPT_ON_INTR) != 0) {
		log_error("could not initialise libfcgi", NULL);
		return -1;
	}
	w->freq_ready = 1;
	/* One epoll set per worker, the listening socket in it with
	 * EPOLLEXCLUSIVE: a new connection wakes one idle worker (or a few),
	 * not the whole pool, which would all race for one accept(). */
	w->ep = epoll_create1(EPOLL_CLOEXEC);
	if (w->ep < 0 || epoll_ctl(w->ep, EPOLL_CTL_ADD, listen_fd, &ev) < 0) {
		log_error("could not watch the listening socket", "error=%s",
		          LOG_Q(strerror(errno)));
		return -1;
	}
	log_info("worker started", NULL);
	w->rd.pending = notify_worker_listened();
	if (w->rd.pending && e.code == ERR_NONE) /* e is still db_open()'s */
		ready_report(&w->rd);
	return 0;
}

/* Free what worker_open() opened, any part of it. */
static void worker_close(struct worker *w)
{
	if (w->freq_ready)
		FCGX_Free(&w->freq, 0);
	if (w->ep >= 0)
		close(w->ep);
	if (w->ks_ready)
		keystats_free(&w->ks);
	rcache_free(&w->rcache);
	http_resp_free(&w->resp);
	PQclear(w->ctx.key_row);
	buf_free(&w->ctx.body);
	buf_free(&w->ctx.scratch);
	db_close(w->ctx.db);
}

/* Serve the request just accepted into w->freq, from its route to its
 * answer, its log line and the buffers given back. */
static void worker_serve(struct worker *w)
{
	struct handler_ctx *ctx = &w->ctx;
	struct http_resp *resp = &w->resp;
	struct timespec t0;
	struct http_req req;
	struct route_hit hit = { .arg = NULL, .arglen = 0 };

	clock_gettime(CLOCK_MONOTONIC, &t0);
	http_req_init(&req, &w->freq);
	/* The one match of the request's path: the scoreboard shows the
	 * route while the request runs, and the router takes it from here. */
	hit.route = route_match(req.path, &hit.arg, &hit.arglen);
	scoreboard_begin(req.method, hit.route, req.request_id);
	handler_trace_begin(ctx, &req);
	http_resp_reset(resp);
	db_check(ctx->db);
	api_handle(ctx, &req, &hit, resp);
	metrics_request(ctx->route, resp->status, ctx->idem, elapsed_ms(&t0) / 1e3,
	                db_reconnects(ctx->db));
	if (ctx->cached)
		metrics_replay_cache_hit();
	count_completion(ctx, resp);
	keystats_note(&w->ks, ctx->tenant_id, req.idem_key, ctx->idem);
	scoreboard_stage(SB_WRITING);
	if (http_send(&w->freq, resp) < 0)
		log_warning("client went away before the answer was sent", "request_id=%s",
		            req.request_id);
	/* Log before finish_request: it frees the strings req points to. */
	log_request(ctx, &req, resp, elapsed_ms(&t0));
	finish_request(&w->freq);
	scoreboard_end();
	http_resp_shrink(resp, BUF_KEEP);
	buf_shrink(&ctx->body, BUF_KEEP);
	buf_shrink(&ctx->scratch, BUF_KEEP);
}

/* Wait for a connection with the stop signals unblocked, atomically,
 * waking for what is due when idle (a key-stats flush, a notify, a
 * readiness probe). epoll_pwait()'s result: 1 when a connection may be
 * accepted. */
static int worker_wait(struct worker *w)
{
	long wait = keystats_wait_ms(&w->ks), nt_wait = notify_wait_ms(&w->nt);
	long rd_wait = ready_wait_ms(&w->rd);
	struct epoll_event ready;

	if (nt_wait >= 0 && (wait < 0 || nt_wait < wait))
		wait = nt_wait;
	if (rd_wait >= 0 && (wait < 0 || rd_wait < wait))
		wait = rd_wait;
	return epoll_pwait(w->ep, &ready, 1, wait < 0 ? -1 : (int)wait, &w->waitmask);
}

int worker_run(const struct conf *c, int listen_fd)
{
	struct worker w;
	long served = 0;
	int rc = 1;

	log_set_component("worker");
	problem_configure(c->idempotency_mismatch_status, c->problem_base_uri);
	mallopt(M_MMAP_THRESHOLD, MMAP_FLOOR); /* also fixes it: no dynamic raise */
	worker_signals(&w.waitmask);

	memset(&w.ctx, 0, sizeof(w.ctx));
	memset(&w.resp, 0, sizeof(w.resp));
	memset(&w.rcache, 0, sizeof(w.rcache));
	memset(&w.nt, 0, sizeof(w.nt));
	memset(&w.rd, 0, sizeof(w.rd));
	w.conf = c;
	w.freq_ready = 0;
	w.ks_ready = 0;
	w.ep = -1;
	if (worker_open(&w, listen_fd) < 0)
		goto out;

	while (!worker_stop) {
		int r = worker_wait(&w);
		if (worker_stop)
			break;
		log_reopen_if_asked();
		if (r == 0) {
			flush_keystats(&w.ks, w.ctx.db, 0);
			notify_if_due(&w.nt, w.ctx.db);
			ready_probe_if_due(&w.rd, w.ctx.db);
		}
		if (r <= 0)
			continue;
		/* The socket is non-blocking: when another worker won the
		 * connection, accept fails with EAGAIN and we wait again. */
		if (FCGX_Accept_r(&w.freq) < 0)
			continue;
		worker_serve(&w);
		/* After the answer went out: the flush never delays a response. */
		flush_keystats(&w.ks, w.ctx.db, 0);
		w.nt.pending |= w.ctx.created;
		notify_if_due(&w.nt, w.ctx.db);
		ready_probe_if_due(&w.rd, w.ctx.db);
		if (c->max_requests > 0 && ++served >= c->max_requests) {
			log_info("worker retiring after max_requests", "served=%ld", served);
			break;
		}
	}
	flush_keystats(&w.ks, w.ctx.db, 1);
	if (w.nt.pending) {
		w.nt.last.tv_sec = 0; /* due now */
		notify_if_due(&w.nt, w.ctx.db);
	}
	log_info("worker stopped", NULL);
	rc = 0;
out:
	worker_close(&w);
	return rc;
}
