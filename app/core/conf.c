/*
 * conf.c - the configuration table and its one parser (see conf.h).
 *
 * Defaults are written as strings and go through the same parser as user
 * input, so a default can never be a value the parser would reject. A
 * key's row says its type and which programs read it; each type has one
 * small parser and one writer (conf_types), so conf_set() only finds the
 * key and hands its value to its type.
 */
#include "core/conf.h"

#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum conf_type {
	T_STR,
	T_INT,
	T_DURATION,
	T_SIZE,
	T_OCTAL,
	T_IDEM_MODE,
	T_LOG_LEVEL,
	T_LOG_FORMAT,
	T_BOOL,
	T_WORKERS,
	T_KEY_STATUS,
	T_URI
};

/* How conf_dump() shows a value that may hold a secret. */
enum conf_mask {
	M_NONE,
	M_WHOLE,    /* the whole value is the secret */
	M_CONNINFO, /* libpq: password=... in a conninfo, or the password of a URI */
	M_URL       /* the password (or a token alone) in URLs' user info */
};

/* One key: its programs (those whose --help lists it), its type, where
 * it lives in struct conf, its default as text, its limits (what they
 * bound depends on the type; 0 as a duration's max is no limit). */
struct conf_key {
	const char *name;
	unsigned programs; /* enum conf_program, or'ed */
	enum conf_type type;
	size_t offset;
	const char *def;
	long min, max;
	const char *help;
};

#define P_SRV CONF_SERVER
#define P_DSP CONF_DISPATCH
#define P_CLI CONF_CLI
#define P_ALL (CONF_SERVER | CONF_DISPATCH | CONF_CLI)

/* The keys whose values may hold a secret, and how conf_dump() masks them. */
static const struct {
	const char *name;
	enum conf_mask mask;
} conf_secrets[] = {
	{ "db", M_CONNINFO },           { "metrics_token", M_WHOLE }, { "secret", M_WHOLE },
	{ "secret_previous", M_WHOLE }, { "amqp_url", M_URL },        { "nats_url", M_URL },
	{ "partitions", M_WHOLE },
};

static enum conf_mask key_mask(const char *name)
{
	for (size_t i = 0; i < sizeof(conf_secrets) / sizeof(conf_secrets[0]); i++)
		if (strcmp(conf_secrets[i].name, name) == 0)
			return conf_secrets[i].mask;
	return M_NONE;
}

