/*
 * conf.h - the one configuration table shared by all idemflow programs.
 *
 * Every key can come from the config file (`key = value`, `#` comments) and
 * from a command-line flag of the same name (`--key value`, `--key=value`,
 * dashes and underscores interchangeable). Precedence, highest first: flag,
 * environment ($DATABASE_URL for `db` only), file, built-in default.
 *
 * A configuration is parsed into a fresh struct, validated, and only then put
 * in use, so a reload with a bad value keeps the old one. Errors name the file
 * and line (or the flag) and the offending value.
 */
#ifndef IDF_CONF_H
#define IDF_CONF_H

#include <stdio.h>

#include "core/err.h"
#include "core/log.h"

enum idem_mode { IDEM_KEY_REQUIRED, IDEM_KEY_OPTIONAL };

/* The programs that read the configuration. All three accept every key
 * (they share one file); each one's --help lists only the keys it reads. */
enum conf_program {
	CONF_SERVER = 1,   /* idemflow-fcgi */
	CONF_DISPATCH = 2, /* idemflow-dispatch */
	CONF_CLI = 4       /* idemflow */
};

/* The names of the boolean keys: as flags they take no value (--once). */
int conf_is_bool(const char *name);

struct conf {
	char *config_file; /* the file this was loaded from, or NULL */
	char *db;          /* libpq conninfo; "" lets libpq use PG* variables */
	char *partitions;  /* "; "-separated conninfos of the partitions, or "" */
	int partition;     /* the one of partitions to run on, or -1: each in turn */
	char *routing;     /* "direct", or "proxy" (doc/distribution.md); checked by the server */
	char *listen;      /* unix socket path, or host:port */
	int listen_mode;   /* permission bits of the unix socket */
	int workers;
	int max_requests; /* a worker exits after this many requests; 0 = never */
	char *pid_file;   /* "" = none */
	enum idem_mode idempotency_key;
	long idempotency_ttl;            /* ms */
	long idempotency_wait;           /* ms: how long a same-key request waits for the owner */
	int idempotency_mismatch_status; /* 409 or 422: a key reused, another request */
	char *problem_base_uri;          /* absolute; a problem's type is it + slug */
	long replay_cache_ttl;  /* ms a worker may answer a replay from memory; 0 = never */
	long statement_timeout; /* ms; 0 = none */
	long max_body;          /* bytes */
	long max_answer;        /* bytes of a page (page.c) */
	long message_ttl_max;   /* ms: the longest ttl of a message kept by business key */
	long max_depth;         /* JSON nesting */
	long retry_after;       /* s, sent with 503 and 409 in-flight */
	long shutdown_timeout;  /* ms a draining worker gets before SIGKILL */

	/* The supervisor's watch over requests in hand (sup.c); 0 = never. */
	long request_slowlog_timeout;   /* ms: a longer request is logged once */
	long request_terminate_timeout; /* ms: a longer request's worker is killed */

	enum log_level log_level;
	char *application_name;
	enum log_format log_format;
	char *log_file;      /* "" = stderr */
	char *metrics_allow; /* addresses and networks that may GET /metrics */
	char *metrics_token; /* bearer token for GET /metrics; "" = none */
	char *textfile;      /* dispatch: node_exporter textfile; "" = none */

	/* idemflow-dispatch */
	int once;              /* one pass, then exit (the default) */
	int loop;              /* keep running, woken by LISTEN/NOTIFY */
	int batch;             /* events claimed per round trip */
	long max_runtime;      /* ms; 0 = no limit */
	int max_attempts;      /* attempts before an event is dead */
	char *backoff;         /* delays after attempt 1, 2, ...: "5s,5m,30m,2h,5h,10h,10h" */
	long lease;            /* ms a claim is held before another dispatcher may take it */
	long poll_interval;    /* ms between polls in --loop when no notification comes */
	char *sink;            /* http | amqp | nats | exec */
	char *url;             /* http: the webhook URL */
	char *secret;          /* http: Standard Webhooks secret ("whsec_" + base64, or raw) */
	char *secret_previous; /* http: the secret being replaced, also signing meanwhile */
	long timeout;          /* ms per delivery (http, amqp, nats, exec) */
	int dead_on_4xx;       /* http: 4xx other than 408/429 is dead at once */
	int parallel;          /* http: requests in flight at once */
	int endpoints;         /* also deliver to the tenant endpoints */
	int endpoint_disable_failures; /* failed attempts in a row before auto-disable */
	long endpoint_disable_after;   /* ms of failing in a row before auto-disable */
	char *amqp_url;                /* amqp://user:pass@host:port/vhost */
	char *exchange;                /* amqp exchange ("" = default exchange) */
	char *routing_key;             /* amqp routing key; "{type}" is the event type */
	char *exec;                    /* exec: shell command, event JSON on stdin */

