/*
 * test_security.c - tokens, what error bodies may say, the operator's
 * endpoints, and the per-token rate limit, through the real stack.
 *
 * One test stops PostgreSQL and one adds a trigger that fails creates, so
 * the tests run one at a time (main() at the end).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <netinet/in.h>

#include <criterion/criterion.h>
#include <grp.h>
#include <sys/stat.h>
#include <json-c/json.h>

#include "core/fp.h"
#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define COLLECTION  "/v1/workflows"
#define JSON_CT     "Content-Type: application/json"
#define MAX_WORKERS 64

static const char BODY[] = "{\"type\":\"sec\",\"input\":{\"n\":1}}";

/*
 * Settings of its own (TSTACK_SETTINGS): idempotency_wait, which is also
 * every worker's lock_timeout, is 10 s, not the harness's 1 s, a window
 * too short on a loaded machine: a revoke runs while a create waits on a held key.
 */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TestSuite(tokens, .timeout = 60);
TestSuite(errors, .timeout = 120);
TestSuite(operator, .timeout = 60);
TestSuite(rate_limit, .timeout = 60);

/* --- Helpers ----------------------------------------------------------- */

static struct http_response *post_as(const char *auth, const char *body)
{
	char key[128], kh[160];
	struct http_response *r;

	tstack_key(key, sizeof(key), "sec");
	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	const char *h[] = { auth, JSON_CT, kh, NULL };
	r = http_request("POST", COLLECTION, h, body, strlen(body));
	cr_assert_not_null(r, "POST: %s", http_error());
	return r;
}

static char *file_slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *text = NULL;
	size_t len = 0;

	if (f == NULL)
		return strdup("");
	FILE *m = open_memstream(&text, &len);
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, m);
	fclose(m);
	fclose(f);
	return text;
}

/* The pid of the worker that logged request_id, waiting up to 3 s: the
 * line is written just after the answer is sent. 0 when none did. */
static long worker_of(const char *request_id)
{
	char needle[64];
	double deadline = tstack_now() + 3;

	snprintf(needle, sizeof(needle), "request_id=%s", request_id);
	do {
		char *log = file_slurp(tstack_env("IDEMFLOW_FCGI_LOG"));
		char *at = strstr(log, needle);
		long pid = 0;
		if (at != NULL) {
			char *line = at;
			while (line > log && line[-1] != '\n')
				line--;
			char *p = strstr(line, " pid=");
			if (p != NULL && p < at)
				pid = atol(p + 5);
		}
		free(log);
		if (pid > 0)
			return pid;
		tstack_sleep_ms(20);
	} while (tstack_now() < deadline);
	return 0;
}

/* Nothing in an error body that tells a client about the server: no SQL,
 * no connection string, no token, no path, no library or SQLSTATE text. */
static void expect_no_internals(const struct http_response *r, const char *const *secrets)
{
	static const char *internal[] = {
		"SELECT",
		"INSERT",
		"UPDATE",
		"DELETE",
		" FROM ",
		"WHERE",
		"idempotency_keys",
		"api_tokens",
		"outbox",
		"relation",
		"violates",
		"syntax",
		"constraint",
		"SQLSTATE",
		"sqlstate",
		"ERROR:",
		"FATAL",
		"PANIC",
		"postgres",
		"PostgreSQL",
		"libpq",
		"host=",
		"port=",
		"user=",
		"dbname",
		"password",
		".s.PGSQL",
		"/tmp/",
		"/work/",
		"/var/",
		"/usr/",
		".c:",
		"errno",
		"Connection refused",
		"No such file",
	};

	for (size_t i = 0; i < sizeof(internal) / sizeof(internal[0]); i++)
		cr_assert_null(strstr(r->body, internal[i]), "%d body says \"%s\": %s", r->status,
		               internal[i], r->body);
	for (size_t i = 0; secrets && secrets[i]; i++)
		cr_assert_null(strstr(r->body, secrets[i]), "%d body holds \"%s\": %s", r->status,
		               secrets[i], r->body);
	for (size_t i = 0; i < r->header_count; i++)
		for (size_t k = 0; secrets && secrets[k]; k++)
			cr_assert_null(strstr(r->headers[i].value, secrets[k]),
			               "header %s holds %s", r->headers[i].name, secrets[k]);
}

/* tstack_expect_problem, read with json-c: the shared one asks PostgreSQL
 * to parse the body, which does not work while it is stopped. */
static void expect_problem_offline(const struct http_response *r, int status, const char *type,
                                   const char *instance)
{
	struct json_object *v, *m;

	cr_assert_eq(r->status, status, "status %d, want %d: %s", r->status, status, r->body);
	tstack_expect_header(r, "Content-Type", "application/problem+json");
	v = json_tokener_parse(r->body);
	cr_assert_not_null(v, "not JSON: %s", r->body);
	cr_assert(json_object_object_get_ex(v, "type", &m));
	cr_assert_str_eq(json_object_get_string(m), type);
	cr_assert(json_object_object_get_ex(v, "status", &m));
	cr_assert_eq(json_object_get_int(m), status);
	cr_assert(json_object_object_get_ex(v, "instance", &m));
	cr_assert_str_eq(json_object_get_string(m), instance);
	cr_assert(json_object_object_get_ex(v, "request_id", &m));
	cr_assert_str_eq(json_object_get_string(m), http_header(r, "X-Request-Id"));
	json_object_put(v);
}

