/* sup.c - pre-fork supervisor (see sup.h). */
#include "server/sup.h"

#include <errno.h>
#include <fcgiapp.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "server/metrics.h"
#include "server/scoreboard.h"
#include "server/notify.h"
#include "server/worker.h"

_Static_assert(SCOREBOARD_SLOTS == METRICS_SLOTS, "a worker's slot is both");

#define MAX_CHILDREN  1024
#define YOUNG_SECONDS 5 /* a worker dying younger than this counts as a crash */
#define BACKOFF_MAX   30

/*
 * Deadlines (a retiring worker's SIGKILL, the respawn back-off) are kept
 * in milliseconds of CLOCK_MONOTONIC, and the next tick is armed for the
 * nearest one. In whole seconds of time(NULL), "now + 1 s" taken at
 * 12:00:00.9 was due at 12:00:01.0, and any wake-up then (a SIGCHLD, a
 * readiness report) cut a 1 s shutdown_timeout to 0.1 s.
 */
struct child {
	pid_t pid;
	unsigned gen;
	int slot; /* its metrics slot */
	time_t started;
	long long kill_at;              /* when retiring: SIGKILL at this (ms); 0 = not retiring */
	int killed;                     /* SIGKILL sent at kill_at; waiting to reap it */
	unsigned long long slow_logged; /* the slot's request number last logged slow */
	int terminated;                 /* killed by request_terminate_timeout */
	int ready;                      /* reported its database connection up (notify.h) */
};

struct sup {
	struct conf *conf;
	int argc;
	char **argv;
	int listen_fd;
	int socket_activated; /* listen_fd came from systemd: never unlink its path */
	struct child kids[MAX_CHILDREN];
	int nkids;
	unsigned gen;
	int crash_streak;
	long long respawn_at; /* back-off: no spawning before this (ms) */
	int stopping;
	int ready_sent; /* READY=1 told for this generation */
};

static volatile sig_atomic_t got_chld, got_term, got_hup, got_alrm, got_usr1, got_io;

static void on_signal(int sig)
{
	switch (sig) {
	case SIGCHLD: got_chld = 1; break;
	case SIGTERM:
	case SIGINT: got_term = 1; break;
	case SIGHUP: got_hup = 1; break;
	case SIGALRM: got_alrm = 1; break;
	case SIGUSR1: got_usr1 = 1; break;
	case SIGIO: got_io = 1; break;
	}
}

/* msg with error=<e's message>, quoted and escaped as logfmt needs. */
static void log_failure(const char *msg, const struct err *e)
{
	char line[512];
	size_t n = 0;

	log_kv(line, sizeof(line), &n, "error", e->msg);
	log_error(msg, "%s", line);
}

/* CLOCK_MONOTONIC in milliseconds: never steps, never 0 after boot. */
static long long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int is_unix_path(const char *listen)
{
	return strchr(listen, '/') != NULL;
}

/* The listening socket's flags for the workers: they wait in ppoll() and
 * then accept(), non-blocking, so the losers of a race for one connection
 * go back to waiting; never passed on to a program a worker runs. */
static void listener_flags(int fd)
{
	int flags = fcntl(fd, F_GETFL);

	fcntl(fd, F_SETFL, flags | O_NONBLOCK);
	fcntl(fd, F_SETFD, FD_CLOEXEC);
}

#define SD_LISTEN_FDS_START 3

/*
 * The socket systemd passed (a socket unit, sd_listen_fds(3) semantics):
 * LISTEN_PID names this process and LISTEN_FDS says how many descriptors
 * start at 3. Returns the one listening stream socket; -2 when none was
 * passed to this process (bind listen ourselves); -1, logged, when what
 * was passed is not one listening stream socket. The variables are
 * removed either way, so no child takes them for its own.
 */
