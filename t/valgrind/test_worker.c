/*
 * One idemflow-fcgi worker under valgrind's memcheck, serving a long mix
 * of requests: creates, replays, conflicts, reads, 404s, bad JSON and
 * missing keys, with exact answers. The supervisor and its worker (memcheck
 * follows the fork) must end with no invalid access, no use of
 * uninitialised memory and no definite or indirect leak.
 *
 * Run by scripts/valgrind through t/run-test (a migrated PostgreSQL);
 * IDEMFLOW_VALGRIND_REQUESTS sets the number of requests (default 10000,
 * a multiple of 8), IDEMFLOW_VALGRIND_SUPP a suppressions file. The
 * server is the plain build's: a sanitizer build cannot run under valgrind.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define COLLECTION "/v1/workflows"
#define JSON_CT    "Content-Type: application/json"

TestSuite(valgrind, .timeout = 900);

static struct tstack_pool own;
static char vglog[512]; /* memcheck's log: a pattern, %p for each process */

static void own_stop(void)
{
	tstack_pool_kill(&own, SIGKILL);
}

static void stack_path(char *out, size_t size, const char *name)
{
	int n = snprintf(out, size, "%s/vg%ld-%s", tstack_env("IDEMFLOW_STACK_DIR"), (long)getpid(),
	                 name);

	cr_assert(n > 0 && (size_t)n < size, "path too long: %s", out);
}

/* valgrind idemflow-fcgi --workers 1, in its own process group. */
static void own_start(void)
{
	const char *supp = getenv("IDEMFLOW_VALGRIND_SUPP");
	char logopt[600], suppopt[600];
	const char *argv[40];
	size_t argc = 0;

	tstack_pool_paths(&own, "vg");
	stack_path(vglog, sizeof(vglog), "memcheck.%p.log");
	snprintf(logopt, sizeof(logopt), "--log-file=%s", vglog);
	argv[argc++] = "valgrind";
	argv[argc++] = "--tool=memcheck";
	argv[argc++] = "--error-exitcode=99";
	argv[argc++] = "--leak-check=full";
	argv[argc++] = "--show-leak-kinds=definite,indirect";
	argv[argc++] = "--errors-for-leak-kinds=definite,indirect";
	argv[argc++] = "--track-origins=yes";
	argv[argc++] = "--num-callers=30";
	argv[argc++] = logopt;
	if (supp && *supp) {
		snprintf(suppopt, sizeof(suppopt), "--suppressions=%s", supp);
		argv[argc++] = suppopt;
	}
	argv[argc++] = tstack_env("IDEMFLOW_FCGI");
	argv[argc++] = "--config";
	argv[argc++] = tstack_env("IDEMFLOW_CONF");
	argv[argc++] = "--listen";
	argv[argc++] = own.sock;
	argv[argc++] = "--pid-file";
	argv[argc++] = own.pidfile;
	argv[argc++] = "--workers";
	argv[argc++] = "1";
	/* A worker that would wait for a slow (instrumented) sibling's key
	 * has none here, but its statements are slower: be generous. */
	argv[argc++] = "--idempotency-wait";
	argv[argc++] = "10s";
	argv[argc++] = "--shutdown-timeout";
	argv[argc++] = "60s";
	argv[argc++] = "--log-level";
	argv[argc++] = "warning";
	argv[argc] = NULL;

	tstack_pool_run(&own, argv, 60000);
	cr_assert(tstack_wait_workers(own.pid, 1, 60000), "no worker within 60s; see %s", own.log);
}

static struct http_response *req(const char *method, const char *path, const char *const *h,
                                 const char *body, int status)
{
	struct http_response *r =
	    http_fcgi_request(own.sock, method, path, h, body, body ? strlen(body) : 0);

	cr_assert_not_null(r, "%s %s: %s", method, path, http_error());
	cr_assert_eq(r->status, status, "%s %s: %d, want %d: %.300s", method, path, r->status,
	             status, r->body);
	return r;
}

/* ERROR SUMMARY and the leak totals of one memcheck log. */
struct vg_summary {
	long errors, definite, indirect, reachable;
	int complete; /* the process ended and memcheck wrote its summary */
};

static long number_after(const char *text, const char *label)
{
	const char *p = strstr(text, label);
	char digits[32];
	size_t n = 0;

	if (p == NULL)
		return 0;
	for (p += strlen(label); *p == ' '; p++)
		;
	for (; (*p >= '0' && *p <= '9') || *p == ','; p++)
		if (*p != ',' && n < sizeof(digits) - 1)
			digits[n++] = *p;
	digits[n] = '\0';
	return atol(digits);
}

static void vg_read(const char *path, struct vg_summary *s)
{
	FILE *f = fopen(path, "r");
	static char text[1 << 20];
	size_t n;

	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	s->complete = strstr(text, "ERROR SUMMARY:") != NULL;
	s->errors = number_after(text, "ERROR SUMMARY:");
	s->definite = number_after(text, "definitely lost:");
	s->indirect = number_after(text, "indirectly lost:");
	s->reachable = number_after(text, "still reachable:");
}