/* --- Tokens ------------------------------------------------------------ */

/* Every text column of every table holds the token nowhere: it is stored
 * as its BLAKE2b-256 only. And no log holds it either. */
Test(tokens, are_stored_only_as_their_blake2b_hash_and_never_logged)
{
	struct tstack_tenant t;
	struct http_response *r;
	uint8_t h[FP_LEN];
	char hex[2 * FP_LEN + 1], *stored, *tables;
	const char *logs[] = { "IDEMFLOW_FCGI_LOG", "IDEMFLOW_PG_LOG" };
	char nginx_log[1024];

	tstack_tenant_create(&t, "hashed");
	r = post_as(t.auth, BODY);
	cr_assert_eq(r->status, 201, "%d %s", r->status, r->body);
	http_response_free(r);
	/* A refused one too: a token in a failing request is not logged. */
	r = post_as(t.auth, "{\"type\":");
	cr_assert_eq(r->status, 400);
	http_response_free(r);

	fp_token(h, t.token, strlen(t.token));
	fp_hex(hex, h, FP_LEN);
	stored = tstack_text(
	    "SELECT encode(token_hash, 'hex') FROM api_tokens WHERE tenant_id = $1", t.id_text);
	cr_assert_str_eq(stored, hex, "the stored hash is not BLAKE2b-256 of the token");
	free(stored);

	tables = tstack_text("SELECT string_agg(quote_ident(relname), ' ') FROM pg_class c"
	                     " JOIN pg_namespace n ON n.oid = c.relnamespace"
	                     " WHERE n.nspname = 'public' AND c.relkind = 'r'");
	cr_assert_not_null(tables);
	for (char *tab = strtok(tables, " "); tab != NULL; tab = strtok(NULL, " ")) {
		char sql[256];
		snprintf(sql, sizeof(sql),
		         "SELECT count(*) FROM %s x WHERE strpos(x::text, $1) > 0", tab);
		cr_assert_eq(tstack_count(sql, t.token), 0, "table %s holds the token", tab);
		/* Nor its hash in hex anywhere but as api_tokens' bytea. */
		if (strcmp(tab, "api_tokens") != 0)
			cr_assert_eq(tstack_count(sql, hex), 0, "table %s holds the hash", tab);
	}
	free(tables);

	snprintf(nginx_log, sizeof(nginx_log), "%s/nginx/access.log",
	         tstack_env("IDEMFLOW_STACK_DIR"));
	const char *paths[] = { tstack_env(logs[0]), tstack_env(logs[1]), nginx_log };
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		char *text = file_slurp(paths[i]);
		cr_assert_null(strstr(text, t.token), "%s holds the token", paths[i]);
		free(text);
	}
}

/* The comparison is of digests, in PostgreSQL's unique index: a token that
 * is almost right is simply another digest. */
Test(tokens, near_misses_of_a_valid_token_are_401)
{
	struct tstack_tenant t;
	char variants[6][256];
	size_t n;

	tstack_tenant_create(&t, "nearmiss");
	n = strlen(t.token);
	snprintf(variants[0], sizeof(variants[0]), "Authorization: Bearer %.*s", (int)n - 1,
	         t.token);
	snprintf(variants[1], sizeof(variants[1]), "Authorization: Bearer %sx", t.token);
	snprintf(variants[2], sizeof(variants[2]), "Authorization: Bearer %s", t.token);
	variants[2][sizeof("Authorization: Bearer ") - 1 + n - 1] ^= 1;
	snprintf(variants[3], sizeof(variants[3]), "Authorization: Bearer %s", t.token);
	for (char *c = variants[3] + 22; *c; c++)
		if (*c >= 'a' && *c <= 'z')
			*c = (char)(*c - 'a' + 'A');
	snprintf(variants[4], sizeof(variants[4]), "Authorization: Bearer %s%%00", t.token);
	snprintf(variants[5], sizeof(variants[5]), "Authorization: Basic %s", t.token);
	for (size_t i = 0; i < 6; i++) {
		struct http_response *r = post_as(variants[i], BODY);
		tstack_expect_problem(r, 401, "/problems/unauthorized", COLLECTION);
		const char *secret[] = { t.token, NULL };
		expect_no_internals(r, secret);
		http_response_free(r);
	}
	tstack_expect_counts(&t, 0, 0, 0);
	struct http_response *r = post_as(t.auth, BODY);
	cr_assert_eq(r->status, 201, "the token itself: %d %s", r->status, r->body);
	http_response_free(r);
}

struct shot {
	pthread_barrier_t *go;
	const char *auth;
	struct http_response *r;
};

