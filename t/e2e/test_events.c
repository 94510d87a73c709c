/*
 * test_events.c - the event feed, one event's deliveries, an endpoint's
 * attempt ledger and undelivered events, recover and resend, and the
 * endpoints' lines of /metrics, through nginx and the worker pool.
 *
 * Endpoints, and the attempts and states a dispatcher would leave, are
 * rows the tests insert and update by SQL; the deliveries are the ones
 * the outbox_deliveries trigger writes with each event
 * (sql/020_endpoints.sql). Sequential: the feed's scan and /metrics see
 * the whole outbox.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"

/* What the helpers below return lives until the test's process ends (one
 * process per test): every string and answer they make is held here, so
 * that an assertion can take one inline and none is lost to
 * LeakSanitizer. A test may still free one early. */
static void **kept;
static size_t nkept, capkept;

static void *keep(void *p)
{
	if (nkept == capkept) {
		capkept = capkept > 0 ? 2 * capkept : 256;
		kept = realloc(kept, capkept * sizeof(*kept));
		cr_assert_not_null(kept);
	}
	kept[nkept++] = p;
	return p;
}

#define KEEP_JSON(...)      ((char *)keep(tstack_json(__VA_ARGS__)))
#define KEEP_JSON_TYPE(...) ((char *)keep(tstack_json_type(__VA_ARGS__)))
#define KEEP_TEXT(...)      ((char *)keep(tstack_text(__VA_ARGS__)))
#define KEEP_CREATE(...)    ((char *)keep(tstack_create(__VA_ARGS__)))
#define KEEP_GET(...)       ((struct http_response *)keep(tstack_get(__VA_ARGS__)))
#define KEEP_POST(...)      ((struct http_response *)keep(tstack_post(__VA_ARGS__)))
#include "tsql.h"
#include "tstack.h"

TSTACK_SEQUENTIAL

TestSuite(feed, .timeout = 120);
TestSuite(ledger, .timeout = 60);
TestSuite(recover, .timeout = 60);
TestSuite(resend, .timeout = 60);
TestSuite(events_isolation, .timeout = 60);
TestSuite(events_metrics, .timeout = 60);

#define SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

/* An endpoint of t, filter_types filter (SQL text: NULL or an array);
 * its id (malloc'ed). */
static char *make_endpoint(const struct tstack_tenant *t, const char *filter)
{
	char id[37], sql[300];

	tstack_uuid(id);
	snprintf(sql, sizeof(sql),
	         "INSERT INTO endpoints (tenant_id, id, url, secret, filter_types)"
	         " VALUES ($1, $2, 'http://127.0.0.1:9/hook', '" SECRET "', %s)",
	         filter);
	tstack_exec(tstack_db(), sql, t->id_text, id);
	return keep(strdup(id));
}

/* A workflow of t; the id of its workflow.created event (malloc'ed). */
static char *make_event(const struct tstack_tenant *t, const char *type)
{
	char body[128], *id, *ev;

	snprintf(body, sizeof(body), "{\"type\":\"%s\",\"input\":{}}", type);
	id = KEEP_CREATE(t, body);
	ev = malloc(strlen(id) + 3);
	sprintf(ev, "%s.1", id);
	free(id);
	return keep(ev);
}

/* The path of the last request (without its query): a problem's
 * instance. */
static char last_path[512];

static const char *path_of(const char *target)
{
	snprintf(last_path, sizeof(last_path), "%.*s", (int)strcspn(target, "?"), target);
	return target;
}

/* r is the problem slug with status, about the last request's path. */
static void problem(const struct http_response *r, int status, const char *slug)
{
	char type[96];

	snprintf(type, sizeof(type), "/problems/%s", slug);
	tstack_expect_problem(r, status, type, last_path);
}

