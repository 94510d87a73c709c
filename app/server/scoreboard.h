/*
 * scoreboard.h - what every worker of the pool is doing right now: the
 * shared table behind the status page (GET /status), the slow-request log
 * and request_terminate_timeout.
 *
 * Like the counters (metrics.h), the scoreboard is one MAP_SHARED
 * anonymous segment the supervisor maps before its first fork. Each worker
 * owns the slot of its metrics slot number and is its only writer: its
 * pid, its start, its stage, the requests it served, and its current (or
 * last) request's method, route, request id, start and duration. The
 * supervisor clears a slot when its worker is reaped, and reads the slots
 * on its tick: it alone notices a request that runs too long, because a
 * worker blocked in the database cannot notice it itself. Any worker reads
 * them all to render the status page. A worker publishes a new request's
 * text fields under a sequence count (odd while it writes them), so a
 * reader never takes a torn request id.
 *
 * Pool-wide figures live beside the slots: the pool's start, the slow
 * requests logged, the workers killed by request_terminate_timeout, the
 * times the pool ran out of idle workers, the most workers busy at once,
 * the listen queue's high-water mark, and whether the last reload took
 * its configuration.
 */
#ifndef IDF_SCOREBOARD_H
#define IDF_SCOREBOARD_H

#include <stddef.h>
#include <sys/types.h>

#include "core/buf.h"
#include "core/err.h"
#include "server/route.h"

/* A slot per worker, numbered as the metrics slots (sup.c checks that
 * the counts agree). */
#define SCOREBOARD_SLOTS 128

/* Where a request is. */
enum sb_stage {
	SB_IDLE,        /* waiting for a connection */
	SB_READING,     /* reading the request */
	SB_WAITING_KEY, /* the round trip that claims the Idempotency-Key */
	SB_IN_DB,       /* any other database work */
	SB_WRITING,     /* writing the answer */
	SB__COUNT
};

/* "idle", "reading", "waiting for the key", "in the database",
 * "writing the answer"; static. */
const char *scoreboard_stage_name(enum sb_stage s);

/*
 * Supervisor, before the first fork: map the scoreboard (zeroed) and note
 * the pool's start. Calling it again keeps the existing one. Returns 0 or
 * -1 with e.
 */
int scoreboard_init(struct err *e) MUSTCHECK;

/* Supervisor: the listening socket, read for the listen queue. */
void scoreboard_set_listener(int fd);

/* In a new worker right after fork: this process owns slot from now on. */
void scoreboard_use_slot(int slot);

/* Supervisor, when the worker in slot is reaped: the slot is free (its
 * busy state goes with it). */
void scoreboard_slot_free(int slot);

/* Worker: a connection was accepted; the request starts now. Counts it,
 * and counts "max children reached" when this leaves no worker idle. */
void scoreboard_begin(const char *method, enum route route, const char *request_id);

/* Worker: the request in hand moved to stage s. */
void scoreboard_stage(enum sb_stage s);

/* Worker: the request is answered; the worker is idle again. */
void scoreboard_end(void);

/* A request running too long, as the supervisor's scan sees it. */
struct sb_late {
	pid_t pid;
	unsigned long long request_no; /* the slot's request count: one id per request */
	double elapsed_s;
	enum sb_stage stage;
	char method[16];
	char route[48];
	char request_id[64];
};

/*
 * Supervisor: the request in hand in slot (owned by pid) when it has run
 * for at least min_ms, in *late; returns 1 then, else 0.
 */
int scoreboard_late(int slot, pid_t pid, long min_ms, struct sb_late *late);

/* Supervisor: one more slow request logged; one more worker killed by
 * request_terminate_timeout. */
void scoreboard_count_slow(void);
void scoreboard_count_terminated(void);

/* Supervisor, after each SIGHUP: whether the configuration was re-read
 * (ok 1) or refused, the old one kept (ok 0). Until the first reload the
 * pool counts as reloaded at its start, as Prometheus does. */
void scoreboard_config_reloaded(int ok);

/* Supervisor, on its tick (and any reader): sample the listen queue, so
 * its high-water mark holds between status reads. */
void scoreboard_sample_queue(void);

/* The pool's figures for one read. listen_queue is -1 when the kernel
 * does not tell (see scoreboard.c). */
struct sb_pool {
	long long start_time; /* s since the epoch */
	long long start_since;
	unsigned long long accepted;
	long listen_queue, max_listen_queue, listen_queue_len;
	int idle, active, total;
	int max_active; /* the most workers busy at once since the start */
	unsigned long long max_children_reached;
	unsigned long long slow_requests;
	unsigned long long terminated;
	int reload_ok;                 /* the last SIGHUP's configuration was taken */
	long long reload_success_time; /* s since the epoch: the last reload taken, or the start */
};
void scoreboard_pool(struct sb_pool *p);

/*
 * Append the status page to out: plain text, or JSON when json; with one
 * entry per worker when full. pool is the pool's name (the configured
 * application_name). The keys are php-fpm's status page's, in its order,
 * so that php-fpm's collectors read it; idemflow's own follow them.
 */
void scoreboard_render(struct buf *out, const char *pool, int json, int full);

#endif
