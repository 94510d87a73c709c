/*
 * The NATS server t/run-test starts for nats/ tests ($IDEMFLOW_NATS_URL,
 * JetStream enabled): a JetStream context on it, streams made and read
 * back message by message, and the server itself stopped and started
 * again (same ports, same streams) in the middle of a test.
 *
 * Functions assert (cr_assert) unless they say otherwise: call them from
 * the test's main thread.
 */
#ifndef IDEMFLOW_T_TNATS_H
#define IDEMFLOW_T_TNATS_H

#include <stddef.h>

#include <nats/nats.h>

struct tnats {
	natsConnection *nc;
	jsCtx *js;
};

/* Connect to $IDEMFLOW_NATS_URL; tnats_close() releases (safe when not
 * connected, and never asserts: for .fini). */
void tnats_connect(struct tnats *t);
void tnats_close(struct tnats *t);

/* A file-backed stream named name taking subjects (e.g. "idf.x.>"), its
 * duplicate window dup_window_ms (0: the server's default, 2 minutes). */
void tnats_stream_add(struct tnats *t, const char *name, const char *subjects, long dup_window_ms);
/* Delete it; no assertion (a missing stream is fine). */
void tnats_stream_delete(struct tnats *t, const char *name);
/* Messages the stream holds, from its state (js_GetStreamInfo). */
long tnats_stream_msgs(struct tnats *t, const char *name);

/*
 * Every message the stream holds, in sequence order, read one by one
 * (js_GetMsg): *out gets a malloc'ed array of n messages, freed with
 * tnats_msgs_free(). Returns n.
 */
size_t tnats_stream_read(struct tnats *t, const char *name, natsMsg ***out);
void tnats_msgs_free(natsMsg **msgs, size_t n);
/* A header's value, "" when the message has none. */
const char *tnats_header(natsMsg *m, const char *key);

/* Stop the server (SIGTERM to its process group: it closes its clients
 * and its streams' files) and wait until it is gone. */
void tnats_server_stop(void);
/* Start it again from its directory ($IDEMFLOW_NATS_DIR): same ports,
 * same streams and messages; returns once JetStream answers. */
void tnats_server_start(void);

#endif
