/*
 * The stack that t/run-test starts (PostgreSQL, idemflow-fcgi, nginx):
 * its environment and settings, the admin CLI, its processes (the pool's
 * supervisor and workers, pools of a test's own, PostgreSQL itself), and
 * TSTACK_SEQUENTIAL.
 *
 * The harness's other headers, each included only by the tests that use
 * it: tapi.h (tenants, tokens, keys; assertions on the API's answers),
 * tsql.h (SQL against the test database), twait.h (the clock, polling),
 * tlog.h (the pool's log: which worker answered), http.h (requests),
 * receiver.h and amqpc.h (the dispatcher's far ends).
 *
 * Functions that assert (cr_assert) must only be called from the test's
 * main thread; http.h is the part that is safe on other threads.
 */
#ifndef IDEMFLOW_T_TSTACK_H
#define IDEMFLOW_T_TSTACK_H

#include <stddef.h>
#include <sys/types.h>

#include <criterion/hooks.h>

/* Value of a harness variable; the test fails when it is unset or empty. */
const char *tstack_env(const char *name);

/*
 * Value of a key in $IDEMFLOW_CONF ("key = value" lines, '#' comments),
 * so tests follow the harness's settings instead of repeating them.
 * Returns 1 and fills out when the key is set, 0 otherwise.
 */
int tstack_conf_get(const char *key, char *out, size_t outsz);
long tstack_conf_ms(const char *key, long fallback_ms); /* durations */
long tstack_conf_long(const char *key, long fallback);  /* ints, sizes */

/*
 * Run "$IDEMFLOW_CLI --db $DATABASE_URL ARGS..." (NULL-terminated args),
 * capturing stdout (trailing newlines removed) into out and stderr for
 * tstack_cli_stderr().  Returns the exit status.
 */
int tstack_cli(char *out, size_t outsz, const char *arg, ...) __attribute__((sentinel));
/* The last run's stderr, for failure messages (it is not echoed). */
const char *tstack_cli_stderr(void);

/*
 * Over partitions (t/run-test's TSTACK_SHARDS, IDEMFLOW_PROXY_URL set):
 * fill the proxy's directory from the partitions' tokens
 * (idemflow_directory_sync), so that a token created on the test's
 * partition routes there. tstack_cli does it after every successful
 * command with a "token" argument; a test that writes api_tokens by SQL
 * calls it.
 * Nothing without a proxy.
 */
void tstack_shards_sync(void);

/* Processes: the harness supervisor, its live workers, liveness. */
pid_t tstack_supervisor_pid(void);
size_t tstack_workers(pid_t supervisor, pid_t *out, size_t max);
int tstack_pid_gone(pid_t pid);

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

/*
 * Stop pid with SIGSTOP and return once every thread of it is stopped
 * (/proc/pid/task/N/stat in state T). kill(2) returns when the signal is
 * sent, not when it took effect: a thread already running may go on
 * serving a little longer. The test fails if the process is not stopped
 * within 5 s.
 */
void tstack_stop_process(pid_t pid);

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

/*
 * TSTACK_SETTINGS("key = value\n...") at file scope gives the binary's
 * tests settings of their own on the harness's pool: before the first test
 * starts, the lines are appended to $IDEMFLOW_CONF (later lines win, for
 * the server and for tstack_conf_*), the supervisor is sent SIGHUP, and
 * the hook waits until every worker it had is gone and the pool is back
 * at its size. Each test binary has a stack of its own, so no other
 * binary sees them. A failed reload ends the run with a message.
 *
 * For the tests whose requests wait on a lock the test holds, or on one
 * another: the harness's idempotency_wait (1 s) is also every worker's
 * lock_timeout, too short a window on a loaded machine.
 */
void tstack_settings_hook(const char *lines);
#define TSTACK_SETTINGS(lines)                                                                     \
	ReportHook(PRE_ALL)(struct criterion_test_set * tstack_set)                                \
	{                                                                                          \
		(void)tstack_set;                                                                  \
		tstack_settings_hook(lines);                                                       \
	}

#endif
