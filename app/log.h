/*
 * log.h - one logfmt line per event, on stderr (or a file opened by log_open).
 *
 * Lines look like:
 *   ts=2026-11-29T14:00:00.123Z level=info pid=123 msg="worker started" slot=2
 * The LOG macros skip all formatting below the configured level. Values are
 * quoted and escaped when they need to be (log_kv does it for callers that
 * build key=value pairs). Never writes to stdout: in a FastCGI worker stdout
 * is not ours, and for the CLI it is reserved for results.
 */
#ifndef IDF_LOG_H
#define IDF_LOG_H

#include <stddef.h>

#include "err.h"

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERROR };

extern enum log_level log_min_level;

/* Parse "debug|info|warning|error"; returns 0 and sets *out, or -1. */
int log_level_parse(const char *s, enum log_level *out) MUSTCHECK;

/* Set the process-wide tag written as component=... (e.g. "supervisor"). */
void log_set_component(const char *component);

/* Log msg plus the already-formatted logfmt pairs in fmt (may be NULL). */
void log_write(enum log_level lvl, const char *msg, const char *fmt, ...) PRINTFLIKE(3, 4);

/* Append key=value to buf (size cap, current length *len), quoting value when
 * it contains spaces, quotes, '=' or control characters. Truncates safely. */
void log_kv(char *buf, size_t cap, size_t *len, const char *key, const char *value);

#define LOG_AT(lvl, ...)                                                                            \
	do {                                                                                        \
		if ((lvl) >= log_min_level)                                                         \
			log_write((lvl), __VA_ARGS__);                                              \
	} while (0)
#define log_debug(...) LOG_AT(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) LOG_AT(LOG_INFO, __VA_ARGS__)
#define log_warning(...) LOG_AT(LOG_WARNING, __VA_ARGS__)
#define log_error(...) LOG_AT(LOG_ERROR, __VA_ARGS__)

#endif
