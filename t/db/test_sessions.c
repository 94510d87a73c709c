/*
 * test_sessions.c - the admin CLI's sessions against a real PostgreSQL.
 *
 * Proves that a CLI command gives up on a row another session holds after
 * idempotency_wait ("try later", 75) instead of waiting for ever, and that
 * `reap --loop`, whose session is ended under it, pins its settings again
 * on the new session (a database-level search_path that would hide the
 * schema changes nothing); that `tenant set-ttl` holds a tenant's TTL to
 * the floor the server holds its own to. The tests change database-wide settings: they
 * run one at a time, and each resets what it changed.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

TSTACK_SEQUENTIAL

static void teardown(void)
{
	char sql[256];
	PGconn *c = tstack_db();

	snprintf(sql, sizeof(sql), "ALTER DATABASE \"%s\" RESET ALL", PQdb(c));
	PQclear(PQexec(c, sql));
}

TestSuite(sessions, .fini = teardown, .timeout = 60);

Test(sessions, a_cli_command_gives_up_on_a_held_row_after_idempotency_wait)
{
	PGconn *hold = tstack_db_connect();
	char name[64], out[256];
	double t0;
	int rc;

	snprintf(name, sizeof(name), "held-%d", (int)getpid());
	tstack_exec(tstack_db(), "INSERT INTO tenants (name) VALUES ($1)", name);
	tstack_exec(hold, "BEGIN");
	tstack_exec(hold, "SELECT 1 FROM tenants WHERE name = $1 FOR UPDATE", name);
	t0 = tstack_now();
	rc = tstack_cli(out, sizeof(out), "--idempotency-wait", "1s", "--idempotency-ttl", "1h",
	                "tenant", "set-ttl", name, "2h", NULL);
	cr_assert_eq(rc, 75, "exit %d: %s", rc, tstack_cli_stderr());
	cr_assert(strstr(tstack_cli_stderr(), "lock timeout") != NULL, "%s", tstack_cli_stderr());
	cr_assert(tstack_now() - t0 < 5, "gave up after %.1f s", tstack_now() - t0);
	tstack_exec(hold, "ROLLBACK");
	PQfinish(hold);
}

/* The pid of the session named idemflow-cli other than not that has run a
 * round of the reaper (so it is past its connect), within 10 s, as text. */
static char *cli_session(const char * not )
{
	double deadline = tstack_now() + 10;
	char *pid;

	for (;;) {
		pid = tstack_text("SELECT min(pid)::text FROM pg_stat_activity"
		                  " WHERE application_name = 'idemflow-cli' AND pid::text <> $1"
		                  "   AND query LIKE '%idemflow_%'",
		                  not );
		if (pid != NULL)
			return pid;
		cr_assert(tstack_now() < deadline, "no idemflow-cli session");
		tstack_sleep_ms(20);
	}
}

static int count_lines(const char *path, const char *needle)
{
	char line[1024];
	FILE *f = fopen(path, "r");
	int n = 0;

	cr_assert_not_null(f, "%s", path);
	while (fgets(line, sizeof(line), f) != NULL)
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

Test(sessions, reap_loop_pins_its_settings_again_after_its_session_ended)
{
	const char *argv[] = { tstack_env("IDEMFLOW_CLI"),
		               "--db",
		               tstack_env("DATABASE_URL"),
		               "reap",
		               "--loop",
		               "--interval",
		               "20",
		               NULL };
	char log[512], sql[256], *first, *second;
	int status;
	pid_t pid;

	snprintf(log, sizeof(log), "%s/sessions-reap-%d.log", tstack_env("IDEMFLOW_STACK_DIR"),
	         (int)getpid());
	pid = tstack_spawn(argv, log);
	first = cli_session("0");
	/* A search_path without the schema: a session that does not pin its
	 * own finds none of idemflow's functions. */
	snprintf(sql, sizeof(sql), "ALTER DATABASE \"%s\" SET search_path = pg_catalog",
	         PQdb(tstack_db()));
	tstack_exec(tstack_db(), sql);
	tstack_exec(tstack_db(), "SELECT pg_terminate_backend($1::int)", first);
	second = cli_session(first);
	tstack_sleep_ms(1000); /* about 50 rounds on the new session */
	cr_assert_eq(kill(pid, SIGTERM), 0);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
	cr_assert_eq(count_lines(log, "does not exist"), 0,
	             "the new session lost its search_path; see %s", log);
	cr_assert_eq(count_lines(log, "idemflow: reap:"), 1, "one failed round; see %s", log);
	free(first);
	free(second);
}

/* The floor is the larger of 10 x idempotency_wait and 2 x
 * statement_timeout, as for the server's idempotency_ttl. */
Test(sessions, tenant_set_ttl_holds_the_server_s_floor)
{
	char name[64], out[256];
	int rc;

	snprintf(name, sizeof(name), "floor-%d", (int)getpid());
	tstack_exec(tstack_db(), "INSERT INTO tenants (name) VALUES ($1)", name);
	/* The defaults: 5 s and 30 s make 60 s. */
	rc = tstack_cli(out, sizeof(out), "tenant", "set-ttl", name, "1s", NULL);
	cr_assert_eq(rc, 64, "exit %d: %s", rc, tstack_cli_stderr());
	cr_assert(strstr(tstack_cli_stderr(), "shorter than 60000 ms") != NULL, "%s",
	          tstack_cli_stderr());
	rc = tstack_cli(out, sizeof(out), "tenant", "set-ttl", name, "59s", NULL);
	cr_assert_eq(rc, 64, "exit %d: %s", rc, tstack_cli_stderr());
	cr_assert_eq(tstack_count("SELECT count(*) FROM tenants WHERE name = $1"
	                          "   AND idempotency_ttl IS NULL",
	                          name),
	             1);
	rc = tstack_cli(out, sizeof(out), "tenant", "set-ttl", name, "60s", NULL);
	cr_assert_eq(rc, 0, "exit %d: %s", rc, tstack_cli_stderr());
	/* With shorter waits, a shorter floor. */
	rc = tstack_cli(out, sizeof(out), "--idempotency-wait", "1s", "--statement-timeout", "2s",
	                "--idempotency-ttl", "1h", "tenant", "set-ttl", name, "10s", NULL);
	cr_assert_eq(rc, 0, "exit %d: %s", rc, tstack_cli_stderr());
	cr_assert_eq(tstack_count("SELECT count(*) FROM tenants WHERE name = $1"
	                          "   AND idempotency_ttl = interval '10 seconds'",
	                          name),
	             1);
}
