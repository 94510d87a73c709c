/*
 * test_audit.c - "idemflow audit" on rows the real server wrote: a clean
 * tenant holds every invariant (exit 0); each invariant broken on purpose
 * (a workflow.created event deleted, a key's workflow deleted, a key left
 * without its answer, a workflow under two keys) is counted exactly and
 * exits 65; the window and outbox_retention bound what is checked; late
 * events, timers and leases are counted and never fail the run; --json has
 * exactly its keys and --textfile writes the gauges (and a failed run's)
 * by rename. Each test works in a tenant of its own, so they run side by
 * side; the one across all tenants reads only its own tenants' lines.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include <criterion/criterion.h>
#include <json-c/json.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"

#define BODY "{\"type\":\"audit\",\"input\":{\"n\":1}}"

TestSuite(audit, .timeout = 120);

static char out[64 * 1024];

/* idemflow audit --tenant t->name --json [a1 ...] (NULL ends the list);
 * expects exit status rc and returns the parsed report. */
static struct json_object *audit_json(const struct tstack_tenant *t, int rc, const char *a1,
                                      const char *a2, const char *a3, const char *a4)
{
	struct json_object *doc;
	int got = tstack_cli(out, sizeof(out), "audit", "--tenant", t->name, "--json", a1, a2, a3,
	                     a4, NULL);

	cr_assert_eq(got, rc, "audit exited %d, expected %d: %s %s", got, rc, out,
	             tstack_cli_stderr());
	doc = json_tokener_parse(out);
	cr_assert_not_null(doc, "not JSON: %s", out);
	return doc;
}

static long num_at(struct json_object *doc, const char *section, const char *name)
{
	struct json_object *s = NULL, *v = NULL;

	cr_assert(json_object_object_get_ex(doc, section, &s), "no \"%s\" in %s", section,
	          json_object_to_json_string(doc));
	cr_assert(json_object_object_get_ex(s, name, &v), "no \"%s\" in %s", name,
	          json_object_to_json_string(s));
	cr_assert(json_object_is_type(v, json_type_int), "%s.%s is not an integer", section, name);
	return (long)json_object_get_int64(v);
}

/* The four invariants' counts, in the report's order. */
static void expect_invariants(struct json_object *doc, long answers_without_workflow,
                              long keys_pointing_nowhere, long several_keys, long no_created)
{
	cr_assert_eq(num_at(doc, "invariants", "answers_without_workflow"),
	             answers_without_workflow);
	cr_assert_eq(num_at(doc, "invariants", "keys_pointing_nowhere"), keys_pointing_nowhere);
	cr_assert_eq(num_at(doc, "invariants", "workflows_with_several_keys"), several_keys);
	cr_assert_eq(num_at(doc, "invariants", "workflows_without_created_event"), no_created);
}

static void expect_checked(struct json_object *doc, long keys, long answers, long workflows)
{
	cr_assert_eq(num_at(doc, "checked", "keys"), keys, "%s", out);
	cr_assert_eq(num_at(doc, "checked", "answers"), answers, "%s", out);
	cr_assert_eq(num_at(doc, "checked", "workflows"), workflows, "%s", out);
}

static void expect_backlog(struct json_object *doc, long pending, long held, long dead, long timers,
                           long jobs)
{
	cr_assert_eq(num_at(doc, "backlog", "events_pending"), pending, "%s", out);
	cr_assert_eq(num_at(doc, "backlog", "events_held"), held, "%s", out);
	cr_assert_eq(num_at(doc, "backlog", "events_dead"), dead, "%s", out);
	cr_assert_eq(num_at(doc, "backlog", "timers_overdue"), timers, "%s", out);
	cr_assert_eq(num_at(doc, "backlog", "jobs_unreaped"), jobs, "%s", out);
}

/* The member names of o, comma-separated, in order. */
static void keys_of(struct json_object *o, char *buf, size_t size)
{
	size_t n = 0;

	buf[0] = '\0';
	json_object_object_foreach(o, k, v)
	{
		(void)v;
		n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? "," : "", k);
	}
}

static char *create(const struct tstack_tenant *t)
{
	return tstack_create(t, BODY);
}

