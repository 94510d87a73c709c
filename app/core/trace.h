/*
 * trace.h - W3C Trace Context (level 1): reading the traceparent and
 * tracestate a request came with, starting a trace when it came without
 * one, and the traceparent to pass on to the work the request causes.
 *
 * Only version 00 is written. A later version is read as the spec's
 * forward-compatibility rule says (its first four fields, anything after
 * them ignored); version ff and every malformed value are ignored, and a
 * new trace starts: a bad header never fails a request. Randomness comes
 * from ids_random(). No allocation; everything lives in struct trace.
 */
#ifndef IDF_TRACE_H
#define IDF_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#define TRACE_ID_LEN        32  /* hex digits, without NUL */
#define TRACE_SPAN_LEN      16  /* hex digits, without NUL */
#define TRACE_PARENT_LEN    55  /* "00-" id "-" span "-" flags, without NUL */
#define TRACE_STATE_MAX     512 /* bytes of tracestate kept; a longer one is dropped */
#define TRACE_STATE_MEMBERS 32

#define TRACE_SAMPLED 0x01

/* One request's place in a trace. */
struct trace {
	char trace_id[TRACE_ID_LEN + 1];    /* "" only when no randomness was had */
	char parent_id[TRACE_SPAN_LEN + 1]; /* the caller's span, "" when started here */
	char span_id[TRACE_SPAN_LEN + 1];   /* this request's span */
	uint8_t flags;                      /* only TRACE_SAMPLED is kept */
	/* The traceparent to pass on: version 00, trace_id, span_id as the
	 * parent, flags; "" when trace_id is. */
	char traceparent[TRACE_PARENT_LEN + 1];
	/* The caller's tracestate as received (several headers joined with
	 * ","), "" when absent, malformed, too long or the traceparent was not
	 * valid (the spec then forbids reading it). */
	char tracestate[TRACE_STATE_MAX + 1];
};

/*
 * Parse a traceparent value. Returns 0 and fills trace_id (TRACE_ID_LEN + 1
 * bytes), parent_id (TRACE_SPAN_LEN + 1) and *flags, or -1 when the value
 * is not one to continue: NULL, a wrong length, uppercase or non-hex
 * digits, version ff, an all-zero trace-id or parent-id, or version 00
 * with anything after the flags.
 */
int trace_parse_parent(const char *s, char *trace_id, char *parent_id, uint8_t *flags) MUSTCHECK;

/*
 * 1 when s (len bytes) is a tracestate the spec allows and within bounds:
 * at most TRACE_STATE_MAX bytes, at most TRACE_STATE_MEMBERS list members,
 * each key=value with a valid key and value, no key twice; empty members
 * and spaces or tabs around members are allowed. 0 otherwise.
 */
int trace_state_valid(const char *s, size_t len);

/*
 * Begin this request's span: continue the trace of traceparent when it is
 * valid (keeping tracestate, which may be NULL, when that is valid too),
 * else start a new trace (sampled: the request's log line records it).
 * nparents is how many traceparent headers came: more than one is not a
 * traceparent either. A new span id is made in every case. Returns 0, or
 * -1 when no random bytes could be had: t is then empty ("" everywhere).
 */
int trace_begin(struct trace *t, const char *traceparent, int nparents,
                const char *tracestate) MUSTCHECK;

/* Write "00-<trace_id>-<span_id>-<flags>" to out (TRACE_PARENT_LEN + 1
 * bytes). */
void trace_format(char *out, const char *trace_id, const char *span_id, uint8_t flags);

#endif