#define OFF(f)           offsetof(struct conf, f)
#define WORKERS_AUTO_MAX 32
static const struct conf_key conf_keys[] = {
	{ "db", P_ALL, T_STR, OFF(db), "", 0, 0,
	  "libpq conninfo or URI (also $DATABASE_URL, PG* variables)" },
	{ "partitions", P_DSP | P_CLI, T_STR, OFF(partitions), "", 0, 0,
	  "the partitions' conninfos, \"; \"-separated: dispatch, reap, prune, audit, migrate run on each" },
	{ "partition", P_DSP | P_CLI, T_INT, OFF(partition), "-1", -1, 32767,
	  "run on this one of partitions only (-1 = each in turn); also db for other commands" },
	{ "listen", P_SRV, T_STR, OFF(listen), "/run/idemflow/idemflow.sock", 0, 0,
	  "FastCGI socket: a unix socket path, or host:port" },
	{ "listen_mode", P_SRV, T_OCTAL, OFF(listen_mode), "0660", 0, 0777,
	  "permissions of the unix socket" },
	{ "routing", P_SRV, T_STR, OFF(routing), "direct", 0, 0,
	  "direct (one database) | proxy: db is a PL/Proxy proxy of partitions" },
	{ "workers", P_SRV, T_WORKERS, OFF(workers), "auto", 1, 256,
	  "number of pre-forked workers, or auto: four per online CPU, 2 to 32" },
	{ "max_requests", P_SRV, T_INT, OFF(max_requests), "0", 0, INT_MAX,
	  "requests a worker serves before it is replaced (0 = never)" },
	{ "pid_file", P_SRV, T_STR, OFF(pid_file), "", 0, 0,
	  "file to write the supervisor's pid to" },
	{ "idempotency_key", P_SRV, T_IDEM_MODE, OFF(idempotency_key), "required", 0, 0,
	  "required | optional (optional accepts unkeyed POSTs, each creating anew)" },
	{ "idempotency_ttl", P_SRV | P_CLI, T_DURATION, OFF(idempotency_ttl), "24h", 1000, 0,
	  "how long a key is remembered" },
	{ "replay_cache_ttl", P_SRV | P_CLI, T_DURATION, OFF(replay_cache_ttl), "1s", 0, 60000,
	  "how long a worker answers a replay from memory (0 = always ask the database)" },
	{ "idempotency_mismatch_status", P_SRV, T_KEY_STATUS, OFF(idempotency_mismatch_status),
	  "409", 0, 0, "409 | 422: the status of a key reused with a different request" },
	{ "problem_base_uri", P_SRV, T_URI, OFF(problem_base_uri),
	  "https://idemflow.example/problems/", 0, 0,
	  "absolute URI each problem type's slug is appended to (the API reference)" },
	{ "idempotency_wait", P_SRV | P_CLI, T_DURATION, OFF(idempotency_wait), "5s", 1, 0,
	  "how long a request waits for another one holding its key" },
	{ "statement_timeout", P_ALL, T_DURATION, OFF(statement_timeout), "30s", 0, 0,
	  "PostgreSQL statement_timeout for request statements (0 = none)" },
	{ "max_body", P_SRV, T_SIZE, OFF(max_body), "1M", 2, 64L * 1024 * 1024,
	  "largest request body accepted" },
	{ "max_answer", P_SRV, T_SIZE, OFF(max_answer), "4M", 64L * 1024, 1024L * 1024 * 1024,
	  "largest list or history page, in bytes" },
	{ "message_ttl_max", P_SRV, T_DURATION, OFF(message_ttl_max), "30d", 1000,
	  3650L * 86400 * 1000,
	  "longest ttl of a message kept by business key (POST /v1/messages)" },
	{ "max_depth", P_SRV, T_INT, OFF(max_depth), "64", 2, 1000,
	  "deepest JSON nesting accepted" },
	{ "retry_after", P_SRV, T_INT, OFF(retry_after), "1", 0, 3600,
	  "seconds sent in Retry-After with 503 and 409 in-flight" },
	{ "shutdown_timeout", P_SRV, T_DURATION, OFF(shutdown_timeout), "30s", 0, 0,
	  "grace period for in-flight requests on SIGTERM before SIGKILL" },
	{ "request_slowlog_timeout", P_SRV, T_DURATION, OFF(request_slowlog_timeout), "0", 0, 0,
	  "log one line for a request running longer than this (0 = never)" },
	{ "request_terminate_timeout", P_SRV, T_DURATION, OFF(request_terminate_timeout), "0", 0, 0,
	  "kill and replace a worker whose request runs longer than this (0 = never)" },
	{ "log_level", P_SRV | P_DSP, T_LOG_LEVEL, OFF(log_level), "info", 0, 0,
	  "debug | info | warning | error" },
	{ "application_name", P_SRV | P_DSP, T_STR, OFF(application_name), "idemflow", 0, 0,
	  "prefix of the PostgreSQL application_name" },
	{ "log_format", P_SRV | P_DSP, T_LOG_FORMAT, OFF(log_format), "logfmt", 0, 0,
	  "logfmt | json (one JSON object per line, same fields)" },
	{ "log_file", P_SRV | P_DSP, T_STR, OFF(log_file), "", 0, 0,
	  "append the log to this file instead of stderr; SIGUSR1 reopens it" },
	{ "metrics_allow", P_SRV, T_STR, OFF(metrics_allow), "127.0.0.1,::1", 0, 0,
	  "client addresses or networks (a.b.c.d/n, x::/n) allowed to GET /metrics" },
	{ "metrics_token", P_SRV, T_STR, OFF(metrics_token), "", 0, 0,
	  "bearer token that opens GET /metrics from any address (never a tenant's)" },
	{ "textfile", P_DSP, T_STR, OFF(textfile), "", 0, 0,
	  "dispatch: write the run's metrics to this node_exporter textfile (*.prom)" },
	/* idemflow-dispatch */
	{ "once", P_DSP, T_BOOL, OFF(once), "false", 0, 0,
	  "dispatch: one pass until nothing is due (default)" },
	{ "loop", P_DSP, T_BOOL, OFF(loop), "false", 0, 0,
	  "dispatch: keep running, woken by LISTEN/NOTIFY, polling as a fallback" },
	{ "batch", P_DSP, T_INT, OFF(batch), "100", 1, 10000,
	  "dispatch: events claimed at a time" },
	{ "max_runtime", P_DSP, T_DURATION, OFF(max_runtime), "0", 0, 0,
	  "dispatch: stop after this long (0 = no limit)" },
	{ "max_attempts", P_DSP, T_INT, OFF(max_attempts), "8", 1, 1000,
	  "dispatch: attempts before an event is dead" },
	{ "backoff", P_DSP, T_STR, OFF(backoff), "5s,5m,30m,2h,5h,10h,10h", 0, 0,
	  "dispatch: delay after each failed attempt, the last one repeating (with +-20% jitter)" },
	{ "lease", P_DSP, T_DURATION, OFF(lease), "2m", 1000, 0,
	  "dispatch: how long a claimed event is reserved for its dispatcher" },
	{ "poll_interval", P_DSP, T_DURATION, OFF(poll_interval), "5s", 10, 0,
	  "dispatch: --loop polls this often without notifications" },
	{ "sink", P_DSP, T_STR, OFF(sink), "http", 0, 0, "dispatch: http | amqp | nats | exec" },
	{ "url", P_DSP, T_STR, OFF(url), "", 0, 0, "dispatch (http): webhook URL" },
	{ "secret", P_DSP, T_STR, OFF(secret), "", 0, 0,
	  "dispatch (http): signing secret, whsec_<base64> or raw text" },
	{ "secret_previous", P_DSP, T_STR, OFF(secret_previous), "", 0, 0,
	  "dispatch (http): the secret being rotated out, signing beside secret meanwhile" },
	{ "timeout", P_DSP, T_DURATION, OFF(timeout), "10s", 1, 0,
	  "dispatch: timeout of one delivery" },
	{ "dead_on_4xx", P_DSP, T_BOOL, OFF(dead_on_4xx), "true", 0, 0,
	  "dispatch (http): a 4xx other than 408/429 makes the event dead at once" },
	{ "parallel", P_DSP, T_INT, OFF(parallel), "4", 1, 64,
	  "dispatch (http): requests in flight at once, each on its own keep-alive connection" },
	{ "endpoints", P_DSP, T_BOOL, OFF(endpoints), "true", 0, 0,
	  "dispatch: also deliver the tenant endpoints' deliveries (over HTTP, whatever the sink)" },
	{ "endpoint_disable_failures", P_DSP, T_INT, OFF(endpoint_disable_failures), "10", 1,
	  1000000,
	  "dispatch: failed attempts in a row before an endpoint is disabled (with "
	  "endpoint_disable_after)" },
	{ "endpoint_disable_after", P_DSP, T_DURATION, OFF(endpoint_disable_after), "5d", 1000, 0,
	  "dispatch: how long an endpoint fails in a row before it is disabled (with "
	  "endpoint_disable_failures)" },
	{ "amqp_url", P_DSP, T_STR, OFF(amqp_url), "amqp://guest:guest@127.0.0.1:5672/", 0, 0,
	  "dispatch (amqp): broker URL" },
	{ "exchange", P_DSP, T_STR, OFF(exchange), "idemflow", 0, 0,
	  "dispatch (amqp): exchange to publish to (\"\" = the default exchange)" },
	{ "routing_key", P_DSP, T_STR, OFF(routing_key), "{type}", 0, 0,
	  "dispatch (amqp): routing key; {type} is replaced by the event type" },
	{ "nats_url", P_DSP, T_STR, OFF(nats_url), "nats://127.0.0.1:4222", 0, 0,
	  "dispatch (nats): server URLs, comma-separated, tried in that order" },
	{ "nats_subject_prefix", P_DSP, T_STR, OFF(nats_subject_prefix), "idemflow", 0, 0,
	  "dispatch (nats): events go to subject <prefix>.<event type> (\"\" = the type alone)" },
	{ "nats_stream", P_DSP, T_STR, OFF(nats_stream), "", 0, 0,
	  "dispatch (nats): the JetStream stream that must store the events (\"\" = any)" },
	{ "exec", P_DSP, T_STR, OFF(exec), "", 0, 0,
	  "dispatch (exec): shell command run per event, event JSON on stdin" },
	/* idemflow prune */
	{ "outbox_retention", P_CLI, T_DURATION, OFF(outbox_retention), "7d", 0, 0,
	  "prune: delivered outbox events older than this are deleted (dead ones are kept)" },
	{ "history_retention", P_CLI, T_DURATION, OFF(history_retention), "7d", 0, 0,
	  "prune: a workflow's events are kept until it has ended this long ago (never while "
	  "it runs)" },
	{ "workflow_retention", P_CLI, T_DURATION, OFF(workflow_retention), "30d", 1000, 0,
	  "prune: an ended workflow, with its jobs, timers, messages and events, is deleted this "
	  "long after it ended (a tenant may set its own; never while an event is undelivered)" },
	{ "prune_batch", P_CLI, T_INT, OFF(prune_batch), "1000", 1, 100000,
	  "prune: rows deleted per statement, each its own short transaction" },
#ifdef IDEMFLOW_TEST_HOOKS
	{ "test_fail_after_write", P_SRV, T_BOOL, OFF(test_fail_after_write), "false", 0, 0,
	  "TEST BUILD ONLY: creates fail after writing, inside the transaction" },
#endif
};
#define NKEYS (sizeof(conf_keys) / sizeof(conf_keys[0]))