static void *shot_run(void *arg)
{
	struct shot *s = arg;
	char key[128], kh[160];

	tstack_key(key, sizeof(key), "revoked");
	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	const char *h[] = { s->auth, JSON_CT, kh, NULL };
	pthread_barrier_wait(s->go);
	s->r = http_request("POST", COLLECTION, h, BODY, strlen(BODY));
	return NULL;
}

/*
 * Workers keep no token in memory: every request looks its token up. After
 * "idemflow token revoke" the very next request is refused, by whichever
 * worker takes it; requests go out in bursts as wide as the pool until
 * every worker has refused at least one.
 */
Test(tokens, a_revoked_token_is_refused_by_every_worker_from_the_next_request)
{
	long nworkers = tstack_conf_long("workers", 8);
	pid_t sup = tstack_supervisor_pid(), pids[MAX_WORKERS];
	long seen[MAX_WORKERS] = { 0 };
	struct tstack_tenant t;
	char other[128], other_auth[160];
	size_t nseen = 0, npids;
	int rounds = 0;

	cr_assert(tstack_wait_workers(sup, (size_t)nworkers, 5000));
	npids = tstack_workers(sup, pids, MAX_WORKERS);
	tstack_tenant_create(&t, "revoke");
	tstack_token_create(t.name, other, sizeof(other));
	snprintf(other_auth, sizeof(other_auth), "Authorization: Bearer %s", other);
	struct http_response *r = post_as(t.auth, BODY);
	cr_assert_eq(r->status, 201);
	http_response_free(r);

	tstack_token_revoke(t.token);
	while (nseen < npids) {
		struct shot shots[MAX_WORKERS];
		pthread_t th[MAX_WORKERS];
		pthread_barrier_t go;

		cr_assert(++rounds <= 40, "after 40 bursts only %zu of %zu workers answered", nseen,
		          npids);
		pthread_barrier_init(&go, NULL, (unsigned)npids);
		for (size_t i = 0; i < npids; i++) {
			shots[i] = (struct shot){ .go = &go, .auth = t.auth };
			pthread_create(&th[i], NULL, shot_run, &shots[i]);
		}
		for (size_t i = 0; i < npids; i++)
			pthread_join(th[i], NULL);
		pthread_barrier_destroy(&go);
		for (size_t i = 0; i < npids; i++) {
			cr_assert_not_null(shots[i].r, "%s", http_error());
			tstack_expect_problem(shots[i].r, 401, "/problems/unauthorized",
			                      COLLECTION);
			long pid = worker_of(http_header(shots[i].r, "X-Request-Id"));
			cr_assert(pid > 0, "no log line for request %s",
			          http_header(shots[i].r, "X-Request-Id"));
			size_t k = 0;
			while (k < nseen && seen[k] != pid)
				k++;
			if (k == nseen)
				seen[nseen++] = pid;
			http_response_free(shots[i].r);
		}
	}
	cr_log_info("every one of %zu workers refused the revoked token (%d bursts)", npids,
	            rounds);
	tstack_expect_counts(&t, 1, 1, 1);
	/* Revocation is per token: the tenant's other one still works. */
	r = post_as(other_auth, BODY);
	cr_assert_eq(r->status, 201, "the tenant's other token: %d %s", r->status, r->body);
	http_response_free(r);
}

/* --- Error bodies ------------------------------------------------------ */

/*
 * A create that PostgreSQL refuses gets 500 /problems/internal that names
 * nothing of the database: the refusal (here a trigger's message, full of
 * SQL and a connection string) goes to the server log, with the request's
 * id, for the operator.
 */
Test(errors, a_database_error_is_a_500_that_says_nothing_of_the_database)
{
	struct tstack_tenant t;
	struct http_response *r;
	char tag[40], body[160], fn[80], sql[1024], *log;
	const char *secrets[4];

	tstack_tenant_create(&t, "dberror");
	tstack_random_hex(tag, 8);
	snprintf(fn, sizeof(fn), "sec_fail_%s", tag);
	snprintf(
	    sql, sizeof(sql),
	    "CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN"
	    " IF NEW.type = 'boom-%s' THEN RAISE EXCEPTION"
	    " 'secret-%s: SELECT password FROM pg_authid; host=/tmp/x port=5432 user=postgres';"
	    " END IF; RETURN NEW; END $f$",
	    fn, tag, tag);
	tstack_exec(tstack_db(), sql);
	snprintf(sql, sizeof(sql),
	         "CREATE TRIGGER %s BEFORE INSERT ON workflows FOR EACH ROW EXECUTE FUNCTION %s()",
	         fn, fn);
	tstack_exec(tstack_db(), sql);

	snprintf(body, sizeof(body), "{\"type\":\"boom-%s\",\"input\":{}}", tag);
	r = post_as(t.auth, body);
	char secret[64];
	snprintf(secret, sizeof(secret), "secret-%s", tag);
	secrets[0] = secret;
	secrets[1] = t.token;
	secrets[2] = tstack_env("DATABASE_URL");
	secrets[3] = NULL;
	tstack_expect_problem(r, 500, "/problems/internal", COLLECTION);
	expect_no_internals(r, secrets);
	tstack_expect_counts(&t, 0, 0, 0);

	/* The operator has it, under the same request id. */
	cr_assert(worker_of(http_header(r, "X-Request-Id")) > 0);
	log = file_slurp(tstack_env("IDEMFLOW_FCGI_LOG"));
	cr_assert_not_null(strstr(log, secret), "the log lacks the database's message");
	free(log);
	http_response_free(r);

	snprintf(sql, sizeof(sql), "DROP TRIGGER %s ON workflows; DROP FUNCTION %s()", fn, fn);
	PQclear(PQexec(tstack_db(), sql));
	r = post_as(t.auth, body);
	cr_assert_eq(r->status, 201, "%d %s", r->status, r->body);
	http_response_free(r);
}

