/* log.c - logfmt or JSON lines on stderr or a log file (see log.h). */
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/utf8.h"

#define LOG_LINE_MAX 2048

enum log_level log_min_level = LOG_INFO;
enum log_format log_line_format = LOG_FORMAT_LOGFMT;
static const char *log_component = "idemflow";

static char *log_path;       /* the log file, or NULL for the inherited stderr */
static int log_orig_fd = -1; /* the inherited stderr, kept to go back to it */
static volatile sig_atomic_t log_reopen_asked;

static const char *const level_names[] = { "debug", "info", "warning", "error" };

/* The syslog priority of each level, as journald reads it from a "<N>"
 * before a line: debug 7, info 6, warning 4, err 3 (notice, 5, is no
 * level of ours). */
static const char level_priorities[] = { '7', '6', '4', '3' };

/* 1 when stderr is the journal's stream, 0 when not, -1 until looked at
 * (again after stderr was replaced). */
static volatile sig_atomic_t log_journal = -1;
static const char *const format_names[] = { "logfmt", "json" };

int log_level_parse(const char *s, enum log_level *out)
{
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (strcmp(s, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -1;
}

int log_format_parse(const char *s, enum log_format *out)
{
	for (size_t i = 0; i < sizeof(format_names) / sizeof(format_names[0]); i++) {
		if (strcmp(s, format_names[i]) == 0) {
			*out = (enum log_format)i;
			return 0;
		}
	}
	return -1;
}

/* The pid on every line, read once per process: getpid(2) is a system
 * call, and a worker writes a line per request. A forked child forgets
 * the parent's. */
static pid_t log_pid;

static void log_forget_pid(void)
{
	log_pid = 0;
}

static long log_getpid(void)
{
	static int registered;

	if (!registered) {
		registered = 1;
		pthread_atfork(NULL, NULL, log_forget_pid);
	}
	if (log_pid == 0)
		log_pid = getpid();
	return (long)log_pid;
}

void log_set_component(const char *component)
{
	log_component = component;
}

static int needs_quotes(const char *v)
{
	if (*v == '\0')
		return 1;
	for (; *v; v++) {
		unsigned char c = (unsigned char)*v;
		if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f)
			return 1;
	}
	return 0;
}

/* Append s (len bytes) to buf at *n, cut to what fits before the final
 * NUL (*n < cap on entry). Returns -1 when it did not all fit. A worker
 * writes a dozen pairs per request: this is the whole of their cost. */
static int put(char *buf, size_t cap, size_t *n, const char *s, size_t len)
{
	size_t room = cap - 1 - *n;
	int fit = len <= room;

	if (!fit)
		len = room;
	memcpy(buf + *n, s, len);
	*n += len;
	buf[*n] = '\0';
	return fit ? 0 : -1;
}

/* c as it stands inside a quoted value, in esc; returns its length. */
static size_t escape(unsigned char c, char esc[8])
{
	static const char hex[] = "0123456789abcdef";

	switch (c) {
	case '"': memcpy(esc, "\\\"", 2); return 2;
	case '\\': memcpy(esc, "\\\\", 2); return 2;
	case '\n': memcpy(esc, "\\n", 2); return 2;
	case '\t': memcpy(esc, "\\t", 2); return 2;
	case '\r': memcpy(esc, "\\r", 2); return 2;
	default: break;
	}
	if (c < ' ' || c == 0x7f) {
		memcpy(esc, "\\u00", 4);
		esc[4] = hex[c >> 4];
		esc[5] = hex[c & 0xf];
		return 6;
	}
	esc[0] = (char)c;
	return 1;
}

/*
 * The one quoting of log values: value between double quotes at buf + *n
 * (*n < cap), escaped. Cut where the next character would not fit with
 * the closing quote (never inside an escape); the closing quote is always
 * written when the opening one was. Nothing when not even "" fits.
 */
static void quote(char *buf, size_t cap, size_t *n, const char *value)
{
	size_t at = *n;
	char esc[8];

	if (at + 3 > cap)
		return;
	buf[at++] = '"';
	for (const char *p = value; *p; p++) {
		size_t k = escape((unsigned char)*p, esc);
		if (at + k + 2 > cap)
			break;
		memcpy(buf + at, esc, k);
		at += k;
	}
	buf[at++] = '"';
	buf[at] = '\0';
	*n = at;
}

const char *log_quote(char *out, size_t cap, const char *value)
{
	size_t n = 0;

	if (cap == 0)
		return out;
	out[0] = '\0';
	quote(out, cap, &n, value != NULL ? value : "");
	return out;
}

void log_kv(char *buf, size_t cap, size_t *len, const char *key, const char *value)
{
	size_t n = *len;

	if (value == NULL)
		value = "";
	if (n + 1 >= cap)
		return;
	if ((n > 0 && put(buf, cap, &n, " ", 1) < 0) || put(buf, cap, &n, key, strlen(key)) < 0 ||
	    put(buf, cap, &n, "=", 1) < 0)
		goto out;
	if (!needs_quotes(value))
		put(buf, cap, &n, value, strlen(value));
	else
		quote(buf, cap, &n, value);
out:
	*len = n < cap ? n : cap - 1;
}

/* --- logfmt to JSON ---------------------------------------------------- */

/* Values under these keys stay strings even when they look like numbers:
 * identifiers whose type must not depend on the digits they happen to hold. */
static const char *const json_string_keys[] = { "request_id", "key_fp", "sqlstate", "event_id",
	                                        "workflow",   "msg",    "trace_id", "span_id" };

struct jw {
	char *out;
	size_t cap, len;
	int full; /* a write did not fit */
};

static void jw_put(struct jw *w, const char *p, size_t n)
{
	/* Keep room for the closing brace and the NUL. */
	if (w->full || w->len + n + 2 > w->cap) {
		w->full = 1;
		return;
	}
	memcpy(w->out + w->len, p, n);
	w->len += n;
}

static void jw_char(struct jw *w, unsigned char c)
{
	char esc[8];

	if (c == '"' || c == '\\') {
		esc[0] = '\\';
		esc[1] = (char)c;
		jw_put(w, esc, 2);
	} else if (c == '\n') {
		jw_put(w, "\\n", 2);
	} else if (c < 0x20) {
		snprintf(esc, sizeof(esc), "\\u%04x", c);
		jw_put(w, esc, 6);
	} else {
		jw_put(w, (const char *)&c, 1);
	}
}

/* The character that the escape after a backslash (at p) stands for, as
 * JSON; returns where the escape ends. The escapes are quote()'s; any
 * other character stands for itself. */
static const char *jw_unescape(struct jw *w, const char *p, const char *end)
{
	int v = 0;

	switch (*p) {
	case 'n': jw_char(w, '\n'); return p + 1;
	case 't': jw_char(w, '\t'); return p + 1;
	case 'r': jw_char(w, '\r'); return p + 1;
	case 'u':
		for (int i = 1; i <= 4 && v >= 0; i++)
			v = p + i < end && utf8_hex_digit(p[i]) >= 0 ? v * 16 + utf8_hex_digit(p[i])
			                                             : -1;
		if (v >= 0 && v < 0x80) {
			jw_char(w, (unsigned char)v);
			return p + 5;
		}
		break;
	default: break;
	}
	jw_char(w, (unsigned char)*p);
	return p + 1;
}

/* The text [p, end) as the inside of a JSON string; quoted logfmt text has
 * its escapes (quote()) undone first. */
static void jw_text(struct jw *w, const char *p, const char *end, int quoted)
{
	while (p < end) {
		unsigned char c = (unsigned char)*p;
		size_t n;

		if (quoted && c == '\\' && p + 1 < end) {
			p = jw_unescape(w, p + 1, end);
		} else if (c < 0x80) {
			jw_char(w, c);
			p++;
		} else if ((n = utf8_len((const unsigned char *)p, (size_t)(end - p))) > 0) {
			jw_put(w, p, n);
			p += n;
		} else {
			jw_put(w, "\\ufffd", 6);
			p++;
		}
	}
}

/* End of the value starting at p: a quoted one ends after its closing
 * quote (or at the end of the line), an unquoted one at a space. */
static const char *value_end(const char *p)
{
	if (*p != '"')
		return p + strcspn(p, " ");
	for (p++; *p && *p != '"'; p++)
		if (*p == '\\' && p[1])
			p++;
	return *p ? p + 1 : p;
}

/* A word without '=' before the next space: not a pair of its own. */
static int is_bare_word(const char *p)
{
	size_t n = strcspn(p, " ");
	return n > 0 && *p != '"' && memchr(p, '=', n) == NULL;
}

static int is_json_number(const char *p, const char *end)
{
	if (p < end && *p == '-')
		p++;
	if (p == end || *p < '0' || *p > '9')
		return 0;
	if (*p == '0')
		p++;
	else
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	if (p < end && *p == '.') {
		if (++p == end || *p < '0' || *p > '9')
			return 0;
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < end && (*p == 'e' || *p == 'E')) {
		p++;
		if (p < end && (*p == '+' || *p == '-'))
			p++;
		if (p == end || *p < '0' || *p > '9')
			return 0;
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	}
	return p == end;
}

static int is_string_key(const char *k, size_t n)
{
	for (size_t i = 0; i < sizeof(json_string_keys) / sizeof(json_string_keys[0]); i++)
		if (strlen(json_string_keys[i]) == n && memcmp(json_string_keys[i], k, n) == 0)
			return 1;
	return 0;
}

size_t log_json_from_logfmt(const char *in, char *out, size_t cap)
{
	struct jw w = { .out = out, .cap = cap };
	const char *p = in;
	int members = 0;

	if (cap < 3)
		return 0;
	jw_put(&w, "{", 1);
	while (*p) {
		const char *key, *val, *end;
		size_t klen, kept = w.len;

		while (*p == ' ')
			p++;
		if (*p == '\0')
			break;
		key = p;
		if (*p == '"' || is_bare_word(p)) {
			/* Only before any pair; after one, words join its value. */
			klen = 1;
			key = "_";
			val = p;
		} else {
			klen = strcspn(p, "=");
			val = p + klen + 1;
		}
		end = value_end(val);
		/* Words that follow (e.g. "signal=9 (Killed)") belong to this value. */
		const char *stop = end;
		while (*stop == ' ' && is_bare_word(stop + 1))
			stop = value_end(stop + 1);

		if (members++)
			jw_put(&w, ",", 1);
		jw_put(&w, "\"", 1);
		jw_text(&w, key, key + klen, 0);
		jw_put(&w, "\":", 2);
		if (stop == end && *val != '"' && !is_string_key(key, klen) &&
		    is_json_number(val, end)) {
			jw_put(&w, val, (size_t)(end - val));
		} else {
			jw_put(&w, "\"", 1);
			if (*val == '"') {
				const char *close = end > val + 1 && end[-1] == '"' ? end - 1 : end;
				jw_text(&w, val + 1, close, 1);
			} else {
				jw_text(&w, val, end, 0);
			}
			/* The joined words, each after one space. */
			for (const char *q = end; q < stop;) {
				const char *qe = value_end(q + 1);
				jw_text(&w, q, qe, 0);
				q = qe;
			}
			jw_put(&w, "\"", 1);
		}
		if (w.full) {
			/* Drop the member that did not fit, keep the object whole. */
			w.len = kept;
			break;
		}
		p = stop;
	}
	w.out[w.len++] = '}';
	w.out[w.len] = '\0';
	return w.len;
}

/* --- Log files ---------------------------------------------------------- */

/*
 * Whether stderr is the journal's stream: systemd puts the device and
 * inode of the stream it connects to a service's stderr in JOURNAL_STREAM
 * ("dev:ino", decimal), as sd_journal_stream_fd() and systemd's own log
 * read it. A variable inherited by a process whose stderr went elsewhere
 * (a log_file, a pipe of its own) does not match, and the lines stay bare.
 */
int log_stderr_is_journal(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	char tail;

	if (env == NULL || sscanf(env, "%llu:%llu%c", &dev, &ino, &tail) != 2)
		return 0;
	if (fstat(STDERR_FILENO, &st) < 0)
		return 0;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

static int log_fd_to_stderr(int fd, const char *path, struct err *e)
{
	if (log_orig_fd < 0)
		log_orig_fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
	if (dup2(fd, STDERR_FILENO) < 0) {
		int saved = errno;
		close(fd);
		return err_set(e, ERR_INTERNAL, "could not put log_file \"%s\" on stderr: %s", path,
		               strerror(saved));
	}
	close(fd);
	log_journal = -1;
	return 0;
}

int log_open(const char *path, struct err *e)
{
	char *copy;
	int fd;

	if (path == NULL || *path == '\0') {
		/* Back to the stderr we were given, if a file had replaced it. */
		if (log_path != NULL && log_orig_fd >= 0) {
			dup2(log_orig_fd, STDERR_FILENO);
			log_journal = -1;
		}
		free(log_path);
		log_path = NULL;
		return 0;
	}
	copy = strdup(path);
	if (copy == NULL)
		return err_set(e, ERR_INTERNAL, "out of memory");
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);
	if (fd < 0) {
		err_set(e, ERR_CONFIG, "could not open log_file \"%s\": %s", path, strerror(errno));
		free(copy);
		return -1;
	}
	if (log_fd_to_stderr(fd, path, e) < 0) {
		free(copy);
		return -1;
	}
	free(log_path);
	log_path = copy;
	return 0;
}

void log_reopen(void)
{
	struct err e;
	int fd;

	if (log_path == NULL)
		return;
	fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);
	if (fd < 0) {
		log_warning("could not reopen the log file; still writing to the old one",
		            "log_file=%s error=%s", LOG_Q(log_path), LOG_Q(strerror(errno)));
		return;
	}
	if (log_fd_to_stderr(fd, log_path, &e) < 0) {
		log_warning("could not reopen the log file; still writing to the old one",
		            "error=%s", LOG_Q(e.msg));
		return;
	}
	log_info("log file reopened", "log_file=%s", LOG_Q(log_path));
}

