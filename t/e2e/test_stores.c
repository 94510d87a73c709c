/*
 * End-to-end tests of what a request leaves behind: which answers an
 * Idempotency-Key keeps (the command's own outcomes, and nothing else),
 * and how big an answer and a worker may grow whatever a tenant asks for.
 *
 * Every test works in a tenant of its own.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

TestSuite(keys, .timeout = 90);
TestSuite(memory, .timeout = 180);

static void activate_one(const struct tstack_tenant *t, const char *type, const char *worker,
                         int lease)
{
	char body[256];
	struct http_response *r;

	snprintf(body, sizeof(body), "{\"job_type\":\"%s\",\"worker\":\"%s\",\"lease_seconds\":%d}",
	         type, worker, lease);
	r = tstack_post(t, "/v1/jobs/activate", NULL, body);
	tstack_expect_status(r, 200);
	cr_assert_eq(tstack_count("SELECT jsonb_array_length($1::jsonb -> 'jobs')", r->body), 1,
	             "activation: %s", r->body);
	http_response_free(r);
}

/* r replays first: same status, Content-Type and body bytes, flagged. */
static void expect_replay(const struct http_response *r, const struct http_response *first)
{
	cr_assert_eq(r->status, first->status, "status %d, body %.500s", r->status, r->body);
	tstack_expect_header(r, "Idempotent-Replayed", "true");
	tstack_expect_header(r, "Content-Type", http_header(first, "Content-Type"));
	cr_assert_eq(r->body_len, first->body_len, "replayed %.500s, first %.500s", r->body,
	             first->body);
	cr_assert(memcmp(r->body, first->body, r->body_len) == 0, "replayed %.500s, first %.500s",
	          r->body, first->body);
}

static long key_rows(const char *key)
{
	return tstack_count("SELECT count(*) FROM idempotency_keys WHERE key = $1", key);
}

/* --- Only results are stored under a key --------------------------------- */

/*
 * A keyed completion of a job that does not exist yet answers 404 and
 * leaves the key free: once the job exists and is leased, the same key
 * and the same request complete it (executed, not replayed), and only
 * then is the answer kept and replayed.
 */
Test(keys, a_missing_job_is_not_stored_and_the_same_key_works_once_it_exists)
{
	const char *body = "{\"worker\":\"w\",\"output\":{\"n\":2}}";
	struct tstack_tenant t;
	struct http_response *a, *b, *c;
	char key[96], path[160], *wf;

	tstack_tenant_create(&t, "missing");
	wf = tstack_create(&t, "{\"type\":\"m\",\"steps\":[{\"name\":\"a\",\"job_type\":\"m1\"},"
	                       "{\"name\":\"b\",\"job_type\":\"m2\"}]}");
	snprintf(path, sizeof(path), "/v1/jobs/%s.s2/complete", wf);
	tstack_key(key, sizeof(key), "early");
	a = tstack_post(&t, path, key, body);
	tstack_expect_problem(a, 404, "/problems/not-found", path);
	cr_assert_eq(key_rows(key), 0, "a 404 does not consume the key");

	activate_one(&t, "m1", "w", 60);
	char p1[160];
	snprintf(p1, sizeof(p1), "/v1/jobs/%s.s1/complete", wf);
	http_response_free(tstack_post(&t, p1, NULL, "{\"worker\":\"w\"}"));
	activate_one(&t, "m2", "w", 60);

	b = tstack_post(&t, path, key, body);
	tstack_expect_status(b, 200);
	cr_assert_null(http_header(b, "Idempotent-Replayed"), "executed, not replayed");
	char *state = tstack_json(b->body, "{state}");
	cr_assert_str_eq(state, "completed");
	free(state);
	cr_assert_eq(key_rows(key), 1);
	c = tstack_post(&t, path, key, body);
	expect_replay(c, b);
	http_response_free(a);
	http_response_free(b);
	http_response_free(c);
	free(wf);
}

/*
 * A keyed transition or message to a workflow that does not exist answers
 * 404 and stores nothing: the same key then serves a corrected request
 * (another path is another request) instead of idempotency-key-reused.
 */