static const struct conf_key *key_find(const char *name)
{
	char norm[64];
	size_t i;

	for (i = 0; name[i] && i < sizeof(norm) - 1; i++)
		norm[i] = name[i] == '-' ? '_' : name[i];
	norm[i] = '\0';
	for (size_t k = 0; k < NKEYS; k++)
		if (strcmp(conf_keys[k].name, norm) == 0)
			return &conf_keys[k];
	return NULL;
}

int conf_is_bool(const char *name)
{
	const struct conf_key *k = key_find(name);

	return k != NULL && k->type == T_BOOL;
}

/* Parse "<digits>[suffix]" where suffix scales by one of units[]. */
struct unit {
	const char *suffix;
	long mult;
};

static int parse_scaled(const char *s, const struct unit *units, long *out)
{
	char *end;
	long v;

	if (!isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0)
		return -1;
	for (const struct unit *u = units; u->suffix; u++) {
		if (strcmp(end, u->suffix) == 0) {
			if (v > LONG_MAX / u->mult)
				return -1;
			*out = v * u->mult;
			return 0;
		}
	}
	return -1;
}

static const struct unit duration_units[] = { { "", 1000 },   { "ms", 1 },      { "s", 1000 },
	                                      { "m", 60000 }, { "h", 3600000 }, { "d", 86400000 },
	                                      { NULL, 0 } };
