/*
 * inbox.h - the consumer's half of effectively-once: deduplicate
 * deliveries on their stable id.
 *
 * The dispatcher delivers every event at least once, so a consumer sees
 * some twice (after a crash, a timeout, a lost acknowledgement). The inbox
 * pattern makes the second one harmless: in the same transaction as the
 * handler's effect, record (handler, message_id); a redelivered message
 * finds its row and its effect is skipped. Usage, against the consumer's
 * own PostgreSQL database:
 *
 *   BEGIN;
 *   switch (inbox_claim(conn, "billing", message_id, &e)) {
 *   case 1:  apply the effect with the same connection; COMMIT; break;
 *   case 0:  duplicate: COMMIT (it counts the drop) and acknowledge; break;
 *   default: ROLLBACK and answer "try again" (5xx, nack); break;
 *   }
 *
 * A consumer that crashes before COMMIT leaves neither the row nor the
 * effect, so the redelivery applies it then. Concurrent deliveries of one
 * message wait on the primary key; the loser sees a duplicate.
 */
#ifndef IDF_INBOX_H
#define IDF_INBOX_H

#include <libpq-fe.h>

#include "core/err.h"

/* Create the inbox tables if they are missing (idempotent). */
int inbox_setup(PGconn *conn, struct err *e) MUSTCHECK;

/*
 * Inside the caller's open transaction: claim message_id for handler.
 * Returns 1 when this is the first delivery (apply the effect now), 0 for
 * a duplicate (skip it; counted in the handler's duplicates), -1 on error
 * (e filled; roll back).
 */
int inbox_claim(PGconn *conn, const char *handler, const char *message_id, struct err *e) MUSTCHECK;

/* How many duplicates the handler has dropped, or -1 with e filled. */
long inbox_duplicates(PGconn *conn, const char *handler, struct err *e);

#endif
