/*
 * queries.h - every SQL statement the server runs, prepared once per
 * connection (and again after a reconnect) from one table.
 *
 * The SQL text lives in queries.c only; callers name a statement by its enum
 * and fill its parameters by name (the enums below).
 */
#ifndef IDF_QUERIES_H
#define IDF_QUERIES_H

#include <stddef.h>

#include "core/db.h"

enum query_id {
	/* -> (tenant_id (KEY_COL_TENANT), the token's id (AUTH_COL_TOKEN)) */
	Q_AUTH,
	/*
	 * Authentication and the key's stored row in one read-only round
	 * trip, for a keyed POST -> no row when the token is unknown or
	 * revoked, else the key row (enum key_col, all KEY_COL__N columns)
	 * with the key's columns NULL when the key is new. Q_CREATE_KEYED's
	 * row has the same KEY_COL__N columns first, so a replay needs no
	 * other statement and either row can go into the replay cache.
	 */
	Q_AUTH_KEY,
	/*
	 * One statement, hence one transaction and one round trip: check the
	 * token, claim the key, insert the workflow and its workflow.created
	 * event with the request's trace context, store the response (enum
	 * create_keyed_param). The key, the workflow and the event record
	 * the token the statement found as their actor. The key's lifetime and the event's due time
	 * count from the database's now(): no worker's clock decides a
	 * lifetime. Nothing is written for an unknown or revoked token.
	 * -> one row laid out as Q_AUTH_KEY's (enum key_col: the tenant, NULL
	 *    for a bad token, then the key's columns), and the outcome
	 *    (CREATE_COL_OUTCOME): 'unauthorized'; 'created' when this request
	 *    owned the key (the key's columns NULL); 'existing' when the key
	 *    was committed before this statement began; 'taken' when it was
	 *    committed by a concurrent owner while we waited (not visible to
	 *    this statement: Q_KEY_GET reads it).
	 */
	Q_CREATE_KEYED,
	/* Unkeyed create (idempotency_key = optional), workflow and event
	 * only (the event is due at the database's now()). */
	Q_CREATE_UNKEYED,
	/* -> the key row's first KEY_COL_SHARED columns ('existing' first) */
	Q_KEY_GET,
	/* Removes the row (and its counts) only if it has expired. */
	Q_KEY_DELETE_EXPIRED,
	/* A key's lifetime counted again from now (never shortened): after
	 * a commit that took long, e.g. waiting for the synchronous standby. */
	Q_KEY_REFRESH,
	/* -> one workflow row (WF_COLUMNS in queries.c): (id, type, state,
	 * input, created_at, business_key, steps, step), then the progress
	 * of the current step's job (NULL when none was reported) */
	Q_WF_GET,
	/* Q_CREATE_KEYED that fails with division by zero after its rows
	 * are written, so the transaction rolls back (--enable-test-hooks
	 * builds with test_fail_after_write; the statement exists in every
	 * build, the switch does not). */
	Q_CREATE_KEYED_FAIL,
	/* Add per-key counts (keystats.h): arrays all of one length, each
	 * (tenant, key) once. */
	Q_KEYSTATS_FLUSH,
	/* -> (the highest applied migration (0 when none), in recovery,
	 * transaction_read_only), for GET /readyz; with routing = proxy,
	 * the lowest over the partitions that answered, then
	 * SCHEMA_COL_PARTITIONS, _UNREACHABLE and _REACHABLE */
	Q_SCHEMA_VERSION,
	/* GET /metrics, one cheap statement per scrape -> (pending events,
	 * age in seconds of the oldest pending one or 0, dead events,
	 * activatable, leased and expired jobs, workflows in incident); with
	 * routing = proxy, the sums over the partitions that answered, then
	 * METRICS_COL_PARTITIONS and _UNREACHABLE */
	Q_METRICS_OUTBOX,
	/* Wake dispatchers waiting in --loop (sent outside any create). */
	Q_NOTIFY,
	/* Transaction control, for commands that span two pipelines. */
	Q_BEGIN,
	Q_COMMIT,
	Q_ROLLBACK,
	/*
	 * Claim a key for a command inside the command's transaction -> one
	 * row when this request owns the key, none when it was taken. The
	 * row stays invisible until Q_KEY_STORE and COMMIT.
	 */
	Q_KEY_CLAIM,
	/* Store the answer on the key claimed by Q_KEY_CLAIM. */
	Q_KEY_STORE,
	/*
	 * routing = proxy (sql/027_partition_keyed_commands.sql): a command
	 * of two round trips as one call on the tenant's partition, its key
	 * claimed (or none) -> (outcome, the command's rows as a JSON array
	 * of record texts): 'created', 'taken', 'unstored' or 'unkeyed'.
	 */
	Q_KEYED_COMMAND,
	/* ...then its rendered answer, unless the key has one already ->
	 * 1 when stored, 0 when it was there. */
	Q_KEY_STORE_ANSWER,
	/* The commands (sql/005_runs.sql); each returns rows whose first
	 * two columns are (problem slug or NULL, detail). */
	/* -> idemflow_wf_row */
	Q_WF_CREATE_RUN,
	/* -> idemflow_wf_row */
	Q_WF_TRANSITION,
	/* -> (problem, detail, outcome, step) */
	Q_WF_MESSAGE,
	/* -> idemflow_job_row per job */
	Q_JOBS_ACTIVATE,
	/* -> idemflow_job_row */
	Q_JOB_COMPLETE,
	/* -> idemflow_job_row */
	Q_JOB_FAIL,
	/* -> (seq, payload, within, actor) rows, one row of NULLs when there
	 * are none, no row when the workflow does not exist */
	Q_WF_EVENTS,
	/* -> workflow rows (as Q_WF_GET, then within) in id order */
	Q_WF_LIST,
	/* Heartbeats and incidents (sql/009_incidents.sql). */
	/* -> the columns of idemflow_job_row, then the job's progress */
	Q_JOB_HEARTBEAT,
	/* -> idemflow_wf_row */
	Q_WF_RESUME,
	/* Set the trace context and the actor that the jobs, events,
	 * messages and workflows inserted later in the same transaction keep
	 * (enum trace_set_param). */
	Q_TRACE_SET,
	/* -> (problem, detail, outcome, workflow_id, step, expires_at) */
	Q_MESSAGE_PUBLISH,
	/* Tenant endpoints (endpoints.c). The commands answer as the others
	 * do: (problem slug or NULL, detail), then ENDPOINT_COLUMNS. */
	/* -> (problem, detail, the endpoint's columns) */
	Q_ENDPOINT_CREATE,
	/* -> the endpoint's columns; no row when there is none */
	Q_ENDPOINT_GET,
	/* -> the endpoint's columns, then within, in id order */
	Q_ENDPOINT_LIST,
	/* -> (problem 'not-found' or NULL, detail, the endpoint's columns) */
	Q_ENDPOINT_UPDATE,
	/* The endpoint, its deliveries and its attempts -> (problem, detail,
	 * id, deliveries deleted, attempts deleted) */
	Q_ENDPOINT_DELETE,
	/* -> (secret, previous secret while it signs, until when); no row
	 * when there is no endpoint */
	Q_ENDPOINT_SECRET,
	/* -> (problem, detail, id, previous secret's end, updated_at) */
	Q_ENDPOINT_ROTATE,
	/* -> as Q_ENDPOINT_ROTATE's */
	Q_ENDPOINT_REVOKE,
	/* The event feed, deliveries and the attempt ledger (events.c). */
	/* -> (id, payload, within, actor) rows of the tenant's events, then
	 * one row (id, NULL, true, NULL) when the scan stopped at
	 * EVENTS_SCAN_PARAM outbox rows: where the next page starts */
	Q_EVENTS_FEED,
	/* -> (endpoint_id, event_id, state, attempts, next_attempt_at,
	 * last_error, updated_at, within) rows in endpoint id order, one row
	 * of NULLs when there are none, no row when the event does not exist */
	Q_EVENT_DELIVERIES,
	/* -> (id, event_id, trigger, started_at, duration_ms, status,
	 * outcome, response, within) rows newest first, one row of NULLs
	 * when there are none, no row when the endpoint does not exist */
	Q_ENDPOINT_ATTEMPTS,
	/* -> (event_id, endpoint_id, state, attempts, next_attempt_at,
	 * last_error, updated_at, within) rows in event stream order, as
	 * Q_ENDPOINT_ATTEMPTS for none or no endpoint */
	Q_ENDPOINT_UNDELIVERED,
	/* -> (problem, detail, recovered) */
	Q_ENDPOINT_RECOVER,
	/* -> (problem, detail, endpoint_id, event_id, state, attempts,
	 * next_attempt_at, last_error, updated_at) */
	Q_EVENT_RESEND,
	/* GET /metrics -> (disabled endpoints, pending deliveries) and
	 * (tenant, endpoint, pending) rows of the METRICS_TOP endpoints with
	 * the most pending deliveries (the first row's endpoint NULL); with
	 * routing = proxy, across the partitions that answered, the first
	 * row ending with METRICS_DELIVERIES_COL_PARTITIONS and _UNREACHABLE */
	Q_METRICS_DELIVERIES,
	Q__COUNT
};

