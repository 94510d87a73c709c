/* metrics.c - pool-wide counters in shared memory and their exposition (see metrics.h). */
#include "server/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "config.h"
#include "server/scoreboard.h"

/* Counters are shared between processes: only lock-free atomics work there. */
#if ATOMIC_LLONG_LOCK_FREE != 2
#error "metrics need lock-free 64-bit atomics"
#endif

/* The statuses the server answers with (http_reason's list); anything else
 * is counted under status="other" so the label stays bounded. */
static const int statuses[] = { 200, 201, 202, 204, 400, 401, 403, 404,
	                        405, 409, 413, 415, 422, 500, 503 };
#define NSTATUS (sizeof(statuses) / sizeof(statuses[0]))

/* Upper bounds of the duration buckets, in seconds: from a replay served
 * in a millisecond to a create that waited out idempotency_wait. */
static const double bucket_le[] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
	                            0.25,  0.5,    1,     2.5,  5,     10 };
static const char *const bucket_le_text[] = { "0.001", "0.0025", "0.005", "0.01", "0.025",
	                                      "0.05",  "0.1",    "0.25",  "0.5",  "1",
	                                      "2.5",   "5",      "10" };
#define NBUCKETS (sizeof(bucket_le) / sizeof(bucket_le[0]))

struct route_ctr {
	atomic_ullong requests[NSTATUS + 1]; /* the last one: any other status */
	atomic_ullong buckets[NBUCKETS + 1]; /* per bucket, not cumulative; last: +Inf */
	atomic_ullong duration_us;
	atomic_ullong created, replays, mismatch, in_flight;
};

struct slot {
	_Alignas(64) struct route_ctr route[ROUTE__COUNT];
	atomic_ullong db_reconnects;
	atomic_ullong replay_cache_hits;
	atomic_ullong completions[MC__COUNT];
};

struct shm {
	atomic_llong workers;
	atomic_ullong worker_restarts;
	struct slot slots[METRICS_SLOTS];
};

/* Plain sums of every slot, for one scrape. */
struct totals {
	unsigned long long requests[ROUTE__COUNT][NSTATUS + 1];
	unsigned long long buckets[ROUTE__COUNT][NBUCKETS + 1];
	unsigned long long duration_us[ROUTE__COUNT];
	unsigned long long created[ROUTE__COUNT], replays[ROUTE__COUNT], mismatch[ROUTE__COUNT],
	    in_flight[ROUTE__COUNT];
	unsigned long long db_reconnects;
	unsigned long long replay_cache_hits;
	unsigned long long completions[MC__COUNT];
	long long workers;
	unsigned long long worker_restarts;
};

static struct shm *metrics_shm;
static int metrics_slot;
static unsigned long metrics_seen_reconnects;

int metrics_init(struct err *e)
{
	void *p;

	if (metrics_shm != NULL)
		return 0;
	/* Anonymous memory is zeroed: every counter starts at 0. */
	p = mmap(NULL, sizeof(struct shm), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
	         0);
	if (p == MAP_FAILED)
		return err_set(e, ERR_INTERNAL, "could not map %zu bytes for the metrics: %s",
		               sizeof(struct shm), strerror(errno));
	metrics_shm = p;
	return 0;
}

void metrics_use_slot(int slot)
{
	metrics_slot = slot >= 0 ? slot % METRICS_SLOTS : 0;
	metrics_seen_reconnects = 0;
}

void metrics_set_workers(int live)
{
	if (metrics_shm != NULL)
		atomic_store_explicit(&metrics_shm->workers, live, memory_order_relaxed);
}

void metrics_worker_restarted(void)
{
	if (metrics_shm != NULL)
		atomic_fetch_add_explicit(&metrics_shm->worker_restarts, 1, memory_order_relaxed);
}

static size_t status_index(int status)
{
	for (size_t i = 0; i < NSTATUS; i++)
		if (statuses[i] == status)
			return i;
	return NSTATUS;
}

