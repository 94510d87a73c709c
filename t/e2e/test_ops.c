/*
 * test_ops.c - operating idemflow: prune (retention), per-tenant key TTLs,
 * the per-key counts behind "idemflow debug idempotency-check", and
 * GET /readyz.
 *
 * prune works on the whole database and the readiness test stops
 * PostgreSQL, so these tests run one at a time (TSTACK_SEQUENTIAL, at the
 * end).
 * Each works in tenants of its own and leaves nothing expired behind.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <json-c/json.h>

#include "core/migrate.h"
#include "http.h"
#include "tapi.h"
#include "tlog.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define JSON_CT "Content-Type: application/json"

static const char BODY[] = "{\"type\":\"ops\",\"input\":{\"n\":1}}";

TestSuite(prune, .timeout = 120);
TestSuite(tenant_ttl, .timeout = 60);
TestSuite(debug, .timeout = 60);
TestSuite(readyz, .timeout = 120);

/* --- Helpers ----------------------------------------------------------- */

/* POST /v1/workflows with key and body; on any thread (no assertions). */
static struct http_response *post_raw(const struct tstack_tenant *t, const char *key,
                                      const char *body)
{
	char kh[300];

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	const char *headers[] = { t->auth, JSON_CT, kh, NULL };
	return http_request("POST", "/v1/workflows", headers, body, strlen(body));
}

static struct http_response *post(const struct tstack_tenant *t, const char *key, const char *body)
{
	struct http_response *r = post_raw(t, key, body);

	cr_assert_not_null(r, "POST: %s", http_error());
	return r;
}

static struct http_response *get(const char *path)
{
	struct http_response *r = http_request("GET", path, NULL, NULL, 0);

	cr_assert_not_null(r, "GET %s: %s", path, http_error());
	return r;
}

/* Run the CLI, expecting exit 0; its stdout goes to out. */
#define cli_ok(out, ...)                                                                           \
	do {                                                                                       \
		int rc_ = tstack_cli(out, sizeof(out), __VA_ARGS__, NULL);                         \
		cr_assert_eq(rc_, 0, "idemflow exited %d: %s", rc_, tstack_cli_stderr());          \
	} while (0)

struct prune_report {
	long keys, key_stats, events, messages, timers, history_kept;
	int statements;
};

/* Statements a prune in batches of batch takes: each kind of row goes
 * in full batches until one comes back short (possibly empty); the
 * events' batches read the events kept as history too. */
static int prune_statements(const struct prune_report *p, int batch)
{
	return (int)(p->keys / batch + 1 + (p->events + p->history_kept) / batch + 1);
}

/* idemflow prune [FLAG VALUE [FLAG2 VALUE2]], and its one-line report. */
static struct prune_report prune_run2(const char *flag, const char *value, const char *flag2,
                                      const char *value2)
{
	struct prune_report p;
	char out[512];
	int n, batch;
	double secs;

	if (flag != NULL && value2 != NULL)
		cli_ok(out, "prune", flag, value, flag2, value2);
	else if (flag != NULL)
		cli_ok(out, "prune", flag, value);
	else
		cli_ok(out, "prune");
	n = sscanf(out,
	           "prune: keys=%ld key_stats=%ld events=%ld statements=%d duration_s=%lf "
	           "messages=%ld timers=%ld history_kept=%ld",
	           &p.keys, &p.key_stats, &p.events, &p.statements, &secs, &p.messages, &p.timers,
	           &p.history_kept);
	cr_assert_eq(n, 8, "unexpected prune report: \"%s\"", out);
	batch = flag != NULL && strcmp(flag, "--prune-batch") == 0 ? atoi(value)
	        : flag2 != NULL && strcmp(flag2, "--prune-batch") == 0
	            ? atoi(value2)
	            : (int)tstack_conf_long("prune_batch", 1000);
	cr_assert_eq(p.statements, prune_statements(&p, batch), "batches of %d: %s", batch, out);
	return p;
}

static struct prune_report prune_run(const char *flag, const char *value)
{
	return prune_run2(flag, value, NULL, NULL);
}

static long count_for(const struct tstack_tenant *t, const char *table)
{
	char sql[128];

	snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE tenant_id = $1", table);
	return tstack_count(sql, t->id_text);
}

/* Expire every key a test left in its tenant, so a later test's prune
 * counts only its own. */
static void forget_keys(const struct tstack_tenant *t)
{
	tstack_exec(tstack_db(), "DELETE FROM idempotency_keys WHERE tenant_id = $1", t->id_text);
	tstack_exec(tstack_db(), "DELETE FROM idempotency_key_stats WHERE tenant_id = $1",
	            t->id_text);
}

/* --- Prune ------------------------------------------------------------- */

/* Keyed traffic for another tenant while prune runs: new keys, plus
 * replays of one key inside its TTL. */
struct traffic {
	const struct tstack_tenant *t;
	const char *replay_key;
	atomic_int *stop;
	int id;
	atomic_long created, replayed;
	long other; /* anything unexpected */
	char other_what[256];
};

static void *traffic_run(void *arg)
{
	struct traffic *tr = arg;

	for (long i = 0; !atomic_load(tr->stop); i++) {
		char key[96];
		struct http_response *r;
		int replay = i % 3 == 2;

		if (replay)
			snprintf(key, sizeof(key), "%s", tr->replay_key);
		else
			snprintf(key, sizeof(key), "traffic-%d-%ld-%ld", tr->id, (long)getpid(), i);
		r = post_raw(tr->t, key, BODY);
		if (r != NULL && r->status == 201 &&
		    (http_header(r, "Idempotent-Replayed") != NULL) == replay) {
			if (replay)
				tr->replayed++;
			else
				tr->created++;
		} else {
			if (tr->other++ == 0)
				snprintf(tr->other_what, sizeof(tr->other_what), "%s %d: %.80s",
				         key, r ? r->status : -1, r ? r->body : http_error());
		}
		http_response_free(r);
	}
	return NULL;
}

#define TRAFFIC_THREADS 4
#define EXPIRED_KEYS    5000

static long traffic_answered(struct traffic *tr)
{
	long n = 0;

	for (int i = 0; i < TRAFFIC_THREADS; i++)
		n += atomic_load(&tr[i].created) + atomic_load(&tr[i].replayed);
	return n;
}