/* The key under which workflow id was created. */
static char *key_of(const struct tstack_tenant *t, const char *id)
{
	char *key = tstack_text("SELECT key FROM idempotency_keys WHERE tenant_id = $1"
	                        "   AND body LIKE '{\"id\":\"' || $2 || '\"%'",
	                        t->id_text, id);

	cr_assert_not_null(key, "no key names %s", id);
	return key;
}

Test(audit, a_clean_tenant_holds_every_invariant)
{
	struct tstack_tenant t;
	struct http_response *r;
	char key[96], path[160], names[512];
	char *a, *b, *c;
	struct json_object *doc, *v;
	int rc;

	tstack_tenant_create(&t, "audit-clean");
	a = create(&t);
	b = create(&t);
	c = create(&t);
	/* A keyed cancel: its answer names the workflow by its path. */
	tstack_key(key, sizeof(key), "cancel");
	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", c);
	r = tstack_post(&t, path, key, "{\"to\":\"cancelled\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	/* A refusal the key keeps (422) is not an answer naming a workflow. */
	tstack_key(key, sizeof(key), "again");
	r = tstack_post(&t, path, key, "{\"to\":\"completed\"}");
	tstack_expect_status(r, 422);
	http_response_free(r);

	doc = audit_json(&t, 0, NULL, NULL, NULL, NULL);
	keys_of(doc, names, sizeof(names));
	cr_assert_str_eq(names, "tenant,now,since,events_since,thresholds,checked,invariants,"
	                        "backlog,tenants_broken,broken,ok,duration_s");
	keys_of(json_object_object_get(doc, "invariants"), names, sizeof(names));
	cr_assert_str_eq(names, "answers_without_workflow,keys_pointing_nowhere,"
	                        "workflows_with_several_keys,workflows_without_created_event");
	keys_of(json_object_object_get(doc, "backlog"), names, sizeof(names));
	cr_assert_str_eq(names,
	                 "events_pending,events_held,events_dead,timers_overdue,jobs_unreaped");
	keys_of(json_object_object_get(doc, "thresholds"), names, sizeof(names));
	cr_assert_str_eq(names, "since_s,pending_after_s,timer_after_s,lease_after_s");
	cr_assert_str_eq(json_object_get_string(json_object_object_get(doc, "tenant")), t.name);
	cr_assert_eq(json_object_get_double(json_object_object_get(
	                 json_object_object_get(doc, "thresholds"), "since_s")),
	             86400.0);
	expect_checked(doc, 5, 4, 3);
	expect_invariants(doc, 0, 0, 0, 0);
	expect_backlog(doc, 0, 0, 0, 0, 0);
	cr_assert_eq(json_object_object_length(json_object_object_get(doc, "tenants_broken")), 0);
	cr_assert(json_object_object_get_ex(doc, "ok", &v) && json_object_get_boolean(v));
	cr_assert_eq(num_at(doc, "checked", "keys"), 5);
	json_object_put(doc);

	/* The readable report says the same. */
	rc = tstack_cli(out, sizeof(out), "audit", "--tenant", t.name, NULL);
	cr_assert_eq(rc, 0, "%s %s", out, tstack_cli_stderr());
	cr_assert_not_null(strstr(out, "\nchecked: keys=5 answers=4 workflows=3\n"), "%s", out);
	cr_assert_not_null(strstr(out, "\nok   workflows_without_created_event         0  "), "%s",
	                   out);
	cr_assert_not_null(strstr(out, "\naudit: 4 of 4 invariants hold ("), "%s", out);
	free(a);
	free(b);
	free(c);
}

Test(audit, a_missing_workflow_created_event_is_counted_and_fails)
{
	struct tstack_tenant t;
	struct json_object *doc, *broken;
	char *a, *b;

	tstack_tenant_create(&t, "audit-event");
	a = create(&t);
	b = create(&t);
	tstack_exec(tstack_db(), "DELETE FROM outbox WHERE tenant_id = $1 AND workflow_id = $2",
	            t.id_text, a);

	doc = audit_json(&t, 65, NULL, NULL, NULL, NULL);
	expect_checked(doc, 2, 2, 2);
	expect_invariants(doc, 0, 0, 0, 1);
	broken = json_object_object_get(doc, "tenants_broken");
	cr_assert_eq(json_object_object_length(broken), 1, "%s", out);
	cr_assert_eq(num_at(broken, t.name, "workflows_without_created_event"), 1, "%s", out);
	cr_assert_eq(num_at(doc, "checked", "workflows"), 2);
	cr_assert_eq(json_object_get_int(json_object_object_get(doc, "broken")), 1);
	cr_assert_not(json_object_get_boolean(json_object_object_get(doc, "ok")));
	json_object_put(doc);

	cr_assert_eq(tstack_cli(out, sizeof(out), "audit", "--tenant", t.name, NULL), 65);
	cr_assert_not_null(strstr(out, "\nFAIL workflows_without_created_event         1  "), "%s",
	                   out);
	cr_assert_not_null(strstr(out, "\naudit: 3 of 4 invariants hold ("), "%s", out);

	/* Another event at seq 1 is not the workflow.created event. */
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET type = 'workflow.started'"
	            " WHERE tenant_id = $1 AND workflow_id = $2 AND seq = 1",
	            t.id_text, b);
	doc = audit_json(&t, 65, NULL, NULL, NULL, NULL);
	expect_invariants(doc, 0, 0, 0, 2);
	json_object_put(doc);
	free(a);
	free(b);
}