/* GET the path fmt makes, as t. */
__attribute__((format(printf, 2, 3))) static struct http_response *
get(const struct tstack_tenant *t, const char *fmt, ...)
{
	char path[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(path, sizeof(path), fmt, ap);
	va_end(ap);
	return KEEP_GET(t, path_of(path));
}

/* POST body under key (NULL: none) to the path fmt makes, as t. */
__attribute__((format(printf, 4, 5))) static struct http_response *
post(const struct tstack_tenant *t, const char *key, const char *body, const char *fmt, ...)
{
	char path[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(path, sizeof(path), fmt, ap);
	va_end(ap);
	return KEEP_POST(t, path_of(path), key, body);
}

/* The number of items of the page's array name. */
static long items(const char *body, const char *name)
{
	char path[64];

	snprintf(path, sizeof(path), "{%s}", name);
	return tstack_count("SELECT jsonb_array_length($1::jsonb #> $2::text[])", body, path);
}

/* One delivery's columns as text, to compare before and after. */
static char *delivery_row(const char *endpoint, const char *event)
{
	return KEEP_TEXT("SELECT concat_ws(',', d.state, d.attempts, d.trigger, d.next_attempt_at,"
	                 "                 d.updated_at)"
	                 "  FROM deliveries d JOIN outbox o ON o.id = d.outbox_id"
	                 " WHERE d.endpoint_id = $1 AND o.event_id = $2",
	                 endpoint, event);
}

static void set_delivery(const char *endpoint, const char *event, const char *state,
                         const char *attempts)
{
	tstack_exec(tstack_db(),
	            "UPDATE deliveries d SET state = $3, attempts = $4::integer,"
	            "       next_attempt_at = now() + interval '1 day', trigger = 'scheduled',"
	            "       last_error = CASE WHEN $3 = 'delivered' THEN NULL ELSE 'HTTP 500' END"
	            "  FROM outbox o"
	            " WHERE o.id = d.outbox_id AND d.endpoint_id = $1 AND o.event_id = $2",
	            endpoint, event, state, attempts);
}

/* --- The feed -------------------------------------------------------- */

/* The tenant's events in the order written, limit per page, and only
 * its own. */
Test(feed, pages_the_tenants_events_in_order)
{
	struct tstack_tenant a, b;
	struct http_response *r;
	char *e1, *e2, *e3, *other, *cursor, path[128];

	tstack_tenant_create(&a, "feed-a");
	tstack_tenant_create(&b, "feed-b");
	e1 = make_event(&a, "f.one");
	other = make_event(&b, "f.other");
	e2 = make_event(&a, "f.two");
	e3 = make_event(&a, "f.three");

	/* From just before its first event: the rows of other tests before
	 * it are no part of this test. */
	char *start = KEEP_TEXT("SELECT (id - 1)::text FROM outbox WHERE event_id = $1", e1);
	snprintf(path, sizeof(path), "/v1/events?limit=2&after=%s", start);
	r = KEEP_GET(&a, path_of(path));
	tstack_expect_status(r, 200);
	cr_assert_eq(items(r->body, "events"), 2, "%s", r->body);
	cr_assert_str_eq(KEEP_JSON(r->body, "{events,0,id}"), e1);
	cr_assert_str_eq(KEEP_JSON(r->body, "{events,1,id}"), e2);
	cr_assert_str_eq(KEEP_JSON(r->body, "{events,1,type}"), "workflow.created");
	cursor = KEEP_JSON(r->body, "{next_cursor}");
	cr_assert_str_eq(cursor, KEEP_TEXT("SELECT id::text FROM outbox WHERE event_id = $1", e2));
	http_response_free(r);

	snprintf(path, sizeof(path), "/v1/events?limit=2&after=%s", cursor);
	r = KEEP_GET(&a, path_of(path));
	tstack_expect_status(r, 200);
	cr_assert_eq(items(r->body, "events"), 1, "%s", r->body);
	cr_assert_str_eq(KEEP_JSON(r->body, "{events,0,id}"), e3);
	cr_assert_str_eq(KEEP_JSON_TYPE(r->body, "{next_cursor}"), "null");
	cr_assert_null(strstr(r->body, other), "another tenant's event: %s", r->body);
	http_response_free(r);

	r = KEEP_GET(&a, path_of("/v1/events?after=-1"));
	problem(r, 422, "invalid-request");
	http_response_free(r);
	r = KEEP_GET(&a, path_of("/v1/events?after=x"));
	problem(r, 422, "invalid-request");
	http_response_free(r);
}

/*
 * A page reads at most 10000 outbox rows: behind another tenant's 10000
 * events the page ends with the tenant's event before them and a cursor
 * past them, not with next_cursor null, and the next page finds the
 * tenant's event after them.
 */
Test(feed, a_page_behind_other_tenants_rows_has_a_cursor)
{
	struct tstack_tenant a, b;
	struct http_response *r;
	char *e1, *e2, *wf, *after, *mark, path[160];

	tstack_tenant_create(&a, "scan-a");
	tstack_tenant_create(&b, "scan-b");
	e1 = make_event(&a, "s.before");
	wf = make_event(&b, "s.bulk");
	wf[36] = '\0';
	tstack_exec(tstack_db(),
	            "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	            " SELECT $2 || '.' || g, $1::bigint, $2::uuid, g, 'bulk',"
	            "        '{\"n\":' || g || '}'"
	            "   FROM generate_series(2, 10001) g",
	            b.id_text, wf);
	e2 = make_event(&a, "s.after");
	after = KEEP_TEXT("SELECT (id - 1)::text FROM outbox WHERE event_id = $1", e1);
	/* The 10000th row from e1 on: the last one the first page reads. */
	mark = KEEP_TEXT("SELECT max(id)::text FROM (SELECT id FROM outbox WHERE id > $1::bigint"
	                 " ORDER BY id LIMIT 10000) s",
	                 after);

	snprintf(path, sizeof(path), "/v1/events?after=%s", after);
	r = KEEP_GET(&a, path_of(path));
	tstack_expect_status(r, 200);
	cr_assert_eq(items(r->body, "events"), 1, "%s", r->body);
	cr_assert_str_eq(KEEP_JSON(r->body, "{events,0,id}"), e1);
	cr_assert_str_eq(KEEP_JSON(r->body, "{next_cursor}"), mark, "%s", r->body);
	http_response_free(r);

	snprintf(path, sizeof(path), "/v1/events?after=%s", mark);
	r = KEEP_GET(&a, path_of(path));
	tstack_expect_status(r, 200);
	cr_assert_eq(items(r->body, "events"), 1, "%s", r->body);
	cr_assert_str_eq(KEEP_JSON(r->body, "{events,0,id}"), e2);
	cr_assert_str_eq(KEEP_JSON_TYPE(r->body, "{next_cursor}"), "null");
	http_response_free(r);
}

/*
 * The 10000th row a page reads is the tenant's own event: it is shown,
 * once, as an event, and the next page starts after it (the scan's own
 * last row has the same id and must come after the event's).
 */
Test(feed, the_scans_last_row_is_the_tenants_event)
{
	struct tstack_tenant a, b;
	struct http_response *r;
	char *wf, *e, *after, *id, path[160];

	tstack_tenant_create(&a, "tie-a");
	tstack_tenant_create(&b, "tie-b");
	wf = make_event(&b, "t.bulk");
	after = KEEP_TEXT("SELECT (id - 1)::text FROM outbox WHERE event_id = $1", wf);
	wf[36] = '\0';
	tstack_exec(tstack_db(),
	            "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	            " SELECT $2 || '.' || g, $1::bigint, $2::uuid, g, 'bulk', '{}'"
	            "   FROM generate_series(2, 9999) g",
	            b.id_text, wf);
	e = make_event(&a, "t.tenth-thousand");
	id = KEEP_TEXT("SELECT id::text FROM outbox WHERE event_id = $1", e);
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE id > $1::bigint"
	                          " AND id <= $2::bigint",
	                          after, id),
	             10000);

	snprintf(path, sizeof(path), "/v1/events?after=%s", after);
	r = KEEP_GET(&a, path_of(path));
	tstack_expect_status(r, 200);
	cr_assert_eq(items(r->body, "events"), 1, "%s", r->body);
	cr_assert_str_eq(KEEP_JSON(r->body, "{events,0,id}"), e);
	cr_assert_str_eq(KEEP_JSON(r->body, "{next_cursor}"), id, "%s", r->body);
	http_response_free(r);
}

