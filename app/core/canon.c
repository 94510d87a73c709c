/* canon.c - strict JSON parsing and the canonical form (see canon.h). */
#include "core/canon.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"

/* The largest magnitudes json-c reads exactly, as digits: int64_t below
 * zero, uint64_t above. */
static const char int_min_digits[] = "9223372036854775808";
static const char int_max_digits[] = "18446744073709551615";

/* 1 when the integer of n digits (no sign, no leading zero) is beyond the
 * limit of its sign. */
static int int_out_of_range(const char *digits, size_t n, int negative)
{
	const char *lim = negative ? int_min_digits : int_max_digits;
	size_t ln = negative ? sizeof(int_min_digits) - 1 : sizeof(int_max_digits) - 1;

	return n > ln || (n == ln && memcmp(digits, lim, n) > 0);
}

/* The code unit of the \uXXXX escape at s (6 bytes available), or -1. */
static long escape_unit(const char *s)
{
	long v = 0;

	if (s[0] != '\\' || s[1] != 'u')
		return -1;
	for (int k = 2; k < 6; k++) {
		int d = utf8_hex_digit(s[k]);
		if (d < 0)
			return -1;
		v = v * 16 + d;
	}
	return v;
}

/*
 * The \u escape at s (left bytes, at byte offset at of the body): returns
 * its length, 6, or 12 for a surrogate pair, or 0 with e filled.
 *  - \u0000: PostgreSQL cannot store it, and json-c cuts an object key at
 *    it, silently: {"a\u0000b":1} was stored as {"a":1}.
 *  - A lone surrogate: json-c replaces it with U+FFFD, so "\ud800" and
 *    "\ufffd" were one request. RFC 8785 requires I-JSON (RFC 7493), which
 *    has no such strings.
 */
static size_t escape_check(const char *s, size_t left, size_t at, struct err *e)
{
	long u = left >= 6 ? escape_unit(s) : -1, low;

	if (u < 0) {
		err_set(e, ERR_INPUT, "the body is not valid JSON: bad escape at byte %zu", at);
		return 0;
	}
	if (u == 0) {
		err_set(e, ERR_INPUT, "strings may not contain U+0000 (byte %zu)", at);
		return 0;
	}
	if (u < 0xd800 || u > 0xdfff)
		return 6;
	low = u <= 0xdbff && left >= 12 ? escape_unit(s + 6) : -1;
	if (low >= 0xdc00 && low <= 0xdfff)
		return 12;
	err_set(e, ERR_INPUT,
	        "the body is not valid JSON: unpaired UTF-16 surrogate \\u%04lx at byte %zu", u,
	        at);
	return 0;
}

/*
 * What json-c lets through but JSON or this service does not, found in one
 * pass over text that json-c has already accepted, so the grammar is known
 * to be right. Returns how many integers are beyond 64 bits (see below),
 * or -1 with e filled (ERR_INPUT, the byte offset of the first offence).
 *  - A single quote outside a string: json-c takes 'a' as a key even in
 *    strict mode.
 *  - Bytes that are not UTF-8 (utf8_len).
 *  - A control character inside a string that is not escaped.
 *  - \u0000 and lone surrogates (escape_check).
 *  - NaN and Infinity, which json-c reads even in strict mode, and a
 *    leading zero after a minus sign (-01), which it reads as -1.
 * Integers outside -2^63 .. 2^64-1 are not errors, but json-c saturates
 * them to the bound: a 30-digit number became 18446744073709551615, and two
 * different numbers one request. They are doubles instead, as every number
 * is in RFC 8785: when wide is not NULL, the text is copied into it with
 * ".0" after each of them, for json-c to read again.
 */