Test(keys, a_missing_workflow_is_not_stored_and_a_corrected_request_may_reuse_the_key)
{
	static const struct {
		const char *verb;
		const char *body;
		int status;
	} cases[] = {
		{ "transitions", "{\"to\":\"cancelled\"}", 200 },
		{ "messages", "{\"message_id\":\"m-1\",\"name\":\"go\"}", 202 },
	};
	struct tstack_tenant t;
	char key[96], path[200], missing[37];

	tstack_tenant_create(&t, "missingwf");
	tstack_uuid(missing);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *wf = tstack_create(&t, "{\"type\":\"mw\"}");
		struct http_response *a, *b;

		tstack_key(key, sizeof(key), cases[i].verb);
		snprintf(path, sizeof(path), "/v1/workflows/%s/%s", missing, cases[i].verb);
		a = tstack_post(&t, path, key, cases[i].body);
		tstack_expect_problem(a, 404, "/problems/not-found", path);
		cr_assert_eq(key_rows(key), 0, "%s: a 404 does not consume the key", cases[i].verb);
		snprintf(path, sizeof(path), "/v1/workflows/%s/%s", wf, cases[i].verb);
		b = tstack_post(&t, path, key, cases[i].body);
		tstack_expect_status(b, cases[i].status);
		cr_assert_null(http_header(b, "Idempotent-Replayed"));
		cr_assert_eq(key_rows(key), 1);
		http_response_free(a);
		http_response_free(b);
		free(wf);
	}
}

/* A request that breaks a command's rules is refused before the key is
 * claimed: nothing is stored, and the corrected request under the same
 * key executes. */
Test(keys, a_validation_error_is_not_stored)
{
	struct tstack_tenant t;
	struct http_response *a, *b;
	char key[96], path[200], *wf;
	static const struct {
		const char *path; /* "/transitions": the workflow's */
		const char *bad, *good;
		int bad_status, good_status;
		const char *type;
	} cases[] = {
		{ "/transitions", "{\"to\":\"sleeping\"}", "{\"to\":\"cancelled\"}", 422, 200,
		  "/problems/invalid-request" },
		{ "/v1/jobs/activate", "{\"job_type\":\"v\",\"worker\":\"w\",\"max_jobs\":0}",
		  "{\"job_type\":\"v\",\"worker\":\"w\"}", 422, 200, "/problems/invalid-request" },
		{ "/v1/workflows", "{\"type\":\"\"}", "{\"type\":\"v\"}", 422, 201,
		  "/problems/invalid-workflow" },
		{ "/v1/workflows", "{\"type\":", "{\"type\":\"v\"}", 400, 201,
		  "/problems/invalid-json" },
	};

	tstack_tenant_create(&t, "valid");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		wf = tstack_create(&t, "{\"type\":\"v\"}");
		if (cases[i].path[0] == '/' && cases[i].path[1] == 't')
			snprintf(path, sizeof(path), "/v1/workflows/%s%s", wf, cases[i].path);
		else
			snprintf(path, sizeof(path), "%s", cases[i].path);
		tstack_key(key, sizeof(key), "v");
		a = tstack_post(&t, path, key, cases[i].bad);
		tstack_expect_problem(a, cases[i].bad_status, cases[i].type, path);
		cr_assert_eq(key_rows(key), 0, "case %zu", i);
		b = tstack_post(&t, path, key, cases[i].good);
		tstack_expect_status(b, cases[i].good_status);
		cr_assert_null(http_header(b, "Idempotent-Replayed"));
		cr_assert_eq(key_rows(key), 1, "case %zu", i);
		http_response_free(a);
		http_response_free(b);
		free(wf);
	}
}

/* Send body to path twice under one fresh key: the first answer is the
 * refusal (status, type), stored; the second is its replay, byte for byte. */
static void expect_stored_refusal(const struct tstack_tenant *t, const char *path, const char *body,
                                  int status, const char *type)
{
	struct http_response *a, *b;
	char key[96];

	tstack_key(key, sizeof(key), "refusal");
	a = tstack_post(t, path, key, body);
	tstack_expect_problem(a, status, type, path);
	cr_assert_null(http_header(a, "Idempotent-Replayed"));
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE key = $1"
	                          " AND status = $2::int",
	                          key, status == 409 ? "409" : "422"),
	             1, "%s is stored under its key", type);
	b = tstack_post(t, path, key, body);
	expect_replay(b, a);
	http_response_free(a);
	http_response_free(b);
}

