/*
 * log.h - one line per event, logfmt or JSON, on stderr (or a file opened by
 * log_open).
 *
 * Lines look like:
 *   ts=2026-11-29T14:00:00.123Z level=info pid=123 msg="worker started" slot=2
 * or, with log_format = json, the same fields as one JSON object:
 *   {"ts":"2026-11-29T14:00:00.123Z","level":"info","pid":123,"msg":"worker started","slot":2}
 * Callers always write logfmt pairs; the JSON form is made from them, so
 * both formats carry exactly the same fields. The LOG macros skip all
 * formatting below the configured level. Values are quoted and escaped by
 * one function, log_quote: always with LOG_Q in a format ("error=%s"), when
 * they need it with log_kv (for callers that build key=value pairs).
 * Never writes to stdout: in a FastCGI worker stdout is not ours, and for
 * the CLI it is reserved for results.
 *
 * When stderr is the journal's stream (systemd's JOURNAL_STREAM names its
 * device and inode), each line starts with its syslog priority, "<3>"
 * error, "<4>" warning, "<6>" info, "<7>" debug, which journald takes off
 * and keeps as the entry's priority (journalctl -p warning). Anywhere else
 * (a terminal, a log_file, a pipe) the lines are as above.
 */
#ifndef IDF_LOG_H
#define IDF_LOG_H

#include <stddef.h>

#include "core/err.h"

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERROR };
enum log_format { LOG_FORMAT_LOGFMT, LOG_FORMAT_JSON };

extern enum log_level log_min_level;
extern enum log_format log_line_format;

/* Parse "debug|info|warning|error"; returns 0 and sets *out, or -1. */
int log_level_parse(const char *s, enum log_level *out) MUSTCHECK;

/* Parse "logfmt|json"; returns 0 and sets *out, or -1. */
int log_format_parse(const char *s, enum log_format *out) MUSTCHECK;

/*
 * Send the log to path: the file is opened for appending (created 0640) and
 * put on stderr with dup2, so everything else that writes to stderr (libpq,
 * children such as the exec sink's commands) lands there too, and processes
 * forked later inherit it. NULL or "" keeps the stderr the process was
 * given. The path is remembered for log_reopen(). Returns 0, or -1 with e
 * filled; the old stderr is then untouched.
 */
int log_open(const char *path, struct err *e) MUSTCHECK;

/*
 * Open the remembered path again, after logrotate renamed the file. The new
 * file replaces stderr in one dup2, so no line is lost or written to a
 * closed descriptor. Logs "log file reopened" into the new file; a failure
 * keeps the old file and is logged there. Does nothing without a log file.
 */
void log_reopen(void);

/*
 * A SIGUSR1 handler: only notes the request (async-signal-safe). The
 * reopen happens at log_reopen_if_asked() or, at the latest, before the
 * process's next log line.
 */
void log_reopen_on_signal(int sig);
void log_reopen_if_asked(void);

/*
 * The JSON line for one logfmt line (no trailing newline in either):
 * values become JSON strings, or numbers when they were unquoted numerals
 * (except identifiers such as request_id, which stay strings); a word
 * without "=" is kept with the value before it. Bytes that are not UTF-8
 * become U+FFFD. out needs 6 * strlen(in) + 16 bytes at most; the result
 * is always a complete JSON object, cut short of a member that would not
 * fit. Returns its length. Used by log_write; exposed for the tests.
 */
size_t log_json_from_logfmt(const char *in, char *out, size_t cap);

/*
 * 1 when stderr is the stream systemd's JOURNAL_STREAM names ("dev:ino"
 * of stderr's fstat), 0 otherwise. log_write asks once, and again after
 * log_open or log_reopen replaced stderr.
 */
int log_stderr_is_journal(void);

/* Set the process-wide tag written as component=... (e.g. "supervisor"). */
void log_set_component(const char *component);

/* Log msg plus the already-formatted logfmt pairs in fmt (may be NULL). */
void log_write(enum log_level lvl, const char *msg, const char *fmt, ...) PRINTFLIKE(3, 4);

/* Append key=value to buf (size cap, current length *len), quoting value as
 * log_quote does when it contains spaces, quotes, '=', backslashes or control
 * characters, or is empty. Truncates safely. */
void log_kv(char *buf, size_t cap, size_t *len, const char *key, const char *value);

/*
 * The one quoting of a log value: value (NULL as "") between double
 * quotes, with the quote, the backslash, newline, tab and carriage return
 * escaped as \" \\ \n \t \r and any other control byte as \u00XX (logfmt as
 * Go reads it; log_json_from_logfmt undoes them); other bytes as they are.
 * Written to out (cap bytes, cap >= 3), cut before what does not fit but
 * always closed by its quote. Returns out. For values that may hold
 * anything (PostgreSQL's messages quote names):
 *   log_error("...", "error=%s", LOG_Q(e.msg));
 */
const char *log_quote(char *out, size_t cap, const char *value);

/* LOG_Q(value): log_quote into a buffer of its own that lives until the end
 * of the enclosing block; inside a log_* call it costs nothing below the
 * level. A value longer than a line is cut anyway. */
#define LOG_QUOTE_MAX 1024
#define LOG_Q(value)  log_quote((char[LOG_QUOTE_MAX]){ 0 }, LOG_QUOTE_MAX, (value))

#define LOG_AT(lvl, ...)                                                                           \
	do {                                                                                       \
		if ((lvl) >= log_min_level)                                                        \
			log_write((lvl), __VA_ARGS__);                                             \
	} while (0)
#define log_debug(...)   LOG_AT(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)    LOG_AT(LOG_INFO, __VA_ARGS__)
#define log_warning(...) LOG_AT(LOG_WARNING, __VA_ARGS__)
#define log_error(...)   LOG_AT(LOG_ERROR, __VA_ARGS__)

#endif
