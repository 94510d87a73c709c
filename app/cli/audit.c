/*
 * audit.c - "idemflow audit": the service's promises checked on the data
 * it wrote, for one tenant or for all, over a window of time.
 *
 * Invariants (a row counted here is damage or a bug; any makes the exit
 * status EX_DATAERR, 65), over the keys and workflows created in the
 * window:
 *   answers_without_workflow     a stored 2xx answer names a workflow that
 *                                does not exist in its tenant (among the
 *                                keys younger than workflow_retention:
 *                                prune may have deleted an older one's)
 *   keys_pointing_nowhere        a key with no answer (status 0: a claim
 *                                committed without its answer), or a 2xx
 *                                answer of a route that names one workflow
 *                                in which no workflow id can be read
 *   workflows_with_several_keys  a workflow named by more than one 201
 *                                answer of POST /v1/workflows (one logical
 *                                request created it twice, or two requests
 *                                one workflow)
 *   workflows_without_created_event  a workflow without its
 *                                workflow.created event (seq 1), among those
 *                                younger than outbox_retention: prune may
 *                                have deleted an older one's, delivered
 *
 * Backlog (reported, never an exit status: it is work late, not data
 * wrong; the alert rules decide), over the whole tables through their
 * small partial indexes, window or not, because what is stuck since before
 * the window is still stuck: events pending longer than --pending-after,
 * events held behind a dead one (sql/012_held_events.sql), dead events,
 * timers overdue by more than --timer-after, and jobs whose lease ran out
 * more than --lease-after ago and that were never reaped.
 *
 * It only reads, in one REPEATABLE READ READ ONLY transaction, so every
 * count is of one moment. The window reads use the (created_at,
 * tenant_id) indexes of sql/015_audit.sql: one range for every tenant, or
 * the same range filtered in the index for one. Not for the server:
 * nothing here is linked into it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "cli/cli.h"
#include "cli/rebuild.h"
#include "core/db.h"
#include "core/iso8601.h"

/* The longest duration an option takes: 100 years, far inside what an
 * interval holds. */
#define AUDIT_DURATION_MAX_MS (100L * 365 * 86400 * 1000)

/* $N milliseconds before the transaction's start, as a timestamptz. */
#define AGO_1 "(now() - $1::bigint * interval '1 millisecond')"
#define AGO_2 "(now() - $2::bigint * interval '1 millisecond')"
#define AGO_3 "(now() - $3::bigint * interval '1 millisecond')"
#define AGO_4 "(now() - $4::bigint * interval '1 millisecond')"

/* A workflow id as the server writes it (and a client may send it). */
#define UUID_RE "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

/* Every tenant ($1 NULL) or one: the condition on tenant_id. With a value
 * the plan keeps one tenant (an unnamed statement is planned with its
 * parameters), and tenant_id is read in the index, not the table. */
#define TENANT_IS "($1::bigint IS NULL OR tenant_id = $1::bigint)"

/*
 * The keys created in the window ($2 ms back), of every tenant or one
 * ($1), one row per tenant that has any: name, keys, 2xx answers naming
 * one workflow, keys pointing nowhere, answers naming a missing
 * workflow, workflows named by several 201 answers. The window is a range
 * of idempotency_keys_created (created_at, tenant_id): each table page of
 * the window is read once, however many tenants share it. A 2xx answer
 * names its workflow by the route: POST /v1/workflows in its body (the
 * server writes {"id":"..." first), /v1/workflows/{id}/... in its path,
 * /v1/jobs/{id}.sN/... in the job key. POST /v1/messages and
 * /v1/jobs/activate name none or many: not checked. A key older than its
 * tenant's workflow_retention (or $3 ms, the CLI's) may name a workflow
 * that prune deleted since: its workflow is not asked for. Each answer's
 * workflow is probed in workflows_pkey (a subplan, not a join the planner
 * may turn into a hash of every workflow): the cost follows the window.
 */
#define AUDIT_KEYS                                                                                  \
	"WITH k AS MATERIALIZED (\n"                                                                \
	"  SELECT tenant_id, status, created_at,\n"                                                 \
	"         CASE WHEN status NOT BETWEEN 200 AND 299 THEN NULL\n"                             \
	"              WHEN method = 'POST' AND path = '/v1/workflows' THEN 'create'\n"             \
	"              WHEN path ~ '^/v1/workflows/[^/]+/[a-z]+$' THEN 'workflow'\n"                \
	"              WHEN path ~ '^/v1/jobs/[^/]+/[a-z]+$' THEN 'job' END AS route,\n"            \
	"         CASE WHEN status NOT BETWEEN 200 AND 299 THEN NULL\n"                             \
	"              WHEN method = 'POST' AND path = '/v1/workflows'\n"                           \
	"              THEN substring(body FROM '^\\{\"id\":\"(" UUID_RE ")\"')\n"                  \
	"              ELSE substring(path FROM\n"                                                  \
	"                   '^/v1/(?:workflows|jobs)/(" UUID_RE ")(?:\\.s[0-9]+)?/[a-z]+$')\n"      \
	"         END AS wf\n"                                                                      \
	"    FROM idempotency_keys\n"                                                               \
	"   WHERE created_at >= " AGO_2 " AND " TENANT_IS "\n"                                      \
	"), s AS (\n"                                                                               \
	"  SELECT tenant_id, count(*) AS keys,\n"                                                   \
	"         count(*) FILTER (WHERE route IS NOT NULL) AS answers,\n"                          \
	"         count(*) FILTER (WHERE status = 0\n"                                              \
	"                            OR (route IS NOT NULL AND wf IS NULL)) AS nowhere,\n"          \
	"         count(*) FILTER (WHERE wf IS NOT NULL AND NOT EXISTS (\n"                         \
	"             SELECT 1\n"                                                                   \
	"               FROM workflows w\n"                                                         \
	"              WHERE w.tenant_id = k.tenant_id AND w.id = k.wf::uuid)\n"                    \
	"             AND k.created_at >= now() - coalesce(\n"                                      \
	"                 (SELECT t.workflow_retention FROM tenants t WHERE t.id = k.tenant_id),\n" \
	"                 $3::bigint * interval '1 millisecond')) AS missing\n"                     \
	"    FROM k\n"                                                                              \
	"   GROUP BY tenant_id\n"                                                                   \
	"), d AS (\n"                                                                               \
	"  SELECT tenant_id, count(*) AS several\n"                                                 \
	"    FROM (SELECT tenant_id\n"                                                              \
	"            FROM k\n"                                                                      \
	"           WHERE route = 'create' AND status = 201 AND wf IS NOT NULL\n"                   \
	"           GROUP BY tenant_id, lower(wf)\n"                                                \
	"          HAVING count(*) > 1) x\n"                                                        \
	"   GROUP BY tenant_id\n"                                                                   \
	")\n"                                                                                       \
	"SELECT t.name, s.keys, s.answers, s.nowhere, s.missing, coalesce(d.several, 0)\n"          \
	"  FROM s\n"                                                                                \
	"  JOIN tenants t ON t.id = s.tenant_id\n"                                                  \
	"  LEFT JOIN d ON d.tenant_id = s.tenant_id\n"                                              \
	" ORDER BY t.name\n"