Test(prune, removes_exactly_the_expired_keys_while_keyed_traffic_continues)
{
	struct tstack_tenant brief, lasting;
	struct http_response *first, *r;
	struct traffic tr[TRAFFIC_THREADS];
	pthread_t th[TRAFFIC_THREADS];
	atomic_int stop = 0;
	char out[256], key[128], live_key[128];
	long traffic_created = 0;

	tstack_tenant_create(&brief, "prune-brief");
	tstack_tenant_create(&lasting, "prune-lasting");
	/* A 1 s TTL is below the floor of the default waits: with waits of
	 * 100 ms and no statement timeout, the floor is 1 s. */
	cli_ok(out, "--idempotency-wait", "100ms", "--statement-timeout", "0", "--idempotency-ttl",
	       "1s", "tenant", "set-ttl", brief.name, "1s");

	/* One key made through the API with the tenant's 1 s TTL, and
	 * replayed once, so it has counts that must go with it. */
	tstack_key(key, sizeof(key), "brief");
	first = post(&brief, key, BODY);
	cr_assert_eq(first->status, 201, "%s", first->body);
	char *first_id = tstack_expect_created(first, "ops", "{\"n\":1}");
	r = post(&brief, key, BODY);
	tstack_expect_replay(r, first);
	http_response_free(r);
	tstack_key(live_key, sizeof(live_key), "lasting");
	struct http_response *live_first = post(&lasting, live_key, BODY);
	cr_assert_eq(live_first->status, 201, "%s", live_first->body);

	/* Many more expired keys than one batch, some with counts, and three
	 * keys of the same tenant that are not expired yet. */
	tstack_exec(
	    tstack_db(),
	    "INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint,"
	    "       status, headers, body, created_at, expires_at)"
	    " SELECT $1, 'old-' || i, 'POST', '/v1/workflows', decode('00', 'hex'), 201, '',"
	    "        '{}', now() - interval '2 hours', now() - interval '1 hour'"
	    "   FROM generate_series(1, 5000) i",
	    brief.id_text);
	tstack_exec(tstack_db(),
	            "INSERT INTO idempotency_key_stats (tenant_id, key, replays, conflicts,"
	            "       in_flight, last_seen)"
	            " SELECT $1, 'old-' || i, 2, 1, 0, now() - interval '1 hour'"
	            "   FROM generate_series(1, 10) i",
	            brief.id_text);
	tstack_exec(tstack_db(),
	            "INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint,"
	            "       status, headers, body, created_at, expires_at)"
	            " SELECT $1, 'young-' || i, 'POST', '/v1/workflows', decode('00', 'hex'), 201,"
	            "        '', '{}', now(), now() + interval '1 hour'"
	            "   FROM generate_series(1, 3) i",
	            brief.id_text);

	/* Past the 1 s TTL, and past the worker's flush of the replay. */
	tstack_sleep_ms(1500);
	cr_assert_eq(tstack_count("SELECT replays FROM idempotency_key_stats"
	                          " WHERE tenant_id = $1 AND key = $2",
	                          brief.id_text, key),
	             1, "the replay was counted");
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"
	                          "   AND expires_at <= now()",
	                          brief.id_text),
	             EXPIRED_KEYS + 1);

	for (int i = 0; i < TRAFFIC_THREADS; i++) {
		tr[i] = (struct traffic){
			.t = &lasting, .replay_key = live_key, .stop = &stop, .id = i
		};
		cr_assert_eq(pthread_create(&th[i], NULL, traffic_run, &tr[i]), 0);
	}
	tstack_sleep_ms(200); /* the traffic is under way */
	long before = traffic_answered(tr);
	struct prune_report p = prune_run("--prune-batch", "100");
	long during = traffic_answered(tr) - before;
	tstack_sleep_ms(200);
	atomic_store(&stop, 1);
	for (int i = 0; i < TRAFFIC_THREADS; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(tr[i].other, 0,
		             "traffic thread %d got %ld unexpected answers, first %s", i,
		             tr[i].other, tr[i].other_what);
		cr_assert(tr[i].created > 0 && tr[i].replayed > 0, "thread %d: no traffic", i);
		traffic_created += tr[i].created;
	}
	cr_assert(during > 0, "no request was answered while prune ran");

	cr_assert_eq(p.keys, EXPIRED_KEYS + 1, "keys removed");
	/* 50 full batches of keys, one of a single key, one empty of events. */
	cr_assert_eq(p.statements, 52);
	cr_assert_eq(p.key_stats, 10 + 1, "counts removed with their keys");
	cr_assert_eq(p.events, 0);
	/* Exactly the expired ones: the young keys and every key of the
	 * traffic are still there; the workflow and event of the pruned key
	 * are not touched. */
	cr_assert_eq(count_for(&brief, "idempotency_keys"), 3);
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"
	                          "   AND key LIKE 'young-%'",
	                          brief.id_text),
	             3);
	cr_assert_eq(count_for(&brief, "idempotency_key_stats"), 0);
	cr_assert_eq(count_for(&brief, "workflows"), 1);
	cr_assert_eq(count_for(&brief, "outbox"), 1);
	cr_assert_eq(count_for(&lasting, "idempotency_keys"), 1 + traffic_created);
	cr_assert_eq(count_for(&lasting, "workflows"), 1 + traffic_created);

	/* A pruned key is new: the same request creates a second workflow. */
	r = post(&brief, key, BODY);
	cr_assert_null(http_header(r, "Idempotent-Replayed"), "a pruned key must not replay");
	char *second_id = tstack_expect_created(r, "ops", "{\"n\":1}");
	cr_assert_str_neq(second_id, first_id);
	cr_assert_eq(count_for(&brief, "workflows"), 2);
	http_response_free(r);

	/* A key inside its TTL still replays, byte for byte. */
	r = post(&lasting, live_key, BODY);
	tstack_expect_replay(r, live_first);
	http_response_free(r);

	/* Nothing left to do: a second run removes nothing. */
	forget_keys(&brief);
	p = prune_run(NULL, NULL);
	cr_assert_eq(p.keys, 0);
	cr_assert_eq(p.key_stats, 0);

	free(first_id);
	free(second_id);
	http_response_free(first);
	http_response_free(live_first);
}

/* event_id of the workflow created under key, via the Location id. */
static char *event_of(const struct tstack_tenant *t, const char *key)
{
	struct http_response *r = post(t, key, BODY);
	char *id = tstack_expect_created(r, "ops", "{\"n\":1}");
	char *ev = malloc(strlen(id) + 3);

	cr_assert_not_null(ev);
	sprintf(ev, "%s.1", id);
	free(id);
	http_response_free(r);
	return ev;
}

static int event_exists(const char *event_id)
{
	return (int)tstack_count("SELECT count(*) FROM outbox WHERE event_id = $1", event_id);
}

/* Every workflow of t completed, ended `ago` (an interval) ago. */
static void end_workflows(const struct tstack_tenant *t, const char *ago)
{
	tstack_exec(tstack_db(),
	            "UPDATE workflows SET state = 'completed', ended_at = now() - $2::interval"
	            " WHERE tenant_id = $1",
	            t->id_text, ago);
}

