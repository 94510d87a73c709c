/*
 * fuzz_conf.c - the configuration parser: files (conf_load_file, and
 * conf_set through it) and flags (conf_from_args), then the server's own
 * check of metrics_allow (metrics_allow_match).
 *
 * An input that starts with "--" is a command line, one argument a line;
 * anything else is a configuration file. The file reaches conf_load_file
 * through a memfd, so the parser reads it exactly as it reads a real one.
 * A configuration that loads must hold only values inside the documented
 * ranges; one that does not must say where and why.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/conf.h"
#include "fuzz.h"
#include "server/metrics.h"

#define MAX_ARGS 64

static void check_loaded(const struct conf *c)
{
	struct err e = { 0 };
	int m;

	FUZZ_CHECK(c->db && c->listen && c->pid_file && c->application_name && c->log_file &&
	               c->metrics_allow && c->metrics_token && c->backoff && c->sink && c->url &&
	               c->secret && c->amqp_url && c->exchange && c->routing_key && c->exec &&
	               c->textfile,
	           "a NULL string");
	FUZZ_CHECK(c->workers >= 1 && c->workers <= 256, "workers %d", c->workers);
	FUZZ_CHECK(c->max_requests >= 0, "max_requests %d", c->max_requests);
	FUZZ_CHECK(c->listen_mode >= 0 && c->listen_mode <= 0777, "listen_mode %o", c->listen_mode);
	FUZZ_CHECK(c->max_body >= 2 && c->max_body <= 64L * 1024 * 1024, "max_body %ld",
	           c->max_body);
	FUZZ_CHECK(c->max_depth >= 2 && c->max_depth <= 1000, "max_depth %ld", c->max_depth);
	FUZZ_CHECK(c->idempotency_ttl >= 1000 && c->idempotency_wait >= 1 &&
	               c->statement_timeout >= 0 && c->shutdown_timeout >= 0 && c->lease >= 1000 &&
	               c->poll_interval >= 10 && c->timeout >= 1 && c->max_runtime >= 0 &&
	               c->outbox_retention >= 0,
	           "a duration below its minimum");
	FUZZ_CHECK(c->batch >= 1 && c->batch <= 10000 && c->parallel >= 1 && c->parallel <= 64 &&
	               c->max_attempts >= 1 && c->prune_batch >= 1,
	           "a count out of range");
	/* What idemflow-fcgi checks before it starts or reloads. */
	m = metrics_allow_match(c->metrics_allow, "127.0.0.1", &e);
	FUZZ_CHECK(m == 0 || m == 1 || (m == -1 && e.code == ERR_CONFIG), "metrics_allow: %d", m);
	m = metrics_allow_match(c->metrics_allow, "::1", &e);
	FUZZ_CHECK(m == 0 || m == 1 || m == -1, "metrics_allow: %d", m);
}

static void fuzz_file(const uint8_t *data, size_t size)
{
	static int fd = -1;
	static char path[64];
	struct conf *c = conf_new();
	struct err e = { 0 };

	FUZZ_CHECK(c != NULL, "out of memory");
	if (fd < 0) {
		fd = memfd_create("idemflow.conf", 0);
		FUZZ_CHECK(fd >= 0, "memfd_create");
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	}
	FUZZ_CHECK(ftruncate(fd, 0) == 0 && pwrite(fd, data, size, 0) == (ssize_t)size, "write");
	if (conf_load_file(c, path, &e) == 0) {
		FUZZ_CHECK(c->config_file && strcmp(c->config_file, path) == 0, "config_file");
		check_loaded(c);
	} else {
		/* Every complaint names the file and line. */
		FUZZ_CHECK(e.code == ERR_CONFIG || e.code == ERR_INTERNAL, "code %d", (int)e.code);
		FUZZ_CHECK(strncmp(e.msg, path, strlen(path)) == 0 && e.msg[strlen(path)] == ':',
		           "no file:line in \"%s\"", e.msg);
	}
	conf_free(c);
}

static void fuzz_args(const uint8_t *data, size_t size)
{
	char *argv[MAX_ARGS + 2];
	int argc = 0, next = -1;
	size_t start = 0;
	struct conf *c;
	struct err e = { 0 };

	argv[argc++] = strdup("idemflow-fcgi");
	for (size_t i = 0; i <= size && argc < MAX_ARGS; i++) {
		if (i < size && data[i] != '\n')
			continue;
		size_t len = strnlen((const char *)data + start, i - start);
		argv[argc] = malloc(len + 1);
		FUZZ_CHECK(argv[argc] != NULL, "out of memory");
		memcpy(argv[argc], data + start, len);
		argv[argc][len] = '\0';
		start = i + 1;
		/* --config would read whatever file the input names. */
		if (strstr(argv[argc++], "config") != NULL)
			goto out;
	}
	argv[argc] = NULL;
	c = conf_from_args(argc, argv, &next, &e);
	if (c != NULL) {
		FUZZ_CHECK(next >= 1 && next <= argc, "next %d of %d", next, argc);
		check_loaded(c);
		conf_free(c);
	} else {
		FUZZ_CHECK(e.code == ERR_CONFIG && e.msg[0], "code %d", (int)e.code);
	}
out:
	for (int i = 0; i < argc; i++)
		free(argv[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* Only the input may configure: not the environment of the run. */
	unsetenv("IDEMFLOW_CONFIG");
	unsetenv("DATABASE_URL");
	if (size >= 2 && data[0] == '-' && data[1] == '-')
		fuzz_args(data, size);
	else
		fuzz_file(data, size);
	return 0;
}
