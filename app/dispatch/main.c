/*
 * idemflow-dispatch - deliver outbox events at least once, from cron or
 * as a long-running process (--loop). See dispatch.h for how, and
 * idemflow-dispatch(8) for the flags.
 *
 * With `textfile` set, every run ends by writing its counters for the
 * node_exporter textfile collector: a cron job has no port to scrape.
 * With --loop the file is also rewritten after every round (dmetrics.h).
 *
 * Exit status: 0 when the run did its job, even if deliveries failed and
 * were rescheduled; 64 usage; 78 configuration (unknown sink, bad URL,
 * bad backoff); 75 database unreachable (try later); 70 other database
 * errors (e.g. the schema is not migrated).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sysexits.h>
#include <unistd.h>

#include "config.h"
#include "core/conf.h"
#include "core/conftest.h"
#include "core/log.h"
#include "dispatch/dispatch.h"
#include "dispatch/dmetrics.h"
#include "dispatch/sink.h"
#include "dispatch/queries.h"
#include "dispatch/whsig.h"

static void usage(FILE *out)
{
	fprintf(out,
	        "Usage: idemflow-dispatch [--config FILE] [--db CONNINFO] [--once | --loop]\n"
	        "                         [--sink http|amqp|nats|exec] [--KEY VALUE ...]\n"
	        "                         [-t [-q] | -T]\n"
	        "Claim due outbox events, deliver them, record the outcome.\n"
	        "\n"
	        "  -t                  test the configuration (values, a database named), exit 0 "
	        "or 78\n"
	        "  -T                  the same, and print the effective configuration, secrets "
	        "masked\n"
	        "  -q                  with -t: nothing on success, nor when no database is named\n"
	        "  --once              run until nothing is due (the default; for cron)\n"
	        "  --loop              keep running; wake on LISTEN/NOTIFY, poll as a fallback\n"
	        "  --batch N           events claimed at a time\n"
	        "  --max-runtime D     stop after D (e.g. 55s); 0 = no limit\n"
	        "  --max-attempts N    attempts before an event is dead\n"
	        "  --sink S            http | amqp | nats | exec\n"
	        "  --url U --secret S --timeout D --parallel N  http sink\n"
	        "  --secret-previous S  http sink, while rotating: the old secret signs too\n"
	        "  --amqp-url U --exchange X --routing-key K  amqp sink ({type} = event type)\n"
	        "  --nats-url U --nats-subject-prefix P --nats-stream S  nats sink (JetStream)\n"
	        "  --exec CMD                                 exec sink\n"
	        "\n");
	conf_usage(out, CONF_DISPATCH);
}

static void on_stop(int sig)
{
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

/* What only the dispatcher reads, checked without connecting anywhere. */
static int dispatch_check(const struct conf *c, struct err *e)
{
	static const char *const sinks[] = { "http", "amqp", "nats", "exec" };
	uint8_t key[WHSIG_KEY_MAX];
	size_t keylen;

	if (c->once && c->loop)
		return err_set(e, ERR_CONFIG, "--once and --loop exclude each other");
	/* The signing secrets as the http sink reads them (too short, bad
	 * base64), whatever the sink: the file may serve another one later. */
	if (*c->secret != '\0' && whsig_key(c->secret, key, &keylen, e) < 0)
		return -1;
	if (*c->secret_previous != '\0') {
		if (*c->secret == '\0')
			return err_set(e, ERR_CONFIG, "secret_previous is set without secret");
		if (whsig_key_named("secret_previous", c->secret_previous, key, &keylen, e) < 0)
			return -1;
	}
	explicit_bzero(key, sizeof(key));
	for (size_t i = 0; i < sizeof(sinks) / sizeof(sinks[0]); i++)
		if (strcmp(c->sink, sinks[i]) == 0)
			return 0;
	return err_set(e, ERR_CONFIG,
	               "invalid value \"%s\" for \"sink\": expected http, amqp, nats or exec",
	               c->sink);
}

/* A run's counters added to the runs' before it (one per partition). */
static void add_stats(struct dispatch_stats *to, const struct dispatch_stats *one)
{
	to->claimed += one->claimed;
	to->published += one->published;
	to->broker_duplicates += one->broker_duplicates;
	to->retried += one->retried;
	to->dead += one->dead;
	to->pending += one->pending;
	if (one->oldest_pending_s > to->oldest_pending_s)
		to->oldest_pending_s = one->oldest_pending_s;
	to->duration_s += one->duration_s;
	to->ep_claimed += one->ep_claimed;
	to->ep_delivered += one->ep_delivered;
	to->ep_retried += one->ep_retried;
	to->ep_dead += one->ep_dead;
	to->ep_disabled += one->ep_disabled;
}