/*
 * The workflows created since $2 ms back (the later of the window's start
 * and outbox_retention back), of every tenant or one ($1), one row per
 * tenant that has any: name, workflows, those without their
 * workflow.created event (seq 1, probed in outbox's unique (workflow_id,
 * seq), a subplan as above). The window is a range of workflows_created.
 */
#define AUDIT_WORKFLOWS                                                                            \
	"SELECT t.name, s.workflows, s.no_event\n"                                                 \
	"  FROM (SELECT tenant_id, count(*) AS workflows,\n"                                       \
	"               count(*) FILTER (WHERE NOT EXISTS (\n"                                     \
	"                   SELECT 1\n"                                                            \
	"                     FROM outbox o\n"                                                     \
	"                    WHERE o.workflow_id = w.id AND o.seq = 1\n"                           \
	"                      AND o.tenant_id = w.tenant_id\n"                                    \
	"                      AND o.type = 'workflow.created')) AS no_event\n"                    \
	"          FROM workflows w\n"                                                             \
	"         WHERE created_at >= " AGO_2 " AND " TENANT_IS "\n"                               \
	"         GROUP BY tenant_id) s\n"                                                         \
	"  JOIN tenants t ON t.id = s.tenant_id\n"                                                 \
	" ORDER BY t.name\n"

/*
 * The backlog, one row: events pending longer than $2 ms (not held),
 * held, dead; timers overdue by more than $3 ms; active jobs whose lease
 * ran out more than $4 ms ago. Each through its partial index (outbox_due,
 * outbox_dead, timers_due, jobs_leases).
 */
#define AUDIT_BACKLOG                                                                              \
	"SELECT (SELECT count(*)\n"                                                                \
	"          FROM outbox\n"                                                                  \
	"         WHERE published_at IS NULL AND dead_at IS NULL\n"                                \
	"           AND next_attempt_at < 'infinity' AND created_at < " AGO_2 "\n"                 \
	"           AND " TENANT_IS "),\n"                                                         \
	"       (SELECT count(*)\n"                                                                \
	"          FROM outbox\n"                                                                  \
	"         WHERE published_at IS NULL AND dead_at IS NULL\n"                                \
	"           AND next_attempt_at = 'infinity' AND " TENANT_IS "),\n"                        \
	"       (SELECT count(*)\n"                                                                \
	"          FROM outbox\n"                                                                  \
	"         WHERE dead_at IS NOT NULL AND " TENANT_IS "),\n"                                 \
	"       (SELECT count(*)\n"                                                                \
	"          FROM timers\n"                                                                  \
	"         WHERE fired_at IS NULL AND due_at < " AGO_3 " AND " TENANT_IS "),\n"             \
	"       (SELECT count(*)\n"                                                                \
	"          FROM jobs\n"                                                                    \
	"         WHERE state = 'active' AND due_at < " AGO_4 " AND " TENANT_IS ")\n"

/* The moments the report names, in UTC: now, the window's start ($1 ms
 * back), the events' ($2 ms back). */
#define TS_FORMAT "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'"
#define AUDIT_TIMES                                                                                \
	"SELECT to_char(now() AT TIME ZONE 'UTC', " TS_FORMAT "),\n"                               \
	"       to_char(" AGO_1 " AT TIME ZONE 'UTC', " TS_FORMAT "),\n"                           \
	"       to_char(" AGO_2 " AT TIME ZONE 'UTC', " TS_FORMAT ")\n"

#define AUDIT_SETTINGS                                                                             \
	"SELECT set_config('jit', 'off', true), set_config('work_mem', '64MB', true)\n"

/* What the options ask for. */
struct audit_opts {
	const char *tenant; /* NULL: all tenants */
	long since_ms;
	long pending_ms, timer_ms, lease_ms;
	const char *textfile; /* NULL: none */
	int json;
	int rebuild; /* --rebuild: workflows rebuilt from their events instead */
};

/* The invariants, in the order they are reported. */
enum audit_inv {
	INV_ANSWERS_WITHOUT_WORKFLOW,
	INV_KEYS_POINTING_NOWHERE,
	INV_WORKFLOWS_WITH_SEVERAL_KEYS,
	INV_WORKFLOWS_WITHOUT_CREATED_EVENT,
	INV__COUNT
};