/* Mark every event of workflow wf delivered `ago` ago. */
static void delivered(const char *wf, const char *ago)
{
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET published_at = now() - $2::interval WHERE workflow_id = $1",
	            wf, ago);
}

static long events_of(const char *wf)
{
	return tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1", wf);
}

/*
 * A workflow's events are its history (GET /v1/workflows/{id}/events) as
 * well as the record of their delivery: a prune that removes the delivered
 * events of finished workflows keeps every event of a live one however
 * long ago it was delivered, and a finished one's until it has ended
 * history_retention ago.
 */
Test(prune, keeps_a_live_workflows_history_and_a_finished_ones_until_history_retention)
{
	struct tstack_tenant live, done, recent;
	struct http_response *r;
	char path[160], *lw, *dw, *rw, *types;

	tstack_tenant_create(&live, "prune-live");
	tstack_tenant_create(&done, "prune-done");
	tstack_tenant_create(&recent, "prune-recent");
	/* live: running, waiting for a message, its 3 events delivered 30
	 * days ago; done: ended 8 days ago, 2 events delivered 30 days ago;
	 * recent: ended 1 day ago, 2 events delivered 30 days ago. */
	lw = tstack_create(&live, "{\"type\":\"l\",\"steps\":[{\"name\":\"a\",\"job_type\":\"pl\"},"
	                          "{\"name\":\"b\",\"wait_for\":\"go\"}]}");
	r = tstack_post(&live, "/v1/jobs/activate", NULL,
	                "{\"job_type\":\"pl\",\"worker\":\"w\",\"max_jobs\":1,"
	                "\"lease_seconds\":60}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", lw);
	r = tstack_post(&live, path, NULL, "{\"worker\":\"w\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	dw = tstack_create(&done, "{\"type\":\"d\"}");
	rw = tstack_create(&recent, "{\"type\":\"d\"}");
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", i ? rw : dw);
		r = tstack_post(i ? &recent : &done, path, NULL, "{\"to\":\"cancelled\"}");
		tstack_expect_status(r, 200);
		http_response_free(r);
	}
	end_workflows(&done, "8 days");
	end_workflows(&recent, "1 day");
	delivered(lw, "30 days");
	delivered(dw, "30 days");
	delivered(rw, "30 days");
	cr_assert_eq(events_of(lw), 3, "created, started, job.completed");
	cr_assert_eq(events_of(dw), 2, "created, cancelled");
	cr_assert_eq(events_of(rw), 2);

	/* Defaults: outbox_retention 7d, history_retention 7d. */
	struct prune_report p = prune_run(NULL, NULL);
	cr_assert_eq(p.events, 2, "the finished workflow's events: %ld deleted", p.events);
	cr_assert_eq(events_of(dw), 0);
	cr_assert_eq(events_of(lw), 3, "a live workflow's history stays");
	cr_assert_eq(events_of(rw), 2, "ended a day ago, within history_retention");
	cr_assert_eq(p.history_kept, 5, "the live one's 3 and the recent one's 2");
	snprintf(path, sizeof(path), "/v1/workflows/%s/events", lw);
	r = tstack_get(&live, path);
	tstack_expect_status(r, 200);
	types = tstack_text("SELECT string_agg(e ->> 'type', ',' ORDER BY (e ->> 'seq')::int)"
	                    "  FROM jsonb_array_elements($1::jsonb -> 'events') e",
	                    r->body);
	cr_assert_str_eq(types, "workflow.created,workflow.started,job.completed");
	free(types);
	http_response_free(r);

	/* A shorter history retention takes the recent one; the live one
	 * still stays. */
	p = prune_run2("--history-retention", "12h", "--prune-batch", "1");
	cr_assert_eq(p.events, 2);
	cr_assert_eq(p.history_kept, 3);
	cr_assert_eq(events_of(rw), 0);
	cr_assert_eq(events_of(lw), 3);
	cr_assert_eq(count_for(&live, "workflows"), 1);
	cr_assert_eq(count_for(&done, "workflows"), 1, "workflows are not pruned");
	free(lw);
	free(dw);
	free(rw);
}

Test(prune, deletes_delivered_events_past_the_retention_and_keeps_pending_and_dead_ones)
{
	struct tstack_tenant t;
	char key[128];
	char *ev[5];

	tstack_tenant_create(&t, "prune-events");
	for (int i = 0; i < 5; i++) {
		tstack_key(key, sizeof(key), "event");
		ev[i] = event_of(&t, key);
	}
	/* Their workflows ended long ago: only the delivery's age decides. */
	end_workflows(&t, "8 days");
	/* 0: delivered 8 days ago; 1: 3 hours ago; 2: a minute ago;
	 * 3: dead for a month; 4: pending, created a month ago. */
	tstack_exec(
	    tstack_db(),
	    "UPDATE outbox SET published_at = now() - interval '8 days' WHERE event_id = $1",
	    ev[0]);
	tstack_exec(
	    tstack_db(),
	    "UPDATE outbox SET published_at = now() - interval '3 hours' WHERE event_id = $1",
	    ev[1]);
	tstack_exec(
	    tstack_db(),
	    "UPDATE outbox SET published_at = now() - interval '1 minute' WHERE event_id = $1",
	    ev[2]);
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET dead_at = now() - interval '30 days', attempts = 8,"
	            "       created_at = now() - interval '31 days' WHERE event_id = $1",
	            ev[3]);
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET created_at = now() - interval '30 days' WHERE event_id = $1",
	            ev[4]);

	/* The default retention is 7 days. */
	struct prune_report p = prune_run(NULL, NULL);
	cr_assert_eq(p.events, 1);
	cr_assert_eq(event_exists(ev[0]), 0, "delivered 8 days ago");
	cr_assert_eq(event_exists(ev[1]), 1);

	p = prune_run("--outbox-retention", "2h");
	cr_assert_eq(p.events, 1);
	cr_assert_eq(event_exists(ev[1]), 0, "delivered 3 hours ago, retention 2h");
	cr_assert_eq(event_exists(ev[2]), 1, "delivered a minute ago");
	cr_assert_eq(event_exists(ev[3]), 1, "dead events stay until requeued or purged");
	cr_assert_eq(event_exists(ev[4]), 1, "pending events stay, however old");
	/* The workflows the events announced are all still there. */
	cr_assert_eq(count_for(&t, "workflows"), 5);

	for (int i = 0; i < 5; i++)
		free(ev[i]);
}

/* What a prune did to workflows: the fields after history_kept=. */
struct prune_wf_report {
	long workflows, jobs, timers, messages, events, held;
};

