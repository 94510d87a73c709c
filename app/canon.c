/* canon.c - strict JSON parsing and the canonical form (see canon.h). */
#include "canon.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/*
 * What json-c accepts that this service refuses, found in text that json-c
 * parsed (so its strings are well formed). Returns the offset of the first
 * and sets *why, or returns -1:
 *  - a single quote outside strings: json-c takes single-quoted keys even
 *    in strict mode; JSON does not;
 *  - a leading zero after a minus sign ("-01"): strict json-c refuses "01"
 *    but not "-01", and reads -000...018446744073709551615 as the 64-bit
 *    limit nearest to it;
 *  - the escape \u0000 anywhere in a string: canon_write refuses U+0000 in
 *    values, but json-c cuts an object key at it, so {"a\u0000x":1} would
 *    silently become {"a":1}.
 */
static long refused_at(const char *text, size_t len, const char **why)
{
	int in_string = 0;

	for (size_t i = 0; i < len; i++) {
		char c = text[i];
		if (in_string) {
			if (c == '\\') {
				if (len - i >= 6 && memcmp(text + i, "\\u0000", 6) == 0) {
					*why = "strings may not contain U+0000";
					return (long)i;
				}
				i++;
			} else if (c == '"') {
				in_string = 0;
			}
		} else if (c == '"') {
			in_string = 1;
		} else if (c == '\'') {
			*why = "the body is not valid JSON: single quote";
			return (long)i;
		} else if (c == '-' && (i == 0 || (text[i - 1] != 'e' && text[i - 1] != 'E')) &&
		           len - i >= 3 && text[i + 1] == '0' && is_digit(text[i + 2])) {
			/* Not in an exponent, where "1e-05" is valid. */
			*why = "the body is not valid JSON: leading zero";
			return (long)i + 1;
		}
	}
	return -1;
}

/* Length of the integer literal -?(0|[1-9][0-9]*) at p[0..n), when it is a
 * whole number token (no fraction or exponent follows); 0 otherwise. */
static size_t integer_literal(const char *p, size_t n)
{
	size_t i = p[0] == '-';

	if (i >= n || !is_digit(p[i]) || (p[i] == '0' && i + 1 < n && is_digit(p[i + 1])))
		return 0;
	while (i < n && is_digit(p[i]))
		i++;
	if (i < n && (p[i] == '.' || p[i] == 'e' || p[i] == 'E' || p[i] == '-' || p[i] == '+'))
		return 0;
	return i;
}

/* 1 when the integer literal p[0..n) is below INT64_MIN or above UINT64_MAX. */
static int integer_overflows(const char *p, size_t n)
{
	const char *limit = "18446744073709551615"; /* UINT64_MAX */

	if (*p == '-') {
		p++;
		n--;
		limit = "9223372036854775808"; /* -INT64_MIN */
	}
	return n > strlen(limit) || (n == strlen(limit) && memcmp(p, limit, n) > 0);
}

/*
 * json-c saturates an integer literal it cannot hold in 64 bits to the
 * nearest limit, so {"n":18446744073709551616} and {"n":99999999999999999999}
 * would share one canonical form, one fingerprint and one stored answer.
 * RFC 8785 reads every number as an IEEE 754 double; such an integer is
 * read as one here too, by parsing a copy of the text with ".0" after it.
 * That also reads back what write_double prints for integral doubles from
 * 1e19 to 1e21, and what jsonb prints for large numbers. Returns the copy
 * (caller frees) with *wide_len, or NULL when the text has no such integer
 * (or when out of memory: *wide_len is then 1).
 */
static char *widen_large_integers(const char *text, size_t len, size_t *wide_len)
{
	size_t count = 0, w = 0;
	char *wide = NULL;

	*wide_len = 0;
	for (int pass = 0; pass < 2; pass++) {
		int in_string = 0;
		for (size_t i = 0; i < len; i++) {
			char c = text[i];
			size_t n;
			if (wide)
				wide[w++] = c;
			if (in_string) {
				if (c == '\\' && i + 1 < len) {
					i++;
					if (wide)
						wide[w++] = text[i];
				} else if (c == '"') {
					in_string = 0;
				}
			} else if (c == '"') {
				in_string = 1;
			} else if ((c == '-' || is_digit(c)) &&
			           (i == 0 || memchr(" \t\r\n[,:", text[i - 1], 7) != NULL) &&
			           (n = integer_literal(text + i, len - i)) > 0) {
				int big = integer_overflows(text + i, n);
				count += big;
				if (wide) {
					memcpy(wide + w, text + i + 1, n - 1);
					w += n - 1;
					if (big) {
						memcpy(wide + w, ".0", 2);
						w += 2;
					}
				}
				i += n - 1;
			}
		}
		if (count == 0)
			return NULL;
		if (wide == NULL) {
			wide = malloc(len + 2 * count);
			if (wide == NULL) {
				*wide_len = 1;
				return NULL;
			}
		}
	}
	*wide_len = w;
	return wide;
}

struct json_object *canon_parse(const char *text, size_t len, int max_depth, struct err *e)
{
	struct json_tokener *tok = json_tokener_new_ex(max_depth);
	struct json_object *v = NULL;
	enum json_tokener_error jerr;
	size_t end, consumed = 0, wide_len;
	char *wide = NULL;

	if (tok == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	if (len > INT32_MAX / 2) {
		err_set(e, ERR_INPUT, "the body is too large to parse");
		goto out;
	}
	/* From here on byte offsets in messages count the copy, if any: two
	 * more for each large integer before them. */
	wide = widen_large_integers(text, len, &wide_len);
	if (wide != NULL) {
		text = wide;
		len = wide_len;
	} else if (wide_len != 0) {
		err_set(e, ERR_INTERNAL, "out of memory");
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
		err_set(e, ERR_INPUT, "the body is not valid JSON: %s at byte %zu",
			jerr == json_tokener_error_depth ? "nesting is too deep"
							 : json_tokener_error_desc(jerr),
			json_tokener_get_parse_end(tok));
		goto fail;
	}
	const char *why = NULL;
	long q = refused_at(text, len, &why);
	if (q >= 0) {
		err_set(e, ERR_INPUT, "%s at byte %ld", why, q);
		goto fail;
	}
	for (end = consumed ? consumed : json_tokener_get_parse_end(tok); end < len; end++) {
		char c = text[end];
		if (c != ' ' && c != '\t' && c != '\r' && c != '\n') {
			err_set(e, ERR_INPUT, "the body is not valid JSON: unexpected data at byte %zu",
				end);
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
	json_tokener_free(tok);
	free(wide);
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
			u[0] = '\\'; u[1] = 'u'; u[2] = '0'; u[3] = '0';
			u[4] = hex[c >> 4]; u[5] = hex[c & 15]; u[6] = '\0';
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
	case json_type_null:
		buf_puts(out, "null");
		return 0;
	case json_type_boolean:
		buf_puts(out, json_object_get_boolean(v) ? "true" : "false");
		return 0;
	case json_type_int: {
		int64_t i = json_object_get_int64(v);
		if (i == INT64_MAX)
			buf_printf(out, "%llu", (unsigned long long)json_object_get_uint64(v));
		else
			buf_printf(out, "%lld", (long long)i);
		return 0;
	}
	case json_type_double: {
		double d = json_object_get_double(v);
		/* json-c reads NaN and Infinity; JSON has no such numbers. */
		if (!isfinite(d))
			return err_set(e, ERR_INPUT, "the body is not valid JSON: NaN or Infinity");
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
		json_object_object_foreach(v, key, val) {
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
