/* scoreboard.c - the workers' states in shared memory and the status page (see scoreboard.h). */
#include "server/scoreboard.h"

#include <errno.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/canon.h"
#include "core/ids.h"

struct sb_slot {
	_Alignas(64) atomic_int pid; /* 0: free */
	atomic_int stage;
	atomic_uint seq;              /* odd while the request's fields change */
	atomic_ullong request_no;     /* requests this slot has begun, ever */
	atomic_ullong served;         /* requests of the current worker */
	atomic_llong started_s;       /* the worker's start, s since the epoch */
	atomic_llong req_start_us;    /* CLOCK_MONOTONIC */
	atomic_llong req_duration_us; /* of the last request, once it ended */
	char method[16];
	char route[48];
	char request_id[64];
};

struct sb_shm {
	atomic_llong start_s;
	atomic_ullong slow, terminated, max_children_reached;
	atomic_long max_listen_queue;
	atomic_int max_active;
	atomic_int reload_ok;
	atomic_llong reload_success_s;
	atomic_ullong uuid_floor; /* the pool's last UUIDv7 timestamp (ids_share_clock) */
	struct sb_slot slots[SCOREBOARD_SLOTS];
};

static struct sb_shm *sb;
static struct sb_slot *sb_mine;
static int sb_listen_fd = -1;

static const char *const stage_names[SB__COUNT] = {
	[SB_IDLE] = "idle",
	[SB_READING] = "reading",
	[SB_WAITING_KEY] = "waiting for the key",
	[SB_IN_DB] = "in the database",
	[SB_WRITING] = "writing the answer",
};

const char *scoreboard_stage_name(enum sb_stage s)
{
	return (unsigned)s < SB__COUNT ? stage_names[s] : "unknown";
}

static long long mono_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

int scoreboard_init(struct err *e)
{
	void *p;

	if (sb != NULL)
		return 0;
	p = mmap(NULL, sizeof(struct sb_shm), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
	         -1, 0);
	if (p == MAP_FAILED)
		return err_set(e, ERR_INTERNAL, "could not map %zu bytes for the scoreboard: %s",
		               sizeof(struct sb_shm), strerror(errno));
	sb = p;
	atomic_store(&sb->start_s, (long long)time(NULL));
	atomic_store(&sb->reload_ok, 1);
	atomic_store(&sb->reload_success_s, atomic_load(&sb->start_s));
	/* Workflow ids in order across the pool's workers, respawned ones and
	 * a wall clock stepped back included. */
	ids_share_clock(&sb->uuid_floor);
	return 0;
}

void scoreboard_set_listener(int fd)
{
	sb_listen_fd = fd;
}

void scoreboard_use_slot(int slot)
{
	if (sb == NULL)
		return;
	sb_mine = &sb->slots[slot >= 0 ? slot % SCOREBOARD_SLOTS : 0];
	atomic_store(&sb_mine->stage, SB_IDLE);
	atomic_store(&sb_mine->served, 0);
	atomic_store(&sb_mine->req_start_us, 0);
	atomic_store(&sb_mine->req_duration_us, 0);
	atomic_store(&sb_mine->started_s, (long long)time(NULL));
	/* Even: a predecessor killed while it wrote left it odd. */
	atomic_store(&sb_mine->seq, (atomic_load(&sb_mine->seq) | 1) + 1);
	sb_mine->method[0] = sb_mine->route[0] = sb_mine->request_id[0] = '\0';
	atomic_store(&sb_mine->pid, (int)getpid());
}

void scoreboard_slot_free(int slot)
{
	struct sb_slot *s;

	if (sb == NULL || slot < 0)
		return;
	s = &sb->slots[slot % SCOREBOARD_SLOTS];
	atomic_store(&s->pid, 0);
	atomic_store(&s->stage, SB_IDLE);
}

/* Printable ASCII only: the fields go into text, JSON and log lines as
 * they are. */
static void copy_field(char *dst, size_t size, const char *src)
{
	size_t i = 0;

	for (; src != NULL && src[i] != '\0' && i < size - 1; i++)
		dst[i] = src[i] > ' ' && src[i] < 0x7f ? src[i] : '?';
	dst[i] = '\0';
}