static int systemd_listener(void)
{
	const char *pid = getenv("LISTEN_PID"), *n = getenv("LISTEN_FDS");
	char *end;
	long lpid, nfds;
	int fd = SD_LISTEN_FDS_START, type = 0, acc = 0;
	socklen_t len = sizeof(type);
	int rc = -2;

	if (pid == NULL || n == NULL)
		goto out;
	errno = 0;
	lpid = strtol(pid, &end, 10);
	if (errno != 0 || end == pid || *end != '\0' || lpid != (long)getpid())
		goto out; /* meant for another process */
	nfds = strtol(n, &end, 10);
	if (end == n || *end != '\0' || nfds != 1) {
		log_error("expected one socket from systemd", "LISTEN_FDS=%s", LOG_Q(n));
		rc = -1;
		goto out;
	}
	errno = 0;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_STREAM ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &(socklen_t){ sizeof(acc) }) < 0 ||
	    !acc) {
		log_error("the socket from systemd is no listening stream socket", "fd=%d error=%s",
		          fd, LOG_Q(errno ? strerror(errno) : "wrong type"));
		rc = -1;
		goto out;
	}
	listener_flags(fd);
	rc = fd;
out:
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return rc;
}

/* Bind the socket once, before any fork: every worker inherits it. */
static int open_listener(const struct conf *c)
{
	int fd;

	if (is_unix_path(c->listen)) {
		struct sockaddr_un sun;
		int probe;

		if (strlen(c->listen) >= sizeof(sun.sun_path)) {
			log_error("socket path too long", "listen=%s", LOG_Q(c->listen));
			return -1;
		}
		/* Refuse to steal the socket of a running server; remove a stale one. */
		memset(&sun, 0, sizeof(sun));
		sun.sun_family = AF_UNIX;
		strcpy(sun.sun_path, c->listen);
		probe = socket(AF_UNIX, SOCK_STREAM, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&sun, sizeof(sun)) == 0) {
			close(probe);
			log_error("socket is in use by another server", "listen=%s",
			          LOG_Q(c->listen));
			return -1;
		}
		if (probe >= 0)
			close(probe);
		unlink(c->listen);
	}
	fd = FCGX_OpenSocket(c->listen, 1024);
	if (fd < 0) {
		log_error("could not listen", "listen=%s error=%s", LOG_Q(c->listen),
		          LOG_Q(strerror(errno)));
		return -1;
	}
	if (is_unix_path(c->listen) && chmod(c->listen, (mode_t)c->listen_mode) < 0) {
		log_error("could not set socket permissions", "listen=%s error=%s",
		          LOG_Q(c->listen), LOG_Q(strerror(errno)));
		close(fd);
		return -1;
	}
	listener_flags(fd);
	return fd;
}

/* The lowest metrics slot no live worker uses, so a respawned worker adds
 * to the counts of the one it replaces. With more live workers than slots
 * (a reload that shrinks a big pool), slots are shared, which the atomic
 * counters allow. */
static int free_slot(const struct sup *s)
{
	unsigned char used[METRICS_SLOTS] = { 0 };

	for (int i = 0; i < s->nkids; i++)
		used[s->kids[i].slot] = 1;
	for (int i = 0; i < METRICS_SLOTS; i++)
		if (!used[i])
			return i;
	return s->nkids % METRICS_SLOTS;
}

static void spawn(struct sup *s)
{
	pid_t pid;
	int slot;

	if (s->nkids >= MAX_CHILDREN)
		return;
	slot = free_slot(s);
	pid = fork();
	if (pid < 0) {
		log_error("could not fork a worker", "error=%s", LOG_Q(strerror(errno)));
		s->respawn_at = mono_ms() + 1000;
		return;
	}
	if (pid == 0) {
		sigset_t none;
		struct sigaction usr1;
		/* A SIGUSR1 forwarded before worker_run installs its handlers
		 * must still reopen the log: the supervisor's handler, inherited,
		 * would only set a flag nobody reads in this process. */
		memset(&usr1, 0, sizeof(usr1));
		usr1.sa_handler = log_reopen_on_signal;
		sigemptyset(&usr1.sa_mask);
		sigaction(SIGUSR1, &usr1, NULL);
		metrics_use_slot(slot);
		scoreboard_use_slot(slot);
		notify_forget();
		sigemptyset(&none);
		/* The child starts with the supervisor's mask; worker_run sets its own. */
		sigprocmask(SIG_SETMASK, &none, NULL);
		_exit(worker_run(s->conf, s->listen_fd));
	}
	s->kids[s->nkids++] =
	    (struct child){ .pid = pid, .gen = s->gen, .slot = slot, .started = time(NULL) };
	metrics_set_workers(s->nkids);
	log_debug("worker spawned", "worker_pid=%ld gen=%u slot=%d", (long)pid, s->gen, slot);
}

