/*
 * cli.c - what every noun of the admin CLI shares: the usage text, the
 * mapping from an error to an exit code and a line on stderr, and the
 * tab-separated printing of a result set. No noun's own logic lives here.
 */
#include <stdio.h>
#include <sysexits.h>

#include "cli/cli.h"
#include "core/db.h"

void cli_usage(FILE *out)
{
	fprintf(
	    out,
	    "Usage: idemflow [--config FILE] [--db CONNINFO] COMMAND [ARGS]\n"
	    "       idemflow [--config FILE] -t [-q] | -T   test the configuration and exit\n"
	    "\n"
	    "Commands:\n"
	    "  migrate [--proxy]              apply the SQL migrations (safe to repeat); --proxy:\n"
	    "                                 the proxy database's own (doc/distribution.md);\n"
	    "                                 with partitions, each partition's, then the proxy's\n"
	    "  tenant create NAME             create a tenant\n"
	    "  tenant list                    list tenants (id, name, created, key TTL,\n"
	    "                                 workflow retention)\n"
	    "  tenant set-ttl NAME DURATION|default\n"
	    "                                 how long the tenant's idempotency keys are\n"
	    "                                 remembered (default: idempotency_ttl)\n"
	    "  tenant set-workflow-retention NAME DURATION|default\n"
	    "                                 how long the tenant's ended workflows are kept\n"
	    "                                 (default: workflow_retention)\n"
	    "  tenant move NAME --to N        move the tenant, every row of it, to partition N\n"
	    "                                 (db is the proxy; doc/distribution.md); again:\n"
	    "                                 finishes a stopped move, --to its old partition\n"
	    "                                 undoes it\n"
	    "  token create --tenant NAME     issue a bearer token; prints it once\n"
	    "  token revoke TOKEN | --id N    revoke a token; returns after replay_cache_ttl,\n"
	    "                                 when no worker answers it any more\n"
	    "  token list [--tenant NAME]     list tokens (ids, tenants, states; never the "
	    "tokens)\n"
	    "  outbox list [--pending|--dead|--published] [--limit N]\n"
	    "                                 list outbox events (default: undelivered)\n"
	    "  outbox show ID                 one event in full (numeric id or event id)\n"
	    "  outbox requeue ID [--force] | --dead\n"
	    "                                 revive a dead or pending event: attempts\n"
	    "                                 start again from zero, due now; an event a\n"
	    "                                 dispatcher holds is refused (exit 75) unless\n"
	    "                                 --force\n"
	    "  endpoint list TENANT           a tenant's endpoints: id, url, ordering, state,\n"
	    "                                 filter, failures, pending deliveries\n"
	    "  endpoint show TENANT ID        one endpoint in full (never its secrets)\n"
	    "  prune [--outbox-retention D] [--history-retention D]\n"
	    "        [--workflow-retention D] [--prune-batch N]\n"
	    "                                 delete expired idempotency keys, delivered\n"
	    "                                 events older than outbox_retention of workflows\n"
	    "                                 that ended more than history_retention ago,\n"
	    "                                 expired messages no workflow took, and\n"
	    "                                 workflows that ended more than\n"
	    "                                 workflow_retention ago, all their events\n"
	    "                                 delivered (for cron)\n"
	    "  reap [--prune-batch N] [--loop [--interval MS]]\n"
	    "                                 make jobs whose lease ran out activatable again\n"
	    "                                 and fire due timers and wait timeouts (for cron;\n"
	    "                                 --loop: every MS, default 200, until signalled)\n"
	    "  debug idempotency-check --tenant NAME [--hours H] [--limit N] [--json]\n"
	    "                                 keys first seen in the last H hours (24) with\n"
	    "                                 their replays and conflicts, most replayed first\n"
	    "  audit [--tenant NAME] [--since D] [--json] [--textfile PATH]\n"
	    "        [--pending-after D] [--timer-after D] [--lease-after D]\n"
	    "        [--outbox-retention D] [--workflow-retention D]\n"
	    "                                 check the invariants on the keys and workflows\n"
	    "                                 created in the last D (24h; or ISO 8601, P1D):\n"
	    "                                 exit 65 when one is broken; count late events,\n"
	    "                                 timers and leases (10m, 5m, 10m); --textfile\n"
	    "                                 writes Prometheus gauges\n"
	    "  endpoint recover --tenant NAME ID --since TIME [--until TIME]\n"
	    "        [--type T]... [--state dead|skipped]...\n"
	    "                                 set the endpoint's dead and skipped deliveries\n"
	    "                                 of events written in [since, until) whose type\n"
	    "                                 a --type passes (names, prefix.* globs) pending\n"
	    "                                 again, due now; prints how many\n"
	    "  event resend --tenant NAME EVENT_ID --endpoint ID\n"
	    "                                 set one event's delivery to one endpoint\n"
	    "                                 pending again, due now\n"
	    "  audit --rebuild [--tenant NAME]\n"
	    "                                 rebuild every workflow's state, step and job\n"
	    "                                 states from its events alone and compare them\n"
	    "                                 with its rows: a line per difference, exit 65\n"
	    "                                 when there is one\n"
	    "\n"
	    "The database is --db, else $DATABASE_URL, else the config file's db, else\n"
	    "libpq's PG* variables.\n\n");
	conf_usage(out, CONF_CLI);
}

int cli_usage_error(void)
{
	cli_usage(stderr);
	return EX_USAGE;
}

int cli_fail(int code, const struct err *e)
{
	fprintf(stderr, "idemflow: %s\n", e->msg);
	return code;
}

int cli_session(PGconn *conn, const struct conf *c, struct err *e)
{
	return db_session_setup(conn, c->idempotency_wait, c->statement_timeout, e);
}

int cli_db_fail(const struct err *e)
{
	/* A held row (lock_timeout) or a conflict is over by the next try. */
	return cli_fail(e->code == ERR_DB_DOWN || e->code == ERR_LOCK_TIMEOUT ||
	                        e->code == ERR_SERIALIZE
	                    ? EX_TEMPFAIL
	                    : EX_SOFTWARE,
	                e);
}

void cli_print_rows(const PGresult *res)
{
	for (int i = 0; i < PQntuples(res); i++)
		for (int f = 0; f < PQnfields(res); f++)
			printf("%s%c", PQgetvalue(res, i, f), f + 1 < PQnfields(res) ? '\t' : '\n');
}