/* Workers busy right now (slots with a live worker not idle), and live. */
static void count_workers(int *busy, int *live)
{
	*busy = *live = 0;
	for (int i = 0; i < SCOREBOARD_SLOTS; i++) {
		if (atomic_load_explicit(&sb->slots[i].pid, memory_order_relaxed) == 0)
			continue;
		(*live)++;
		if (atomic_load_explicit(&sb->slots[i].stage, memory_order_relaxed) != SB_IDLE)
			(*busy)++;
	}
}

void scoreboard_begin(const char *method, enum route route, const char *request_id)
{
	int busy, live;

	if (sb_mine == NULL)
		return;
	atomic_fetch_add_explicit(&sb_mine->seq, 1, memory_order_acq_rel); /* odd */
	copy_field(sb_mine->method, sizeof(sb_mine->method), method);
	copy_field(sb_mine->route, sizeof(sb_mine->route), route_name(route));
	copy_field(sb_mine->request_id, sizeof(sb_mine->request_id), request_id);
	atomic_store_explicit(&sb_mine->req_start_us, mono_us(), memory_order_relaxed);
	atomic_store_explicit(&sb_mine->req_duration_us, -1, memory_order_relaxed);
	atomic_fetch_add_explicit(&sb_mine->request_no, 1, memory_order_relaxed);
	atomic_store_explicit(&sb_mine->stage, SB_READING, memory_order_relaxed);
	atomic_fetch_add_explicit(&sb_mine->seq, 1, memory_order_release); /* even */
	atomic_fetch_add_explicit(&sb_mine->served, 1, memory_order_relaxed);
	/* The last idle worker took this one: until a worker is free again,
	 * every new connection waits in the listen queue. */
	count_workers(&busy, &live);
	if (busy >= live)
		atomic_fetch_add_explicit(&sb->max_children_reached, 1, memory_order_relaxed);
	int hw = atomic_load_explicit(&sb->max_active, memory_order_relaxed);
	while (busy > hw && !atomic_compare_exchange_weak(&sb->max_active, &hw, busy))
		;
}

void scoreboard_stage(enum sb_stage s)
{
	if (sb_mine != NULL)
		atomic_store_explicit(&sb_mine->stage, s, memory_order_relaxed);
}

void scoreboard_end(void)
{
	if (sb_mine == NULL)
		return;
	atomic_store_explicit(
	    &sb_mine->req_duration_us,
	    mono_us() - atomic_load_explicit(&sb_mine->req_start_us, memory_order_relaxed),
	    memory_order_relaxed);
	atomic_store_explicit(&sb_mine->stage, SB_IDLE, memory_order_release);
}

/* A consistent copy of slot s's request fields; 0 when the worker kept
 * rewriting them (then the copy is left empty). */
static int read_request(struct sb_slot *s, struct sb_late *out)
{
	for (int tries = 0; tries < 100; tries++) {
		unsigned a = atomic_load_explicit(&s->seq, memory_order_acquire);
		if (a & 1)
			continue;
		memcpy(out->method, s->method, sizeof(out->method));
		memcpy(out->route, s->route, sizeof(out->route));
		memcpy(out->request_id, s->request_id, sizeof(out->request_id));
		out->request_no = atomic_load_explicit(&s->request_no, memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&s->seq, memory_order_relaxed) == a) {
			out->method[sizeof(out->method) - 1] = '\0';
			out->route[sizeof(out->route) - 1] = '\0';
			out->request_id[sizeof(out->request_id) - 1] = '\0';
			return 1;
		}
	}
	out->method[0] = out->route[0] = out->request_id[0] = '\0';
	return 0;
}

int scoreboard_late(int slot, pid_t pid, long min_ms, struct sb_late *late)
{
	struct sb_slot *s;
	long long start;

	if (sb == NULL || slot < 0)
		return 0;
	s = &sb->slots[slot % SCOREBOARD_SLOTS];
	if (atomic_load(&s->pid) != (int)pid)
		return 0;
	late->stage = (enum sb_stage)atomic_load(&s->stage);
	if (late->stage == SB_IDLE)
		return 0;
	if (!read_request(s, late))
		return 0;
	start = atomic_load(&s->req_start_us);
	late->elapsed_s = (double)(mono_us() - start) / 1e6;
	late->pid = pid;
	/* Read again: the request may have ended meanwhile. */
	late->stage = (enum sb_stage)atomic_load(&s->stage);
	return late->stage != SB_IDLE && late->elapsed_s * 1000 >= (double)min_ms;
}

void scoreboard_count_slow(void)
{
	if (sb != NULL)
		atomic_fetch_add(&sb->slow, 1);
}