static const struct unit size_units[] = { { "", 1 },        { "k", 1024 },    { "K", 1024 },
	                                  { "M", 1048576 }, { "m", 1048576 }, { NULL, 0 } };

int conf_duration(const char *s, long *ms)
{
	return parse_scaled(s, duration_units, ms);
}

/* An absolute URI (RFC 3986: scheme ":" ...) that can go into a JSON
 * string and a header unescaped: printable ASCII without space, '"',
 * '\\', '<' or '>'. Not a full URI parser: a check against typing. */
#define URI_MAX 200
static int uri_valid(const char *v)
{
	size_t n = 0;

	if (!isalpha((unsigned char)v[0]))
		return 0;
	while (isalnum((unsigned char)v[n]) || v[n] == '+' || v[n] == '-' || v[n] == '.')
		n++;
	if (v[n] != ':' || v[n + 1] == '\0')
		return 0;
	for (n = 0; v[n]; n++) {
		unsigned char c = (unsigned char)v[n];
		if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' ||
		    n >= URI_MAX)
			return 0;
	}
	return 1;
}

/* --- What conf_dump() writes ------------------------------------------- */

/* The text form of a duration in ms: the largest unit that is exact. */
static void dump_duration(FILE *out, long ms)
{
	static const struct unit units[] = { { "d", 86400000 }, { "h", 3600000 }, { "m", 60000 },
		                             { "s", 1000 },     { "ms", 1 },      { NULL, 0 } };

	if (ms == 0) {
		fputs("0", out);
		return;
	}
	for (const struct unit *u = units; u->suffix; u++)
		if (ms % u->mult == 0) {
			fprintf(out, "%ld%s", ms / u->mult, u->suffix);
			return;
		}
}

static void dump_size(FILE *out, long b)
{
	if (b != 0 && b % 1048576 == 0)
		fprintf(out, "%ldM", b / 1048576);
	else if (b != 0 && b % 1024 == 0)
		fprintf(out, "%ldk", b / 1024);
	else
		fprintf(out, "%ld", b);
}

#define MASKED "********"

/* URLs, comma-separated: the password of each one's user info (and with
 * token_alone, a user info without a password, which is a token). */
static void dump_urls(FILE *out, const char *v, int token_alone)
{
	while (*v) {
		size_t n = strcspn(v, ",");
		const char *scheme = strstr(v, "://");
		const char *at = NULL;

		if (scheme != NULL && (size_t)(scheme - v) < n) {
			const char *ui = scheme + 3;
			size_t hostpart = strcspn(ui, "/?#,");
			for (size_t i = 0; i < hostpart; i++)
				if (ui[i] == '@')
					at = ui + i;
			if (at != NULL) {
				const char *colon = memchr(ui, ':', (size_t)(at - ui));
				if (colon != NULL)
					fprintf(out, "%.*s" MASKED, (int)(colon + 1 - v), v);
				else if (token_alone)
					fprintf(out, "%.*s" MASKED, (int)(ui - v), v);
				else
					at = ui, fprintf(out, "%.*s", (int)(ui - v), v);
				fprintf(out, "%.*s", (int)(v + n - at), at);
			}
		}
		if (at == NULL)
			fprintf(out, "%.*s", (int)n, v);
		v += n;
		if (*v == ',')
			fputc(*v++, out);
	}
}

/* A conninfo "k=v k='v'": every password's value masked. A URI: the
 * password of its user info, and password= in its query. */
