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

/* A result of text columns, named as columns (a JSON array of strings)
 * names them. */
static PGresult *empty(struct json_object *columns, struct err *e)
{
	static const PGresAttDesc text = { .typid = 25, .typlen = -1, .atttypmod = -1 };
	PGresAttDesc att[ROWTEXT_MAX_FIELDS];
	const int nfields = (int)json_object_array_length(columns);
	PGresult *res;

	if (nfields > ROWTEXT_MAX_FIELDS) {
		err_set(e, ERR_INTERNAL, "a command's rows have more than %d columns",
		        ROWTEXT_MAX_FIELDS);
		return NULL;
	}
	for (int i = 0; i < nfields; i++) {
		struct json_object *name = json_object_array_get_idx(columns, (size_t)i);
		if (!json_object_is_type(name, json_type_string)) {
			err_set(e, ERR_INTERNAL, "a command's column %d has no name", i);
			return NULL;
		}
		att[i] = text;
		att[i].name = (char *)json_object_get_string(name);
	}
	res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
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
	struct json_object *root = NULL, *columns, *rows;
	struct buf b = BUF_INIT;
	struct field f[ROWTEXT_MAX_FIELDS];
	PGresult *res = NULL;
	int nfields;

	if (tok == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		goto out;
	}
	root = json_tokener_parse_ex(tok, json, (int)len);
	if (root == NULL || !json_object_object_get_ex(root, "columns", &columns) ||
	    !json_object_is_type(columns, json_type_array) ||
	    !json_object_object_get_ex(root, "rows", &rows) ||
	    !json_object_is_type(rows, json_type_array)) {
		err_set(e, ERR_INTERNAL,
		        "a command's rows are not {\"columns\":[...],\"rows\":[...]}");
		goto out;
	}
	if ((res = empty(columns, e)) == NULL)
		goto out;
	nfields = PQnfields(res);
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
		if (nf != nfields) {
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
	goto out;
fail:
	PQclear(res);
	res = NULL;
out:
	buf_free(&b);
	json_object_put(root);
	if (tok != NULL)
		json_tokener_free(tok);
	return res;
}