/* idemflow prune [FLAG VALUE], and the workflows' part of its report. */
static struct prune_wf_report prune_wf_run(const char *flag, const char *value)
{
	struct prune_wf_report w;
	const char *tail;
	char out[512];
	int n;

	if (flag != NULL)
		cli_ok(out, "prune", flag, value);
	else
		cli_ok(out, "prune");
	tail = strstr(out, " workflows=");
	cr_assert_not_null(tail, "no workflows= in \"%s\"", out);
	n = sscanf(tail,
	           " workflows=%ld workflow_jobs=%ld workflow_timers=%ld workflow_messages=%ld "
	           "workflow_events=%ld workflows_held=%ld",
	           &w.workflows, &w.jobs, &w.timers, &w.messages, &w.events, &w.held);
	cr_assert_eq(n, 6, "unexpected prune report: \"%s\"", out);
	return w;
}

/* Rows of workflow wf in table (jobs, timers, messages, outbox, or
 * workflows by id). */
static long rows_of(const char *table, const char *wf)
{
	char sql[128];

	snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE %s = $1", table,
	         strcmp(table, "workflows") == 0 ? "id" : "workflow_id");
	return tstack_count(sql, wf);
}

/* Workflow wf ended `ago` ago (its state as it is), every event delivered
 * a day ago. */
static void ended_and_delivered(const char *wf, const char *ago)
{
	tstack_exec(tstack_db(),
	            "UPDATE workflows SET ended_at = now() - $2::interval WHERE id = $1", wf, ago);
	delivered(wf, "1 day");
}

static void cancel(const struct tstack_tenant *t, const char *wf)
{
	char path[160];
	struct http_response *r;

	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", wf);
	r = tstack_post(t, path, NULL, "{\"to\":\"cancelled\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
}

/*
 * An ended workflow goes workflow_retention (30 days) after it ended, with
 * its jobs, its timers, the messages it received and its events, in one
 * statement; one with an event not delivered (pending, or dead) stays
 * whole until it is; a live one stays however old, with its whole
 * history.
 */
Test(prune, deletes_ended_workflows_past_workflow_retention_with_all_theirs)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[160], *old, *pending, *dead, *recent, *live;

	tstack_tenant_create(&t, "prune-wf");
	/* old: a job step done, then waiting with a timeout (its timer), a
	 * message recorded for later, cancelled: 2 jobs, 1 timer, 1 message,
	 * 4 events (created, started, job.completed, cancelled). */
	old = tstack_create(&t, "{\"type\":\"w\",\"steps\":[{\"name\":\"a\",\"job_type\":\"pwf\"},"
	                        "{\"name\":\"b\",\"wait_for\":\"go\",\"timeout\":\"PT1H\"}]}");
	r = tstack_post(&t, "/v1/jobs/activate", NULL,
	                "{\"job_type\":\"pwf\",\"worker\":\"w\",\"max_jobs\":1}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", old);
	r = tstack_post(&t, path, NULL, "{\"worker\":\"w\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", old);
	r = tstack_post(&t, path, NULL,
	                "{\"message_id\":\"prune-wf-later\",\"name\":\"later\",\"payload\":{}}");
	tstack_expect_status(r, 202);
	http_response_free(r);
	cancel(&t, old);
	pending = tstack_create(&t, "{\"type\":\"w\"}");
	dead = tstack_create(&t, "{\"type\":\"w\"}");
	recent = tstack_create(&t, "{\"type\":\"w\"}");
	cancel(&t, pending);
	cancel(&t, dead);
	cancel(&t, recent);
	live = tstack_create(&t, "{\"type\":\"w\",\"steps\":[{\"name\":\"a\",\"job_type\":\"pwf\"},"
	                         "{\"name\":\"b\",\"job_type\":\"pwf-never\"}]}");
	r = tstack_post(&t, "/v1/jobs/activate", NULL,
	                "{\"job_type\":\"pwf\",\"worker\":\"w\",\"max_jobs\":1}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", live);
	r = tstack_post(&t, path, NULL, "{\"worker\":\"w\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	cr_assert_eq(rows_of("jobs", old), 2);
	cr_assert_eq(rows_of("timers", old), 1);
	cr_assert_eq(rows_of("messages", old), 1);
	cr_assert_eq(rows_of("outbox", old), 4);

	ended_and_delivered(old, "31 days");
	ended_and_delivered(pending, "31 days");
	ended_and_delivered(dead, "31 days");
	ended_and_delivered(recent, "29 days");
	/* pending: its cancel not delivered yet; dead: dead for a month. */
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET published_at = NULL WHERE workflow_id = $1 AND seq = 2",
	            pending);
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET published_at = NULL, dead_at = now() - interval '30 days'"
	            " WHERE workflow_id = $1 AND seq = 2",
	            dead);
	/* live: created a year ago, its events delivered then. */
	tstack_exec(tstack_db(),
	            "UPDATE workflows SET created_at = now() - interval '1 year' WHERE id = $1",
	            live);
	delivered(live, "360 days");

	struct prune_wf_report w = prune_wf_run(NULL, NULL);
	cr_assert_eq(w.workflows, 1, "only old: %ld", w.workflows);
	cr_assert_eq(w.jobs, 2);
	cr_assert_eq(w.timers, 1);
	cr_assert_eq(w.messages, 1);
	cr_assert_eq(w.events, 4);
	cr_assert_eq(w.held, 2, "pending and dead");
	cr_assert_eq(rows_of("workflows", old), 0);
	cr_assert_eq(rows_of("jobs", old) + rows_of("timers", old) + rows_of("messages", old) +
	                 rows_of("outbox", old),
	             0);
	snprintf(path, sizeof(path), "/v1/workflows/%s", old);
	r = tstack_get(&t, path);
	tstack_expect_status(r, 404);
	http_response_free(r);
	for (int i = 0; i < 2; i++) {
		const char *kept = i ? dead : pending;
		cr_assert_eq(rows_of("workflows", kept), 1, "an undelivered event holds it");
		cr_assert_eq(rows_of("outbox", kept), 2, "whole");
	}
	cr_assert_eq(rows_of("workflows", recent), 1, "ended 29 days ago");
	cr_assert_eq(rows_of("outbox", recent), 2);
	cr_assert_eq(rows_of("workflows", live), 1, "a live workflow is never pruned");
	cr_assert_eq(rows_of("jobs", live), 2);
	cr_assert_eq(rows_of("outbox", live), 3, "created, started, job.completed");

	/* Delivered at last (the dead one requeued and delivered): both go. */
	delivered(pending, "1 minute");
	delivered(dead, "1 minute");
	w = prune_wf_run("--prune-batch", "1");
	cr_assert_eq(w.workflows, 2);
	cr_assert_eq(w.events, 4);
	cr_assert_eq(w.held, 0);
	cr_assert_eq(rows_of("workflows", pending) + rows_of("workflows", dead), 0);
	cr_assert_eq(rows_of("workflows", recent), 1);
	cr_assert_eq(rows_of("outbox", live), 3);
	/* Nothing expired left behind for the next test's counts. */
	delivered(live, "1 minute");
	free(old);
	free(pending);
	free(dead);
	free(recent);
	free(live);
}