static void dump_conninfo(FILE *out, const char *v)
{
	const char *p = v;

	if (strstr(v, "://") != NULL) {
		char *copy = strdup(v), *q;
		if (copy == NULL)
			return;
		q = strstr(copy, "password=");
		if (q != NULL && (q[-1] == '?' || q[-1] == '&')) {
			size_t rest = strcspn(q + 9, "&#");
			memmove(q + 9 + strlen(MASKED), q + 9 + rest, strlen(q + 9 + rest) + 1);
			memcpy(q + 9, MASKED, strlen(MASKED));
		}
		dump_urls(out, copy, 0);
		free(copy);
		return;
	}
	while (*p) {
		const char *kw = p;
		size_t klen;

		while (isspace((unsigned char)*p))
			fputc(*p++, out);
		kw = p;
		while (*p && *p != '=' && !isspace((unsigned char)*p))
			p++;
		klen = (size_t)(p - kw);
		fprintf(out, "%.*s", (int)klen, kw);
		while (isspace((unsigned char)*p))
			fputc(*p++, out);
		if (*p != '=')
			continue;
		fputc(*p++, out);
		while (isspace((unsigned char)*p))
			fputc(*p++, out);
		const char *val = p;
		if (*p == '\'') {
			for (p++; *p && *p != '\''; p++)
				if (*p == '\\' && p[1])
					p++;
			if (*p)
				p++;
		} else {
			while (*p && !isspace((unsigned char)*p))
				p++;
		}
		if (klen == 8 && strncmp(kw, "password", 8) == 0)
			fputs(MASKED, out);
		else
			fprintf(out, "%.*s", (int)(p - val), val);
	}
}

/* --- One parser per type ------------------------------------------------
 *
 * Each reads value as key k's, into dst (k's field of a struct conf), or
 * returns -1 with e naming origin, the value, the key and what it expects.
 * dst is untouched on an error. */

typedef int conf_parse_fn(const struct conf_key *k, const char *value, const char *origin,
                          void *dst, struct err *e);

/* The one form of a bad value: "ORIGIN: invalid value "V" for "K":
 * expected ...", the expectation formatted from fmt. */
static int PRINTFLIKE(5, 6) invalid(struct err *e, const struct conf_key *k, const char *origin,
                                    const char *value, const char *fmt, ...)
{
	char expected[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(expected, sizeof(expected), fmt, ap);
	va_end(ap);
	return err_set(e, ERR_CONFIG, "%s: invalid value \"%s\" for \"%s\": expected %s", origin,
	               value, k->name, expected);
}

static int parse_str(const struct conf_key *k, const char *value, const char *origin, void *dst,
                     struct err *e)
{
	char *dup = strdup(value);

	if (dup == NULL)
		return err_set(e, ERR_INTERNAL, "out of memory");
	free(*(char **)dst);
	*(char **)dst = dup;
	return 0;
}

static int parse_uri(const struct conf_key *k, const char *value, const char *origin, void *dst,
                     struct err *e)
{
	if (!uri_valid(value))
		return invalid(
		    e, k, origin, value,
		    "an absolute URI such as https://example.com/problems/ (scheme, "
		    "colon, at most %d printable ASCII characters without spaces, quotes, "
		    "backslashes or angle brackets)",
		    URI_MAX);
	return parse_str(k, value, origin, dst, e);
}

/* An int in [k->min, k->max], in base 10 or 8; noun names it in the error. */
static int parse_long_in_base(const struct conf_key *k, const char *value, const char *origin,
                              void *dst, struct err *e, int base, const char *noun)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(value, &end, base);
	if (errno || end == value || *end || v < k->min || v > k->max)
		return invalid(e, k, origin, value, "%s between %ld and %ld", noun, k->min, k->max);
	*(int *)dst = (int)v;
	return 0;
}

static int parse_int(const struct conf_key *k, const char *value, const char *origin, void *dst,
                     struct err *e)
{
	return parse_long_in_base(k, value, origin, dst, e, 10, "an integer");
}

static int parse_octal(const struct conf_key *k, const char *value, const char *origin, void *dst,
                       struct err *e)
{
	return parse_long_in_base(k, value, origin, dst, e, 8, "an octal mode");
}

/* Four per CPU: a worker waits on PostgreSQL for most of a create, its
 * commit above all, and on a disk that takes a millisecond to commit two
 * per CPU leave the cores idle (doc/performance.md, "A create's CPU"). At
 * most WORKERS_AUTO_MAX: each worker holds a connection, and PostgreSQL
 * allows 100 by default. Not auto: an integer in the key's range. */
static int parse_workers(const struct conf_key *k, const char *value, const char *origin, void *dst,
                         struct err *e)
{
	long v;

	if (strcmp(value, "auto") != 0)
		return parse_long_in_base(k, value, origin, dst, e, 10, "auto or an integer");
	v = 4 * sysconf(_SC_NPROCESSORS_ONLN);
	*(int *)dst = (int)(v < 2 ? 2 : v > WORKERS_AUTO_MAX ? WORKERS_AUTO_MAX : v);
	return 0;
}

