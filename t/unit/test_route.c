/*
 * Unit tests of routing: paths matched once against the route templates
 * (route_match, the label of the metrics and the log line), and the small
 * parsers behind the routes of running workflows: query parameters
 * (http_query_param) and job keys (jobs_parse_key).
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "core/ids.h"
#include "server/http.h"
#include "server/jobs.h"
#include "server/route.h"

Test(route, paths_match_templates_so_the_label_stays_bounded)
{
	cr_assert_str_eq(route_name(route_match("/v1/workflows", NULL, NULL)), "/v1/workflows");
	cr_assert_str_eq(route_name(route_match("/v1/workflows/0190-abc", NULL, NULL)),
	                 "/v1/workflows/{id}");
	cr_assert_str_eq(route_name(route_match("/v1/workflows/", NULL, NULL)), "other");
	cr_assert_str_eq(route_name(route_match("/v1/workflows/a/b", NULL, NULL)), "other");
	cr_assert_str_eq(route_name(route_match("/healthz", NULL, NULL)), "/healthz");
	cr_assert_str_eq(route_name(route_match("/readyz", NULL, NULL)), "/readyz");
	cr_assert_str_eq(route_name(route_match("/metrics", NULL, NULL)), "/metrics");
	cr_assert_str_eq(route_name(route_match("/metrics/", NULL, NULL)), "other");
	cr_assert_str_eq(route_name(route_match("", NULL, NULL)), "other");
}

Test(route, the_routes_of_running_workflows_are_templates_too)
{
	static const char *const cases[][2] = {
		{ "/v1/workflows/0190-abc/events", "/v1/workflows/{id}/events" },
		{ "/v1/workflows/0190-abc/transitions", "/v1/workflows/{id}/transitions" },
		{ "/v1/workflows/0190-abc/messages", "/v1/workflows/{id}/messages" },
		{ "/v1/workflows/0190-abc/messages/x", "other" },
		{ "/v1/workflows//events", "other" },
		{ "/v1/jobs/activate", "/v1/jobs/activate" },
		{ "/v1/jobs/0190-abc.s1/complete", "/v1/jobs/{key}/complete" },
		{ "/v1/jobs/0190-abc.s1/fail", "/v1/jobs/{key}/fail" },
		{ "/v1/jobs/0190-abc.s1", "other" },
		{ "/v1/jobs/", "other" },
		{ "/v1/messages", "/v1/messages" },
		{ "/v1/messages/x", "other" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		cr_assert_str_eq(route_name(route_match(cases[i][0], NULL, NULL)), cases[i][1],
		                 "%s", cases[i][0]);
}

Test(route, the_id_segment_is_handed_to_the_router_whatever_its_length)
{
	const char *arg = NULL;
	size_t n = 0;
	char path[300];

	cr_assert_eq(route_match("/v1/jobs/0190-abc.s1/fail", &arg, &n), ROUTE_JOB_FAIL);
	cr_assert_eq(n, 11);
	cr_assert_eq(strncmp(arg, "0190-abc.s1/", 12), 0);
	arg = NULL;
	cr_assert_eq(route_match("/healthz", &arg, &n), ROUTE_HEALTHZ);
	cr_assert_null(arg, "no template segment, nothing set");
	/* Too long for an id: the router answers 404, still under the template. */
	snprintf(path, sizeof(path), "/v1/workflows/%0200d/events", 7);
	cr_assert_eq(route_match(path, &arg, &n), ROUTE_WF_EVENTS);
	cr_assert_eq(n, 200);
	cr_assert_eq(route_match(NULL, &arg, &n), ROUTE_OTHER);
	cr_assert_str_eq(route_name(ROUTE__COUNT), "other");
}

Test(query, finds_the_first_value_and_decodes_it)
{
	char v[32];

	cr_assert_eq(http_query_param("state=running&type=a%20b+c", "type", v, sizeof(v)), 1);
	cr_assert_str_eq(v, "a b c");
	cr_assert_eq(http_query_param("state=running&state=failed", "state", v, sizeof(v)), 1);
	cr_assert_str_eq(v, "running");
	cr_assert_eq(http_query_param("limit=", "limit", v, sizeof(v)), 1);
	cr_assert_str_eq(v, "");
}

Test(query, names_match_whole_not_as_prefixes_or_suffixes)
{
	char v[32];

	cr_assert_eq(http_query_param("xstate=1&states=2", "state", v, sizeof(v)), 0);
	cr_assert_eq(http_query_param("", "state", v, sizeof(v)), 0);
	cr_assert_eq(http_query_param("state", "state", v, sizeof(v)), 0);
}

