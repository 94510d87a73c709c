/* test_conf.c - the configuration table: files, flags, and clear errors. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/conf.h"

static char path[64];

static void write_conf(const char *text)
{
	FILE *f;

	snprintf(path, sizeof(path), "/tmp/idemflow-conf-test.%ld", (long)getpid());
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

/* What workers = auto (the default) comes to on this machine. */
static int auto_workers(void)
{
	long n = 4 * sysconf(_SC_NPROCESSORS_ONLN);

	return n < 2 ? 2 : n > 32 ? 32 : (int)n;
}

static void cleanup(void)
{
	unlink(path);
}

Test(conf, defaults_are_the_documented_ones)
{
	struct conf *c = conf_new();

	cr_assert_not_null(c);
	cr_assert_eq(c->workers, auto_workers());
	cr_assert_eq(c->idempotency_key, IDEM_KEY_REQUIRED);
	cr_assert_eq(c->idempotency_ttl, 24L * 3600 * 1000);
	cr_assert_eq(c->idempotency_wait, 5000);
	cr_assert_eq(c->replay_cache_ttl, 1000);
	cr_assert_eq(c->max_body, 1048576);
	cr_assert_eq(c->listen_mode, 0660);
	cr_assert_str_eq(c->db, "");
	conf_free(c);
}

Test(conf, file_values_and_units_are_parsed, .fini = cleanup)
{
	struct conf *c = conf_new();
	struct err e = { 0 };

	write_conf("# comment\n\nworkers = 7\nidempotency_ttl = 90m\nidempotency-wait=250ms\n"
	           "max_body = 64k\nidempotency_key = optional\nlisten = \" /tmp/x.sock \"\n");
	cr_assert_eq(conf_load_file(c, path, &e), 0, "%s", e.msg);
	cr_assert_eq(c->workers, 7);
	cr_assert_eq(c->idempotency_ttl, 90L * 60 * 1000);
	cr_assert_eq(c->idempotency_wait, 250);
	cr_assert_eq(c->max_body, 65536);
	cr_assert_eq(c->idempotency_key, IDEM_KEY_OPTIONAL);
	cr_assert_str_eq(c->listen, " /tmp/x.sock ");
	conf_free(c);
}

Test(conf, a_bad_value_names_file_line_key_and_value, .fini = cleanup)
{
	struct conf *c = conf_new();
	struct err e = { 0 };

	write_conf("workers = 2\nidempotency_wait = soon\n");
	cr_assert_eq(conf_load_file(c, path, &e), -1);
	cr_assert(strstr(e.msg, ":2:") != NULL, "line number in: %s", e.msg);
	cr_assert(strstr(e.msg, "idempotency_wait") != NULL, "key in: %s", e.msg);
	cr_assert(strstr(e.msg, "\"soon\"") != NULL, "value in: %s", e.msg);
	conf_free(c);
}

Test(conf, unknown_keys_and_out_of_range_values_are_errors)
{
	struct conf *c = conf_new();
	struct err e = { 0 };

	cr_assert_eq(conf_set(c, "wokers", "3", "test", &e), -1);
	cr_assert(strstr(e.msg, "unknown configuration key \"wokers\"") != NULL, "%s", e.msg);
	cr_assert_eq(conf_set(c, "workers", "0", "test", &e), -1);
	cr_assert_eq(conf_set(c, "workers", "3x", "test", &e), -1);
	cr_assert_eq(conf_set(c, "idempotency_key", "maybe", "test", &e), -1);
	cr_assert_eq(conf_set(c, "log_level", "loud", "test", &e), -1);
	cr_assert_eq(c->workers, auto_workers(), "a rejected value leaves the old one");
	conf_free(c);
}

/* replay_cache_ttl: 0 turns the cache off; a window above a minute is
 * refused (a revoke waits it out), naming the limit. */