Test(audit, a_key_whose_workflow_is_gone_is_counted_and_fails)
{
	struct tstack_tenant t, other;
	struct json_object *doc;
	char *a, *b;

	tstack_tenant_create(&t, "audit-gone");
	tstack_tenant_create(&other, "audit-gone-other");
	a = create(&t);
	b = create(&t);
	tstack_exec(tstack_db(), "DELETE FROM outbox WHERE tenant_id = $1 AND workflow_id = $2",
	            t.id_text, a);
	tstack_exec(tstack_db(), "DELETE FROM workflows WHERE tenant_id = $1 AND id = $2",
	            t.id_text, a);

	doc = audit_json(&t, 65, NULL, NULL, NULL, NULL);
	expect_checked(doc, 2, 2, 1);
	expect_invariants(doc, 1, 0, 0, 0);
	json_object_put(doc);

	/* A workflow of another tenant under that id is not the key's. */
	tstack_exec(tstack_db(),
	            "INSERT INTO workflows (tenant_id, id, type, input, created_at, updated_at)"
	            " VALUES ($1, $2, 'audit', '{}', now() - interval '30 days', now())",
	            other.id_text, a);
	doc = audit_json(&t, 65, NULL, NULL, NULL, NULL);
	expect_invariants(doc, 1, 0, 0, 0);
	json_object_put(doc);
	free(a);
	free(b);
}

Test(audit, keys_pointing_nowhere_are_counted_and_fail)
{
	struct tstack_tenant t;
	struct json_object *doc;
	char *a, *b, *c, *ka, *kb;

	tstack_tenant_create(&t, "audit-nowhere");
	a = create(&t);
	b = create(&t);
	c = create(&t);
	ka = key_of(&t, a);
	kb = key_of(&t, b);
	/* A claim committed without its answer; an answer that names nothing. */
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET status = 0, headers = '', body = ''"
	            " WHERE tenant_id = $1 AND key = $2",
	            t.id_text, ka);
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET body = '{}' WHERE tenant_id = $1 AND key = $2",
	            t.id_text, kb);

	doc = audit_json(&t, 65, NULL, NULL, NULL, NULL);
	expect_checked(doc, 3, 2, 3);
	expect_invariants(doc, 0, 2, 0, 0);
	json_object_put(doc);
	free(a);
	free(b);
	free(c);
	free(ka);
	free(kb);
}

Test(audit, a_workflow_created_under_two_keys_is_counted_and_fails)
{
	struct tstack_tenant t;
	struct json_object *doc;
	char *a, *ka;

	tstack_tenant_create(&t, "audit-twice");
	a = create(&t);
	ka = key_of(&t, a);
	tstack_exec(tstack_db(),
	            "INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint,"
	            "    status, headers, body, created_at, expires_at)"
	            " SELECT tenant_id, key || '-copy', method, path, fingerprint, status,"
	            "        headers, body, created_at, expires_at"
	            "   FROM idempotency_keys WHERE tenant_id = $1 AND key = $2",
	            t.id_text, ka);

	doc = audit_json(&t, 65, NULL, NULL, NULL, NULL);
	expect_checked(doc, 2, 2, 1);
	expect_invariants(doc, 0, 0, 1, 0);
	json_object_put(doc);

	/* An "existing" answer (200) under another key is how a business key
	 * answers: not a second creation. */
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET status = 200 WHERE tenant_id = $1 AND key = $2",
	            t.id_text, ka);
	doc = audit_json(&t, 0, NULL, NULL, NULL, NULL);
	expect_invariants(doc, 0, 0, 0, 0);
	json_object_put(doc);
	free(a);
	free(ka);
}