/* Every refusal a command decides from the state it finds is its outcome:
 * stored, and replayed byte for byte. */
Test(keys, every_refusal_of_a_command_is_stored_and_replayed_byte_for_byte)
{
	struct tstack_tenant t;
	char path[200], *wf;

	tstack_tenant_create(&t, "refusals");

	/* lease-expired: the worker's lease of 1 s ran out. */
	wf = tstack_create(&t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"rl\"}]}");
	activate_one(&t, "rl", "w", 1);
	tstack_sleep_ms(1300);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	expect_stored_refusal(&t, path, "{\"worker\":\"w\"}", 409, "/problems/lease-expired");
	free(wf);

	/* not-lease-holder, then job-not-active on the completed job. */
	wf = tstack_create(&t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"rh\"}]}");
	activate_one(&t, "rh", "w", 60);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	expect_stored_refusal(&t, path, "{\"worker\":\"intruder\"}", 409,
	                      "/problems/not-lease-holder");
	http_response_free(tstack_post(&t, path, NULL, "{\"worker\":\"w\",\"output\":{\"v\":1}}"));
	expect_stored_refusal(&t, path, "{\"worker\":\"w\",\"output\":{\"v\":2}}", 409,
	                      "/problems/job-not-active");
	free(wf);

	/* state-conflict and invalid-transition. */
	wf = tstack_create(&t, "{\"type\":\"r\"}");
	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", wf);
	expect_stored_refusal(&t, path, "{\"to\":\"cancelled\",\"from\":\"running\"}", 409,
	                      "/problems/state-conflict");
	expect_stored_refusal(&t, path, "{\"to\":\"completed\"}", 422,
	                      "/problems/invalid-transition");

	/* message-id-reused. */
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	http_response_free(tstack_post(&t, path, NULL, "{\"message_id\":\"x\",\"name\":\"go\"}"));
	expect_stored_refusal(&t, path, "{\"message_id\":\"x\",\"name\":\"stop\"}", 409,
	                      "/problems/message-id-reused");
	free(wf);
}

/* --- Bounded answers and workers ----------------------------------------- */

enum { BIG_WORKFLOWS = 40, BIG_INPUT = 900000, CLIENTS = 4, WALKS = 1 };

struct walk {
	const struct tstack_tenant *t;
	size_t cap;
	/* Results, read after the join. */
	int items, pages, failed;
	size_t largest;
	char why[300];
};

/* Walk every page of the tenant's "big" workflows, limit=1000, twice.
 * Runs on its own thread: no assertions, only results. */
static void *walk_pages(void *arg)
{
	struct walk *w = arg;
	const char *h[] = { w->t->auth, NULL };

	for (int round = 0; round < WALKS && !w->failed; round++) {
		char path[200], cursor[37] = "";
		int items = 0;
		do {
			struct http_response *r;
			const char *c, *p;
			int n = 0;

			snprintf(path, sizeof(path), "/v1/workflows?type=big&limit=1000%s%s",
			         cursor[0] ? "&after=" : "", cursor);
			r = http_request("GET", path, h, NULL, 0);
			if (r == NULL || r->status != 200) {
				snprintf(w->why, sizeof(w->why), "GET %s: %d", path,
				         r ? r->status : -1);
				w->failed = 1;
				http_response_free(r);
				break;
			}
			if (r->body_len > w->largest)
				w->largest = r->body_len;
			for (p = r->body; (p = strstr(p, "{\"id\":\"")) != NULL; p++)
				n++;
			items += n;
			w->pages++;
			c = strstr(r->body, "\"next_cursor\":\"");
			if (c != NULL)
				snprintf(cursor, sizeof(cursor), "%.36s", c + 15);
			else
				cursor[0] = '\0';
			if (n == 0 && c != NULL) {
				snprintf(w->why, sizeof(w->why), "an empty page with a cursor");
				w->failed = 1;
			}
			http_response_free(r);
		} while (cursor[0] != '\0' && !w->failed);
		w->items += items;
	}
	return NULL;
}

/* The field of pid's /proc status in KiB ("VmRSS", "VmHWM"), or -1. */
static long status_kib(pid_t pid, const char *field)
{
	char path[64], line[256];
	size_t len = strlen(field);
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	f = fopen(path, "r");
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, len) == 0 && line[len] == ':') {
			kib = strtol(line + len + 1, NULL, 10);
			break;
		}
	fclose(f);
	return kib;
}

