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
	 * transaction_read_only), for GET /readyz */
	Q_SCHEMA_VERSION,
	/* GET /metrics, one cheap statement per scrape -> (pending events,
	 * age in seconds of the oldest pending one or 0, dead events,
	 * workflows in incident) */
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
	Q__COUNT
};

/*
 * The parameters of each statement, in $n order ($1 is the first name):
 * a caller fills its array by name, const char *p[CK__N] = {[CK_TENANT] =
 * ...}, and passes the count, which db_run() checks against the table.
 * The table's count is each enum's __N, which db_stmt_check() checks
 * against the SQL when the statements are prepared. Text format; "bytea
 * hex" is '\x' and hex digits, "interval" any text PostgreSQL reads as one.
 */

/* Q_AUTH */
enum auth_param { AU_TOKEN_HASH /* bytea hex */, AU__N };

/* Q_AUTH_KEY */
enum auth_key_param { AK_TOKEN_HASH /* bytea hex */, AK_KEY, AK__N };

/* Q_CREATE_KEYED, Q_CREATE_KEYED_FAIL */
enum create_keyed_param {
	CK_TOKEN_HASH, /* bytea hex, as Q_AUTH_KEY's */
	CK_KEY,
	CK_METHOD,
	CK_PATH,
	CK_FP,         /* the request's fingerprint, bytea hex */
	CK_HEADERS,    /* stored with the answer */
	CK_BODY,       /* stored with the answer */
	CK_CREATED_AT, /* the workflow's, as the answer shows it */
	CK_TTL,        /* the key's (interval); the tenant's idempotency_ttl wins */
	CK_ID,         /* the workflow's */
	CK_TYPE,
	CK_INPUT, /* canonical JSON */
	CK_EVENT_ID,
	CK_PAYLOAD_HEAD, /* the workflow.created event's, up to its tenant id */
	CK_BYTES_FP,     /* the fingerprint of the request's bytes, bytea hex */
	CK_PAYLOAD_TAIL, /* the event's payload after its tenant id */
	CK_TRACEPARENT,  /* of the workflow and its event, or NULL */
	CK_TRACESTATE,   /* or NULL */
	CK__N
};

/* Q_CREATE_UNKEYED */
enum create_unkeyed_param {
	CU_TENANT,
	CU_CREATED_AT,
	CU_ID,
	CU_TYPE,
	CU_INPUT,
	CU_EVENT_ID,
	CU_PAYLOAD,
	CU__N
};

/* Q_KEY_GET, Q_KEY_DELETE_EXPIRED */
enum key_param { KG_TENANT, KG_KEY, KG__N };

/* Q_KEY_REFRESH: the server's TTL (an interval) unless the tenant has one */
enum key_refresh_param { KR_TENANT, KR_KEY, KR_TTL, KR__N };

/* Q_WF_GET */
enum wf_get_param { WG_TENANT, WG_ID, WG__N };

/* Q_KEYSTATS_FLUSH */
enum keystats_param {
	KF_TENANTS,   /* bigint[] */
	KF_KEYS,      /* text[] */
	KF_REPLAYS,   /* int[] */
	KF_CONFLICTS, /* int[] */
	KF_IN_FLIGHT, /* int[], in-flight refusals */
	KF__N
};

/* Q_KEY_CLAIM */
enum key_claim_param {
	KC_TENANT,
	KC_KEY,
	KC_METHOD,
	KC_PATH,
	KC_FP,       /* the request's fingerprint, bytea hex */
	KC_TTL,      /* interval; the tenant's idempotency_ttl wins */
	KC_BYTES_FP, /* the fingerprint of the request's bytes, bytea hex */
	KC_ACTOR,    /* "token:<id>" (sql/014_actor.sql) */
	KC__N
};

/* Q_KEY_STORE */
enum key_store_param { KS_TENANT, KS_KEY, KS_STATUS, KS_HEADERS, KS_BODY, KS__N };

/* Q_WF_CREATE_RUN */
enum wf_create_run_param {
	CR_TENANT,
	CR_ID,
	CR_TYPE,
	CR_INPUT,
	CR_CREATED_AT,
	CR_STEPS,        /* canonical JSON array, "[]" for none */
	CR_BUSINESS_KEY, /* or NULL */
	CR_PAYLOAD,      /* the workflow.created event's */
	CR__N
};

/* Q_WF_TRANSITION */
enum wf_transition_param { TR_TENANT, TR_ID, TR_TO, TR_FROM /* or NULL */, TR__N };

/* Q_WF_MESSAGE */
enum wf_message_param { MS_TENANT, MS_ID, MS_MESSAGE_ID, MS_NAME, MS_PAYLOAD, MS__N };

/* Q_MESSAGE_PUBLISH */
enum message_publish_param {
	MP_TENANT,
	MP_MESSAGE_ID,
	MP_NAME,
	MP_BUSINESS_KEY,
	MP_TTL, /* an ISO 8601 duration, checked (messages.c) */
	MP_PAYLOAD,
	MP_TTL_MAX, /* ms: message_ttl_max */
	MP__N
};

/* Q_JOBS_ACTIVATE */
enum jobs_activate_param {
	JA_TENANT,
	JA_JOB_TYPE,
	JA_WORKER,
	JA_MAX_JOBS,
	JA_LEASE,  /* interval */
	JA_BUDGET, /* bytes: max_answer */
	JA__N
};

/* Q_JOB_COMPLETE */
enum job_complete_param { JC_TENANT, JC_WORKFLOW, JC_STEP, JC_WORKER, JC_OUTPUT, JC__N };

/* Q_JOB_FAIL */
enum job_fail_param {
	JF_TENANT,
	JF_WORKFLOW,
	JF_STEP,
	JF_WORKER,
	JF_ERROR,       /* or NULL */
	JF_RETRY_AFTER, /* interval */
	JF__N
};

/* Q_WF_EVENTS: events after seq WE_AFTER, at most WE_LIMIT, stopping
 * after the first one past WE_BUDGET bytes (page.c, page_answer). */
enum wf_events_param { WE_TENANT, WE_ID, WE_AFTER, WE_LIMIT, WE_BUDGET, WE__N };

/* Q_WF_LIST: filters are NULL when not asked for; pages as Q_WF_EVENTS. */
enum wf_list_param {
	WL_TENANT,
	WL_STATE, /* or NULL */
	WL_TYPE,  /* or NULL */
	WL_AFTER, /* the last id of the previous page, or NULL */
	WL_LIMIT,
	WL_BUDGET,
	WL__N
};

/* Q_JOB_HEARTBEAT */
enum job_heartbeat_param {
	JH_TENANT,
	JH_WORKFLOW,
	JH_STEP,
	JH_WORKER,
	JH_LEASE,    /* interval */
	JH_PROGRESS, /* canonical JSON, or NULL to keep the last one */
	JH__N
};

/* Q_WF_RESUME */
enum wf_resume_param { RS_TENANT, RS_ID, RS_RETRIES /* or NULL: the step's own */, RS__N };

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

/* db_stmt_check() over the whole table: 0, or -1 with e naming the first
 * statement whose count and SQL differ. idemflow-fcgi runs it before it
 * starts anything. */
int queries_check(struct err *e) MUSTCHECK;

/* Q_AUTH's second column: the token's id (KEY_COL_TOKEN in a key row). */
enum { AUTH_COL_TOKEN = 1 };

/* Q_TRACE_SET */
enum trace_set_param {
	TS_TRACEPARENT,
	TS_TRACESTATE, /* or NULL */
	TS_ACTOR,      /* "token:<id>", or NULL */
	TS__N
};

#endif
