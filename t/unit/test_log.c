/* test_log.c - JSON lines made from logfmt, log files and their reopening. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"

static char *json(const char *logfmt)
{
	static char out[8192];

	log_json_from_logfmt(logfmt, out, sizeof(out));
	return out;
}

Test(log_json, same_fields_in_order_numbers_stay_numbers)
{
	cr_assert_str_eq(json("ts=2026-11-29T14:00:00.123Z level=info component=worker pid=12 "
	                      "msg=request request_id=0af3 route=/v1/workflows status=201 "
	                      "tenant=7 idem=created key_fp=123456789012 duration_ms=1.250"),
	                 "{\"ts\":\"2026-11-29T14:00:00.123Z\",\"level\":\"info\","
	                 "\"component\":\"worker\",\"pid\":12,\"msg\":\"request\","
	                 "\"request_id\":\"0af3\",\"route\":\"/v1/workflows\",\"status\":201,"
	                 "\"tenant\":7,\"idem\":\"created\",\"key_fp\":\"123456789012\","
	                 "\"duration_ms\":1.250}");
}

Test(log_json, identifiers_and_non_numbers_stay_strings)
{
	cr_assert_str_eq(json("sqlstate=40001 request_id=12 event_id=1 a=01 b=1. c=-0 d=1e5 e=- "
	                      "f=0x10 g="),
	                 "{\"sqlstate\":\"40001\",\"request_id\":\"12\",\"event_id\":\"1\","
	                 "\"a\":\"01\",\"b\":\"1.\",\"c\":-0,\"d\":1e5,\"e\":\"-\",\"f\":\"0x10\","
	                 "\"g\":\"\"}");
}

Test(log_json, quoted_values_are_unescaped_then_escaped_for_json)
{
	cr_assert_str_eq(json("msg=\"say \\\"hi\\\"\" error=\"a\\\\b\\nc\" x=\"=\""),
	                 "{\"msg\":\"say \\\"hi\\\"\",\"error\":\"a\\\\b\\nc\",\"x\":\"=\"}");
	/* The value ends at the end of the line when its quote never comes. */
	cr_assert_str_eq(json("msg=\"cut sh"), "{\"msg\":\"cut sh\"}");
}

Test(log_json, words_without_a_key_join_the_value_before_them)
{
	cr_assert_str_eq(json("signal=11 (Segmentation fault) uptime_s=3"),
	                 "{\"signal\":\"11 (Segmentation fault)\",\"uptime_s\":3}");
	cr_assert_str_eq(json("stray words x=1"), "{\"_\":\"stray words\",\"x\":1}");
}

Test(log_json, bytes_that_are_not_utf8_become_replacement_characters)
{
	cr_assert_str_eq(json("path=/\xc3\xa9t\xc3 x=\"\x01\""),
	                 "{\"path\":\"/\xc3\xa9t\\ufffd\",\"x\":\"\\u0001\"}");
	cr_assert_str_eq(json("p=\xed\xa0\x80"), "{\"p\":\"\\ufffd\\ufffd\\ufffd\"}",
	                 "a UTF-16 surrogate is not UTF-8");
}

Test(log_json, a_line_too_long_for_the_buffer_keeps_whole_members_only)
{
	char out[40];
	size_t n =
	    log_json_from_logfmt("level=info msg=\"a long message here\" x=1", out, sizeof(out));

	cr_assert_str_eq(out, "{\"level\":\"info\"}");
	cr_assert_eq(n, strlen(out));
}

Test(log_json, every_line_parses_as_json)
{
	const char *lines[] = { "",       "a",     "=",           "a=",    "=b",       "\"",
		                "a=\"\\", "a=b=c", "  a=1  b=2 ", "k\"=v", "a=\"x\" y" };

	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
		struct json_object *o = json_tokener_parse(json(lines[i]));
		cr_assert_not_null(o, "\"%s\" gave %s", lines[i], json(lines[i]));
		cr_assert(json_object_is_type(o, json_type_object));
		json_object_put(o);
	}
}