/* SIGTERM now, SIGKILL once shutdown_timeout has passed (maintain()). */
static void retire(struct sup *s, struct child *k)
{
	k->kill_at = mono_ms() + s->conf->shutdown_timeout;
	log_debug("retiring worker", "worker_pid=%ld gen=%u shutdown_timeout_ms=%ld", (long)k->pid,
	          k->gen, (long)s->conf->shutdown_timeout);
	kill(k->pid, SIGTERM);
}

static void reap(struct sup *s)
{
	int status;
	pid_t pid;

	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		int i;
		for (i = 0; i < s->nkids && s->kids[i].pid != pid; i++)
			;
		if (i == s->nkids)
			continue;
		struct child k = s->kids[i];
		s->kids[i] = s->kids[--s->nkids];
		metrics_set_workers(s->nkids);
		scoreboard_slot_free(k.slot);
		long uptime = (long)(time(NULL) - k.started);
		/* A worker killed for its request was counted as terminated,
		 * and is no crash to back off from. */
		int expected = k.kill_at != 0 || s->stopping || k.terminated;
		int clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;

		if (WIFSIGNALED(status)) {
			char name[96];
			size_t n = 0;
			log_kv(name, sizeof(name), &n, "signal_name", strsignal(WTERMSIG(status)));
			LOG_AT(expected ? LOG_INFO : LOG_WARNING, "worker exited",
			       "worker_pid=%ld signal=%d %s uptime_s=%ld", (long)pid,
			       WTERMSIG(status), name, uptime);
		} else {
			LOG_AT(clean ? LOG_INFO : LOG_WARNING, "worker exited",
			       "worker_pid=%ld exit_code=%d uptime_s=%ld", (long)pid,
			       WEXITSTATUS(status), uptime);
		}
		if (expected || clean)
			continue;
		/* Planned exits (stop, reload, max_requests) are not restarts. */
		metrics_worker_restarted();
		/* Crash storm back-off: immediate respawns for the first two
		 * young deaths in a row, then 1 s, 2 s, 4 s ... 30 s. */
		if (uptime < YOUNG_SECONDS) {
			s->crash_streak++;
			if (s->crash_streak > 2) {
				int d = 1 << (s->crash_streak - 3 > 5 ? 5 : s->crash_streak - 3);
				if (d > BACKOFF_MAX)
					d = BACKOFF_MAX;
				s->respawn_at = mono_ms() + (long long)d * 1000;
				log_warning("workers keep crashing; delaying respawn",
				            "delay_s=%d crashes_in_a_row=%d", d, s->crash_streak);
			}
		} else {
			s->crash_streak = 0;
		}
	}
}

/*
 * The supervisor's look at the scoreboard, on every tick: a worker blocked
 * in the database cannot tell that its request is slow, so the supervisor
 * does. A request in hand for longer than request_slowlog_timeout gets one
 * log line (the slot's request number tells one request from the next);
 * one in hand for longer than request_terminate_timeout has its worker
 * killed (SIGKILL: the worker may be blocked in a system call, and its
 * database connection, closed with it, takes the open transaction along);
 * reap() then replaces it. Also samples the listen queue, for its
 * high-water mark.
 */
static void watch(struct sup *s)
{
	const long slow_ms = s->conf->request_slowlog_timeout;
	const long kill_ms = s->conf->request_terminate_timeout;

	scoreboard_sample_queue();
	if (slow_ms <= 0 && kill_ms <= 0)
		return;
	for (int i = 0; i < s->nkids; i++) {
		struct child *k = &s->kids[i];
		long min = slow_ms > 0 && (kill_ms <= 0 || slow_ms < kill_ms) ? slow_ms : kill_ms;
		struct sb_late late;
		char line[512];
		size_t n = 0;

		if (k->terminated || !scoreboard_late(k->slot, k->pid, min, &late))
			continue;
		log_kv(line, sizeof(line), &n, "request_id", late.request_id);
		log_kv(line, sizeof(line), &n, "method", late.method);
		log_kv(line, sizeof(line), &n, "route", late.route);
		log_kv(line, sizeof(line), &n, "stage", scoreboard_stage_name(late.stage));
		if (slow_ms > 0 && late.elapsed_s * 1000 >= (double)slow_ms &&
		    k->slow_logged != late.request_no) {
			k->slow_logged = late.request_no;
			scoreboard_count_slow();
			log_warning("slow request", "worker_pid=%ld %s elapsed_ms=%.0f",
			            (long)k->pid, line, late.elapsed_s * 1000);
		}
		if (kill_ms > 0 && late.elapsed_s * 1000 >= (double)kill_ms) {
			k->terminated = 1;
			scoreboard_count_terminated();
			log_error("request ran past request_terminate_timeout; killing its worker",
			          "worker_pid=%ld %s elapsed_ms=%.0f", (long)k->pid, line,
			          late.elapsed_s * 1000);
			kill(k->pid, SIGKILL);
		}
	}
}

