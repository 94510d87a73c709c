/* dmetrics.c - the dispatcher's counters, lag histogram and textfile (see dmetrics.h). */
#include "dispatch/dmetrics.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/iso8601.h"
#include "core/log.h"

/* Upper bounds of the lag buckets, in seconds: from a --loop dispatcher
 * woken by NOTIFY (milliseconds) to a cron run every minute, a receiver
 * down for an hour and the back-off's last steps. */
static const double lag_le[] = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
	                         5,    10,    30,   60,  120,  300, 900, 3600 };
static const char *const lag_le_text[] = { "0.01", "0.025", "0.05", "0.1", "0.25", "0.5",
	                                   "1",    "2.5",   "5",    "10",  "30",   "60",
	                                   "120",  "300",   "900",  "3600" };
#define NLAG (sizeof(lag_le) / sizeof(lag_le[0]))

enum { OUT_DELIVERED, OUT_RETRIED, OUT_DEAD, OUT__COUNT };
static const char *const outcome_names[OUT__COUNT] = { "delivered", "retried", "dead" };

/* The attempt ledger's classes (sql/020_endpoints.sql), fixed: a bounded
 * label set, every one written even at 0. */
enum { CLS_SUCCEEDED, CLS_HTTP, CLS_TIMEOUT, CLS_CONNECT, CLS_TLS, CLS_OTHER, CLS__COUNT };
static const char *const cls_names[CLS__COUNT] = { "succeeded", "http", "timeout",
	                                           "connect",   "tls",  "other" };

static struct {
	char sink[16];
	const char *textfile; /* borrowed; NULL: no writes per round */
	int lag;              /* measure the lag: a textfile will hold it */
	unsigned long long outcomes[OUT__COUNT];
	unsigned long long duplicates;
	unsigned long long ep_attempts[CLS__COUNT];   /* tenant endpoints, by class */
	unsigned long long ep_deliveries[OUT__COUNT]; /* and what became of them */
	unsigned long long ep_disabled;
	unsigned long long lag_buckets[NLAG + 1]; /* per bucket; the last: +Inf */
	double lag_sum;
	unsigned long long lag_unknown; /* delivered, no occurred_at to measure from */
	double last_write;              /* monotonic s; 0: never */
	int write_failed;               /* logged once until a write succeeds */
} dm;

static double mono_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double wall_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void dmetrics_start(const char *sink, const char *textfile, int loop)
{
	memset(&dm, 0, sizeof(dm));
	snprintf(dm.sink, sizeof(dm.sink), "%s", sink);
	dm.textfile = loop && textfile != NULL && *textfile ? textfile : NULL;
	/* Parsing every payload costs: only when a file will show it. */
	dm.lag = textfile != NULL && *textfile;
}

double dmetrics_lag(const char *occurred_at, double now)
{
	int64_t us;
	char why[128];
	double lag;

	if (occurred_at == NULL || iso8601_time(occurred_at, &us, why, sizeof(why)) < 0)
		return -1;
	lag = now - (double)us / 1e6;
	return lag < 0 ? 0 : lag; /* two clocks: the database's and ours */
}

/* The payload's top-level occurred_at: parsed, since a key of the same
 * name may sit inside "data" and come first in the text. */
static double payload_lag(const struct sink_event *ev, double now)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *doc = NULL, *at;
	double lag = -1;

	if (tok == NULL || ev->payload == NULL)
		goto out;
	doc = json_tokener_parse_ex(tok, ev->payload, (int)ev->payload_len);
	if (doc != NULL && json_object_object_get_ex(doc, "occurred_at", &at) &&
	    json_object_is_type(at, json_type_string))
		lag = dmetrics_lag(json_object_get_string(at), now);
out:
	json_object_put(doc);
	if (tok != NULL)
		json_tokener_free(tok);
	return lag;
}

void dmetrics_outcome(const struct sink_event *ev, const struct sink_outcome *o, int dead)
{
	double lag;
	size_t b = 0;

	if (o->result != SINK_OK) {
		dm.outcomes[dead ? OUT_DEAD : OUT_RETRIED]++;
	} else {
		dm.outcomes[OUT_DELIVERED]++;
		if (o->duplicate)
			dm.duplicates++;
		lag = dm.lag ? payload_lag(ev, wall_s()) : -1;
		if (lag < 0) {
			dm.lag_unknown++;
		} else {
			while (b < NLAG && lag > lag_le[b])
				b++;
			dm.lag_buckets[b]++;
			dm.lag_sum += lag;
		}
	}
	/* A long drain: the file follows it, at most once a second. */
	if (dm.textfile != NULL && mono_s() - dm.last_write >= 1.0)
		dmetrics_round();
}