Test(log_quote, plain_values_are_only_put_between_quotes)
{
	char q[64];

	cr_assert_str_eq(log_quote(q, sizeof(q), "/run/idemflow/fcgi.sock"),
	                 "\"/run/idemflow/fcgi.sock\"");
	cr_assert_str_eq(log_quote(q, sizeof(q), "Connection refused"), "\"Connection refused\"");
	cr_assert_str_eq(log_quote(q, sizeof(q), ""), "\"\"");
	cr_assert_str_eq(log_quote(q, sizeof(q), NULL), "\"\"", "NULL is the empty value");
}

Test(log_quote, escapes_quotes_backslashes_and_control_characters)
{
	char q[128];

	/* As PostgreSQL words its messages. */
	cr_assert_str_eq(log_quote(q, sizeof(q), "relation \"outbox\" does not exist"),
	                 "\"relation \\\"outbox\\\" does not exist\"");
	cr_assert_str_eq(log_quote(q, sizeof(q), "C:\\tmp\\x"), "\"C:\\\\tmp\\\\x\"");
	cr_assert_str_eq(log_quote(q, sizeof(q), "ERROR:  x\nDETAIL:  y\r\n\tz"),
	                 "\"ERROR:  x\\nDETAIL:  y\\r\\n\\tz\"");
	cr_assert_str_eq(log_quote(q, sizeof(q),
	                           "a\x01"
	                           "b\x1b[0m\x7f"),
	                 "\"a\\u0001b\\u001b[0m\\u007f\"");
	/* Bytes above ASCII stand as they are (the JSON form checks UTF-8). */
	cr_assert_str_eq(log_quote(q, sizeof(q), "caf\xc3\xa9"), "\"caf\xc3\xa9\"");
}

Test(log_quote, a_long_value_is_cut_whole_and_still_closed)
{
	char big[3000], q[LOG_QUOTE_MAX], small[10];
	size_t n;

	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	log_quote(q, sizeof(q), big);
	n = strlen(q);
	cr_assert_eq(n, sizeof(q) - 1);
	cr_assert_eq(q[0], '"');
	cr_assert_eq(q[n - 1], '"');
	/* Never half an escape: "ab\"" and its closing quote fill 9 bytes;
	 * the next escape would not fit with the quote and is left out. */
	cr_assert_str_eq(log_quote(small, sizeof(small), "ab\"\"\"\""), "\"ab\\\"\\\"\"");
	cr_assert_str_eq(log_quote(small, sizeof(small), "abc\x01"), "\"abc\"");
	cr_assert_str_eq(log_quote(small, 3, "abc"), "\"\"");
}

Test(log_quote, log_kv_quotes_the_same_way_and_only_when_needed)
{
	char line[256];
	size_t n = 0;

	log_kv(line, sizeof(line), &n, "route", "/v1/workflows/{id}");
	log_kv(line, sizeof(line), &n, "error", "role \"x\"\tgone\x02");
	log_kv(line, sizeof(line), &n, "empty", NULL);
	cr_assert_str_eq(line, "route=/v1/workflows/{id} error=\"role \\\"x\\\"\\tgone\\u0002\" "
	                       "empty=\"\"");
	cr_assert_eq(n, strlen(line));
}

Test(log_quote, the_json_form_gives_back_the_value)
{
	char line[256];

	snprintf(line, sizeof(line), "error=%s",
	         LOG_Q("a \"b\" \\ c\n\td\r\x01"
	               "e\x7f"));
	cr_assert_str_eq(json(line),
	                 "{\"error\":\"a \\\"b\\\" \\\\ c\\n\\u0009d\\u000d\\u0001e\x7f\"}");
	/* Not an escape quote() makes: the character stands for itself. */
	cr_assert_str_eq(json("x=\"\\q\\u12\""), "{\"x\":\"qu12\"}");
}

Test(log_format, parses_its_two_names)
{
	enum log_format f;

	cr_assert_eq(log_format_parse("json", &f), 0);
	cr_assert_eq(f, LOG_FORMAT_JSON);
	cr_assert_eq(log_format_parse("logfmt", &f), 0);
	cr_assert_eq(f, LOG_FORMAT_LOGFMT);
	cr_assert_eq(log_format_parse("JSON", &f), -1);
}

