/*
 * test_roles.c - the server and the dispatcher run as database roles that
 * have only the privileges their statements use (sql/roles.sql), while the
 * schema stays with the owner that migrated it (here the harness's
 * superuser).
 *
 * Proves: roles.sql runs again and again; every table has a decision; an
 * idemflow-fcgi logged in as a member of idemflow_server serves every
 * statement of app/server/queries.c (creates, replays, conflicts, expired keys,
 * unkeyed creates, reads, readiness, metrics, key counts, NOTIFY) and
 * every route of app/server/route.h (heartbeats, incidents and resumes,
 * messages by id and by business key, sleep and wait-timeout steps, a
 * saga's compensation through incident and resume; each route's 2xx seen
 * in /metrics) without one permission error; idemflow reap and prune as a
 * member of idemflow_maintenance hand back an expired lease, fire a sleep,
 * time out three waits (one beginning a compensation), drop a cancelled
 * workflow's
 * timer and delete an expired message, and idemflow audit as that role
 * reads one tenant and every tenant; idemflow-dispatch as a member of
 * idemflow_dispatcher delivers; and neither role can change the schema,
 * the tenants or the tokens. Roles belong to the whole cluster, so the
 * tests run one at a time.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "server/route.h"

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define COLLECTION "/v1/workflows"
#define JSON_CT    "Content-Type: application/json"
/* The login roles' password: the stack lets other roles in by password. */
#define ROLE_PASSWORD "roles-test-pw"