static long rss_kib(pid_t pid)
{
	return status_kib(pid, "VmRSS");
}

/* Start pid's peak RSS (VmHWM) again from its RSS now (proc(5), clear_refs). */
static void peak_reset(pid_t pid)
{
	char path[64];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/clear_refs", (long)pid);
	f = fopen(path, "w");
	cr_assert_not_null(f, "%s: cannot open", path);
	cr_assert_eq(fputs("5", f) >= 0 && fclose(f) == 0, 1, "%s: cannot write", path);
}

/* The calls and rows PostgreSQL counted for the list query since the last
 * pg_stat_statements_reset(). */
static void list_stats(long *calls, long *rows)
{
	const char *q = "FROM pg_stat_statements WHERE query LIKE 'WITH RECURSIVE page AS (%'";
	char sql[200];

	snprintf(sql, sizeof(sql), "SELECT coalesce(sum(calls), 0) %s", q);
	*calls = tstack_count(sql);
	snprintf(sql, sizeof(sql), "SELECT coalesce(sum(rows), 0) %s", q);
	*rows = tstack_count(sql);
}

/* Items on the page r answered, and its next_cursor (36 characters, ""
 * when null) into cursor. */
static int page_items(const struct http_response *r, char cursor[37])
{
	const char *c, *p;
	int n = 0;

	for (p = r->body; (p = strstr(p, "{\"id\":\"")) != NULL; p++)
		n++;
	c = strstr(r->body, "\"next_cursor\":\"");
	snprintf(cursor, 37, "%.36s", c != NULL ? c + 15 : "");
	return n;
}

/*
 * Tens of MB of workflows (40 of about 900 KB each), listed a thousand at
 * a time by four clients at once: every answer stays within max_answer,
 * the walks see every workflow, each worker's peak resident memory during
 * the walks (VmHWM, started again from its RSS before them) stays within
 * a few pages' worth, and its resident memory comes back to near where it
 * was (its buffers and the big allocations are given back after each
 * request). Then one more walk, page by page: PostgreSQL's own count
 * (pg_stat_statements) of the rows the list query sent is the page's
 * items plus at most two (the one the cap cut, the one past the budget),
 * never the thousand asked for.
 */
