/* log.c - logfmt lines on stderr (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

enum log_level log_min_level = LOG_INFO;
static const char *log_component = "idemflow";

static const char *const level_names[] = {"debug", "info", "warning", "error"};

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

void log_kv(char *buf, size_t cap, size_t *len, const char *key, const char *value)
{
	size_t n = *len;

	if (value == NULL)
		value = "";
	if (n + 1 >= cap)
		return;
	n += (size_t)snprintf(buf + n, cap - n, "%s%s=", n ? " " : "", key);
	if (n >= cap)
		goto out;
	if (!needs_quotes(value)) {
		n += (size_t)snprintf(buf + n, cap - n, "%s", value);
		goto out;
	}
	buf[n++] = '"';
	for (const char *p = value; *p && n + 4 < cap; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '"' || c == '\\') {
			buf[n++] = '\\';
			buf[n++] = (char)c;
		} else if (c == '\n') {
			buf[n++] = '\\';
			buf[n++] = 'n';
		} else if (c < ' ' || c == 0x7f) {
			buf[n++] = '?';
		} else {
			buf[n++] = (char)c;
		}
	}
	if (n + 1 < cap)
		buf[n++] = '"';
	buf[n < cap ? n : cap - 1] = '\0';
out:
	*len = n < cap ? n : cap - 1;
}

void log_write(enum log_level lvl, const char *msg, const char *fmt, ...)
{
	char line[2048];
	char ts[64];
	size_t n = 0;
	struct timeval tv;
	struct tm tm;
	va_list ap;

	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		 (long)(tv.tv_usec / 1000) % 1000);
	n = (size_t)snprintf(line, sizeof(line), "ts=%s level=%s component=%s pid=%ld", ts,
			     level_names[lvl], log_component, (long)getpid());
	log_kv(line, sizeof(line), &n, "msg", msg);
	if (fmt != NULL && n + 2 < sizeof(line)) {
		line[n++] = ' ';
		va_start(ap, fmt);
		int w = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
		va_end(ap);
		if (w > 0)
			n += (size_t)w;
		if (n >= sizeof(line))
			n = sizeof(line) - 1;
	}
	if (n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	/* One write(2) per line so lines from concurrent workers never interleave. */
	ssize_t r = write(STDERR_FILENO, line, n);
	(void)r;
}
