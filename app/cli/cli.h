/*
 * cli.h - the admin CLI's nouns (migrate, tenant, token, outbox, endpoint,
 * event, prune, reap, debug, audit) and the little they share: the usage text, how an error
 * becomes an exit code and a line on stderr, and how a result set is
 * printed. main.c parses the global options, connects and calls one noun.
 *
 * Exit codes are sysexits.h's: EX_USAGE bad arguments, EX_DATAERR bad
 * data (unknown tenant, duplicate name), EX_TEMPFAIL try later (database
 * unreachable, an outbox event held by a dispatcher), EX_SOFTWARE any
 * other database error. Results go to stdout, diagnostics to stderr.
 * Not for the server or the dispatcher: nothing here is linked into them.
 */
#ifndef IDF_CLI_H
#define IDF_CLI_H

#include <stdio.h>

#include <libpq-fe.h>

#include "core/conf.h"
#include "core/err.h"

/*
 * The nouns, one file each. argc/argv are the words after the noun. conn
 * is open and borrowed; c is borrowed, and prune and reap set the keys
 * their options name in it. Each prints its result on stdout and any
 * diagnostic on stderr, and returns the exit code.
 */
typedef int cli_noun_fn(PGconn *conn, struct conf *c, int argc, char **argv);

/* migrate.c: apply the SQL migrations. */
int cli_migrate(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* tenant.c: create, list, set-ttl. */
int cli_tenant(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* move.c: tenant move NAME --to N; conn is the proxy. */
int cli_tenant_move(PGconn *conn, const struct conf *c, const char *name, const char *to) MUSTCHECK;
/* token.c: create, revoke, list. */
int cli_token(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* outbox.c: list, show, requeue. */
int cli_outbox(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* endpoint.c: list, show a tenant's endpoints (never their secrets). */
int cli_endpoint(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* prune.c: expired idempotency keys and delivered events past retention. */
int cli_prune(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* prune.c: jobs whose lease ran out, activatable again. */
int cli_reap(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* debug.c: idempotency-check. */
int cli_debug(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* endpoint.c: recover (a tenant endpoint's dead and skipped deliveries). */
int cli_endpoint(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* endpoint.c: resend (one event to one endpoint). */
int cli_event(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;
/* audit.c: the invariants checked on the stored data; EX_DATAERR when one
 * is broken. Only reads. */
int cli_audit(PGconn *conn, struct conf *c, int argc, char **argv) MUSTCHECK;

/*
 * Configure a CLI session (a new one, or one PQreset() renewed): the
 * settings every connection pins (db_session_setup), lock_timeout =
 * idempotency_wait and statement_timeout = statement_timeout, so a command
 * that meets a held row or a stuck statement ends with "try later" (75)
 * or an error instead of waiting for ever. Returns 0 or -1 with e.
 */
int cli_session(PGconn *conn, const struct conf *c, struct err *e) MUSTCHECK;

/* The usage text, then the configuration keys (conf_usage), on out. */
void cli_usage(FILE *out);

/* Bad arguments: the usage text on stderr. Returns EX_USAGE. */
int cli_usage_error(void) MUSTCHECK;

/* "idemflow: <e's message>" on stderr. Returns code. */
int cli_fail(int code, const struct err *e) MUSTCHECK;

/* The same for an error from the database layer: EX_TEMPFAIL when the
 * database is unreachable (ERR_DB_DOWN), a row stayed held past
 * lock_timeout (ERR_LOCK_TIMEOUT) or a transaction conflicted
 * (ERR_SERIALIZE), else EX_SOFTWARE. */
int cli_db_fail(const struct err *e) MUSTCHECK;

/* Every row of res on stdout, its fields separated by tabs, one line each
 * (a NULL prints as ""). res borrowed. */
void cli_print_rows(const PGresult *res);

#endif