static int lex_check(const char *text, size_t len, struct buf *wide, struct err *e)
{
	int in_string = 0, nwide = 0;
	size_t copied = 0; /* text before this offset is in wide */

	for (size_t i = 0; i < len; i++) {
		char c = text[i];
		if (in_string) {
			size_t n;
			if (c == '\\' && i + 1 < len && text[i + 1] == 'u') {
				n = escape_check(text + i, len - i, i, e);
				if (n == 0)
					return -1;
				i += n - 1;
			} else if (c == '\\')
				i++;
			else if ((unsigned char)c < 0x20)
				return err_set(
				    e, ERR_INPUT,
				    "the body is not valid JSON: control character U+%04X "
				    "at byte %zu must be escaped",
				    (unsigned)c, i);
			else if (c == '"')
				in_string = 0;
			else if ((unsigned char)c >= 0x80) {
				n = utf8_len((const unsigned char *)text + i, len - i);
				if (n == 0)
					return err_set(
					    e, ERR_INPUT,
					    "the body is not valid JSON: invalid UTF-8 at byte "
					    "%zu",
					    i);
				i += n - 1;
			}
		} else if ((unsigned char)c >= 0x80) {
			return err_set(e, ERR_INPUT,
			               "the body is not valid JSON: invalid UTF-8 at byte %zu", i);
		} else if (c == '"') {
			in_string = 1;
		} else if (c == '\'') {
			return err_set(e, ERR_INPUT,
			               "the body is not valid JSON: single quote at byte %zu", i);
		} else if (c == 'N' || c == 'I' ||
		           ((c == '-' || c == '+') && i + 1 < len &&
		            (text[i + 1] == 'N' || text[i + 1] == 'I'))) {
			return err_set(e, ERR_INPUT,
			               "the body is not valid JSON: NaN or Infinity at byte %zu",
			               i);
		} else if (c == '-' || (c >= '0' && c <= '9')) {
			size_t d = i + (c == '-'), end = d;
			if (d + 1 < len && text[d] == '0' && text[d + 1] >= '0' &&
			    text[d + 1] <= '9')
				return err_set(
				    e, ERR_INPUT,
				    "the body is not valid JSON: leading zero at byte %zu", d);
			while (end < len && text[end] >= '0' && text[end] <= '9')
				end++;
			i = end;
			if (i < len && (text[i] == '.' || text[i] == 'e' || text[i] == 'E')) {
				/* Already a double: skip the rest of it. */
				while (i < len && text[i] != '\0' &&
				       strchr("0123456789.eE+-", text[i]) != NULL)
					i++;
			} else if (int_out_of_range(text + d, end - d, c == '-')) {
				nwide++;
				if (wide != NULL) {
					buf_append(wide, text + copied, end - copied);
					buf_puts(wide, ".0");
					copied = end;
				}
			}
			i--; /* the loop steps onto the byte after the number */
		}
	}
	if (wide != NULL)
		buf_append(wide, text + copied, len - copied);
	return nwide;
}

/* One tokener per process, reset for each body: making one allocates and
 * clears its whole depth stack, for every request. */
static struct json_tokener *tokener(int max_depth)
{
	static struct json_tokener *tok;
	static int depth;

	if (tok != NULL && depth == max_depth) {
		json_tokener_reset(tok);
		return tok;
	}
	if (tok != NULL)
		json_tokener_free(tok);
	tok = json_tokener_new_ex(max_depth);
	depth = tok != NULL ? max_depth : 0;
	return tok;
}

/* json-c's part of canon_parse: the grammar, the depth, UTF-8, and nothing
 * but whitespace after the value. NULL with e filled on failure, and for a
 * JSON null document. */
static struct json_object *parse_json(const char *text, size_t len, int max_depth, struct err *e)
{
	struct json_tokener *tok = tokener(max_depth);
	struct json_object *v = NULL;
	enum json_tokener_error jerr;
	size_t end, consumed = 0;

	if (tok == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	if (len > INT32_MAX) {
		err_set(e, ERR_INPUT, "the body is too large to parse");
		goto out;
	}
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
	v = json_tokener_parse_ex(tok, text, (int)len);
	jerr = json_tokener_get_error(tok);
	if (jerr == json_tokener_continue && len > 0) {
		/* A number at the very end (a bare "1.5" body) waits for a
		 * terminator that may still come: the NUL says none will. */
		v = json_tokener_parse_ex(tok, "", 1);
		jerr = json_tokener_get_error(tok);
		consumed = len; /* the first call took every byte */
	}
	if (jerr == json_tokener_continue) {
		err_set(e, ERR_INPUT, "the body is not valid JSON: unexpected end of input");
		goto fail;
	}
	if (jerr != json_tokener_success) {
		/* After the second call the offset is into the NUL chunk: the
		 * body ended early, at its last byte. */
		err_set(e, ERR_INPUT, "the body is not valid JSON: %s at byte %zu",
		        jerr == json_tokener_error_depth ? "nesting is too deep"
		                                         : json_tokener_error_desc(jerr),
		        consumed ? consumed : json_tokener_get_parse_end(tok));
		goto fail;
	}
	for (end = consumed ? consumed : json_tokener_get_parse_end(tok); end < len; end++) {
		char c = text[end];
		if (c != ' ' && c != '\t' && c != '\r' && c != '\n') {
			err_set(e, ERR_INPUT,
			        "the body is not valid JSON: unexpected data at byte %zu", end);
			goto fail;
		}
	}
	if (v == NULL)
		err_set(e, ERR_INPUT, "the body is JSON null");
	goto out;
fail:
	json_object_put(v);
	v = NULL;
out:
	return v;
}

struct json_object *canon_parse(const char *text, size_t len, int max_depth, struct err *e)
{
	struct json_object *v = parse_json(text, len, max_depth, e);
	struct buf wide = BUF_INIT;
	int nwide;

