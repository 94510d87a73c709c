/*
 * migrate.c - "idemflow migrate": apply the SQL migrations the program
 * carries (core/migrate.h), safe to repeat; "idemflow migrate --proxy"
 * applies the proxy database's own (sql/proxy/) instead. The migrations themselves
 * and their bookkeeping live in the core, which the server also uses.
 */
#include <stdio.h>
#include <string.h>
#include <sysexits.h>

#include "cli/cli.h"
#include "core/migrate.h"

int cli_migrate(PGconn *conn, struct conf *c, int argc, char **argv)
{
	struct err e;
	int applied, proxy = argc == 1 && strcmp(argv[0], "--proxy") == 0;

	if (argc != 0 && !proxy)
		return cli_usage_error();
	if ((proxy ? migrate_apply_proxy(conn, &applied, &e) : migrate_apply(conn, &applied, &e)) <
	    0)
		return cli_db_fail(&e);
	printf("migrate: applied %d %smigration(s); schema at version %d\n", applied,
	       proxy ? "proxy " : "", proxy ? migrate_latest_proxy() : migrate_latest());
	return EX_OK;
}
