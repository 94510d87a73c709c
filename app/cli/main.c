/*
 * idemflow - the admin CLI: migrations, tenants, API tokens, the outbox,
 * retention (prune, reap), idempotency debugging and the audit of the
 * stored data's invariants. This file reads the
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
};

static void quiet_notices(void *arg, const char *msg)
{
}

int main(int argc, char **argv)
{
	cli_noun_fn *run = NULL;
	struct conf *c = NULL;
	PGconn *conn = NULL;
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
	/* Six tries over about 3 s: a failover in progress is waited out,
	 * a database that stays down is "try later" (75). */
	conn = db_connect_retry(c->db, "idemflow-cli", 6, &e);
	if (conn == NULL) {
		rc = cli_fail(EX_TEMPFAIL, &e);
		goto out;
	}
	PQsetNoticeProcessor(conn, quiet_notices, NULL);
	/* A migration runs without timeouts: it waits for its advisory lock
	 * and may rewrite a table for longer than a request's statement. */
	if (run != cli_migrate && cli_session(conn, c, &e) < 0) {
		rc = cli_db_fail(&e);
		goto out;
	}
	rc = run(conn, c, argc - next - 1, argv + next + 1);
out:
	PQfinish(conn);
	conf_free(c);
	return rc;
}