Test(valgrind, one_worker_serves_mixed_requests_with_no_memory_error_or_leak, .fini = own_stop)
{
	const char *env = getenv("IDEMFLOW_VALGRIND_REQUESTS");
	long total = env && *env ? atol(env) : 10000;
	long cycles = total / 8, counts[6] = { 0 };
	struct tstack_tenant t;
	char kh[160], path[128], body[128], other[128], uuid[37];
	const char *keyed[] = { NULL, JSON_CT, kh, NULL };
	const char *unkeyed[] = { NULL, JSON_CT, NULL };
	const char *auth[] = { NULL, NULL };
	glob_t logs;
	double t0, secs;
	int status;

	cr_assert(total >= 8 && total % 8 == 0, "IDEMFLOW_VALGRIND_REQUESTS=%ld", total);
	tstack_tenant_create(&t, "valgrind");
	keyed[0] = unkeyed[0] = auth[0] = t.auth;
	own_start();

	t0 = tstack_now();
	for (long i = 0; i < cycles; i++) {
		struct http_response *r, *again;
		const char *loc;

		snprintf(kh, sizeof(kh), "Idempotency-Key: vg-%ld", i);
		snprintf(body, sizeof(body), "{\"type\":\"vg\",\"input\":{\"i\":%ld,\"s\":\"%c\"}}",
		         i, 'a' + (int)(i % 26));
		snprintf(other, sizeof(other), "{\"type\":\"vg\",\"input\":{\"i\":%ld}}", -i);
		/* created, replayed, conflict */
		r = req("POST", COLLECTION, keyed, body, 201);
		cr_assert_null(http_header(r, "Idempotent-Replayed"));
		again = req("POST", COLLECTION, keyed, body, 201);
		cr_assert_str_eq(again->body, r->body, "replay %ld differs", i);
		http_response_free(again);
		http_response_free(req("POST", COLLECTION, keyed, other, 409));
		counts[0] += 3;
		/* read it back; an id nobody has */
		loc = http_header(r, "Location");
		cr_assert_not_null(loc);
		http_response_free(req("GET", loc, auth, NULL, 200));
		tstack_uuid(uuid);
		snprintf(path, sizeof(path), COLLECTION "/%s", uuid);
		http_response_free(req("GET", path, auth, NULL, 404));
		counts[1] += 2;
		/* bad JSON under a fresh key; no key; no route */
		snprintf(kh, sizeof(kh), "Idempotency-Key: vg-bad-%ld", i);
		http_response_free(req("POST", COLLECTION, keyed, "{\"type\":", 400));
		http_response_free(req("POST", COLLECTION, unkeyed, body, 400));
		http_response_free(req("GET", "/v1/nothing", auth, NULL, 404));
		counts[2] += 3;
		http_response_free(r);
	}
	secs = tstack_now() - t0;
	cr_assert_eq(counts[0] + counts[1] + counts[2], total);
	tstack_expect_counts(&t, cycles, cycles, cycles);

	/* A clean stop: the worker leaves with _exit, memcheck checks it. */
	cr_assert_eq(kill(own.pid, SIGTERM), 0);
	cr_assert_eq(waitpid(own.pid, &status, 0), own.pid);
	own.pid = 0;
	cr_assert(WIFEXITED(status), "supervisor status 0x%x", status);
	cr_assert_eq(WEXITSTATUS(status), 0, "supervisor exited %d (99: memcheck errors); see %s",
	             WEXITSTATUS(status), own.log);

	char pattern[600], *pp;
	snprintf(pattern, sizeof(pattern), "%s", vglog);
	pp = strstr(pattern, "%p");
	pp[0] = '*';
	memmove(pp + 1, pp + 2, strlen(pp + 2) + 1);
	cr_assert_eq(glob(pattern, 0, NULL, &logs), 0, "no memcheck logs %s", pattern);
	/* The supervisor and its one worker: nobody died and was replaced. */
	cr_assert_eq(logs.gl_pathc, 2, "%zu memcheck logs, want 2", logs.gl_pathc);
	for (size_t i = 0; i < logs.gl_pathc; i++) {
		struct vg_summary s;

		vg_read(logs.gl_pathv[i], &s);
		cr_assert(s.complete, "%s: no ERROR SUMMARY", logs.gl_pathv[i]);
		cr_log_info("%s: %ld errors, definitely lost %ld, indirectly lost %ld, still "
		            "reachable %ld bytes",
		            logs.gl_pathv[i], s.errors, s.definite, s.indirect, s.reachable);
		fprintf(stderr, "memcheck: %s: %ld errors, lost %ld + %ld bytes, %ld reachable\n",
		        strrchr(logs.gl_pathv[i], '/') + 1, s.errors, s.definite, s.indirect,
		        s.reachable);
		cr_expect_eq(s.errors, 0, "%s: %ld errors", logs.gl_pathv[i], s.errors);
		cr_expect_eq(s.definite + s.indirect, 0, "%s: %ld bytes lost", logs.gl_pathv[i],
		             s.definite + s.indirect);
	}
	fprintf(stderr, "memcheck: %ld requests in %.1f s (%.0f/s) through one worker\n", total,
	        secs, total / secs);
	globfree(&logs);
}