Test(memory, pages_over_tens_of_megabytes_stay_within_the_cap_and_workers_give_memory_back)
{
	const long slack_kib = 5 * 1024;
	long peak[64], peak_slack_kib;
	struct tstack_tenant t;
	struct walk w[CLIENTS];
	pthread_t th[CLIENTS];
	pid_t pids[64];
	long before[64], after[64];
	size_t nw, cap;
	char n[24];

	tstack_tenant_create(&t, "bigpages");
	cap = (size_t)tstack_conf_long("max_answer", 4L * 1024 * 1024);
	snprintf(n, sizeof(n), "%d", BIG_INPUT);
	tstack_exec(tstack_db(),
	            "INSERT INTO workflows (tenant_id, id, type, input, created_at, updated_at)"
	            " SELECT $1::bigint, gen_random_uuid(), 'big',"
	            "        jsonb_build_object('n', g, 'blob', repeat(chr(97 + g % 26), $2::int)),"
	            "        now(), now()"
	            "   FROM generate_series(1, 40) g",
	            t.id_text, n);

	/* Every worker warmed by small pages first: the baseline is a worker
	 * that has served lists, not one fresh from its fork. */
	nw = tstack_workers(tstack_supervisor_pid(), pids, 64);
	cr_assert_gt(nw, 0);
	for (int i = 0; i < 30; i++) {
		const char *h[] = { t.auth, NULL };
		struct http_response *r =
		    http_request("GET", "/v1/workflows?type=none&limit=1", h, NULL, 0);
		cr_assert_not_null(r);
		http_response_free(r);
	}
	for (size_t i = 0; i < nw; i++) {
		peak_reset(pids[i]);
		before[i] = rss_kib(pids[i]);
	}

	for (int i = 0; i < CLIENTS; i++) {
		w[i] = (struct walk){ .t = &t, .cap = cap };
		cr_assert_eq(pthread_create(&th[i], NULL, walk_pages, &w[i]), 0);
	}
	for (int i = 0; i < CLIENTS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < CLIENTS; i++) {
		cr_assert_not(w[i].failed, "client %d: %s", i, w[i].why);
		cr_assert_eq(w[i].items, WALKS * BIG_WORKFLOWS, "client %d saw %d items", i,
		             w[i].items);
		cr_assert_leq(w[i].largest, cap, "client %d got a page of %zu bytes, cap %zu", i,
		              w[i].largest, cap);
		cr_assert_gt(w[i].pages, WALKS * 2, "the cap cut the pages short");
		cr_log_info("client %d: %d pages, largest %zu bytes", i, w[i].pages, w[i].largest);
	}

	/* At its peak a worker holds one page's rows (the budget plus two
	 * items) and its answer (at most the cap), each grown by doubling:
	 * four caps over where it started. Before the cap, one page held all
	 * 36 MB, twice. */
	peak_slack_kib = 4 * (long)(cap / 1024);
	for (size_t i = 0; i < nw; i++)
		peak[i] = status_kib(pids[i], "VmHWM");

	/* The workers answered before they gave the memory back: look again
	 * for a moment rather than once. */
	for (int tries = 0;; tries++) {
		int over = 0;
		for (size_t i = 0; i < nw; i++) {
			after[i] = rss_kib(pids[i]);
			over |= after[i] > before[i] + slack_kib;
		}
		if (!over || tries == 30)
			break;
		tstack_sleep_ms(100);
	}
	for (size_t i = 0; i < nw; i++) {
		cr_log_info("worker %ld: VmRSS %ld kB before, peak %ld kB, %ld kB after",
		            (long)pids[i], before[i], peak[i], after[i]);
#if defined(__SANITIZE_ADDRESS__)
		/* AddressSanitizer keeps freed memory in its quarantine (256 MB)
		 * and never hands it back: a worker's RSS says nothing there.
		 * The plain build checks it. */
		continue;
#endif
		cr_assert_gt(peak[i], 0, "worker %ld: no VmHWM", (long)pids[i]);
		cr_assert_leq(peak[i], before[i] + peak_slack_kib,
		              "worker %ld peaked at %ld kB, %ld kB over its %ld kB before (at most"
		              " %ld)",
		              (long)pids[i], peak[i], peak[i] - before[i], before[i],
		              peak_slack_kib);
		cr_assert_leq(after[i], before[i] + slack_kib,
		              "worker %ld kept %ld kB more than before (%ld -> %ld kB)",
		              (long)pids[i], after[i] - before[i], before[i], after[i]);
	}

	/* What PostgreSQL sent, page by page. */
	tstack_exec(tstack_db(), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
	{
		const char *h[] = { t.auth, NULL };
		const long most = (long)(cap / BIG_INPUT) + 2;
		char path[200], cursor[37] = "";
		int pages = 0, items = 0;
		long calls, rows, most_rows = 0;

		do {
			struct http_response *r;
			int got;

			snprintf(path, sizeof(path), "/v1/workflows?type=big&limit=1000%s%s",
			         cursor[0] ? "&after=" : "", cursor);
			tstack_exec(tstack_db(), "SELECT pg_stat_statements_reset()");
			r = http_request("GET", path, h, NULL, 0);
			cr_assert_not_null(r);
			cr_assert_eq(r->status, 200, "GET %s: %d", path, r->status);
			got = page_items(r, cursor);
			http_response_free(r);
			list_stats(&calls, &rows);
			cr_assert_eq(calls, 1, "page %d: the list query ran %ld times", pages + 1,
			             calls);
			cr_assert_gt(got, 0, "page %d: no items", pages + 1);
			cr_assert_leq(rows, got + 2,
			              "page %d: PostgreSQL sent %ld rows for a page of %d items",
			              pages + 1, rows, got);
			cr_assert_leq(
			    rows, most,
			    "page %d: PostgreSQL sent %ld rows of %d bytes, the cap is %zu",
			    pages + 1, rows, BIG_INPUT, cap);
			if (rows > most_rows)
				most_rows = rows;
			pages++;
			items += got;
		} while (cursor[0] != '\0');
		cr_assert_eq(items, BIG_WORKFLOWS, "the measured walk saw %d items", items);
		cr_log_info("measured walk: %d pages, at most %ld rows sent for one (at most %ld"
		            " allowed)",
		            pages, most_rows, most);
	}
}