static int parse_duration(const struct conf_key *k, const char *value, const char *origin,
                          void *dst, struct err *e)
{
	long v;

	if (conf_duration(value, &v) < 0 || v < k->min)
		return invalid(e, k, origin, value, "a duration such as 500ms, 5s, 10m, 24h or 7d");
	if (k->max > 0 && v > k->max)
		return invalid(e, k, origin, value, "a duration of at most %ld ms", k->max);
	*(long *)dst = v;
	return 0;
}

static int parse_size(const struct conf_key *k, const char *value, const char *origin, void *dst,
                      struct err *e)
{
	long v;

	if (parse_scaled(value, size_units, &v) < 0 || v < k->min || v > k->max)
		return invalid(e, k, origin, value,
		               "a size between %ld and %ld bytes, such as 512k or 1M", k->min,
		               k->max);
	*(long *)dst = v;
	return 0;
}

static int parse_idem_mode(const struct conf_key *k, const char *value, const char *origin,
                           void *dst, struct err *e)
{
	if (strcmp(value, "required") == 0)
		*(enum idem_mode *)dst = IDEM_KEY_REQUIRED;
	else if (strcmp(value, "optional") == 0)
		*(enum idem_mode *)dst = IDEM_KEY_OPTIONAL;
	else
		return invalid(e, k, origin, value, "required or optional");
	return 0;
}

static int parse_bool(const struct conf_key *k, const char *value, const char *origin, void *dst,
                      struct err *e)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcmp(value, yes[i]) == 0 || strcmp(value, no[i]) == 0) {
			*(int *)dst = strcmp(value, yes[i]) == 0;
			return 0;
		}
	}
	return invalid(e, k, origin, value, "true or false");
}

/* 409 is what idemflow always answered; 422 is the IETF draft's. Nothing
 * else: a client tells them by status. */
static int parse_key_status(const struct conf_key *k, const char *value, const char *origin,
                            void *dst, struct err *e)
{
	if (strcmp(value, "409") != 0 && strcmp(value, "422") != 0)
		return invalid(e, k, origin, value, "409 or 422");
	*(int *)dst = atoi(value);
	return 0;
}

static int parse_log_format(const struct conf_key *k, const char *value, const char *origin,
                            void *dst, struct err *e)
{
	if (log_format_parse(value, (enum log_format *)dst) < 0)
		return invalid(e, k, origin, value, "logfmt or json");
	return 0;
}

static int parse_log_level(const struct conf_key *k, const char *value, const char *origin,
                           void *dst, struct err *e)
{
	if (log_level_parse(value, (enum log_level *)dst) < 0)
		return invalid(e, k, origin, value, "debug, info, warning or error");
	return 0;
}

/* --- One writer per type, for conf_dump() ------------------------------ */

typedef void conf_dump_fn(FILE *out, const struct conf_key *k, const void *src);

/* A string as the parser reads it back ("" for empty), its secret masked. */
static void write_str(FILE *out, const struct conf_key *k, const void *src)
{
	const char *v = *(char *const *)src;
	enum conf_mask mask = key_mask(k->name);

	if (*v == '\0')
		fputs("\"\"", out);
	else if (mask == M_NONE)
		fputs(v, out);
	else if (mask == M_WHOLE)
		fputs(MASKED, out);
	else if (mask == M_CONNINFO)
		dump_conninfo(out, v);
	else
		dump_urls(out, v, 1);
}

static void write_int(FILE *out, const struct conf_key *k, const void *src)
{
	fprintf(out, "%d", *(const int *)src);
}

static void write_octal(FILE *out, const struct conf_key *k, const void *src)
{
	fprintf(out, "%04o", (unsigned)*(const int *)src);
}

static void write_duration(FILE *out, const struct conf_key *k, const void *src)
{
	dump_duration(out, *(const long *)src);
}

static void write_size(FILE *out, const struct conf_key *k, const void *src)
{
	dump_size(out, *(const long *)src);
}

static void write_idem_mode(FILE *out, const struct conf_key *k, const void *src)
{
	fputs(*(const enum idem_mode *)src == IDEM_KEY_REQUIRED ? "required" : "optional", out);
}

static void write_log_level(FILE *out, const struct conf_key *k, const void *src)
{
	static const char *const levels[] = { "debug", "info", "warning", "error" };

	fputs(levels[*(const enum log_level *)src], out);
}

static void write_log_format(FILE *out, const struct conf_key *k, const void *src)
{
	fputs(*(const enum log_format *)src == LOG_FORMAT_JSON ? "json" : "logfmt", out);
}

static void write_bool(FILE *out, const struct conf_key *k, const void *src)
{
	fputs(*(const int *)src ? "true" : "false", out);
}

/* Each type: its parser, its writer, and whether the struct owns a string
 * (conf_free() frees it). */