/* --- Deliveries and the ledger ----------------------------------------- */

/* An event's deliveries: one per matching endpoint, none for one whose
 * filter does not pass it; exact bytes of an item. */
Test(ledger, an_events_deliveries)
{
	struct tstack_tenant a;
	struct http_response *r;
	char *all, *glob, *none, *ev, *want;

	tstack_tenant_create(&a, "dl");
	all = make_endpoint(&a, "NULL");
	glob = make_endpoint(&a, "ARRAY['workflow.*']");
	none = make_endpoint(&a, "ARRAY['billing.paid']");
	ev = make_event(&a, "dl.x");
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM deliveries WHERE tenant_id = $1", a.id_text), 2);

	r = get(&a, "/v1/events/%s/deliveries", ev);
	tstack_expect_status(r, 200);
	want = KEEP_TEXT(
	    "SELECT '{\"deliveries\":[' || string_agg("
	    "  '{\"endpoint_id\":\"' || d.endpoint_id || '\",\"event_id\":\"' || $2 ||"
	    "  '\",\"state\":\"pending\",\"attempts\":0,\"next_attempt_at\":\"' ||"
	    "  to_char(d.next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') ||"
	    "  '\",\"last_error\":null,\"updated_at\":\"' ||"
	    "  to_char(d.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') || '\"}',"
	    "  ',' ORDER BY d.endpoint_id) || '],\"next_cursor\":null}'"
	    "  FROM deliveries d WHERE d.tenant_id = $1",
	    a.id_text, ev);
	cr_assert_str_eq(r->body, want);
	cr_assert_null(strstr(r->body, none));
	cr_assert_not_null(strstr(r->body, all));
	cr_assert_not_null(strstr(r->body, glob));
	http_response_free(r);

	/* One per page, in endpoint id order. */
	r = get(&a, "/v1/events/%s/deliveries?limit=1", ev);
	tstack_expect_status(r, 200);
	cr_assert_eq(items(r->body, "deliveries"), 1);
	char *first = KEEP_JSON(r->body, "{deliveries,0,endpoint_id}");
	cr_assert_str_eq(KEEP_JSON(r->body, "{next_cursor}"), first);
	http_response_free(r);
	char path[300];
	snprintf(path, sizeof(path), "/v1/events/%s/deliveries?limit=1&after=%s", ev, first);
	r = KEEP_GET(&a, path_of(path));
	tstack_expect_status(r, 200);
	cr_assert_eq(items(r->body, "deliveries"), 1);
	cr_assert_str_neq(KEEP_JSON(r->body, "{deliveries,0,endpoint_id}"), first);
	cr_assert_str_eq(KEEP_JSON_TYPE(r->body, "{next_cursor}"), "null");
	http_response_free(r);

	r = get(&a, "/v1/events/%s/deliveries", "01890000-0000-7000-8000-000000000000.1");
	problem(r, 404, "not-found");
	http_response_free(r);
	r = get(&a, "/v1/events/%s/deliveries", "nope");
	problem(r, 404, "not-found");
	http_response_free(r);
}

/* The attempt ledger: newest first, filtered by outcome or HTTP status,
 * keyset pages. */
