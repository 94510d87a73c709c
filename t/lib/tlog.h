/*
 * Reading logs: whether a file says something, which worker answered a
 * request (by its X-Request-Id in the pool's log), and a claim shown for
 * every worker.
 */
#ifndef IDEMFLOW_T_TLOG_H
#define IDEMFLOW_T_TLOG_H

#include <sys/types.h>

#include "http.h"

/*
 * The pid of the worker whose request line in log (a pool's stderr, e.g.
 * $IDEMFLOW_FCGI_LOG) carries request_id (the X-Request-Id of its
 * answer), waiting up to 3 s: the line follows the answer. 0 when none.
 */
long tstack_worker_of(const char *log, const char *request_id);

/* 1 when the file at path contains needle (0 when it is missing). */
int tstack_file_contains(const char *path, const char *needle);

/*
 * A claim about every worker, shown rather than assumed: with
 * EPOLLEXCLUSIVE, requests sent one after another may all reach the same
 * idle worker. Sends bursts of `width` requests at once, send(i, arg) on
 * a thread of its own for request i (counted from 0 over all bursts; no
 * assertions there), until the request lines in log name every live
 * worker of supervisor. check(r, i, arg) sees each answer on the calling
 * thread, then the answer is freed. The test fails after max_bursts.
 * Returns the number of requests sent.
 */
int tstack_every_worker(pid_t supervisor, const char *log, int width, int max_bursts,
                        struct http_response *(*send)(int i, void *arg),
                        void (*check)(const struct http_response *r, int i, void *arg), void *arg);

#endif
