/*
 * End-to-end test helpers; see tstack.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf, pipe2 */
#endif
#include "tstack.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <regex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <criterion/options.h>

#define TSTACK_MAX_PARAMS 16

static PGconn *tstack_conn;
/* What the last CLI run wrote to stderr: quoted when it failed, and kept
 * out of the test log when it did not. */
static char tstack_cli_err[2048];

const char *tstack_cli_stderr(void)
{
	return tstack_cli_err;
}

const char *tstack_env(const char *name)
{
	const char *v = getenv(name);

	cr_assert(v && *v, "%s is not set: run this test through t/run-test",
		  name);
	return v;
}

/* --- Configuration ----------------------------------------------------- */

static char *str_trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

int tstack_conf_get(const char *key, char *out, size_t outsz)
{
	const char *path = tstack_env("IDEMFLOW_CONF");
	FILE *f = fopen(path, "r");
	char line[1024];
	int found = 0;

	cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		char *hash = strchr(line, '#');
		char *eq, *k, *v;

		if (hash)
			*hash = '\0';
		eq = strchr(line, '=');
		if (!eq)
			continue;
		*eq = '\0';
		k = str_trim(line);
		v = str_trim(eq + 1);
		for (char *c = k; *c; c++)
			if (*c == '-')
				*c = '_';
		/* Later lines win, as in any key = value file. */
		if (strcmp(k, key) == 0) {
			snprintf(out, outsz, "%s", v);
			found = 1;
		}
	}
	fclose(f);
	return found;
}

/* "<digits><suffix>" with the suffix scaling from units (NULL-ended). */
static long conf_scaled(const char *key, const char *v,
			const char *const *suffixes, const long *mult)
{
	char *end;
	long n = strtol(v, &end, 10);

	for (size_t i = 0; suffixes[i]; i++)
		if (end != v && strcmp(end, suffixes[i]) == 0)
			return n * mult[i];
	cr_assert_fail("cannot parse %s = %s in $IDEMFLOW_CONF", key, v);
	return 0;
}

long tstack_conf_ms(const char *key, long fallback_ms)
{
	static const char *const sfx[] = { "", "ms", "s", "m", "h", "d", NULL };
	static const long mult[] = { 1000, 1, 1000, 60000, 3600000, 86400000 };
	char v[128];

	if (!tstack_conf_get(key, v, sizeof(v)))
		return fallback_ms;
	return conf_scaled(key, v, sfx, mult);
}

long tstack_conf_long(const char *key, long fallback)
{
	static const char *const sfx[] = { "", "k", "K", "m", "M", NULL };
	static const long mult[] = { 1, 1024, 1024, 1048576, 1048576 };
	char v[128];

	if (!tstack_conf_get(key, v, sizeof(v)))
		return fallback;
	return conf_scaled(key, v, sfx, mult);
}

/* --- Admin CLI --------------------------------------------------------- */

/*
 * fork/exec rather than popen: DATABASE_URL is a conninfo string with
 * spaces and quotes, and passing it as one argv element avoids quoting it
 * for a shell.
 */