Test(ledger, an_endpoints_attempts)
{
	struct tstack_tenant a;
	struct http_response *r;
	char *ep, *ev, *ids, path[300];

	tstack_tenant_create(&a, "att");
	ep = make_endpoint(&a, "NULL");
	ev = make_event(&a, "att.x");
	ids = KEEP_TEXT(
	    "WITH i AS (INSERT INTO delivery_attempts (tenant_id, endpoint_id, workflow_id, seq,"
	    "             event_id, trigger, started_at, duration_ms, status, outcome, response)"
	    " SELECT $1::bigint, $2::uuid, split_part($3, '.', 1)::uuid, 1, $3, t, now(), 12.5, s, o, b"
	    "   FROM (VALUES (1, 'scheduled', 500, 'http', 'oops'),"
	    "                (2, 'scheduled', 0, 'timeout', ''),"
	    "                (3, 'manual', 200, 'succeeded', 'ok')) v (n, t, s, o, b)"
	    "  ORDER BY n RETURNING id)"
	    " SELECT string_agg(id::text, ',' ORDER BY id) FROM i",
	    a.id_text, ep, ev);
	long id1, id2, id3;
	cr_assert_eq(sscanf(ids, "%ld,%ld,%ld", &id1, &id2, &id3), 3);

	r = get(&a, "/v1/endpoints/%s/attempts", ep);
	tstack_expect_status(r, 200);
	snprintf(path, sizeof(path),
	         "{\"attempts\":[{\"id\":%ld,\"event_id\":\"%s\",\"trigger\":\"manual\",", id3, ev);
	cr_assert(strncmp(r->body, path, strlen(path)) == 0, "%s", r->body);
	cr_assert_eq(items(r->body, "attempts"), 3);
	cr_assert_str_eq(KEEP_JSON(r->body, "{attempts,2,outcome}"), "http");
	cr_assert_str_eq(KEEP_JSON(r->body, "{attempts,2,response}"), "oops");
	cr_assert_str_eq(KEEP_JSON(r->body, "{attempts,2,status}"), "500");
	cr_assert_str_eq(KEEP_JSON(r->body, "{attempts,2,duration_ms}"), "12.5");
	http_response_free(r);

	r = get(&a, "/v1/endpoints/%s/attempts?status=failed", ep);
	tstack_expect_status(r, 200);
	cr_assert_eq(items(r->body, "attempts"), 2, "%s", r->body);
	cr_assert_eq(atol(KEEP_JSON(r->body, "{attempts,0,id}")), id2);
	http_response_free(r);
	r = get(&a, "/v1/endpoints/%s/attempts?status=succeeded", ep);
	cr_assert_eq(items(r->body, "attempts"), 1, "%s", r->body);
	cr_assert_eq(atol(KEEP_JSON(r->body, "{attempts,0,id}")), id3);
	http_response_free(r);
	r = get(&a, "/v1/endpoints/%s/attempts?status=500", ep);
	cr_assert_eq(items(r->body, "attempts"), 1, "%s", r->body);
	cr_assert_eq(atol(KEEP_JSON(r->body, "{attempts,0,id}")), id1);
	http_response_free(r);

	r = get(&a, "/v1/endpoints/%s/attempts?limit=2", ep);
	cr_assert_eq(items(r->body, "attempts"), 2);
	cr_assert_eq(atol(KEEP_JSON(r->body, "{next_cursor}")), id2);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/endpoints/%s/attempts?limit=2&after=%ld", ep, id2);
	r = KEEP_GET(&a, path_of(path));
	cr_assert_eq(items(r->body, "attempts"), 1);
	cr_assert_eq(atol(KEEP_JSON(r->body, "{attempts,0,id}")), id1);
	cr_assert_str_eq(KEEP_JSON_TYPE(r->body, "{next_cursor}"), "null");
	http_response_free(r);

	const char *bad[] = { "status=bogus", "status=99", "status=5000", "status=20x", "after=z" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		r = get(&a, "/v1/endpoints/%s/attempts?%s", ep, bad[i]);
		problem(r, 422, "invalid-request");
		http_response_free(r);
	}
	r = get(&a, "/v1/endpoints/%s/attempts", "01890000-0000-7000-8000-000000000000");
	problem(r, 404, "not-found");
	http_response_free(r);
	/* An endpoint without attempts: an empty page. */
	r = get(&a, "/v1/endpoints/%s/attempts", make_endpoint(&a, "NULL"));
	tstack_expect_status(r, 200);
	cr_assert_str_eq(r->body, "{\"attempts\":[],\"next_cursor\":null}");
	http_response_free(r);
}

/* Undelivered: pending, dead and skipped, never delivered; one state. */
Test(ledger, an_endpoints_undelivered)
{
	struct tstack_tenant a;
	struct http_response *r;
	char *ep, *ev[4], path[300];
	const char *states[4] = { "delivered", "dead", "skipped", "pending" };

	tstack_tenant_create(&a, "und");
	ep = make_endpoint(&a, "NULL");
	for (int i = 0; i < 4; i++) {
		ev[i] = make_event(&a, "und.x");
		set_delivery(ep, ev[i], states[i], "3");
	}
	r = get(&a, "/v1/endpoints/%s/undelivered", ep);
	tstack_expect_status(r, 200);
	cr_assert_eq(items(r->body, "deliveries"), 3, "%s", r->body);
	cr_assert_null(strstr(r->body, ev[0]), "a delivered one: %s", r->body);
	cr_assert_str_eq(KEEP_JSON(r->body, "{deliveries,0,last_error}"), "HTTP 500");
	http_response_free(r);

	r = get(&a, "/v1/endpoints/%s/undelivered?state=dead", ep);
	cr_assert_eq(items(r->body, "deliveries"), 1, "%s", r->body);
	cr_assert_str_eq(KEEP_JSON(r->body, "{deliveries,0,event_id}"), ev[1]);
	cr_assert_str_eq(KEEP_JSON(r->body, "{deliveries,0,state}"), "dead");
	cr_assert_str_eq(KEEP_JSON(r->body, "{deliveries,0,attempts}"), "3");
	http_response_free(r);

	/* Pages in stream order, the cursor an event id. */
	r = get(&a, "/v1/endpoints/%s/undelivered?limit=1", ep);
	char *first = KEEP_JSON(r->body, "{deliveries,0,event_id}");
	cr_assert_str_eq(KEEP_JSON(r->body, "{next_cursor}"), first);
	http_response_free(r);
	int seen = 1;
	char *cursor = first;
	while (cursor != NULL) {
		snprintf(path, sizeof(path), "/v1/endpoints/%s/undelivered?limit=1&after=%s", ep,
		         cursor);
		r = KEEP_GET(&a, path_of(path));
		tstack_expect_status(r, 200);
		cr_assert_gt(strcmp(KEEP_JSON(r->body, "{deliveries,0,event_id}"), cursor), 0);
		seen++;
		cursor = strcmp(KEEP_JSON_TYPE(r->body, "{next_cursor}"), "null") == 0
		             ? NULL
		             : KEEP_JSON(r->body, "{next_cursor}");
		http_response_free(r);
	}
	cr_assert_eq(seen, 3);

	r = get(&a, "/v1/endpoints/%s/undelivered?state=delivered", ep);
	problem(r, 422, "invalid-request");
	http_response_free(r);
	r = get(&a, "/v1/endpoints/%s/undelivered?after=x.1", ep);
	problem(r, 422, "invalid-request");
	http_response_free(r);
	r = get(&a, "/v1/endpoints/%s/undelivered", "not-a-uuid");
	problem(r, 404, "not-found");
	http_response_free(r);
}