/* Keep the earlier of *due and at (ms; -1 = none). */
static void due_min(long long *due, long long at)
{
	if (*due < 0 || at < *due)
		*due = at;
}

/* Bring the pool to its configured size and generation. Returns the
 * monotonic time (ms) of the next deadline it waits for, -1 when none. */
static long long maintain(struct sup *s)
{
	long long now = mono_ms(), due = -1;
	int cur = 0, old = 0, retiring = 0;

	for (int i = 0; i < s->nkids; i++) {
		struct child *k = &s->kids[i];
		if (k->kill_at) {
			retiring++;
			if (k->killed) {
				continue; /* its SIGCHLD is on the way */
			} else if (now >= k->kill_at) {
				log_warning("worker did not stop in time; killing it",
				            "worker_pid=%ld", (long)k->pid);
				kill(k->pid, SIGKILL);
				k->killed = 1;
			} else {
				due_min(&due, k->kill_at);
			}
		} else if (k->gen == s->gen) {
			cur++;
		} else {
			old++;
		}
	}
	if (s->stopping)
		return due;
	/* Rolling replacement: one old worker at a time, after its
	 * successor has been forked. */
	if (old > 0 && retiring == 0) {
		if (cur < s->conf->workers) {
			spawn(s);
			cur++;
		}
		for (int i = 0; i < s->nkids; i++) {
			if (s->kids[i].gen != s->gen && !s->kids[i].kill_at) {
				retire(s, &s->kids[i]);
				due_min(&due, s->kids[i].kill_at);
				break;
			}
		}
		old--;
	}
	if (cur + old < s->conf->workers) {
		if (now < s->respawn_at) {
			due_min(&due, s->respawn_at);
			return due;
		}
		while (cur + old < s->conf->workers && s->nkids < MAX_CHILDREN) {
			spawn(s);
			cur++;
		}
	}
	for (int i = 0; i < s->nkids && cur > s->conf->workers; i++) {
		if (s->kids[i].gen == s->gen && !s->kids[i].kill_at) {
			retire(s, &s->kids[i]);
			due_min(&due, s->kids[i].kill_at);
			cur--;
		}
	}
	return due;
}

/* --- The service manager (notify.h): readiness, reloads, status, watchdog. */

/* Mark the workers whose readiness reports came in. */
static void ready_reports_read(struct sup *s)
{
	enum { BATCH = 64 };
	pid_t pids[BATCH];
	int n;

	do {
		n = notify_ready_reports(pids, BATCH);
		for (int j = 0; j < n; j++)
			for (int i = 0; i < s->nkids; i++)
				if (s->kids[i].pid == pids[j])
					s->kids[i].ready = 1;
	} while (n == BATCH);
}

/* READY=1 once as many workers of the current generation as configured
 * hold their database connection (at start, and after each reload), and
 * a STATUS= line whenever the counts change (busy from the scoreboard;
 * idle: ready and not busy). Workers being retired are
 * not counted: they take no new request. */