/*
 * The parameters of each statement, in $n order ($1 is the first name):
 * a caller fills its array by name, const char *p[KEY_GET__N] =
 * {[KEY_GET_TENANT] = ...}, and passes the count, which db_run() checks against the table.
 * The table's count is each enum's __N, which db_stmt_check() checks
 * against the SQL when the statements are prepared. Text format; "bytea
 * hex" is '\x' and hex digits, "interval" any text PostgreSQL reads as one.
 */

/* Q_AUTH */
enum auth_param { AUTH_TOKEN_HASH /* bytea hex */, AUTH__N };

/* Q_AUTH_KEY */
enum auth_key_param { AUTH_KEY_TOKEN_HASH /* bytea hex */, AUTH_KEY_KEY, AUTH_KEY__N };

/*
 * The workflow.created event's payload, in the three create statements
 * (Q_CREATE_KEYED, Q_CREATE_UNKEYED, Q_WF_CREATE_RUN) alike: two parts
 * around the tenant id, which the statement puts between them (the keyed
 * create learns the tenant from the token, in the statement itself).
 */

/* Q_CREATE_KEYED, Q_CREATE_KEYED_FAIL */
enum create_keyed_param {
	CREATE_KEYED_TOKEN_HASH, /* bytea hex, as Q_AUTH_KEY's */
	CREATE_KEYED_KEY,
	CREATE_KEYED_METHOD,
	CREATE_KEYED_PATH,
	CREATE_KEYED_FP,         /* the request's fingerprint, bytea hex */
	CREATE_KEYED_HEADERS,    /* stored with the answer */
	CREATE_KEYED_BODY,       /* stored with the answer */
	CREATE_KEYED_CREATED_AT, /* the workflow's, as the answer shows it */
	CREATE_KEYED_TTL,        /* the key's (interval); the tenant's idempotency_ttl wins */
	CREATE_KEYED_ID,         /* the workflow's */
	CREATE_KEYED_TYPE,
	CREATE_KEYED_INPUT, /* canonical JSON */
	CREATE_KEYED_EVENT_ID,
	CREATE_KEYED_PAYLOAD_HEAD, /* the event's payload up to its tenant id */
	CREATE_KEYED_BYTES_FP,     /* the fingerprint of the request's bytes, bytea hex */
	CREATE_KEYED_PAYLOAD_TAIL, /* the event's payload after its tenant id */
	CREATE_KEYED_TRACEPARENT,  /* of the workflow and its event, or NULL */
	CREATE_KEYED_TRACESTATE,   /* or NULL */
	CREATE_KEYED__N
};