/* --- Recover ------------------------------------------------------------ */

/*
 * A recover sets the dead and skipped deliveries pending, attempts 0,
 * trigger recover, due now; its retry under the same key replays the
 * answer and changes no row, even after the dispatcher delivered them
 * again: each event is sent once more, not twice.
 */
Test(recover, sends_once_more_and_its_retry_replays)
{
	struct tstack_tenant a;
	struct http_response *r, *again;
	char *ep, *ev[4], *before[4], key[96];
	const char *states[4] = { "delivered", "dead", "skipped", "dead" };
	static const char body[] = "{\"since\":\"2000-01-01T00:00:00Z\"}";

	tstack_tenant_create(&a, "rec");
	ep = make_endpoint(&a, "NULL");
	for (int i = 0; i < 4; i++) {
		ev[i] = make_event(&a, "rec.x");
		set_delivery(ep, ev[i], states[i], "8");
	}
	tstack_key(key, sizeof(key), "recover");
	r = post(&a, key, body, "/v1/endpoints/%s/recover", ep);
	tstack_expect_status(r, 200);
	cr_assert_str_eq(r->body, "{\"recovered\":3}");
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          " AND state = 'pending' AND attempts = 0 AND trigger = 'recover'"
	                          " AND next_attempt_at <= now()",
	                          ep),
	             3);
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          " AND state = 'delivered' AND attempts = 8",
	                          ep),
	             1);

	/* The dispatcher sends each once more: one attempt each. */
	tstack_exec(tstack_db(),
	            "INSERT INTO delivery_attempts (tenant_id, endpoint_id, workflow_id, seq,"
	            "       event_id, trigger, started_at, duration_ms, status, outcome)"
	            " SELECT d.tenant_id, d.endpoint_id, d.workflow_id, d.seq,"
	            "        d.workflow_id || '.' || d.seq, d.trigger, now(), 1, 200, 'succeeded'"
	            "   FROM deliveries d WHERE d.endpoint_id = $1 AND d.state = 'pending'",
	            ep);
	tstack_exec(tstack_db(),
	            "UPDATE deliveries SET state = 'delivered', attempts = 1, trigger = 'scheduled'"
	            " WHERE endpoint_id = $1 AND state = 'pending'",
	            ep);
	/* ... but one fails for good again: dead, as before the recover. */
	set_delivery(ep, ev[3], "dead", "1");
	for (int i = 0; i < 4; i++)
		before[i] = delivery_row(ep, ev[i]);

	again = post(&a, key, body, "/v1/endpoints/%s/recover", ep);
	tstack_expect_status(again, 200);
	for (int i = 0; i < 4; i++)
		cr_assert_str_eq(delivery_row(ep, ev[i]), before[i], "event %d changed", i);
	tstack_expect_header(again, "Idempotent-Replayed", "true");
	cr_assert_str_eq(again->body, r->body);
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          " AND state = 'pending'",
	                          ep),
	             0);
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          " AND state = 'dead'",
	                          ep),
	             1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM delivery_attempts WHERE endpoint_id = $1"
	                          " AND trigger = 'recover'",
	                          ep),
	             3);
	http_response_free(again);
	http_response_free(r);

	/* Another body under the key is a conflict; a new key finds none. */
	r = post(&a, key, "{\"since\":\"2001-01-01T00:00:00Z\"}", "/v1/endpoints/%s/recover", ep);
	problem(r, 409, "idempotency-key-reused");
	http_response_free(r);
	tstack_key(key, sizeof(key), "recover2");
	r = post(&a, key, body, "/v1/endpoints/%s/recover", ep);
	cr_assert_str_eq(r->body, "{\"recovered\":1}");
	http_response_free(r);
}