static void pool_notify(struct sup *s)
{
	int live = 0, ready = 0, busy;
	struct sb_pool sb;
	const char *failed;

	if (!notify_enabled())
		return;
	if (s->stopping) {
		notify_send(NULL, "stopping: %d workers left", s->nkids);
		return;
	}
	for (int i = 0; i < s->nkids; i++) {
		if (s->kids[i].kill_at)
			continue;
		live++;
		if (s->kids[i].gen == s->gen && s->kids[i].ready)
			ready++;
	}
	scoreboard_pool(&sb);
	busy = sb.active < ready ? sb.active : ready;
	/* A refused reload stays in the status line until one is taken:
	 * "systemctl status" shows it, not only the log. */
	failed = sb.reload_ok ? "" : "; reload failed, running the previous configuration";
	if (!s->ready_sent && ready >= s->conf->workers) {
		s->ready_sent = 1;
		notify_send("READY=1", "%d workers, %d ready, %d busy, %d idle%s", live, ready,
		            busy, ready - busy, failed);
	} else if (!s->ready_sent) {
		notify_send(NULL, "%s: %d of %d workers ready", s->gen ? "reloading" : "starting",
		            ready, s->conf->workers);
	} else {
		notify_send(NULL, "%d workers, %d ready, %d busy, %d idle%s", live, ready, busy,
		            ready - busy, failed);
	}
}

/* SIGHUP: the service is reloading until the new generation is ready
 * (or, when the configuration is refused, the old one again). */
static void reload_notify(struct sup *s)
{
	if (!notify_enabled())
		return;
	s->ready_sent = 0;
	notify_send("RELOADING=1", "reloading the configuration");
}

/* The next tick: in wait_us (-1: none), and no later than the next
 * watchdog ping; none when neither. */
static void timer_arm(long long wait_us)
{
	long long us = wait_us, wd = notify_watchdog_wait_us();
	struct itimerval it = { 0 };

	if (wd >= 0 && (us < 0 || wd < us))
		us = wd;
	if (us == 0)
		us = 1; /* due now: 0 would disarm the timer */
	if (us < 0)
		us = 0;
	it.it_value.tv_sec = (time_t)(us / 1000000);
	it.it_value.tv_usec = (suseconds_t)(us % 1000000);
	setitimer(ITIMER_REAL, &it, NULL);
}

static void reload(struct sup *s)
{
	struct err e;
	int next;
	struct conf *c = conf_from_args(s->argc, s->argv, &next, &e);

	if (c == NULL) {
		log_failure("configuration not reloaded; keeping the old one", &e);
		scoreboard_config_reloaded(0);
		return;
	}
	/* Checked here, not by the parser: only the server reads these. The
	 * log file is opened last, once nothing else can refuse the reload. */
	if (metrics_allow_match(c->metrics_allow, NULL, &e) < 0 ||
	    (strcmp(c->log_file, s->conf->log_file) != 0 && log_open(c->log_file, &e) < 0)) {
		log_failure("configuration not reloaded; keeping the old one", &e);
		scoreboard_config_reloaded(0);
		conf_free(c);
		return;
	}
	if (strcmp(c->listen, s->conf->listen) != 0) {
		log_warning("listen cannot change on reload; restart to apply it", "listen=%s",
		            LOG_Q(s->conf->listen));
		free(c->listen);
		c->listen = strdup(s->conf->listen);
	}
	conf_free(s->conf);
	s->conf = c;
	log_min_level = c->log_level;
	log_line_format = c->log_format;
	s->gen++;
	s->crash_streak = 0;
	s->respawn_at = 0;
	scoreboard_config_reloaded(1);
	log_info("configuration reloaded; replacing workers", "gen=%u workers=%d", s->gen,
	         c->workers);
}

static void begin_stop(struct sup *s)
{
	if (s->stopping)
		return;
	s->stopping = 1;
	log_info("stopping: letting in-flight requests finish", "workers=%d", s->nkids);
	if (notify_enabled())
		notify_send("STOPPING=1", "stopping: %d workers left", s->nkids);
	for (int i = 0; i < s->nkids; i++)
		if (!s->kids[i].kill_at)
			retire(s, &s->kids[i]);
}

/* After the listener is up, before the first fork. */
static void notify_start(void)
{
	const char *why;

	if (notify_open(&why))
		log_info("notifying the service manager", "watchdog_usec=%llu",
		         notify_watchdog_usec());
	else if (why != NULL)
		log_warning("not notifying the service manager", "reason=%s", LOG_Q(why));
}

