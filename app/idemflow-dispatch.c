/*
 * idemflow-dispatch - deliver outbox events at least once, from cron or
 * as a long-running process (--loop). See dispatch.h for how, and
 * idemflow-dispatch(1) for the flags.
 *
 * Exit status: 0 when the run did its job, even if deliveries failed and
 * were rescheduled; 64 usage; 78 configuration (unknown sink, bad URL,
 * bad backoff); 75 database unreachable (try later); 70 other database
 * errors (e.g. the schema is not migrated).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sysexits.h>

#include "config.h"
#include "conf.h"
#include "dispatch.h"
#include "log.h"
#include "sink.h"

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: idemflow-dispatch [--config FILE] [--db CONNINFO] [--once | --loop]\n"
		"                         [--sink http|amqp|exec] [--KEY VALUE ...]\n"
		"Claim due outbox events, deliver them, record the outcome.\n"
		"\n"
		"  --once              run until nothing is due (the default; for cron)\n"
		"  --loop              keep running; wake on LISTEN/NOTIFY, poll as a fallback\n"
		"  --batch N           events claimed at a time\n"
		"  --max-runtime D     stop after D (e.g. 55s); 0 = no limit\n"
		"  --max-attempts N    attempts before an event is dead\n"
		"  --sink S            http | amqp | exec\n"
		"  --url U --secret S --timeout D --parallel N  http sink\n"
		"  --amqp-url U --exchange X --routing-key K  amqp sink ({type} = event type)\n"
		"  --exec CMD                                 exec sink\n"
		"\n");
	conf_usage(out);
}

static void on_stop(int sig)
{
	(void)sig;
	dispatch_stop();
}

static int exit_code(const struct err *e)
{
	switch (e->code) {
	case ERR_CONFIG: return EX_CONFIG;
	case ERR_DB_DOWN: return EX_TEMPFAIL;
	default: return EX_SOFTWARE;
	}
}

int main(int argc, char **argv)
{
	struct err e = {0};
	struct conf *c;
	struct sink *s = NULL;
	struct dispatcher *d = NULL;
	struct dispatch_stats st;
	struct sigaction sa;
	int next, rc = EX_OK;

	log_set_component("dispatch");
	c = conf_from_args(argc, argv, &next, &e);
	if (c == NULL) {
		fprintf(stderr, "idemflow-dispatch: %s\n", e.msg);
		return EX_CONFIG;
	}
	if (next < argc) {
		if (strcmp(argv[next], "-h") == 0 || strcmp(argv[next], "--help") == 0) {
			usage(stdout);
		} else if (strcmp(argv[next], "--version") == 0) {
			printf("idemflow-dispatch %s\n", PACKAGE_VERSION);
		} else {
			fprintf(stderr, "idemflow-dispatch: unexpected argument \"%s\"\n",
				argv[next]);
			usage(stderr);
			rc = EX_USAGE;
		}
		conf_free(c);
		return rc;
	}
	if (c->once && c->loop) {
		fprintf(stderr, "idemflow-dispatch: --once and --loop exclude each other\n");
		conf_free(c);
		return EX_USAGE;
	}
	log_min_level = c->log_level;

	s = sink_open(c, &e);
	if (s == NULL)
		goto fail;
	d = dispatch_new(c, s, &e);
	if (d == NULL)
		goto fail;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop; /* no SA_RESTART: wake a --loop wait */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	log_info("run started", "sink=%s mode=%s batch=%d max_attempts=%d", s->name,
		 c->loop ? "loop" : "once", c->batch, c->max_attempts);
	if (dispatch_run(d, &st, &e) < 0)
		goto fail;
	log_info("run finished",
		 "claimed=%ld published=%ld retried=%ld dead=%ld pending=%ld oldest_pending_s=%.1f "
		 "duration_s=%.3f",
		 st.claimed, st.published, st.retried, st.dead, st.pending, st.oldest_pending_s,
		 st.duration_s);
	goto out;
fail:
	rc = exit_code(&e);
	{
		char line[512];
		size_t n = 0;
		log_kv(line, sizeof(line), &n, "error", e.msg);
		log_error(rc == EX_CONFIG ? "bad configuration" : "run failed", "%s exit=%d", line,
			  rc);
	}
out:
	dispatch_free(d);
	if (s != NULL)
		s->close(s);
	conf_free(c);
	return rc;
}