/* The time range, the types (names and globs) and the states choose. */
Test(recover, by_range_types_and_states)
{
	struct tstack_tenant a;
	struct http_response *r;
	char *ep, *ev[3], key[96], body[300];
	const char *types[3] = { "rt.a", "rt.b", "rt.c" };

	tstack_tenant_create(&a, "rt");
	ep = make_endpoint(&a, "NULL");
	for (int i = 0; i < 3; i++) {
		ev[i] = make_event(&a, types[i]);
		set_delivery(ep, ev[i], i == 2 ? "skipped" : "dead", "4");
	}
	/* Every event is workflow.created: the type filter sees that type. */
	tstack_key(key, sizeof(key), "rt");
	r = post(&a, key, "{\"since\":\"2000-01-01T00:00:00Z\",\"types\":[\"billing.*\"]}",
	         "/v1/endpoints/%s/recover", ep);
	cr_assert_str_eq(r->body, "{\"recovered\":0}");
	http_response_free(r);
	tstack_key(key, sizeof(key), "rt");
	r = post(&a, key, "{\"since\":\"2000-01-01T00:00:00Z\",\"until\":\"2001-01-01T00:00:00Z\"}",
	         "/v1/endpoints/%s/recover", ep);
	cr_assert_str_eq(r->body, "{\"recovered\":0}");
	http_response_free(r);
	tstack_key(key, sizeof(key), "rt");
	r = post(&a, key,
	         "{\"since\":\"2000-01-01T00:00:00Z\",\"types\":[\"workflow.*\"],"
	         "\"states\":[\"skipped\"]}",
	         "/v1/endpoints/%s/recover", ep);
	cr_assert_str_eq(r->body, "{\"recovered\":1}");
	http_response_free(r);
	cr_assert_str_eq(KEEP_TEXT("SELECT d.state || d.trigger FROM deliveries d JOIN outbox o"
	                           " ON o.id = d.outbox_id WHERE o.event_id = $1",
	                           ev[2]),
	                 "pendingrecover");
	/* Since the second event was written: only it and the third. */
	tstack_exec(tstack_db(), "UPDATE deliveries SET state = 'dead' WHERE endpoint_id = $1", ep);
	char *since = KEEP_TEXT("SELECT to_char(created_at AT TIME ZONE 'UTC',"
	                        " 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM outbox"
	                        " WHERE event_id = $1",
	                        ev[1]);
	snprintf(body, sizeof(body), "{\"since\":\"%s\",\"types\":[\"workflow.created\"]}", since);
	tstack_key(key, sizeof(key), "rt");
	r = post(&a, key, body, "/v1/endpoints/%s/recover", ep);
	cr_assert_str_eq(r->body, "{\"recovered\":2}");
	http_response_free(r);

	const char *bad[] = {
		"{}",
		"{\"since\":\"yesterday\"}",
		"{\"since\":\"2000-01-01T00:00:00Z\",\"until\":\"2000-01-01T00:00:00Z\"}",
		"{\"since\":\"2000-01-01T00:00:00Z\",\"states\":[\"pending\"]}",
		"{\"since\":\"2000-01-01T00:00:00Z\",\"states\":[]}",
		"{\"since\":\"2000-01-01T00:00:00Z\",\"types\":[\"a*\"]}",
		"{\"since\":\"2000-01-01T00:00:00Z\",\"types\":[\"a\\\"b\"]}",
		"{\"since\":\"2000-01-01T00:00:00Z\",\"colour\":1}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		tstack_key(key, sizeof(key), "rt-bad");
		r = post(&a, key, bad[i], "/v1/endpoints/%s/recover", ep);
		problem(r, 422, "invalid-request");
		http_response_free(r);
	}
	r = post(&a, NULL, "{\"since\":\"2000-01-01T00:00:00Z\"}", "/v1/endpoints/%s/recover", ep);
	problem(r, 400, "missing-idempotency-key");
	http_response_free(r);
	tstack_key(key, sizeof(key), "rt-ghost");
	r = post(&a, key, "{\"since\":\"2000-01-01T00:00:00Z\"}", "/v1/endpoints/%s/recover",
	         "01890000-0000-7000-8000-000000000000");
	problem(r, 404, "not-found");
	http_response_free(r);
}

/* --- Resend ------------------------------------------------------------- */

Test(resend, one_delivery_pending_again)
{
	struct tstack_tenant a;
	struct http_response *r, *again;
	char *ep, *other, *ev, *before, key[96], body[100];

	tstack_tenant_create(&a, "rs");
	ep = make_endpoint(&a, "NULL");
	other = make_endpoint(&a, "ARRAY['billing.*']");
	ev = make_event(&a, "rs.x");
	set_delivery(ep, ev, "delivered", "2");

	snprintf(body, sizeof(body), "{\"endpoint_id\":\"%s\"}", ep);
	tstack_key(key, sizeof(key), "resend");
	r = post(&a, key, body, "/v1/events/%s/resend", ev);
	tstack_expect_status(r, 200);
	cr_assert_str_eq(KEEP_JSON(r->body, "{endpoint_id}"), ep);
	cr_assert_str_eq(KEEP_JSON(r->body, "{event_id}"), ev);
	cr_assert_str_eq(KEEP_JSON(r->body, "{state}"), "pending");
	cr_assert_str_eq(KEEP_JSON(r->body, "{attempts}"), "0");
	cr_assert_str_eq(KEEP_JSON_TYPE(r->body, "{last_error}"), "null");
	cr_assert_str_eq(
	    delivery_row(ep, ev),
	    KEEP_TEXT("SELECT concat_ws(',', 'pending', 0, 'manual', d.next_attempt_at,"
	              " d.updated_at) FROM deliveries d WHERE d.endpoint_id = $1",
	              ep));
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          " AND next_attempt_at <= now()",
	                          ep),
	             1);
	/* Delivered again; the retry changes nothing. */
	set_delivery(ep, ev, "delivered", "1");
	before = delivery_row(ep, ev);
	again = post(&a, key, body, "/v1/events/%s/resend", ev);
	tstack_expect_status(again, 200);
	tstack_expect_header(again, "Idempotent-Replayed", "true");
	cr_assert_str_eq(again->body, r->body);
	cr_assert_str_eq(delivery_row(ep, ev), before);
	http_response_free(again);
	http_response_free(r);

	/* No delivery to an endpoint whose filter did not pass the event. */
	snprintf(body, sizeof(body), "{\"endpoint_id\":\"%s\"}", other);
	tstack_key(key, sizeof(key), "resend-none");
	r = post(&a, key, body, "/v1/events/%s/resend", ev);
	problem(r, 409, "state-conflict");
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", other),
	             0);
	http_response_free(r);

	tstack_key(key, sizeof(key), "resend-ghost");
	r = post(&a, key, "{\"endpoint_id\":\"01890000-0000-7000-8000-000000000000\"}",
	         "/v1/events/%s/resend", ev);
	problem(r, 404, "not-found");
	http_response_free(r);
	r = post(&a, key, body, "/v1/events/%s/resend", "01890000-0000-7000-8000-000000000000.1");
	problem(r, 404, "not-found");
	http_response_free(r);
	const char *bad[] = {
		"{}", "{\"endpoint_id\":\"x\"}", "{\"endpoint_id\":1}",
		"{\"endpoint_id\":\"01890000-0000-7000-8000-000000000000\",\"a\":1}"
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		tstack_key(key, sizeof(key), "resend-bad");
		r = post(&a, key, bad[i], "/v1/events/%s/resend", ev);
		problem(r, 422, "invalid-request");
		http_response_free(r);
	}
}