/* Run a program with argv, stdout and stderr to log; its exit status. */
static int run(const char *const *argv, const char *log)
{
	int status;
	pid_t pid = tstack_spawn(argv, log);

	cr_assert_eq(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void stack_path(char *out, size_t size, const char *name)
{
	snprintf(out, size, "%s/roles-%s", tstack_env("IDEMFLOW_STACK_DIR"), name);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *text = NULL;
	size_t len = 0;
	char buf[8192];
	size_t n;

	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	FILE *m = open_memstream(&text, &len);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, m);
	fclose(m);
	fclose(f);
	return text;
}

/* psql -f sql/roles.sql as the owner. */
static void roles_apply(void)
{
	const char *srcdir = getenv("top_srcdir");
	char psql[512], file[1024], log[512];
	int rc;

	snprintf(psql, sizeof(psql), "%s/psql", tstack_env("IDEMFLOW_PG_BINDIR"));
	snprintf(file, sizeof(file), "%s/sql/roles.sql", srcdir && *srcdir ? srcdir : ".");
	stack_path(log, sizeof(log), "psql.log");
	const char *argv[] = {
		psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", tstack_env("DATABASE_URL"),
		"-f", file, NULL
	};
	rc = run(argv, log);
	char *out = slurp(log);
	cr_assert_eq(rc, 0, "psql -f %s exited %d: %s", file, rc, out);
	free(out);
	/* The login roles the programs use, members of the groups. */
	tstack_exec(tstack_db(),
	            "DO $$ BEGIN"
	            " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idemflow_web')"
	            " THEN CREATE ROLE idemflow_web LOGIN IN ROLE idemflow_server; END IF;"
	            " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idemflow_cron')"
	            " THEN CREATE ROLE idemflow_cron LOGIN IN ROLE idemflow_dispatcher;"
	            " END IF;"
	            " IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idemflow_maint')"
	            " THEN CREATE ROLE idemflow_maint LOGIN IN ROLE idemflow_maintenance;"
	            " END IF; END $$");
	tstack_exec(tstack_db(), "ALTER ROLE idemflow_maint PASSWORD '" ROLE_PASSWORD "'");
	/* Other roles than the stack's superuser log in by password. */
	tstack_exec(tstack_db(), "ALTER ROLE idemflow_web PASSWORD '" ROLE_PASSWORD "'");
	tstack_exec(tstack_db(), "ALTER ROLE idemflow_cron PASSWORD '" ROLE_PASSWORD "'");
}

/* $DATABASE_URL as another user (the last keyword wins in libpq). */
static void conninfo_as(char *out, size_t size, const char *user)
{
	snprintf(out, size, "%s user=%s password=" ROLE_PASSWORD, tstack_env("DATABASE_URL"), user);
}

TestSuite(roles, .init = roles_apply, .timeout = 90);

Test(roles, roles_sql_runs_again_and_every_table_has_a_decision)
{
	char *missing;

	/* .init ran it once already; twice more changes nothing. */
	roles_apply();
	roles_apply();
	/* A table neither group may use must be listed here, on purpose. */
	missing =
	    tstack_text("SELECT string_agg(c.relname, ', ' ORDER BY c.relname) FROM pg_class c"
	                "  JOIN pg_namespace n ON n.oid = c.relnamespace"
	                " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
	                "   AND NOT EXISTS (SELECT 1 FROM unnest(ARRAY['idemflow_server',"
	                "                   'idemflow_dispatcher']) AS g(r)"
	                "                    WHERE has_table_privilege(g.r, c.oid,"
	                "                            'SELECT, INSERT, UPDATE, DELETE')"
	                "                       OR has_any_column_privilege(g.r, c.oid,"
	                "                            'SELECT, INSERT, UPDATE'))");
	cr_assert_null(missing, "no grant in sql/roles.sql for: %s", missing);

	/* The groups own nothing and may create nothing. */
	cr_assert_eq(tstack_count("SELECT count(*) FROM pg_roles WHERE rolname IN"
	                          " ('idemflow_server', 'idemflow_dispatcher') AND NOT rolcanlogin"
	                          " AND NOT rolsuper AND NOT rolcreaterole AND NOT rolcreatedb"),
	             2);
	cr_assert_eq(tstack_count("SELECT count(*) FROM pg_class c JOIN pg_roles r"
	                          "  ON r.oid = c.relowner WHERE r.rolname IN"
	                          " ('idemflow_server', 'idemflow_dispatcher', 'idemflow_web',"
	                          "  'idemflow_cron')"),
	             0);
	for (int i = 0; i < 2; i++) {
		const char *g = i ? "idemflow_dispatcher" : "idemflow_server";
		char *v =
		    tstack_text("SELECT has_schema_privilege($1, 'public', 'CREATE')::text", g);
		cr_assert_str_eq(v, "false", "%s may create in schema public", g);
		free(v);
	}
}

/* A server of our own, logged in as idemflow_web. */
static struct tstack_pool own;

static void own_stop(void)
{
	tstack_pool_kill(&own, SIGTERM);
}

static void own_start(void)
{
	char db[1024];

	conninfo_as(db, sizeof(db), "idemflow_web");
	tstack_pool_paths(&own, "roles");
	/* optional: unkeyed creates too, so every create statement runs. */
	const char *argv[] = { tstack_env("IDEMFLOW_FCGI"),
		               "--config",
		               tstack_env("IDEMFLOW_CONF"),
		               "--db",
		               db,
		               "--listen",
		               own.sock,
		               "--pid-file",
		               own.pidfile,
		               "--workers",
		               "1",
		               "--idempotency-key",
		               "optional",
		               NULL };
	tstack_pool_run(&own, argv, 10000);
}

/* The worker connects after the fork, a moment after the socket: wait
 * until one is logged in as idemflow_web. */
static void own_wait_worker(void)
{
	double deadline = tstack_now() + 10;

	while (tstack_count("SELECT count(*) FROM pg_stat_activity WHERE usename = 'idemflow_web'"
	                    " AND application_name LIKE '%-worker-%'") != 1) {
		cr_assert(tstack_now() < deadline, "no worker logged in as idemflow_web; see %s",
		          own.log);
		tstack_sleep_ms(20);
	}
}

static struct http_response *req(const char *method, const char *path, const char *auth,
                                 const char *key, const char *body)
{
	char kh[160];
	const char *h[4] = { auth, NULL, NULL, NULL };
	size_t n = auth ? 1 : 0;
	struct http_response *r;

	if (body != NULL)
		h[n++] = JSON_CT;
	if (key != NULL) {
		snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
		h[n++] = kh;
	}
	r = http_fcgi_request(own.sock, method, path, h, body, body ? strlen(body) : 0);
	cr_assert_not_null(r, "%s %s: %s", method, path, http_error());
	return r;
}

static void expect_status(struct http_response *r, int status, const char *what)
{
	cr_assert_eq(r->status, status, "%s: %d %s; see %s", what, r->status, r->body, own.log);
	http_response_free(r);
}

Test(roles, the_server_runs_every_statement_as_idemflow_server, .fini = own_stop)
{
	static const char a[] = "{\"type\":\"roles\",\"input\":{\"a\":1}}";
	static const char b[] = "{\"type\":\"roles\",\"input\":{\"a\":2}}";
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], path[80], out[256], *id, *log;
	PGconn *listener;
	double deadline;

	own_start();
	own_wait_worker();
	tstack_tenant_create(&t, "roles");
	listener = tstack_db_connect();
	PQclear(PQexec(listener, "LISTEN idemflow_outbox"));

	tstack_key(key, sizeof(key), "roles");
	r = req("POST", COLLECTION, t.auth, key, a);
	cr_assert_eq(r->status, 201, "create: %d %s; see %s", r->status, r->body, own.log);
	id = tstack_json(r->body, "{id}");
	http_response_free(r);
	expect_status(req("POST", COLLECTION, t.auth, key, a), 201, "replay");
	expect_status(req("POST", COLLECTION, t.auth, key, b), 409, "conflict");
	snprintf(path, sizeof(path), COLLECTION "/%s", id);
	expect_status(req("GET", path, t.auth, NULL, NULL), 200, "read");
	expect_status(req("POST", COLLECTION, t.auth, NULL, a), 201, "unkeyed create");

	/* The replay and the conflict are counted, a second later at most:
	 * before the takeover below, which deletes the key with its counts
	 * (a flush after it would find the key gone). */
	deadline = tstack_now() + 5;
	while (tstack_count("SELECT count(*) FROM idempotency_key_stats WHERE tenant_id = $1",
	                    t.id_text) == 0) {
		cr_assert(tstack_now() < deadline, "no key counts stored; see %s", own.log);
		tstack_sleep_ms(100);
	}

	/* A key past its TTL is deleted with its counts and taken over (a
	 * new token: the worker holds the row it read for the old one). */
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET expires_at = now() - interval '1 second'"
	            " WHERE tenant_id = $1 AND key = $2",
	            t.id_text, key);
	tstack_tenant_retoken(&t);
	expect_status(req("POST", COLLECTION, t.auth, key, b), 201, "expired key taken over");
	/* The tenant's own TTL, read by the create statement. */
	cr_assert_eq(tstack_cli(out, sizeof(out), "tenant", "set-ttl", t.name, "36h", NULL), 0);
	tstack_key(key, sizeof(key), "ttl");
	expect_status(req("POST", COLLECTION, t.auth, key, a), 201, "create with a tenant TTL");
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"
	                          " AND key = $2 AND expires_at - created_at = interval '36 hours'",
	                          t.id_text, key),
	             1);

	expect_status(req("GET", "/readyz", NULL, NULL, NULL), 200, "readyz");
	r = req("GET", "/metrics", NULL, NULL, NULL);
	cr_assert_eq(r->status, 200, "metrics: %d %s", r->status, r->body);
	cr_assert_not_null(strstr(r->body, "\nidemflow_db_up 1\n"), "metrics: %s", r->body);
	http_response_free(r);

	/* And the worker's NOTIFY after its creates reached the listener. */
	deadline = tstack_now() + 3;
	PGnotify *n = NULL;
	while (n == NULL && tstack_now() < deadline) {
		PQconsumeInput(listener);
		n = PQnotifies(listener);
		if (n == NULL)
			tstack_sleep_ms(20);
	}
	cr_assert_not_null(n, "no NOTIFY from the worker");
	PQfreemem(n);
	PQfinish(listener);

	tstack_expect_counts(&t, 4, 4, 2);

	/* Workflows that run: steps, business key, jobs, messages, cancel,
	 * history and list, keyed and not, in a tenant of their own. */
	struct tstack_tenant t2;
	char *wf, jpath[160];
	tstack_tenant_create(&t2, "roles-run");
	tstack_key(key, sizeof(key), "run");
	r = req("POST", COLLECTION, t2.auth, key,
	        "{\"type\":\"run\",\"business_key\":\"R-1\",\"steps\":["
	        "{\"name\":\"a\",\"job_type\":\"ra\",\"retries\":1},"
	        "{\"name\":\"b\",\"wait_for\":\"go\"},{\"name\":\"c\",\"job_type\":\"rc\"}]}");
	cr_assert_eq(r->status, 201, "create with steps: %d %s; see %s", r->status, r->body,
	             own.log);
	wf = tstack_json(r->body, "{id}");
	http_response_free(r);
	tstack_key(key, sizeof(key), "act");
	expect_status(req("POST", "/v1/jobs/activate", t2.auth, key,
	                  "{\"job_type\":\"ra\",\"worker\":\"w\"}"),
	              200, "keyed activation");
	snprintf(jpath, sizeof(jpath), "/v1/jobs/%s.s1/fail", wf);
	expect_status(req("POST", jpath, t2.auth, NULL, "{\"worker\":\"w\",\"error\":\"e\"}"), 200,
	              "fail with a retry left");
	expect_status(req("POST", "/v1/jobs/activate", t2.auth, NULL,
	                  "{\"job_type\":\"ra\",\"worker\":\"w\"}"),
	              200, "activation");
	snprintf(jpath, sizeof(jpath), "/v1/jobs/%s.s1/complete", wf);
	expect_status(req("POST", jpath, t2.auth, NULL, "{\"worker\":\"w\"}"), 200, "complete");
	snprintf(path, sizeof(path), COLLECTION "/%s/messages", wf);
	expect_status(req("POST", path, t2.auth, NULL, "{\"message_id\":\"m1\",\"name\":\"go\"}"),
	              200, "message");
	snprintf(path, sizeof(path), COLLECTION "/%s/transitions", wf);
	expect_status(req("POST", path, t2.auth, NULL, "{\"to\":\"cancelled\"}"), 200, "cancel");
	snprintf(path, sizeof(path), COLLECTION "/%s/events", wf);
	expect_status(req("GET", path, t2.auth, NULL, NULL), 200, "events");
	expect_status(req("GET", COLLECTION "?state=cancelled", t2.auth, NULL, NULL), 200, "list");
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1", wf), 6,
	             "created, started, job.failed, job.completed x2, workflow.cancelled and "
	             "nothing else");
	free(wf);
	cr_assert_eq(tstack_cli(out, sizeof(out), "reap", NULL), 0, "reap: %s",
	             tstack_cli_stderr());

	log = slurp(own.log);
	cr_assert_null(strstr(log, "permission denied"), "%s", log);
	cr_assert_null(strstr(log, "level=error"), "%s", log);
	free(log);
	free(id);
}