Test(query, refuses_bad_escapes_nul_and_values_too_long)
{
	char v[4];

	cr_assert_eq(http_query_param("a=%zz", "a", v, sizeof(v)), -1);
	cr_assert_eq(http_query_param("a=%4", "a", v, sizeof(v)), -1);
	cr_assert_eq(http_query_param("a=%00", "a", v, sizeof(v)), -1);
	cr_assert_eq(http_query_param("a=abcd", "a", v, sizeof(v)), -1);
	cr_assert_eq(http_query_param("a=abc", "a", v, sizeof(v)), 1);
	cr_assert_str_eq(v, "abc");
}

Test(job_key, splits_a_workflow_id_and_a_step)
{
	const char *k = "01a22825-40a8-7132-bb6f-0624710e4210.s12";
	char wf[IDS_UUID_LEN + 1];
	int step = 0;

	cr_assert_eq(jobs_parse_key(k, strlen(k), wf, &step), 0);
	cr_assert_str_eq(wf, "01a22825-40a8-7132-bb6f-0624710e4210");
	cr_assert_eq(step, 12);
}

Test(job_key, a_compensating_jobs_key_is_its_steps_negated)
{
	const char *k = "01a22825-40a8-7132-bb6f-0624710e4210.c7";
	char wf[IDS_UUID_LEN + 1];
	int step = 0;

	cr_assert_eq(jobs_parse_key(k, strlen(k), wf, &step), 0);
	cr_assert_str_eq(wf, "01a22825-40a8-7132-bb6f-0624710e4210");
	cr_assert_eq(step, -7);
}

Test(job_key, refuses_anything_else)
{
	static const char *const bad[] = {
		"",
		"nonsense",
		"01a22825-40a8-7132-bb6f-0624710e4210",
		"01a22825-40a8-7132-bb6f-0624710e4210.s",
		"01a22825-40a8-7132-bb6f-0624710e4210.s0",
		"01a22825-40a8-7132-bb6f-0624710e4210.s01",
		"01a22825-40a8-7132-bb6f-0624710e4210.s33",
		"01a22825-40a8-7132-bb6f-0624710e4210.s1x",
		"01a22825-40a8-7132-bb6f-0624710e4210.c0",
		"01a22825-40a8-7132-bb6f-0624710e4210.c33",
		"01a22825-40a8-7132-bb6f-0624710e4210.c-1",
		"01a22825-40a8-7132-bb6f-0624710e4210.j1",
		"01a22825-40a8-7132-bb6f-0624710e4210:s1",
		"zza22825-40a8-7132-bb6f-0624710e4210.s1",
	};
	char wf[IDS_UUID_LEN + 1];
	int step;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(jobs_parse_key(bad[i], strlen(bad[i]), wf, &step), -1, "%s", bad[i]);
}

Test(route, the_contract_has_a_route_of_its_own)
{
	cr_assert_eq(route_match("/v1/openapi.json", NULL, NULL), ROUTE_OPENAPI);
	cr_assert_str_eq(route_name(ROUTE_OPENAPI), "/v1/openapi.json");
	cr_assert_not(route_keyed(ROUTE_OPENAPI));
	cr_assert_str_eq(route_name(route_match("/v1/openapi.yaml", NULL, NULL)), "other");
	cr_assert_str_eq(route_name(route_match("/v1/openapi.json/", NULL, NULL)), "other");
}

Test(route, a_tenants_endpoints_have_routes_of_their_own)
{
	static const char *const cases[][2] = {
		{ "/v1/endpoints", "/v1/endpoints" },
		{ "/v1/endpoints/0190-abc", "/v1/endpoints/{id}" },
		{ "/v1/endpoints/0190-abc/secret", "/v1/endpoints/{id}/secret" },
		{ "/v1/endpoints/0190-abc/secret/rotate", "/v1/endpoints/{id}/secret/rotate" },
		{ "/v1/endpoints/0190-abc/secret/revoke", "/v1/endpoints/{id}/secret/revoke" },
		{ "/v1/endpoints/", "other" },
		{ "/v1/endpoints/a/secret/", "other" },
		{ "/v1/endpoints/a/secret/renew", "other" },
	};
	const char *arg = NULL;
	size_t n = 0;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		cr_assert_str_eq(route_name(route_match(cases[i][0], NULL, NULL)), cases[i][1],
		                 "%s", cases[i][0]);
	cr_assert_eq(route_match("/v1/endpoints/0190-abc/secret/rotate", &arg, &n),
	             ROUTE_ENDPOINT_ROTATE);
	cr_assert_eq(n, 8);
	cr_assert(strncmp(arg, "0190-abc", n) == 0);
	/* Keyed: the commands' routes count their keys in the metrics. */
	cr_assert(route_keyed(ROUTE_ENDPOINTS));
	cr_assert(route_keyed(ROUTE_ENDPOINT));
	cr_assert(route_keyed(ROUTE_ENDPOINT_ROTATE));
	cr_assert(route_keyed(ROUTE_ENDPOINT_REVOKE));
	cr_assert_not(route_keyed(ROUTE_ENDPOINT_SECRET));
}