static const struct {
	conf_parse_fn *parse;
	conf_dump_fn *write;
	int owns_string;
} conf_types[] = {
	[T_STR] = { parse_str, write_str, 1 },
	[T_URI] = { parse_uri, write_str, 1 },
	[T_INT] = { parse_int, write_int, 0 },
	[T_WORKERS] = { parse_workers, write_int, 0 },
	[T_KEY_STATUS] = { parse_key_status, write_int, 0 },
	[T_OCTAL] = { parse_octal, write_octal, 0 },
	[T_DURATION] = { parse_duration, write_duration, 0 },
	[T_SIZE] = { parse_size, write_size, 0 },
	[T_IDEM_MODE] = { parse_idem_mode, write_idem_mode, 0 },
	[T_LOG_LEVEL] = { parse_log_level, write_log_level, 0 },
	[T_LOG_FORMAT] = { parse_log_format, write_log_format, 0 },
	[T_BOOL] = { parse_bool, write_bool, 0 },
};

int conf_set(struct conf *c, const char *name, const char *value, const char *origin, struct err *e)
{
	const struct conf_key *k = key_find(name);

	if (k == NULL)
		return err_set(e, ERR_CONFIG, "%s: unknown configuration key \"%s\"", origin, name);
	return conf_types[k->type].parse(k, value, origin, (char *)c + k->offset, e);
}

int conf_key_duration(const char *name, const char *value, const char *origin, long *ms,
                      struct err *e)
{
	const struct conf_key *k = key_find(name);

	if (k == NULL || k->type != T_DURATION)
		return err_set(e, ERR_INTERNAL, "\"%s\" is not a duration key", name);
	return parse_duration(k, value, origin, ms, e);
}

struct conf *conf_new(void)
{
	struct conf *c = calloc(1, sizeof(*c));
	struct err e;

	if (c == NULL)
		return NULL;
	for (size_t k = 0; k < NKEYS; k++) {
		if (conf_set(c, conf_keys[k].name, conf_keys[k].def, "default", &e) < 0) {
			conf_free(c);
			return NULL;
		}
	}
	return c;
}

void conf_free(struct conf *c)
{
	if (c == NULL)
		return;
	for (size_t k = 0; k < NKEYS; k++)
		if (conf_types[conf_keys[k].type].owns_string)
			free(*(char **)((char *)c + conf_keys[k].offset));
	free(c->config_file);
	free(c);
}

static char *trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

int conf_load_file(struct conf *c, const char *path, struct err *e)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	char origin[512];
	int lineno = 0;
	int rc = -1;

	if (f == NULL)
		return err_set(e, ERR_CONFIG, "could not open configuration file \"%s\": %s", path,
		               strerror(errno));
	while (fgets(line, sizeof(line), f) != NULL) {
		char *p, *eq, *key, *val;

		lineno++;
		snprintf(origin, sizeof(origin), "%s:%d", path, lineno);
		if (strchr(line, '\n') == NULL && !feof(f)) {
			err_set(e, ERR_CONFIG, "%s: line too long", origin);
			goto out;
		}
		p = trim(line);
		if (*p == '\0' || *p == '#')
			continue;
		eq = strchr(p, '=');
		if (eq == NULL) {
			err_set(e, ERR_CONFIG, "%s: expected \"key = value\", got \"%s\"", origin,
			        p);
			goto out;
		}
		*eq = '\0';
		key = trim(p);
		val = trim(eq + 1);
		/* Allow "value" in quotes so values may keep surrounding spaces. */
		size_t vl = strlen(val);
		if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
			val[vl - 1] = '\0';
			val++;
		}
		if (conf_set(c, key, val, origin, e) < 0)
			goto out;
	}
	if (ferror(f)) {
		err_set(e, ERR_CONFIG, "could not read configuration file \"%s\"", path);
		goto out;
	}
	free(c->config_file);
	c->config_file = strdup(path);
	rc = 0;
out:
	fclose(f);
	return rc;
}

static int is_stop_flag(const char *a)
{
	return strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0 || strcmp(a, "--version") == 0;
}

/* A key's lifetime against the waits of the requests that use it: a
 * key must outlive every request that may still hold or wait for it. */
#define TTL_WAIT_FACTOR      10 /* times idempotency_wait */
#define TTL_STATEMENT_FACTOR 2  /* times statement_timeout */

int conf_partition_count(const struct conf *c)
{
	int n = 0;

	for (const char *p = c->partitions; *p != '\0';) {
		size_t len = strcspn(p, ";");
		const char *q = p;
		while (q < p + len && isspace((unsigned char)*q))
			q++;
		if (q < p + len)
			n++;
		p += len;
		if (*p == ';')
			p++;
	}
	return n;
}

char *conf_partition_db(const struct conf *c, int i)
{
	int n = 0;

	for (const char *p = c->partitions; *p != '\0';) {
		size_t len = strcspn(p, ";");
		const char *q = p, *end = p + len;
		while (q < end && isspace((unsigned char)*q))
			q++;
		while (end > q && isspace((unsigned char)end[-1]))
			end--;
		if (q < end && n++ == i)
			return strndup(q, (size_t)(end - q));
		p += len;
		if (*p == ';')
			p++;
	}
	return NULL;
}

