/*
 * page.h - the paging of list answers (GET /v1/workflows and a workflow's
 * events): the query parameters of a page and the answer
 * {"<name>":[items],"next_cursor":...} within max_answer bytes. What an
 * item is, and the statement that reads the rows, is the caller's.
 */
#ifndef IDF_PAGE_H
#define IDF_PAGE_H

#include <libpq-fe.h>
#include <stddef.h>

#include "core/buf.h"
#include "core/err.h"
#include "server/handler.h"

#define PAGE_DEFAULT 100  /* items on a page without limit= */
#define PAGE_MAX     1000 /* the largest limit= */

/* The query parameter name into out (outlen bytes); "" when absent.
 * Returns 0, or -1 with resp filled (400) when it is malformed or too long. */
int page_param(const struct http_req *req, struct http_resp *resp, const char *name, char *out,
               size_t outlen) MUSTCHECK;

/* limit=N within 1..PAGE_MAX into *limit, PAGE_DEFAULT when absent.
 * Returns 0, or -1 with resp filled (400). */
int page_limit(const struct http_req *req, struct http_resp *resp, long *limit) MUSTCHECK;

/* Append row i of res to out as one item of a page; 0, or -1 with e. */
typedef int (*page_item_fn)(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                            struct err *e);

/*
 * Answer 200 {"<name>":[items],"next_cursor":...} from the first n rows
 * of res (borrowed): at most limit items and at most max_answer bytes,
 * the first item always (so a walk always moves on, even past an item
 * bigger than the cap). The query asked for one row more than limit and
 * stopped one row past its byte budget; column within_col says whether a
 * row starts within that budget. A row left over means a next page; the
 * cursor is column 0 of the last row shown. An item that fails answers
 * the error instead (handler_db_error).
 */
void page_answer(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                 const char *name, const PGresult *res, int n, long limit, int within_col,
                 page_item_fn item);

/* page_answer(), and when every row is shown, next_cursor resume instead
 * of null unless resume is NULL: the query stopped before the end of what
 * it reads (the event feed's scan, events.c). resume borrowed. */
void page_answer_from(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                      const char *name, const PGresult *res, int n, long limit, int within_col,
                      page_item_fn item, const char *resume);

#endif