enum audit_backlog {
	BL_EVENTS_PENDING,
	BL_EVENTS_HELD,
	BL_EVENTS_DEAD,
	BL_TIMERS_OVERDUE,
	BL_JOBS_UNREAPED,
	BL__COUNT
};

static const struct {
	const char *name, *text;
} invariants[INV__COUNT] = {
	[INV_ANSWERS_WITHOUT_WORKFLOW] = { "answers_without_workflow",
	                                   "2xx answers naming a workflow that does not exist" },
	[INV_KEYS_POINTING_NOWHERE] = { "keys_pointing_nowhere",
	                                "keys without an answer, or whose answer names no "
	                                "workflow" },
	[INV_WORKFLOWS_WITH_SEVERAL_KEYS] = { "workflows_with_several_keys",
	                                      "workflows created (201) under more than one key" },
	[INV_WORKFLOWS_WITHOUT_CREATED_EVENT] = { "workflows_without_created_event",
	                                          "workflows without their workflow.created "
	                                          "event" },
};

static const char *const backlog_names[BL__COUNT] = {
	[BL_EVENTS_PENDING] = "events_pending", [BL_EVENTS_HELD] = "events_held",
	[BL_EVENTS_DEAD] = "events_dead",       [BL_TIMERS_OVERDUE] = "timers_overdue",
	[BL_JOBS_UNREAPED] = "jobs_unreaped",
};

/* One tenant's broken invariants, for the report. */
struct audit_tenant {
	char name[64];
	long inv[INV__COUNT];
};

struct audit_result {
	char now[40], since[40], events_since[40];
	long keys, answers, workflows;
	long inv[INV__COUNT];
	long backlog[BL__COUNT];
	struct audit_tenant *tenants; /* those with a broken invariant */
	size_t ntenants, cap;
	double duration_s;
};

/*
 * A duration option: an ISO 8601 duration (P1D, PT24H, PT30M: what a
 * workflow's "sleep" takes, iso8601.h) or the configuration's form (24h,
 * 30m, 7d, 500ms: conf.h). Returns 0 with *ms, or EX_USAGE after saying
 * why on stderr.
 */
static int audit_duration(const char *opt, const char *v, long *ms)
{
	char why[128];
	int64_t us;

	if (v != NULL && v[0] == 'P') {
		if (iso8601_duration(v, &us, why, sizeof(why)) == 0 &&
		    us / 1000 <= AUDIT_DURATION_MAX_MS) {
			*ms = (long)(us / 1000);
			return 0;
		}
	} else if (v != NULL && conf_duration(v, ms) == 0 && *ms <= AUDIT_DURATION_MAX_MS) {
		return 0;
	}
	fprintf(stderr,
	        "idemflow: invalid %s \"%s\": expected a duration such as 24h, 30m, 7d or "
	        "PT24H, P1D (at most 100 years)\n",
	        opt, v ? v : "");
	return EX_USAGE;
}

/* Parse argv (after "audit") into o and the configuration keys c takes.
 * Returns EX_OK or EX_USAGE (said on stderr). */
static int audit_options(struct conf *c, struct audit_opts *o, int argc, char **argv)
{
	const struct {
		const char *name;
		long *ms; /* a duration; NULL: another kind of value */
	} valued[] = {
		{ "--since", &o->since_ms },
		{ "--pending-after", &o->pending_ms },
		{ "--timer-after", &o->timer_ms },
		{ "--lease-after", &o->lease_ms },
		{ "--tenant", NULL },
		{ "--textfile", NULL },
		{ "--outbox-retention", NULL },
		{ "--workflow-retention", NULL },
	};
	struct err e;

	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *eq = strchr(a, '='), *val;
		size_t n = eq ? (size_t)(eq - a) : strlen(a), k;

		if (strcmp(a, "--json") == 0) {
			o->json = 1;
			continue;
		}
		if (strcmp(a, "--rebuild") == 0) {
			o->rebuild = 1;
			continue;
		}
		for (k = 0; k < sizeof(valued) / sizeof(valued[0]); k++)
			if (strlen(valued[k].name) == n && strncmp(a, valued[k].name, n) == 0)
				break;
		if (k == sizeof(valued) / sizeof(valued[0]))
			return cli_usage_error();
		if (eq == NULL && i + 1 >= argc) {
			fprintf(stderr, "idemflow: option \"%s\" needs a value\n", a);
			return EX_USAGE;
		}
		val = eq ? eq + 1 : argv[++i];
		if (valued[k].ms != NULL) {
			if (audit_duration(valued[k].name, val, valued[k].ms) != 0)
				return EX_USAGE;
		} else if (strcmp(valued[k].name, "--tenant") == 0) {
			o->tenant = val;
		} else if (strcmp(valued[k].name, "--textfile") == 0) {
			if (*val == '\0') {
				fprintf(stderr, "idemflow: --textfile needs a path\n");
				return EX_USAGE;
			}
			o->textfile = val;
		} else if (conf_set(c, valued[k].name + 2, val, valued[k].name, &e) < 0) {
			fprintf(stderr, "idemflow: %s\n", e.msg);
			return EX_USAGE;
		}
	}
	if (o->rebuild && (o->json || o->textfile != NULL)) {
		fprintf(stderr, "idemflow: audit --rebuild takes no --json or --textfile\n");
		return EX_USAGE;
	}
	if (o->since_ms <= 0) {
		fprintf(stderr, "idemflow: --since must be longer than 0\n");
		return EX_USAGE;
	}
	return EX_OK;
}

/*
 * Add one tenant's counts inv (those of one statement; the others 0) to
 * r, and to the tenant's line when one is above 0. Returns 0, or -1 with
 * e when out of memory.
 */
