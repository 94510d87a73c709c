/*
 * page.c - the paging of list answers (see page.h): a page's query
 * parameters, and its answer cut at limit items and max_answer bytes.
 */
#include "server/page.h"

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int page_param(const struct http_req *req, struct http_resp *resp, const char *name, char *out,
               size_t outlen)
{
	char detail[128];
	int rc = http_query_param(req->query, name, out, outlen);

	if (rc < 0) {
		snprintf(detail, sizeof(detail),
		         "query parameter \"%s\" is malformed or longer than %zu bytes", name,
		         outlen - 1);
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		return -1;
	}
	if (rc == 0)
		out[0] = '\0';
	return 0;
}

int page_limit(const struct http_req *req, struct http_resp *resp, long *limit)
{
	char v[16], *end;

	if (page_param(req, resp, "limit", v, sizeof(v)) < 0)
		return -1;
	*limit = PAGE_DEFAULT;
	if (v[0] == '\0')
		return 0;
	*limit = strtol(v, &end, 10);
	if (*end != '\0' || end == v || *limit < 1 || *limit > PAGE_MAX) {
		handler_problem(resp, req, P_INVALID_REQUEST,
		                "limit must be an integer from 1 to 1000");
		return -1;
	}
	return 0;
}

/* The longest end of a page: "],"next_cursor":"<uuid>"}". */
#define PAGE_TAIL_MAX 64

/* page_answer(): see page.h. */
void page_answer(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                 const char *name, const PGresult *res, int n, long limit, int within_col,
                 page_item_fn item)
{
	page_answer_from(ctx, req, resp, name, res, n, limit, within_col, item, NULL);
}

void page_answer_from(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                      const char *name, const PGresult *res, int n, long limit, int within_col,
                      page_item_fn item, const char *resume)
{
	const size_t cap = (size_t)ctx->conf->max_answer;
	struct buf *b = &resp->body;
	int shown = 0;
	struct err e;

	buf_printf(b, "{\"%s\":[", name);
	for (int i = 0; i < n && i < limit; i++) {
		size_t mark = b->len;
		if (i > 0 && strcmp(PQgetvalue(res, i, within_col), "t") != 0)
			break;
		if (i > 0)
			buf_putc(b, ',');
		if (item(ctx, b, res, i, &e) < 0)
			goto fail;
		if (i > 0 && b->len + PAGE_TAIL_MAX > cap) {
			buf_truncate(b, mark); /* the next page starts with it */
			break;
		}
		shown++;
	}
	if (shown < n)
		buf_printf(b, "],\"next_cursor\":\"%s\"}", PQgetvalue(res, shown - 1, 0));
	else if (resume != NULL)
		buf_printf(b, "],\"next_cursor\":\"%s\"}", resume);
	else
		buf_puts(b, "],\"next_cursor\":null}");
	if (b->oom) {
		err_set(&e, ERR_INTERNAL, "out of memory");
		goto fail;
	}
	resp->status = 200;
	resp->content_type = "application/json";
	return;
fail:
	buf_reset(b);
	handler_db_error(ctx, resp, req, &e);
}
