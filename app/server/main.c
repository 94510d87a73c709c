/*
 * idemflow-fcgi - the FastCGI server: a supervisor and its pre-forked
 * workers (sup.c, worker.c), configured from idemflow.conf and flags.
 */
#include <stdio.h>
#include <string.h>
#include <sysexits.h>

#include "config.h"
#include "core/conf.h"
#include "core/conftest.h"
#include "core/log.h"
#include "server/metrics.h"
#include "server/queries.h"
#include "server/sup.h"

static void usage(FILE *out)
{
	fprintf(out, "Usage: idemflow-fcgi [--config FILE] [--KEY VALUE ...] [-t [-q] | -T]\n"
	             "Serve the idemflow API over FastCGI with a pool of pre-forked workers.\n"
	             "  -t  test the configuration (values, a database named) and exit: 0 or 78\n"
	             "  -T  the same, and print the effective configuration, secrets masked\n"
	             "  -q  with -t: print nothing on success, nor when no database is named\n"
	             "Signals: TERM/INT finish in-flight requests and exit; HUP reloads the\n"
	             "configuration and replaces the workers one by one.\n\n");
	conf_usage(out, CONF_SERVER);
}

/* What only the server reads, checked as it is on start and reload. */
static int server_check(const struct conf *c, struct err *e)
{
	return metrics_allow_match(c->metrics_allow, NULL, e) < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
	struct err e;
	int next, tflags;
	struct conf *c;

	log_set_component("supervisor");
	tflags = conftest_take_flags(&argc, argv);
	c = conf_from_args(argc, argv, &next, &e);
	if (tflags != 0 && c != NULL && next < argc) {
		fprintf(stderr, "idemflow-fcgi: -t and -T take no other argument (\"%s\")\n",
		        argv[next]);
		conf_free(c);
		return EX_USAGE;
	}
	if (tflags != 0)
		return conftest_run("idemflow-fcgi", tflags, c, &e, server_check);
	if (c == NULL) {
		fprintf(stderr, "idemflow-fcgi: %s\n", e.msg);
		return EX_CONFIG;
	}
	if (next < argc) {
		int rc = EX_OK;
		if (strcmp(argv[next], "-h") == 0 || strcmp(argv[next], "--help") == 0) {
			usage(stdout);
		} else if (strcmp(argv[next], "--version") == 0) {
			printf("idemflow-fcgi %s\n", PACKAGE_VERSION);
		} else {
			fprintf(stderr, "idemflow-fcgi: unexpected argument \"%s\"\n", argv[next]);
			usage(stderr);
			rc = EX_USAGE;
		}
		conf_free(c);
		return rc;
	}
	log_min_level = c->log_level;
	/* A statement whose parameters drifted from its SQL is a bug: refuse
	 * to start, rather than answer 500 for it later. */
	if (queries_for(c->routing) == NULL) {
		fprintf(stderr, "idemflow-fcgi: routing = \"%s\": expected direct or proxy\n",
		        c->routing);
		conf_free(c);
		return EX_CONFIG;
	}
	if (queries_check(&e) < 0) {
		fprintf(stderr, "idemflow-fcgi: %s\n", e.msg);
		conf_free(c);
		return EX_SOFTWARE;
	}
	return sup_run(c, argc, argv);
}
