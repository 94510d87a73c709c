/*
 * idemflow-dispatch as a test runs it; see tdispatch.h.
 */
#include "tdispatch.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "core/db.h"
#include "tstack.h"

void tdispatch_open(struct tdispatch *d, const char *appname, const char *tag)
{
	struct err e;
	char name[64];
	PGresult *res;

	memset(d, 0, sizeof(*d));
	d->tag = tag;
	d->conn = db_connect_simple(tstack_env("DATABASE_URL"), appname, &e);
	cr_assert_not_null(d->conn, "%s", e.msg);
	/* Start from an outbox with nothing due: earlier tests' leftovers
	 * would otherwise be delivered by this test's runs. */
	PQclear(tdispatch_sql(d,
	                      "UPDATE outbox\n"
	                      "   SET published_at = now()\n"
	                      " WHERE published_at IS NULL\n",
	                      0, NULL));
	snprintf(name, sizeof(name), "%s-%ld-%d", tag, (long)getpid(), rand() % 100000);
	const char *p[1] = { name };
	res = tdispatch_sql(d,
	                    "INSERT INTO tenants (name)\n"
	                    "VALUES ($1)\n"
	                    "RETURNING id\n",
	                    1, p);
	snprintf(d->tenant, sizeof(d->tenant), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
}

void tdispatch_close(struct tdispatch *d)
{
	PQfinish(d->conn);
	d->conn = NULL;
}

PGresult *tdispatch_sql(struct tdispatch *d, const char *sql, int n, const char *const *p)
{
	struct err e;
	PGresult *res = db_exec(d->conn, sql, n, p, &e);

	cr_assert_not_null(res, "%s: %s", sql, e.msg);
	return res;
}

long tdispatch_scalar(struct tdispatch *d, const char *sql, int n, const char *const *p)
{
	PGresult *res = tdispatch_sql(d, sql, n, p);
	long v = atol(PQgetvalue(res, 0, 0));

	PQclear(res);
	return v;
}

long tdispatch_count(struct tdispatch *d, const char *cond)
{
	char q[1024];
	const char *p[1] = { d->tenant };
	int n = snprintf(q, sizeof(q),
	                 "SELECT count(*)\n"
	                 "  FROM outbox\n"
	                 " WHERE tenant_id = $1 AND %s\n",
	                 cond);

	cr_assert_lt((size_t)n, sizeof(q), "condition too long: %s", cond);
	return tdispatch_scalar(d, q, 1, p);
}

void tdispatch_seed(struct tdispatch *d, int nwf, int nev, const char *type)
{
	char a[16], b[16];
	snprintf(a, sizeof(a), "%d", nwf);
	snprintf(b, sizeof(b), "%d", nev);
	const char *p[4] = { d->tenant, a, b, type };

	PQclear(tdispatch_sql(
	    d,
	    "WITH w AS (\n"
	    "  INSERT INTO workflows (tenant_id, id, type, input, created_at, updated_at)\n"
	    "  SELECT $1, gen_random_uuid(), 'test', '{}', now(), now()\n"
	    "    FROM generate_series(1, $2::int)\n"
	    "  RETURNING tenant_id, id\n"
	    ")\n"
	    "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)\n"
	    "SELECT w.id::text || '.' || s, w.tenant_id, w.id, s, $4,\n"
	    "       json_build_object('id', w.id::text || '.' || s, 'seq', s)::text\n"
	    "  FROM w, generate_series(1, $3::int) s\n"
	    " ORDER BY w.id, s\n",
	    4, p));
}

pid_t tdispatch_spawn(struct tdispatch *d, const char *const *common, const char *const *extra)
{
	const char *argv[64];
	int n = 0;
	pid_t pid;

	snprintf(d->log, sizeof(d->log), "%s/%s-%d.log", tstack_env("IDEMFLOW_STACK_DIR"), d->tag,
	         ++d->runs);
	argv[n++] = tstack_env("IDEMFLOW_DISPATCH");
	argv[n++] = "--db";
	argv[n++] = tstack_env("DATABASE_URL");
	for (int i = 0; common && common[i]; i++)
		argv[n++] = common[i];
	for (int i = 0; extra && extra[i]; i++)
		argv[n++] = extra[i];
	cr_assert_lt(n, 64, "too many flags");
	argv[n] = NULL;
	fflush(NULL);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, STDERR_FILENO);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

int tdispatch_wait(pid_t pid)
{
	int st;

	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st), "dispatcher killed by signal %d", WTERMSIG(st));
	return WEXITSTATUS(st);
}

int tdispatch_run(struct tdispatch *d, const char *const *common, const char *const *extra)
{
	return tdispatch_wait(tdispatch_spawn(d, common, extra));
}

long tdispatch_textfile_value(const char *path, const char *name)
{
	char line[512];
	FILE *f = fopen(path, "r");
	size_t nl = strlen(name);
	long v = -1;

	cr_assert_not_null(f, "no textfile %s", path);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, name, nl) == 0 && line[nl] == ' ')
			v = atol(line + nl + 1);
	fclose(f);
	return v;
}