/* Q_CREATE_UNKEYED */
enum create_unkeyed_param {
	CREATE_UNKEYED_TENANT,
	CREATE_UNKEYED_CREATED_AT,
	CREATE_UNKEYED_ID,
	CREATE_UNKEYED_TYPE,
	CREATE_UNKEYED_INPUT,
	CREATE_UNKEYED_EVENT_ID,
	CREATE_UNKEYED_PAYLOAD_HEAD, /* as Q_CREATE_KEYED's */
	CREATE_UNKEYED_PAYLOAD_TAIL,
	CREATE_UNKEYED__N
};

/* Q_KEY_GET, Q_KEY_DELETE_EXPIRED */
enum key_get_param { KEY_GET_TENANT, KEY_GET_KEY, KEY_GET__N };

/* Q_KEY_REFRESH: the server's TTL (an interval) unless the tenant has one */
enum key_refresh_param { KEY_REFRESH_TENANT, KEY_REFRESH_KEY, KEY_REFRESH_TTL, KEY_REFRESH__N };

/* Q_WF_GET */
enum wf_get_param { WF_GET_TENANT, WF_GET_ID, WF_GET__N };

/* Q_KEYSTATS_FLUSH */
enum keystats_flush_param {
	KEYSTATS_FLUSH_TENANTS,   /* bigint[] */
	KEYSTATS_FLUSH_KEYS,      /* text[] */
	KEYSTATS_FLUSH_REPLAYS,   /* int[] */
	KEYSTATS_FLUSH_CONFLICTS, /* int[] */
	KEYSTATS_FLUSH_IN_FLIGHT, /* int[], in-flight refusals */
	KEYSTATS_FLUSH__N
};