Test(audit, the_window_and_outbox_retention_bound_what_is_checked)
{
	struct tstack_tenant t;
	struct json_object *doc;
	char *a, *ka;

	tstack_tenant_create(&t, "audit-window");
	a = create(&t);
	ka = key_of(&t, a);
	tstack_exec(tstack_db(), "DELETE FROM outbox WHERE tenant_id = $1 AND workflow_id = $2",
	            t.id_text, a);
	tstack_exec(tstack_db(),
	            "UPDATE workflows SET created_at = now() - interval '2 days'"
	            " WHERE tenant_id = $1 AND id = $2",
	            t.id_text, a);
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET created_at = now() - interval '2 days'"
	            " WHERE tenant_id = $1 AND key = $2",
	            t.id_text, ka);

	/* 24 hours: nothing of the tenant's is in the window. */
	doc = audit_json(&t, 0, NULL, NULL, NULL, NULL);
	expect_checked(doc, 0, 0, 0);
	expect_invariants(doc, 0, 0, 0, 0);
	json_object_put(doc);
	/* Three days, either way of writing it. */
	doc = audit_json(&t, 65, "--since", "3d", NULL, NULL);
	expect_checked(doc, 1, 1, 1);
	expect_invariants(doc, 0, 0, 0, 1);
	json_object_put(doc);
	doc = audit_json(&t, 65, "--since", "P3D", NULL, NULL);
	expect_checked(doc, 1, 1, 1);
	json_object_put(doc);
	doc = audit_json(&t, 65, "--since=PT72H", NULL, NULL, NULL);
	expect_checked(doc, 1, 1, 1);
	json_object_put(doc);
	/* A workflow older than outbox_retention may have lost its delivered
	 * event to prune: its event is not asked for. */
	doc = audit_json(&t, 0, "--since", "3d", "--outbox-retention", "1d");
	expect_checked(doc, 1, 1, 0);
	expect_invariants(doc, 0, 0, 0, 0);
	json_object_put(doc);
	free(a);
	free(ka);
}

Test(audit, late_events_timers_and_leases_are_counted_and_do_not_fail)
{
	struct tstack_tenant t;
	struct json_object *doc;
	char *w[6];

	tstack_tenant_create(&t, "audit-late");
	for (int i = 0; i < 6; i++)
		w[i] = create(&t);
	/* Pending an hour; held behind a dead one; dead. */
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET created_at = now() - interval '1 hour'"
	            " WHERE tenant_id = $1 AND workflow_id = $2 AND seq = 1",
	            t.id_text, w[0]);
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET next_attempt_at = 'infinity',"
	            "       created_at = now() - interval '1 hour'"
	            " WHERE tenant_id = $1 AND workflow_id = $2 AND seq = 1",
	            t.id_text, w[1]);
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET dead_at = now(), last_error = 'audit'"
	            " WHERE tenant_id = $1 AND workflow_id = $2 AND seq = 1",
	            t.id_text, w[2]);
	/* A timer due an hour ago, and one due now (not late yet). */
	tstack_exec(tstack_db(),
	            "INSERT INTO timers (tenant_id, workflow_id, step, kind, due_at, created_at)"
	            " VALUES ($1, $2, 1, 'sleep', now() - interval '1 hour', now()),"
	            "        ($1, $3, 1, 'sleep', now(), now())",
	            t.id_text, w[3], w[4]);
	/* A lease that ran out an hour ago; one that runs out now. */
	tstack_exec(tstack_db(),
	            "INSERT INTO jobs (tenant_id, workflow_id, step, name, job_type, state, due_at,"
	            "                  created_at, updated_at)"
	            " VALUES ($1, $2, 1, 'a', 'audit', 'active', now() - interval '1 hour',"
	            "         now(), now()),"
	            "        ($1, $3, 1, 'a', 'audit', 'active', now(), now(), now())",
	            t.id_text, w[4], w[5]);

	doc = audit_json(&t, 0, NULL, NULL, NULL, NULL);
	expect_invariants(doc, 0, 0, 0, 0);
	expect_backlog(doc, 1, 1, 1, 1, 1);
	json_object_put(doc);
	/* Thresholds past an hour: none is late any more (dead and held
	 * events have no threshold). */
	doc = audit_json(&t, 0, "--pending-after", "2h", "--timer-after", "PT2H");
	expect_backlog(doc, 0, 1, 1, 0, 1);
	json_object_put(doc);
	doc = audit_json(&t, 0, "--lease-after", "61m", NULL, NULL);
	expect_backlog(doc, 1, 1, 1, 1, 0);
	json_object_put(doc);
	for (int i = 0; i < 6; i++)
		free(w[i]);
}

