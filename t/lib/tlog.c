/*
 * Reading the pool's log: which worker answered; see tlog.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf, pipe2, open_memstream */
#endif
#include "tlog.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "tstack.h"
#include "twait.h"

static char *tstack_slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *text = NULL, buf[65536];
	size_t len = 0, n;
	FILE *m;

	if (f == NULL)
		return strdup("");
	m = open_memstream(&text, &len);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, m);
	fclose(m);
	fclose(f);
	return text;
}

int tstack_file_contains(const char *path, const char *needle)
{
	char *text = tstack_slurp(path);
	int found = strstr(text, needle) != NULL;

	free(text);
	return found;
}

long tstack_worker_of(const char *log, const char *request_id)
{
	char needle[96];
	double deadline = tstack_now() + 3;

	if (request_id == NULL || *request_id == '\0')
		return 0;
	snprintf(needle, sizeof(needle), "request_id=%s", request_id);
	do {
		char *text = tstack_slurp(log), *at = strstr(text, needle);
		long pid = 0;

		if (at != NULL) {
			char *line = at, *p;
			while (line > text && line[-1] != '\n')
				line--;
			p = strstr(line, " pid=");
			if (p != NULL && p < at)
				pid = atol(p + 5);
		}
		free(text);
		if (pid > 0)
			return pid;
		tstack_sleep_ms(20);
	} while (tstack_now() < deadline);
	return 0;
}

struct tstack_shot {
	struct http_response *(*send)(int i, void *arg);
	void *arg;
	int i;
	pthread_barrier_t *go;
	struct http_response *r;
	char err[256];
};

static void *tstack_shot_run(void *p)
{
	struct tstack_shot *s = p;

	pthread_barrier_wait(s->go);
	s->r = s->send(s->i, s->arg);
	if (s->r == NULL)
		snprintf(s->err, sizeof(s->err), "%s", http_error());
	return NULL;
}

#define TSTACK_MAX_WIDTH 64

int tstack_every_worker(pid_t supervisor, const char *log, int width, int max_bursts,
                        struct http_response *(*send)(int i, void *arg),
                        void (*check)(const struct http_response *r, int i, void *arg), void *arg)
{
	pid_t pids[TSTACK_MAX_WIDTH];
	int seen[TSTACK_MAX_WIDTH] = { 0 };
	size_t npids = tstack_workers(supervisor, pids, TSTACK_MAX_WIDTH), nseen = 0;
	int sent = 0, bursts = 0;

	cr_assert(npids > 0 && npids <= TSTACK_MAX_WIDTH, "%zu workers", npids);
	cr_assert(width > 0 && width <= TSTACK_MAX_WIDTH);
	while (nseen < npids) {
		struct tstack_shot shots[TSTACK_MAX_WIDTH];
		pthread_t th[TSTACK_MAX_WIDTH];
		pthread_barrier_t go;

		cr_assert(bursts++ < max_bursts,
		          "after %d bursts of %d only %zu of %zu workers answered", max_bursts,
		          width, nseen, npids);
		pthread_barrier_init(&go, NULL, (unsigned)width);
		for (int k = 0; k < width; k++) {
			shots[k] = (struct tstack_shot){
				.send = send, .arg = arg, .i = sent + k, .go = &go
			};
			cr_assert_eq(pthread_create(&th[k], NULL, tstack_shot_run, &shots[k]), 0);
		}
		for (int k = 0; k < width; k++)
			pthread_join(th[k], NULL);
		pthread_barrier_destroy(&go);
		for (int k = 0; k < width; k++) {
			const char *rid;
			long pid;

			cr_assert_not_null(shots[k].r, "request %d: %s", sent + k, shots[k].err);
			check(shots[k].r, sent + k, arg);
			rid = http_header(shots[k].r, "X-Request-Id");
			pid = tstack_worker_of(log, rid);
			cr_assert(pid > 0, "no request line for request %s", rid ? rid : "(no id)");
			for (size_t j = 0; j < npids; j++)
				if (pids[j] == pid && !seen[j]) {
					seen[j] = 1;
					nseen++;
				}
			http_response_free(shots[k].r);
		}
		sent += width;
	}
	cr_log_info("every one of %zu workers answered (%d requests in %d bursts)", npids, sent,
	            bursts);
	return sent;
}