int tstack_cli(char *out, size_t outsz, const char *arg, ...)
{
	const char *argv[32];
	size_t argc = 0, len = 0;
	int pipefd[2], status;
	FILE *errf;
	va_list ap;
	pid_t pid;

	argv[argc++] = tstack_env("IDEMFLOW_CLI");
	argv[argc++] = "--db";
	argv[argc++] = tstack_env("DATABASE_URL");
	va_start(ap, arg);
	for (const char *a = arg; a; a = va_arg(ap, const char *)) {
		cr_assert(argc < sizeof(argv) / sizeof(argv[0]) - 1);
		argv[argc++] = a;
	}
	va_end(ap);
	argv[argc] = NULL;

	errf = tmpfile();
	cr_assert_not_null(errf, "tmpfile: %s", strerror(errno));
	cr_assert_eq(pipe2(pipefd, O_CLOEXEC), 0, "pipe: %s", strerror(errno));
	fflush(NULL);
	pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		dup2(pipefd[1], STDOUT_FILENO);
		dup2(fileno(errf), STDERR_FILENO);
		execv(argv[0], (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(pipefd[1]);
	for (;;) {
		char chunk[512];
		ssize_t n = read(pipefd[0], chunk, sizeof(chunk));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		/* Keep what fits; the rest is drained so the child never
		 * blocks on a full pipe. */
		for (ssize_t i = 0; i < n && len + 1 < outsz; i++)
			out[len++] = chunk[i];
	}
	close(pipefd[0]);
	if (outsz)
		out[len] = '\0';
	while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == '\r'))
		out[--len] = '\0';
	while (waitpid(pid, &status, 0) < 0)
		cr_assert_eq(errno, EINTR, "waitpid: %s", strerror(errno));
	rewind(errf);
	len = fread(tstack_cli_err, 1, sizeof(tstack_cli_err) - 1, errf);
	tstack_cli_err[len] = '\0';
	fclose(errf);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void tstack_token_create(const char *tenant, char *out, size_t outsz)
{
	int rc = tstack_cli(out, outsz, "token", "create", "--tenant", tenant,
			    NULL);

	cr_assert_eq(rc, 0, "idemflow token create --tenant %s exited %d: %s",
		     tenant, rc, tstack_cli_err);
	cr_assert(out[0] != '\0' && !strpbrk(out, " \t\r\n"),
		  "token create must print exactly one token, printed \"%s\"",
		  out);
}

void tstack_token_revoke(const char *token)
{
	char out[256];
	int rc = tstack_cli(out, sizeof(out), "token", "revoke", token, NULL);

	cr_assert_eq(rc, 0, "idemflow token revoke exited %d: %s", rc,
		     tstack_cli_err);
}

void tstack_tenant_create(struct tstack_tenant *t, const char *label)
{
	char hex[9], out[256], clean[33];
	size_t i;
	int rc;

	memset(t, 0, sizeof(*t));
	/* Tenant names allow [A-Za-z0-9._-]; test names may hold more. */
	for (i = 0; label[i] && i < sizeof(clean) - 1; i++)
		clean[i] = isalnum((unsigned char)label[i]) ? label[i] : '-';
	clean[i] = '\0';
	tstack_random_hex(hex, 4);
	snprintf(t->name, sizeof(t->name), "t-%s-%ld-%s", clean,
		 (long)getpid(), hex);

	rc = tstack_cli(out, sizeof(out), "tenant", "create", t->name, NULL);
	cr_assert_eq(rc, 0, "idemflow tenant create %s exited %d: %s", t->name,
		     rc, tstack_cli_err);
	/* Take the id from the table, not from the CLI's wording. */
	t->id = tstack_count("SELECT id FROM tenants WHERE name = $1",
			     t->name);
	snprintf(t->id_text, sizeof(t->id_text), "%ld", t->id);
	cr_assert_str_eq(out, t->id_text,
			 "tenant create must print the tenant id");

	tstack_tenant_retoken(t);
}

void tstack_tenant_retoken(struct tstack_tenant *t)
{
	tstack_token_create(t->name, t->token, sizeof(t->token));
	snprintf(t->auth, sizeof(t->auth), "Authorization: Bearer %s",
		 t->token);
}

/* --- Database ---------------------------------------------------------- */

static void tstack_db_close(void)
{
	PQfinish(tstack_conn);
	tstack_conn = NULL;
}

PGconn *tstack_db_connect(void)
{
	const char *keys[] = { "dbname", "application_name", NULL };
	const char *vals[] = { tstack_env("DATABASE_URL"), "idemflow-tests",
			       NULL };
	PGconn *c = PQconnectdbParams(keys, vals, 1);

	cr_assert_not_null(c, "out of memory");
	cr_assert_eq(PQstatus(c), CONNECTION_OK, "connect to DATABASE_URL: %s",
		     PQerrorMessage(c));
	return c;
}

PGconn *tstack_db(void)
{
	if (!tstack_conn) {
		tstack_conn = tstack_db_connect();
		atexit(tstack_db_close);
	}
	return tstack_conn;
}

static size_t params_collect(va_list ap, const char **params)
{
	size_t n = 0;

	for (const char *p = va_arg(ap, const char *); p;
	     p = va_arg(ap, const char *)) {
		cr_assert(n < TSTACK_MAX_PARAMS, "too many query parameters");
		params[n++] = p;
	}
	return n;
}

static PGresult *query_run(PGconn *conn, const char *sql, va_list ap)
{
	const char *params[TSTACK_MAX_PARAMS];
	size_t n = params_collect(ap, params);
	PGresult *res = PQexecParams(conn, sql, (int)n, NULL, params, NULL,
				     NULL, 0);
	ExecStatusType st = PQresultStatus(res);

	cr_assert(st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK,
		  "query failed: %s\n  %s", PQresultErrorMessage(res), sql);
	return res;
}

/* The single value of a one-row, one-column result, or NULL. */
static char *query_value(const char *sql, va_list ap)
{
	PGresult *res = query_run(tstack_db(), sql, ap);
	char *v = NULL;

	cr_assert(PQntuples(res) == 1 && PQnfields(res) == 1,
		  "expected one row and one column, got %d x %d: %s",
		  PQntuples(res), PQnfields(res), sql);
	if (!PQgetisnull(res, 0, 0)) {
		v = strdup(PQgetvalue(res, 0, 0));
		cr_assert_not_null(v, "out of memory");
	}
	PQclear(res);
	return v;
}

long tstack_count_(const char *sql, ...)
{
	va_list ap;
	char *v, *end;
	long n;

	va_start(ap, sql);
	v = query_value(sql, ap);
	va_end(ap);
	cr_assert_not_null(v, "NULL where a number was expected: %s", sql);
	n = strtol(v, &end, 10);
	cr_assert(*end == '\0', "not an integer: %s (%s)", v, sql);
	free(v);
	return n;
}

char *tstack_text_(const char *sql, ...)
{
	va_list ap;
	char *v;

	va_start(ap, sql);
	v = query_value(sql, ap);
	va_end(ap);
	return v;
}

void tstack_exec_(PGconn *conn, const char *sql, ...)
{
	va_list ap;

	va_start(ap, sql);
	PQclear(query_run(conn, sql, ap));
	va_end(ap);
}

void tstack_key_hold(PGconn *conn, const struct tstack_tenant *t,
		     const char *key)
{
	tstack_exec(conn, "BEGIN");
	/* Values other than (tenant_id, key) are never read: the row is
	 * rolled back before anyone can see it. */
	tstack_exec(conn,
		    "INSERT INTO idempotency_keys (tenant_id, key, method, path,"
		    " fingerprint, status, headers, body, created_at,"
		    " expires_at)"
		    " VALUES ($1, $2, 'POST', '/v1/workflows',"
		    " decode('00', 'hex'), 201, '', '', now(),"
		    " now() + interval '1 day')",
		    t->id_text, key);
}

/* --- JSON -------------------------------------------------------------- */

static char *json_query(const char *sql, const char *json, const char *path)
{
	PGresult *res;
	const char *params[2] = { json, path };
	char *v = NULL;

	res = PQexecParams(tstack_db(), sql, 2, NULL, params, NULL, NULL, 0);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK,
		     "body is not valid JSON (%s): %.300s",
		     PQresultErrorMessage(res), json);
	if (!PQgetisnull(res, 0, 0)) {
		v = strdup(PQgetvalue(res, 0, 0));
		cr_assert_not_null(v, "out of memory");
	}
	PQclear(res);
	return v;
}

