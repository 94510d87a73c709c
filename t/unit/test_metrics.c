/* test_metrics.c - the allowlist, the token, and the exposition of counters
 * summed over processes, by the route the router matched. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server/metrics.h"
#include "server/ops.h"

Test(metrics, allowlist_matches_addresses_networks_and_mapped_ipv4)
{
	const char *list = "127.0.0.1, ::1,10.1.0.0/16,fd00::/8";
	struct err e;

	cr_assert_eq(metrics_allow_match(list, "127.0.0.1", &e), 1);
	cr_assert_eq(metrics_allow_match(list, "::1", &e), 1);
	cr_assert_eq(metrics_allow_match(list, "10.1.255.7", &e), 1);
	cr_assert_eq(metrics_allow_match(list, "10.2.0.1", &e), 0);
	cr_assert_eq(metrics_allow_match(list, "fdab::5", &e), 1);
	cr_assert_eq(metrics_allow_match(list, "fe80::1", &e), 0);
	cr_assert_eq(metrics_allow_match(list, "127.0.0.2", &e), 0);
	/* A dual-stack socket reports IPv4 clients this way. */
	cr_assert_eq(metrics_allow_match(list, "::ffff:127.0.0.1", &e), 1);
	cr_assert_eq(metrics_allow_match(list, "", &e), 0);
	cr_assert_eq(metrics_allow_match(list, "unix:", &e), 0);
	cr_assert_eq(metrics_allow_match("", "127.0.0.1", &e), 0, "an empty list allows no one");
	cr_assert_eq(metrics_allow_match("0.0.0.0/0", "192.0.2.1", &e), 1);
	cr_assert_eq(metrics_allow_match("10.1.2.3/31", "10.1.2.2", &e), 1);
	cr_assert_eq(metrics_allow_match("10.1.2.3/31", "10.1.2.4", &e), 0);
}

Test(metrics, a_bad_allowlist_entry_is_an_error_naming_it)
{
	struct err e;

	cr_assert_eq(metrics_allow_match("127.0.0.1,localhost", NULL, &e), -1);
	cr_assert_str_eq(e.msg, "metrics_allow: \"localhost\" is not an IPv4 or IPv6 address");
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_eq(metrics_allow_match("10.0.0.0/33", "10.0.0.1", &e), -1);
	cr_assert_str_eq(e.msg, "metrics_allow: bad prefix length \"/33\" for 10.0.0.0 (0 to 32)");
	cr_assert_eq(metrics_allow_match("::/x", NULL, &e), -1);
	cr_assert_str_eq(e.msg, "metrics_allow: bad prefix length \"/x\" for :: (0 to 128)");
	/* Wherever the bad entry is, even after a match. */
	cr_assert_eq(metrics_allow_match("127.0.0.1,1.2.3.4 5.6.7.8", "127.0.0.1", &e), -1);
	cr_assert_eq(metrics_allow_match("127.0.0.1,::1", NULL, &e), 0, "the default parses");
}

Test(metrics, only_the_metrics_token_opens_and_never_an_empty_one)
{
	cr_assert(ops_metrics_token_match("s3cret", "Bearer s3cret"));
	cr_assert(ops_metrics_token_match("s3cret", "bearer   s3cret"));
	cr_assert_not(ops_metrics_token_match("s3cret", "Bearer s3cre"));
	cr_assert_not(ops_metrics_token_match("s3cret", "Bearer s3cretX"));
	cr_assert_not(ops_metrics_token_match("s3cret", "Basic s3cret"));
	cr_assert_not(ops_metrics_token_match("s3cret", NULL));
	cr_assert_not(ops_metrics_token_match("", "Bearer "));
	cr_assert_not(ops_metrics_token_match("", NULL));
}

static int has_line(const char *text, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
		if ((p == text || p[-1] == '\n') && p[n] == '\n')
			return 1;
	return 0;
}

#define EXPECT_LINE(text, line)                                                                    \
	cr_assert(has_line((text), (line)), "no line \"%s\" in:\n%s", (line), (text))

