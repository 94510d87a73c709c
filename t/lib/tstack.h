/*
 * Helpers for end-to-end tests against the stack that t/run-test starts
 * (PostgreSQL, idemflow-fcgi, nginx): environment, tenants and tokens via
 * the admin CLI, direct libpq checks, unique names, worker processes, and
 * the assertions every test repeats.
 *
 * Functions that assert (cr_assert) must only be called from the test's
 * main thread; http.h is the part that is safe on other threads.
 */
#ifndef IDEMFLOW_T_TSTACK_H
#define IDEMFLOW_T_TSTACK_H

#include <stddef.h>
#include <sys/types.h>

#include <criterion/hooks.h>
#include <libpq-fe.h>

#include "http.h"

struct tstack_tenant {
	long id;
	char id_text[24];   /* id as a query parameter */
	char name[64];
	char token[128];
	char auth[160];     /* "Authorization: Bearer <token>" */
};

/* Value of a harness variable; the test fails when it is unset or empty. */
const char *tstack_env(const char *name);

/*
 * Value of a key in $IDEMFLOW_CONF ("key = value" lines, '#' comments),
 * so tests follow the harness's settings instead of repeating them.
 * Returns 1 and fills out when the key is set, 0 otherwise.
 */
int tstack_conf_get(const char *key, char *out, size_t outsz);
long tstack_conf_ms(const char *key, long fallback_ms);  /* durations */
long tstack_conf_long(const char *key, long fallback);   /* ints, sizes */

/*
 * Run "$IDEMFLOW_CLI --db $DATABASE_URL ARGS..." (NULL-terminated args),
 * capturing stdout (trailing newlines removed) into out and stderr for
 * tstack_cli_stderr().  Returns the exit status.
 */
int tstack_cli(char *out, size_t outsz, const char *arg, ...)
	__attribute__((sentinel));
/* The last run's stderr, for failure messages (it is not echoed). */
const char *tstack_cli_stderr(void);

/* A fresh tenant named after label, with one bearer token. */
void tstack_tenant_create(struct tstack_tenant *t, const char *label);
void tstack_token_create(const char *tenant, char *out, size_t outsz);
void tstack_token_revoke(const char *token);
/* Give t a new token of the same tenant. A worker's replay cache holds
 * key rows per token (app/server/rcache.h): a test that changes a stored row in
 * the database asks again with a token no worker has used. */
void tstack_tenant_retoken(struct tstack_tenant *t);

/* The process's own connection (created on first use, closed at exit). */
PGconn *tstack_db(void);
/* An extra connection, e.g. to hold locks; the caller PQfinish()es it. */
PGconn *tstack_db_connect(void);

/* Text parameters after sql, NULL-terminated by the macros. */
long tstack_count_(const char *sql, ...);
char *tstack_text_(const char *sql, ...);
void tstack_exec_(PGconn *conn, const char *sql, ...);
#define tstack_count(...) tstack_count_(__VA_ARGS__, (const char *)NULL)
#define tstack_text(...) tstack_text_(__VA_ARGS__, (const char *)NULL)
#define tstack_exec(...) tstack_exec_(__VA_ARGS__, (const char *)NULL)

/*
 * BEGIN on conn and insert an idempotency_keys row for (tenant, key)
 * without committing, so the server's own insert for that key waits on it
 * exactly as it would behind a concurrent request still in flight.
 * Release with tstack_exec(conn, "ROLLBACK").
 */
void tstack_key_hold(PGconn *conn, const struct tstack_tenant *t,
		     const char *key);

/*
 * JSON inspection through PostgreSQL's own parser: the text at a path
 * ("{id}", "{input,a}") or its jsonb_typeof.  NULL when absent.  The test
 * fails when json is not valid JSON.  The result is malloc'ed.
 */
char *tstack_json(const char *json, const char *path);
char *tstack_json_type(const char *json, const char *path);

/* Unique names: nbytes random bytes as hex, a v4 uuid, a fresh key. */
void tstack_random_hex(char *out, size_t nbytes);
void tstack_uuid(char out[37]);
void tstack_key(char *out, size_t outsz, const char *label);

/* Processes: the harness supervisor, its live workers, liveness. */
pid_t tstack_supervisor_pid(void);
size_t tstack_workers(pid_t supervisor, pid_t *out, size_t max);
int tstack_pid_gone(pid_t pid);
int tstack_wait_workers(pid_t supervisor, size_t n, long timeout_ms);

/*
 * The worker whose PostgreSQL session is waiting on a lock held by
 * holder's session (found by pg_blocking_pids and the worker's
 * application_name "...-worker-<pid>"), polling every 20 ms; 0 on timeout.
 */
pid_t tstack_blocked_worker(PGconn *holder, long timeout_ms);