/* A tenant's own workflow_retention, shorter or longer than the CLI's;
 * "default" gives it back the CLI's. */
Test(prune, a_tenants_workflow_retention_overrides_the_clis)
{
	struct tstack_tenant brief, lasting, plain;
	char out[512], want[512], *b, *l, *p;

	tstack_tenant_create(&brief, "prune-wf-brief");
	tstack_tenant_create(&lasting, "prune-wf-lasting");
	tstack_tenant_create(&plain, "prune-wf-plain");
	cli_ok(out, "tenant", "set-workflow-retention", brief.name, "1h");
	snprintf(want, sizeof(want), "tenant %s: ended workflows kept for 1h after they ended",
	         brief.name);
	cr_assert_str_eq(out, want);
	cli_ok(out, "tenant", "set-workflow-retention", lasting.name, "90d");
	b = tstack_create(&brief, "{\"type\":\"w\"}");
	l = tstack_create(&lasting, "{\"type\":\"w\"}");
	p = tstack_create(&plain, "{\"type\":\"w\"}");
	cancel(&brief, b);
	cancel(&lasting, l);
	cancel(&plain, p);
	ended_and_delivered(b, "2 hours");
	ended_and_delivered(l, "60 days");
	ended_and_delivered(p, "2 hours");

	struct prune_wf_report w = prune_wf_run(NULL, NULL);
	cr_assert_eq(w.workflows, 1, "brief's, ended 2h ago, retention 1h");
	cr_assert_eq(rows_of("workflows", b), 0);
	cr_assert_eq(rows_of("workflows", l), 1, "60 days, within its 90");
	cr_assert_eq(rows_of("workflows", p), 1, "2 hours, within the CLI's 30 days");

	cli_ok(out, "tenant", "set-workflow-retention", lasting.name, "default");
	snprintf(want, sizeof(want),
	         "tenant %s: ended workflows kept for prune's workflow_retention", lasting.name);
	cr_assert_str_eq(out, want);
	w = prune_wf_run(NULL, NULL);
	cr_assert_eq(w.workflows, 1, "lasting's, now past the CLI's 30 days");
	cr_assert_eq(rows_of("workflows", l), 0);
	cr_assert_eq(rows_of("workflows", p), 1);
	/* The flag sets the CLI's for one run. */
	w = prune_wf_run("--workflow-retention", "1h");
	cr_assert_eq(w.workflows, 1);
	cr_assert_eq(rows_of("workflows", p), 0);

	cr_assert_eq(tstack_cli(out, sizeof(out), "tenant", "set-workflow-retention", plain.name,
	                        "soon", NULL),
	             64);
	cr_assert(strstr(tstack_cli_stderr(), "workflow_retention") != NULL, "%s",
	          tstack_cli_stderr());
	cr_assert_eq(tstack_cli(out, sizeof(out), "tenant", "set-workflow-retention",
	                        "prune-wf-nobody", "1h", NULL),
	             65);
	free(b);
	free(l);
	free(p);
}

/*
 * Workflows are taken FOR UPDATE SKIP LOCKED: one that a command holds at
 * that moment (here a transaction holding its row) is passed over, not
 * waited for, and goes in the next run; the others go at once.
 */
Test(prune, a_workflow_held_by_a_command_is_skipped_not_waited_for)
{
	struct tstack_tenant t;
	PGconn *holder;
	char *held, *free_one;

	tstack_tenant_create(&t, "prune-wf-held");
	held = tstack_create(&t, "{\"type\":\"w\"}");
	free_one = tstack_create(&t, "{\"type\":\"w\"}");
	cancel(&t, held);
	cancel(&t, free_one);
	ended_and_delivered(held, "31 days");
	ended_and_delivered(free_one, "31 days");
	holder = tstack_db_connect();
	tstack_exec(holder, "BEGIN");
	tstack_exec(holder, "SELECT 1 FROM workflows WHERE id = $1 FOR UPDATE", held);

	struct prune_wf_report w = prune_wf_run(NULL, NULL);
	cr_assert_eq(w.workflows, 1, "the free one only");
	cr_assert_eq(w.held, 0, "a locked workflow is not read");
	cr_assert_eq(rows_of("workflows", free_one), 0);
	cr_assert_eq(rows_of("workflows", held), 1);
	cr_assert_eq(rows_of("outbox", held), 2);

	tstack_exec(holder, "ROLLBACK");
	PQfinish(holder);
	w = prune_wf_run(NULL, NULL);
	cr_assert_eq(w.workflows, 1, "the next run takes it");
	cr_assert_eq(rows_of("workflows", held), 0);
	free(held);
	free(free_one);
}

/*
 * The key that created a workflow may outlive it: a retry of the create
 * under it still gets the stored answer, byte for byte, while a read of
 * the pruned workflow answers 404. The audit does not count the key as
 * naming a missing workflow: it is older than the tenant's retention.
 */
Test(prune, a_key_outlives_its_pruned_workflow_and_still_replays)
{
	struct tstack_tenant t;
	struct http_response *first, *r;
	char key[128], path[160], out[4096], *id;

	tstack_tenant_create(&t, "prune-wf-key");
	cli_ok(out, "tenant", "set-workflow-retention", t.name, "1s");
	tstack_key(key, sizeof(key), "outlives");
	first = post(&t, key, BODY);
	id = tstack_expect_created(first, "ops", "{\"n\":1}");
	cancel(&t, id);
	ended_and_delivered(id, "2 seconds");
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET created_at = now() - interval '2 seconds'"
	            " WHERE tenant_id = $1",
	            t.id_text);

	struct prune_wf_report w = prune_wf_run(NULL, NULL);
	cr_assert_eq(w.workflows, 1);
	cr_assert_eq(rows_of("workflows", id), 0);
	snprintf(path, sizeof(path), "/v1/workflows/%s", id);
	r = tstack_get(&t, path);
	tstack_expect_status(r, 404);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/workflows/%s/events", id);
	r = tstack_get(&t, path);
	tstack_expect_status(r, 404);
	http_response_free(r);

	r = post(&t, key, BODY);
	tstack_expect_replay(r, first);
	http_response_free(r);
	cr_assert_eq(count_for(&t, "workflows"), 0, "the replay created nothing");

	cr_assert_eq(tstack_cli(out, sizeof(out), "audit", "--tenant", t.name, NULL), 0,
	             "audit: %s%s", out, tstack_cli_stderr());
	forget_keys(&t);
	free(id);
	http_response_free(first);
}