	/* idemflow-dispatch, sink = nats (NATS JetStream) */
	char *nats_url;            /* server URLs, comma-separated, tried in order */
	char *nats_subject_prefix; /* subject = prefix "." type; "" = the type alone */
	char *nats_stream;         /* the stream that must take the events; "" = any */

	/* idemflow prune */
	long outbox_retention;   /* ms a delivered event is kept, at least */
	long history_retention;  /* ms a workflow's events are kept after it ended */
	long workflow_retention; /* ms an ended workflow is kept (tenants.workflow_retention) */
	int prune_batch;         /* rows deleted per statement (one short transaction each) */

	/* Only in builds configured with --enable-test-hooks: the create
	 * statement fails after writing its rows, inside its transaction. */
	int test_fail_after_write;
};

/* A struct conf with every default applied. Caller frees with conf_free(). */
struct conf *conf_new(void) MUSTCHECK;
void conf_free(struct conf *c);

/* Set one key from its text form; "origin" names where it came from for
 * error messages (e.g. "idemflow.conf:12" or "--workers"). */
int conf_set(struct conf *c, const char *key, const char *value, const char *origin,
             struct err *e) MUSTCHECK;

/* Read a config file into c. */
int conf_load_file(struct conf *c, const char *path, struct err *e) MUSTCHECK;

/*
 * Build a configuration from argv: the file named by --config (or
 * $IDEMFLOW_CONFIG), then $DATABASE_URL, then every --key flag. Parsing stops
 * at the first argument that is not a flag, or after "--"; *next receives its
 * index. -h/--help and --version are left to the caller: they stop parsing
 * too. Returns a new struct conf (caller frees) or NULL with e filled.
 */
struct conf *conf_from_args(int argc, char **argv, int *next, struct err *e) MUSTCHECK;

/*
 * Checks across keys, after every key is set (conf_from_args() runs it):
 * idempotency_ttl must be at least 10 times idempotency_wait and twice
 * statement_timeout, so that no key expires while a request that claimed
 * it may still commit or a duplicate still wait for it. Returns 0, or -1
 * with e (ERR_CONFIG) naming the setting.
 */
int conf_check(const struct conf *c, struct err *e) MUSTCHECK;

/*
 * The partitions a partitioned deployment's dispatcher, reap, prune and
 * audit run on (doc/distribution.md): how many conninfos the key
 * "partitions" lists (separated by ";", blanks around each ignored), and
 * the i-th of them (0-based) as a new string (caller frees), or NULL.
 */
int conf_partition_count(const struct conf *c);
char *conf_partition_db(const struct conf *c, int i) MUSTCHECK;

/*
 * value read as the duration key name reads it: its units, its limits and
 * its error message, naming origin ("tenant set-ttl"). Returns 0 with *ms
 * set, or -1 with e filled (ERR_INTERNAL when name is no duration key).
 */
int conf_key_duration(const char *name, const char *value, const char *origin, long *ms,
                      struct err *e) MUSTCHECK;

/*
 * A duration written as the configuration writes one: digits and a unit,
 * "500ms", "5s", "10m", "24h", "7d" (no unit: seconds). Returns 0 with *ms
 * its length in milliseconds, or -1 when s is not such a duration (or
 * overflows a long). The one duration parser of the configuration, for
 * the keys and for the values that are lists of durations (backoff) or
 * the options of commands.
 */
int conf_duration(const char *s, long *ms) MUSTCHECK;

/*
 * Print the effective configuration, every key as "key = value" in the
 * order of the table, after a comment line naming the file: what -T shows.
 * Secrets are masked (********): metrics_token, secret and secret_previous whole, the
 * password of db (conninfo or URI), of amqp_url and of nats_url (or its
 * token).
 */
void conf_dump(const struct conf *c, FILE *out);

/* Print the keys program reads, with their defaults and descriptions, for
 * its --help (the table of conf.c says which program reads which key). */
void conf_usage(FILE *out, enum conf_program program);

#endif