void scoreboard_count_terminated(void)
{
	if (sb != NULL)
		atomic_fetch_add(&sb->terminated, 1);
}

void scoreboard_config_reloaded(int ok)
{
	if (sb == NULL)
		return;
	atomic_store(&sb->reload_ok, ok != 0);
	if (ok)
		atomic_store(&sb->reload_success_s, (long long)time(NULL));
}

/* --- The listen queue ------------------------------------------------------ */

/*
 * A unix stream socket's accept queue, from the kernel's sock_diag netlink
 * interface (what "ss -xl" shows as Recv-Q and Send-Q): UNIX_DIAG_RQLEN
 * of a listening socket is its queue length and its backlog. -1 when the
 * kernel does not answer.
 */
static int unix_queue(int fd, long *len, long *max)
{
	struct {
		struct nlmsghdr nlh;
		struct unix_diag_req req;
	} q;
	struct sockaddr_nl nl = { .nl_family = AF_NETLINK };
	struct stat st;
	char ans[8192];
	int s, rc = -1;
	ssize_t n;

	if (fstat(fd, &st) < 0)
		return -1;
	s = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (s < 0)
		return -1;
	memset(&q, 0, sizeof(q));
	q.nlh.nlmsg_len = sizeof(q);
	q.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	q.nlh.nlmsg_flags = NLM_F_REQUEST;
	q.req.sdiag_family = AF_UNIX;
	q.req.udiag_states = 1 << 10; /* TCP_LISTEN */
	q.req.udiag_ino = (unsigned)st.st_ino;
	q.req.udiag_show = UDIAG_SHOW_RQLEN;
	q.req.udiag_cookie[0] = q.req.udiag_cookie[1] = ~0U; /* any */
	if (sendto(s, &q, sizeof(q), 0, (struct sockaddr *)&nl, sizeof(nl)) < 0)
		goto out;
	n = recv(s, ans, sizeof(ans), 0);
	for (struct nlmsghdr *h = (struct nlmsghdr *)ans; n > 0 && NLMSG_OK(h, (size_t)n);
	     h = NLMSG_NEXT(h, n)) {
		if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY)
			break;
		struct unix_diag_msg *m = NLMSG_DATA(h);
		size_t alen = h->nlmsg_len - NLMSG_LENGTH(sizeof(*m));
		for (struct nlattr *a = (struct nlattr *)(m + 1);
		     alen >= sizeof(*a) && a->nla_len >= sizeof(*a) && a->nla_len <= alen;
		     alen -= (size_t)NLA_ALIGN(a->nla_len),
		                   a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len))) {
			if (a->nla_type == UNIX_DIAG_RQLEN &&
			    a->nla_len >= NLA_HDRLEN + sizeof(struct unix_diag_rqlen)) {
				struct unix_diag_rqlen *r =
				    (struct unix_diag_rqlen *)((char *)a + NLA_HDRLEN);
				*len = (long)r->udiag_rqueue;
				*max = (long)r->udiag_wqueue;
				rc = 0;
				goto out;
			}
			if (alen < (size_t)NLA_ALIGN(a->nla_len))
				break;
		}
	}
out:
	close(s);
	return rc;
}

/* A TCP listening socket's accept queue: TCP_INFO on a listener reports
 * its length in tcpi_unacked and its backlog in tcpi_sacked. */
static int tcp_queue(int fd, long *len, long *max)
{
	struct tcp_info ti;
	socklen_t sl = sizeof(ti);

	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &sl) < 0)
		return -1;
	*len = (long)ti.tcpi_unacked;
	*max = (long)ti.tcpi_sacked;
	return 0;
}

static int listen_queue(long *len, long *max)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	if (sb_listen_fd < 0 || getsockname(sb_listen_fd, (struct sockaddr *)&ss, &sl) < 0)
		return -1;
	if (ss.ss_family == AF_UNIX)
		return unix_queue(sb_listen_fd, len, max);
	return tcp_queue(sb_listen_fd, len, max);
}

/* Read the queue and raise the high-water mark; -1 when unknown. */
static long sample_queue(long *backlog)
{
	long len = -1, max = -1, hw;

	if (sb == NULL || listen_queue(&len, &max) < 0) {
		*backlog = -1;
		return -1;
	}
	*backlog = max;
	hw = atomic_load(&sb->max_listen_queue);
	while (len > hw && !atomic_compare_exchange_weak(&sb->max_listen_queue, &hw, len))
		;
	return len;
}