Test(conf, replay_cache_ttl_is_zero_to_one_minute)
{
	struct conf *c = conf_new();
	struct err e = { 0 };

	cr_assert_eq(conf_set(c, "replay_cache_ttl", "0", "test", &e), 0, "%s", e.msg);
	cr_assert_eq(c->replay_cache_ttl, 0);
	cr_assert_eq(conf_set(c, "replay-cache-ttl", "1m", "test", &e), 0, "%s", e.msg);
	cr_assert_eq(c->replay_cache_ttl, 60000);
	cr_assert_eq(conf_set(c, "replay_cache_ttl", "61s", "test", &e), -1);
	cr_assert_str_eq(e.msg, "test: invalid value \"61s\" for \"replay_cache_ttl\": expected a "
	                        "duration of at most 60000 ms");
	cr_assert_eq(c->replay_cache_ttl, 60000, "a rejected value leaves the old one");
	conf_free(c);
}

/* workers = auto is four per online CPU, at least two; a number is taken as
 * it is, and anything else is refused with both forms named. */
Test(conf, workers_auto_is_four_per_cpu)
{
	struct conf *c = conf_new();
	struct err e = { 0 };

	cr_assert_eq(conf_set(c, "workers", "3", "test", &e), 0, "%s", e.msg);
	cr_assert_eq(c->workers, 3);
	cr_assert_eq(conf_set(c, "workers", "auto", "test", &e), 0, "%s", e.msg);
	cr_assert_eq(c->workers, auto_workers());
	cr_assert_geq(c->workers, 2);
	cr_assert_eq(conf_set(c, "workers", "257", "test", &e), -1);
	cr_assert(strstr(e.msg, "expected auto or an integer between 1 and 256") != NULL, "%s",
	          e.msg);
	cr_assert_eq(conf_set(c, "workers", "Auto", "test", &e), -1);
	cr_assert_eq(c->workers, auto_workers());
	conf_free(c);
}

Test(conf, flags_override_the_file_and_stop_at_the_command, .fini = cleanup)
{
	struct err e = { 0 };
	int next = 0;
	struct conf *c;

	write_conf("workers = 2\ndb = dbname=fromfile\n");
	char *argv[] = { "prog",     "--workers", "9",
		         "--config", path,        "--idempotency-key=optional",
		         "migrate",  "--workers", "1",
		         NULL };
	unsetenv("DATABASE_URL");
	unsetenv("IDEMFLOW_CONFIG");
	c = conf_from_args(9, argv, &next, &e);
	cr_assert_not_null(c, "%s", e.msg);
	cr_assert_eq(c->workers, 9);
	cr_assert_eq(c->idempotency_key, IDEM_KEY_OPTIONAL);
	cr_assert_str_eq(c->db, "dbname=fromfile");
	cr_assert_eq(next, 6);
	conf_free(c);
}

Test(conf, database_url_overrides_the_file_but_not_the_flag, .fini = cleanup)
{
	struct err e = { 0 };
	int next = 0;
	struct conf *c;

	write_conf("db = dbname=fromfile\n");
	setenv("DATABASE_URL", "postgresql:///fromenv", 1);
	char *argv1[] = { "prog", "--config", path, NULL };
	c = conf_from_args(3, argv1, &next, &e);
	cr_assert_not_null(c, "%s", e.msg);
	cr_assert_str_eq(c->db, "postgresql:///fromenv");
	conf_free(c);
	char *argv2[] = { "prog", "--config", path, "--db", "dbname=fromflag", NULL };
	c = conf_from_args(5, argv2, &next, &e);
	cr_assert_str_eq(c->db, "dbname=fromflag");
	conf_free(c);
}

Test(conf, unknown_flags_are_errors)
{
	struct err e = { 0 };
	int next = 0;
	char *argv[] = { "prog", "--wrokers", "3", NULL };

	cr_assert_null(conf_from_args(3, argv, &next, &e));
	cr_assert(strstr(e.msg, "--wrokers") != NULL, "%s", e.msg);
}

/* The first pass, which looks for --config, read a flag's name at a + 2:
 * past the end of a lone "-". The arguments are heap copies of their exact
 * size, so a sanitizer build catches a read past one. */
