/*
 * The clock, sleeping and polling; see twait.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf, pipe2, open_memstream */
#endif
#include "twait.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "tsql.h"
#include "tstack.h"

int tstack_wait_workers(pid_t supervisor, size_t n, long timeout_ms)
{
	double deadline = tstack_now() + timeout_ms / 1000.0;
	pid_t pids[64];

	for (;;) {
		if (tstack_workers(supervisor, pids, 64) == n)
			return 1;
		if (tstack_now() >= deadline)
			return 0;
		tstack_sleep_ms(20);
	}
}

/*
 * Over partitions (IDEMFLOW_PROXY_URL): the partition's backends are
 * PL/Proxy's connections, named by no worker. The kernel's table of unix
 * sockets (ss) ties one to the proxy's backend at its other end: the
 * partition's end (on its .s.PGSQL socket) names the proxy's end as its
 * peer. That backend's application_name, on the proxy, names the worker.
 * 0 when the chain breaks anywhere (the call ended meanwhile).
 */
static pid_t shards_worker_of(long backend)
{
	char line[1024], want[40], peer[32] = "", cmd[] = "ss -xpnH 2>/dev/null";
	char *lines = NULL, *v;
	size_t len = 0;
	long proxy_pid = 0;
	FILE *f, *all;
	pid_t worker = 0;

	f = popen(cmd, "r");
	all = open_memstream(&lines, &len);
	cr_assert(f != NULL && all != NULL, "%s: %s", cmd, strerror(errno));
	while (fgets(line, sizeof(line), f))
		fputs(line, all);
	pclose(f);
	fclose(all);
	/* "u_str ESTAB 0 0 LOCAL INODE PEER PEER_INODE users:((...,pid=N,...))" */
	snprintf(want, sizeof(want), ",pid=%ld,", backend);
	for (char *l = lines, *nl; l && *l; l = nl ? nl + 1 : NULL) {
		char local[512], inode[32], rpeer[8], rinode[32];

		nl = strchr(l, '\n');
		if (nl)
			*nl = '\0';
		if (sscanf(l, "%*s %*s %*s %*s %511s %31s %7s %31s", local, inode, rpeer, rinode) ==
		        4 &&
		    strstr(l, want) && strstr(local, "/.s.PGSQL."))
			snprintf(peer, sizeof(peer), "%s", rinode);
		if (nl)
			*nl = '\n';
	}
	for (char *l = lines, *nl; peer[0] && l && *l; l = nl ? nl + 1 : NULL) {
		char local[512], inode[32], *p;

		nl = strchr(l, '\n');
		if (nl)
			*nl = '\0';
		if (sscanf(l, "%*s %*s %*s %*s %511s %31s", local, inode) == 2 &&
		    strcmp(inode, peer) == 0 && (p = strstr(l, ",pid=")) != NULL)
			proxy_pid = atol(p + 5);
		if (nl)
			*nl = '\n';
	}
	free(lines);
	if (proxy_pid <= 0)
		return 0;
	{
		PGconn *c = PQconnectdb(getenv("IDEMFLOW_PROXY_URL"));
		char pidtext[24];
		const char *params[1] = { pidtext };
		PGresult *res;

		cr_assert_eq(PQstatus(c), CONNECTION_OK, "connect to the proxy: %s",
		             PQerrorMessage(c));
		snprintf(pidtext, sizeof(pidtext), "%ld", proxy_pid);
		res = PQexecParams(c,
		                   "SELECT substring(application_name FROM '-worker-([0-9]+)$')"
		                   "  FROM pg_stat_activity WHERE pid = $1::int",
		                   1, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
		    !PQgetisnull(res, 0, 0)) {
			v = PQgetvalue(res, 0, 0);
			worker = (pid_t)atol(v);
		}
		PQclear(res);
		PQfinish(c);
	}
	return worker;
}

/* Over partitions: a worker whose call waits on holder, through the proxy. */
static pid_t shards_blocked_worker(const char *backend)
{
	char *v = tstack_text("SELECT coalesce(string_agg(pid::text, ' '), '')"
	                      "  FROM pg_stat_activity"
	                      " WHERE $1::int = ANY (pg_blocking_pids(pid))",
	                      backend);
	pid_t worker = 0;

	for (char *p = v, *end; p && *p && worker == 0; p = end) {
		long pid = strtol(p, &end, 10);

		if (end == p)
			break;
		worker = shards_worker_of(pid);
	}
	free(v);
	return worker;
}

pid_t tstack_blocked_worker(PGconn *holder, long timeout_ms)
{
	double deadline = tstack_now() + timeout_ms / 1000.0;
	const char *proxy = getenv("IDEMFLOW_PROXY_URL");
	char backend[24];

	snprintf(backend, sizeof(backend), "%d", PQbackendPID(holder));
	while (proxy != NULL && *proxy != '\0') {
		pid_t pid = shards_blocked_worker(backend);

		if (pid > 0)
			return pid;
		if (tstack_now() >= deadline)
			return 0;
		tstack_sleep_ms(20);
	}
	/* Asked on another session: pg_stat_activity is a per-transaction
	 * snapshot, and holder is inside its transaction. */
	for (;;) {
		char *v = tstack_text("SELECT max(substring(application_name"
		                      "  FROM '-worker-([0-9]+)$'))"
		                      "  FROM pg_stat_activity"
		                      " WHERE $1::int = ANY (pg_blocking_pids(pid))"
		                      "   AND application_name ~ '-worker-[0-9]+$'",
		                      backend);

		if (v) {
			pid_t pid = (pid_t)atol(v);

			free(v);
			return pid;
		}
		if (tstack_now() >= deadline)
			return 0;
		tstack_sleep_ms(20);
	}
}

double tstack_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void tstack_sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}