Test(roles, the_dispatcher_delivers_as_idemflow_dispatcher)
{
	struct tstack_tenant t;
	char db[1024], log[512], *text;
	int rc;

	tstack_tenant_create(&t, "dispatch");
	/* Two events to deliver, written as the owner. */
	for (int i = 0; i < 2; i++)
		tstack_exec(
		    tstack_db(),
		    "WITH w AS (INSERT INTO workflows (tenant_id, id, type, input, created_at,"
		    "  updated_at) VALUES ($1, gen_random_uuid(), 'roles', '{}', now(), now())"
		    "  RETURNING tenant_id, id)"
		    " INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
		    " SELECT id || '.1', tenant_id, id, 1, 'workflow.created', '{}' FROM w",
		    t.id_text);
	conninfo_as(db, sizeof(db), "idemflow_cron");
	stack_path(log, sizeof(log), "dispatch.log");
	const char *argv[] = { tstack_env("IDEMFLOW_DISPATCH"),
		               "--config",
		               tstack_env("IDEMFLOW_CONF"),
		               "--db",
		               db,
		               "--once",
		               "--sink",
		               "exec",
		               "--exec",
		               "cat >/dev/null",
		               NULL };
	rc = run(argv, log);
	text = slurp(log);
	cr_assert_eq(rc, 0, "idemflow-dispatch exited %d: %s", rc, text);
	cr_assert_null(strstr(text, "permission denied"), "%s", text);
	free(text);
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1"
	                          " AND published_at IS NOT NULL AND attempts = 1",
	                          t.id_text),
	             2);

	/* A tenant endpoint nobody listens at (port 1): the delivery, its
	 * attempt, the endpoint's health and delivery.exhausted in the
	 * outbox, all written as the dispatcher. */
	tstack_exec(tstack_db(),
	            "INSERT INTO endpoints (tenant_id, id, url, secret) VALUES ($1,"
	            " gen_random_uuid(), 'http://127.0.0.1:1/hook',"
	            " 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')",
	            t.id_text);
	tstack_exec(tstack_db(),
	            "WITH w AS (INSERT INTO workflows (tenant_id, id, type, input, created_at,"
	            "  updated_at) VALUES ($1, gen_random_uuid(), 'roles', '{}', now(), now())"
	            "  RETURNING tenant_id, id)"
	            " INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	            " SELECT id || '.1', tenant_id, id, 1, 'workflow.created', '{}' FROM w",
	            t.id_text);
	const char *argv2[] = { tstack_env("IDEMFLOW_DISPATCH"),
		                "--config",
		                tstack_env("IDEMFLOW_CONF"),
		                "--db",
		                db,
		                "--once",
		                "--max-attempts",
		                "1",
		                "--sink",
		                "exec",
		                "--exec",
		                "cat >/dev/null",
		                NULL };
	rc = run(argv2, log);
	text = slurp(log);
	cr_assert_eq(rc, 0, "idemflow-dispatch exited %d: %s", rc, text);
	cr_assert_null(strstr(text, "permission denied"), "%s", text);
	free(text);
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries d JOIN delivery_attempts a"
	                          " USING (tenant_id, endpoint_id, workflow_id, seq)"
	                          " JOIN endpoints e ON e.tenant_id = d.tenant_id"
	                          "  AND e.id = d.endpoint_id"
	                          " WHERE d.tenant_id = $1 AND d.state = 'dead'"
	                          "   AND a.outcome = 'connect' AND e.failures = 1",
	                          t.id_text),
	             1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1"
	                          " AND type = 'delivery.exhausted' AND published_at IS NOT NULL",
	                          t.id_text),
	             1);
}

/*
 * idemflow ARGS... (NULL-terminated) as idemflow_maint, the role of the
 * cron jobs' prune, reap and audit; its exit status, and its output
 * (stdout and stderr) in out. cli_as_maint: one word.
 */
