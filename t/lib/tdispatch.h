/*
 * idemflow-dispatch as a test runs it: a tenant of the test's own and its
 * outbox rows, the dispatcher started with the test's flags, its stderr in
 * a log of the run's own, its exit status, and its metrics textfile. For
 * the dispatch/, amqp/ and nats/ layers ($IDEMFLOW_DISPATCH, $DATABASE_URL).
 */
#ifndef IDEMFLOW_T_TDISPATCH_H
#define IDEMFLOW_T_TDISPATCH_H

#include <stddef.h>
#include <sys/types.h>

#include <libpq-fe.h>

struct tdispatch {
	PGconn *conn;    /* the test's own connection */
	char tenant[24]; /* the tenant's id */
	const char *tag; /* names the tenant and the logs (borrowed) */
	char log[600];   /* the last run's stderr: $IDEMFLOW_STACK_DIR/<tag>-<n>.log */
	int runs;
};

/*
 * Connect as application_name appname, mark every event that earlier
 * tests left pending published (a run would deliver them too), and create
 * a tenant "<tag>-<pid>-<random>". The test fails if any of it does.
 */
void tdispatch_open(struct tdispatch *d, const char *appname, const char *tag);
void tdispatch_close(struct tdispatch *d);

/* sql with n text parameters on d's connection; the test fails on an
 * error. The caller PQclear()s the result. */
PGresult *tdispatch_sql(struct tdispatch *d, const char *sql, int n, const char *const *p);
/* The first column of the first row, as a number. */
long tdispatch_scalar(struct tdispatch *d, const char *sql, int n, const char *const *p);
/* The tenant's outbox rows that match cond (SQL, e.g. "published_at IS NULL"). */
long tdispatch_count(struct tdispatch *d, const char *cond);

/*
 * nwf workflows of the tenant, with nev events each (seq 1..nev), due
 * now: event id "<workflow id>.<seq>", the given type, and the payload
 * {"id": <event id>, "seq": <seq>}.
 */
void tdispatch_seed(struct tdispatch *d, int nwf, int nev, const char *type);

/*
 * Start $IDEMFLOW_DISPATCH --db $DATABASE_URL, then the flags in common
 * and in extra (each NULL-ended, either may be NULL); its stderr goes to
 * a new d->log. Returns its pid.
 */
pid_t tdispatch_spawn(struct tdispatch *d, const char *const *common, const char *const *extra);
/* Reap pid: its exit status; the test fails if a signal killed it. */
int tdispatch_wait(pid_t pid);
/* tdispatch_spawn() and tdispatch_wait(). */
int tdispatch_run(struct tdispatch *d, const char *const *common, const char *const *extra);

/* The value of a Prometheus sample "name value" in the textfile at path,
 * or -1 when it has none; the test fails when there is no file. */
long tdispatch_textfile_value(const char *path, const char *name);

#endif
