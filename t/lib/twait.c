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

pid_t tstack_blocked_worker(PGconn *holder, long timeout_ms)
{
	double deadline = tstack_now() + timeout_ms / 1000.0;
	char backend[24];

	snprintf(backend, sizeof(backend), "%d", PQbackendPID(holder));
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
