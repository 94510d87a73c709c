/*
 * migrate.h - applying the numbered SQL migrations of sql/.
 *
 * The migrations are compiled in (app/core/migrations.c is generated from
 * sql/NNN_name.sql). Each one runs in its own transaction that first takes
 * a transaction-level advisory lock, so concurrent runs queue instead of
 * racing; it is recorded in schema_migrations, so a second run changes
 * nothing.
 */
#ifndef IDF_MIGRATE_H
#define IDF_MIGRATE_H

#include <libpq-fe.h>

#include "core/err.h"

struct migration {
	int version;
	const char *name;
	const char *sql;
};

extern const struct migration migrations[];
extern const int migrations_count;

/* The proxy database's own migrations (sql/proxy/, doc/distribution.md),
 * numbered apart from the partitions' ones. */
extern const struct migration proxy_migrations[];
extern const int proxy_migrations_count;

/* The version the code expects: the highest compiled-in migration. */
int migrate_latest(void);

/* Apply every migration not yet recorded. *applied receives how many ran
 * now. Returns 0 or -1 with e filled (the failed migration rolled back). */
int migrate_apply(PGconn *conn, int *applied, struct err *e) MUSTCHECK;

/* migrate_apply() for a proxy database: proxy_migrations[] instead, in
 * the proxy's own schema_migrations. */
int migrate_apply_proxy(PGconn *conn, int *applied, struct err *e) MUSTCHECK;

/* The highest compiled-in proxy migration. */
int migrate_latest_proxy(void);

/* The highest applied version (0 when none), or -1 with e filled. */
int migrate_current(PGconn *conn, struct err *e);

#endif