Test(prune, refuses_bad_flags_with_a_usage_error)
{
	char out[256];

	cr_assert_eq(tstack_cli(out, sizeof(out), "prune", "--outbox-retention", "soon", NULL), 64);
	cr_assert(strstr(tstack_cli_stderr(), "outbox_retention") != NULL, "%s",
	          tstack_cli_stderr());
	cr_assert_eq(tstack_cli(out, sizeof(out), "prune", "--prune-batch", "0", NULL), 64);
	cr_assert_eq(tstack_cli(out, sizeof(out), "prune", "--dead", NULL), 64);
}

/* --- Per-tenant TTL ---------------------------------------------------- */

/* Seconds between created_at and expires_at of the tenant's key. */
static long ttl_of(const struct tstack_tenant *t, const char *key)
{
	return tstack_count("SELECT extract(epoch FROM expires_at - created_at)::bigint"
	                    "  FROM idempotency_keys WHERE tenant_id = $1 AND key = $2",
	                    t->id_text, key);
}

Test(tenant_ttl, applies_to_new_keys_and_default_restores_the_server_ttl)
{
	struct tstack_tenant t, other;
	struct http_response *r;
	char out[512], want[512], k1[128], k2[128], k3[128];
	long server_ttl = tstack_conf_ms("idempotency_ttl", 24L * 3600 * 1000) / 1000;

	tstack_tenant_create(&t, "ttl");
	tstack_tenant_create(&other, "ttl-other");
	tstack_key(k1, sizeof(k1), "before");
	r = post(&t, k1, BODY);
	cr_assert_eq(r->status, 201);
	http_response_free(r);

	cli_ok(out, "tenant", "set-ttl", t.name, "90m");
	snprintf(want, sizeof(want), "tenant %s: idempotency keys kept for 90m (from new keys on)",
	         t.name);
	cr_assert_str_eq(out, want);
	tstack_key(k2, sizeof(k2), "during");
	r = post(&t, k2, BODY);
	cr_assert_eq(r->status, 201);
	http_response_free(r);
	r = post(&other, k2, BODY);
	cr_assert_eq(r->status, 201);
	http_response_free(r);
	cr_assert_eq(ttl_of(&t, k2), 90 * 60);
	cr_assert_eq(ttl_of(&other, k2), server_ttl, "another tenant keeps the server's TTL");
	cr_assert_eq(ttl_of(&t, k1), server_ttl, "a stored key keeps its expiry");

	cli_ok(out, "tenant", "set-ttl", t.name, "default");
	tstack_key(k3, sizeof(k3), "after");
	r = post(&t, k3, BODY);
	cr_assert_eq(r->status, 201);
	http_response_free(r);
	cr_assert_eq(ttl_of(&t, k3), server_ttl);
	cr_assert_eq(ttl_of(&t, k2), 90 * 60);
}

Test(tenant_ttl, rejects_bad_durations_and_unknown_tenants)
{
	struct tstack_tenant t;
	char out[256];

	tstack_tenant_create(&t, "ttl-bad");
	cr_assert_eq(tstack_cli(out, sizeof(out), "tenant", "set-ttl", t.name, "500ms", NULL), 64,
	             "shorter than a second");
	cr_assert_eq(tstack_cli(out, sizeof(out), "tenant", "set-ttl", t.name, "forever", NULL),
	             64);
	cr_assert(strstr(tstack_cli_stderr(), "\"forever\"") != NULL, "%s", tstack_cli_stderr());
	cr_assert_eq(
	    tstack_cli(out, sizeof(out), "tenant", "set-ttl", "no-such-tenant", "1h", NULL), 65);
	cr_assert_eq(tstack_count("SELECT count(*) FROM tenants WHERE name = $1"
	                          "   AND idempotency_ttl IS NULL",
	                          t.name),
	             1, "nothing was changed");
}

/* --- Debugging ---------------------------------------------------------- */

static struct json_object *member(struct json_object *o, const char *name)
{
	struct json_object *v = NULL;

	cr_assert(json_object_object_get_ex(o, name, &v), "no \"%s\" in %s", name,
	          json_object_to_json_string(o));
	return v;
}

static long num(struct json_object *o, const char *name)
{
	return (long)json_object_get_int64(member(o, name));
}

static const char *str(struct json_object *o, const char *name)
{
	return json_object_get_string(member(o, name));
}

/* debug idempotency-check --json for the tenant, parsed. */
static struct json_object *check_json(const struct tstack_tenant *t, const char *hours,
                                      const char *limit)
{
	static char out[64 * 1024];
	struct json_object *doc;

	cli_ok(out, "debug", "idempotency-check", "--tenant", t->name, "--hours", hours, "--limit",
	       limit, "--json");
	doc = json_tokener_parse(out);
	cr_assert_not_null(doc, "not JSON: %s", out);
	return doc;
}

static void expect_key(struct json_object *keys, size_t i, const char *key, long replays,
                       long conflicts, long in_flight)
{
	struct json_object *k = json_object_array_get_idx(keys, i);

	cr_assert_not_null(k, "no key at position %zu", i);
	cr_assert_str_eq(str(k, "key"), key, "position %zu", i);
	cr_assert_str_eq(str(k, "route"), "/v1/workflows");
	cr_assert_str_eq(str(k, "method"), "POST");
	tstack_expect_match(str(k, "first_seen"), "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$",
	                    "first_seen");
	cr_assert_eq(num(k, "replays"), replays, "%s replays", key);
	cr_assert_eq(num(k, "conflicts"), conflicts, "%s conflicts", key);
	cr_assert_eq(num(k, "in_flight"), in_flight, "%s in flight", key);
}

static void post_expect(const struct tstack_tenant *t, const char *key, const char *body,
                        int status)
{
	struct http_response *r = post(t, key, body);

	cr_assert_eq(r->status, status, "%s: %s", key, r->body);
	http_response_free(r);
}

static void post_conflict(const struct tstack_tenant *t, const char *key, const char *body,
                          const char *type)
{
	struct http_response *r = post(t, key, body);

	tstack_expect_problem(r, 409, type, "/v1/workflows");
	http_response_free(r);
}