static int cli_as_maint_args(char *out, size_t outsz, const char *const *args)
{
	char db[1024], log[512], *text;
	const char *argv[16];
	int rc, n = 0;

	conninfo_as(db, sizeof(db), "idemflow_maint");
	stack_path(log, sizeof(log), args[0]);
	argv[n++] = tstack_env("IDEMFLOW_CLI");
	argv[n++] = "--config";
	argv[n++] = tstack_env("IDEMFLOW_CONF");
	argv[n++] = "--db";
	argv[n++] = db;
	for (size_t i = 0; args[i] != NULL && n < 15; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	rc = run(argv, log);
	text = slurp(log);
	snprintf(out, outsz, "%s", text);
	free(text);
	return rc;
}

static int cli_as_maint(char *out, size_t outsz, const char *cmd)
{
	const char *args[] = { cmd, NULL };

	return cli_as_maint_args(out, outsz, args);
}

/* Create a workflow as t through our own server; its id. */
static char *create_as_server(const struct tstack_tenant *t, const char *body)
{
	struct http_response *r = req("POST", COLLECTION, t->auth, NULL, body);
	char *id;

	cr_assert_eq(r->status, 201, "create %s: %d %s; see %s", body, r->status, r->body, own.log);
	id = tstack_json(r->body, "{id}");
	http_response_free(r);
	return id;
}

static void expect_wf(const char *wf, const char *state_step)
{
	char *v = tstack_text("SELECT state || '/' || step FROM workflows WHERE id = $1", wf);

	cr_assert_str_eq(v, state_step, "workflow %s", wf);
	free(v);
}

/* The workflow's event types in order, comma-separated. */
static void expect_events_of(const char *wf, const char *types)
{
	char *v = tstack_text("SELECT string_agg(type, ',' ORDER BY seq) FROM outbox"
	                      " WHERE workflow_id = $1",
	                      wf);

	cr_assert_str_eq(v, types, "events of %s", wf);
	free(v);
}

/*
 * Every route of app/server/route.h answered with a 2xx by our own
 * server, by its /metrics: a route added later without a request here
 * fails this test.
 */
static void expect_every_route_served(void)
{
	struct http_response *r = req("GET", "/metrics", NULL, NULL, NULL);

	cr_assert_eq(r->status, 200, "metrics: %d %s", r->status, r->body);
	for (int i = 0; i < ROUTE_OTHER; i++) {
		char series[200];
		const char *p = r->body;
		int served = 0;

		snprintf(series, sizeof(series),
		         "\nidemflow_requests_total{route=\"%s\",status=\"2",
		         route_name((enum route)i));
		while ((p = strstr(p, series)) != NULL) {
			served = 1;
			p++;
		}
		cr_assert(served, "no 2xx answer on %s as idemflow_server",
		          route_name((enum route)i));
	}
	http_response_free(r);
}

/*
 * Every route, as the roles: besides the first test's, a heartbeat (keyed
 * and not), an incident and its resume, POST /v1/messages (correlated,
 * kept, taken by a create, expired), sleep and wait-timeout steps written
 * by the server, /healthz, /status and /v1/openapi.json, each route
 * checked by /metrics; then the reaper and prune as idemflow_maint, with
 * work to do: a lease that ran out, a sleep due that goes on into a wait
 * whose kept message is there, two wait timeouts due (one going on at its
 * on_timeout step, one failing the workflow), the timer of a cancelled
 * workflow, an expired kept message.
 */
Test(roles, every_route_timers_and_the_reaper_run_as_their_roles, .fini = own_stop)
{
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], path[160], out[512], aout[8192], *hb, *inc, *paid, *kept, *nap, *late, *lost,
	    *gone, *saga, *undo, *log;

	own_start();
	own_wait_worker();
	tstack_tenant_create(&t, "roles-more");

	expect_status(req("GET", "/healthz", NULL, NULL, NULL), 204, "healthz");
	expect_status(req("GET", "/readyz", NULL, NULL, NULL), 200, "readyz");
	expect_status(req("GET", "/metrics", NULL, NULL, NULL), 200, "metrics");
	expect_status(req("GET", "/status", NULL, NULL, NULL), 200, "status");
	expect_status(req("GET", "/v1/openapi.json", NULL, NULL, NULL), 200, "openapi");

	/* A heartbeat, plain and keyed; then its lease runs out, for reap. */
	hb = create_as_server(&t,
	                      "{\"type\":\"hb\",\"steps\":[{\"name\":\"a\",\"job_type\":\"rh\"}]}");
	expect_status(req("POST", "/v1/jobs/activate", t.auth, NULL,
	                  "{\"job_type\":\"rh\",\"worker\":\"w\"}"),
	              200, "activation");
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/heartbeat", hb);
	expect_status(req("POST", path, t.auth, NULL,
	                  "{\"worker\":\"w\",\"lease_seconds\":60,\"progress\":{\"done\":1}}"),
	              200, "heartbeat");
	tstack_key(key, sizeof(key), "hb");
	expect_status(req("POST", path, t.auth, key,
	                  "{\"worker\":\"w\",\"lease_seconds\":60,\"progress\":{\"done\":2}}"),
	              200, "keyed heartbeat");
	expect_status(req("POST", path, t.auth, key,
	                  "{\"worker\":\"w\",\"lease_seconds\":60,\"progress\":{\"done\":2}}"),
	              200, "heartbeat replayed");
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step = 1"
	                          " AND state = 'active' AND progress::jsonb = '{\"done\":2}'"
	                          " AND heartbeat_at IS NOT NULL",
	                          hb),
	             1);
	tstack_exec(tstack_db(),
	            "UPDATE jobs SET due_at = now() - interval '1 second' WHERE workflow_id = $1",
	            hb);

	/* An incident, listed, and resumed (keyed, and replayed). */
	inc =
	    create_as_server(&t, "{\"type\":\"inc\",\"steps\":[{\"name\":\"a\",\"job_type\":\"ri\","
	                         "\"retries\":0,\"on_failure\":\"incident\"}]}");
	expect_status(req("POST", "/v1/jobs/activate", t.auth, NULL,
	                  "{\"job_type\":\"ri\",\"worker\":\"w\"}"),
	              200, "activation");
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/fail", inc);
	expect_status(req("POST", path, t.auth, NULL, "{\"worker\":\"w\",\"error\":\"e\"}"), 200,
	              "fail into an incident");
	expect_wf(inc, "incident/1");
	expect_status(req("GET", COLLECTION "?state=incident", t.auth, NULL, NULL), 200,
	              "incidents listed");
	snprintf(path, sizeof(path), COLLECTION "/%s/resume", inc);
	tstack_key(key, sizeof(key), "resume");
	expect_status(req("POST", path, t.auth, key, "{\"retries\":1}"), 200, "resume");
	expect_status(req("POST", path, t.auth, key, "{\"retries\":1}"), 200, "resume replayed");
	expect_wf(inc, "running/1");
	expect_events_of(inc, "workflow.created,workflow.started,job.failed,workflow.incident,"
	                      "workflow.resumed");
	/* The resumed job completes: a message by id, the history, a read. */
	expect_status(req("POST", "/v1/jobs/activate", t.auth, NULL,
	                  "{\"job_type\":\"ri\",\"worker\":\"w\"}"),
	              200, "activation");
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", inc);
	expect_status(req("POST", path, t.auth, NULL, "{\"worker\":\"w\"}"), 200, "complete");
	expect_wf(inc, "completed/1");
	snprintf(path, sizeof(path), COLLECTION "/%s/events", inc);
	expect_status(req("GET", path, t.auth, NULL, NULL), 200, "events");
	snprintf(path, sizeof(path), COLLECTION "/%s", inc);
	expect_status(req("GET", path, t.auth, NULL, NULL), 200, "read");

	/* A saga (sql/017_compensation.sql): step b fails, a is undone; the
	 * undo fails into an incident, a cancel is refused, a resume and a
	 * completion end it compensated. */
	saga =
	    create_as_server(&t, "{\"type\":\"saga\",\"steps\":["
	                         "{\"name\":\"a\",\"job_type\":\"rsa\",\"compensate\":"
	                         "{\"job_type\":\"rsu\"}},{\"name\":\"b\",\"job_type\":\"rsb\"}]}");
	expect_status(req("POST", "/v1/jobs/activate", t.auth, NULL,
	                  "{\"job_type\":\"rsa\",\"worker\":\"w\"}"),
	              200, "activation");
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", saga);
	expect_status(req("POST", path, t.auth, NULL, "{\"worker\":\"w\"}"), 200, "complete");
	expect_status(req("POST", "/v1/jobs/activate", t.auth, NULL,
	                  "{\"job_type\":\"rsb\",\"worker\":\"w\"}"),
	              200, "activation");
	snprintf(path, sizeof(path), "/v1/jobs/%s.s2/fail", saga);
	expect_status(req("POST", path, t.auth, NULL, "{\"worker\":\"w\",\"error\":\"e\"}"), 200,
	              "fail into a compensation");
	expect_wf(saga, "compensating/2");
	for (int i = 0; i < 2; i++) {
		expect_status(req("POST", "/v1/jobs/activate", t.auth, NULL,
		                  "{\"job_type\":\"rsu\",\"worker\":\"w\"}"),
		              200, "activation of the undo");
		snprintf(path, sizeof(path), "/v1/jobs/%s.c1/%s", saga,
		         i == 0 ? "fail" : "complete");
		expect_status(req("POST", path, t.auth, NULL, "{\"worker\":\"w\"}"), 200,
		              i == 0 ? "the undo fails" : "the undo completes");
		if (i > 0)
			break;
		expect_wf(saga, "incident/2");
		snprintf(path, sizeof(path), COLLECTION "/%s/transitions", saga);
		expect_status(req("POST", path, t.auth, NULL, "{\"to\":\"cancelled\"}"), 409,
		              "no cancel while undoing");
		snprintf(path, sizeof(path), COLLECTION "/%s/resume", saga);
		expect_status(req("POST", path, t.auth, NULL, "{}"), 200, "resume the undo");
	}
	expect_wf(saga, "compensated/2");
	expect_events_of(saga, "workflow.created,workflow.started,job.completed,job.failed,"
	                       "compensation.started,job.failed,workflow.incident,workflow.resumed,"
	                       "step.compensated,workflow.compensated");
	free(saga);

	/* A message by id, to a waiting workflow. */
	paid = create_as_server(&t, "{\"type\":\"byid\",\"steps\":["
	                            "{\"name\":\"w\",\"wait_for\":\"byid\"}]}");
	snprintf(path, sizeof(path), COLLECTION "/%s/messages", paid);
	expect_status(req("POST", path, t.auth, NULL, "{\"message_id\":\"i1\",\"name\":\"byid\"}"),
	              200, "a message by id");
	expect_wf(paid, "completed/1");
	free(paid);

	/* POST /v1/messages: to a waiting workflow (its wait's timer goes), */
	paid =
	    create_as_server(&t, "{\"type\":\"pay\",\"business_key\":\"K-1\",\"steps\":["
	                         "{\"name\":\"w\",\"wait_for\":\"paid\",\"timeout\":\"PT1H\"}]}");
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1", paid), 1);
	tstack_key(key, sizeof(key), "publish");
	r = req("POST", "/v1/messages", t.auth, key,
	        "{\"name\":\"paid\",\"business_key\":\"K-1\",\"message_id\":\"m1\"}");
	cr_assert_eq(r->status, 200, "publish: %d %s; see %s", r->status, r->body, own.log);
	cr_assert_not_null(strstr(r->body, "\"correlated\":true"), "%s", r->body);
	http_response_free(r);
	expect_wf(paid, "completed/1");
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1", paid), 0);
	/* kept for a workflow that begins its wait later (a create takes it), */
	expect_status(req("POST", "/v1/messages", t.auth, NULL,
	                  "{\"name\":\"ship\",\"business_key\":\"K-2\",\"message_id\":\"m2\"}"),
	              202, "message kept");
	kept = create_as_server(&t, "{\"type\":\"ship\",\"business_key\":\"K-2\",\"steps\":["
	                            "{\"name\":\"w\",\"wait_for\":\"ship\"}]}");
	expect_wf(kept, "completed/1");
	/* and one that nobody takes, expired: prune's. */
	expect_status(req("POST", "/v1/messages", t.auth, NULL,
	                  "{\"name\":\"x\",\"business_key\":\"K-3\",\"message_id\":\"m3\"}"),
	              202, "message kept");
	tstack_exec(tstack_db(),
	            "UPDATE messages SET expires_at = now() - interval '1 second'"
	            " WHERE tenant_id = $1 AND message_id = 'm3'",
	            t.id_text);

	/* Timers the server writes: a sleep due at once, two waits whose
	 * timeouts are made due, and the sleep of a workflow cancelled since.
	 * The sleep goes on into a wait whose kept message is there. */
	expect_status(req("POST", "/v1/messages", t.auth, NULL,
	                  "{\"name\":\"go\",\"business_key\":\"K-4\",\"message_id\":\"m4\"}"),
	              202, "message kept");
	nap = create_as_server(&t, "{\"type\":\"nap\",\"business_key\":\"K-4\",\"steps\":["
	                           "{\"name\":\"nap\",\"until\":\"2020-01-01T00:00:00Z\"},"
	                           "{\"name\":\"w\",\"wait_for\":\"go\"},"
	                           "{\"name\":\"b\",\"job_type\":\"rn\"}]}");
	late = create_as_server(&t, "{\"type\":\"late\",\"steps\":["
	                            "{\"name\":\"w\",\"wait_for\":\"never\",\"timeout\":\"PT1H\","
	                            "\"on_timeout\":\"c\"},{\"name\":\"b\",\"job_type\":\"rb\"},"
	                            "{\"name\":\"c\",\"job_type\":\"rc\"}]}");
	lost =
	    create_as_server(&t, "{\"type\":\"lost\",\"steps\":["
	                         "{\"name\":\"w\",\"wait_for\":\"never\",\"timeout\":\"PT1H\"}]}");
	/* A saga whose wait times out: the reaper begins its compensation. */
	undo =
	    create_as_server(&t, "{\"type\":\"undo\",\"steps\":["
	                         "{\"name\":\"a\",\"job_type\":\"rua\",\"compensate\":"
	                         "{\"job_type\":\"ruu\"}},"
	                         "{\"name\":\"w\",\"wait_for\":\"never\",\"timeout\":\"PT1H\"}]}");
	expect_status(req("POST", "/v1/jobs/activate", t.auth, NULL,
	                  "{\"job_type\":\"rua\",\"worker\":\"w\"}"),
	              200, "activation");
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", undo);
	expect_status(req("POST", path, t.auth, NULL, "{\"worker\":\"w\"}"), 200, "complete");
	gone = create_as_server(&t, "{\"type\":\"gone\",\"steps\":["
	                            "{\"name\":\"nap\",\"until\":\"2020-01-01T00:00:00Z\"}]}");
	snprintf(path, sizeof(path), COLLECTION "/%s/transitions", gone);
	expect_status(req("POST", path, t.auth, NULL, "{\"to\":\"cancelled\"}"), 200, "cancel");
	tstack_exec(tstack_db(),
	            "UPDATE timers SET due_at = now() - interval '1 second'"
	            " WHERE workflow_id IN ($1, $2, $3)",
	            late, lost, undo);
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE tenant_id = $1"
	                          " AND fired_at IS NULL AND due_at <= now()",
	                          t.id_text),
	             5);

	/* The reaper, as cron runs it: every one of them. */
	cr_assert_eq(cli_as_maint(out, sizeof(out), "reap"), 0, "reap: %s", out);
	cr_assert_str_eq(out, "reap: jobs=1\nreap: timers=1 timeouts=3 incidents=0\n");
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step = 1"
	                          " AND state = 'activatable'",
	                          hb),
	             1, "the lease that ran out is handed back");
	expect_wf(nap, "running/3");
	expect_events_of(nap, "workflow.created,workflow.started,timer.fired,job.completed");
	expect_wf(late, "running/3");
	expect_events_of(late, "workflow.created,workflow.started,step.timed_out");
	expect_wf(lost, "failed/1");
	expect_events_of(lost, "workflow.created,workflow.started,step.timed_out,workflow.failed");
	expect_wf(gone, "cancelled/1");
	expect_wf(undo, "compensating/2");
	expect_events_of(undo, "workflow.created,workflow.started,job.completed,step.timed_out,"
	                       "compensation.started");
	expect_status(req("POST", "/v1/jobs/activate", t.auth, NULL,
	                  "{\"job_type\":\"ruu\",\"worker\":\"w\"}"),
	              200, "activation of the undo");
	snprintf(path, sizeof(path), "/v1/jobs/%s.c1/complete", undo);
	expect_status(req("POST", path, t.auth, NULL, "{\"worker\":\"w\"}"), 200, "the undo");
	expect_wf(undo, "compensated/2");
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE tenant_id = $1"
	                          " AND fired_at IS NULL",
	                          t.id_text),
	             0, "every due timer fired or dropped");

	/* The audit, as the maintenance role runs it: the tenant's keys of
	 * every keyed route, its workflows and events hold every invariant. */
	const char *audit[] = { "audit", "--tenant", t.name, NULL };
	cr_assert_eq(cli_as_maint_args(aout, sizeof(aout), audit), 0, "audit: %s", aout);
	cr_assert_not_null(strstr(aout, "\naudit: 4 of 4 invariants hold ("), "%s", aout);
	cr_assert_null(strstr(aout, "FAIL"), "%s", aout);
	/* Every tenant: what the other tests left may break an invariant (65),
	 * but the role reads it all. */
	const char *audit_all[] = { "audit", "--json", NULL };
	int arc = cli_as_maint_args(aout, sizeof(aout), audit_all);
	cr_assert(arc == 0 || arc == 65, "audit exited %d: %s", arc, aout);
	cr_assert_null(strstr(aout, "permission denied"), "%s", aout);
	cr_assert_not_null(strstr(aout, "\"tenants_broken\":"), "%s", aout);

	/* Prune, as cron runs it: the expired message. */
	cr_assert_eq(cli_as_maint(out, sizeof(out), "prune"), 0, "prune: %s", out);
	cr_assert_not_null(strstr(out, " messages=1"), "%s", out);
	cr_assert_eq(tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1"
	                          " AND message_id = 'm3'",
	                          t.id_text),
	             0);

	/* A tenant's endpoints: every command, the secret, a new event's
	 * delivery written by the server, and a delete taking it along. */
	{
		tstack_key(key, sizeof(key), "ep");
		r = req("POST", "/v1/endpoints", t.auth, key, "{\"url\":\"https://h/roles\"}");
		cr_assert_eq(r->status, 201, "endpoint: %d %s; see %s", r->status, r->body,
		             own.log);
		char *ep = tstack_json(r->body, "{id}");
		http_response_free(r);
		expect_status(req("GET", "/v1/endpoints", t.auth, NULL, NULL), 200, "endpoints");
		snprintf(path, sizeof(path), "/v1/endpoints/%s", ep);
		expect_status(req("GET", path, t.auth, NULL, NULL), 200, "endpoint");
		expect_status(req("PATCH", path, t.auth, NULL, "{\"ordering\":\"none\"}"), 200,
		              "endpoint changed");
		free(create_as_server(&t, "{\"type\":\"to-endpoint\"}"));
		cr_assert_eq(
		    tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", ep), 1);
		snprintf(path, sizeof(path), "/v1/endpoints/%s/secret", ep);
		expect_status(req("GET", path, t.auth, NULL, NULL), 200, "secret");
		snprintf(path, sizeof(path), "/v1/endpoints/%s/secret/rotate", ep);
		expect_status(req("POST", path, t.auth, NULL, "{}"), 200, "secret rotated");
		snprintf(path, sizeof(path), "/v1/endpoints/%s/secret/revoke", ep);
		expect_status(req("POST", path, t.auth, NULL, "{}"), 200, "secret revoked");
		snprintf(path, sizeof(path), "/v1/endpoints/%s", ep);
		expect_status(req("DELETE", path, t.auth, NULL, NULL), 200, "endpoint deleted");
		cr_assert_eq(
		    tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", ep), 0);
		free(ep);
	}
	/* The event routes (app/server/events.c) as the server, recover and
	 * resend as the CLI (maintenance): an endpoint of the tenant's with
	 * a dead delivery and an attempt. */
	char ep[37], *fan, ev[48], body[96];
	tstack_uuid(ep);
	tstack_exec(tstack_db(),
	            "INSERT INTO endpoints (tenant_id, id, url, secret) VALUES ($1, $2,"
	            " 'http://127.0.0.1:9/', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')",
	            t.id_text, ep);
	fan = create_as_server(&t, "{\"type\":\"fan\"}");
	snprintf(ev, sizeof(ev), "%s.1", fan);
	tstack_exec(tstack_db(), "UPDATE deliveries SET state = 'dead' WHERE endpoint_id = $1", ep);
	tstack_exec(
	    tstack_db(),
	    "INSERT INTO delivery_attempts (tenant_id, endpoint_id, workflow_id, seq, event_id,"
	    " trigger, started_at, duration_ms, status, outcome) VALUES ($1, $2, $3, 1, $4,"
	    " 'scheduled', now(), 1, 500, 'http')",
	    t.id_text, ep, fan, ev);
	expect_status(req("GET", "/v1/events", t.auth, NULL, NULL), 200, "the event feed");
	snprintf(path, sizeof(path), "/v1/events/%s/deliveries", ev);
	expect_status(req("GET", path, t.auth, NULL, NULL), 200, "an event's deliveries");
	snprintf(path, sizeof(path), "/v1/endpoints/%s/attempts?status=failed", ep);
	expect_status(req("GET", path, t.auth, NULL, NULL), 200, "the attempts");
	snprintf(path, sizeof(path), "/v1/endpoints/%s/undelivered", ep);
	expect_status(req("GET", path, t.auth, NULL, NULL), 200, "undelivered");
	snprintf(path, sizeof(path), "/v1/endpoints/%s/recover", ep);
	tstack_key(key, sizeof(key), "recover");
	expect_status(req("POST", path, t.auth, key, "{\"since\":\"2000-01-01T00:00:00Z\"}"), 200,
	              "recover");
	snprintf(path, sizeof(path), "/v1/events/%s/resend", ev);
	snprintf(body, sizeof(body), "{\"endpoint_id\":\"%s\"}", ep);
	tstack_key(key, sizeof(key), "resend");
	expect_status(req("POST", path, t.auth, key, body), 200, "resend");
	const char *recover[] = {
		"endpoint", "recover", "--tenant", t.name, ep, "--since", "2000-01-01T00:00:00Z",
		NULL
	};
	cr_assert_eq(cli_as_maint_args(out, sizeof(out), recover), 0, "recover: %s", out);
	const char *resend[] = {
		"event", "resend", "--tenant", t.name, ev, "--endpoint", ep, NULL
	};
	cr_assert_eq(cli_as_maint_args(out, sizeof(out), resend), 0, "resend: %s", out);
	free(fan);

	expect_every_route_served();
	log = slurp(own.log);
	cr_assert_null(strstr(log, "permission denied"), "%s", log);
	cr_assert_null(strstr(log, "level=error"), "%s", log);
	free(log);
	free(hb);
	free(inc);
	free(paid);
	free(kept);
	free(nap);
	free(late);
	free(lost);
	free(gone);
	free(undo);
}

/* Run sql as user; its SQLSTATE ("" when it succeeded). */
static void expect_refused(const char *user, const char *sql)
{
	char conninfo[1024];
	const char *keys[] = { "dbname", NULL }, *vals[] = { conninfo, NULL };
	PGconn *c;
	PGresult *res;
	const char *state;

	conninfo_as(conninfo, sizeof(conninfo), user);
	c = PQconnectdbParams(keys, vals, 1);
	cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
	res = PQexec(c, sql);
	state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	cr_assert_not_null(state, "%s may run: %s", user, sql);
	/* 42501: insufficient privilege, or "must be owner". */
	cr_assert_str_eq(state, "42501", "%s: %s: %s", user, sql, PQresultErrorMessage(res));
	PQclear(res);
	PQfinish(c);
}

Test(roles, neither_role_can_change_the_schema_the_tenants_or_the_tokens)
{
	static const char *server_refused[] = {
		"CREATE TABLE evil (a int)",
		"ALTER TABLE workflows ADD COLUMN evil int",
		"DROP TABLE outbox",
		"TRUNCATE workflows",
		"CREATE INDEX evil ON workflows (type)",
		"CREATE FUNCTION evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
		"UPDATE workflows SET input = '{}'",
		"DELETE FROM workflows",
		"UPDATE outbox SET payload = '{}'",
		"DELETE FROM outbox",
		"UPDATE idempotency_keys SET fingerprint = '\\x00'",
		"INSERT INTO tenants (name) VALUES ('evil')",
		"SELECT name FROM tenants",
		"UPDATE tenants SET idempotency_ttl = NULL",
		"INSERT INTO api_tokens (token_hash, tenant_id) VALUES (decode(repeat('00', 32), "
		"'hex'), 1)",
		"UPDATE api_tokens SET revoked_at = NULL",
		"SELECT id, created_at FROM api_tokens",
		"DELETE FROM api_tokens",
		"INSERT INTO schema_migrations (version, name) VALUES (999, 'evil')",
		"SET ROLE postgres",
	};
	static const char *dispatcher_refused[] = {
		"CREATE TABLE evil (a int)",
		"UPDATE outbox SET payload = '{}'",
		"UPDATE outbox SET type = 'evil'",
		"INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
		" VALUES ('e', 1, gen_random_uuid(), 1, 't', '{}')",
		"DELETE FROM outbox",
		"SELECT * FROM workflows",
		"SELECT token_hash FROM api_tokens",
		"SELECT * FROM idempotency_keys",
		"SELECT name FROM tenants",
	};

	for (size_t i = 0; i < sizeof(server_refused) / sizeof(server_refused[0]); i++)
		expect_refused("idemflow_web", server_refused[i]);
	for (size_t i = 0; i < sizeof(dispatcher_refused) / sizeof(dispatcher_refused[0]); i++)
		expect_refused("idemflow_cron", dispatcher_refused[i]);
}

/* --- The shipped deployment ---------------------------------------------- */

/* The line of the generated file path that contains needle, newline cut. */
static char *line_with(const char *path, const char *needle)
{
	char *text = slurp(path), *p = strstr(text, needle), *out;

	cr_assert_not_null(p, "%s has no line with %s", path, needle);
	while (p > text && p[-1] != '\n')
		p--;
	out = strndup(p, strcspn(p, "\n"));
	free(text);
	return out;
}

/*
 * The shipped service file as an operator configures it: its commented
 * dbname lines taken in, nothing else changed. Written beside pgpass.
 */
static void operator_service_file(char *out, size_t outsz, const char *pgpass)
{
	const char *srcdir = getenv("top_srcdir");
	char path[600];
	char *text, *line, *save = NULL;
	FILE *f;

	snprintf(path, sizeof(path), "%s/etc/pg_service.conf", srcdir && *srcdir ? srcdir : ".");
	text = slurp(path);
	snprintf(out, outsz, "%s.service", pgpass);
	f = fopen(out, "w");
	cr_assert_not_null(f, "%s: %s", out, strerror(errno));
	for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save))
		fprintf(f, "%s\n", strncmp(line, "#dbname=", 8) == 0 ? line + 1 : line);
	fclose(f);
	free(text);
}