/* Q_KEY_CLAIM */
enum key_claim_param {
	KEY_CLAIM_TENANT,
	KEY_CLAIM_KEY,
	KEY_CLAIM_METHOD,
	KEY_CLAIM_PATH,
	KEY_CLAIM_FP,       /* the request's fingerprint, bytea hex */
	KEY_CLAIM_TTL,      /* interval; the tenant's idempotency_ttl wins */
	KEY_CLAIM_BYTES_FP, /* the fingerprint of the request's bytes, bytea hex */
	KEY_CLAIM_ACTOR,    /* "token:<id>" (sql/014_actor.sql) */
	KEY_CLAIM__N
};

/* Q_KEY_STORE */
enum key_store_param {
	KEY_STORE_TENANT,
	KEY_STORE_KEY,
	KEY_STORE_STATUS,
	KEY_STORE_HEADERS,
	KEY_STORE_BODY,
	KEY_STORE__N
};

/* Q_KEYED_COMMAND */
enum keyed_command_param {
	KEYED_COMMAND_TENANT,
	KEYED_COMMAND_KEY, /* NULL: run the command without a key */
	KEYED_COMMAND_METHOD,
	KEYED_COMMAND_PATH,
	KEYED_COMMAND_FP,
	KEYED_COMMAND_TTL,
	KEYED_COMMAND_BYTES_FP,
	KEYED_COMMAND_ACTOR,
	KEYED_COMMAND_TRACEPARENT,
	KEYED_COMMAND_TRACESTATE,
	KEYED_COMMAND_SQL,   /* the command's statement, as queries[] has it */
	KEYED_COMMAND_ARGS,  /* its parameters, a text[] literal */
	KEYED_COMMAND_STORE, /* the problems a key keeps (cmd_stores), a text[] literal */
	KEYED_COMMAND__N
};
/* Q_KEYED_COMMAND's columns */
enum { KEYED_COMMAND_COL_OUTCOME, KEYED_COMMAND_COL_ROWS };

/* Q_WF_CREATE_RUN */
enum wf_create_run_param {
	WF_CREATE_RUN_TENANT,
	WF_CREATE_RUN_ID,
	WF_CREATE_RUN_TYPE,
	WF_CREATE_RUN_INPUT,
	WF_CREATE_RUN_CREATED_AT,
	WF_CREATE_RUN_STEPS,        /* canonical JSON array, "[]" for none */
	WF_CREATE_RUN_BUSINESS_KEY, /* or NULL */
	WF_CREATE_RUN_PAYLOAD_HEAD, /* as Q_CREATE_KEYED's */
	WF_CREATE_RUN_PAYLOAD_TAIL,
	WF_CREATE_RUN_PRIORITY, /* 0 to 9 */
	WF_CREATE_RUN__N
};

/* Q_WF_TRANSITION */
enum wf_transition_param {
	WF_TRANSITION_TENANT,
	WF_TRANSITION_ID,
	WF_TRANSITION_TO,
	WF_TRANSITION_FROM, /* or NULL */
	WF_TRANSITION__N
};

/* Q_WF_MESSAGE */
enum wf_message_param {
	WF_MESSAGE_TENANT,
	WF_MESSAGE_ID,
	WF_MESSAGE_MESSAGE_ID,
	WF_MESSAGE_NAME,
	WF_MESSAGE_PAYLOAD,
	WF_MESSAGE__N
};

/* Q_MESSAGE_PUBLISH */
enum message_publish_param {
	MESSAGE_PUBLISH_TENANT,
	MESSAGE_PUBLISH_MESSAGE_ID,
	MESSAGE_PUBLISH_NAME,
	MESSAGE_PUBLISH_BUSINESS_KEY,
	MESSAGE_PUBLISH_TTL, /* an ISO 8601 duration, checked (messages.c) */
	MESSAGE_PUBLISH_PAYLOAD,
	MESSAGE_PUBLISH_TTL_MAX, /* ms: message_ttl_max */
	MESSAGE_PUBLISH__N
};