void log_reopen_on_signal(int sig)
{
	log_reopen_asked = 1;
}

void log_reopen_if_asked(void)
{
	if (!log_reopen_asked)
		return;
	log_reopen_asked = 0;
	log_reopen();
}

/* --- Lines -------------------------------------------------------------- */

/* d as exactly width digits (zero padded) at p. */
static char *digits(char *p, long d, int width)
{
	for (int i = width - 1; i >= 0; i--) {
		p[i] = (char)('0' + d % 10);
		d /= 10;
	}
	return p + width;
}

/*
 * "ts=... level=... component=... pid=..." into line; returns its length.
 * The date and time to the second are formatted once per second.
 */
static size_t line_head(char *line, size_t cap, enum log_level lvl)
{
	static time_t sec_cached = (time_t)-1;
	static char sec_text[32]; /* 2026-11-29T18:45:35 */
	char pid[24], *p;
	size_t n = 0;
	struct timeval tv;
	long pidv = log_getpid();

	gettimeofday(&tv, NULL);
	if (tv.tv_sec != sec_cached) {
		struct tm tm;
		gmtime_r(&tv.tv_sec, &tm);
		p = digits(sec_text, tm.tm_year + 1900L, 4);
		*p++ = '-';
		p = digits(p, tm.tm_mon + 1L, 2);
		*p++ = '-';
		p = digits(p, tm.tm_mday, 2);
		*p++ = 'T';
		p = digits(p, tm.tm_hour, 2);
		*p++ = ':';
		p = digits(p, tm.tm_min, 2);
		*p++ = ':';
		p = digits(p, tm.tm_sec, 2);
		*p = '\0';
		sec_cached = tv.tv_sec;
	}
	char ms[6] = { '.', 0, 0, 0, 'Z', '\0' };
	digits(ms + 1, (long)(tv.tv_usec / 1000) % 1000, 3);
	pid[sizeof(pid) - 1] = '\0';
	p = buf_utoa(pid + sizeof(pid) - 1, (unsigned long long)pidv);
	line[0] = '\0';
	put(line, cap, &n, "ts=", 3);
	put(line, cap, &n, sec_text, strlen(sec_text));
	put(line, cap, &n, ms, 5);
	put(line, cap, &n, " level=", 7);
	put(line, cap, &n, level_names[lvl], strlen(level_names[lvl]));
	put(line, cap, &n, " component=", 11);
	put(line, cap, &n, log_component, strlen(log_component));
	put(line, cap, &n, " pid=", 5);
	put(line, cap, &n, p, strlen(p));
	return n;
}

