/* err.c - filling struct err (see err.h). */
#include "core/err.h"

#include <stdio.h>
#include <string.h>

int err_set(struct err *e, enum err_code code, const char *fmt, ...)
{
	va_list ap;

	if (e == NULL)
		return -1;
	e->code = code;
	e->sqlstate[0] = '\0';
	e->outcome_unknown = 0;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return -1;
}

void err_clear(struct err *e)
{
	if (e == NULL)
		return;
	e->code = ERR_NONE;
	e->sqlstate[0] = '\0';
	e->outcome_unknown = 0;
	e->msg[0] = '\0';
}

void err_prefix(struct err *e, const char *fmt, ...)
{
	char pre[sizeof(e->msg)], old[sizeof(e->msg)];
	va_list ap;
	int n;

	if (e == NULL)
		return;
	va_start(ap, fmt);
	n = vsnprintf(pre, sizeof(pre), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	memcpy(old, e->msg, sizeof(old));
	/* Truncation is fine: the message is for humans and logs. */
	n = snprintf(e->msg, sizeof(e->msg), "%s: ", pre);
	if (n > 0 && (size_t)n < sizeof(e->msg))
		snprintf(e->msg + n, sizeof(e->msg) - (size_t)n, "%.*s",
		         (int)(sizeof(e->msg) - (size_t)n - 1), old);
}
