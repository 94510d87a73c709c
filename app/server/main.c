/*
 * idemflow-fcgi - the FastCGI server: a supervisor and its pre-forked
 * workers (sup.c, worker.c), configured from idemflow.conf and flags.
 */
#include <stdio.h>
#include <string.h>
#include <sysexits.h>

#include "config.h"
#include "core/conf.h"
#include "core/log.h"
#include "server/queries.h"
#include "server/sup.h"

static void usage(FILE *out)
{
	fprintf(out, "Usage: idemflow-fcgi [--config FILE] [--KEY VALUE ...]\n"
	             "Serve the idemflow API over FastCGI with a pool of pre-forked workers.\n"
	             "Signals: TERM/INT finish in-flight requests and exit; HUP reloads the\n"
	             "configuration and replaces the workers one by one.\n\n");
	conf_usage(out);
}

int main(int argc, char **argv)
{
	struct err e;
	int next;
	struct conf *c;

	log_set_component("supervisor");
	c = conf_from_args(argc, argv, &next, &e);
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
	if (queries_check(&e) < 0) {
		fprintf(stderr, "idemflow-fcgi: %s\n", e.msg);
		conf_free(c);
		return EX_SOFTWARE;
	}
	return sup_run(c, argc, argv);
}