static void add(atomic_ullong *c, unsigned long long n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

void metrics_request(enum route route, int status, enum idem_outcome idem, double seconds,
                     unsigned long reconnects)
{
	struct slot *s;
	struct route_ctr *r;
	size_t b = 0;

	if (metrics_shm == NULL)
		return;
	s = &metrics_shm->slots[metrics_slot];
	r = &s->route[(unsigned)route < ROUTE__COUNT ? route : ROUTE_OTHER];
	if (seconds < 0)
		seconds = 0;
	while (b < NBUCKETS && seconds > bucket_le[b])
		b++;
	add(&r->requests[status_index(status)], 1);
	add(&r->buckets[b], 1);
	add(&r->duration_us, (unsigned long long)(seconds * 1e6 + 0.5));
	switch (idem) {
	case IDEM_CREATED: add(&r->created, 1); break;
	case IDEM_REPLAYED: add(&r->replays, 1); break;
	case IDEM_CONFLICT: add(&r->mismatch, 1); break;
	case IDEM_IN_FLIGHT: add(&r->in_flight, 1); break;
	case IDEM_NONE: break;
	}
	/* The handle counts from 0 in every worker; the slot keeps the sum
	 * of all the workers that have used it. */
	if (reconnects > metrics_seen_reconnects) {
		add(&s->db_reconnects, reconnects - metrics_seen_reconnects);
		metrics_seen_reconnects = reconnects;
	}
}

void metrics_replay_cache_hit(void)
{
	if (metrics_shm != NULL)
		add(&metrics_shm->slots[metrics_slot].replay_cache_hits, 1);
}

void metrics_job_completion(enum metrics_completion outcome)
{
	if (metrics_shm != NULL && (unsigned)outcome < MC__COUNT)
		add(&metrics_shm->slots[metrics_slot].completions[outcome], 1);
}

static unsigned long long get(atomic_ullong *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

static void sum_slots(struct totals *t)
{
	memset(t, 0, sizeof(*t));
	if (metrics_shm == NULL)
		return;
	t->workers = atomic_load_explicit(&metrics_shm->workers, memory_order_relaxed);
	t->worker_restarts = get(&metrics_shm->worker_restarts);
	for (size_t i = 0; i < METRICS_SLOTS; i++) {
		struct slot *s = &metrics_shm->slots[i];
		t->db_reconnects += get(&s->db_reconnects);
		t->replay_cache_hits += get(&s->replay_cache_hits);
		for (size_t k = 0; k < MC__COUNT; k++)
			t->completions[k] += get(&s->completions[k]);
		for (enum route r = 0; r < ROUTE__COUNT; r++) {
			struct route_ctr *c = &s->route[r];
			for (size_t k = 0; k <= NSTATUS; k++)
				t->requests[r][k] += get(&c->requests[k]);
			for (size_t k = 0; k <= NBUCKETS; k++)
				t->buckets[r][k] += get(&c->buckets[k]);
			t->duration_us[r] += get(&c->duration_us);
			t->created[r] += get(&c->created);
			t->replays[r] += get(&c->replays);
			t->mismatch[r] += get(&c->mismatch);
			t->in_flight[r] += get(&c->in_flight);
		}
	}
}

static void help(struct buf *out, const char *name, const char *type, const char *text)
{
	buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, type);
}

/* The pool's figures from the scoreboard, and the build. */
static void render_pool(struct buf *out)
{
	struct sb_pool p;

	scoreboard_pool(&p);
	help(out, "idemflow_pool_workers", "gauge",
	     "Workers by state: busy with a request, or idle waiting for one.");
	buf_printf(out, "idemflow_pool_workers{state=\"busy\"} %d\n", p.active);
	buf_printf(out, "idemflow_pool_workers{state=\"idle\"} %d\n", p.idle);
	help(out, "idemflow_accepted_connections_total", "counter",
	     "Connections the workers accepted from the FastCGI socket.");
	buf_printf(out, "idemflow_accepted_connections_total %llu\n", p.accepted);
	if (p.listen_queue >= 0) {
		help(out, "idemflow_listen_queue", "gauge",
		     "Connections waiting in the FastCGI socket's accept queue.");
		buf_printf(out, "idemflow_listen_queue %ld\n", p.listen_queue);
		help(out, "idemflow_listen_queue_max", "gauge",
		     "The most connections seen waiting in the accept queue since the start.");
		buf_printf(out, "idemflow_listen_queue_max %ld\n", p.max_listen_queue);
		help(out, "idemflow_listen_queue_length", "gauge",
		     "The accept queue's size (the socket's backlog).");
		buf_printf(out, "idemflow_listen_queue_length %ld\n", p.listen_queue_len);
	}
	help(out, "idemflow_max_children_reached_total", "counter",
	     "Times the last idle worker took a request: until one is free again, new "
	     "connections wait in the listen queue.");
	buf_printf(out, "idemflow_max_children_reached_total %llu\n", p.max_children_reached);
	help(out, "idemflow_slow_requests_total", "counter",
	     "Requests that ran longer than request_slowlog_timeout.");
	buf_printf(out, "idemflow_slow_requests_total %llu\n", p.slow_requests);
	help(out, "idemflow_worker_terminated_total", "counter",
	     "Workers killed because their request ran longer than "
	     "request_terminate_timeout.");
	buf_printf(out, "idemflow_worker_terminated_total %llu\n", p.terminated);
	help(out, "idemflow_config_last_reload_success", "gauge",
	     "0 when the last SIGHUP's configuration was refused and the previous one is still "
	     "in use (see the log); 1 otherwise.");
	buf_printf(out, "idemflow_config_last_reload_success %d\n", p.reload_ok);
	help(out, "idemflow_config_last_reload_success_timestamp_seconds", "gauge",
	     "When the configuration was last taken: the last successful reload, or the start.");
	buf_printf(out, "idemflow_config_last_reload_success_timestamp_seconds %lld\n",
	           p.reload_success_time);
	help(out, "idemflow_build_info", "gauge",
	     "Always 1; the labels name the version and the git commit it was built from.");
	buf_printf(out, "idemflow_build_info{version=\"%s\",commit=\"%s\"} 1\n", PACKAGE_VERSION,
	           IDEMFLOW_COMMIT);
}

void metrics_render(struct buf *out, const struct metrics_outbox *ob)
{
	struct totals t;

	sum_slots(&t);

	help(out, "idemflow_requests_total", "counter",
	     "Requests answered by the workers, by route template and status.");
	for (enum route r = 0; r < ROUTE__COUNT; r++) {
		for (size_t k = 0; k <= NSTATUS; k++) {
			if (t.requests[r][k] == 0)
				continue;
			if (k < NSTATUS)
				buf_printf(
				    out,
				    "idemflow_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
				    route_name(r), statuses[k], t.requests[r][k]);
			else
				buf_printf(
				    out,
				    "idemflow_requests_total{route=\"%s\",status=\"other\"} %llu\n",
				    route_name(r), t.requests[r][k]);
		}
	}

	help(out, "idemflow_request_duration_seconds", "histogram",
	     "Time from accepting a request to having its answer ready, by route template.");
	for (enum route r = 0; r < ROUTE__COUNT; r++) {
		unsigned long long cum = 0;
		for (size_t k = 0; k < NBUCKETS; k++) {
			cum += t.buckets[r][k];
			buf_printf(
			    out,
			    "idemflow_request_duration_seconds_bucket{route=\"%s\",le=\"%s\"} "
			    "%llu\n",
			    route_name(r), bucket_le_text[k], cum);
		}
		/* The count is the +Inf bucket by construction, so the two can
		 * never disagree even while workers are counting. */
		cum += t.buckets[r][NBUCKETS];
		buf_printf(
		    out,
		    "idemflow_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %llu\n",
		    route_name(r), cum);
		buf_printf(out, "idemflow_request_duration_seconds_sum{route=\"%s\"} %llu.%06llu\n",
		           route_name(r), t.duration_us[r] / 1000000, t.duration_us[r] % 1000000);
		buf_printf(out, "idemflow_request_duration_seconds_count{route=\"%s\"} %llu\n",
		           route_name(r), cum);
	}

	help(out, "idemflow_idempotency_created_total", "counter",
	     "Keyed requests that executed and stored their response.");
	for (enum route r = 0; r < ROUTE__COUNT; r++)
		if (route_keyed(r))
			buf_printf(out, "idemflow_idempotency_created_total{route=\"%s\"} %llu\n",
			           route_name(r), t.created[r]);
	help(out, "idemflow_idempotency_replays_total", "counter",
	     "Keyed requests answered with the stored response of an earlier one.");
	for (enum route r = 0; r < ROUTE__COUNT; r++)
		if (route_keyed(r))
			buf_printf(out, "idemflow_idempotency_replays_total{route=\"%s\"} %llu\n",
			           route_name(r), t.replays[r]);
	help(out, "idemflow_idempotency_conflicts_total", "counter",
	     "Keyed requests refused with 409: the key was used for a different request "
	     "(mismatch) or its first request was still running (in_flight).");
	for (enum route r = 0; r < ROUTE__COUNT; r++) {
		if (!route_keyed(r))
			continue;
		buf_printf(out,
		           "idemflow_idempotency_conflicts_total{route=\"%s\",reason=\"mismatch\"} "
		           "%llu\n",
		           route_name(r), t.mismatch[r]);
		buf_printf(
		    out,
		    "idemflow_idempotency_conflicts_total{route=\"%s\",reason=\"in_flight\"} "
		    "%llu\n",
		    route_name(r), t.in_flight[r]);
	}

	help(out, "idemflow_replay_cache_hits_total", "counter",
	     "Keyed requests whose stored key row a worker had in memory (replay_cache_ttl): "
	     "answered without a database statement.");
	buf_printf(out, "idemflow_replay_cache_hits_total %llu\n", t.replay_cache_hits);
	help(out, "idemflow_job_completions_total", "counter",
	     "Job completions that ran (replays not counted): completed, or skipped.");
	buf_printf(out, "idemflow_job_completions_total %llu\n",
	           t.completions[MC_COMPLETED] + t.completions[MC_SKIPPED_LEASE_EXPIRED] +
	               t.completions[MC_SKIPPED_NOT_LEASE_HOLDER] +
	               t.completions[MC_SKIPPED_NOT_ACTIVE]);
	help(out, "idemflow_job_completions_skipped_total", "counter",
	     "Job completions refused because the worker no longer held the job's lease: "
	     "its result was not recorded.");
	buf_printf(out, "idemflow_job_completions_skipped_total{reason=\"lease_expired\"} %llu\n",
	           t.completions[MC_SKIPPED_LEASE_EXPIRED]);
	buf_printf(out,
	           "idemflow_job_completions_skipped_total{reason=\"not_lease_holder\"} %llu\n",
	           t.completions[MC_SKIPPED_NOT_LEASE_HOLDER]);
	buf_printf(out, "idemflow_job_completions_skipped_total{reason=\"not_active\"} %llu\n",
	           t.completions[MC_SKIPPED_NOT_ACTIVE]);
	help(out, "idemflow_db_reconnects_total", "counter",
	     "Times a worker reconnected to PostgreSQL after losing its connection.");
	buf_printf(out, "idemflow_db_reconnects_total %llu\n", t.db_reconnects);
	help(out, "idemflow_workers", "gauge", "Live worker processes.");
	buf_printf(out, "idemflow_workers %lld\n", t.workers);
	help(out, "idemflow_worker_restarts_total", "counter",
	     "Workers that exited without being asked to (crash, signal, error) and were "
	     "replaced.");
	buf_printf(out, "idemflow_worker_restarts_total %llu\n", t.worker_restarts);

	render_pool(out);

	help(out, "idemflow_db_up", "gauge",
	     "1 when this scrape's database statement succeeded; the outbox gauges are "
	     "missing otherwise.");
	buf_printf(out, "idemflow_db_up %d\n", ob != NULL);
	if (ob == NULL)
		return;
	help(out, "idemflow_outbox_pending", "gauge",
	     "Outbox events not delivered yet and not dead.");
	buf_printf(out, "idemflow_outbox_pending %ld\n", ob->pending);
	help(out, "idemflow_outbox_dead", "gauge",
	     "Outbox events that used up their attempts and wait for a requeue.");
	buf_printf(out, "idemflow_outbox_dead %ld\n", ob->dead);
	help(out, "idemflow_outbox_oldest_pending_age_seconds", "gauge",
	     "Age of the oldest pending outbox event (0 when none is pending).");
	buf_printf(out, "idemflow_outbox_oldest_pending_age_seconds %.3f\n", ob->oldest_pending_s);
	help(out, "idemflow_jobs_activatable", "gauge",
	     "Jobs waiting for a worker to activate them.");
	buf_printf(out, "idemflow_jobs_activatable %ld\n", ob->jobs_activatable);
	help(out, "idemflow_jobs_leased", "gauge", "Active jobs whose lease has not run out.");
	buf_printf(out, "idemflow_jobs_leased %ld\n", ob->jobs_leased);
	help(out, "idemflow_jobs_leases_expired", "gauge",
	     "Active jobs whose lease ran out: idemflow reap (or the next activation) "
	     "frees them.");
	buf_printf(out, "idemflow_jobs_leases_expired %ld\n", ob->jobs_leases_expired);
	help(out, "idemflow_workflows_incident", "gauge",
	     "Workflows parked in incident, of every tenant, waiting for a resume or a cancel.");
	buf_printf(out, "idemflow_workflows_incident %ld\n", ob->incidents);
}

void metrics_render_partitions(struct buf *out, const struct metrics_partitions *mp)
{
	int n = mp->n < METRICS_PARTITIONS_MAX ? mp->n : METRICS_PARTITIONS_MAX;

	help(out, "idemflow_partition_up", "gauge",
	     "1 when the partition answered this scrape's database statements through the "
	     "proxy; the outbox, job, incident and endpoint gauges leave out the partitions "
	     "at 0.");
	for (int p = 0; p < n; p++)
		buf_printf(out, "idemflow_partition_up{partition=\"%d\"} %d\n", p,
		           !(mp->down[p / 8] & (1u << (p % 8))));
}

void metrics_render_deliveries(struct buf *out, const struct metrics_deliveries *md)
{
	long rest = md->pending;

	help(out, "idemflow_endpoints_disabled", "gauge",
	     "Tenant endpoints disabled, by hand or for failing; their new deliveries are "
	     "kept as skipped.");
	buf_printf(out, "idemflow_endpoints_disabled %ld\n", md->disabled);
	help(out, "idemflow_endpoint_deliveries_pending", "gauge",
	     "Pending deliveries of the endpoints with the most (at most 10 lines), the "
	     "rest summed in endpoint=\"other\".");
	for (int i = 0; i < md->n; i++) {
		buf_printf(out,
		           "idemflow_endpoint_deliveries_pending{tenant=\"%ld\",endpoint=\"%s\"} "
		           "%ld\n",
		           md->top[i].tenant, md->top[i].endpoint, md->top[i].pending);
		rest -= md->top[i].pending;
	}
	buf_printf(
	    out, "idemflow_endpoint_deliveries_pending{tenant=\"other\",endpoint=\"other\"} %ld\n",
	    rest);
}

/* --- Access ------------------------------------------------------------ */

struct net {
	int family; /* AF_INET or AF_INET6 */
	unsigned char addr[16];
	int bits;
};

/* Parse an address; a v4-mapped IPv6 address (::ffff:a.b.c.d) is the IPv4
 * address, as a dual-stack listener may report an IPv4 client either way. */
static int addr_parse(const char *s, struct net *n)
{
	static const unsigned char mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	memset(n, 0, sizeof(*n));
	if (inet_pton(AF_INET, s, n->addr) == 1) {
		n->family = AF_INET;
		n->bits = 32;
		return 0;
	}
	if (inet_pton(AF_INET6, s, n->addr) == 1) {
		n->family = AF_INET6;
		n->bits = 128;
		if (memcmp(n->addr, mapped, sizeof(mapped)) == 0) {
			memmove(n->addr, n->addr + 12, 4);
			memset(n->addr + 4, 0, 12);
			n->family = AF_INET;
			n->bits = 32;
		}
		return 0;
	}
	return -1;
}

static int net_contains(const struct net *net, const struct net *a)
{
	int full = net->bits / 8, rest = net->bits % 8;

	if (net->family != a->family || memcmp(net->addr, a->addr, (size_t)full) != 0)
		return 0;
	if (rest == 0)
		return 1;
	unsigned char mask = (unsigned char)(0xff << (8 - rest));
	return (net->addr[full] & mask) == (a->addr[full] & mask);
}

int metrics_allow_match(const char *allow, const char *addr, struct err *e)
{
	struct net client;
	int have_client = addr != NULL && addr_parse(addr, &client) == 0;
	int found = 0;
	const char *p = allow;

	while (*p) {
		char item[80], *slash;
		size_t n;
		struct net net;

		p += strspn(p, " \t,");
		n = strcspn(p, ",");
		while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
			n--;
		if (n == 0)
			break;
		if (n >= sizeof(item))
			return err_set(e, ERR_CONFIG, "metrics_allow: \"%.*s\" is not an address",
			               (int)n, p);
		memcpy(item, p, n);
		item[n] = '\0';
		p += n;
		slash = strchr(item, '/');
		if (slash != NULL)
			*slash = '\0';
		if (addr_parse(item, &net) < 0)
			return err_set(e, ERR_CONFIG,
			               "metrics_allow: \"%s\" is not an IPv4 or IPv6 address",
			               item);
		if (slash != NULL) {
			char *end;
			long bits = strtol(slash + 1, &end, 10);
			int max = net.family == AF_INET ? 32 : 128;
			if (end == slash + 1 || *end != '\0' || bits < 0 || bits > max)
				return err_set(
				    e, ERR_CONFIG,
				    "metrics_allow: bad prefix length \"/%s\" for %s (0 to %d)",
				    slash + 1, item, max);
			net.bits = (int)bits;
		}
		/* Keep parsing after a match: a bad entry is an error wherever it is. */
		if (have_client && net_contains(&net, &client))
			found = 1;
	}
	return found;
}