/* The whole of path (at most size - 1 bytes). */
static void read_text(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	size_t n;

	cr_assert_not_null(f, "%s", path);
	n = fread(buf, 1, size - 1, f);
	buf[n] = '\0';
	fclose(f);
}

/* Files in dir whose name starts with prefix. */
static int files_with(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	cr_assert_not_null(d, "%s", dir);
	while ((de = readdir(d)) != NULL)
		n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

Test(audit, textfile_gauges_are_written_by_rename)
{
	struct tstack_tenant t;
	char dir[512], path[600], bad[640], text[8192], want[512], prefix[128];
	struct stat st;
	char *a;
	int rc;

	tstack_tenant_create(&t, "audit-prom");
	a = create(&t);
	snprintf(dir, sizeof(dir), "%s/audit-%s", tstack_env("IDEMFLOW_STACK_DIR"), t.name);
	cr_assert_eq(mkdir(dir, 0755), 0);
	snprintf(path, sizeof(path), "%s/idemflow-audit.prom", dir);

	rc = tstack_cli(out, sizeof(out), "audit", "--tenant", t.name, "--textfile", path, NULL);
	cr_assert_eq(rc, 0, "%s %s", out, tstack_cli_stderr());
	read_text(path, text, sizeof(text));
	snprintf(want, sizeof(want), "\nidemflow_audit_last_run_success{tenant=\"%s\"} 1\n",
	         t.name);
	cr_assert_not_null(strstr(text, want), "%s", text);
	snprintf(want, sizeof(want),
	         "\nidemflow_audit_checked{tenant=\"%s\",kind=\"keys\"} 1\n"
	         "idemflow_audit_checked{tenant=\"%s\",kind=\"answers\"} 1\n"
	         "idemflow_audit_checked{tenant=\"%s\",kind=\"workflows\"} 1\n",
	         t.name, t.name, t.name);
	cr_assert_not_null(strstr(text, want), "%s", text);
	snprintf(want, sizeof(want),
	         "\nidemflow_audit_violations{tenant=\"%s\","
	         "invariant=\"workflows_without_created_event\"} 0\n",
	         t.name);
	cr_assert_not_null(strstr(text, want), "%s", text);
	snprintf(want, sizeof(want),
	         "\nidemflow_audit_backlog{tenant=\"%s\",kind=\"jobs_unreaped\"} 0\n", t.name);
	cr_assert_not_null(strstr(text, want), "%s", text);
	snprintf(want, sizeof(want), "\nidemflow_audit_window_seconds{tenant=\"%s\"} 86400.000\n",
	         t.name);
	cr_assert_not_null(strstr(text, want), "%s", text);
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0644);
	cr_assert_eq(files_with(dir, "idemflow-audit.prom."), 0, "a temporary file was left");

	/* A directory it cannot write to: exit 73 (the audit itself passed),
	 * and stderr says where. */
	snprintf(bad, sizeof(bad), "%s/no-such-dir/idemflow-audit.prom", dir);
	rc = tstack_cli(out, sizeof(out), "audit", "--tenant", t.name, "--textfile", bad, NULL);
	cr_assert_eq(rc, 73, "%s %s", out, tstack_cli_stderr());
	cr_assert_not_null(strstr(tstack_cli_stderr(), "could not write"), "%s",
	                   tstack_cli_stderr());

	/* Broken: the gauge says so, and so does the exit status. */
	tstack_exec(tstack_db(), "DELETE FROM outbox WHERE tenant_id = $1 AND workflow_id = $2",
	            t.id_text, a);
	rc = tstack_cli(out, sizeof(out), "audit", "--tenant", t.name, "--textfile", path, NULL);
	cr_assert_eq(rc, 65, "%s %s", out, tstack_cli_stderr());
	read_text(path, text, sizeof(text));
	snprintf(want, sizeof(want),
	         "\nidemflow_audit_violations{tenant=\"%s\","
	         "invariant=\"workflows_without_created_event\"} 1\n",
	         t.name);
	cr_assert_not_null(strstr(text, want), "%s", text);

	/* A run that could not audit leaves its failure and nothing else. */
	snprintf(prefix, sizeof(prefix), "%s-none", t.name);
	rc = tstack_cli(out, sizeof(out), "audit", "--tenant", prefix, "--textfile", path, NULL);
	cr_assert_eq(rc, 65, "%s", tstack_cli_stderr());
	cr_assert_not_null(strstr(tstack_cli_stderr(), "no tenant named"), "%s",
	                   tstack_cli_stderr());
	read_text(path, text, sizeof(text));
	snprintf(want, sizeof(want), "\nidemflow_audit_last_run_success{tenant=\"%s\"} 0\n",
	         prefix);
	cr_assert_not_null(strstr(text, want), "%s", text);
	cr_assert_null(strstr(text, "idemflow_audit_violations"), "%s", text);

	free(a);
}

