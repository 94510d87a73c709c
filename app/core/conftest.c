/* conftest.c - the configuration test, -t and -T (see conftest.h). */
#include "core/conftest.h"

#include <ctype.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

int conftest_take_flags(int *argc, char **argv)
{
	int flags = 0, out = 1, quiet = 0;

	for (int i = 1; i < *argc; i++) {
		const char *a = argv[i];

		/* Ours only before "--" or a command (idemflow's "migrate"). */
		if (strcmp(a, "--") == 0 || a[0] != '-') {
			while (i < *argc)
				argv[out++] = argv[i++];
			break;
		}
		if (strcmp(a, "-t") == 0) {
			flags |= CONFTEST_TEST;
			continue;
		}
		if (strcmp(a, "-T") == 0) {
			flags |= CONFTEST_DUMP;
			continue;
		}
		if (strcmp(a, "-q") == 0) {
			quiet = 1;
			continue;
		}
		argv[out++] = argv[i];
		/* The value of "--key value" is never a flag of ours. */
		if (strncmp(a, "--", 2) == 0 && strchr(a, '=') == NULL && !conf_is_bool(a + 2) &&
		    i + 1 < *argc)
			argv[out++] = argv[++i];
	}
	if (quiet && flags == 0) {
		/* Not ours alone: put it back, first, for the program to refuse. */
		memmove(argv + 2, argv + 1, (size_t)(out - 1) * sizeof(*argv));
		argv[1] = (char *)"-q";
		out++;
	} else if (quiet) {
		flags |= CONFTEST_QUIET;
	}
	argv[out] = NULL;
	*argc = out;
	return flags;
}

/* 1 when the service file at path has a section [name] that names a
 * database: dbname, host or hostaddr. A section with only user= (as the
 * shipped pg_service.conf before it is configured) names none. */
static int service_names_db(const char *path, const char *name)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	size_t n = strlen(name);
	int in = 0, found = 0;

	if (f == NULL)
		return 0;
	while (!found && fgets(line, sizeof(line), f) != NULL) {
		char *p = line;
		while (isspace((unsigned char)*p))
			p++;
		if (*p == '[')
			in = strncmp(p + 1, name, n) == 0 && p[1 + n] == ']';
		else if (in && (strncmp(p, "dbname", 6) == 0 || strncmp(p, "hostaddr", 8) == 0 ||
		                strncmp(p, "host", 4) == 0)) {
			p += strcspn(p, "= \t");
			while (*p == ' ' || *p == '\t')
				p++;
			found = *p == '=';
		}
	}
	fclose(f);
	return found;
}

int conftest_db_named(const struct conf *c, struct err *e)
{
	const char *svc = getenv("PGSERVICE"), *file = getenv("PGSERVICEFILE");
	const char *sysdir = getenv("PGSYSCONFDIR"), *home = getenv("HOME");
	char path[4096];

	if (*c->db) {
		char *why = NULL;
		PQconninfoOption *opts = PQconninfoParse(c->db, &why);
		if (opts == NULL) {
			size_t n = why != NULL ? strlen(why) : 0;
			while (n > 0 && why[n - 1] == '\n')
				why[--n] = '\0';
			err_set(e, ERR_CONFIG, "invalid value for \"db\": %s",
			        why != NULL ? why : "out of memory");
			PQfreemem(why);
			return -1;
		}
		PQconninfoFree(opts);
		return 0;
	}
	if (svc != NULL && *svc) {
		if (file != NULL && *file) {
			if (service_names_db(file, svc))
				return 0;
		} else if (home != NULL && *home) {
			snprintf(path, sizeof(path), "%s/.pg_service.conf", home);
			if (service_names_db(path, svc))
				return 0;
		}
		if (sysdir != NULL && *sysdir) {
			snprintf(path, sizeof(path), "%s/pg_service.conf", sysdir);
			if (service_names_db(path, svc))
				return 0;
		}
		return err_set(e, ERR_CONFIG,
		               "no database configured: \"db\" is not set%s%s and the service "
		               "[%s] names no dbname or host in %s",
		               c->config_file ? " in " : "", c->config_file ? c->config_file : "",
		               svc,
		               file != NULL && *file ? file : "the service file ($PGSERVICEFILE)");
	}
	if ((getenv("PGDATABASE") && *getenv("PGDATABASE")) ||
	    (getenv("PGHOST") && *getenv("PGHOST")))
		return 0;
	return err_set(e, ERR_CONFIG, "no database configured: \"db\" is not set%s%s",
	               c->config_file ? " in " : "", c->config_file ? c->config_file : "");
}

int conftest_run(const char *prog, int flags, struct conf *c, const struct err *parse_err,
                 conftest_check_fn check)
{
	struct err e = { 0 };
	const char *file = "";
	int quiet = flags & CONFTEST_QUIET;

	if (c == NULL) {
		fprintf(stderr, "%s: %s\n%s: configuration test failed\n", prog, parse_err->msg,
		        prog);
		return EX_CONFIG;
	}
	if (c->config_file != NULL)
		file = c->config_file;
	/* conf_from_args() ran conf_check(): the values and their relations. */
	if (check != NULL && check(c, &e) < 0)
		goto fail;
	if (conftest_db_named(c, &e) < 0) {
		/* Not configured yet is no error to report under -q: the guard
		 * of a cron job on a fresh installation. */
		if (quiet && strncmp(e.msg, "no database configured", 22) == 0) {
			conf_free(c);
			return EX_CONFIG;
		}
		goto fail;
	}
	if (flags & CONFTEST_DUMP)
		conf_dump(c, stdout);
	if (!quiet)
		fprintf(stderr, "%s: configuration file %s test is successful\n", prog,
		        *file ? file : "(none)");
	conf_free(c);
	return EX_OK;
fail:
	fprintf(stderr, "%s: %s\n%s: configuration file %s test failed\n", prog, e.msg, prog,
	        *file ? file : "(none)");
	conf_free(c);
	return EX_CONFIG;
}