	if (v == NULL)
		return NULL;
	nwide = lex_check(text, len, NULL, e);
	if (nwide < 0)
		goto fail;
	if (nwide > 0) {
		/* Rare: read it again with those integers as doubles. */
		json_object_put(v);
		lex_check(text, len, &wide, e);
		if (wide.oom) {
			err_set(e, ERR_INTERNAL, "out of memory");
			v = NULL;
			goto out;
		}
		v = parse_json(wide.data, wide.len, max_depth, e);
	}
	goto out;
fail:
	json_object_put(v);
	v = NULL;
out:
	buf_free(&wide);
	return v;
}

void canon_write_string(struct buf *out, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	size_t run = 0; /* start of the pending run of literal bytes */

	buf_putc(out, '"');
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		const char *esc = NULL;
		char u[7];

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		switch (c) {
		case '"': esc = "\\\""; break;
		case '\\': esc = "\\\\"; break;
		case '\b': esc = "\\b"; break;
		case '\f': esc = "\\f"; break;
		case '\n': esc = "\\n"; break;
		case '\r': esc = "\\r"; break;
		case '\t': esc = "\\t"; break;
		default:
			u[0] = '\\';
			u[1] = 'u';
			u[2] = '0';
			u[3] = '0';
			u[4] = hex[c >> 4];
			u[5] = hex[c & 15];
			u[6] = '\0';
			esc = u;
		}
		buf_append(out, s + run, i - run);
		buf_puts(out, esc);
		run = i + 1;
	}
	buf_append(out, s + run, n - run);
	buf_putc(out, '"');
}

static void write_double(struct buf *out, double d)
{
	char tmp[40];

	if (d == 0) { /* also -0, which JCS writes as 0 */
		buf_putc(out, '0');
		return;
	}
	if (d == floor(d) && fabs(d) < 1e21) {
		snprintf(tmp, sizeof(tmp), "%.0f", d);
		buf_puts(out, tmp);
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(tmp, sizeof(tmp), "%.*g", prec, d);
		if (strtod(tmp, NULL) == d)
			break;
	}
	buf_puts(out, tmp);
}

struct member {
	const char *key;
	struct json_object *val;
};

static int member_cmp(const void *a, const void *b)
{
	/* strcmp compares as unsigned char: UTF-8 byte order is code point order. */
	return strcmp(((const struct member *)a)->key, ((const struct member *)b)->key);
}

int canon_write(struct buf *out, struct json_object *v, struct err *e)
{
	switch (json_object_get_type(v)) {
	case json_type_null: buf_puts(out, "null"); return 0;
	case json_type_boolean:
		buf_puts(out, json_object_get_boolean(v) ? "true" : "false");
		return 0;
	case json_type_int: {
		int64_t i = json_object_get_int64(v);
		char digits[24], *p;
		uint64_t u = i == INT64_MAX ? json_object_get_uint64(v)
		             : i < 0        ? 0 - (uint64_t)i
		                            : (uint64_t)i;
		p = buf_utoa(digits + sizeof(digits), u);
		if (i < 0)
			*--p = '-';
		buf_append(out, p, (size_t)(digits + sizeof(digits) - p));
		return 0;
	}
	case json_type_double: {
		double d = json_object_get_double(v);
		/* NaN and Infinity are refused by lex_check: what is left is
		 * a number too large for a double (1e400), read as infinity. */
		if (!isfinite(d))
			return err_set(e, ERR_INPUT,
			               "a number is out of range: numbers with a fraction or an "
			               "exponent must fit in a double (up to about 1.8e308)");
		write_double(out, d);
		return 0;
	}
	case json_type_string: {
		const char *s = json_object_get_string(v);
		size_t n = (size_t)json_object_get_string_len(v);
		if (memchr(s, '\0', n) != NULL)
			return err_set(e, ERR_INPUT, "strings may not contain U+0000");
		canon_write_string(out, s, n);
		return 0;
	}
	case json_type_array: {
		size_t n = json_object_array_length(v);
		buf_putc(out, '[');
		for (size_t i = 0; i < n; i++) {
			if (i)
				buf_putc(out, ',');
			if (canon_write(out, json_object_array_get_idx(v, i), e) < 0)
				return -1;
		}
		buf_putc(out, ']');
		return 0;
	}
	case json_type_object: {
		size_t n = (size_t)json_object_object_length(v), i = 0;
		struct member stack[16];
		struct member *m = n <= 16 ? stack : malloc(n * sizeof(*m));
		int rc = 0;

		if (m == NULL)
			return err_set(e, ERR_INTERNAL, "out of memory");
		json_object_object_foreach(v, key, val)
		{
			m[i].key = key;
			m[i].val = val;
			i++;
		}
		qsort(m, n, sizeof(*m), member_cmp);
		buf_putc(out, '{');
		for (i = 0; i < n && rc == 0; i++) {
			if (i)
				buf_putc(out, ',');
			canon_write_string(out, m[i].key, strlen(m[i].key));
			buf_putc(out, ':');
			rc = canon_write(out, m[i].val, e);
		}
		buf_putc(out, '}');
		if (m != stack)
			free(m);
		return rc;
	}
	}
	return err_set(e, ERR_INTERNAL, "unknown JSON type");
}

int canon_recanon(struct buf *out, const char *text, size_t len, struct err *e)
{
	struct json_object *v = canon_parse(text, len, CANON_STORED_DEPTH, e);
	int rc = v != NULL ? canon_write(out, v, e) : -1;

	json_object_put(v);
	return rc;
}