/* --- Files ---------------------------------------------------------------- */

static char dir[] = "/tmp/idemflow-test-log.XXXXXX";

static void setup(void)
{
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	struct err e;
	char cmd[128];

	/* Back to the stderr Criterion gave us. */
	cr_assert_eq(log_open(NULL, &e), 0);
	log_line_format = LOG_FORMAT_LOGFMT;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	static char text[8192];
	size_t n;

	cr_assert_not_null(f, "%s", path);
	n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	return text;
}

Test(log_file, lines_go_to_the_file_as_json_and_sigusr1_moves_them_to_a_new_one, .init = setup,
     .fini = teardown)
{
	char path[128], rotated[140];
	struct err e;
	struct json_object *o, *v;
	char *text;

	snprintf(path, sizeof(path), "%s/idemflow.log", dir);
	snprintf(rotated, sizeof(rotated), "%s.1", path);
	cr_assert_eq(log_open(path, &e), 0, "%s", e.msg);
	log_line_format = LOG_FORMAT_JSON;
	log_set_component("test");
	log_info("first", "n=1");
	fprintf(stderr, "stray\n"); /* anything on stderr goes to the file too */

	text = slurp(path);
	char *nl = strchr(text, '\n');
	cr_assert_not_null(nl);
	*nl = '\0';
	o = json_tokener_parse(text);
	cr_assert_not_null(o, "%s", text);
	cr_assert(json_object_object_get_ex(o, "msg", &v));
	cr_assert_str_eq(json_object_get_string(v), "first");
	cr_assert(json_object_object_get_ex(o, "component", &v));
	cr_assert_str_eq(json_object_get_string(v), "test");
	cr_assert(json_object_object_get_ex(o, "n", &v));
	cr_assert_eq(json_object_get_int(v), 1);
	json_object_put(o);
	cr_assert_str_eq(nl + 1, "stray\n");

	/* logrotate renames, then signals: the next line opens the new file. */
	cr_assert_eq(rename(path, rotated), 0);
	log_reopen_on_signal(SIGUSR1);
	log_line_format = LOG_FORMAT_LOGFMT;
	log_info("second", NULL);
	text = slurp(path);
	cr_assert_not_null(strstr(text, "msg=\"log file reopened\""), "%s", text);
	cr_assert_not_null(strstr(text, "msg=second"), "%s", text);
	cr_assert(strstr(text, "msg=\"log file reopened\"") < strstr(text, "msg=second"));
	cr_assert_null(strstr(slurp(rotated), "second"), "the old file must not get new lines");
}

Test(log_file, an_unwritable_path_is_an_error_and_stderr_is_kept, .init = setup, .fini = teardown)
{
	char path[160];
	struct err e;

	snprintf(path, sizeof(path), "%s/missing/idemflow.log", dir);
	cr_assert_eq(log_open(path, &e), -1);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert(strstr(e.msg, "could not open log_file \"") == e.msg, "%s", e.msg);
	cr_assert(strstr(e.msg, "No such file or directory") != NULL, "%s", e.msg);
}

/* --- Lines ---------------------------------------------------------------- */

/* The line a log call writes, read back from a log file of its own. */
static char *one_line(void (*emit)(void))
{
	char path[128];
	struct err e;

	snprintf(path, sizeof(path), "%s/lines.log", dir);
	unlink(path);
	cr_assert_eq(log_open(path, &e), 0, "%s", e.msg);
	emit();
	return slurp(path);
}

static char long_pairs[4096];

static void emit_pairs(void)
{
	char pairs[256];
	size_t n = 0;

	log_kv(pairs, sizeof(pairs), &n, "status", "201");
	log_kv(pairs, sizeof(pairs), &n, "path", "/v1/a b");
	log_kv(pairs, sizeof(pairs), &n, "q", "say \"hi\"\\\n");
	log_kv(pairs, sizeof(pairs), &n, "empty", "");
	log_info("request", "%s", pairs);
}