static int audit_note(struct audit_result *r, const char *name, const long *inv, struct err *e)
{
	struct audit_tenant *t = NULL;
	int any = 0;

	for (int i = 0; i < INV__COUNT; i++) {
		r->inv[i] += inv[i];
		any |= inv[i] > 0;
	}
	if (!any)
		return 0;
	for (size_t i = 0; i < r->ntenants; i++)
		if (strcmp(r->tenants[i].name, name) == 0)
			t = &r->tenants[i];
	if (t == NULL) {
		if (r->ntenants == r->cap) {
			size_t cap = r->cap ? r->cap * 2 : 8;
			struct audit_tenant *grown = realloc(r->tenants, cap * sizeof(*grown));
			if (grown == NULL)
				return err_set(e, ERR_INTERNAL, "out of memory");
			r->tenants = grown;
			r->cap = cap;
		}
		t = &r->tenants[r->ntenants++];
		memset(t, 0, sizeof(*t));
		snprintf(t->name, sizeof(t->name), "%s", name);
	}
	for (int i = 0; i < INV__COUNT; i++)
		t->inv[i] += inv[i];
	return 0;
}

/*
 * Run the audit's statements in one read-only snapshot and fill r: the
 * times, the keys, the workflows, the backlog. tenant_id is "" for all
 * tenants. Returns 0, or -1 with e.
 */
static int audit_run(PGconn *conn, const struct conf *c, const struct audit_opts *o,
                     const char *tenant_id, struct audit_result *r, struct err *e)
{
	char since[24], events[24], pending[24], timer[24], lease[24], wf_retention[24];
	const char *tid = *tenant_id ? tenant_id : NULL;
	PGresult *res = NULL;
	int rc = -1;

	snprintf(since, sizeof(since), "%ld", o->since_ms);
	/* A delivered event older than outbox_retention may be pruned: only
	 * workflows younger than that must still have theirs. */
	snprintf(events, sizeof(events), "%ld",
	         o->since_ms < c->outbox_retention ? o->since_ms : c->outbox_retention);
	snprintf(pending, sizeof(pending), "%ld", o->pending_ms);
	snprintf(timer, sizeof(timer), "%ld", o->timer_ms);
	snprintf(lease, sizeof(lease), "%ld", o->lease_ms);
	snprintf(wf_retention, sizeof(wf_retention), "%ld", c->workflow_retention);

	res = db_exec(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL, e);
	if (res == NULL)
		return -1;
	PQclear(res);
	/* For this transaction only: no JIT (the statements count rows read
	 * from the table; on 5 million keys, compiling them took 2.2 s of a
	 * 4 s statement), and room to sort and hash a large window in memory. */
	res = db_exec(conn, AUDIT_SETTINGS, 0, NULL, e);
	if (res == NULL)
		goto out;
	PQclear(res);

	const char *pt[2] = { since, events };
	res = db_exec(conn, AUDIT_TIMES, 2, pt, e);
	if (res == NULL)
		goto out;
	snprintf(r->now, sizeof(r->now), "%s", PQgetvalue(res, 0, 0));
	snprintf(r->since, sizeof(r->since), "%s", PQgetvalue(res, 0, 1));
	snprintf(r->events_since, sizeof(r->events_since), "%s", PQgetvalue(res, 0, 2));
	PQclear(res);

	const char *pk[3] = { tid, since, wf_retention };
	res = db_exec(conn, AUDIT_KEYS, 3, pk, e);
	if (res == NULL)
		goto out;
	for (int i = 0; i < PQntuples(res); i++) {
		long inv[INV__COUNT] = { 0 };

		r->keys += atol(PQgetvalue(res, i, 1));
		r->answers += atol(PQgetvalue(res, i, 2));
		inv[INV_KEYS_POINTING_NOWHERE] = atol(PQgetvalue(res, i, 3));
		inv[INV_ANSWERS_WITHOUT_WORKFLOW] = atol(PQgetvalue(res, i, 4));
		inv[INV_WORKFLOWS_WITH_SEVERAL_KEYS] = atol(PQgetvalue(res, i, 5));
		if (audit_note(r, PQgetvalue(res, i, 0), inv, e) < 0)
			goto out;
	}
	PQclear(res);

	const char *pw[2] = { tid, events };
	res = db_exec(conn, AUDIT_WORKFLOWS, 2, pw, e);
	if (res == NULL)
		goto out;
	for (int i = 0; i < PQntuples(res); i++) {
		long inv[INV__COUNT] = { 0 };

		r->workflows += atol(PQgetvalue(res, i, 1));
		inv[INV_WORKFLOWS_WITHOUT_CREATED_EVENT] = atol(PQgetvalue(res, i, 2));
		if (audit_note(r, PQgetvalue(res, i, 0), inv, e) < 0)
			goto out;
	}
	PQclear(res);

	const char *pb[4] = { tid, pending, timer, lease };
	res = db_exec(conn, AUDIT_BACKLOG, 4, pb, e);
	if (res == NULL)
		goto out;
	for (int b = 0; b < BL__COUNT; b++)
		r->backlog[b] = atol(PQgetvalue(res, 0, b));
	rc = 0;
out:
	PQclear(res);
	/* Read only: ending it either way changes nothing. */
	PQclear(PQexec(conn, rc == 0 ? "COMMIT" : "ROLLBACK"));
	return rc;
}

static long audit_broken(const struct audit_result *r)
{
	long n = 0;

	for (int i = 0; i < INV__COUNT; i++)
		n += r->inv[i] > 0;
	return n;
}

/* A duration in the shortest of the configuration's units that is exact. */
static void audit_fmt_ms(char *out, size_t size, long ms)
{
	static const struct {
		const char *unit;
		long ms;
	} units[] = { { "d", 86400000 }, { "h", 3600000 }, { "m", 60000 }, { "s", 1000 } };

	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (ms % units[i].ms == 0) {
			snprintf(out, size, "%ld%s", ms / units[i].ms, units[i].unit);
			return;
		}
	snprintf(out, size, "%ldms", ms);
}

