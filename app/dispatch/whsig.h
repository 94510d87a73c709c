/*
 * whsig.h - Standard Webhooks signatures (https://www.standardwebhooks.com).
 *
 * A delivery carries webhook-id, webhook-timestamp (unix seconds) and
 * webhook-signature: "v1,<base64 HMAC-SHA256>" of the signed content
 * "<webhook-id>.<webhook-timestamp>.<body>". The receiver recomputes it with
 * the shared secret, so it knows the body came from us, unaltered, and (with
 * the timestamp) recently.
 *
 * Secrets: "whsec_<base64>" means the key is the decoded bytes (the form the
 * specification's libraries generate); any other string is used as raw key
 * bytes. The reference libraries also base64-decode an unprefixed secret, so
 * a receiver that verifies with one of them should be given the whsec_ form.
 * A key is at least WHSIG_KEY_MIN bytes: the specification asks for 24 to
 * 64 random bytes, and a shorter one is likely a word someone typed.
 *
 * Rotation: while a secret is replaced, the sender signs with the new and
 * the previous one at once, "v1,<new> v1,<previous>" in one header, and a
 * receiver holding either secret accepts (doc/security.md).
 */
#ifndef IDF_WHSIG_H
#define IDF_WHSIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#define WHSIG_KEY_MAX 256 /* longest key, decoded or raw */
#define WHSIG_KEY_MIN 24  /* shortest key, decoded or raw */
#define WHSIG_MAX     48  /* "v1," + base64 of 32 bytes (44) + NUL */
/* Two entries and the space between them: a header signed during a rotation. */
#define WHSIG_HEADER_MAX  (2 * WHSIG_MAX)
#define WHSIG_TOLERANCE_S 300 /* the specification's suggested freshness window */

/*
 * Turn a configured secret into key bytes: key must hold WHSIG_KEY_MAX.
 * ERR_CONFIG (naming "secret", never quoting it) for an empty secret, bad
 * base64 after "whsec_", a key shorter than WHSIG_KEY_MIN or longer than
 * WHSIG_KEY_MAX.
 */
int whsig_key(const char *secret, uint8_t *key, size_t *keylen, struct err *e) MUSTCHECK;

/* The same, the messages naming the configuration key name (borrowed)
 * instead of "secret": "secret_previous: ...". */
int whsig_key_named(const char *name, const char *secret, uint8_t *key, size_t *keylen,
                    struct err *e) MUSTCHECK;

/*
 * out = "v1,<base64>" for the event id, timestamp ts (unix seconds, signed
 * as its decimal text) and the body's len bytes. Fails (ERR_INTERNAL) only
 * when memory or libcrypto fail.
 */
int whsig_sign(const uint8_t *key, size_t keylen, const char *id, long ts, const char *body,
               size_t len, char out[WHSIG_MAX], struct err *e) MUSTCHECK;

/*
 * out = the webhook-signature header's value: whsig_sign() with key, then,
 * when key2 is not NULL (a rotation's previous secret), a space and the
 * entry of key2. Fails as whsig_sign() does.
 */
int whsig_sign_header(const uint8_t *key, size_t keylen, const uint8_t *key2, size_t key2len,
                      const char *id, long ts, const char *body, size_t len,
                      char out[WHSIG_HEADER_MAX], struct err *e) MUSTCHECK;

/*
 * For receivers (and the tests): 0 when header, a space-separated list of
 * "<version>,<signature>" entries, holds a v1 entry matching id, the
 * timestamp text ts exactly as received, and the body; and ts is within
 * tolerance_s seconds of now (tolerance_s < 0 skips that check). Otherwise
 * -1 with ERR_INPUT saying which check failed.
 */
int whsig_verify(const uint8_t *key, size_t keylen, const char *id, const char *ts,
                 const char *body, size_t len, const char *header, long now, long tolerance_s,
                 struct err *e) MUSTCHECK;

#endif