char *tstack_json(const char *json, const char *path)
{
	return json_query("SELECT $1::jsonb #>> $2::text[]", json, path);
}

char *tstack_json_type(const char *json, const char *path)
{
	return json_query("SELECT jsonb_typeof($1::jsonb #> $2::text[])", json,
			  path);
}

/* --- Unique names ------------------------------------------------------ */

void tstack_random_hex(char *out, size_t nbytes)
{
	unsigned char b[64];

	cr_assert(nbytes <= sizeof(b));
	cr_assert_eq(getrandom(b, nbytes, 0), (ssize_t)nbytes, "getrandom");
	for (size_t i = 0; i < nbytes; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
	out[2 * nbytes] = '\0';
}

void tstack_uuid(char out[37])
{
	unsigned char b[16];

	cr_assert_eq(getrandom(b, sizeof(b), 0), (ssize_t)sizeof(b));
	b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
	b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
	snprintf(out, 37,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
		 "%02x%02x%02x%02x%02x%02x",
		 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
		 b[10], b[11], b[12], b[13], b[14], b[15]);
}

void tstack_key(char *out, size_t outsz, const char *label)
{
	char hex[17];

	tstack_random_hex(hex, 8);
	snprintf(out, outsz, "k-%s-%ld-%s", label, (long)getpid(), hex);
}

/* --- Processes --------------------------------------------------------- */

/* State and parent from /proc/<pid>/stat; 0 when the process is gone. */
static int proc_stat(pid_t pid, char *state, pid_t *ppid)
{
	char path[64], line[1024], *rp;
	FILE *f;
	long pp;
	int ok;

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	ok = fgets(line, sizeof(line), f) != NULL;
	fclose(f);
	/* comm may contain spaces and parentheses: parse after the last ')' */
	rp = ok ? strrchr(line, ')') : NULL;
	if (!rp || sscanf(rp + 1, " %c %ld", state, &pp) != 2)
		return 0;
	*ppid = (pid_t)pp;
	return 1;
}

pid_t tstack_supervisor_pid(void)
{
	const char *path = tstack_env("IDEMFLOW_FCGI_PIDFILE");
	FILE *f = fopen(path, "r");
	long pid = 0;

	cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));
	cr_assert_eq(fscanf(f, "%ld", &pid), 1, "no pid in %s", path);
	fclose(f);
	cr_assert(pid > 1, "bad pid %ld in %s", pid, path);
	return (pid_t)pid;
}