static int audit_tenant_cmp(const void *a, const void *b)
{
	return strcmp(((const struct audit_tenant *)a)->name,
	              ((const struct audit_tenant *)b)->name);
}

static void audit_print_text(const struct audit_opts *o, const struct audit_result *r)
{
	char since[32], pending[32], timer[32], lease[32];
	const char *text[BL__COUNT];
	char lines[BL__COUNT][96];
	long broken = audit_broken(r);

	audit_fmt_ms(since, sizeof(since), o->since_ms);
	audit_fmt_ms(pending, sizeof(pending), o->pending_ms);
	audit_fmt_ms(timer, sizeof(timer), o->timer_ms);
	audit_fmt_ms(lease, sizeof(lease), o->lease_ms);
	snprintf(lines[BL_EVENTS_PENDING], sizeof(lines[0]), "events pending for more than %s",
	         pending);
	snprintf(lines[BL_EVENTS_HELD], sizeof(lines[0]), "events held behind a dead one");
	snprintf(lines[BL_EVENTS_DEAD], sizeof(lines[0]), "dead events");
	snprintf(lines[BL_TIMERS_OVERDUE], sizeof(lines[0]), "timers overdue by more than %s",
	         timer);
	snprintf(lines[BL_JOBS_UNREAPED], sizeof(lines[0]),
	         "jobs whose lease ran out more than %s ago, not reaped", lease);
	for (int b = 0; b < BL__COUNT; b++)
		text[b] = lines[b];

	printf("audit: %s%s, keys and workflows created since %s (%s), events checked for "
	       "workflows since %s\n",
	       o->tenant ? "tenant " : "all tenants", o->tenant ? o->tenant : "", r->since, since,
	       r->events_since);
	printf("checked: keys=%ld answers=%ld workflows=%ld\n", r->keys, r->answers, r->workflows);
	for (int i = 0; i < INV__COUNT; i++)
		printf("%-4s %-32s %8ld  %s\n", r->inv[i] ? "FAIL" : "ok", invariants[i].name,
		       r->inv[i], invariants[i].text);
	for (int b = 0; b < BL__COUNT; b++)
		printf("%-4s %-32s %8ld  %s\n", "info", backlog_names[b], r->backlog[b], text[b]);
	for (size_t t = 0; t < r->ntenants; t++) {
		printf("tenant %s:", r->tenants[t].name);
		for (int i = 0; i < INV__COUNT; i++)
			if (r->tenants[t].inv[i] > 0)
				printf(" %s=%ld", invariants[i].name, r->tenants[t].inv[i]);
		printf("\n");
	}
	printf("audit: %ld of %d invariants hold (%.3f s)\n", INV__COUNT - broken, INV__COUNT,
	       r->duration_s);
}

