/* rowtext.c - a command's rows from their record texts (see rowtext.h). */
#include "server/rowtext.h"

#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "core/buf.h"

/* One field's place in the row's buffer; len -1: NULL. */
struct field {
	size_t off;
	int len;
};

/*
 * Split record text s (n bytes) into fields, their values unquoted into b
 * (each followed by a NUL). record_out writes a field as nothing (NULL),
 * bare (no quote, backslash, comma, parenthesis or space in it), or in
 * double quotes with a quote doubled and a backslash escaped; record_in
 * also reads a backslash escape outside quotes, and so does this.
 * Returns the number of fields, or -1 when s is not a record's text.
 */
static int split(const char *s, size_t n, struct buf *b, struct field *f)
{
	size_t i = 1;
	int nf = 0;

	if (n < 2 || s[0] != '(' || s[n - 1] != ')')
		return -1;
	for (;;) {
		int quoted = 0, any = 0;

		if (nf == ROWTEXT_MAX_FIELDS)
			return -1;
		f[nf].off = b->len;
		while (i < n - 1 && (quoted || (s[i] != ',' && s[i] != ')'))) {
			any = 1;
			if (s[i] == '"') {
				if (quoted && i + 1 < n - 1 && s[i + 1] == '"') {
					buf_putc(b, '"');
					i += 2;
				} else {
					quoted = !quoted;
					i++;
				}
			} else if (s[i] == '\\' && i + 1 < n - 1) {
				buf_putc(b, s[i + 1]);
				i += 2;
			} else {
				buf_putc(b, s[i++]);
			}
		}
		if (quoted)
			return -1;
		f[nf].len = any ? (int)(b->len - f[nf].off) : -1;
		buf_putc(b, '\0');
		nf++;
		if (i >= n - 1)
			return nf;
		i++; /* the comma */
	}
}

static PGresult *empty(int nfields, struct err *e)
{
	static const PGresAttDesc text = {
		.name = "?column?", .typid = 25, .typlen = -1, .atttypmod = -1
	};
	PGresAttDesc att[ROWTEXT_MAX_FIELDS];
	PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);

	for (int i = 0; i < nfields; i++)
		att[i] = text;
	if (res == NULL || (nfields > 0 && !PQsetResultAttrs(res, nfields, att))) {
		PQclear(res);
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	return res;
}

PGresult *rowtext_result(const char *json, size_t len, struct err *e)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *rows = NULL;
	struct buf b = BUF_INIT;
	struct field f[ROWTEXT_MAX_FIELDS];
	PGresult *res = NULL;
	int nfields = 0;

	if (tok == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		goto out;
	}
	rows = json_tokener_parse_ex(tok, json, (int)len);
	if (rows == NULL || !json_object_is_type(rows, json_type_array)) {
		err_set(e, ERR_INTERNAL, "a command's rows are not a JSON array");
		goto out;
	}
	for (size_t t = 0; t < json_object_array_length(rows); t++) {
		struct json_object *row = json_object_array_get_idx(rows, t);
		int nf;

		if (!json_object_is_type(row, json_type_string)) {
			err_set(e, ERR_INTERNAL, "a command's row %zu is not a string", t);
			goto fail;
		}
		buf_reset(&b);
		nf = split(json_object_get_string(row), (size_t)json_object_get_string_len(row), &b,
		           f);
		if (nf < 0 || b.oom) {
			err_set(e, ERR_INTERNAL, "a command's row %zu is not a record's text", t);
			goto fail;
		}
		if (res == NULL) {
			nfields = nf;
			if ((res = empty(nfields, e)) == NULL)
				goto out;
		} else if (nf != nfields) {
			err_set(e, ERR_INTERNAL, "a command's row %zu has %d fields, not %d", t, nf,
			        nfields);
			goto fail;
		}
		for (int i = 0; i < nf; i++) {
			char *v = f[i].len < 0 ? NULL : b.data + f[i].off;
			if (!PQsetvalue(res, (int)t, i, v, f[i].len)) {
				err_set(e, ERR_INTERNAL, "out of memory");
				goto fail;
			}
		}
	}
	if (res == NULL)
		res = empty(0, e);
	goto out;
fail:
	PQclear(res);
	res = NULL;
out:
	buf_free(&b);
	json_object_put(rows);
	if (tok != NULL)
		json_tokener_free(tok);
	return res;
}
