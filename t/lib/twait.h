/*
 * The clock, sleeping, and waiting for a state of the stack by polling
 * it with a deadline (a test asserts the state it waited for: a wait is
 * never what makes a race pass).
 */
#ifndef IDEMFLOW_T_TWAIT_H
#define IDEMFLOW_T_TWAIT_H

#include <stddef.h>
#include <sys/types.h>

#include <libpq-fe.h>

double tstack_now(void);
void tstack_sleep_ms(long ms);

/* 1 once supervisor has exactly n live workers; 0 after timeout_ms. */
int tstack_wait_workers(pid_t supervisor, size_t n, long timeout_ms);

/*
 * The worker whose PostgreSQL session is waiting on a lock held by
 * holder's session (found by pg_blocking_pids and the worker's
 * application_name "...-worker-<pid>"), polling every 20 ms; 0 on timeout.
 * Over partitions (t/run-test's TSTACK_SHARDS) holder is on the test's
 * partition, where the waiting session is PL/Proxy's: the worker is the
 * one whose proxy session is that session's peer (read with ss(8)).
 */
pid_t tstack_blocked_worker(PGconn *holder, long timeout_ms);

#endif
