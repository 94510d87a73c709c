/*
 * Unit tests of the small parsers behind the routes of running workflows:
 * query parameters (http_query_param) and job keys (jobs_parse_key).
 */
#include <string.h>

#include <criterion/criterion.h>

#include "core/ids.h"
#include "server/http.h"
#include "server/jobs.h"

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
	    "01a22825-40a8-7132-bb6f-0624710e4210.j1",
	    "01a22825-40a8-7132-bb6f-0624710e4210:s1",
	    "zza22825-40a8-7132-bb6f-0624710e4210.s1",
	};
	char wf[IDS_UUID_LEN + 1];
	int step;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(jobs_parse_key(bad[i], strlen(bad[i]), wf, &step), -1, "%s", bad[i]);
}