static void emit_formatted(void)
{
	log_warning("slow", "n=%d ms=%.1f", 7, 2.5);
}

static void emit_long(void)
{
	memset(long_pairs, 'x', sizeof(long_pairs) - 1);
	memcpy(long_pairs, "k=", 2);
	log_info("long", "%s", long_pairs);
}

/* ts=<UTC, milliseconds> level component pid msg, then the pairs as given:
 * the fields every line starts with, made without printf. */
Test(log_line, head_fields_then_the_pairs, .init = setup, .fini = teardown)
{
	char expect[256], ts[32];
	time_t now = time(NULL);
	struct tm tm;

	log_set_component("test");
	char *text = one_line(emit_pairs);
	snprintf(expect, sizeof(expect), " level=info component=test pid=%ld msg=request ",
	         (long)getpid());
	cr_assert_not_null(strstr(text, expect), "%s", text);
	cr_assert_eq(strncmp(text, "ts=", 3), 0, "%s", text);
	/* 2026-11-29T18:45:35.361Z: this second or the one before. */
	cr_assert_eq(text[22], '.', "%s", text);
	cr_assert_eq(text[26], 'Z', "%s", text);
	for (int i = 23; i < 26; i++)
		cr_assert(text[i] >= '0' && text[i] <= '9', "%s", text);
	int found = 0;
	for (time_t t = now - 1; t <= now + 1; t++) {
		gmtime_r(&t, &tm);
		strftime(ts, sizeof(ts), "ts=%Y-%m-%dT%H:%M:%S.", &tm);
		found |= strncmp(text, ts, strlen(ts)) == 0;
	}
	cr_assert(found, "%s", text);
	cr_assert_not_null(strstr(text, "msg=request status=201 path=\"/v1/a b\" "
	                                "q=\"say \\\"hi\\\"\\\\\\n\" empty=\"\"\n"),
	                   "%s", text);
}

Test(log_line, printf_pairs_are_formatted, .init = setup, .fini = teardown)
{
	char *text = one_line(emit_formatted);
	cr_assert_not_null(strstr(text, " level=warning "), "%s", text);
	cr_assert_not_null(strstr(text, " msg=slow n=7 ms=2.5\n"), "%s", text);
}

/* A line never outgrows its buffer: cut, still one line, newline last. */
Test(log_line, an_overlong_line_is_cut_and_ends_with_a_newline, .init = setup, .fini = teardown)
{
	char *text = one_line(emit_long);
	size_t n = strlen(text);
	cr_assert_lt(n, 2100, "%zu", n);
	cr_assert_gt(n, 2000, "%zu", n);
	cr_assert_eq(text[n - 1], '\n');
	cr_assert_eq(strchr(text, '\n'), text + n - 1, "one line only");
	cr_assert_not_null(strstr(text, " msg=long k=xxxx"), "%s", text);
}

/* A forked child logs its own pid, not its parent's. */
Test(log_line, a_child_logs_its_own_pid, .init = setup, .fini = teardown)
{
	char path[128], expect[64];
	struct err e;
	int status;

	snprintf(path, sizeof(path), "%s/fork.log", dir);
	cr_assert_eq(log_open(path, &e), 0, "%s", e.msg);
	log_info("parent", NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		log_info("child", NULL);
		_exit(0);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	char *text = slurp(path);
	snprintf(expect, sizeof(expect), "pid=%ld msg=parent\n", (long)getpid());
	cr_assert_not_null(strstr(text, expect), "%s", text);
	snprintf(expect, sizeof(expect), "pid=%ld msg=child\n", (long)pid);
	cr_assert_not_null(strstr(text, expect), "%s", text);
}

/* --- The journal ------------------------------------------------------ */

/* JOURNAL_STREAM as systemd sets it for the file at path: "dev:ino". */
static void journal_stream_is(const char *path)
{
	struct stat st;
	char v[64];

	cr_assert_eq(stat(path, &st), 0, "%s", path);
	snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long)st.st_dev,
	         (unsigned long long)st.st_ino);
	cr_assert_eq(setenv("JOURNAL_STREAM", v, 1), 0);
}

