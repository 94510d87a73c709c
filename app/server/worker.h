/*
 * worker.h - one pre-forked FastCGI worker: its own PostgreSQL connection,
 * an accept loop, one request at a time.
 *
 * Signals: SIGTERM or SIGINT finish the request in hand and exit 0;
 * SIGUSR1 (forwarded by the supervisor) reopens the log file. They are
 * blocked except while the worker waits for a connection (epoll_pwait), so a
 * stop request can never be lost in the gap before accept(), and a reopen
 * never interrupts a request.
 */
#ifndef IDF_WORKER_H
#define IDF_WORKER_H

#include "core/conf.h"

/* Serve requests on listen_fd until told to stop. Runs in the child after
 * fork(); returns the process exit code. */
int worker_run(const struct conf *c, int listen_fd);

#endif