/* With PostgreSQL stopped every route that needs it answers 503 without a
 * word about the connection: no conninfo, socket path or libpq message. */
static int pg_stopped;

/* Whatever the test did, the next one finds PostgreSQL running. */
static void pg_restart(void)
{
	if (pg_stopped)
		tstack_pg_ctl("start");
	pg_stopped = 0;
}

Test(errors, with_postgresql_down_503_bodies_name_nothing_of_the_connection, .fini = pg_restart)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[80], uuid[37];
	const char *secrets[] = { NULL, NULL, NULL, NULL };

	tstack_tenant_create(&t, "down");
	secrets[0] = t.token;
	secrets[1] = tstack_env("DATABASE_URL");
	secrets[2] = tstack_env("PGHOST");
	tstack_uuid(uuid);
	snprintf(path, sizeof(path), COLLECTION "/%s", uuid);

	tstack_pg_ctl("stop");
	pg_stopped = 1;
	const char *get_h[] = { t.auth, NULL };
	for (int i = 0; i < 3; i++) {
		r = post_as(t.auth, BODY);
		expect_problem_offline(r, 503, "https://idemflow.example/problems/unavailable",
		                       COLLECTION);
		tstack_expect_header(r, "Retry-After", "1");
		expect_no_internals(r, secrets);
		http_response_free(r);

		r = http_request("GET", path, get_h, NULL, 0);
		cr_assert_not_null(r, "%s", http_error());
		expect_problem_offline(r, 503, "https://idemflow.example/problems/unavailable",
		                       path);
		expect_no_internals(r, secrets);
		http_response_free(r);

		r = http_request("GET", "/readyz", NULL, NULL, 0);
		cr_assert_not_null(r, "%s", http_error());
		expect_problem_offline(r, 503, "https://idemflow.example/problems/unavailable",
		                       "/readyz");
		expect_no_internals(r, secrets);
		http_response_free(r);
	}
	tstack_pg_ctl("start");
	pg_stopped = 0;

	double deadline = tstack_now() + 15;
	int status = 0;
	while (status != 201 && tstack_now() < deadline) {
		r = post_as(t.auth, BODY);
		status = r->status;
		http_response_free(r);
		if (status != 201)
			tstack_sleep_ms(200);
	}
	cr_assert_eq(status, 201, "after PostgreSQL came back: %d", status);
}

/* --- Operator endpoints ------------------------------------------------ */

/* Administration is the CLI's alone: no HTTP route reaches tenants,
 * tokens, the outbox, prune or migrations, whatever the token. */
Test(operator, admin_looking_paths_are_404_for_tenant_tokens)
{
	static const char *paths[] = {
		"/admin",
		"/admin/tenants",
		"/v1/admin",
		"/v1/tenants",
		"/v1/tenants/1",
		"/v1/tenants/1/tokens",
		"/v1/tokens",
		"/v1/api_tokens",
		"/v1/token/revoke",
		"/v1/outbox",
		"/v1/outbox/1/requeue",
		"/v1/prune",
		"/v1/migrate",
		"/migrate",
		"/debug",
		"/v1/debug/idempotency-check",
		"/v1/workflows/../../admin",
		"/metrics/admin",
		"/server-status",
		"/.env",
	};
	static const char *methods[] = { "GET", "POST", "PUT", "DELETE", "PATCH" };
	struct tstack_tenant t;
	long tenants, tokens, events;

	tstack_tenant_create(&t, "notadmin");
	tenants = tstack_count("SELECT count(*) FROM tenants");
	tokens = tstack_count("SELECT count(*) FROM api_tokens WHERE revoked_at IS NULL");
	events = tstack_count("SELECT count(*) FROM outbox");
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		for (size_t m = 0; m < sizeof(methods) / sizeof(methods[0]); m++) {
			const char *h[] = { t.auth, JSON_CT, "Idempotency-Key: admin-try", NULL };
			const char *body = strcmp(methods[m], "GET") ? "{\"name\":\"evil\"}" : NULL;
			struct http_response *r =
			    http_request(methods[m], paths[i], h, body, body ? strlen(body) : 0);
			cr_assert_not_null(r, "%s", http_error());
			cr_assert_eq(r->status, 404, "%s %s: %d %s", methods[m], paths[i],
			             r->status, r->body);
			cr_assert_str_eq(http_header(r, "Content-Type"),
			                 "application/problem+json");
			http_response_free(r);
		}
	}
	cr_assert_eq(tstack_count("SELECT count(*) FROM tenants"), tenants);
	cr_assert_eq(tstack_count("SELECT count(*) FROM api_tokens WHERE revoked_at IS NULL"),
	             tokens);
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox"), events);
	tstack_expect_counts(&t, 0, 0, 0);
}