Test(debug, idempotency_check_shows_the_replays_and_conflicts_a_client_caused)
{
	struct tstack_tenant t, other;
	struct json_object *doc, *summary, *keys;
	char a[128], b[128], c[128], d[128], e[128], out[4096];
	PGconn *holder = tstack_db_connect();

	tstack_tenant_create(&t, "debug");
	tstack_tenant_create(&other, "debug-other");
	tstack_key(a, sizeof(a), "A");
	tstack_key(b, sizeof(b), "B");
	tstack_key(c, sizeof(c), "C");
	tstack_key(d, sizeof(d), "D");
	tstack_key(e, sizeof(e), "E");

	/* A: created, then replayed 3 times (on whichever workers). */
	for (int i = 0; i < 4; i++)
		post_expect(&t, a, BODY, 201);
	/* B: created, then reused twice for other requests. */
	post_expect(&t, b, BODY, 201);
	post_conflict(&t, b, "{\"type\":\"ops\",\"input\":{\"n\":2}}",
	              "/problems/idempotency-key-reused");
	post_conflict(&t, b, "{\"type\":\"other\"}", "/problems/idempotency-key-reused");
	/* C: created once. */
	post_expect(&t, c, BODY, 201);
	/* E: sent while another request holds it (409 in flight), then
	 * created once the holder gives up. */
	tstack_key_hold(holder, &t, e);
	post_conflict(&t, e, BODY, "/problems/idempotency-key-in-flight");
	tstack_exec(holder, "ROLLBACK");
	post_expect(&t, e, BODY, 201);
	/* D: created two days ago, outside a 24 h window; replayed now. */
	post_expect(&t, d, BODY, 201);
	post_expect(&t, d, BODY, 201);
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET created_at = created_at - interval '2 days'"
	            " WHERE tenant_id = $1 AND key = $2",
	            t.id_text, d);
	/* The same key names in another tenant count there only. */
	for (int i = 0; i < 6; i++)
		post_expect(&other, a, BODY, 201);

	/* Workers flush at most once a second, and when idle after one. */
	double deadline = tstack_now() + 3;
	while (tstack_count("SELECT coalesce(sum(replays + conflicts + in_flight), 0)"
	                    "  FROM idempotency_key_stats WHERE tenant_id = $1",
	                    t.id_text) < 3 + 2 + 1 + 1 &&
	       tstack_now() < deadline)
		tstack_sleep_ms(100);

	doc = check_json(&t, "24", "100");
	cr_assert_str_eq(str(doc, "tenant"), t.name);
	keys = member(doc, "keys");
	cr_assert_eq(json_object_array_length(keys), 4, "%s", json_object_to_json_string(doc));
	/* Most replayed first, then most conflicts, then in flight. */
	expect_key(keys, 0, a, 3, 0, 0);
	expect_key(keys, 1, b, 0, 2, 0);
	expect_key(keys, 2, e, 0, 0, 1);
	expect_key(keys, 3, c, 0, 0, 0);
	cr_assert(json_object_is_type(member(json_object_array_get_idx(keys, 3), "last_seen"),
	                              json_type_null),
	          "a key never replayed has no last_seen");
	summary = member(doc, "summary");
	cr_assert_eq(num(summary, "keys"), 4);
	cr_assert_eq(num(summary, "listed"), 4);
	cr_assert_eq(num(summary, "replays"), 3);
	cr_assert_eq(num(summary, "conflicts"), 2);
	cr_assert_eq(num(summary, "in_flight"), 1);
	cr_assert_str_eq(json_object_to_json_string(member(summary, "replay_ratio")), "0.750");
	json_object_put(doc);

	/* A wider window takes in D; --limit shortens the list, not the
	 * summary. */
	doc = check_json(&t, "72", "1");
	keys = member(doc, "keys");
	cr_assert_eq(json_object_array_length(keys), 1);
	expect_key(keys, 0, a, 3, 0, 0);
	summary = member(doc, "summary");
	cr_assert_eq(num(summary, "keys"), 5);
	cr_assert_eq(num(summary, "listed"), 1);
	cr_assert_eq(num(summary, "replays"), 4);
	json_object_put(doc);

	/* The text form: a header, one line per key, the summary. */
	cli_ok(out, "debug", "idempotency-check", "--tenant", t.name, "--limit", "2");
	char *line2 = strchr(out, '\n');
	cr_assert_not_null(line2, "%s", out);
	*line2++ = '\0';
	cr_assert_str_eq(out, "key\troute\tfirst_seen\treplays\tconflicts\tin_flight");
	char prefix[300];
	snprintf(prefix, sizeof(prefix), "%s\tPOST /v1/workflows\t", a);
	cr_assert(strncmp(line2, prefix, strlen(prefix)) == 0, "%s", line2);
	tstack_expect_match(line2, "\t3\t0\t0\n", "A's counts");
	tstack_expect_match(line2,
	                    "\nsummary: keys=4 listed=2 replays=3 conflicts=2 in_flight=1 "
	                    "replay_ratio=0\\.750 since=[0-9T:Z-]+$",
	                    "summary");

	cr_assert_eq(tstack_cli(out, sizeof(out), "debug", "idempotency-check", "--tenant",
	                        "no-such-tenant", NULL),
	             65);
	cr_assert_eq(tstack_cli(out, sizeof(out), "debug", "idempotency-check", NULL), 64);
	cr_assert_eq(tstack_cli(out, sizeof(out), "debug", "idempotency-check", "--tenant", t.name,
	                        "--hours", "-1", NULL),
	             64);
	PQfinish(holder);
}

/* --- Readiness ---------------------------------------------------------- */

/* Bursts twice as wide as the pool (3 workers), until the request log
 * shows that every worker answered. */
#define BURST      6
#define MAX_BURSTS 50

static struct http_response *send_readyz(int i, void *arg)
{
	(void)i;
	(void)arg;
	return http_request("GET", "/readyz", NULL, NULL, 0);
}

static void expect_ready(const struct http_response *r, int version)
{
	char want[96];

	snprintf(want, sizeof(want), "{\"status\":\"ready\",\"schema_version\":%d}", version);
	cr_assert_eq(r->status, 200, "got %d: %s", r->status, r->body);
	tstack_expect_header(r, "Content-Type", "application/json");
	cr_assert_str_eq(r->body, want);
}

/* 503 problem+json with Retry-After and exactly this detail; parsed with
 * json-c, since the database may be what is down. */
static void expect_not_ready(const struct http_response *r, const char *detail)
{
	struct json_object *v;

	cr_assert_eq(r->status, 503, "got %d: %s", r->status, r->body);
	tstack_expect_header(r, "Content-Type", "application/problem+json");
	tstack_expect_header(r, "Retry-After", "1");
	v = json_tokener_parse(r->body);
	cr_assert_not_null(v, "not JSON: %s", r->body);
	cr_assert_str_eq(str(v, "type"), "https://idemflow.example/problems/unavailable");
	cr_assert_eq(num(v, "status"), 503);
	cr_assert_str_eq(str(v, "detail"), detail);
	cr_assert_str_eq(str(v, "instance"), "/readyz");
	json_object_put(v);
}