Test(conf, a_lone_dash_is_an_unknown_option)
{
	struct err e = { 0 };
	int next = 0;
	char *argv[] = { strdup("prog"), strdup("-"), strdup("--workers"), strdup("3"), NULL };

	cr_assert_null(conf_from_args(4, argv, &next, &e));
	cr_assert(strstr(e.msg, "unknown option \"-\"") != NULL, "%s", e.msg);
	for (int i = 0; i < 4; i++)
		free(argv[i]);
}

/* A key must outlive every request that may hold or wait for it: a TTL
 * under 10 x idempotency_wait or 2 x statement_timeout is refused,
 * naming the settings, by every program (conf_from_args). */
Test(conf, a_key_ttl_shorter_than_the_waits_is_refused)
{
	struct err e = { 0 };
	int next = 0;
	struct conf *c;

	unsetenv("DATABASE_URL");
	unsetenv("IDEMFLOW_CONFIG");
	char *short_wait[] = {
		"prog", "--idempotency_wait", "5s", "--idempotency_ttl", "49s", NULL
	};
	cr_assert_null(conf_from_args(5, short_wait, &next, &e));
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert(strstr(e.msg, "\"idempotency_ttl\"") != NULL, "%s", e.msg);
	cr_assert(strstr(e.msg, "idempotency_wait (5000 ms)") != NULL, "%s", e.msg);
	char *short_stmt[] = { "prog", "--idempotency_wait", "1s",  "--statement_timeout",
		               "30s",  "--idempotency_ttl",  "59s", NULL };
	cr_assert_null(conf_from_args(7, short_stmt, &next, &e));
	cr_assert(strstr(e.msg, "statement_timeout (30000 ms)") != NULL, "%s", e.msg);
	char *enough[] = { "prog", "--idempotency_wait", "5s", "--idempotency_ttl", "1m", NULL };
	c = conf_from_args(5, enough, &next, &e);
	cr_assert_not_null(c, "%s", e.msg);
	cr_assert_eq(c->idempotency_ttl, 60000);
	conf_free(c);
	/* The defaults pass: 24 h against 5 s and 30 s. */
	char *none[] = { "prog", NULL };
	c = conf_from_args(1, none, &next, &e);
	cr_assert_not_null(c, "%s", e.msg);
	conf_free(c);
}

/* A key reused with a different request: 409 (the default, what idemflow
 * always answered) or 422 (the IETF draft's), nothing else. */
Test(conf, idempotency_mismatch_status_is_409_or_422)
{
	struct conf *c = conf_new();
	struct err e = { 0 };

	cr_assert_eq(c->idempotency_mismatch_status, 409);
	cr_assert_eq(conf_set(c, "idempotency_mismatch_status", "422", "test", &e), 0, "%s", e.msg);
	cr_assert_eq(c->idempotency_mismatch_status, 422);
	cr_assert_eq(conf_set(c, "idempotency-mismatch-status", "409", "test", &e), 0, "%s", e.msg);
	cr_assert_eq(c->idempotency_mismatch_status, 409);
	cr_assert_eq(conf_set(c, "idempotency_mismatch_status", "400", "test", &e), -1);
	cr_assert_str_eq(e.msg, "test: invalid value \"400\" for \"idempotency_mismatch_status\": "
	                        "expected 409 or 422");
	cr_assert_eq(conf_set(c, "idempotency_mismatch_status", "422 ", "test", &e), -1);
	cr_assert_eq(c->idempotency_mismatch_status, 409, "a rejected value leaves the old one");
	conf_free(c);
}