/*
 * The pid of the worker whose request line in log (a pool's stderr, e.g.
 * $IDEMFLOW_FCGI_LOG) carries request_id (the X-Request-Id of its
 * answer), waiting up to 3 s: the line follows the answer. 0 when none.
 */
long tstack_worker_of(const char *log, const char *request_id);

/* 1 when the file at path contains needle (0 when it is missing). */
int tstack_file_contains(const char *path, const char *needle);

/*
 * A claim about every worker, shown rather than assumed: with
 * EPOLLEXCLUSIVE, requests sent one after another may all reach the same
 * idle worker. Sends bursts of `width` requests at once, send(i, arg) on
 * a thread of its own for request i (counted from 0 over all bursts; no
 * assertions there), until the request lines in log name every live
 * worker of supervisor. check(r, i, arg) sees each answer on the calling
 * thread, then the answer is freed. The test fails after max_bursts.
 * Returns the number of requests sent.
 */
int tstack_every_worker(pid_t supervisor, const char *log, int width, int max_bursts,
			struct http_response *(*send)(int i, void *arg),
			void (*check)(const struct http_response *r, int i, void *arg),
			void *arg);

/*
 * An idemflow-fcgi of the test's own, beside the harness's pool: its
 * socket, pid file and log (its stdout and stderr) in the harness's
 * directory, named after a tag and the test process's pid.
 */
struct tstack_pool {
	pid_t pid; /* the supervisor, which leads its process group; 0: not running */
	char sock[108];
	char pidfile[512];
	char log[512];
};
/* Fill p's paths: $IDEMFLOW_STACK_DIR/<tag><pid>-fcgi.{sock,pid,log}. */
void tstack_pool_paths(struct tstack_pool *p, const char *tag);
/* Fork/exec argv in a process group of its own, stdout and stderr to log;
 * it never outlives the test process. Returns its pid. */
pid_t tstack_spawn(const char *const *argv, const char *log);
/* Run argv (an idemflow-fcgi, possibly under a wrapper, that listens on
 * p->sock and writes p->pidfile) and wait up to timeout_ms until the socket
 * accepts and the pid file is written; the test fails if it exits first. */
void tstack_pool_run(struct tstack_pool *p, const char *const *argv, long timeout_ms);
/* Send sig to the pool's whole process group and reap the supervisor;
 * nothing when it is not running. For .fini: it never asserts. */
void tstack_pool_kill(struct tstack_pool *p, int sig);

/* 1 when a unix socket at path accepts a connection. */
int tstack_socket_accepts(const char *path);
/* The pid in path, or 0 while the file is missing or not yet written. */
long tstack_pidfile_read(const char *path);

/* Run pg_ctl ACTION ("stop", "start", "restart") on the harness's
 * PostgreSQL, as its owner; the test fails if pg_ctl does. */
void tstack_pg_ctl(const char *action);

/*
 * TSTACK_SEQUENTIAL at file scope runs the binary's tests one at a time,
 * for suites that share state no test may see changing under it (the
 * whole outbox, a stopped database): a report hook sets Criterion's job
 * count to 1 before the first test starts, whatever -j says.
 *
 * Not a main() of the suite's own: Criterion's BoxFort starts every test
 * process by writing a 16-byte jump over the start of main, and a main
 * that only calls a function is shorter than that when functions are not
 * aligned (-O1); the jump then overwrote the function after it (ASan's
 * global destructor), and every test process crashed as it exited.
 */
void tstack_sequential_hook(void *test_set);
#define TSTACK_SEQUENTIAL                                                                          \
	ReportHook(PRE_ALL)(struct criterion_test_set * tstack_set)                                \
	{                                                                                          \
		tstack_sequential_hook(tstack_set);                                                \
	}

double tstack_now(void);
void tstack_sleep_ms(long ms);

/* Assertions shared by the e2e suites. */
void tstack_expect_header(const struct http_response *r, const char *name,
			  const char *value);
/* A problem+json response; type NULL accepts any "/problems/..." type. */
void tstack_expect_problem(const struct http_response *r, int status,
			   const char *type, const char *instance);
/* s matches the extended regular expression pattern. */
void tstack_expect_match(const char *s, const char *pattern, const char *what);
/*
 * A first (not replayed) 201 from POST /v1/workflows: Location and body
 * name the same id, and the body is exactly the documented bytes
 * {"id","type","state":"pending","input":<canonical_input>,"created_at"}.
 * Returns the id (malloc'ed).
 */
char *tstack_expect_created(const struct http_response *r, const char *type,
			    const char *canonical_input);
/* A replay of first: same status, Location and body bytes, flagged. */
void tstack_expect_replay(const struct http_response *r,
			  const struct http_response *first);
/* Rows for the tenant: workflows, workflow.created events, keys. */
void tstack_expect_counts(const struct tstack_tenant *t, long workflows,
			  long events, long keys);

#endif