/* The priority prefix "<N>" of lvl in the 3 bytes before at, when stderr
 * is the journal; returns where the line to write starts. */
static char *journal_prefix(char *at, enum log_level lvl)
{
	if (log_journal < 0)
		log_journal = log_stderr_is_journal();
	if (!log_journal)
		return at;
	at[-3] = '<';
	at[-2] = level_priorities[lvl];
	at[-1] = '>';
	return at - 3;
}

#define PRIO_MAX 3 /* "<N>" */

void log_write(enum log_level lvl, const char *msg, const char *fmt, ...)
{
	char whole[PRIO_MAX + LOG_LINE_MAX];
	char *line = whole + PRIO_MAX, *start;
	size_t n = 0;
	va_list ap;

	/* A SIGUSR1 that no loop picked up yet: this line goes to the new file. */
	if (log_reopen_asked)
		log_reopen_if_asked();
	n = line_head(line, LOG_LINE_MAX, lvl);
	log_kv(line, LOG_LINE_MAX, &n, "msg", msg);
	/* A line made by log_kv already ("%s", line) is copied as it is. */
	if (fmt != NULL && strcmp(fmt, "%s") == 0 && n + 2 < LOG_LINE_MAX) {
		line[n++] = ' ';
		va_start(ap, fmt);
		const char *pairs = va_arg(ap, const char *);
		va_end(ap);
		put(line, LOG_LINE_MAX, &n, pairs, strlen(pairs));
	} else if (fmt != NULL && n + 2 < LOG_LINE_MAX) {
		line[n++] = ' ';
		va_start(ap, fmt);
		int w = vsnprintf(line + n, LOG_LINE_MAX - n, fmt, ap);
		va_end(ap);
		if (w > 0)
			n += (size_t)w;
		if (n >= LOG_LINE_MAX)
			n = LOG_LINE_MAX - 1;
	}
	if (n > LOG_LINE_MAX - 2)
		n = LOG_LINE_MAX - 2;
	line[n] = '\0';
	/* One write(2) per line so lines from concurrent workers never
	 * interleave (the file is opened O_APPEND); the journal's priority
	 * goes in the same write, in room kept before the line. */
	if (log_line_format == LOG_FORMAT_JSON) {
		char jwhole[PRIO_MAX + 6 * LOG_LINE_MAX + 16];
		char *json = jwhole + PRIO_MAX;
		size_t jn = log_json_from_logfmt(line, json, sizeof(jwhole) - PRIO_MAX - 1);
		json[jn++] = '\n';
		start = journal_prefix(json, lvl);
		ssize_t r = write(STDERR_FILENO, start, jn + (size_t)(json - start));
		(void)r;
	} else {
		line[n++] = '\n';
		start = journal_prefix(line, lvl);
		ssize_t r = write(STDERR_FILENO, start, n + (size_t)(line - start));
		(void)r;
	}
}
