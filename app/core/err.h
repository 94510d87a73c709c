/*
 * err.h - error detail that travels up from where a failure happens.
 *
 * Lower layers fill a caller-supplied struct err and return -1; they neither
 * log nor answer. The request boundary logs it once and maps it to a
 * problem+json answer (see problem.h). Not for control flow on the hot path.
 */
#ifndef IDF_ERR_H
#define IDF_ERR_H

#include <stdarg.h>

#define MUSTCHECK        __attribute__((warn_unused_result))
#define PRINTFLIKE(f, a) __attribute__((format(printf, f, a)))

enum err_code {
	ERR_NONE = 0,
	ERR_INTERNAL,     /* a bug or an unexpected library failure */
	ERR_CONFIG,       /* bad configuration value */
	ERR_DB_DOWN,      /* connection to PostgreSQL lost or unavailable */
	ERR_DB,           /* PostgreSQL answered with an unexpected error */
	ERR_LOCK_TIMEOUT, /* lock_timeout expired (SQLSTATE 55P03) */
	ERR_SERIALIZE,    /* serialization failure or deadlock: retryable */
	ERR_INPUT,        /* the caller's input is invalid */
};

struct err {
	enum err_code code;
	char sqlstate[6]; /* "" unless PostgreSQL reported one */
	/* ERR_DB_DOWN only: the connection was lost while a statement that
	 * could commit was on its way or running, so it may have committed.
	 * 0 when it is known that nothing was committed. */
	int outcome_unknown;
	char msg[256];
};

/* Fill *e (may be NULL) with a code and a printf-style message (no SQLSTATE,
 * outcome known). Returns -1 so callers can write `return err_set(e, ...)`. */
int err_set(struct err *e, enum err_code code, const char *fmt, ...) PRINTFLIKE(3, 4);

/* Put context in front of e's message: "<prefix>: <message>". */
void err_prefix(struct err *e, const char *fmt, ...) PRINTFLIKE(2, 3);

/* Reset *e to "no error". */
void err_clear(struct err *e);

#endif