void dmetrics_endpoint_attempt(const char *cls, int dead)
{
	int k = CLS_OTHER;

	for (int i = 0; i < CLS__COUNT; i++)
		if (cls != NULL && strcmp(cls, cls_names[i]) == 0)
			k = i;
	dm.ep_attempts[k]++;
	dm.ep_deliveries[k == CLS_SUCCEEDED ? OUT_DELIVERED : dead ? OUT_DEAD : OUT_RETRIED]++;
	if (dm.textfile != NULL && mono_s() - dm.last_write >= 1.0)
		dmetrics_round();
}

void dmetrics_endpoints_disabled(long n)
{
	dm.ep_disabled += (unsigned long long)n;
}

static void help(FILE *f, const char *name, const char *type, const char *text)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

static void write_counters(FILE *f)
{
	unsigned long long cum = 0;
	struct timeval now;

	gettimeofday(&now, NULL);
	help(f, "idemflow_dispatch_last_write_timestamp_seconds", "gauge",
	     "When the dispatcher last wrote this file (after every round with --loop).");
	fprintf(f, "idemflow_dispatch_last_write_timestamp_seconds %ld.%03ld\n", (long)now.tv_sec,
	        (long)now.tv_usec / 1000);
	help(f, "idemflow_dispatch_events_total", "counter",
	     "Delivery attempts since the dispatcher started, by sink and outcome: delivered, "
	     "retried (failed, rescheduled) or dead (failed for good).");
	for (int i = 0; i < OUT__COUNT; i++)
		fprintf(f, "idemflow_dispatch_events_total{sink=\"%s\",outcome=\"%s\"} %llu\n",
		        dm.sink, outcome_names[i], dm.outcomes[i]);
	help(f, "idemflow_dispatch_endpoint_attempts_total", "counter",
	     "Attempts to deliver to tenant endpoints since the dispatcher started, by outcome "
	     "as the attempt ledger classes them.");
	for (int i = 0; i < CLS__COUNT; i++)
		fprintf(f, "idemflow_dispatch_endpoint_attempts_total{outcome=\"%s\"} %llu\n",
		        cls_names[i], dm.ep_attempts[i]);
	help(f, "idemflow_dispatch_endpoint_deliveries_total", "counter",
	     "Tenant endpoint deliveries attempted since the dispatcher started, by what became "
	     "of them: delivered, retried (rescheduled) or dead.");
	for (int i = 0; i < OUT__COUNT; i++)
		fprintf(f, "idemflow_dispatch_endpoint_deliveries_total{result=\"%s\"} %llu\n",
		        outcome_names[i], dm.ep_deliveries[i]);
	help(f, "idemflow_dispatch_endpoints_disabled_total", "counter",
	     "Tenant endpoints this dispatcher disabled for failing (endpoint_disable_failures "
	     "and endpoint_disable_after).");
	fprintf(f, "idemflow_dispatch_endpoints_disabled_total %llu\n", dm.ep_disabled);
	help(f, "idemflow_dispatch_broker_duplicates_total", "counter",
	     "Delivered events the broker already held and dropped (JetStream acknowledgements "
	     "marked duplicate); also counted as delivered.");
	fprintf(f, "idemflow_dispatch_broker_duplicates_total{sink=\"%s\"} %llu\n", dm.sink,
	        dm.duplicates);
	help(f, "idemflow_dispatch_delivery_lag_seconds", "histogram",
	     "Time from an event's creation (its occurred_at) to its delivery.");
	for (size_t k = 0; k < NLAG; k++) {
		cum += dm.lag_buckets[k];
		fprintf(
		    f,
		    "idemflow_dispatch_delivery_lag_seconds_bucket{sink=\"%s\",le=\"%s\"} %llu\n",
		    dm.sink, lag_le_text[k], cum);
	}
	cum += dm.lag_buckets[NLAG];
	fprintf(f, "idemflow_dispatch_delivery_lag_seconds_bucket{sink=\"%s\",le=\"+Inf\"} %llu\n",
	        dm.sink, cum);
	fprintf(f, "idemflow_dispatch_delivery_lag_seconds_sum{sink=\"%s\"} %.6f\n", dm.sink,
	        dm.lag_sum);
	fprintf(f, "idemflow_dispatch_delivery_lag_seconds_count{sink=\"%s\"} %llu\n", dm.sink,
	        cum);
	help(f, "idemflow_dispatch_delivery_lag_unknown_total", "counter",
	     "Delivered events whose payload has no occurred_at: not in the lag histogram.");
	fprintf(f, "idemflow_dispatch_delivery_lag_unknown_total{sink=\"%s\"} %llu\n", dm.sink,
	        dm.lag_unknown);
}