size_t tstack_workers(pid_t supervisor, pid_t *out, size_t max)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	size_t n = 0;

	cr_assert_not_null(d, "opendir /proc: %s", strerror(errno));
	while ((e = readdir(d))) {
		char *end, state;
		long pid = strtol(e->d_name, &end, 10);
		pid_t ppid;

		if (*end || pid <= 0)
			continue;
		/* A zombie is a dead worker the supervisor has yet to reap. */
		if (!proc_stat((pid_t)pid, &state, &ppid) ||
		    ppid != supervisor || state == 'Z' || state == 'X')
			continue;
		if (n < max)
			out[n] = (pid_t)pid;
		n++;
	}
	closedir(d);
	return n;
}

int tstack_pid_gone(pid_t pid)
{
	char state;
	pid_t ppid;

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return 1;
	/* Exited but not yet reaped by a parent that is not us. */
	return !proc_stat(pid, &state, &ppid) || state == 'Z' || state == 'X';
}

int tstack_wait_workers(pid_t supervisor, size_t n, long timeout_ms)
{
	double deadline = tstack_now() + timeout_ms / 1000.0;
	pid_t pids[64];

	for (;;) {
		if (tstack_workers(supervisor, pids, 64) == n)
			return 1;
		if (tstack_now() >= deadline)
			return 0;
		tstack_sleep_ms(20);
	}
}

pid_t tstack_blocked_worker(PGconn *holder, long timeout_ms)
{
	double deadline = tstack_now() + timeout_ms / 1000.0;
	char backend[24];

	snprintf(backend, sizeof(backend), "%d", PQbackendPID(holder));
	/* Asked on another session: pg_stat_activity is a per-transaction
	 * snapshot, and holder is inside its transaction. */
	for (;;) {
		char *v = tstack_text(
			"SELECT max(substring(application_name"
			"  FROM '-worker-([0-9]+)$'))"
			"  FROM pg_stat_activity"
			" WHERE $1::int = ANY (pg_blocking_pids(pid))"
			"   AND application_name ~ '-worker-[0-9]+$'",
			backend);

		if (v) {
			pid_t pid = (pid_t)atol(v);

			free(v);
			return pid;
		}
		if (tstack_now() >= deadline)
			return 0;
		tstack_sleep_ms(20);
	}
}

