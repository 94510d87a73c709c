/*
 * conftest.h - "-t" and "-T", the configuration test every program shares,
 * as nginx -t: parse, check the values, check that a database is named;
 * -T also prints the effective configuration without its secrets.
 *
 * Used by the units (ExecStartPre, ExecReload) and by the cron jobs and
 * the dispatcher's timer as their guard: "-t -q" says nothing when no
 * database is configured yet, and exits 78 all the same.
 */
#ifndef IDF_CONFTEST_H
#define IDF_CONFTEST_H

#include "core/conf.h"
#include "core/err.h"

enum conftest_flag {
	CONFTEST_TEST = 1,  /* -t: test, then exit */
	CONFTEST_DUMP = 2,  /* -T: test, print the configuration, then exit */
	CONFTEST_QUIET = 4, /* -q (with -t): no line on success, none for "no database" */
};

/*
 * Take -t, -T and -q out of argv (before "--" or the first argument that
 * is no flag, a command; skipping the values of flags that take one),
 * moving the rest down; *argc shrinks to match.
 * Returns the flags found (0: none; -q alone is left in place).
 */
int conftest_take_flags(int *argc, char **argv);

/*
 * 0 when c names a database: the db key; else, with $PGSERVICE, that
 * service in the service file libpq would read ($PGSERVICEFILE or
 * ~/.pg_service.conf, then $PGSYSCONFDIR/pg_service.conf) with a dbname,
 * host or hostaddr; else $PGDATABASE or $PGHOST. A db that libpq cannot parse is an error too.
 * -1 with e (ERR_CONFIG) saying what to set.
 */
int conftest_db_named(const struct conf *c, struct err *e) MUSTCHECK;

/* A program's own checks of the values only it reads; 0 or -1 with e. */
typedef int (*conftest_check_fn)(const struct conf *c, struct err *e);

/*
 * Run the test for program prog with the flags of conftest_take_flags():
 * c is what conf_from_args() returned (NULL: it failed, with parse_err),
 * and is freed here. Errors go to stderr, the dump (-T) to stdout, and
 * "configuration file F test is successful" to stderr unless -q.
 * Returns the exit status: 0, or 78 (EX_CONFIG).
 */
int conftest_run(const char *prog, int flags, struct conf *c, const struct err *parse_err,
                 conftest_check_fn check);

#endif
