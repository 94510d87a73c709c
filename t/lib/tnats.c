/* The NATS server of nats/ tests (see tnats.h). */
#include "tnats.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "tstack.h"
#include "twait.h"

void tnats_connect(struct tnats *t)
{
	natsStatus s;

	memset(t, 0, sizeof(*t));
	s = natsConnection_ConnectTo(&t->nc, tstack_env("IDEMFLOW_NATS_URL"));
	cr_assert_eq(s, NATS_OK, "connect to %s: %s", tstack_env("IDEMFLOW_NATS_URL"),
	             natsStatus_GetText(s));
	s = natsConnection_JetStream(&t->js, t->nc, NULL);
	cr_assert_eq(s, NATS_OK, "JetStream: %s", natsStatus_GetText(s));
}

void tnats_close(struct tnats *t)
{
	jsCtx_Destroy(t->js);
	natsConnection_Destroy(t->nc);
	t->js = NULL;
	t->nc = NULL;
}

void tnats_stream_add(struct tnats *t, const char *name, const char *subjects, long dup_window_ms)
{
	jsStreamConfig cfg;
	jsStreamInfo *si = NULL;
	jsErrCode jerr = 0;
	const char *subj[1] = { subjects };
	natsStatus s;

	jsStreamConfig_Init(&cfg);
	cfg.Name = name;
	cfg.Subjects = subj;
	cfg.SubjectsLen = 1;
	cfg.Storage = js_FileStorage;
	cfg.Duplicates = (int64_t)dup_window_ms * 1000000;
	s = js_AddStream(&si, t->js, &cfg, NULL, &jerr);
	cr_assert_eq(s, NATS_OK, "add stream %s: %s (%d)", name, nats_GetLastError(NULL),
	             (int)jerr);
	jsStreamInfo_Destroy(si);
}

void tnats_stream_delete(struct tnats *t, const char *name)
{
	if (t->js != NULL)
		(void)js_DeleteStream(t->js, name, NULL, NULL);
}

long tnats_stream_msgs(struct tnats *t, const char *name)
{
	jsStreamInfo *si = NULL;
	jsErrCode jerr = 0;
	natsStatus s;
	long n;

	s = js_GetStreamInfo(&si, t->js, name, NULL, &jerr);
	cr_assert_eq(s, NATS_OK, "stream info %s: %s (%d)", name, nats_GetLastError(NULL),
	             (int)jerr);
	n = (long)si->State.Msgs;
	jsStreamInfo_Destroy(si);
	return n;
}

size_t tnats_stream_read(struct tnats *t, const char *name, natsMsg ***out)
{
	jsStreamInfo *si = NULL;
	jsErrCode jerr = 0;
	natsMsg **msgs;
	uint64_t first, last;
	size_t n = 0;
	natsStatus s;

	s = js_GetStreamInfo(&si, t->js, name, NULL, &jerr);
	cr_assert_eq(s, NATS_OK, "stream info %s: %s", name, nats_GetLastError(NULL));
	first = si->State.FirstSeq;
	last = si->State.LastSeq;
	jsStreamInfo_Destroy(si);
	msgs = calloc(last >= first ? (size_t)(last - first + 1) : 1, sizeof(*msgs));
	cr_assert_not_null(msgs);
	for (uint64_t seq = first; seq <= last && seq > 0; seq++) {
		natsMsg *m = NULL;
		s = js_GetMsg(&m, t->js, name, seq, NULL, &jerr);
		if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
			continue; /* deleted */
		cr_assert_eq(s, NATS_OK, "get %s #%llu: %s", name, (unsigned long long)seq,
		             nats_GetLastError(NULL));
		msgs[n++] = m;
	}
	*out = msgs;
	return n;
}

void tnats_msgs_free(natsMsg **msgs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		natsMsg_Destroy(msgs[i]);
	free(msgs);
}

const char *tnats_header(natsMsg *m, const char *key)
{
	const char *v = NULL;

	if (natsMsgHeader_Get(m, key, &v) != NATS_OK || v == NULL)
		return "";
	return v;
}

static pid_t server_pid(const char *file)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/%s", tstack_env("IDEMFLOW_NATS_DIR"), file);
	return (pid_t)tstack_pidfile_read(path);
}

void tnats_server_stop(void)
{
	pid_t pgid = server_pid("server.pgid"), pid = server_pid("nats.pid");
	double deadline = tstack_now() + 30;

	cr_assert_gt(pgid, 0, "no nats-server process group recorded");
	cr_assert_gt(pid, 0, "no nats-server pid file");
	cr_assert_eq(kill(-pgid, SIGTERM), 0, "SIGTERM to nats-server's group %d", (int)pgid);
	while (!tstack_pid_gone(pid) || !tstack_pid_gone(pgid)) {
		cr_assert_lt(tstack_now(), deadline, "nats-server %d did not stop in 30 s",
		             (int)pid);
		tstack_sleep_ms(20);
	}
}

void tnats_server_start(void)
{
	char cmd[2048];
	int rc;

	snprintf(cmd, sizeof(cmd),
	         "bash -c '. \"$1/scripts/lib/stack.sh\" && STACK_LOG_PREFIX=tnats "
	         "stack_nats_run \"$2\"' tnats '%s' '%s' >&2",
	         tstack_env("top_srcdir"), tstack_env("IDEMFLOW_NATS_DIR"));
	rc = system(cmd);
	cr_assert_eq(rc, 0, "nats-server did not start again: %d", rc);
}