double tstack_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void tstack_sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
			       .tv_nsec = (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* --- Assertions -------------------------------------------------------- */

void tstack_expect_header(const struct http_response *r, const char *name,
			  const char *value)
{
	const char *v = http_header(r, name);

	cr_assert_not_null(v, "missing header %s (status %d, body %.300s)",
			   name, r->status, r->body);
	cr_assert(strcmp(v, value) == 0, "header %s: \"%s\", want \"%s\"",
		  name, v, value);
	cr_assert_eq(http_header_count(r, name), 1,
		     "header %s sent %zu times", name,
		     http_header_count(r, name));
}

/* Field at path of a problem body must have the given JSON type. */
static char *problem_field(const struct http_response *r, const char *path,
			   const char *type)
{
	char *t = tstack_json_type(r->body, path);

	cr_assert(t && strcmp(t, type) == 0,
		  "problem field %s must be a %s, is %s: %s", path, type,
		  t ? t : "missing", r->body);
	free(t);
	return tstack_json(r->body, path);
}

void tstack_expect_problem(const struct http_response *r, int status,
			   const char *type, const char *instance)
{
	const char *rid;
	char *root, *v, want[16];

	cr_assert_not_null(r, "no response: %s", http_error());
	cr_assert_eq(r->status, status, "status %d, want %d; body: %.500s",
		     r->status, status, r->body);
	tstack_expect_header(r, "Content-Type", "application/problem+json");
	rid = http_header(r, "X-Request-Id");
	cr_assert_not_null(rid, "missing X-Request-Id");

	root = tstack_json_type(r->body, "{}");
	cr_assert_str_eq(root, "object", "problem body: %s", r->body);
	free(root);

	v = problem_field(r, "{type}", "string");
	if (type)
		cr_assert_str_eq(v, type, "problem type; body: %s", r->body);
	else
		cr_assert(strncmp(v, "/problems/", 10) == 0 && v[10],
			  "problem type: %s", v);
	free(v);

	v = problem_field(r, "{title}", "string");
	cr_assert(v[0] != '\0', "empty problem title");
	free(v);

	snprintf(want, sizeof(want), "%d", status);
	v = problem_field(r, "{status}", "number");
	cr_assert_str_eq(v, want, "problem status must equal the HTTP status");
	free(v);

	v = problem_field(r, "{detail}", "string");
	free(v);

	v = problem_field(r, "{instance}", "string");
	cr_assert_str_eq(v, instance, "problem instance");
	free(v);

	v = problem_field(r, "{request_id}", "string");
	cr_assert_str_eq(v, rid, "request_id must equal X-Request-Id");
	free(v);
}

void tstack_expect_counts(const struct tstack_tenant *t, long workflows,
			  long events, long keys)
{
	long n;

	n = tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1",
			 t->id_text);
	cr_assert_eq(n, workflows, "workflow rows for %s: %ld, want %ld",
		     t->name, n, workflows);
	n = tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1"
			 " AND type = 'workflow.created'",
			 t->id_text);
	cr_assert_eq(n, events, "workflow.created events for %s: %ld, want %ld",
		     t->name, n, events);
	n = tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1",
			 t->id_text);
	cr_assert_eq(n, events, "outbox rows for %s: %ld, want %ld", t->name,
		     n, events);
	n = tstack_count("SELECT count(*) FROM idempotency_keys"
			 " WHERE tenant_id = $1",
			 t->id_text);
	cr_assert_eq(n, keys, "idempotency keys for %s: %ld, want %ld",
		     t->name, n, keys);
}

void tstack_expect_match(const char *s, const char *pattern, const char *what)
{
	regex_t re;
	int rc;

	cr_assert_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0,
		     "bad pattern %s", pattern);
	rc = regexec(&re, s, 0, NULL, 0);
	regfree(&re);
	cr_assert_eq(rc, 0, "%s \"%s\" does not match %s", what, s, pattern);
}

char *tstack_expect_created(const struct http_response *r, const char *type,
			    const char *canonical_input)
{
	char *id, *created_at, *want, location[64];
	const char *rid;

	cr_assert_not_null(r, "no response: %s", http_error());
	cr_assert_eq(r->status, 201, "status %d, body %.500s", r->status,
		     r->body);
	tstack_expect_header(r, "Content-Type", "application/json");
	cr_assert_null(http_header(r, "Idempotent-Replayed"),
		       "a first request is not a replay");
	rid = http_header(r, "X-Request-Id");
	cr_assert_not_null(rid, "missing X-Request-Id");
	tstack_expect_match(rid, "^[0-9a-f]{32}$", "X-Request-Id");

	id = tstack_json(r->body, "{id}");
	cr_assert_not_null(id, "no id in %s", r->body);
	tstack_expect_match(id, "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-"
				"[0-9a-f]{4}-[0-9a-f]{12}$", "id");
	snprintf(location, sizeof(location), "/v1/workflows/%s", id);
	tstack_expect_header(r, "Location", location);

	created_at = tstack_json(r->body, "{created_at}");
	cr_assert_not_null(created_at, "no created_at in %s", r->body);
	tstack_expect_match(created_at,
			    "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}"
			    ":[0-9]{2}(\\.[0-9]{1,9})?Z$", "created_at");

	cr_assert(asprintf(&want, "{\"id\":\"%s\",\"type\":\"%s\",\"state\":"
				  "\"pending\",\"input\":%s,\"created_at\":"
				  "\"%s\"}",
			   id, type, canonical_input, created_at) > 0);
	cr_assert_eq(r->body_len, strlen(want), "body %.500s, want %.500s",
		     r->body, want);
	cr_assert_str_eq(r->body, want);
	free(want);
	free(created_at);
	return id;
}

