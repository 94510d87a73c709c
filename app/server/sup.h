/*
 * sup.h - the supervisor: binds the FastCGI socket once (or takes it from
 * systemd), pre-forks the workers, and keeps the pool at its size.
 *
 *  - A worker that dies is logged (exit code or signal, uptime) and
 *    respawned; when workers keep dying young, respawns back off
 *    exponentially up to 30 s.
 *  - SIGTERM/SIGINT: every worker finishes its request in hand and exits;
 *    after shutdown_timeout the rest get SIGKILL; then the supervisor exits 0.
 *  - SIGHUP: re-read the configuration (a bad one is logged and the old one
 *    kept) and replace the workers one at a time.
 *  - SIGUSR1: reopen the log file (log_file), then have every worker do the
 *    same.
 * Under a socket unit (LISTEN_FDS, LISTEN_PID) it serves on the socket
 * systemd passed instead of binding listen, and leaves its file in place at
 * exit: the socket, and the connections queued on it, outlive a restart.
 * Under systemd (NOTIFY_SOCKET) it tells the service manager when the pool
 * is ready, reloading and stopping, its status and its heartbeat; workers
 * report their connections to it (notify.h).
 * Before the first fork it maps the metrics counters (metrics.h) and the
 * scoreboard (scoreboard.h) and gives each worker a slot of both; it keeps
 * idemflow_workers and idemflow_worker_restarts_total itself.
 *  - Every second it reads the scoreboard: a request in hand for longer
 *    than request_slowlog_timeout is logged once ("slow request"), and
 *    the worker of one in hand for longer than request_terminate_timeout
 *    is killed (SIGKILL), counted and replaced.
 * The main loop waits in sigsuspend() with every handled signal blocked
 * otherwise, so no signal is lost between a check and the wait.
 */
#ifndef IDF_SUP_H
#define IDF_SUP_H

#include "core/conf.h"

/* Run the server until stopped. c is owned by the supervisor from now on
 * (replaced on reload); argc/argv are kept to re-read the configuration.
 * Returns the process exit code, from sysexits.h: EX_OK after a stop,
 * EX_CONFIG for a bad configuration, EX_CANTCREAT when the log or pid file
 * cannot be written, EX_OSERR when the shared maps or the socket cannot be
 * made. */
int sup_run(struct conf *c, int argc, char **argv);

#endif