/* problem_base_uri: an absolute URI that goes into JSON unescaped. */
Test(conf, problem_base_uri_is_an_absolute_uri)
{
	struct conf *c = conf_new();
	struct err e = { 0 };
	static const char *const bad[] = { "/problems/",
		                           "problems/",
		                           "https:",
		                           "1http://x/",
		                           "https://x/\"y",
		                           "https://x/\\y",
		                           "https://x/ y",
		                           "https://x/<y>",
		                           "https://x/\xc3\xa9",
		                           "" };

	cr_assert_str_eq(c->problem_base_uri, "https://idemflow.example/problems/");
	cr_assert_eq(
	    conf_set(c, "problem_base_uri", "https://docs.example.com/api.html#", "test", &e), 0,
	    "%s", e.msg);
	cr_assert_str_eq(c->problem_base_uri, "https://docs.example.com/api.html#");
	cr_assert_eq(conf_set(c, "problem_base_uri", "urn:example:problem:", "test", &e), 0, "%s",
	             e.msg);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(conf_set(c, "problem_base_uri", bad[i], "test", &e), -1, "%s", bad[i]);
	cr_assert(strstr(e.msg, "expected an absolute URI") != NULL, "%s", e.msg);
	cr_assert_str_eq(c->problem_base_uri,
	                 "urn:example:problem:", "a rejected value leaves the old one");
	conf_free(c);
}

/* A duration outside a struct conf (tenant set-ttl) is read exactly as
 * its key reads it: units, the key's floor, the key's error message. */
Test(conf, a_duration_read_alone_is_read_as_its_key_reads_it)
{
	struct conf *c = conf_new();
	struct err e = { 0 }, set = { 0 };
	long ms = -1;

	cr_assert_eq(conf_key_duration("idempotency_ttl", "36h", "tenant set-ttl", &ms, &e), 0);
	cr_assert_eq(ms, 36L * 3600 * 1000);
	/* Below the key's 1 s floor: the message conf_set gives, word for word. */
	cr_assert_eq(conf_key_duration("idempotency_ttl", "999ms", "tenant set-ttl", &ms, &e), -1);
	cr_assert_eq(ms, 36L * 3600 * 1000, "untouched on an error");
	cr_assert_eq(conf_set(c, "idempotency_ttl", "999ms", "tenant set-ttl", &set), -1);
	cr_assert_str_eq(e.msg, set.msg);
	cr_assert_str_eq(e.msg, "tenant set-ttl: invalid value \"999ms\" for \"idempotency_ttl\": "
	                        "expected a duration such as 500ms, 5s, 10m, 24h or 7d");
	/* Above replay_cache_ttl's ceiling of a minute. */
	cr_assert_eq(conf_key_duration("replay_cache_ttl", "61s", "x", &ms, &e), -1);
	cr_assert_str_eq(e.msg, "x: invalid value \"61s\" for \"replay_cache_ttl\": expected a "
	                        "duration of at most 60000 ms");
	/* Only a duration key. */
	cr_assert_eq(conf_key_duration("workers", "5s", "x", &ms, &e), -1);
	cr_assert_eq(e.code, ERR_INTERNAL);
	cr_assert_eq(conf_key_duration("no_such_key", "5s", "x", &ms, &e), -1);
	conf_free(c);
}

/* Each program's --help lists the keys it reads, from the one table. */
Test(conf, usage_lists_the_keys_of_one_program)
{
	static const struct {
		enum conf_program p;
		const char *has, *lacks;
	} cases[] = {
		{ CONF_SERVER, "\n  workers ", "\n  amqp_url " },
		{ CONF_SERVER, "\n  metrics_token ", "\n  nats_url " },
		{ CONF_DISPATCH, "\n  amqp_url ", "\n  workers " },
		{ CONF_DISPATCH, "\n  nats_stream ", "\n  prune_batch " },
		{ CONF_CLI, "\n  prune_batch ", "\n  sink " },
		{ CONF_CLI, "\n  idempotency_wait ", "\n  listen " },
	};
	char text[16384];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		FILE *f = fmemopen(text, sizeof(text), "w");
		cr_assert_not_null(f);
		conf_usage(f, cases[i].p);
		fclose(f);
		cr_assert(strstr(text, "\n  db ") != NULL, "db is every program's");
		cr_assert(strstr(text, cases[i].has) != NULL, "%zu: no%s", i, cases[i].has);
		cr_assert(strstr(text, cases[i].lacks) == NULL, "%zu: has%s", i, cases[i].lacks);
	}
}
