/*
 * canon.h - parsing request JSON with limits, and its canonical form.
 *
 * The canonical form is what makes `{"a":1,"b":2}` and `{ "b": 2, "a": 1 }`
 * the same request. It is close to RFC 8785 (JCS) but not it (key order by
 * UTF-8 bytes, not UTF-16 units; exact 64-bit integers; C's exponent form;
 * kept so that stored keys' fingerprints stay valid, see the README):
 *  - no insignificant whitespace;
 *  - object members sorted by key, byte-wise on UTF-8 (= code point order);
 *  - strings escaped minimally: \" \\ \b \f \n \r \t, other controls as \u00xx,
 *    everything else literal UTF-8;
 *  - integers that fit 64 bits written in decimal; other numbers written as
 *    the shortest text that reads back as the same IEEE 754 double, integral
 *    doubles below 1e21 without a fraction or exponent.
 * Numbers: an integer from -2^63 to 2^64-1 is exact; anything else (a
 * fraction, an exponent, or an integer beyond 64 bits) is a double, rounded
 * to the nearest one, so two texts that round alike are one request; a
 * number beyond the range of a double (1e400) is refused.
 * Where JSON allows a choice this code fixes one:
 *  - duplicate object keys: the last one wins (json-c's rule), in the parsed
 *    value and therefore in the fingerprint and in what is stored;
 *  - U+0000 in a string or a key is rejected: PostgreSQL cannot store it;
 *    so are lone UTF-16 surrogates (\ud800), which have no UTF-8 form.
 */
#ifndef IDF_CANON_H
#define IDF_CANON_H

#include <json-c/json.h>
#include <stddef.h>

#include "core/buf.h"
#include "core/err.h"

/*
 * Parse len bytes of JSON text, strictly: valid UTF-8, nothing but
 * whitespace after the value, nesting at most max_depth. Returns a new
 * json_object (caller releases with json_object_put) or NULL with e filled
 * (ERR_INPUT, message fit for a client). Note a JSON `null` document also
 * yields NULL: callers that need an object treat both the same.
 */
struct json_object *canon_parse(const char *text, size_t len, int max_depth,
                                struct err *e) MUSTCHECK;

/* Append the canonical form of v to out. Returns 0, or -1 with e filled when
 * v holds something that has no canonical form (U+0000 in a string, a
 * number too large for a double). */
int canon_write(struct buf *out, struct json_object *v, struct err *e) MUSTCHECK;

/* The nesting canon_recanon() accepts: as deep as the deepest request
 * (the configuration's max_depth is at most 1000). */
#define CANON_STORED_DEPTH 1000

/*
 * Append the canonical form of len bytes of JSON text that the program
 * stored itself (jsonb prints in its own style: spaces, its own key
 * order), parsed as canon_parse() with CANON_STORED_DEPTH. Returns 0, or
 * -1 with e filled; out may then hold part of a value.
 */
int canon_recanon(struct buf *out, const char *text, size_t len, struct err *e) MUSTCHECK;

/* Append s (n bytes, valid UTF-8) as a JSON string literal with quotes. */
void canon_write_string(struct buf *out, const char *s, size_t n);

#endif