int main(int argc, char **argv)
{
	struct err e = { 0 }, first = { 0 };
	struct conf *c;
	struct sink *s = NULL, *es = NULL;
	struct dispatcher *d = NULL;
	struct dispatch_stats st = { 0 };
	struct dmetrics_run run;
	struct sigaction sa;
	int next, rc = EX_OK, ran = 0, tflags, nparts;
	char *db = NULL, *part_db = NULL;

	log_set_component("dispatch");
	tflags = conftest_take_flags(&argc, argv);
	c = conf_from_args(argc, argv, &next, &e);
	if (tflags != 0 && c != NULL && next < argc) {
		fprintf(stderr, "idemflow-dispatch: -t and -T take no other argument (\"%s\")\n",
		        argv[next]);
		conf_free(c);
		return EX_USAGE;
	}
	if (tflags != 0)
		return conftest_run("idemflow-dispatch", tflags, c, &e, dispatch_check);
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
	log_line_format = c->log_format;
	if (log_open(c->log_file, &e) < 0) {
		fprintf(stderr, "idemflow-dispatch: %s\n", e.msg);
		conf_free(c);
		return EX_CANTCREAT;
	}

	dmetrics_start(c->sink, c->textfile, c->loop);
	/* A statement whose parameters drifted from its SQL is a bug: refuse
	 * to start (EX_SOFTWARE, the statement named in the log), rather than
	 * fail each claim later or bind values to the wrong $n. */
	if (dispatch_queries_check(&e) < 0)
		goto fail;
	s = sink_open(c, &e);
	if (s == NULL)
		goto fail;
	/* The tenant endpoints are delivered over HTTP whatever the sink. */
	if (c->endpoints && (es = sink_http_open_endpoints(c, &e)) == NULL)
		goto fail;
	/* With partitions (doc/distribution.md): each in turn, or the one
	 * named by partition. A --loop stays on one database. */
	nparts = conf_partition_count(c);
	if (c->partition < 0 && nparts > 1 && c->loop) {
		err_set(
		    &e, ERR_CONFIG,
		    "--loop runs on one database: name one of the %d partitions with --partition N "
		    "(one dispatcher per partition)",
		    nparts);
		goto fail;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop; /* no SA_RESTART: wake a --loop wait */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	/* logrotate: the next line goes to the new file. SA_RESTART, so the
	 * signal never cuts a delivery short. */
	sa.sa_handler = log_reopen_on_signal;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGUSR1, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	log_info("run started", "sink=%s mode=%s batch=%d max_attempts=%d endpoints=%s", s->name,
	         c->loop ? "loop" : "once", c->batch, c->max_attempts,
	         c->endpoints ? "true" : "false");
	ran = 1;
	db = c->db;
	for (int i = c->partition >= 0 ? c->partition : 0; i < (c->partition >= 0 ? c->partition + 1
	                                                        : nparts > 0      ? nparts
	                                                                          : 1);
	     i++) {
		struct dispatch_stats one = { 0 };
		if (nparts > 0) {
			free(part_db);
			part_db = conf_partition_db(c, i);
			if (part_db == NULL) {
				err_set(&e, ERR_INTERNAL, "out of memory");
				goto fail;
			}
			c->db = part_db;
			log_info("partition", "partition=%d", i);
		}
		d = dispatch_new(c, s, es, &e);
		if (d == NULL || dispatch_run(d, &one, &e) < 0) {
			/* The other partitions still get their run; the first
			 * failure is the run's (logged and its exit status at
			 * fail, as without partitions). */
			if (nparts > 0) {
				char line[512];
				size_t n = 0;
				log_kv(line, sizeof(line), &n, "error", e.msg);
				log_error("partition failed", "%s partition=%d", line, i);
			}
			if (rc == EX_OK) {
				rc = exit_code(&e);
				first = e;
			}
		}
		dispatch_free(d);
		d = NULL;
		add_stats(&st, &one);
	}
	c->db = db;
	if (rc != EX_OK) {
		e = first;
		goto fail;
	}
	log_info("run finished",
	         "claimed=%ld published=%ld retried=%ld dead=%ld broker_duplicates=%ld pending=%ld "
	         "oldest_pending_s=%.1f duration_s=%.3f",
	         st.claimed, st.published, st.retried, st.dead, st.broker_duplicates, st.pending,
	         st.oldest_pending_s, st.duration_s);
	if (c->endpoints)
		log_info("endpoints drained",
		         "claimed=%ld delivered=%ld retried=%ld dead=%ld disabled=%ld",
		         st.ep_claimed, st.ep_delivered, st.ep_retried, st.ep_dead, st.ep_disabled);
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
	run = (struct dmetrics_run){ .claimed = st.claimed,
		                     .published = st.published,
		                     .retried = st.retried,
		                     .dead = st.dead,
		                     .broker_duplicates = st.broker_duplicates,
		                     .pending = st.pending,
		                     .oldest_pending_s = st.oldest_pending_s,
		                     .duration_s = st.duration_s };
	if (*c->textfile && dmetrics_write(c->textfile, ran ? &run : NULL, rc == EX_OK, &e) < 0) {
		char line[512];
		size_t n = 0;
		log_kv(line, sizeof(line), &n, "error", e.msg);
		log_error("could not write the metrics textfile", "%s", line);
	}
	dispatch_free(d);
	if (db != NULL)
		c->db = db;
	free(part_db);
	if (s != NULL)
		s->close(s);
	if (es != NULL)
		es->close(es);
	conf_free(c);
	return rc;
}