void scoreboard_sample_queue(void)
{
	long backlog;

	(void)sample_queue(&backlog);
}

void scoreboard_pool(struct sb_pool *p)
{
	memset(p, 0, sizeof(*p));
	p->reload_ok = 1; /* no supervisor, no reload */
	if (sb == NULL)
		return;
	p->start_time = atomic_load(&sb->start_s);
	p->start_since = (long long)time(NULL) - p->start_time;
	p->listen_queue = sample_queue(&p->listen_queue_len);
	p->max_listen_queue = p->listen_queue < 0 ? -1 : atomic_load(&sb->max_listen_queue);
	for (int i = 0; i < SCOREBOARD_SLOTS; i++)
		p->accepted += atomic_load_explicit(&sb->slots[i].request_no, memory_order_relaxed);
	count_workers(&p->active, &p->total);
	p->idle = p->total - p->active;
	p->max_children_reached = atomic_load(&sb->max_children_reached);
	p->slow_requests = atomic_load(&sb->slow);
	p->terminated = atomic_load(&sb->terminated);
	p->max_active = atomic_load(&sb->max_active);
	p->reload_ok = atomic_load(&sb->reload_ok);
	p->reload_success_time = atomic_load(&sb->reload_success_s);
}

/* --- The status page --------------------------------------------------------- */

/* Resident set size of pid in bytes, from /proc/PID/statm; -1 when gone. */
static long long rss_bytes(pid_t pid)
{
	char path[64];
	long size, resident;
	FILE *f;
	int n;

	snprintf(path, sizeof(path), "/proc/%ld/statm", (long)pid);
	f = fopen(path, "r");
	if (f == NULL)
		return -1;
	n = fscanf(f, "%ld %ld", &size, &resident);
	fclose(f);
	return n == 2 ? (long long)resident * sysconf(_SC_PAGESIZE) : -1;
}