static void audit_print_json(const struct audit_opts *o, const struct audit_result *r)
{
	struct json_object *doc = json_object_new_object(), *obj;
	char dur[32];

	/* json_object_object_add takes ownership: json_object_put(doc) frees
	 * everything. */
	json_object_object_add(doc, "tenant", o->tenant ? json_object_new_string(o->tenant) : NULL);
	json_object_object_add(doc, "now", json_object_new_string(r->now));
	json_object_object_add(doc, "since", json_object_new_string(r->since));
	json_object_object_add(doc, "events_since", json_object_new_string(r->events_since));
	obj = json_object_new_object();
	json_object_object_add(obj, "since_s", json_object_new_double((double)o->since_ms / 1000));
	json_object_object_add(obj, "pending_after_s",
	                       json_object_new_double((double)o->pending_ms / 1000));
	json_object_object_add(obj, "timer_after_s",
	                       json_object_new_double((double)o->timer_ms / 1000));
	json_object_object_add(obj, "lease_after_s",
	                       json_object_new_double((double)o->lease_ms / 1000));
	json_object_object_add(doc, "thresholds", obj);
	obj = json_object_new_object();
	json_object_object_add(obj, "keys", json_object_new_int64(r->keys));
	json_object_object_add(obj, "answers", json_object_new_int64(r->answers));
	json_object_object_add(obj, "workflows", json_object_new_int64(r->workflows));
	json_object_object_add(doc, "checked", obj);
	obj = json_object_new_object();
	for (int i = 0; i < INV__COUNT; i++)
		json_object_object_add(obj, invariants[i].name, json_object_new_int64(r->inv[i]));
	json_object_object_add(doc, "invariants", obj);
	obj = json_object_new_object();
	for (int b = 0; b < BL__COUNT; b++)
		json_object_object_add(obj, backlog_names[b], json_object_new_int64(r->backlog[b]));
	json_object_object_add(doc, "backlog", obj);
	obj = json_object_new_object();
	for (size_t t = 0; t < r->ntenants; t++) {
		struct json_object *one = json_object_new_object();
		for (int i = 0; i < INV__COUNT; i++)
			json_object_object_add(one, invariants[i].name,
			                       json_object_new_int64(r->tenants[t].inv[i]));
		json_object_object_add(obj, r->tenants[t].name, one);
	}
	json_object_object_add(doc, "tenants_broken", obj);
	json_object_object_add(doc, "broken", json_object_new_int64(audit_broken(r)));
	json_object_object_add(doc, "ok", json_object_new_boolean(audit_broken(r) == 0));
	snprintf(dur, sizeof(dur), "%.3f", r->duration_s);
	json_object_object_add(doc, "duration_s", json_object_new_double_s(atof(dur), dur));
	printf("%s\n", json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PLAIN |
	                                                       JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(doc);
}

/*
 * The gauges for node_exporter's textfile collector, written to a
 * temporary file beside path and renamed over it (the collector reads the
 * previous run's file or this one, never half of one; the temporary name
 * does not end in .prom). r NULL: the audit could not run, and only its
 * time and failure are written. Returns 0, or -1 after saying why on
 * stderr.
 */
static int audit_write_textfile(const struct audit_opts *o, const struct audit_result *r)
{
	char tmp[4096], label[96], sep[100];
	struct timeval now;
	FILE *f;
	int n;

	n = snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", o->textfile, (long)getpid());
	if (n < 0 || (size_t)n >= sizeof(tmp)) {
		fprintf(stderr, "idemflow: --textfile path too long\n");
		return -1;
	}
	f = fopen(tmp, "w");
	if (f == NULL) {
		fprintf(stderr, "idemflow: could not write \"%s\": %s\n", tmp, strerror(errno));
		return -1;
	}
	/* Tenant names are [A-Za-z0-9._-]: nothing to escape in a label. */
	snprintf(label, sizeof(label), "%s%s%s", o->tenant ? "{tenant=\"" : "",
	         o->tenant ? o->tenant : "", o->tenant ? "\"}" : "");
	snprintf(sep, sizeof(sep), "%s%s%s", o->tenant ? "tenant=\"" : "",
	         o->tenant ? o->tenant : "", o->tenant ? "\"," : "");
	gettimeofday(&now, NULL);
	fprintf(f,
	        "# HELP idemflow_audit_last_run_timestamp_seconds When the last audit ended.\n"
	        "# TYPE idemflow_audit_last_run_timestamp_seconds gauge\n"
	        "idemflow_audit_last_run_timestamp_seconds%s %ld.%03ld\n"
	        "# HELP idemflow_audit_last_run_success 1 when the last audit ran to its end "
	        "(whatever it found), 0 when it could not.\n"
	        "# TYPE idemflow_audit_last_run_success gauge\n"
	        "idemflow_audit_last_run_success%s %d\n",
	        label, (long)now.tv_sec, (long)now.tv_usec / 1000, label, r != NULL);
	if (r != NULL) {
		fprintf(f,
		        "# HELP idemflow_audit_last_run_duration_seconds How long the last audit "
		        "took.\n"
		        "# TYPE idemflow_audit_last_run_duration_seconds gauge\n"
		        "idemflow_audit_last_run_duration_seconds%s %.3f\n"
		        "# HELP idemflow_audit_window_seconds The window the last audit checked "
		        "(--since).\n"
		        "# TYPE idemflow_audit_window_seconds gauge\n"
		        "idemflow_audit_window_seconds%s %.3f\n"
		        "# HELP idemflow_audit_checked Rows the last audit checked, by kind.\n"
		        "# TYPE idemflow_audit_checked gauge\n"
		        "idemflow_audit_checked{%skind=\"keys\"} %ld\n"
		        "idemflow_audit_checked{%skind=\"answers\"} %ld\n"
		        "idemflow_audit_checked{%skind=\"workflows\"} %ld\n"
		        "# HELP idemflow_audit_violations Rows that break an invariant, by "
		        "invariant: above 0 is damage or a bug.\n"
		        "# TYPE idemflow_audit_violations gauge\n",
		        label, r->duration_s, label, (double)o->since_ms / 1000, sep, r->keys, sep,
		        r->answers, sep, r->workflows);
		for (int i = 0; i < INV__COUNT; i++)
			fprintf(f, "idemflow_audit_violations{%sinvariant=\"%s\"} %ld\n", sep,
			        invariants[i].name, r->inv[i]);
		fprintf(f, "# HELP idemflow_audit_backlog Work late past its threshold, by kind "
		           "(reported, not an invariant).\n"
		           "# TYPE idemflow_audit_backlog gauge\n");
		for (int b = 0; b < BL__COUNT; b++)
			fprintf(f, "idemflow_audit_backlog{%skind=\"%s\"} %ld\n", sep,
			        backlog_names[b], r->backlog[b]);
	}
	if (fflush(f) != 0 || ferror(f)) {
		fprintf(stderr, "idemflow: could not write \"%s\": %s\n", tmp, strerror(errno));
		fclose(f);
		goto fail;
	}
	/* Readable by the collector whatever cron's umask is. */
	fchmod(fileno(f), 0644);
	if (fclose(f) != 0) {
		fprintf(stderr, "idemflow: could not write \"%s\": %s\n", tmp, strerror(errno));
		goto fail;
	}
	if (rename(tmp, o->textfile) < 0) {
		fprintf(stderr, "idemflow: could not rename \"%s\" to \"%s\": %s\n", tmp,
		        o->textfile, strerror(errno));
		goto fail;
	}
	return 0;
fail:
	unlink(tmp);
	return -1;
}

/*
 * --rebuild: every workflow (of one tenant, or all), in batches of
 * REBUILD_BATCH in (tenant_id, id) order, each batch its own REPEATABLE
 * READ READ ONLY transaction (a workflow, its jobs and its events are
 * read at one moment; no snapshot is held across the walk). $1 tenant or
 * NULL, $2 $3 the last (tenant_id, id) of the previous batch, $4 the batch
 * size.
 */
#define REBUILD_BATCH 200
#define REBUILD_WORKFLOWS                                                                          \
	"SELECT w.tenant_id, w.id, w.state, w.step, w.last_seq, t.name\n"                          \
	"  FROM workflows w\n"                                                                     \
	"  JOIN tenants t ON t.id = w.tenant_id\n"                                                 \
	" WHERE ($1::bigint IS NULL OR w.tenant_id = $1::bigint)\n"                                \
	"   AND (w.tenant_id, w.id) > ($2::bigint, $3::uuid)\n"                                    \
	" ORDER BY w.tenant_id, w.id\n"                                                            \
	" LIMIT $4::int\n"

/* The batch's jobs and events: $1 the tenant ids, $2 the workflow ids
 * (one pair per workflow), in the workflows' order. */
#define REBUILD_JOBS                                                                               \
	"SELECT j.tenant_id, j.workflow_id, j.step, j.state\n"                                     \
	"  FROM jobs j\n"                                                                          \
	"  JOIN unnest($1::bigint[], $2::uuid[]) AS b(tenant_id, id)\n"                            \
	"    ON j.tenant_id = b.tenant_id AND j.workflow_id = b.id\n"                              \
	" ORDER BY j.tenant_id, j.workflow_id, j.step\n"
#define REBUILD_EVENTS                                                                             \
	"SELECT o.tenant_id, o.workflow_id, o.seq, o.type, (o.payload::jsonb -> 'data')::text\n"   \
	"  FROM outbox o\n"                                                                        \
	"  JOIN unnest($1::bigint[], $2::uuid[]) AS b(tenant_id, id)\n"                            \
	"    ON o.workflow_id = b.id AND o.tenant_id = b.tenant_id\n"                              \
	" ORDER BY o.tenant_id, o.workflow_id, o.seq\n"

/* What the rebuild found. */
struct rebuild_counts {
	long workflows, checked, skipped, differences, events;
};

/* One difference's line: the workflow and its tenant, set per workflow. */
struct rebuild_line {
	const char *tenant, *id;
	long *differences;
};

static void rebuild_print(void *arg, const char *field, const char *stored, const char *rebuilt)
{
	const struct rebuild_line *l = arg;

	printf("DIFF tenant=%s workflow=%s field=\"%s\" stored=%s rebuilt=%s\n", l->tenant, l->id,
	       field, stored, rebuilt);
}

/* (tenant, id) of row i of res against the workflow (tenant, id):
 * <0, 0, >0. Workflow ids compare as their text: the order of uuid. */
static int rebuild_order(const PGresult *res, int i, long long tenant, const char *id)
{
	long long t = atoll(PQgetvalue(res, i, 0));

	if (t != tenant)
		return t < tenant ? -1 : 1;
	return strcmp(PQgetvalue(res, i, 1), id);
}

/*
 * One workflow, row w of wf, its jobs and events from *ji and *ei on
 * (advanced past them). A history that does not start at seq 1 or has a
 * gap (pruned) is skipped and counted.
 */
static void rebuild_one(const PGresult *wf, int w, const PGresult *jobs, int *ji,
                        const PGresult *events, int *ei, struct rebuild_counts *n)
{
	long long tenant = atoll(PQgetvalue(wf, w, 0));
	const char *id = PQgetvalue(wf, w, 1);
	struct rebuild_job stored[REBUILD_MAX_JOBS];
	struct rebuild_line line = { PQgetvalue(wf, w, 5), id, &n->differences };
	struct rebuild r;
	char why[160];
	int njobs = 0, first = *ei, last_seq = atoi(PQgetvalue(wf, w, 4)), whole = 1, seq = 0;

	n->workflows++;
	while (*ji < PQntuples(jobs) && rebuild_order(jobs, *ji, tenant, id) < 0)
		(*ji)++;
	for (; *ji < PQntuples(jobs) && rebuild_order(jobs, *ji, tenant, id) == 0; (*ji)++)
		if (njobs < REBUILD_MAX_JOBS) {
			stored[njobs].step = atoi(PQgetvalue(jobs, *ji, 2));
			snprintf(stored[njobs].state, sizeof(stored[0].state), "%s",
			         PQgetvalue(jobs, *ji, 3));
			njobs++;
		}
	while (*ei < PQntuples(events) && rebuild_order(events, *ei, tenant, id) < 0)
		(*ei)++;
	first = *ei;
	for (; *ei < PQntuples(events) && rebuild_order(events, *ei, tenant, id) == 0; (*ei)++)
		whole &= atoi(PQgetvalue(events, *ei, 2)) == ++seq;
	if (!whole || seq == 0) {
		n->skipped++;
		return;
	}
	n->checked++;
	rebuild_init(&r);
	for (int i = first; i < *ei; i++) {
		struct json_object *data = json_tokener_parse(PQgetvalue(events, i, 4));
		int rc = rebuild_apply(&r, atoi(PQgetvalue(events, i, 2)), PQgetvalue(events, i, 3),
		                       data, why, sizeof(why));

		json_object_put(data);
		n->events++;
		if (rc < 0) {
			printf("DIFF tenant=%s workflow=%s field=\"history\" stored=event-%s "
			       "rebuilt=\"%s\"\n",
			       line.tenant, id, PQgetvalue(events, i, 2), why);
			n->differences++;
			return;
		}
	}
	if (seq != last_seq) {
		char a[16], b[16];
		snprintf(a, sizeof(a), "%d", last_seq);
		snprintf(b, sizeof(b), "%d", seq);
		rebuild_print(&line, "last_seq", a, b);
		n->differences++;
	}
	n->differences += rebuild_compare(&r, PQgetvalue(wf, w, 2), atoi(PQgetvalue(wf, w, 3)),
	                                  stored, njobs, rebuild_print, &line);
}

/* The walk. Returns 0, or -1 with e; n holds what was done before. */
static int audit_rebuild_run(PGconn *conn, const char *tenant_id, struct rebuild_counts *n,
                             struct err *e)
{
	char after_tenant[24] = "0", after_id[40] = "00000000-0000-0000-0000-000000000000",
	     batch[16];
	const char *tid = *tenant_id ? tenant_id : NULL;

	snprintf(batch, sizeof(batch), "%d", REBUILD_BATCH);
	for (;;) {
		PGresult *wf = NULL, *jobs = NULL, *events = NULL, *res;
		char *tenants = NULL, *ids = NULL;
		size_t tl = 0, il = 0;
		FILE *ft = NULL, *fi = NULL;
		int rows = 0, rc = -1, ji = 0, ei = 0;

		res = db_exec(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL, e);
		if (res == NULL)
			return -1;
		PQclear(res);
		const char *pw[4] = { tid, after_tenant, after_id, batch };
		wf = db_exec(conn, REBUILD_WORKFLOWS, 4, pw, e);
		if (wf == NULL)
			goto next;
		rows = PQntuples(wf);
		/* The batch's ids as two arrays, {1,1,2} and {a,b,c}. */
		ft = open_memstream(&tenants, &tl);
		fi = open_memstream(&ids, &il);
		if (ft == NULL || fi == NULL) {
			err_set(e, ERR_INTERNAL, "out of memory");
			goto next;
		}
		fputc('{', ft);
		fputc('{', fi);
		for (int i = 0; i < rows; i++) {
			fprintf(ft, "%s%s", i ? "," : "", PQgetvalue(wf, i, 0));
			fprintf(fi, "%s%s", i ? "," : "", PQgetvalue(wf, i, 1));
		}
		fputc('}', ft);
		fputc('}', fi);
		fclose(ft);
		fclose(fi);
		ft = fi = NULL;
		const char *pb[2] = { tenants, ids };
		jobs = db_exec(conn, REBUILD_JOBS, 2, pb, e);
		if (jobs == NULL)
			goto next;
		events = db_exec(conn, REBUILD_EVENTS, 2, pb, e);
		if (events == NULL)
			goto next;
		for (int i = 0; i < rows; i++)
			rebuild_one(wf, i, jobs, &ji, events, &ei, n);
		if (rows > 0) {
			snprintf(after_tenant, sizeof(after_tenant), "%s",
			         PQgetvalue(wf, rows - 1, 0));
			snprintf(after_id, sizeof(after_id), "%s", PQgetvalue(wf, rows - 1, 1));
		}
		rc = 0;
	next:
		if (ft != NULL)
			fclose(ft);
		if (fi != NULL)
			fclose(fi);
		free(tenants);
		free(ids);
		PQclear(wf);
		PQclear(jobs);
		PQclear(events);
		/* Read only: ending it either way changes nothing. */
		PQclear(PQexec(conn, rc == 0 ? "COMMIT" : "ROLLBACK"));
		if (rc < 0)
			return -1;
		if (rows < REBUILD_BATCH)
			return 0;
	}
}

/*
 * audit --rebuild [--tenant NAME]: each workflow's state, step and job
 * states rebuilt from its events alone (rebuild.c) and compared with its
 * rows; one DIFF line per difference, then a summary. Exits EX_DATAERR
 * (65) on any difference, as a broken invariant does.
 */
static int audit_rebuild(PGconn *conn, const struct audit_opts *o, const char *tenant_id)
{
	struct rebuild_counts n = { 0 };
	struct timespec t0, t1;
	struct err e;
	int failed;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	failed = audit_rebuild_run(conn, tenant_id, &n, &e) < 0;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("rebuild: %s%s workflows=%ld checked=%ld skipped=%ld events=%ld differences=%ld "
	       "duration_s=%.3f\n",
	       o->tenant ? "tenant=" : "all tenants", o->tenant ? o->tenant : "", n.workflows,
	       n.checked, n.skipped, n.events, n.differences,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	if (failed)
		return cli_db_fail(&e);
	return n.differences > 0 ? EX_DATAERR : EX_OK;
}

int cli_audit(PGconn *conn, struct conf *c, int argc, char **argv)
{
	struct audit_opts o = { .since_ms = 24L * 3600 * 1000,
		                .pending_ms = 10L * 60 * 1000,
		                .timer_ms = 5L * 60 * 1000,
		                .lease_ms = 10L * 60 * 1000 };
	struct audit_result r;
	char tenant_id[24] = "";
	struct timespec t0, t1;
	PGresult *res;
	struct err e;
	int rc, ran = 0;

	memset(&r, 0, sizeof(r));
	rc = audit_options(c, &o, argc, argv);
	if (rc != EX_OK)
		return rc;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (o.tenant != NULL) {
		const char *pt[1] = { o.tenant };
		res = db_exec(conn,
		              "SELECT id\n"
		              "  FROM tenants\n"
		              " WHERE name = $1\n",
		              1, pt, &e);
		if (res == NULL) {
			rc = cli_db_fail(&e);
			goto out;
		}
		if (PQntuples(res) == 0) {
			PQclear(res);
			fprintf(stderr, "idemflow: no tenant named \"%s\"\n", o.tenant);
			rc = EX_DATAERR;
			goto out;
		}
		snprintf(tenant_id, sizeof(tenant_id), "%s", PQgetvalue(res, 0, 0));
		PQclear(res);
	}
	if (o.rebuild) {
		rc = audit_rebuild(conn, &o, tenant_id);
		goto out;
	}
	if (audit_run(conn, c, &o, tenant_id, &r, &e) < 0) {
		rc = cli_db_fail(&e);
		goto out;
	}
	ran = 1;
	/* The tenants by name, whichever statement found them broken. */
	if (r.ntenants > 1)
		qsort(r.tenants, r.ntenants, sizeof(r.tenants[0]), audit_tenant_cmp);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	r.duration_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	if (o.json)
		audit_print_json(&o, &r);
	else
		audit_print_text(&o, &r);
	rc = audit_broken(&r) > 0 ? EX_DATAERR : EX_OK;
out:
	/* A textfile that cannot be written fails the run: the gauges would
	 * go stale without a word. */
	if (o.textfile != NULL && audit_write_textfile(&o, ran ? &r : NULL) < 0 && rc == EX_OK)
		rc = EX_CANTCREAT;
	free(r.tenants);
	return rc;
}