/* --- Isolation ---------------------------------------------------------- */

/* Another tenant's event or endpoint is 404 on every route, and nothing
 * of the owner's changes. */
Test(events_isolation, another_tenants_ids_are_404)
{
	struct tstack_tenant a, b;
	struct http_response *r;
	char *ep, *ev, *before, *own_ep, key[96], body[100];

	tstack_tenant_create(&a, "iso-a");
	tstack_tenant_create(&b, "iso-b");
	ep = make_endpoint(&a, "NULL");
	own_ep = make_endpoint(&b, "NULL");
	ev = make_event(&a, "iso.x");
	set_delivery(ep, ev, "dead", "5");
	before = delivery_row(ep, ev);

	r = get(&b, "/v1/events/%s/deliveries", ev);
	problem(r, 404, "not-found");
	http_response_free(r);
	r = get(&b, "/v1/endpoints/%s/attempts", ep);
	problem(r, 404, "not-found");
	http_response_free(r);
	r = get(&b, "/v1/endpoints/%s/undelivered", ep);
	problem(r, 404, "not-found");
	http_response_free(r);
	tstack_key(key, sizeof(key), "iso");
	r = post(&b, key, "{\"since\":\"2000-01-01T00:00:00Z\"}", "/v1/endpoints/%s/recover", ep);
	problem(r, 404, "not-found");
	http_response_free(r);
	/* Their event, to their own endpoint or to the owner's. */
	snprintf(body, sizeof(body), "{\"endpoint_id\":\"%s\"}", own_ep);
	tstack_key(key, sizeof(key), "iso");
	r = post(&b, key, body, "/v1/events/%s/resend", ev);
	problem(r, 404, "not-found");
	http_response_free(r);
	snprintf(body, sizeof(body), "{\"endpoint_id\":\"%s\"}", ep);
	tstack_key(key, sizeof(key), "iso");
	r = post(&b, key, body, "/v1/events/%s/resend", ev);
	problem(r, 404, "not-found");
	http_response_free(r);
	r = KEEP_GET(&b, "/v1/events");
	tstack_expect_status(r, 200);
	cr_assert_null(strstr(r->body, ev), "%s", r->body);
	http_response_free(r);
	cr_assert_str_eq(delivery_row(ep, ev), before);
}

/* --- /metrics ----------------------------------------------------------- */

static struct http_response *scrape(void)
{
	char *saved = strdup(tstack_env("IDEMFLOW_PORT"));
	struct http_response *r;

	setenv("IDEMFLOW_PORT", tstack_env("IDEMFLOW_METRICS_PORT"), 1);
	r = http_request("GET", "/metrics", NULL, NULL, 0);
	setenv("IDEMFLOW_PORT", saved, 1);
	free(saved);
	cr_assert_not_null(r, "GET /metrics: %s", http_error());
	cr_assert_eq(r->status, 200, "%d %.300s", r->status, r->body);
	return r;
}

/* The disabled endpoints, and the pending deliveries of the 10 endpoints
 * with the most, the rest in one "other" line: 12 lines for 12 endpoints
 * and never more, each with its exact count. */