/*
 * A shell command from an installed command line: the program from this
 * build, our configuration and pid file in place of the installed ones,
 * the installed service file (make install copies it verbatim) with its
 * dbname lines taken in, a pgpass with the login roles' passwords, and
 * nothing in the environment that names a database user: the service
 * must.
 */
static void installed_command(char *out, size_t outsz, const char *line, const char *conf,
                              const char *pidfile, const char *pgpass)
{
	char *copy = strdup(line), *save = NULL, service[700];
	size_t n;

	operator_service_file(service, sizeof(service), pgpass);
	n = (size_t)snprintf(out, outsz,
	                     "exec env -u DATABASE_URL -u PGUSER -u PGDATABASE -u IDEMFLOW_CONFIG"
	                     " PGSERVICEFILE='%s' PGPASSFILE='%s'",
	                     service, pgpass);
	for (char *w = strtok_r(copy, " ", &save), *prev = NULL; w != NULL;
	     prev = w, w = strtok_r(NULL, " ", &save)) {
		const char *word = w;
		char prog[600];

		if (strcmp(w, "|") == 0)
			break; /* "| logger ...": the output is ours */
		if (prev != NULL && strcmp(prev, "--config") == 0)
			word = conf;
		else if (prev != NULL && strcmp(prev, "--pid-file") == 0)
			word = pidfile;
		else if (strchr(w, '/') != NULL && strstr(w, "/idemflow") != NULL && w[0] == '/' &&
		         strrchr(w, '/')[1] == 'i') {
			snprintf(prog, sizeof(prog), "%s",
			         tstack_env(strstr(w, "idemflow-dispatch") ? "IDEMFLOW_DISPATCH"
			                    : strstr(w, "idemflow-fcgi")   ? "IDEMFLOW_FCGI"
			                                                   : "IDEMFLOW_CLI"));
			word = prog;
		}
		n += (size_t)snprintf(out + n, outsz - n, " %s", word);
		cr_assert(n < outsz);
	}
	free(copy);
}

