/*
 * notify.h - telling the service manager how the pool is doing, and the
 * channel on which each worker tells the supervisor it is ready.
 *
 * The first half is systemd's notification protocol (sd_notify(3)),
 * spoken by the supervisor alone (the unit's NotifyAccess=main): one
 * datagram per change on the AF_UNIX socket that $NOTIFY_SOCKET names (a
 * path, or an abstract name when it starts with '@'), made of
 * newline-separated assignments (READY=1, RELOADING=1, STOPPING=1,
 * STATUS=..., WATCHDOG=1). It is a few lines of socket code, so there is
 * no libsystemd to link. Sends never block and failures are not errors:
 * a service manager that is gone or slow must not stop the pool.
 *
 * The second half: a pipe made before the first fork. A worker writes its
 * pid into it once it holds its database connection and waits for
 * connections; the pipe's read end raises SIGIO in the supervisor, which
 * reads the reports between two sigsuspend()s.
 *
 * Without NOTIFY_SOCKET nothing of this exists: no socket, no pipe, and
 * every call does nothing.
 */
#ifndef IDF_NOTIFY_H
#define IDF_NOTIFY_H

#include <sys/types.h>

/*
 * Supervisor, at start: read NOTIFY_SOCKET, WATCHDOG_USEC and
 * WATCHDOG_PID, and remove them from the environment (no child is meant
 * to speak for the service). Opens the socket and, for the workers'
 * reports, the pipe (its read end raises SIGIO in this process: install
 * the handler first). Returns 1 when notifications are on, 0 when off
 * (no NOTIFY_SOCKET, or a name it cannot use; *why says which, for the
 * log, or is NULL).
 */
int notify_open(const char **why);

/* 1 when notify_open() turned notifications on. */
int notify_enabled(void);

/* Close the socket and the pipe; notifications are off afterwards. */
void notify_close(void);

/* In a new worker, right after fork(): close the socket and the pipe's
 * read end (the write end stays, for notify_worker_ready()). */
void notify_forget(void);

/*
 * Send one datagram: state (one assignment such as "READY=1" or
 * "STOPPING=1"; "RELOADING=1" gets MONOTONIC_USEC=<now> after it, as
 * systemd wants) when not NULL, then STATUS=<status_fmt ...>. With state
 * NULL the datagram is sent only when the status text changed since the
 * last one. Returns 0, or -1 when it was not sent (errno set; ENOTCONN
 * when notifications are off).
 */
int notify_send(const char *state, const char *status_fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * The watchdog (WATCHDOG_USEC, unless WATCHDOG_PID names another
 * process): notify_watchdog() sends WATCHDOG=1 when half the period has
 * passed since the last one (call it on every turn of the main loop);
 * notify_watchdog_wait_us() is how long until the next one is due (0:
 * now), or -1 when there is no watchdog.
 */
void notify_watchdog(void);
long long notify_watchdog_wait_us(void);

/* The period systemd asked for, in microseconds; 0 when none. */
unsigned long long notify_watchdog_usec(void);

/*
 * Worker: report once that it holds its database connection and is
 * waiting for connections. Does nothing when notifications are off.
 */
void notify_worker_ready(void);

/* Worker: 1 when someone waits for notify_worker_ready(). */
int notify_worker_listened(void);

/*
 * Supervisor: read the workers' reports that arrived, up to max pids into
 * pids. Returns how many were read (0 when none, or off); call again while
 * it returns max.
 */
int notify_ready_reports(pid_t *pids, int max);

#endif