void tstack_expect_replay(const struct http_response *r,
			  const struct http_response *first)
{
	cr_assert_not_null(r, "no response: %s", http_error());
	cr_assert_eq(r->status, first->status, "status %d, body %.500s",
		     r->status, r->body);
	tstack_expect_header(r, "Idempotent-Replayed", "true");
	tstack_expect_header(r, "Location", http_header(first, "Location"));
	tstack_expect_header(r, "Content-Type", "application/json");
	cr_assert_eq(r->body_len, first->body_len, "replayed %.500s, first %.500s",
		     r->body, first->body);
	cr_assert(memcmp(r->body, first->body, r->body_len) == 0,
		  "replayed %.500s, first %.500s", r->body, first->body);
}

void tstack_pg_ctl(const char *action)
{
	char cmd[2048];
	int rc;

	snprintf(cmd, sizeof(cmd),
		 "cd / && %s '%s/pg_ctl' -D '%s' -l '%s' -m fast -w -t 60 %s >/dev/null 2>&1",
		 geteuid() == 0 ? "runuser -u postgres --" : "", tstack_env("IDEMFLOW_PG_BINDIR"),
		 tstack_env("IDEMFLOW_PG_DATA"), tstack_env("IDEMFLOW_PG_LOG"), action);
	rc = system(cmd);
	cr_assert_eq(rc, 0, "pg_ctl %s failed: %d", action, rc);
}

void tstack_sequential_hook(void *test_set)
{
	(void)test_set;
	criterion_options.jobs = 1;
}

int tstack_socket_accepts(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int ok;

	if (fd < 0)
		return 0;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

long tstack_pidfile_read(const char *path)
{
	FILE *f = fopen(path, "r");
	long pid = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%ld", &pid) != 1)
		pid = 0;
	fclose(f);
	return pid;
}

/*
 * Sanitizer builds: Criterion's runner (the process that starts one
 * process per test, and runs no test code itself) leaks a 48-byte block
 * of its own when it runs tests in parallel, which LeakSanitizer reports
 * as the runner exits. The runtime calls this hook, by its name, before
 * that check: the runner skips it, every test process keeps it. Test
 * processes are re-executed by Criterion's BoxFort with BXFI_MAP in their
 * environment, which is how they are told apart (Criterion 2.4); the
 * programs that tests start are other binaries, without this hook.
 */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void)
{
	return getenv("BXFI_MAP") == NULL;
}

void tstack_pool_paths(struct tstack_pool *p, const char *tag)
{
	const char *dir = tstack_env("IDEMFLOW_STACK_DIR");
	long pid = (long)getpid();
	int a, b, c;

	memset(p, 0, sizeof(*p));
	a = snprintf(p->sock, sizeof(p->sock), "%s/%s%ld-fcgi.sock", dir, tag, pid);
	b = snprintf(p->pidfile, sizeof(p->pidfile), "%s/%s%ld-fcgi.pid", dir, tag, pid);
	c = snprintf(p->log, sizeof(p->log), "%s/%s%ld-fcgi.log", dir, tag, pid);
	cr_assert(a > 0 && (size_t)a < sizeof(p->sock) && b > 0 && (size_t)b < sizeof(p->pidfile) &&
		      c > 0 && (size_t)c < sizeof(p->log),
		  "paths too long under %s", dir);
}

pid_t tstack_spawn(const char *const *argv, const char *log)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		setpgid(0, 0);
		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		execvp(argv[0], (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	return pid;
}

void tstack_pool_run(struct tstack_pool *p, const char *const *argv, long timeout_ms)
{
	double deadline;

	p->pid = tstack_spawn(argv, p->log);
	deadline = tstack_now() + (double)timeout_ms / 1e3;
	while (!tstack_socket_accepts(p->sock) || tstack_pidfile_read(p->pidfile) == 0) {
		int status = 0;

		cr_assert(waitpid(p->pid, &status, WNOHANG) == 0,
			  "%s exited during startup, status 0x%x; see %s", argv[0], status, p->log);
		cr_assert(tstack_now() < deadline, "%s not ready within %ld ms; see %s", argv[0],
			  timeout_ms, p->log);
		tstack_sleep_ms(20);
	}
}

void tstack_pool_kill(struct tstack_pool *p, int sig)
{
	if (p->pid <= 0)
		return;
	kill(-p->pid, sig);
	waitpid(p->pid, NULL, 0);
	p->pid = 0;
}

/* --- Which worker answered ---------------------------------------------- */

static char *tstack_slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *text = NULL, buf[65536];
	size_t len = 0, n;
	FILE *m;

	if (f == NULL)
		return strdup("");
	m = open_memstream(&text, &len);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, m);
	fclose(m);
	fclose(f);
	return text;
}