/* Q_JOBS_ACTIVATE */
enum jobs_activate_param {
	JOBS_ACTIVATE_TENANT,
	JOBS_ACTIVATE_JOB_TYPE,
	JOBS_ACTIVATE_WORKER,
	JOBS_ACTIVATE_MAX_JOBS,
	JOBS_ACTIVATE_LEASE,  /* interval */
	JOBS_ACTIVATE_BUDGET, /* bytes: max_answer */
	JOBS_ACTIVATE__N
};

/* Q_JOB_COMPLETE */
enum job_complete_param {
	JOB_COMPLETE_TENANT,
	JOB_COMPLETE_WORKFLOW,
	JOB_COMPLETE_STEP,
	JOB_COMPLETE_WORKER,
	JOB_COMPLETE_OUTPUT,
	JOB_COMPLETE__N
};

/* Q_JOB_FAIL */
enum job_fail_param {
	JOB_FAIL_TENANT,
	JOB_FAIL_WORKFLOW,
	JOB_FAIL_STEP,
	JOB_FAIL_WORKER,
	JOB_FAIL_ERROR,       /* or NULL */
	JOB_FAIL_RETRY_AFTER, /* interval */
	JOB_FAIL__N
};

/* Q_WF_EVENTS: events after seq WF_EVENTS_AFTER, at most WF_EVENTS_LIMIT,
 * stopping after the first one past WF_EVENTS_BUDGET bytes (page.c,
 * page_answer). */
enum wf_events_param {
	WF_EVENTS_TENANT,
	WF_EVENTS_ID,
	WF_EVENTS_AFTER,
	WF_EVENTS_LIMIT,
	WF_EVENTS_BUDGET,
	WF_EVENTS__N
};

/* Q_WF_LIST: filters are NULL when not asked for; pages as Q_WF_EVENTS. */
enum wf_list_param {
	WF_LIST_TENANT,
	WF_LIST_STATE, /* or NULL */
	WF_LIST_TYPE,  /* or NULL */
	WF_LIST_AFTER, /* the last id of the previous page, or NULL */
	WF_LIST_LIMIT,
	WF_LIST_BUDGET,
	WF_LIST__N
};

/* Q_JOB_HEARTBEAT */
enum job_heartbeat_param {
	JOB_HEARTBEAT_TENANT,
	JOB_HEARTBEAT_WORKFLOW,
	JOB_HEARTBEAT_STEP,
	JOB_HEARTBEAT_WORKER,
	JOB_HEARTBEAT_LEASE,    /* interval */
	JOB_HEARTBEAT_PROGRESS, /* canonical JSON, or NULL to keep the last one */
	JOB_HEARTBEAT__N
};

/* Q_WF_RESUME */
enum wf_resume_param {
	WF_RESUME_TENANT,
	WF_RESUME_ID,
	WF_RESUME_RETRIES, /* or NULL: the step's own */
	WF_RESUME__N
};

/* Q_ENDPOINT_CREATE */
enum endpoint_create_param {
	ENDPOINT_CREATE_TENANT,
	ENDPOINT_CREATE_ID,
	ENDPOINT_CREATE_URL,
	ENDPOINT_CREATE_FILTER,   /* text[] literal, or NULL: every type */
	ENDPOINT_CREATE_ORDERING, /* 'workflow' or 'none' */
	ENDPOINT_CREATE_DISABLED, /* boolean */
	ENDPOINT_CREATE_METADATA, /* canonical JSON object */
	ENDPOINT_CREATE_SECRET,   /* "whsec_<base64>" */
	ENDPOINT_CREATE_ACTOR,    /* "token:<id>" */
	ENDPOINT_CREATE__N
};

/* Q_ENDPOINT_GET, Q_ENDPOINT_DELETE, Q_ENDPOINT_SECRET */
enum endpoint_get_param { ENDPOINT_GET_TENANT, ENDPOINT_GET_ID, ENDPOINT_GET__N };

/* Q_ENDPOINT_LIST: pages as Q_WF_EVENTS's. */
enum endpoint_list_param {
	ENDPOINT_LIST_TENANT,
	ENDPOINT_LIST_AFTER, /* the last id of the previous page, or NULL */
	ENDPOINT_LIST_LIMIT,
	ENDPOINT_LIST_BUDGET,
	ENDPOINT_LIST__N
};