static struct tstack_pool own;

static void own_stop(void)
{
	tstack_pool_kill(&own, SIGTERM);
}

/*
 * /metrics with a tenant's token from an address outside metrics_allow:
 * 403, and no metric in the body. Tenants' tokens are never looked up
 * there. (Through the harness's nginx every client is 127.0.0.1, which the
 * default metrics_allow lets in, so this talks FastCGI to a server of its
 * own, as nginx would for a remote client.)
 */
Test(operator, metrics_refuse_tenant_tokens_outside_the_allowlist, .fini = own_stop)
{
	struct tstack_tenant t;
	struct http_response *r;

	tstack_pool_paths(&own, "sec");
	const char *argv[] = { tstack_env("IDEMFLOW_FCGI"),
		               "--config",
		               tstack_env("IDEMFLOW_CONF"),
		               "--listen",
		               own.sock,
		               "--pid-file",
		               own.pidfile,
		               "--workers",
		               "1",
		               "--metrics-allow",
		               "10.0.0.0/8",
		               NULL };
	tstack_pool_run(&own, argv, 10000);
	tstack_tenant_create(&t, "scrape");
	const char *with_tenant[] = { t.auth, NULL };
	const char *none[] = { NULL };
	const char *const *who[] = { with_tenant, none };
	for (size_t i = 0; i < 2; i++) {
		r = http_fcgi_request(own.sock, "GET", "/metrics", who[i], NULL, 0);
		cr_assert_not_null(r, "%s", http_error());
		tstack_expect_problem(r, 403, "/problems/forbidden", "/metrics");
		cr_assert_null(strstr(r->body, "idemflow_"), "metrics leaked: %s", r->body);
		http_response_free(r);
	}
	/* The same token does open the API on that server. */
	r = http_fcgi_request(own.sock, "GET", COLLECTION "/00000000-0000-4000-8000-000000000000",
	                      with_tenant, NULL, 0);
	cr_assert_not_null(r, "%s", http_error());
	tstack_expect_problem(r, 404, "/problems/not-found",
	                      COLLECTION "/00000000-0000-4000-8000-000000000000");
	http_response_free(r);
}

/* --- Rate limit -------------------------------------------------------- */

static struct {
	char prefix[512];
	char port[16];
	char *saved_port;
} rl;

static void rl_stop(void)
{
	char pidfile[600];
	long pid;

	if (rl.saved_port != NULL) {
		setenv("IDEMFLOW_PORT", rl.saved_port, 1);
		free(rl.saved_port);
		rl.saved_port = NULL;
	}
	snprintf(pidfile, sizeof(pidfile), "%s/nginx.pid", rl.prefix);
	pid = tstack_pidfile_read(pidfile);
	if (pid > 0) {
		kill((pid_t)pid, SIGTERM);
		for (int i = 0; i < 100 && !tstack_pid_gone((pid_t)pid); i++)
			tstack_sleep_ms(50);
	}
}

