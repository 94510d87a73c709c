/*
 * migrate.c - "idemflow migrate": apply the SQL migrations the program
 * carries (core/migrate.h), safe to repeat. The migrations themselves
 * and their bookkeeping live in the core, which the server also uses.
 */
#include <stdio.h>
#include <sysexits.h>

#include "cli/cli.h"
#include "core/migrate.h"

int cli_migrate(PGconn *conn, struct conf *c, int argc, char **argv)
{
	struct err e;
	int applied;

	if (argc != 0)
		return cli_usage_error();
	if (migrate_apply(conn, &applied, &e) < 0)
		return cli_db_fail(&e);
	printf("migrate: applied %d migration(s); schema at version %d\n", applied,
	       migrate_latest());
	return EX_OK;
}