static void emit_every_level(void)
{
	log_min_level = LOG_DEBUG;
	log_debug("d", NULL);
	log_info("i", NULL);
	log_warning("w", NULL);
	log_error("e", NULL);
	log_line_format = LOG_FORMAT_JSON;
	log_warning("j", NULL);
	log_line_format = LOG_FORMAT_LOGFMT;
}

/* The start of each line of text, up to and with its "level=", or "{". */
static void expect_starts(const char *text, const char *const *starts, size_t n)
{
	const char *line = text;

	for (size_t i = 0; i < n; i++) {
		cr_assert(*line, "line %zu missing: %s", i, text);
		cr_assert_eq(strncmp(line, starts[i], strlen(starts[i])), 0, "line %zu: %s", i,
		             line);
		line = strchr(line, '\n');
		cr_assert_not_null(line);
		line++;
	}
	cr_assert_str_eq(line, "", "%s", text);
}

Test(log_journal, stderr_as_the_journal_gives_each_line_its_priority, .init = setup,
     .fini = teardown)
{
	static const char *const starts[] = { "<7>ts=", "<6>ts=", "<4>ts=", "<3>ts=",
		                              "<4>{\"ts\":" };
	char path[128];
	struct err e;

	snprintf(path, sizeof(path), "%s/journal", dir);
	cr_assert_eq(log_open(path, &e), 0, "%s", e.msg);
	journal_stream_is(path);
	cr_assert_eq(log_stderr_is_journal(), 1);
	emit_every_level();
	char *text = slurp(path);
	expect_starts(text, starts, 5);
	/* The level is still named in the line itself. */
	cr_assert_not_null(strstr(text, "<3>ts="), "%s", text);
	cr_assert_not_null(strstr(strstr(text, "<3>ts="), " level=error "), "%s", text);
}

Test(log_journal, anywhere_else_the_lines_are_bare, .init = setup, .fini = teardown)
{
	static const char *const starts[] = { "ts=", "ts=", "ts=", "ts=", "{\"ts\":" };
	static const char *const others[] = { NULL, "1:2", "garbage", "", "12", "1:2:3" };
	char path[128], other[128];
	struct err e;

	snprintf(other, sizeof(other), "%s/not-stderr", dir);
	fclose(fopen(other, "w"));
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]) + 1; i++) {
		snprintf(path, sizeof(path), "%s/bare%zu", dir, i);
		cr_assert_eq(log_open(path, &e), 0, "%s", e.msg);
		if (i == sizeof(others) / sizeof(others[0]))
			journal_stream_is(other); /* a stream, but not our stderr */
		else if (others[i] == NULL)
			unsetenv("JOURNAL_STREAM");
		else
			setenv("JOURNAL_STREAM", others[i], 1);
		cr_assert_eq(log_stderr_is_journal(), 0, "case %zu", i);
		emit_every_level();
		expect_starts(slurp(path), starts, 5);
	}
}

/* systemd's variable stays in the environment when log_file takes stderr
 * over: the file's lines are bare; stderr given back, the prefix is back. */
Test(log_journal, a_log_file_over_the_journal_is_bare, .init = setup, .fini = teardown)
{
	char journal[128], file[128];
	struct err e;

	snprintf(journal, sizeof(journal), "%s/journal", dir);
	snprintf(file, sizeof(file), "%s/idemflow.log", dir);
	cr_assert_eq(log_open(journal, &e), 0, "%s", e.msg);
	journal_stream_is(journal);
	log_warning("to the journal", NULL);
	cr_assert_eq(log_open(file, &e), 0, "%s", e.msg);
	log_warning("to the file", NULL);
	cr_assert_eq(strncmp(slurp(journal), "<4>ts=", 6), 0, "%s", slurp(journal));
	cr_assert_eq(strncmp(slurp(file), "ts=", 3), 0, "%s", slurp(file));
	cr_assert_null(strstr(slurp(journal), "to the file"));
}