Test(events_metrics, pending_per_endpoint_bounded)
{
	struct tstack_tenant a;
	struct http_response *r;
	char *eps[12], line[200];
	long total, top_sum = 0;

	tstack_tenant_create(&a, "met");
	/* Endpoint i has 100 + i pending deliveries: more than any other test's. */
	for (int i = 0; i < 12; i++)
		eps[i] = make_endpoint(&a, "ARRAY['none.*']");
	char *wf = make_event(&a, "met.x");
	wf[36] = '\0';
	for (int i = 0; i < 12; i++) {
		char n[16];
		snprintf(n, sizeof(n), "%d", 100 + i);
		tstack_exec(
		    tstack_db(),
		    "INSERT INTO deliveries (tenant_id, endpoint_id, workflow_id, seq, outbox_id)"
		    " SELECT $1::bigint, $2::uuid, $3::uuid, g, 0 FROM generate_series(1, $4::int) g",
		    a.id_text, eps[i], wf, n);
	}
	tstack_exec(tstack_db(),
	            "UPDATE endpoints SET disabled = true, disabled_reason = 'manual'"
	            " WHERE id = $1",
	            eps[0]);
	r = scrape();
	cr_assert_not_null(strstr(r->body, "# TYPE idemflow_endpoints_disabled gauge\n"));
	snprintf(line, sizeof(line), "\nidemflow_endpoints_disabled %ld\n",
	         tstack_count("SELECT count(*) FROM endpoints WHERE disabled"));
	cr_assert_not_null(strstr(r->body, line), "%s", r->body);
	for (int i = 0; i < 12; i++) {
		snprintf(
		    line, sizeof(line),
		    "\nidemflow_endpoint_deliveries_pending{tenant=\"%ld\",endpoint=\"%s\"} %d\n",
		    a.id, eps[i], 100 + i);
		if (i >= 2) {
			cr_assert_not_null(strstr(r->body, line), "%s: %s", line, r->body);
			top_sum += 100 + i;
		} else {
			cr_assert_null(strstr(r->body, eps[i]), "%s", r->body);
		}
	}
	int lines = 0;
	for (const char *p = r->body; (p = strstr(p, "\nidemflow_endpoint_deliveries_pending{"));
	     p++)
		lines++;
	cr_assert_eq(lines, 11, "%s", r->body);
	total = tstack_count("SELECT count(*) FROM deliveries WHERE state = 'pending'");
	snprintf(
	    line, sizeof(line),
	    "\nidemflow_endpoint_deliveries_pending{tenant=\"other\",endpoint=\"other\"} %ld\n",
	    total - top_sum);
	cr_assert_not_null(strstr(r->body, line), "%s: %s", line, r->body);
	http_response_free(r);
}

/* --- The CLI ------------------------------------------------------------ */

TestSuite(events_cli, .timeout = 60);

/* idemflow endpoint recover and event resend: the same functions as the
 * routes, the count and the delivery on stdout, 65 for what is not there,
 * 64 for a bad argument. */
Test(events_cli, recover_and_resend)
{
	struct tstack_tenant a;
	char out[512], want[512], *ep, *other, *ev[3];

	tstack_tenant_create(&a, "cli");
	ep = make_endpoint(&a, "NULL");
	other = make_endpoint(&a, "ARRAY['billing.*']");
	for (int i = 0; i < 3; i++) {
		ev[i] = make_event(&a, "cli.x");
		set_delivery(ep, ev[i], i == 0 ? "delivered" : i == 1 ? "dead" : "skipped", "7");
	}
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "recover", "--tenant", a.name, ep,
	                        "--since", "2000-01-01T00:00:00Z", "--state", "dead", "--type",
	                        "workflow.*", (char *)NULL),
	             0, "%s", tstack_cli_stderr());
	cr_assert_str_eq(out, "1");
	cr_assert_str_eq(KEEP_TEXT("SELECT string_agg(d.state || '/' || d.attempts || '/' ||"
	                           " d.trigger, ' ' ORDER BY o.id) FROM deliveries d"
	                           " JOIN outbox o ON o.id = d.outbox_id WHERE d.endpoint_id = $1",
	                           ep),
	                 "delivered/7/scheduled pending/0/recover skipped/7/scheduled");

	cr_assert_eq(tstack_cli(out, sizeof(out), "event", "resend", "--tenant", a.name, ev[0],
	                        "--endpoint", ep, (char *)NULL),
	             0, "%s", tstack_cli_stderr());
	snprintf(want, sizeof(want), "%s\t%s\tpending\t0\t", ep, ev[0]);
	cr_assert(strncmp(out, want, strlen(want)) == 0, "%s", out);
	cr_assert_str_eq(
	    delivery_row(ep, ev[0]),
	    KEEP_TEXT("SELECT concat_ws(',', 'pending', 0, 'manual', d.next_attempt_at,"
	              " d.updated_at) FROM deliveries d JOIN outbox o"
	              " ON o.id = d.outbox_id WHERE o.event_id = $1"
	              " AND d.endpoint_id = $2",
	              ev[0], ep));

	cr_assert_eq(tstack_cli(out, sizeof(out), "event", "resend", "--tenant", a.name, ev[0],
	                        "--endpoint", other, (char *)NULL),
	             65);
	cr_assert_not_null(strstr(tstack_cli_stderr(), "state-conflict"), "%s",
	                   tstack_cli_stderr());
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "recover", "--tenant", "no-such", ep,
	                        "--since", "2000-01-01T00:00:00Z", (char *)NULL),
	             65);
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "recover", "--tenant", a.name,
	                        "01890000-0000-7000-8000-000000000000", "--since",
	                        "2000-01-01T00:00:00Z", (char *)NULL),
	             65);
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "recover", "--tenant", a.name, ep,
	                        "--since", "not-a-time", (char *)NULL),
	             64, "%s", tstack_cli_stderr());
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "recover", "--tenant", a.name, ep,
	                        "--since", "2000-01-01T00:00:00Z", "--state", "pending",
	                        (char *)NULL),
	             64);
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "recover", "--tenant", a.name, ep,
	                        (char *)NULL),
	             64);
}
