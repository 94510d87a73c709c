/* trace.c - W3C Trace Context, level 1 (see trace.h). */
#include "core/trace.h"

#include <stddef.h>
#include <string.h>

#include "core/ids.h"

static const char hexdig[] = "0123456789abcdef";

/* Lowercase hex digits only: the spec's HEXDIGLC. */
static int is_hexlc(int c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static int hexlc(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!is_hexlc((unsigned char)s[i]))
			return 0;
	return 1;
}

static int all_zero(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != '0')
			return 0;
	return 1;
}

static int hexval(int c)
{
	return c <= '9' ? c - '0' : c - 'a' + 10;
}

/*
 * version "-" trace-id "-" parent-id "-" trace-flags: 2, 32, 16 and 2
 * lowercase hex digits, 55 characters. A version above 00 may carry more
 * after the flags, behind a "-" (the forward-compatibility rule: read the
 * fields this version knows, ignore the rest); version 00 may not.
 */
int trace_parse_parent(const char *s, char *trace_id, char *parent_id, uint8_t *flags)
{
	size_t len;

	if (s == NULL)
		return -1;
	len = strnlen(s, TRACE_PARENT_LEN + 2);
	if (len < TRACE_PARENT_LEN || !hexlc(s, 2) || s[2] != '-')
		return -1;
	if (s[0] == 'f' && s[1] == 'f')
		return -1; /* forbidden */
	if (s[0] == '0' && s[1] == '0' ? len != TRACE_PARENT_LEN
	                               : len > TRACE_PARENT_LEN && s[TRACE_PARENT_LEN] != '-')
		return -1;
	if (!hexlc(s + 3, TRACE_ID_LEN) || s[35] != '-' || !hexlc(s + 36, TRACE_SPAN_LEN) ||
	    s[52] != '-' || !hexlc(s + 53, 2))
		return -1;
	if (all_zero(s + 3, TRACE_ID_LEN) || all_zero(s + 36, TRACE_SPAN_LEN))
		return -1;
	memcpy(trace_id, s + 3, TRACE_ID_LEN);
	trace_id[TRACE_ID_LEN] = '\0';
	memcpy(parent_id, s + 36, TRACE_SPAN_LEN);
	parent_id[TRACE_SPAN_LEN] = '\0';
	*flags = (uint8_t)(hexval(s[53]) << 4 | hexval(s[54]));
	return 0;
}

static int is_lcalpha(int c)
{
	return c >= 'a' && c <= 'z';
}

static int is_keychar(int c)
{
	return is_lcalpha(c) || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' ||
	       c == '/';
}

/*
 * key = simple-key / multi-tenant-key
 * simple-key = lcalpha 0*255( lcalpha / DIGIT / "_" / "-"/ "*" / "/" )
 * multi-tenant-key = tenant-id "@" system-id
 * tenant-id = ( lcalpha / DIGIT ) 0*240( lcalpha / DIGIT / "_" / "-"/ "*" / "/" )
 * system-id = lcalpha 0*13( lcalpha / DIGIT / "_" / "-"/ "*" / "/" )
 */
static int key_valid(const char *k, size_t n)
{
	const char *at = memchr(k, '@', n);

	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (k + i != at && !is_keychar((unsigned char)k[i]))
			return 0;
	if (at == NULL)
		return is_lcalpha((unsigned char)k[0]) && n <= 256;
	size_t tn = (size_t)(at - k), sn = n - tn - 1;
	return tn >= 1 && tn <= 241 &&
	       (is_lcalpha((unsigned char)k[0]) || (k[0] >= '0' && k[0] <= '9')) && sn >= 1 &&
	       sn <= 14 && is_lcalpha((unsigned char)at[1]);
}

/* value = 0*255(chr) nblk-chr; nblk-chr = %x21-2B / %x2D-3C / %x3E-7E;
 * chr = %x20 / nblk-chr */
static int value_valid(const char *v, size_t n)
{
	if (n == 0 || n > 256 || v[n - 1] == ' ')
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)v[i];
		if (c < 0x20 || c > 0x7e || c == ',' || c == '=')
			return 0;
	}
	return 1;
}

int trace_state_valid(const char *s, size_t len)
{
	struct {
		const char *k;
		size_t n;
	} keys[TRACE_STATE_MEMBERS];
	size_t nkeys = 0, i = 0;

	if (len > TRACE_STATE_MAX)
		return 0;
	while (i <= len) {
		size_t start = i, end;
		const char *eq;

		while (i < len && s[i] != ',')
			i++;
		end = i++; /* past the comma (or the end) */
		while (start < end && (s[start] == ' ' || s[start] == '\t'))
			start++;
		while (end > start && (s[end - 1] == ' ' || s[end - 1] == '\t'))
			end--;
		if (start == end)
			continue; /* an empty member is allowed */
		eq = memchr(s + start, '=', end - start);
		if (eq == NULL || nkeys == TRACE_STATE_MEMBERS ||
		    !key_valid(s + start, (size_t)(eq - (s + start))) ||
		    !value_valid(eq + 1, (size_t)(s + end - eq - 1)))
			return 0;
		keys[nkeys].k = s + start;
		keys[nkeys].n = (size_t)(eq - (s + start));
		for (size_t j = 0; j < nkeys; j++)
			if (keys[j].n == keys[nkeys].n &&
			    memcmp(keys[j].k, keys[nkeys].k, keys[j].n) == 0)
				return 0;
		nkeys++;
	}
	return 1;
}

void trace_format(char *out, const char *trace_id, const char *span_id, uint8_t flags)
{
	memcpy(out, "00-", 3);
	memcpy(out + 3, trace_id, TRACE_ID_LEN);
	out[35] = '-';
	memcpy(out + 36, span_id, TRACE_SPAN_LEN);
	out[52] = '-';
	out[53] = hexdig[flags >> 4];
	out[54] = hexdig[flags & 0x0f];
	out[TRACE_PARENT_LEN] = '\0';
}

/* n random bytes as 2n lowercase hex digits, never all zero. */
static int random_hex(char *out, size_t n)
{
	uint8_t b[16];

	if (ids_random_id(b, n) < 0)
		return -1;
	uint8_t any = 0;
	for (size_t i = 0; i < n; i++)
		any |= b[i];
	if (!any)
		b[n - 1] = 1; /* odds of 2^-64 at worst, but the rule is absolute */
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = hexdig[b[i] >> 4];
		out[2 * i + 1] = hexdig[b[i] & 0x0f];
	}
	out[2 * n] = '\0';
	return 0;
}

int trace_begin(struct trace *t, const char *traceparent, int nparents, const char *tracestate)
{
	memset(t, 0, sizeof(*t));
	if (nparents == 1 &&
	    trace_parse_parent(traceparent, t->trace_id, t->parent_id, &t->flags) == 0) {
		t->flags &= TRACE_SAMPLED; /* the other bits are undefined in version 00 */
		if (tracestate != NULL && trace_state_valid(tracestate, strlen(tracestate)))
			memcpy(t->tracestate, tracestate, strlen(tracestate) + 1);
	} else {
		t->parent_id[0] = '\0';
		t->flags = TRACE_SAMPLED;
		if (random_hex(t->trace_id, TRACE_ID_LEN / 2) < 0)
			goto fail;
	}
	if (random_hex(t->span_id, TRACE_SPAN_LEN / 2) < 0)
		goto fail;
	trace_format(t->traceparent, t->trace_id, t->span_id, t->flags);
	return 0;
fail:
	memset(t, 0, sizeof(*t));
	return -1;
}