/* Q_ENDPOINT_UPDATE: NULL leaves a field as it is. */
enum endpoint_update_param {
	ENDPOINT_UPDATE_TENANT,
	ENDPOINT_UPDATE_ID,
	ENDPOINT_UPDATE_URL,        /* or NULL */
	ENDPOINT_UPDATE_FILTER_SET, /* boolean: set filter_types to ENDPOINT_UPDATE_FILTER */
	ENDPOINT_UPDATE_FILTER,     /* text[] literal, or NULL: every type */
	ENDPOINT_UPDATE_ORDERING,   /* or NULL */
	ENDPOINT_UPDATE_DISABLED,   /* boolean, or NULL */
	ENDPOINT_UPDATE_METADATA,   /* canonical JSON object, or NULL */
	ENDPOINT_UPDATE_ACTOR,
	ENDPOINT_UPDATE__N
};

/* Q_ENDPOINT_ROTATE */
enum endpoint_rotate_param {
	ENDPOINT_ROTATE_TENANT,
	ENDPOINT_ROTATE_ID,
	ENDPOINT_ROTATE_SECRET, /* the new one */
	ENDPOINT_ROTATE_GRACE,  /* interval: how long the old one still signs */
	ENDPOINT_ROTATE_ACTOR,
	ENDPOINT_ROTATE__N
};

/* Q_ENDPOINT_REVOKE */
enum endpoint_revoke_param {
	ENDPOINT_REVOKE_TENANT,
	ENDPOINT_REVOKE_ID,
	ENDPOINT_REVOKE_ACTOR,
	ENDPOINT_REVOKE__N
};

/* Q_EVENTS_FEED: the tenant's events after outbox id EVENTS_FEED_AFTER,
 * reading at most EVENTS_FEED_SCAN outbox rows of every tenant; pages as
 * Q_WF_EVENTS. */
enum events_feed_param {
	EVENTS_FEED_TENANT,
	EVENTS_FEED_AFTER,
	EVENTS_FEED_LIMIT,
	EVENTS_FEED_BUDGET,
	EVENTS_FEED_SCAN,
	EVENTS_FEED__N
};

/* Q_EVENT_DELIVERIES: pages as Q_WF_EVENTS. */
enum event_deliveries_param {
	EVENT_DELIVERIES_TENANT,
	EVENT_DELIVERIES_EVENT,
	EVENT_DELIVERIES_AFTER, /* an endpoint id, or NULL */
	EVENT_DELIVERIES_LIMIT,
	EVENT_DELIVERIES_BUDGET,
	EVENT_DELIVERIES__N
};

/* Q_ENDPOINT_ATTEMPTS: pages as Q_WF_EVENTS. */
enum endpoint_attempts_param {
	ENDPOINT_ATTEMPTS_TENANT,
	ENDPOINT_ATTEMPTS_ENDPOINT,
	ENDPOINT_ATTEMPTS_BEFORE,  /* an attempt id, or NULL */
	ENDPOINT_ATTEMPTS_OUTCOME, /* 'succeeded', 'failed' or NULL */
	ENDPOINT_ATTEMPTS_STATUS,  /* an HTTP status, or NULL */
	ENDPOINT_ATTEMPTS_LIMIT,
	ENDPOINT_ATTEMPTS_BUDGET,
	ENDPOINT_ATTEMPTS__N
};

/* Q_ENDPOINT_UNDELIVERED: pages as Q_WF_EVENTS. */
enum endpoint_undelivered_param {
	ENDPOINT_UNDELIVERED_TENANT,
	ENDPOINT_UNDELIVERED_ENDPOINT,
	ENDPOINT_UNDELIVERED_AFTER_STREAM, /* the cursor's stream uuid, or NULL */
	ENDPOINT_UNDELIVERED_AFTER_SEQ,    /* and its seq */
	ENDPOINT_UNDELIVERED_STATES,       /* text[] of pending, dead, skipped */
	ENDPOINT_UNDELIVERED_LIMIT,
	ENDPOINT_UNDELIVERED_BUDGET,
	ENDPOINT_UNDELIVERED__N
};

