/* test_problem.c - RFC 9457 problem details bodies. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <string.h>

#include "core/problem.h"

Test(problem, body_has_every_member_with_exact_bytes)
{
	struct buf b = BUF_INIT;

	problem_write(&b, P_KEY_REUSED, "key \"k\" reused", "/v1/workflows", "abc123",
	              "idempotency_key", "k");
	cr_assert_str_eq(
	    b.data, "{\"type\":\"https://idemflow.example/problems/"
	            "idempotency-key-reused\",\"title\":\"Idempotency-Key "
	            "Reused\",\"status\":409,\"detail\":\"key \\\"k\\\" reused\",\"instance\":\"/"
	            "v1/workflows\",\"request_id\":\"abc123\",\"idempotency_key\":\"k\"}");
	buf_free(&b);
}

Test(problem, every_kind_is_valid_json_with_its_status)
{
	for (int k = 0; k < P__COUNT; k++) {
		struct buf b = BUF_INIT;
		struct json_object *v, *st, *ty;

		problem_write(&b, (enum problem_kind)k, "d", "/p", "r", NULL, NULL);
		v = json_tokener_parse(b.data);
		cr_assert_not_null(v, "kind %d: %s", k, b.data);
		cr_assert(json_object_object_get_ex(v, "status", &st));
		cr_assert_eq(json_object_get_int(st), problem_def((enum problem_kind)k)->status);
		cr_assert(json_object_object_get_ex(v, "type", &ty));
		cr_assert_eq(
		    strncmp(json_object_get_string(ty), "https://idemflow.example/problems/", 34),
		    0);
		cr_assert(json_object_object_get_ex(v, "title", NULL));
		json_object_put(v);
		buf_free(&b);
	}
}

Test(problem, hostile_values_still_make_valid_json)
{
	struct buf b = BUF_INIT;
	struct json_object *v, *inst;

	problem_write(&b, P_NOT_FOUND, NULL, "/v1/\xff\x01\"x", "", NULL, NULL);
	v = json_tokener_parse(b.data);
	cr_assert_not_null(v, "%s", b.data);
	cr_assert(json_object_object_get_ex(v, "instance", &inst));
	cr_assert_str_eq(json_object_get_string(inst), "/v1/??\"x");
	cr_assert_not(json_object_object_get_ex(v, "detail", NULL), "NULL detail is omitted");
	json_object_put(v);
	buf_free(&b);
}

Test(problem, titles_are_rfc9110_reason_phrases_where_they_name_one)
{
	cr_assert_str_eq(problem_def(P_BODY_TOO_LARGE)->title, "Content Too Large");
	cr_assert_eq(problem_def(P_BODY_TOO_LARGE)->status, 413);
}

Test(problem, the_status_of_a_reused_key_is_configured)
{
	struct buf b = BUF_INIT;

	cr_assert_eq(problem_def(P_KEY_REUSED)->status, 409, "the default");
	problem_configure(422, NULL);
	cr_assert_eq(problem_def(P_KEY_REUSED)->status, 422);
	cr_assert_eq(problem_def(P_KEY_IN_FLIGHT)->status, 409, "in flight stays 409");
	problem_write(&b, P_KEY_REUSED, NULL, NULL, NULL, NULL, NULL);
	cr_assert_str_eq(b.data, "{\"type\":\"https://idemflow.example/problems/"
	                         "idempotency-key-reused\",\"title\":"
	                         "\"Idempotency-Key Reused\",\"status\":422}");
	buf_free(&b);
}

Test(problem, types_are_absolute_under_the_configured_base)
{
	struct buf b = BUF_INIT;

	cr_assert_str_eq(problem_base_uri(), "https://idemflow.example/problems/", "the default");
	problem_configure(409, "https://docs.example.com/idemflow/api.html#");
	problem_write(&b, P_INVALID_KEY, NULL, NULL, NULL, NULL, NULL);
	cr_assert_str_eq(b.data, "{\"type\":\"https://docs.example.com/idemflow/api.html#invalid-"
	                         "idempotency-key\",\"title\":\"Invalid Idempotency-Key\","
	                         "\"status\":400}");
	buf_free(&b);
}