static void iso_time(char *out, size_t size, long long t)
{
	time_t tt = (time_t)t;
	struct tm tm;

	gmtime_r(&tt, &tm);
	strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* One worker as the page shows it. */
struct sb_row {
	pid_t pid;
	const char *state;
	long long started_s;
	unsigned long long served;
	double duration_ms; /* of the request in hand, or the last one */
	long long rss;
	struct sb_late req;
};

static int read_row(struct sb_slot *s, struct sb_row *r)
{
	long long start, dur;

	r->pid = atomic_load(&s->pid);
	if (r->pid == 0)
		return 0;
	r->state = scoreboard_stage_name((enum sb_stage)atomic_load(&s->stage));
	r->started_s = atomic_load(&s->started_s);
	r->served = atomic_load(&s->served);
	read_request(s, &r->req);
	start = atomic_load(&s->req_start_us);
	dur = atomic_load(&s->req_duration_us);
	if (start == 0)
		r->duration_ms = 0;
	else if (dur < 0)
		r->duration_ms = (double)(mono_us() - start) / 1e3;
	else
		r->duration_ms = (double)dur / 1e3;
	r->rss = rss_bytes(r->pid);
	return 1;
}

static void json_str(struct buf *out, const char *s)
{
	canon_write_string(out, s, strlen(s));
}

/*
 * php-fpm's keys, in its order and with its types (its JSON has spaces in
 * its keys, and times in seconds since the epoch), then idemflow's own.
 * What idemflow does not have takes php-fpm's value for "none": the
 * process manager is static (a fixed pool), a request has no user, no
 * script and no content length counted, and its CPU is not measured; its
 * URI is the route template, never the request's own path with its ids.
 */
static void render_json(struct buf *out, const char *pool, const struct sb_pool *p, int full)
{
	buf_puts(out, "{\"pool\":");
	json_str(out, pool);
	buf_printf(out,
	           ",\"process manager\":\"static\",\"start time\":%lld,\"start since\":%lld,"
	           "\"accepted conn\":%llu,\"listen queue\":%ld,\"max listen queue\":%ld,"
	           "\"listen queue len\":%ld,\"idle processes\":%d,\"active processes\":%d,"
	           "\"total processes\":%d,\"max active processes\":%d,"
	           "\"max children reached\":%llu,\"slow requests\":%llu,"
	           "\"terminated requests\":%llu,\"config last reload success\":%d,"
	           "\"config last reload success time\":%lld",
	           p->start_time, p->start_since, p->accepted, p->listen_queue, p->max_listen_queue,
	           p->listen_queue_len, p->idle, p->active, p->total, p->max_active,
	           p->max_children_reached, p->slow_requests, p->terminated, p->reload_ok,
	           p->reload_success_time);
	if (full) {
		int first = 1;
		long long now = (long long)time(NULL);
		buf_puts(out, ",\"processes\":[");
		for (int i = 0; i < SCOREBOARD_SLOTS; i++) {
			struct sb_row r;
			if (!read_row(&sb->slots[i], &r))
				continue;
			buf_printf(
			    out,
			    "%s{\"pid\":%ld,\"state\":\"%s\",\"start time\":%lld,"
			    "\"start since\":%lld,\"requests\":%llu,\"request duration\":%lld,"
			    "\"request method\":",
			    first ? "" : ",", (long)r.pid, r.state, r.started_s, now - r.started_s,
			    r.served, (long long)(r.duration_ms * 1e3));
			json_str(out, r.req.method[0] ? r.req.method : "-");
			buf_puts(out, ",\"request uri\":");
			json_str(out, r.req.route[0] ? r.req.route : "-");
			buf_printf(out,
			           ",\"content length\":0,\"user\":\"-\",\"script\":\"-\","
			           "\"last request cpu\":0.00,\"last request memory\":%lld,"
			           "\"request route\":",
			           r.rss < 0 ? 0 : r.rss);
			json_str(out, r.req.route);
			buf_puts(out, ",\"request id\":");
			json_str(out, r.req.request_id);
			buf_printf(out, ",\"rss bytes\":%lld}", r.rss);
			first = 0;
		}
		buf_putc(out, ']');
	}
	buf_puts(out, "}\n");
}

static void render_text(struct buf *out, const char *pool, const struct sb_pool *p, int full)
{
	char start[32], ok[32];
	long long now = (long long)time(NULL);

	iso_time(start, sizeof(start), p->start_time);
	iso_time(ok, sizeof(ok), p->reload_success_time);
	buf_printf(out,
	           "pool:                 %s\n"
	           "process manager:      static\n"
	           "start time:           %s\n"
	           "start since:          %lld\n"
	           "accepted conn:        %llu\n"
	           "listen queue:         %ld\n"
	           "max listen queue:     %ld\n"
	           "listen queue len:     %ld\n"
	           "idle processes:       %d\n"
	           "active processes:     %d\n"
	           "total processes:      %d\n"
	           "max active processes: %d\n"
	           "max children reached: %llu\n"
	           "slow requests:        %llu\n"
	           "terminated requests:  %llu\n"
	           "last reload:          %s\n"
	           "last reload success:  %s\n",
	           pool, start, p->start_since, p->accepted, p->listen_queue, p->max_listen_queue,
	           p->listen_queue_len, p->idle, p->active, p->total, p->max_active,
	           p->max_children_reached, p->slow_requests, p->terminated,
	           p->reload_ok ? "ok" : "failed, running the previous configuration", ok);
	if (!full)
		return;
	for (int i = 0; i < SCOREBOARD_SLOTS; i++) {
		struct sb_row r;
		if (!read_row(&sb->slots[i], &r))
			continue;
		iso_time(start, sizeof(start), r.started_s);
		buf_printf(out,
		           "\n************************\n"
		           "pid:                  %ld\n"
		           "state:                %s\n"
		           "start time:           %s\n"
		           "start since:          %lld\n"
		           "requests:             %llu\n"
		           "request duration:     %lld\n"
		           "request method:       %s\n"
		           "request URI:          %s\n"
		           "content length:       0\n"
		           "user:                 -\n"
		           "script:               -\n"
		           "last request cpu:     0.00\n"
		           "last request memory:  %lld\n"
		           "request route:        %s\n"
		           "request id:           %s\n"
		           "rss bytes:            %lld\n",
		           (long)r.pid, r.state, start, now - r.started_s, r.served,
		           (long long)(r.duration_ms * 1e3), r.req.method[0] ? r.req.method : "-",
		           r.req.route[0] ? r.req.route : "-", r.rss < 0 ? 0 : r.rss, r.req.route,
		           r.req.request_id, r.rss);
	}
}

void scoreboard_render(struct buf *out, const char *pool, int json, int full)
{
	struct sb_pool p;

	scoreboard_pool(&p);
	if (sb == NULL)
		full = 0;
	if (json)
		render_json(out, pool, &p, full);
	else
		render_text(out, pool, &p, full);
}