/* Q_ENDPOINT_RECOVER */
enum endpoint_recover_param {
	ENDPOINT_RECOVER_TENANT,
	ENDPOINT_RECOVER_ENDPOINT,
	ENDPOINT_RECOVER_SINCE, /* timestamptz */
	ENDPOINT_RECOVER_UNTIL, /* timestamptz, or NULL for now */
	ENDPOINT_RECOVER_TYPES, /* text[], or NULL for every type */
	ENDPOINT_RECOVER_STATES,
	ENDPOINT_RECOVER__N
};

/* Q_EVENT_RESEND */
enum event_resend_param {
	EVENT_RESEND_TENANT,
	EVENT_RESEND_EVENT,
	EVENT_RESEND_ENDPOINT,
	EVENT_RESEND__N
};

/* Q_METRICS_DELIVERIES */
enum metrics_deliveries_param { METRICS_DELIVERIES_TOP, METRICS_DELIVERIES__N };

/*
 * The key row: what Q_AUTH_KEY, Q_CREATE_KEYED and Q_KEY_GET return for a
 * key, read by name by every reader (cmd.c, wf.c, auth.c, rcache.c).
 * Column 0 differs: the tenant (Q_AUTH_KEY, as Q_AUTH's, and
 * Q_CREATE_KEYED) or 'existing' (Q_KEY_GET). The next five are the same in
 * all three; Q_AUTH_KEY and Q_CREATE_KEYED have the last three, and
 * Q_CREATE_KEYED its outcome after them.
 */
enum key_col {
	KEY_COL_TENANT = 0,
	KEY_COL_FP,                        /* the fingerprint of the request that made the key */
	KEY_COL_STATUS,                    /* of the stored answer; 0 while still being written */
	KEY_COL_HEADERS,                   /* of the stored answer */
	KEY_COL_BODY,                      /* of the stored answer, bytes */
	KEY_COL_EXPIRED,                   /* "t" or "f" */
	KEY_COL_SHARED,                    /* the columns every key row has */
	KEY_COL_BYTES_FP = KEY_COL_SHARED, /* of the request's bytes, or NULL */
	KEY_COL_MS_LEFT,                   /* whole milliseconds until the key expires */
	KEY_COL_TOKEN,                     /* the asking token's id (not the key's actor) */
	KEY_COL__N,                        /* Q_AUTH_KEY's columns */
	CREATE_COL_OUTCOME = KEY_COL__N,   /* Q_CREATE_KEYED's last */
};

extern const struct db_stmt queries[Q__COUNT];

/*
 * The statements a worker prepares for the configuration's routing:
 * "direct" (one database: the table above) or "proxy" (a PL/Proxy proxy
 * in front of partitions, doc/distribution.md: the routed statements as
 * calls of the proxy's functions, the others refused there). NULL for any
 * other value. The proxy table is built on the first call and lives for
 * the process.
 */
const struct db_stmt *queries_for(const char *routing);

/* db_stmt_check() over the whole table: 0, or -1 with e naming the first
 * statement whose count and SQL differ, in either routing's table. idemflow-fcgi runs it before it
 * starts anything. */
int queries_check(struct err *e) MUSTCHECK;

/* Q_SCHEMA_VERSION's columns through a proxy: each partition's state, a
 * JSON array of {"partition", "reachable", "schema_version"}; the
 * partitions that did not answer, "0,3", or "" when all did; how many
 * answered. */
enum { SCHEMA_COL_PARTITIONS = 3, SCHEMA_COL_UNREACHABLE = 4, SCHEMA_COL_REACHABLE = 5 };

/* Through a proxy, Q_METRICS_OUTBOX's row and Q_METRICS_DELIVERIES's first
 * row end with how many partitions the proxy names and the numbers of
 * those that did not answer, "0,3", or "" when all did; the sums are of
 * the partitions that answered. */
enum { METRICS_COL_PARTITIONS = 7, METRICS_COL_UNREACHABLE = 8 };
enum { METRICS_DELIVERIES_COL_PARTITIONS = 5, METRICS_DELIVERIES_COL_UNREACHABLE = 6 };

/* Q_AUTH's second column: the token's id (KEY_COL_TOKEN in a key row). */
enum { AUTH_COL_TOKEN = 1 };

/* Q_TRACE_SET */
enum trace_set_param {
	TRACE_SET_TRACEPARENT,
	TRACE_SET_TRACESTATE, /* or NULL */
	TRACE_SET_ACTOR,      /* "token:<id>", or NULL */
	TRACE_SET__N
};

#endif