Test(metrics, counters_from_every_process_are_summed_and_histograms_are_cumulative)
{
	struct buf out = BUF_INIT;
	struct err e;
	pid_t pid;
	int status;

	cr_assert_eq(metrics_init(&e), 0, "%s", e.msg);
	metrics_use_slot(0);
	metrics_request(ROUTE_WORKFLOWS, 201, IDEM_CREATED, 0.004, 0);
	metrics_request(ROUTE_WORKFLOWS, 201, IDEM_REPLAYED, 0.0005, 0);
	metrics_request(ROUTE_WORKFLOWS, 409, IDEM_CONFLICT, 0.002, 2);
	/* Another process in another slot, as a worker would be. */
	fflush(NULL);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		metrics_use_slot(1);
		metrics_request(ROUTE_WORKFLOWS, 409, IDEM_IN_FLIGHT, 5.0, 1);
		metrics_request(ROUTE_WORKFLOWS, 201, IDEM_REPLAYED, 30.0, 1);
		metrics_request(ROUTE_WORKFLOW, 404, IDEM_NONE, 0.0015, 1);
		metrics_request(ROUTE_OTHER, 418, IDEM_NONE, 0.001, 1);
		_exit(0);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* Only the growth of a worker's reconnect count is added. */
	metrics_request(ROUTE_HEALTHZ, 204, IDEM_NONE, 0.0001, 2);
	metrics_request(ROUTE_HEALTHZ, 204, IDEM_NONE, 0.0001, 3);
	/* A successor in slot 0 counts from its own zero. */
	metrics_use_slot(0);
	metrics_request(ROUTE_HEALTHZ, 204, IDEM_NONE, 0.0001, 1);
	metrics_set_workers(4);
	metrics_worker_restarted();
	metrics_worker_restarted();

	struct metrics_outbox ob = {
		.pending = 7, .oldest_pending_s = 61.5, .dead = 2, .incidents = 3
	};
	metrics_render(&out, &ob);
	cr_assert_not(out.oom);
	EXPECT_LINE(out.data, "# TYPE idemflow_requests_total counter");
	EXPECT_LINE(out.data, "idemflow_requests_total{route=\"/v1/workflows\",status=\"201\"} 3");
	EXPECT_LINE(out.data, "idemflow_requests_total{route=\"/v1/workflows\",status=\"409\"} 2");
	EXPECT_LINE(out.data,
	            "idemflow_requests_total{route=\"/v1/workflows/{id}\",status=\"404\"} 1");
	EXPECT_LINE(out.data, "idemflow_requests_total{route=\"/healthz\",status=\"204\"} 3");
	EXPECT_LINE(out.data, "idemflow_requests_total{route=\"other\",status=\"other\"} 1");
	cr_assert_null(strstr(out.data, "status=\"500\""), "statuses never seen are left out");

	const char *hist =
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"0.001\"} 1\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"0.0025\"} 2\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"0.005\"} 3\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"0.01\"} 3\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"0.025\"} 3\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"0.05\"} 3\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"0.1\"} 3\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"0.25\"} 3\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"0.5\"} 3\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"1\"} 3\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"2.5\"} 3\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"5\"} 4\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"10\"} 4\n"
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"+Inf\"} 5\n"
	    "idemflow_request_duration_seconds_sum{route=\"/v1/workflows\"} 35.006500\n"
	    "idemflow_request_duration_seconds_count{route=\"/v1/workflows\"} 5\n";
	cr_assert_not_null(strstr(out.data, hist), "histogram block, want:\n%s\nin:\n%s", hist,
	                   out.data);
	EXPECT_LINE(out.data, "# TYPE idemflow_request_duration_seconds histogram");

	EXPECT_LINE(out.data, "idemflow_idempotency_created_total{route=\"/v1/workflows\"} 1");
	EXPECT_LINE(out.data, "idemflow_idempotency_replays_total{route=\"/v1/workflows\"} 2");
	EXPECT_LINE(
	    out.data,
	    "idemflow_idempotency_conflicts_total{route=\"/v1/workflows\",reason=\"mismatch\"} 1");
	EXPECT_LINE(
	    out.data,
	    "idemflow_idempotency_conflicts_total{route=\"/v1/workflows\",reason=\"in_flight\"} 1");
	cr_assert_null(strstr(out.data, "idemflow_idempotency_replays_total{route=\"/healthz\"}"),
	               "idempotency series only for keyed routes");
	/* 3 from slot 0's first worker, 1 from slot 1, 1 from the successor. */
	EXPECT_LINE(out.data, "idemflow_db_reconnects_total 5");
	EXPECT_LINE(out.data, "idemflow_workers 4");
	EXPECT_LINE(out.data, "idemflow_worker_restarts_total 2");
	EXPECT_LINE(out.data, "idemflow_db_up 1");
	EXPECT_LINE(out.data, "idemflow_outbox_pending 7");
	EXPECT_LINE(out.data, "idemflow_outbox_dead 2");
	EXPECT_LINE(out.data, "idemflow_outbox_oldest_pending_age_seconds 61.500");
	EXPECT_LINE(out.data, "# TYPE idemflow_workflows_incident gauge");
	EXPECT_LINE(out.data, "idemflow_workflows_incident 3");

	/* Without the database: the counters still, the gauges not. */
	buf_reset(&out);
	metrics_render(&out, NULL);
	EXPECT_LINE(out.data, "idemflow_db_up 0");
	EXPECT_LINE(out.data, "idemflow_workers 4");
	cr_assert_null(strstr(out.data, "idemflow_outbox_"), "%s", out.data);
	cr_assert_null(strstr(out.data, "idemflow_workflows_incident"), "%s", out.data);
	buf_free(&out);
}