static void check_ready(const struct http_response *r, int i, void *arg)
{
	(void)i;
	expect_ready(r, *(const int *)arg);
}

static void check_not_ready(const struct http_response *r, int i, void *arg)
{
	(void)i;
	expect_not_ready(r, arg);
}

static void expect_ready_everywhere(int version)
{
	tstack_every_worker(tstack_supervisor_pid(), tstack_env("IDEMFLOW_FCGI_LOG"), BURST,
	                    MAX_BURSTS, send_readyz, check_ready, &version);
}

/* Poll /readyz until it answers 200 (workers reconnect at their own pace),
 * then expect it from every worker. */
static void expect_ready_again(int version)
{
	double deadline = tstack_now() + 10;
	int status = 0;

	while (tstack_now() < deadline) {
		struct http_response *r = get("/readyz");
		status = r->status;
		http_response_free(r);
		if (status == 200)
			break;
		tstack_sleep_ms(150);
	}
	cr_assert_eq(status, 200, "still %d", status);
	tstack_sleep_ms(150); /* past every worker's reconnect pacing */
	expect_ready_everywhere(version);
}

Test(readyz, answers_200_without_a_token_and_only_to_get)
{
	struct http_response *r;

	expect_ready_again(migrate_latest());
	r = http_request("POST", "/readyz", NULL, "", 0);
	cr_assert_not_null(r);
	cr_assert_eq(r->status, 405);
	tstack_expect_header(r, "Allow", "GET");
	http_response_free(r);
}

Test(readyz, turns_503_while_postgresql_is_down_and_200_when_it_returns)
{
	struct http_response *r;

	expect_ready_again(migrate_latest());

	tstack_pg_ctl("stop");
	tstack_every_worker(tstack_supervisor_pid(), tstack_env("IDEMFLOW_FCGI_LOG"), BURST,
	                    MAX_BURSTS, send_readyz, check_not_ready, "database unreachable");
	/* /healthz is liveness: the processes are fine. */
	r = get("/healthz");
	cr_assert_eq(r->status, 204);
	http_response_free(r);

	/* Back: every worker reconnects by itself and is ready again. */
	tstack_pg_ctl("start");
	expect_ready_again(migrate_latest());
}

/* The newest migration's row and a column it added, taken away by the
 * tests below and put back here, even when a test fails half-way. */
static char latest_name[256];

static void restore_latest_migration(void)
{
	char v[16];
	PGconn *c;

	if (latest_name[0] == '\0')
		return;
	snprintf(v, sizeof(v), "%d", migrate_latest());
	c = tstack_db_connect();
	tstack_exec(c,
	            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)"
	            " ON CONFLICT (version) DO NOTHING",
	            v, latest_name);
	tstack_exec(c, "DELETE FROM schema_migrations WHERE version > $1", v);
	if (tstack_count("SELECT count(*) FROM information_schema.columns"
	                 " WHERE table_name = 'tenants' AND column_name = 'ttl_hidden'") == 1)
		tstack_exec(c, "ALTER TABLE tenants RENAME COLUMN ttl_hidden TO idempotency_ttl");
	PQfinish(c);
}

/* The version of the migration before the newest one: what the schema is
 * at without the newest (numbers need not be contiguous on a branch). */
static int previous_version(void)
{
	cr_assert_geq(migrations_count, 2);
	return migrations[migrations_count - 2].version;
}

/* Remember the newest migration's name, for restore_latest_migration(). */
static void note_latest_migration(void)
{
	char v[16];

	snprintf(v, sizeof(v), "%d", migrate_latest());
	char *name = tstack_text("SELECT name FROM schema_migrations WHERE version = $1", v);
	cr_assert_not_null(name);
	snprintf(latest_name, sizeof(latest_name), "%s", name);
	free(name);
}

Test(readyz, turns_503_while_the_schema_is_behind_the_build, .fini = restore_latest_migration)
{
	char v[16], newer[16], detail[128];
	PGconn *c = tstack_db_connect();
	int latest = migrate_latest();

	snprintf(v, sizeof(v), "%d", latest);
	note_latest_migration();

	/* As if the newest migration had not been applied yet. */
	tstack_exec(c, "DELETE FROM schema_migrations WHERE version = $1", v);
	snprintf(detail, sizeof(detail),
	         "schema at version %d, expected %d: run \"idemflow migrate\"", previous_version(),
	         latest);
	tstack_every_worker(tstack_supervisor_pid(), tstack_env("IDEMFLOW_FCGI_LOG"), BURST,
	                    MAX_BURSTS, send_readyz, check_not_ready, detail);
	restore_latest_migration();
	expect_ready_everywhere(latest);

	/* A schema ahead of the build (migrated before the workers were
	 * replaced, during an upgrade) keeps the old workers in service. */
	snprintf(newer, sizeof(newer), "%d", latest + 1);
	tstack_exec(c, "INSERT INTO schema_migrations (version, name) VALUES ($1, 'next.sql')",
	            newer);
	expect_ready_everywhere(latest + 1);
	tstack_exec(c, "DELETE FROM schema_migrations WHERE version = $1", newer);
	expect_ready_everywhere(latest);
	PQfinish(c);
}

Test(readyz, names_the_schema_version_when_the_build_is_newer_than_its_schema,
     .fini = restore_latest_migration)
{
	char v[16], detail[128];
	PGconn *c = tstack_db_connect();
	int latest = migrate_latest();

	snprintf(v, sizeof(v), "%d", latest);
	note_latest_migration();
	/* The newest migration not applied, as far as this build can tell:
	 * not recorded, and a column it adds missing, so the workers cannot
	 * prepare their statements once they reconnect. */
	tstack_exec(c, "DELETE FROM schema_migrations WHERE version = $1", v);
	tstack_exec(c, "ALTER TABLE tenants RENAME COLUMN idempotency_ttl TO ttl_hidden");
	tstack_exec(c, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
	               " WHERE application_name LIKE '%-worker-%'");
	snprintf(detail, sizeof(detail),
	         "schema at version %d, expected %d: run \"idemflow migrate\"", previous_version(),
	         latest);
	tstack_every_worker(tstack_supervisor_pid(), tstack_env("IDEMFLOW_FCGI_LOG"), BURST,
	                    MAX_BURSTS, send_readyz, check_not_ready, detail);
	restore_latest_migration();
	expect_ready_again(latest);
	PQfinish(c);
}

/* One test at a time: prune works on every tenant's rows, and one test
 * stops PostgreSQL under all of them. */
TSTACK_SEQUENTIAL