/* The end of a run's gauges (the file cron runs always had). */
static void write_last_run(FILE *f, const struct dmetrics_run *st, int ok)
{
	struct timeval now;

	gettimeofday(&now, NULL);
	fprintf(f,
	        "# HELP idemflow_dispatch_last_run_timestamp_seconds When the last run ended.\n"
	        "# TYPE idemflow_dispatch_last_run_timestamp_seconds gauge\n"
	        "idemflow_dispatch_last_run_timestamp_seconds %ld.%03ld\n"
	        "# HELP idemflow_dispatch_last_run_success 1 when the last run did its job, 0 "
	        "when it failed (see its log).\n"
	        "# TYPE idemflow_dispatch_last_run_success gauge\n"
	        "idemflow_dispatch_last_run_success %d\n",
	        (long)now.tv_sec, (long)now.tv_usec / 1000, ok);
	if (st != NULL) {
		static const char *const counters[][2] = {
			{ "claimed", "Events the last run claimed." },
			{ "published", "Events the last run delivered." },
			{ "retried", "Events the last run failed to deliver and rescheduled." },
			{ "dead", "Events the last run gave up on (dead letters)." },
			{ "broker_duplicates",
			  "Events the last run delivered that the broker already held and "
			  "dropped (JetStream acknowledgements marked duplicate); also counted in "
			  "published." },
		};
		const long values[] = { st->claimed, st->published, st->retried, st->dead,
			                st->broker_duplicates };
		for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++)
			fprintf(f,
			        "# HELP idemflow_dispatch_last_run_%s %s\n"
			        "# TYPE idemflow_dispatch_last_run_%s gauge\n"
			        "idemflow_dispatch_last_run_%s %ld\n",
			        counters[i][0], counters[i][1], counters[i][0], counters[i][0],
			        values[i]);
		fprintf(f,
		        "# HELP idemflow_dispatch_last_run_duration_seconds How long the last run "
		        "took.\n"
		        "# TYPE idemflow_dispatch_last_run_duration_seconds gauge\n"
		        "idemflow_dispatch_last_run_duration_seconds %.3f\n",
		        st->duration_s);
	}
	/* Only a run that finished counted what is left; a failed one knows
	 * nothing reliable about it. */
	if (st != NULL && ok)
		fprintf(
		    f,
		    "# HELP idemflow_dispatch_outbox_pending Events left undelivered (not dead) "
		    "when the last run ended.\n"
		    "# TYPE idemflow_dispatch_outbox_pending gauge\n"
		    "idemflow_dispatch_outbox_pending %ld\n"
		    "# HELP idemflow_dispatch_outbox_oldest_pending_age_seconds Age of the oldest "
		    "of them.\n"
		    "# TYPE idemflow_dispatch_outbox_oldest_pending_age_seconds gauge\n"
		    "idemflow_dispatch_outbox_oldest_pending_age_seconds %.3f\n",
		    st->pending, st->oldest_pending_s);
}

/*
 * Write path through a temporary file in the same directory and rename(2):
 * the collector reads either the previous file or this one, never half of
 * one. The temporary name does not end in .prom, so the collector never
 * reads it. final: with the last run's gauges (st, ok).
 */
static int write_file(const char *path, int final, const struct dmetrics_run *st, int ok,
                      struct err *e)
{
	char tmp[4096];
	FILE *f;
	int n;

	n = snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
	if (n < 0 || (size_t)n >= sizeof(tmp))
		return err_set(e, ERR_CONFIG, "textfile path too long");
	f = fopen(tmp, "w");
	if (f == NULL)
		return err_set(e, ERR_CONFIG, "could not write \"%s\": %s", tmp, strerror(errno));
	write_counters(f);
	if (final)
		write_last_run(f, st, ok);
	if (fflush(f) != 0 || ferror(f)) {
		err_set(e, ERR_INTERNAL, "could not write \"%s\": %s", tmp, strerror(errno));
		fclose(f);
		goto fail;
	}
	/* Readable by the collector whatever cron's umask is. */
	fchmod(fileno(f), 0644);
	if (fclose(f) != 0) {
		err_set(e, ERR_INTERNAL, "could not write \"%s\": %s", tmp, strerror(errno));
		goto fail;
	}
	if (rename(tmp, path) < 0) {
		err_set(e, ERR_INTERNAL, "could not rename \"%s\" to \"%s\": %s", tmp, path,
		        strerror(errno));
		goto fail;
	}
	return 0;
fail:
	unlink(tmp);
	return -1;
}

void dmetrics_round(void)
{
	struct err e;

	if (dm.textfile == NULL)
		return;
	dm.last_write = mono_s();
	if (write_file(dm.textfile, 0, NULL, 0, &e) < 0) {
		if (!dm.write_failed)
			log_error("could not write the metrics textfile", "error=%s", LOG_Q(e.msg));
		dm.write_failed = 1;
		return;
	}
	dm.write_failed = 0;
}

int dmetrics_write(const char *path, const struct dmetrics_run *st, int ok, struct err *e)
{
	return write_file(path, 1, st, ok, e);
}
