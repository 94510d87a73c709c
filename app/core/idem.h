/*
 * idem.h - Idempotency-Key rules: syntax, and what a stored key row means
 * for a new request that carries the same key.
 *
 * The claim itself is a statement (queries.h, Q_CREATE_KEYED): PostgreSQL's
 * unique index decides who owns a key, and a waiter blocks on it until the
 * owner commits or lock_timeout (idempotency_wait) expires.
 */
#ifndef IDF_IDEM_H
#define IDF_IDEM_H

#include <stdint.h>

#include "core/fp.h"

/* What happened to a keyed request; also the log field idem=... */
enum idem_outcome {
	IDEM_NONE,      /* no key (optional mode), or the request never got that far */
	IDEM_CREATED,   /* this request owned the key and its response is stored */
	IDEM_REPLAYED,  /* same key, same request: the stored response was sent */
	IDEM_CONFLICT,  /* same key, different request: 409 */
	IDEM_IN_FLIGHT, /* same key, the owner still running after the wait: 409 */
};

#define IDEM_KEY_MAX 255

/* 1 when key is 1..255 printable ASCII characters, no space (0x21..0x7e). */
int idem_key_valid(const char *key);

/*
 * The key an Idempotency-Key header value names. The IETF draft makes the
 * header an RFC 8941 sf-string, "abc": the key is what is inside the
 * quotes, \" and \\ the only escapes, every character printable ASCII
 * (0x20..0x7e), nothing after the closing quote (a ;parameter is refused:
 * the draft defines none). A value that does not start with a quote is
 * the bare form idemflow accepted before, kept for existing clients: the
 * key is the value as it is. Either way the key then has to pass
 * idem_key_valid(), so "abc" and abc are the same key.
 *
 * Writes the key, NUL-terminated, to out (IDEM_KEY_MAX + 1 bytes) and
 * returns 0; returns -1, out holding "", when the quoting is malformed or
 * the key is longer than IDEM_KEY_MAX.
 */
int idem_key_parse(const char *value, char out[IDEM_KEY_MAX + 1]);

/* Text form of a fingerprint as PostgreSQL prints bytea: "\x" + 64 hex
 * digits. out has IDEM_FP_TEXT bytes. */
#define IDEM_FP_TEXT (2 + 2 * FP_LEN + 1)
void idem_fp_text(char out[IDEM_FP_TEXT], const uint8_t fp[FP_LEN]);

/* Compare a stored row's fingerprint (bytea text from PostgreSQL) with this
 * request's: IDEM_REPLAYED when equal, IDEM_CONFLICT otherwise. */
enum idem_outcome idem_compare(const char *stored_fp_text, const char fp_text[IDEM_FP_TEXT]);

/* "created", "replayed", ... for logs. */
const char *idem_outcome_name(enum idem_outcome o);

#endif