static int write_pid_file(const char *path)
{
	FILE *f;

	if (path == NULL || *path == '\0')
		return 0;
	f = fopen(path, "w");
	if (f == NULL) {
		log_error("could not write pid file", "pid_file=%s error=%s", LOG_Q(path),
		          LOG_Q(strerror(errno)));
		return -1;
	}
	fprintf(f, "%ld\n", (long)getpid());
	fclose(f);
	return 0;
}

int sup_run(struct conf *c, int argc, char **argv)
{
	static struct sup s; /* large: keep it off the stack */
	struct sigaction sa;
	sigset_t handled, waitmask;
	char *pid_file = NULL;
	struct err e;

	s.conf = c;
	s.argc = argc;
	s.argv = argv;
	log_set_component("supervisor");

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigemptyset(&handled);
	int sigs[] = { SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGALRM, SIGUSR1, SIGIO };
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		sigaddset(&handled, sigs[i]);
		sigaction(sigs[i], &sa, NULL);
	}
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	sigprocmask(SIG_BLOCK, &handled, &waitmask);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigdelset(&waitmask, sigs[i]);

	log_line_format = c->log_format;
	if (log_open(c->log_file, &e) < 0) {
		log_failure("could not open the log file", &e);
		return EX_CANTCREAT;
	}
	if (metrics_allow_match(c->metrics_allow, NULL, &e) < 0) {
		log_failure("bad configuration", &e);
		return EX_CONFIG;
	}
	/* Before the first fork: every worker inherits the mappings. */
	if (metrics_init(&e) < 0 || scoreboard_init(&e) < 0) {
		log_failure("could not start", &e);
		return EX_OSERR;
	}
	/* A socket from systemd outlives this process: it stays open, and
	 * keeps its queue, while the server restarts. */
	s.listen_fd = systemd_listener();
	s.socket_activated = s.listen_fd >= 0;
	if (s.listen_fd == -2)
		s.listen_fd = open_listener(c);
	if (s.listen_fd < 0)
		return EX_OSERR;
	scoreboard_set_listener(s.listen_fd);
	if (write_pid_file(c->pid_file) < 0)
		return EX_CANTCREAT;
	pid_file = strdup(c->pid_file);
	if (s.socket_activated)
		log_info("listening on the socket from systemd", "fd=%d workers=%d", s.listen_fd,
		         c->workers);
	else
		log_info("listening", "listen=%s workers=%d", LOG_Q(c->listen), c->workers);
	notify_start();

	for (;;) {
		long long due = maintain(&s), tick_us = 1000000;

		pool_notify(&s);
		notify_watchdog();
		if (s.stopping && s.nkids == 0)
			break;
		/* A tick every second, pending or not: watch() runs on it;
		 * sooner when a deadline is due sooner; and no later than the
		 * next watchdog ping. */
		watch(&s);
		if (due >= 0) {
			long long left_ms = due - mono_ms();
			if (left_ms < 0)
				left_ms = 0;
			if (left_ms * 1000 < tick_us)
				tick_us = left_ms * 1000;
		}
		timer_arm(tick_us);
		while (!got_chld && !got_term && !got_hup && !got_alrm && !got_usr1 && !got_io)
			sigsuspend(&waitmask);
		if (got_io) {
			got_io = 0;
			ready_reports_read(&s);
		}
		if (got_chld) {
			got_chld = 0;
			reap(&s);
		}
		if (got_term) {
			got_term = 0;
			begin_stop(&s);
		}
		if (got_hup) {
			got_hup = 0;
			if (!s.stopping) {
				reload_notify(&s);
				reload(&s);
			}
		}
		if (got_usr1) {
			got_usr1 = 0;
			/* logrotate moved the file: reopen it here, then in every
			 * worker (each holds its own descriptor). */
			log_reopen();
			for (int i = 0; i < s.nkids; i++)
				kill(s.kids[i].pid, SIGUSR1);
		}
		got_alrm = 0;
	}
	notify_close();
	timer_arm(-1);
	close(s.listen_fd);
	if (!s.socket_activated && is_unix_path(s.conf->listen))
		unlink(s.conf->listen);
	if (pid_file && *pid_file)
		unlink(pid_file);
	free(pid_file);
	log_info("stopped", NULL);
	conf_free(s.conf);
	return EX_OK;
}
