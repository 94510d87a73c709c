/*
 * idemflow/inbox.h - libidemflow-inbox: the consumer's half of
 * effectively-once, deduplicating idemflow's deliveries on their event id.
 *
 * idemflow's dispatcher delivers every event at least once, with an id
 * that stays the same across retries, so a consumer sees some events
 * twice (after a crash, a timeout, a lost acknowledgement). The inbox makes
 * the second one harmless: in the same transaction as the effect, claim
 * (consumer, event id); a redelivery finds the claim and skips its effect.
 * The inbox lives in the consumer's own PostgreSQL database; its SQL is
 * /usr/share/idemflow/consumer/inbox.sql, which this library carries and
 * calls, so a consumer in C and one in any other language share one inbox.
 *
 *   idemflow_inbox_setup(conn, &err);            once, outside a transaction
 *   BEGIN;
 *   switch (idemflow_inbox_claim(conn, "billing", event_id, &err)) {
 *   case 1:  apply the effect on conn; COMMIT; acknowledge; break;
 *   case 0:  a duplicate: COMMIT (which counts it); acknowledge; break;
 *   default: ROLLBACK; answer "try again" (5xx, nack); break;
 *   }
 *
 * Build with `pkg-config --cflags --libs idemflow-inbox`. libidemflow-inbox(3)
 * has the details. The functions use only the connection they are given
 * (no global state): one connection per thread, as libpq requires.
 */
#ifndef IDEMFLOW_INBOX_H
#define IDEMFLOW_INBOX_H

#include <stddef.h>

#include <libpq-fe.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define IDEMFLOW_INBOX_MUSTCHECK __attribute__((warn_unused_result))
#else
#define IDEMFLOW_INBOX_MUSTCHECK
#endif

/*
 * What went wrong, filled by a function that fails. sqlstate is the
 * server's SQLSTATE ("40001" serialization failure, "40P01" deadlock:
 * retry the transaction) or "" when the error is not the server's (a lost
 * connection, a misuse); msg is one line for a log. Every function takes
 * NULL when the caller does not want the detail.
 */
struct idemflow_inbox_err {
	char sqlstate[6];
	char msg[256];
};

/*
 * Create the inbox's tables and functions in conn's database (in the first
 * schema of its search_path) if they are missing, or bring the functions
 * up to this library's version: inbox.sql, in its own transaction.
 * Idempotent; concurrent calls queue. Call it outside a transaction (it
 * commits). Returns 0, or -1 with err filled.
 */
int idemflow_inbox_setup(PGconn *conn, struct idemflow_inbox_err *err) IDEMFLOW_INBOX_MUSTCHECK;

/*
 * Inside the caller's open transaction: claim event_id for consumer (both
 * non-empty text). Returns 1 for the first delivery (apply the effect in
 * the same transaction), 0 for a duplicate of a claim already committed
 * (skip the effect; counted in consumer's duplicates when the transaction
 * commits), -1 on error (err filled; roll back). A claim of the same event
 * held by a transaction still open waits until that one ends. Outside a
 * transaction it refuses (-1): a claim must commit with its effect.
 */
int idemflow_inbox_claim(PGconn *conn, const char *consumer, const char *event_id,
                         struct idemflow_inbox_err *err) IDEMFLOW_INBOX_MUSTCHECK;

/* The duplicates consumer has dropped (committed), or -1 with err filled. */
long long idemflow_inbox_duplicates(PGconn *conn, const char *consumer,
                                    struct idemflow_inbox_err *err);

/*
 * Every consumer's duplicates as Prometheus text (exposition format 0.0.4):
 *
 *   # HELP idemflow_inbox_duplicates_total Deliveries the inbox dropped ...
 *   # TYPE idemflow_inbox_duplicates_total counter
 *   idemflow_inbox_duplicates_total{consumer="billing"} 3
 *
 * Returns a NUL-terminated string the caller frees with free(), or NULL
 * with err filled.
 */
char *idemflow_inbox_metrics(PGconn *conn, struct idemflow_inbox_err *err);

/*
 * The same text written to path for node_exporter's textfile collector:
 * to path.tmp first, then renamed, so a scrape never reads half a file.
 * Returns 0, or -1 with err filled (and path left as it was).
 */
int idemflow_inbox_write_textfile(PGconn *conn, const char *path,
                                  struct idemflow_inbox_err *err) IDEMFLOW_INBOX_MUSTCHECK;

#ifdef __cplusplus
}
#endif

#endif
