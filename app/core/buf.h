/*
 * buf.h - a growable byte buffer, always NUL-terminated for convenience.
 *
 * Allocation failure is sticky: after the first failed append, b->oom is set,
 * later appends do nothing, and the caller checks once at the end. Hot paths
 * reuse one buffer with buf_reset() instead of allocating per request.
 */
#ifndef IDF_BUF_H
#define IDF_BUF_H

#include <stddef.h>

#include "core/err.h"

struct buf {
	char *data; /* owned; NULL until the first append */
	size_t len;
	size_t cap;
	int oom;
};

#define BUF_INIT                                                                                   \
	{                                                                                          \
		NULL, 0, 0, 0                                                                      \
	}

void buf_append(struct buf *b, const void *p, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_putc(struct buf *b, char c);
void buf_printf(struct buf *b, const char *fmt, ...) PRINTFLIKE(2, 3);
/* The decimal digits of v, written backwards so that they end just before
 * end; returns where they start. Writes no NUL; 20 bytes always suffice.
 * (The request path formats its numbers with this, not printf.) */
char *buf_utoa(char *end, unsigned long long v);
/* Empty the buffer, keeping its memory; clears oom. */
void buf_reset(struct buf *b);
/* Release the memory; the buffer is then empty and reusable. */
void buf_free(struct buf *b);
/* Cut the contents back to their first len bytes (len <= b->len). */
void buf_truncate(struct buf *b, size_t len);
/* Empty the buffer, and give its memory back when it holds more than
 * keep bytes: a buffer reused across requests keeps a small one, not the
 * high-water mark of the largest request it ever served. */
void buf_shrink(struct buf *b, size_t keep);

#endif