static int free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
		                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert(fd >= 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

/* A second nginx in front of the same workers: the harness's configuration
 * with the per-token limit_req example turned on, at one request a minute
 * with a burst of 2, so the outcome does not depend on timing. */
static void rl_start(void)
{
	const char *dir = tstack_env("IDEMFLOW_STACK_DIR");
	char src[700], dst[700], old_prefix[600], cmd[2400], line[4096];
	char main_listen[64], metrics_listen[64];
	FILE *in, *out;

	snprintf(main_listen, sizeof(main_listen), "listen 127.0.0.1:%s;",
	         tstack_env("IDEMFLOW_PORT"));
	snprintf(metrics_listen, sizeof(metrics_listen), "listen 127.0.0.1:%s;",
	         tstack_env("IDEMFLOW_METRICS_PORT"));

	snprintf(old_prefix, sizeof(old_prefix), "%s/nginx", dir);
	snprintf(rl.prefix, sizeof(rl.prefix), "%s/nginx-ratelimit", dir);
	snprintf(rl.port, sizeof(rl.port), "%d", free_port());
	snprintf(src, sizeof(src), "%s/nginx.conf", old_prefix);
	snprintf(dst, sizeof(dst), "%s/nginx.conf", rl.prefix);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/tmp'", rl.prefix);
	cr_assert_eq(system(cmd), 0);
	in = fopen(src, "r");
	out = fopen(dst, "w");
	cr_assert(in && out, "%s or %s: %s", src, dst, strerror(errno));
	int zone = 0, limit = 0;
	while (fgets(line, sizeof(line), in)) {
		char *at;
		if ((at = strstr(line, "# limit_req_zone ")) != NULL) {
			/* The shipped key, at a rate a test can count on. */
			char *rate = strstr(at, " zone=");
			cr_assert_not_null(rate, "%s", line);
			fprintf(out, "%.*s zone=idemflow_per_token:1m rate=1r/m;\n",
			        (int)(rate - (at + 2)), at + 2);
			zone = 1;
			continue;
		}
		if (strstr(line, "# limit_req zone=") != NULL) {
			fputs("limit_req zone=idemflow_per_token burst=2 nodelay;\n", out);
			limit = 1;
			continue;
		}
		if (strstr(line, main_listen) != NULL) {
			fprintf(out, "listen 127.0.0.1:%s;\n", rl.port);
			continue;
		}
		if (strstr(line, metrics_listen) != NULL) {
			fprintf(out, "listen 127.0.0.1:%d;\n", free_port());
			continue;
		}
		/* Every path under the old prefix moves to ours. */
		char *p = line;
		while ((at = strstr(p, old_prefix)) != NULL) {
			fwrite(p, 1, (size_t)(at - p), out);
			fputs(rl.prefix, out);
			p = at + strlen(old_prefix);
		}
		fputs(p, out);
	}
	fclose(in);
	fclose(out);
	cr_assert(zone && limit, "the limit_req example is missing from %s", src);
	snprintf(cmd, sizeof(cmd),
	         "nginx=$(command -v nginx || echo /usr/sbin/nginx); "
	         "\"$nginx\" -p '%s/' -c nginx.conf -e '%s/error.log' 2>'%s/start.err'",
	         rl.prefix, rl.prefix, rl.prefix);
	cr_assert_eq(system(cmd), 0, "nginx with the rate limit did not start; see %s/start.err",
	             rl.prefix);
	rl.saved_port = strdup(tstack_env("IDEMFLOW_PORT"));
	setenv("IDEMFLOW_PORT", rl.port, 1);
	double deadline = tstack_now() + 10;
	for (;;) {
		struct http_response *r = http_request("GET", "/healthz", NULL, NULL, 0);
		if (r != NULL) {
			http_response_free(r);
			break;
		}
		cr_assert(tstack_now() < deadline, "nginx on %s does not answer", rl.port);
		tstack_sleep_ms(50);
	}
}

Test(rate_limit, the_per_token_example_refuses_with_429_per_token, .fini = rl_stop)
{
	struct tstack_tenant a, b;
	char path[80], uuid[37];
	int ok = 0, limited = 0;

	tstack_tenant_create(&a, "rl-a");
	tstack_tenant_create(&b, "rl-b");
	rl_start();
	tstack_uuid(uuid);
	snprintf(path, sizeof(path), COLLECTION "/%s", uuid);
	const char *ha[] = { a.auth, NULL }, *hb[] = { b.auth, NULL };
	for (int i = 0; i < 10; i++) {
		struct http_response *r = http_request("GET", path, ha, NULL, 0);
		cr_assert_not_null(r, "%s", http_error());
		if (r->status == 404) {
			ok++;
		} else {
			tstack_expect_problem(r, 429, "/problems/too-many-requests", path);
			tstack_expect_header(r, "Retry-After", "1");
			limited++;
		}
		http_response_free(r);
	}
	/* One a minute plus a burst of 2: the first 3 pass. */
	cr_assert_eq(ok, 3, "%d passed, %d refused", ok, limited);
	cr_assert_eq(limited, 7);
	/* Another token has its own budget; no token is not counted. */
	for (int i = 0; i < 3; i++) {
		struct http_response *r = http_request("GET", path, hb, NULL, 0);
		cr_assert_not_null(r, "%s", http_error());
		cr_assert_eq(r->status, 404, "tenant B, request %d: %d", i, r->status);
		http_response_free(r);
		r = http_request("GET", "/healthz", NULL, NULL, 0);
		cr_assert_not_null(r, "%s", http_error());
		cr_assert_eq(r->status, 204);
		http_response_free(r);
	}
}

/*
 * The limit is per token, not per spelling of the header: the app reads
 * "Bearer" in any case followed by any number of spaces, so a client that
 * varies them must not get a budget per variant.
 */
Test(rate_limit, variants_of_the_bearer_scheme_share_the_token_budget, .fini = rl_stop)
{
	struct tstack_tenant a;
	char path[80], uuid[37], variants[4][200];
	const char *tok;
	int ok = 0, limited = 0;

	tstack_tenant_create(&a, "rl-variants");
	tok = a.auth + strlen("Authorization: Bearer ");
	snprintf(variants[0], sizeof(variants[0]), "Authorization: Bearer %s", tok);
	snprintf(variants[1], sizeof(variants[1]), "Authorization: bearer %s", tok);
	snprintf(variants[2], sizeof(variants[2]), "Authorization: BEARER    %s", tok);
	snprintf(variants[3], sizeof(variants[3]), "authorization: bEaReR  %s", tok);
	rl_start();
	tstack_uuid(uuid);
	snprintf(path, sizeof(path), COLLECTION "/%s", uuid);
	for (int i = 0; i < 12; i++) {
		const char *h[] = { variants[i % 4], NULL };
		struct http_response *r = http_request("GET", path, h, NULL, 0);

		cr_assert_not_null(r, "%s", http_error());
		if (r->status == 404) {
			ok++;
		} else {
			tstack_expect_problem(r, 429, "/problems/too-many-requests", path);
			limited++;
		}
		http_response_free(r);
	}
	/* Every variant is the token (the app answered 404, not 401), and
	 * all of them together get one budget: one a minute plus 2. */
	cr_assert_eq(ok, 3, "%d passed, %d refused", ok, limited);
	cr_assert_eq(limited, 9);
}

/* --- /metrics behind nginx ---------------------------------------------- */

static struct http_response *get_on(const char *port, const char *path)
{
	char *saved = strdup(tstack_env("IDEMFLOW_PORT"));
	struct http_response *r;

	setenv("IDEMFLOW_PORT", port, 1);
	r = http_request("GET", path, NULL, NULL, 0);
	setenv("IDEMFLOW_PORT", saved, 1);
	free(saved);
	cr_assert_not_null(r, "GET %s on port %s: %s", path, port, http_error());
	return r;
}

/*
 * A TLS proxy on the same host makes every client of the site 127.0.0.1,
 * so the site's client address must not open /metrics: there it takes the
 * metrics_token. Scrapers by address use the loopback metrics listener,
 * which serves /metrics and nothing else.
 */
Test(operator, metrics_by_address_only_on_the_metrics_listener)
{
	struct http_response *r;

	/* From 127.0.0.1 through the site, as every client behind a local
	 * proxy would be. */
	r = get_on(tstack_env("IDEMFLOW_PORT"), "/metrics");
	tstack_expect_problem(r, 403, "/problems/forbidden", "/metrics");
	cr_assert_null(strstr(r->body, "idemflow_"), "metrics leaked: %s", r->body);
	http_response_free(r);

	r = get_on(tstack_env("IDEMFLOW_METRICS_PORT"), "/metrics");
	cr_assert_eq(r->status, 200, "metrics listener: %d %.300s", r->status, r->body);
	cr_assert_not_null(strstr(r->body, "\nidemflow_workers "), "%.300s", r->body);
	http_response_free(r);

	/* Nothing of the API on the metrics listener. */
	r = get_on(tstack_env("IDEMFLOW_METRICS_PORT"), "/healthz");
	tstack_expect_problem(r, 404, "/problems/not-found", "/healthz");
	http_response_free(r);
	r = get_on(tstack_env("IDEMFLOW_METRICS_PORT"), COLLECTION);
	tstack_expect_problem(r, 404, "/problems/not-found", COLLECTION);
	http_response_free(r);
}

/* --- A token revoked while its request is in flight ---------------------- */

struct inflight {
	const char *auth, *key;
	struct http_response *r;
};

static void *inflight_create(void *arg)
{
	static const char body[] = "{\"type\":\"inflight\"}";
	struct inflight *f = arg;
	char kh[200];
	const char *h[] = { f->auth, "Content-Type: application/json", kh, NULL };

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", f->key);
	f->r = http_request("POST", COLLECTION, h, body, sizeof(body) - 1);
	return NULL;
}

/*
 * The bound the README states: the token check is a request's first
 * statement, its write a later one, and a revoke does not reach back into
 * a request already past its check. Such a request (here held on its key
 * while the revoke commits) still completes its write; every request that
 * checks the token after the revoke is refused.
 */
Test(tokens, a_revoke_does_not_stop_a_request_already_past_its_token_check)
{
	struct tstack_tenant t;
	struct inflight f;
	pthread_t th;
	char key[128], out[256], uuid[37], path[80];
	const char *tok;
	PGconn *hold = tstack_db_connect();
	struct http_response *r;
	int rc;

	tstack_tenant_create(&t, "inflight");
	tok = t.auth + strlen("Authorization: Bearer ");
	tstack_key(key, sizeof(key), "inflight");
	tstack_key_hold(hold, &t, key);
	f = (struct inflight){ .auth = t.auth, .key = key };
	cr_assert_eq(pthread_create(&th, NULL, inflight_create, &f), 0);
	/* Well inside idempotency_wait, or the create would give up with 409. */
	cr_assert_neq(tstack_blocked_worker(hold, tstack_conf_ms("idempotency_wait", 1000) / 2), 0,
	              "the create never reached its write");
	/* No replay cache wait: the revoke returns as soon as it committed. */
	rc = tstack_cli(out, sizeof(out), "--replay-cache-ttl", "0", "token", "revoke", tok, NULL);
	cr_assert_eq(rc, 0, "revoke: %s", tstack_cli_stderr());
	tstack_exec(hold, "ROLLBACK");
	PQfinish(hold);
	pthread_join(th, NULL);
	cr_assert_not_null(f.r, "%s", http_error());
	cr_assert_eq(f.r->status, 201, "the request in flight: %d %s", f.r->status, f.r->body);
	http_response_free(f.r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows w JOIN api_tokens a"
	                          "  ON a.tenant_id = w.tenant_id"
	                          " WHERE w.tenant_id = $1 AND a.revoked_at IS NOT NULL",
	                          t.id_text),
	             1);

	tstack_uuid(uuid);
	snprintf(path, sizeof(path), COLLECTION "/%s", uuid);
	const char *h[] = { t.auth, NULL };
	r = http_request("GET", path, h, NULL, 0);
	cr_assert_not_null(r, "%s", http_error());
	cr_assert_eq(r->status, 401, "after the revoke: %d %s", r->status, r->body);
	http_response_free(r);
}