int conf_check(const struct conf *c, struct err *e)
{
	long min = TTL_WAIT_FACTOR * c->idempotency_wait;

	if (c->partition >= 0 && c->partition >= conf_partition_count(c))
		return err_set(e, ERR_CONFIG,
		               "invalid value for \"partition\": %d, but \"partitions\" names %d",
		               c->partition, conf_partition_count(c));

	if (TTL_STATEMENT_FACTOR * c->statement_timeout > min)
		min = TTL_STATEMENT_FACTOR * c->statement_timeout;
	if (c->idempotency_ttl < min)
		return err_set(
		    e, ERR_CONFIG,
		    "invalid value for \"idempotency_ttl\": %ld ms is shorter than %ld ms, "
		    "%d times idempotency_wait (%ld ms) and %d times statement_timeout "
		    "(%ld ms): a key must outlive every request that may still hold or "
		    "wait for it",
		    c->idempotency_ttl, min, TTL_WAIT_FACTOR, c->idempotency_wait,
		    TTL_STATEMENT_FACTOR, c->statement_timeout);
	return 0;
}

struct conf *conf_from_args(int argc, char **argv, int *next, struct err *e)
{
	struct conf *c = conf_new();
	const char *file = getenv("IDEMFLOW_CONFIG");
	const char *dburl = getenv("DATABASE_URL");
	int i;

	if (c == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	/* First pass: only find --config, so the file sits below the flags. */
	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0 || a[0] != '-' || is_stop_flag(a))
			break;
		if (strcmp(a, "--config") == 0 && i + 1 < argc)
			file = argv[i + 1];
		else if (strncmp(a, "--config=", 9) == 0)
			file = a + 9;
		/* Skip the flag's value. Only "--name" has a name at a + 2: a
		 * lone "-" ends one byte earlier (the second pass refuses it). */
		if (strncmp(a, "--", 2) == 0 && strchr(a, '=') == NULL && !conf_is_bool(a + 2))
			i++;
	}
	if (file != NULL && *file && conf_load_file(c, file, e) < 0)
		goto fail;
	if (dburl != NULL && *dburl && conf_set(c, "db", dburl, "$DATABASE_URL", e) < 0)
		goto fail;

	for (i = 1; i < argc; i++) {
		char name[128];
		const char *a = argv[i], *val, *eq;

		if (strcmp(a, "--") == 0) {
			i++;
			break;
		}
		if (a[0] != '-' || is_stop_flag(a))
			break;
		if (strncmp(a, "--", 2) != 0) {
			err_set(e, ERR_CONFIG, "unknown option \"%s\"", a);
			goto fail;
		}
		eq = strchr(a, '=');
		if (eq != NULL) {
			snprintf(name, sizeof(name), "%.*s", (int)(eq - a - 2), a + 2);
			val = eq + 1;
		} else if (conf_is_bool(a + 2)) {
			snprintf(name, sizeof(name), "%s", a + 2);
			val = "true";
		} else {
			snprintf(name, sizeof(name), "%s", a + 2);
			if (i + 1 >= argc) {
				err_set(e, ERR_CONFIG, "option \"%s\" needs a value", a);
				goto fail;
			}
			val = argv[++i];
		}
		if (strcmp(name, "config") == 0)
			continue;
		if (key_find(name) == NULL) {
			err_set(e, ERR_CONFIG, "unknown option \"--%s\"", name);
			goto fail;
		}
		if (conf_set(c, name, val, a, e) < 0)
			goto fail;
	}
	if (conf_check(c, e) < 0)
		goto fail;
	*next = i;
	return c;
fail:
	conf_free(c);
	return NULL;
}

void conf_usage(FILE *out, enum conf_program program)
{
	fprintf(out, "Configuration (file key, or flag --key VALUE):\n");
	fprintf(out, "  %-20s %s\n", "config", "configuration file (also $IDEMFLOW_CONFIG)");
	for (size_t k = 0; k < NKEYS; k++)
		if (conf_keys[k].programs & program)
			fprintf(out, "  %-20s %s [default: %s]\n", conf_keys[k].name,
			        conf_keys[k].help, *conf_keys[k].def ? conf_keys[k].def : "none");
}

void conf_dump(const struct conf *c, FILE *out)
{
	fprintf(out,
	        "# the effective configuration: %s, $DATABASE_URL and flags over the "
	        "defaults; secrets masked\n",
	        c->config_file != NULL ? c->config_file : "no file");
	for (size_t k = 0; k < NKEYS; k++) {
		const struct conf_key *key = &conf_keys[k];

		fprintf(out, "%s = ", key->name);
		conf_types[key->type].write(out, key, (const char *)c + key->offset);
		fputc('\n', out);
	}
}
