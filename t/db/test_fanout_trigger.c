/*
 * test_fanout_trigger.c - the deliveries the trigger outbox_deliveries
 * writes with each event (sql/020_endpoints.sql), and the filter it
 * matches types with, idemflow_type_matches (sql/023_type_matches.sql).
 *
 * Proves: the function gives the answers of its first definition on a
 * table of filters and types (NULL filter, exact names, "prefix.*" globs
 * at one and two levels, look-alikes that are no glob, NULL elements and
 * types, an empty filter); and one event of a tenant with five endpoints
 * gets exactly one delivery per matching one, pending, or skipped for the
 * disabled one, none for the endpoint whose filter does not pass its type
 * nor for another tenant's endpoint; an operational event
 * (endpoint.disabled) gets none.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tsql.h"

/* filter (an array literal or NULL), type (or NULL), the answer ("t",
 * "f" or NULL): the answers of 020's SQL definition. */
static const struct {
	const char *filter, *type, *want;
} cases[] = {
	{ NULL, "a.b", "t" },
	{ "{a.*}", "a.b", "t" },
	{ "{a.*}", "ab.c", "f" },
	{ "{a.b.*}", "a.b.c", "t" },
	{ "{a.b.*}", "a.c", "f" },
	{ "{a.*}", "a", "f" },
	{ "{x,a.b.c.*}", "a.b.c", "f" },
	{ "{x,a.b.*}", "a.b.c.d", "t" },
	{ "{a.b}", "a.b", "t" },
	{ "{a+.*}", "a+.x", "t" },
	{ "{a..*}", "a.x", "f" },
	{ "{*}", "a.b", "f" },
	{ "{.*}", "a.b", "f" },
	{ "{.*}", ".x", "t" },
	{ "{step.*}", "step.timed_out", "t" },
	{ "{workflow.created,invoice.paid}", "workflow.created", "t" },
	{ "{workflow.created,invoice.paid}", "workflow.completed", "f" },
	{ "{a.*}", "a.", "t" },
	{ "{a.*}", "a.b.", "t" },
	{ "{NULL}", "a.b", NULL },
	{ "{NULL,a.b}", "a.b", "t" },
	{ "{a.*,NULL}", "b.c", NULL },
	{ "{a.b}", NULL, NULL },
	{ NULL, NULL, "t" },
	{ "{}", "a", "f" },
	{ "{}", NULL, "f" },
};

/* A parameter that stands for NULL: the helpers' lists end at NULL. */
#define SQL_NULL "-"
static const char *nz(const char *s)
{
	return s != NULL ? s : SQL_NULL;
}

Test(type_matches, answers)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *got =
		    tstack_text("SELECT idemflow_type_matches(NULLIF($1, '" SQL_NULL "')::text[],"
		                " NULLIF($2, '" SQL_NULL "'))",
		                nz(cases[i].filter), nz(cases[i].type));

		cr_expect(
		    (got == NULL && cases[i].want == NULL) ||
		        (got != NULL && cases[i].want != NULL && strcmp(got, cases[i].want) == 0),
		    "idemflow_type_matches(%s, %s) = %s, expected %s",
		    cases[i].filter ? cases[i].filter : "NULL",
		    cases[i].type ? cases[i].type : "NULL", got ? got : "NULL",
		    cases[i].want ? cases[i].want : "NULL");
		free(got);
	}
}

#define SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

static char *tenant(const char *name)
{
	return tstack_text("INSERT INTO tenants (name) VALUES ($1) RETURNING id", name);
}

static void endpoint(const char *tenant_id, const char *id, const char *filter,
                     const char *disabled)
{
	tstack_exec(tstack_db(),
	            "INSERT INTO endpoints (tenant_id, id, url, filter_types, secret, disabled,"
	            " disabled_reason)"
	            " VALUES ($1, $2, 'http://127.0.0.1:9/hook', NULLIF($3, '" SQL_NULL
	            "')::text[],"
	            " '" SECRET "',"
	            " $4::boolean, CASE WHEN $4::boolean THEN 'manual' END)",
	            tenant_id, id, nz(filter), disabled);
}

static void event(const char *tenant_id, const char *event_id, const char *workflow_id,
                  const char *seq, const char *type)
{
	tstack_exec(tstack_db(),
	            "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	            " VALUES ($1, $2, $3, $4::integer, $5, '{}')",
	            event_id, tenant_id, workflow_id, seq, type);
}

#define E_ALL      "00000000-0000-4000-8000-00000000000a"
#define E_GLOB     "00000000-0000-4000-8000-00000000000b"
#define E_EXACT    "00000000-0000-4000-8000-00000000000c"
#define E_OTHER    "00000000-0000-4000-8000-00000000000d"
#define E_DISABLED "00000000-0000-4000-8000-00000000000e"
#define E_FOREIGN  "00000000-0000-4000-8000-00000000000f"
#define WF         "00000000-0000-4000-8000-000000000100"

Test(trigger, one_delivery_per_matching_endpoint)
{
	char *t = tenant("fanout-trigger"), *u = tenant("fanout-trigger-other");
	char *states;

	endpoint(t, E_ALL, NULL, "false");
	endpoint(t, E_GLOB, "{workflow.*}", "false");
	endpoint(t, E_EXACT, "{invoice.paid,workflow.created}", "false");
	endpoint(t, E_OTHER, "{invoice.*}", "false");
	endpoint(t, E_DISABLED, "{workflow.created}", "true");
	endpoint(u, E_FOREIGN, NULL, "false");

	event(t, "fanout-trigger-1", WF, "1", "workflow.created");
	states = tstack_text("SELECT string_agg(right(endpoint_id::text, 1) || '=' || state, ','"
	                     " ORDER BY endpoint_id)"
	                     " FROM deliveries d JOIN outbox o ON o.id = d.outbox_id"
	                     " WHERE o.event_id = 'fanout-trigger-1' AND d.tenant_id = o.tenant_id"
	                     " AND d.workflow_id = o.workflow_id AND d.seq = o.seq");
	cr_assert_str_eq(states, "a=pending,b=pending,c=pending,e=skipped");
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE tenant_id = $1", u), 0);

	/* An operational event of an endpoint: the operator's only. */
	event(t, "fanout-trigger-2", E_OTHER, "1", "endpoint.disabled");
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE tenant_id = $1", t), 4);
	free(states);
	free(t);
	free(u);
}