Test(audit, across_all_tenants_each_broken_tenant_is_named)
{
	struct tstack_tenant t1, t2;
	struct json_object *doc, *broken, *v;
	char *a, *b, *c, *kc;
	int rc;

	tstack_tenant_create(&t1, "audit-all-1");
	tstack_tenant_create(&t2, "audit-all-2");
	a = create(&t1);
	b = create(&t2);
	c = create(&t2);
	kc = key_of(&t2, c);
	tstack_exec(tstack_db(), "DELETE FROM outbox WHERE tenant_id = $1 AND workflow_id = $2",
	            t1.id_text, a);
	tstack_exec(tstack_db(), "DELETE FROM outbox WHERE tenant_id = $1 AND workflow_id = $2",
	            t2.id_text, b);
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET status = 0 WHERE tenant_id = $1 AND key = $2",
	            t2.id_text, kc);

	rc = tstack_cli(out, sizeof(out), "audit", "--json", NULL);
	cr_assert_eq(rc, 65, "%s %s", out, tstack_cli_stderr());
	doc = json_tokener_parse(out);
	cr_assert_not_null(doc, "%s", out);
	cr_assert(json_object_object_get_ex(doc, "tenant", &v) && v == NULL, "%s", out);
	broken = json_object_object_get(doc, "tenants_broken");
	cr_assert_eq(num_at(broken, t1.name, "workflows_without_created_event"), 1, "%s", out);
	cr_assert_eq(num_at(broken, t1.name, "keys_pointing_nowhere"), 0, "%s", out);
	cr_assert_eq(num_at(broken, t2.name, "workflows_without_created_event"), 1, "%s", out);
	cr_assert_eq(num_at(broken, t2.name, "keys_pointing_nowhere"), 1, "%s", out);
	cr_assert_geq(num_at(doc, "invariants", "workflows_without_created_event"), 2);
	json_object_put(doc);

	rc = tstack_cli(out, sizeof(out), "audit", NULL);
	cr_assert_eq(rc, 65);
	cr_assert_eq(strncmp(out, "audit: all tenants, keys and workflows created since ", 53), 0,
	             "%s", out);
	free(a);
	free(b);
	free(c);
	free(kc);
}

Test(audit, bad_options_are_usage_errors)
{
	static const char *const bad[][3] = {
		{ "--since", "0", NULL },      { "--since", "PT0S", NULL },
		{ "--since", "soon", NULL },   { "--since", "P1Y", NULL },
		{ "--since", "40000d", NULL }, { "--pending-after", "-1m", NULL },
		{ "--bogus", NULL, NULL },     { "--tenant", NULL, NULL },
		{ "--textfile", "", NULL },    { "--outbox-retention", "x", NULL },
		{ "stray", NULL, NULL },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = tstack_cli(out, sizeof(out), "audit", bad[i][0], bad[i][1], NULL);
		cr_assert_eq(rc, 64, "audit %s %s exited %d: %s", bad[i][0],
		             bad[i][1] ? bad[i][1] : "", rc, tstack_cli_stderr());
		cr_assert_str_eq(out, "", "nothing on stdout");
	}
}