int tstack_file_contains(const char *path, const char *needle)
{
	char *text = tstack_slurp(path);
	int found = strstr(text, needle) != NULL;

	free(text);
	return found;
}

long tstack_worker_of(const char *log, const char *request_id)
{
	char needle[96];
	double deadline = tstack_now() + 3;

	if (request_id == NULL || *request_id == '\0')
		return 0;
	snprintf(needle, sizeof(needle), "request_id=%s", request_id);
	do {
		char *text = tstack_slurp(log), *at = strstr(text, needle);
		long pid = 0;

		if (at != NULL) {
			char *line = at, *p;
			while (line > text && line[-1] != '\n')
				line--;
			p = strstr(line, " pid=");
			if (p != NULL && p < at)
				pid = atol(p + 5);
		}
		free(text);
		if (pid > 0)
			return pid;
		tstack_sleep_ms(20);
	} while (tstack_now() < deadline);
	return 0;
}

struct tstack_shot {
	struct http_response *(*send)(int i, void *arg);
	void *arg;
	int i;
	pthread_barrier_t *go;
	struct http_response *r;
	char err[256];
};

static void *tstack_shot_run(void *p)
{
	struct tstack_shot *s = p;

	pthread_barrier_wait(s->go);
	s->r = s->send(s->i, s->arg);
	if (s->r == NULL)
		snprintf(s->err, sizeof(s->err), "%s", http_error());
	return NULL;
}

#define TSTACK_MAX_WIDTH 64

int tstack_every_worker(pid_t supervisor, const char *log, int width, int max_bursts,
			struct http_response *(*send)(int i, void *arg),
			void (*check)(const struct http_response *r, int i, void *arg),
			void *arg)
{
	pid_t pids[TSTACK_MAX_WIDTH];
	int seen[TSTACK_MAX_WIDTH] = {0};
	size_t npids = tstack_workers(supervisor, pids, TSTACK_MAX_WIDTH), nseen = 0;
	int sent = 0, bursts = 0;

	cr_assert(npids > 0 && npids <= TSTACK_MAX_WIDTH, "%zu workers", npids);
	cr_assert(width > 0 && width <= TSTACK_MAX_WIDTH);
	while (nseen < npids) {
		struct tstack_shot shots[TSTACK_MAX_WIDTH];
		pthread_t th[TSTACK_MAX_WIDTH];
		pthread_barrier_t go;

		cr_assert(bursts++ < max_bursts, "after %d bursts of %d only %zu of %zu workers answered",
			  max_bursts, width, nseen, npids);
		pthread_barrier_init(&go, NULL, (unsigned)width);
		for (int k = 0; k < width; k++) {
			shots[k] = (struct tstack_shot){.send = send, .arg = arg, .i = sent + k, .go = &go};
			cr_assert_eq(pthread_create(&th[k], NULL, tstack_shot_run, &shots[k]), 0);
		}
		for (int k = 0; k < width; k++)
			pthread_join(th[k], NULL);
		pthread_barrier_destroy(&go);
		for (int k = 0; k < width; k++) {
			const char *rid;
			long pid;

			cr_assert_not_null(shots[k].r, "request %d: %s", sent + k, shots[k].err);
			check(shots[k].r, sent + k, arg);
			rid = http_header(shots[k].r, "X-Request-Id");
			pid = tstack_worker_of(log, rid);
			cr_assert(pid > 0, "no request line for request %s", rid ? rid : "(no id)");
			for (size_t j = 0; j < npids; j++)
				if (pids[j] == pid && !seen[j]) {
					seen[j] = 1;
					nseen++;
				}
			http_response_free(shots[k].r);
		}
		sent += width;
	}
	cr_log_info("every one of %zu workers answered (%d requests in %d bursts)", npids, sent,
		    bursts);
	return sent;
}