Test(metrics, a_202_has_its_own_status_label)
{
	struct buf out = BUF_INIT;
	struct err e;

	cr_assert_eq(metrics_init(&e), 0, "%s", e.msg);
	metrics_use_slot(0);
	metrics_request(ROUTE_WF_MESSAGES, 202, IDEM_CREATED, 0.001, 0);
	metrics_request(ROUTE_MESSAGES, 202, IDEM_CREATED, 0.001, 0);
	metrics_request(ROUTE_MESSAGES, 202, IDEM_REPLAYED, 0.001, 0);
	metrics_render(&out, NULL);
	EXPECT_LINE(
	    out.data,
	    "idemflow_requests_total{route=\"/v1/workflows/{id}/messages\",status=\"202\"} 1");
	EXPECT_LINE(out.data, "idemflow_requests_total{route=\"/v1/messages\",status=\"202\"} 2");
	cr_assert_null(strstr(out.data, "status=\"other\""), "%s", out.data);
	buf_free(&out);
}

Test(metrics, job_completions_count_the_skipped_ones_by_reason)
{
	struct buf out = BUF_INIT;
	struct err e;

	cr_assert_eq(metrics_init(&e), 0, "%s", e.msg);
	metrics_use_slot(0);
	metrics_render(&out, NULL);
	EXPECT_LINE(out.data, "# TYPE idemflow_job_completions_total counter");
	EXPECT_LINE(out.data, "idemflow_job_completions_total 0");
	EXPECT_LINE(out.data, "idemflow_job_completions_skipped_total{reason=\"lease_expired\"} 0");
	buf_reset(&out);
	for (int i = 0; i < 7; i++)
		metrics_job_completion(MC_COMPLETED);
	metrics_job_completion(MC_SKIPPED_LEASE_EXPIRED);
	metrics_job_completion(MC_SKIPPED_NOT_LEASE_HOLDER);
	metrics_job_completion(MC_SKIPPED_NOT_LEASE_HOLDER);
	metrics_use_slot(5);
	metrics_job_completion(MC_SKIPPED_NOT_ACTIVE);
	metrics_job_completion(MC_COMPLETED);
	metrics_render(&out, NULL);
	EXPECT_LINE(out.data, "idemflow_job_completions_total 12");
	EXPECT_LINE(out.data, "idemflow_job_completions_skipped_total{reason=\"lease_expired\"} 1");
	EXPECT_LINE(out.data,
	            "idemflow_job_completions_skipped_total{reason=\"not_lease_holder\"} 2");
	EXPECT_LINE(out.data, "idemflow_job_completions_skipped_total{reason=\"not_active\"} 1");
	buf_free(&out);
}

Test(metrics, every_line_is_a_comment_or_a_sample_with_one_value)
{
	struct buf out = BUF_INIT;
	struct err e;
	struct metrics_outbox ob = { 0 };
	char *save = NULL;

	cr_assert_eq(metrics_init(&e), 0);
	metrics_request(ROUTE_READYZ, 503, IDEM_NONE, 0.01, 0);
	metrics_render(&out, &ob);
	cr_assert_eq(out.data[out.len - 1], '\n', "the exposition ends with a newline");
	for (char *l = strtok_r(out.data, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		char name[200];
		double v;
		int n = 0;
		if (strncmp(l, "# HELP idemflow_", 16) == 0 ||
		    strncmp(l, "# TYPE idemflow_", 16) == 0)
			continue;
		cr_assert_eq(sscanf(l, "%199[a-z_]%n", name, &n), 1, "bad line: %s", l);
		cr_assert_eq(strncmp(name, "idemflow_", 9), 0, "%s", l);
		const char *rest = l + n;
		if (*rest == '{')
			rest = strrchr(rest, '}') + 1;
		cr_assert_eq(sscanf(rest, " %lf%n", &v, &n), 1, "no value: %s", l);
		cr_assert_eq(rest[n], '\0', "trailing text: %s", l);
	}
	buf_free(&out);
}