/* --- The local stack's secrets ------------------------------------------- */

/* Run a shell command; its exit status, and its output in out. */
static int sh(char *out, size_t outsz, const char *cmd)
{
	FILE *f = popen(cmd, "r");
	size_t n;
	int st;

	cr_assert_not_null(f, "%s", cmd);
	n = fread(out, 1, outsz - 1, f);
	out[n] = '\0';
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/*
 * The stack t/run-test starts (scripts/lib/stack.sh, as scripts/run does):
 * its configuration and PostgreSQL password file are the owner's alone,
 * its FastCGI socket is writable by nginx's workers but not by everyone,
 * and its PostgreSQL lets in the stack's owner, not every local user.
 */
Test(local_stack, secrets_are_private_and_postgres_trusts_only_the_owner)
{
	struct stat st;
	char cmd[2048], out[4096];
	int rc;

	cr_assert_eq(stat(tstack_env("IDEMFLOW_CONF"), &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0600, "idemflow.conf has mode %o", st.st_mode & 0777);
	cr_assert_eq(stat(tstack_env("PGPASSFILE"), &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0600, "pgpass has mode %o", st.st_mode & 0777);

	cr_assert_eq(stat(tstack_env("IDEMFLOW_FCGI_SOCKET"), &st), 0);
	cr_assert(S_ISSOCK(st.st_mode));
	cr_assert_eq(st.st_mode & 0007, 0, "the FastCGI socket is open to everyone: %o",
	             st.st_mode & 0777);
	if (geteuid() == 0) {
		/* nginx's workers (www-data) connect through the group. */
		struct group *g = getgrnam("www-data");
		cr_assert_not_null(g);
		cr_assert_eq(st.st_gid, g->gr_gid, "socket group %u", (unsigned)st.st_gid);
		cr_assert_eq(st.st_mode & 0060, 0060, "mode %o", st.st_mode & 0777);
	}

	/* The owner, over the socket (peer) and over TCP (the password). */
	snprintf(cmd, sizeof(cmd), "'%s/psql' -XAtq -w -c 'SELECT 42' 2>&1",
	         tstack_env("IDEMFLOW_PG_BINDIR"));
	rc = sh(out, sizeof(out), cmd);
	cr_assert(rc == 0 && strcmp(out, "42\n") == 0, "owner over the socket: %d %s", rc, out);
	snprintf(cmd, sizeof(cmd), "'%s/psql' -XAtq -w -h 127.0.0.1 -c 'SELECT 42' 2>&1",
	         tstack_env("IDEMFLOW_PG_BINDIR"));
	rc = sh(out, sizeof(out), cmd);
	cr_assert(rc == 0 && strcmp(out, "42\n") == 0, "owner over TCP: %d %s", rc, out);

	/* Over TCP without the password: refused. */
	snprintf(cmd, sizeof(cmd),
	         "PGPASSFILE=/dev/null '%s/psql' -XAtq -w -h 127.0.0.1 -c 'SELECT 42' 2>&1",
	         tstack_env("IDEMFLOW_PG_BINDIR"));
	rc = sh(out, sizeof(out), cmd);
	cr_assert_neq(rc, 0, "TCP without a password got in: %s", out);
	cr_assert_not_null(strstr(out, "no password supplied"), "%s", out);

	/* Another local user, over the socket: refused. */
	if (geteuid() == 0) {
		snprintf(cmd, sizeof(cmd),
		         "cd / && PGPASSFILE=/dev/null runuser -u nobody -- '%s/psql' -XAtq -w -c"
		         " 'SELECT 42' 2>&1",
		         tstack_env("IDEMFLOW_PG_BINDIR"));
		rc = sh(out, sizeof(out), cmd);
		cr_assert_neq(rc, 0, "user nobody got in: %s", out);
		cr_assert_not_null(strstr(out, "Peer authentication failed for user \"postgres\""),
		                   "%s", out);
		/* Nor as another role without its password. */
		snprintf(cmd, sizeof(cmd),
		         "cd / && PGPASSFILE=/dev/null runuser -u nobody -- '%s/psql' -XAtq -w"
		         " -U nobody -c 'SELECT 42' 2>&1",
		         tstack_env("IDEMFLOW_PG_BINDIR"));
		rc = sh(out, sizeof(out), cmd);
		cr_assert_neq(rc, 0, "user nobody got in as nobody: %s", out);
		cr_assert_not_null(strstr(out, "no password supplied"), "%s", out);
	}
}

TSTACK_SEQUENTIAL
