/* test_trace.c - W3C traceparent and tracestate: what is continued, what
 * is ignored (and a new trace started), and what is passed on. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/trace.h"

#define TID  "4bf92f3577b34da6a3ce929d0e0e4736"
#define PID  "00f067aa0ba902b7"
#define GOOD "00-" TID "-" PID "-01"

static int parses(const char *s)
{
	char tid[TRACE_ID_LEN + 1], pid[TRACE_SPAN_LEN + 1];
	uint8_t flags;

	return trace_parse_parent(s, tid, pid, &flags) == 0;
}

Test(trace, a_version_00_traceparent_is_read_field_by_field)
{
	char tid[TRACE_ID_LEN + 1], pid[TRACE_SPAN_LEN + 1];
	uint8_t flags = 0xee;

	cr_assert_eq(trace_parse_parent(GOOD, tid, pid, &flags), 0);
	cr_assert_str_eq(tid, TID);
	cr_assert_str_eq(pid, PID);
	cr_assert_eq(flags, 0x01);
	cr_assert_eq(trace_parse_parent("00-" TID "-" PID "-00", tid, pid, &flags), 0);
	cr_assert_eq(flags, 0x00);
}

/* Each way a version 00 value can be malformed. */
Test(trace, every_malformed_form_is_refused)
{
	static const char *const bad[] = {
		"",
		"00",
		"00-" TID "-" PID "-0",        /* short flags */
		"00-" TID "-" PID "-011",      /* long flags */
		"00-" TID "-" PID "-01-",      /* version 00 with more after it */
		"00-" TID "-" PID "-01-extra", /* the same */
		"00-" TID "-" PID "-01 ",      /* a trailing space */
		" 00-" TID "-" PID "-01",      /* a leading space */
		"00_" TID "-" PID "-01",       /* wrong separators */
		"00-" TID "_" PID "-01",
		"00-" TID "-" PID "_01",
		"00-4bf92f3577b34da6a3ce929d0e0e473-" PID "-01",  /* 31-digit trace-id */
		"00-4bf92f3577b34da6a3ce929d0e0e47366-" PID "-0", /* 33 digits, same length */
		"00-" TID "-00f067aa0ba902b-01",                  /* 15-digit parent-id */
		"00-" TID "-00f067aa0ba902bg-01",                 /* not hex */
		"00-4bf92f3577b34da6a3ce929d0e0e473z-" PID "-01",
		"0g-" TID "-" PID "-01", /* version not hex */
		"00-" TID "-" PID "-0x", /* flags not hex */
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_not(parses(bad[i]), "accepted \"%s\"", bad[i]);
	cr_assert_not(parses(NULL));
}

Test(trace, all_zero_trace_id_or_parent_id_is_invalid)
{
	cr_assert_not(parses("00-00000000000000000000000000000000-" PID "-01"));
	cr_assert_not(parses("00-" TID "-0000000000000000-01"));
}

Test(trace, uppercase_hex_is_invalid)
{
	cr_assert_not(parses("00-4BF92F3577B34DA6A3CE929D0E0E4736-" PID "-01"));
	cr_assert_not(parses("00-" TID "-00F067AA0BA902B7-01"));
	cr_assert_not(parses("00-" TID "-" PID "-0A"));
	cr_assert_not(parses("0A-" TID "-" PID "-01"));
}

Test(trace, version_ff_is_invalid)
{
	cr_assert_not(parses("ff-" TID "-" PID "-01"));
}

/* A later version is read by the forward-compatibility rule: its first
 * four fields as version 00's, anything after them behind a "-". */
Test(trace, a_future_version_with_extra_fields_is_continued)
{
	char tid[TRACE_ID_LEN + 1], pid[TRACE_SPAN_LEN + 1];
	uint8_t flags;

	cr_assert_eq(
	    trace_parse_parent("cc-" TID "-" PID "-01-what-the-future-holds", tid, pid, &flags), 0);
	cr_assert_str_eq(tid, TID);
	cr_assert_str_eq(pid, PID);
	cr_assert_eq(flags, 0x01);
	cr_assert(parses("01-" TID "-" PID "-01"), "exactly 55 characters");
	cr_assert_not(parses("cc-" TID "-" PID "-01.what"), "more, but not behind a dash");
	cr_assert_not(parses("cc-" TID "-" PID "-1"), "shorter than 55");
	cr_assert_not(parses("cc-" TID "-" PID "-0X-more"));
}

Test(trace, a_valid_traceparent_is_continued_with_a_new_span)
{
	struct trace t;

	cr_assert_eq(trace_begin(&t, GOOD, 1, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"), 0);
	cr_assert_str_eq(t.trace_id, TID);
	cr_assert_str_eq(t.parent_id, PID);
	cr_assert_eq(strlen(t.span_id), TRACE_SPAN_LEN);
	cr_assert_str_neq(t.span_id, PID);
	cr_assert_eq(strlen(t.traceparent), TRACE_PARENT_LEN);
	cr_assert_eq(strncmp(t.traceparent, "00-" TID "-", 36), 0);
	cr_assert_str_eq(t.traceparent + 36 + TRACE_SPAN_LEN, "-01");
	cr_assert_eq(strncmp(t.traceparent + 36, t.span_id, TRACE_SPAN_LEN), 0);
	cr_assert_str_eq(t.tracestate, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
}

Test(trace, a_future_version_is_passed_on_as_version_00_with_known_flags_only)
{
	struct trace t;

	cr_assert_eq(trace_begin(&t, "cc-" TID "-" PID "-ff-more", 1, NULL), 0);
	cr_assert_str_eq(t.trace_id, TID);
	cr_assert_eq(strncmp(t.traceparent, "00-" TID "-", 36), 0);
	cr_assert_str_eq(t.traceparent + 52, "-01", "only the sampled flag is defined");
}

Test(trace, an_invalid_or_absent_traceparent_starts_a_new_trace_without_tracestate)
{
	static const char *const ins[] = { NULL, "", "garbage", "ff-" TID "-" PID "-01",
		                           "00-00000000000000000000000000000000-" PID "-01" };
	struct trace t, u;

	for (size_t i = 0; i < sizeof(ins) / sizeof(ins[0]); i++) {
		cr_assert_eq(trace_begin(&t, ins[i], ins[i] ? 1 : 0, "congo=t61rcWkgMzE"), 0);
		cr_assert_eq(strlen(t.trace_id), TRACE_ID_LEN);
		cr_assert_str_neq(t.trace_id, TID);
		cr_assert_str_eq(t.parent_id, "");
		cr_assert_str_eq(t.tracestate, "", "tracestate is not read without a traceparent");
		cr_assert(parses(t.traceparent), "what is passed on is valid: %s", t.traceparent);
		cr_assert_str_eq(t.traceparent + 52, "-01");
	}
	cr_assert_eq(trace_begin(&u, NULL, 0, NULL), 0);
	cr_assert_str_neq(u.trace_id, t.trace_id, "each new trace has an id of its own");
}

Test(trace, two_traceparent_headers_are_none)
{
	struct trace t;

	cr_assert_eq(trace_begin(&t, GOOD, 2, NULL), 0);
	cr_assert_str_neq(t.trace_id, TID);
}

Test(trace, tracestate_members_keys_and_values)
{
	static const char *const good[] = {
		"",
		"congo=t61rcWkgMzE",
		"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
		" rojo=1 ,\tcongo=2\t",
		"rojo=1,,congo=2", /* empty members are allowed */
		"fw529a3039@dt=1",
		"0tenant@sys=a b", /* a value may hold spaces, not end with one */
		"a_-*/9=x",
	};
	static const char *const bad[] = {
		"rojo",                /* no value */
		"rojo=",               /* empty value */
		"Rojo=1",              /* uppercase key */
		"9rojo=1",             /* a simple key starts with a letter */
		"rojo=1,rojo=2",       /* a key twice */
		"rojo=a,b=c=d",        /* '=' in a value */
		"rojo=caf\xc3\xa9",    /* not ASCII */
		"rojo=a\x01",          /* a control character */
		"t@=1",                /* an empty system id */
		"t@9sys=1",            /* a system id starts with a letter */
		"t@abcdefghijklmno=1", /* a 15-character system id */
	};

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		cr_assert(trace_state_valid(good[i], strlen(good[i])), "refused \"%s\"", good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_not(trace_state_valid(bad[i], strlen(bad[i])), "accepted \"%s\"", bad[i]);
}

Test(trace, tracestate_is_bounded_in_members_and_bytes)
{
	char s[2048];
	size_t n = 0;
	struct trace t;

	for (int i = 0; i < TRACE_STATE_MEMBERS; i++)
		n += (size_t)snprintf(s + n, sizeof(s) - n, "%sk%d=v", i ? "," : "", i);
	cr_assert(trace_state_valid(s, n), "32 members");
	n += (size_t)snprintf(s + n, sizeof(s) - n, ",k99=v");
	cr_assert_not(trace_state_valid(s, n), "33 members");

	memset(s, 'v', sizeof(s));
	memcpy(s, "k=", 2);
	s[TRACE_STATE_MAX] = '\0';
	cr_assert_not(trace_state_valid(s, TRACE_STATE_MAX), "a value is at most 256 bytes");
	n = 0;
	for (int i = 0; n < TRACE_STATE_MAX + 1; i++)
		n += (size_t)snprintf(s + n, sizeof(s) - n, "%sk%d=%040d", i ? "," : "", i, i);
	cr_assert_gt(n, TRACE_STATE_MAX);
	cr_assert_not(trace_state_valid(s, n), "%zu bytes", n);
	cr_assert_eq(trace_begin(&t, GOOD, 1, s), 0);
	cr_assert_str_eq(t.trace_id, TID, "a bad tracestate does not cost the trace");
	cr_assert_str_eq(t.tracestate, "");
}

Test(trace, format_writes_version_00)
{
	char out[TRACE_PARENT_LEN + 1];

	trace_format(out, TID, PID, 0x01);
	cr_assert_str_eq(out, GOOD);
}