/* A cron line's job itself, after its guard ("PGSERVICE=... prog -t -q
 * &&", which the package test runs): from its last PGSERVICE=. */
static const char *cron_job(const char *line)
{
	const char *start = strstr(line, "PGSERVICE="), *next;

	cr_assert_not_null(start, "%s", line);
	while ((next = strstr(start + 1, "PGSERVICE=")) != NULL)
		start = next;
	return start;
}

static int sh_run(const char *cmd, const char *log)
{
	const char *argv[] = { "/bin/sh", "-c", cmd, NULL };

	return run(argv, log);
}

/*
 * What make install ships, run as it is: the systemd unit's idemflow-fcgi,
 * the cron jobs' idemflow-dispatch, prune and reap, each through the
 * service its unit names in the shipped pg_service.conf. Each logs in as
 * its own role, and each role's privileges are enough for its program.
 */
Test(roles, the_shipped_units_run_each_program_as_its_own_role, .fini = own_stop)
{
	const char *builddir = getenv("top_builddir");
	char unit[600], cron[600], conf[512], pgpass[512], log[512], cmd[4096], key[128];
	char *exec, *line, *text;
	struct tstack_tenant t;
	FILE *f;
	int rc;

	snprintf(unit, sizeof(unit), "%s/etc/idemflow-fcgi.service",
	         builddir && *builddir ? builddir : ".");
	snprintf(cron, sizeof(cron), "%s/etc/idemflow.cron",
	         builddir && *builddir ? builddir : ".");
	tstack_pool_paths(&own, "shipped");
	stack_path(pgpass, sizeof(pgpass), "pgpass");
	f = fopen(pgpass, "w");
	cr_assert_not_null(f);
	fprintf(f, "*:*:*:idemflow_web:%s\n*:*:*:idemflow_cron:%s\n*:*:*:idemflow_maint:%s\n",
	        ROLE_PASSWORD, ROLE_PASSWORD, ROLE_PASSWORD);
	fclose(f);
	cr_assert_eq(chmod(pgpass, 0600), 0);
	/* The operator's idemflow.conf: no db (the services decide), the
	 * stack's socket for the server, an exec sink for the dispatcher. */
	stack_path(conf, sizeof(conf), "shipped.conf");
	f = fopen(conf, "w");
	cr_assert_not_null(f);
	fprintf(f,
	        "listen = %s\nworkers = 1\nsink = exec\nexec = cat >/dev/null\n"
	        "outbox_retention = 1h\n",
	        own.sock);
	fclose(f);

	/* The server, as systemd starts it. */
	exec = line_with(unit, "ExecStart=");
	line = line_with(unit, "Environment=PGSERVICEFILE=");
	cr_assert_not_null(strstr(line, " PGSERVICE=idemflow-server"), "%s", line);
	free(line);
	{
		char with_env[1024];
		snprintf(with_env, sizeof(with_env), "PGSERVICE=idemflow-server %s",
		         exec + strlen("ExecStart="));
		installed_command(cmd, sizeof(cmd), with_env, conf, own.pidfile, pgpass);
	}
	free(exec);
	/* systemd knows the unit's main pid; the harness reads a pid file to
	 * know the pool started and to stop it. */
	if (strstr(cmd, " --pid-file ") == NULL) {
		size_t n = strlen(cmd);
		snprintf(cmd + n, sizeof(cmd) - n, " --pid-file %s", own.pidfile);
	}
	const char *argv[] = { "/bin/sh", "-c", cmd, NULL };
	tstack_pool_run(&own, argv, 10000);
	own_wait_worker();
	tstack_tenant_create(&t, "shipped");
	tstack_key(key, sizeof(key), "shipped");
	expect_status(req("POST", COLLECTION, t.auth, key, "{\"type\":\"shipped\"}"), 201,
	              "create through the shipped unit");
	/* An expired key and a delivered event past retention, for prune. */
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET expires_at = now() - interval '1 second'"
	            " WHERE tenant_id = $1",
	            t.id_text);

	/* The cron jobs, line by line, as cron runs them. */
	line = line_with(cron, "PGSERVICEFILE=");
	free(line);
	static const struct {
		const char *needle, *service, *log;
	} jobs[] = {
		{ "idemflow-dispatch --config", "PGSERVICE=idemflow-dispatch ", "dispatch" },
		{ " reap |", "PGSERVICE=idemflow-maintenance ", "reap" },
	};
	for (size_t i = 0; i < 2; i++) {
		char *job = line_with(cron, jobs[i].needle);
		const char *start = cron_job(job);

		cr_assert_eq(strncmp(start, jobs[i].service, strlen(jobs[i].service)), 0, "%s",
		             job);
		installed_command(cmd, sizeof(cmd), start, conf, "", pgpass);
		stack_path(log, sizeof(log), jobs[i].log);
		rc = sh_run(cmd, log);
		text = slurp(log);
		cr_assert_eq(rc, 0, "%s exited %d: %s", cmd, rc, text);
		cr_assert_null(strstr(text, "permission denied"), "%s", text);
		free(text);
		free(job);
	}
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1"
	                          " AND published_at IS NOT NULL",
	                          t.id_text),
	             1, "the cron dispatcher delivered the event");
	tstack_exec(
	    tstack_db(),
	    "UPDATE outbox SET published_at = now() - interval '2 hours' WHERE tenant_id = $1",
	    t.id_text);
	/* and its workflow ended before history_retention (7 days): a live
	 * workflow's events are its history, which prune keeps. */
	tstack_exec(tstack_db(),
	            "UPDATE workflows SET state = 'completed', ended_at = now() - interval '8 days'"
	            " WHERE tenant_id = $1",
	            t.id_text);

	line = line_with(cron, " prune |");
	installed_command(cmd, sizeof(cmd), cron_job(line), conf, "", pgpass);
	cr_assert_not_null(strstr(line, "PGSERVICE=idemflow-maintenance "), "%s", line);
	free(line);
	stack_path(log, sizeof(log), "prune");
	rc = sh_run(cmd, log);
	text = slurp(log);
	cr_assert_eq(rc, 0, "prune exited %d: %s", rc, text);
	free(text);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", t.id_text),
	    0, "prune deleted the expired key");
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1", t.id_text), 0,
	             "prune deleted the delivered event");

	text = slurp(own.log);
	cr_assert_null(strstr(text, "permission denied"), "%s", text);
	free(text);
}

TSTACK_SEQUENTIAL
