/*
 * idemflow - the admin CLI: migrations, tenants, API tokens, the outbox,
 * retention (prune, reap), idempotency debugging, the audit of the
 * stored data's invariants, and recover and resend of deliveries. This file reads the
 * global options and the command, connects and hands over to the noun's
 * file (cli.h); what each command does is there.
 *
 * Results go to stdout (a new token is the only thing printed by
 * "token create", so scripts can capture it); diagnostics go to stderr.
 * Exit codes follow sysexits.h: 64 usage, 65 bad data (unknown tenant,
 * duplicate name, an invariant the audit found broken), 75 try later (database unreachable, a row
 * held past idempotency_wait, an outbox event held by a dispatcher), 78 configuration.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "config.h"
#include "cli/cli.h"
#include "core/conf.h"
#include "core/conftest.h"
#include "core/db.h"

static const struct {
	const char *name;
	cli_noun_fn *run;
} nouns[] = {
	{ "migrate", cli_migrate }, { "tenant", cli_tenant }, { "token", cli_token },
	{ "outbox", cli_outbox },   { "prune", cli_prune },   { "reap", cli_reap },
	{ "debug", cli_debug },     { "audit", cli_audit },   { "endpoint", cli_endpoint },
	{ "event", cli_event },
};

static void quiet_notices(void *arg, const char *msg)
{
}

/* One command on one database. */
static int run_on(cli_noun_fn *run, struct conf *c, const char *db, int argc, char **argv)
{
	PGconn *conn;
	struct err e;
	int rc;

	/* Six tries over about 3 s: a failover in progress is waited out,
	 * a database that stays down is "try later" (75). */
	conn = db_connect_retry(db, "idemflow-cli", 6, &e);
	if (conn == NULL)
		return cli_fail(EX_TEMPFAIL, &e);
	PQsetNoticeProcessor(conn, quiet_notices, NULL);
	/* A migration runs without timeouts: it waits for its advisory lock
	 * and may rewrite a table for longer than a request's statement. */
	if (run != cli_migrate && cli_session(conn, c, &e) < 0)
		rc = cli_db_fail(&e);
	else
		rc = run(conn, c, argc, argv);
	PQfinish(conn);
	return rc;
}

/* One command on partition i of the configuration's partitions. */
static int run_partition(cli_noun_fn *run, struct conf *c, int i, int argc, char **argv)
{
	char *db = conf_partition_db(c, i);
	int rc;

	if (db == NULL) {
		fprintf(stderr, "idemflow: out of memory\n");
		return EX_OSERR;
	}
	rc = run_on(run, c, db, argc, argv);
	free(db);
	return rc;
}

/* The commands that run on each of the partitions in turn when the
 * configuration lists them (doc/distribution.md): the upkeep of every
 * partition's rows. The others take db, or the one partition named. */
static int per_partition(cli_noun_fn *run)
{
	return run == cli_prune || run == cli_reap || run == cli_audit;
}

/*
 * "idemflow migrate" over the configuration's partitions: each
 * partition's migrations in turn, then the proxy's in front of them
 * (routing = proxy), whose functions call the partitions'. The first
 * failure stops the run, so the proxy is never ahead of a partition. With
 * an argument ("--proxy"), the proxy's alone, as without partitions.
 */
static int migrate_all(struct conf *c, int argc, char **argv)
{
	static char proxy_opt[] = "--proxy";
	char *proxy_argv[] = { proxy_opt, NULL };
	int rc;

	if (argc != 0)
		return run_on(cli_migrate, c, c->db, argc, argv);
	for (int i = 0; i < conf_partition_count(c); i++) {
		printf("partition %d:\n", i);
		fflush(stdout);
		rc = run_partition(cli_migrate, c, i, 0, argv);
		if (rc != EX_OK)
			return rc;
	}
	if (c->routing == NULL || strcmp(c->routing, "proxy") != 0)
		return EX_OK;
	printf("proxy:\n");
	fflush(stdout);
	return run_on(cli_migrate, c, c->db, 1, proxy_argv);
}

/* The options that keep a command on one database: a loop that never
 * ends, an output a program reads whole. */
static int one_database_only(const char *arg)
{
	static const char *const opts[] = { "--loop", "--json", "--textfile", "--rebuild" };

	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++)
		if (strncmp(arg, opts[i], strlen(opts[i])) == 0)
			return 1;
	return 0;
}

int main(int argc, char **argv)
{
	cli_noun_fn *run = NULL;
	struct conf *c = NULL;
	struct err e;
	int next, rc, tflags;

	tflags = conftest_take_flags(&argc, argv);
	c = conf_from_args(argc, argv, &next, &e);
	if (tflags != 0 && c != NULL && next < argc) {
		fprintf(stderr, "idemflow: -t and -T take no other argument (\"%s\")\n",
		        argv[next]);
		conf_free(c);
		return EX_USAGE;
	}
	if (tflags != 0)
		return conftest_run("idemflow", tflags, c, &e, NULL);
	if (c == NULL) {
		rc = cli_fail(EX_CONFIG, &e);
		goto out;
	}
	if (next >= argc) {
		rc = cli_usage_error();
		goto out;
	}
	if (strcmp(argv[next], "-h") == 0 || strcmp(argv[next], "--help") == 0 ||
	    strcmp(argv[next], "help") == 0) {
		cli_usage(stdout);
		rc = EX_OK;
		goto out;
	}
	if (strcmp(argv[next], "--version") == 0) {
		printf("idemflow %s\n", PACKAGE_VERSION);
		rc = EX_OK;
		goto out;
	}
	for (size_t i = 0; i < sizeof(nouns) / sizeof(nouns[0]); i++)
		if (strcmp(argv[next], nouns[i].name) == 0)
			run = nouns[i].run;
	if (run == NULL) {
		fprintf(stderr, "idemflow: unknown command \"%s\"\n", argv[next]);
		rc = cli_usage_error();
		goto out;
	}
	if (c->partition >= 0) {
		rc = run_partition(run, c, c->partition, argc - next - 1, argv + next + 1);
	} else if (run == cli_migrate && conf_partition_count(c) > 0) {
		rc = migrate_all(c, argc - next - 1, argv + next + 1);
	} else if (per_partition(run) && conf_partition_count(c) > 0) {
		for (int i = next + 1; i < argc; i++)
			if (conf_partition_count(c) > 1 && one_database_only(argv[i])) {
				fprintf(
				    stderr,
				    "idemflow: %s %s runs on one database: name one partition with "
				    "--partition N\n",
				    argv[next], argv[i]);
				rc = EX_USAGE;
				goto out;
			}
		rc = EX_OK;
		for (int i = 0; i < conf_partition_count(c); i++) {
			int prc;
			printf("partition %d:\n", i);
			fflush(stdout);
			prc = run_partition(run, c, i, argc - next - 1, argv + next + 1);
			if (rc == EX_OK)
				rc = prc;
		}
	} else {
		rc = run_on(run, c, c->db, argc - next - 1, argv + next + 1);
	}
out:
	conf_free(c);
	return rc;
}
