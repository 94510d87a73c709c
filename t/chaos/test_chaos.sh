#!/usr/bin/env bash
# t/chaos/test_chaos.sh - the short chaos run: keyed creates through nginx to
# two idemflow-fcgi instances while workers, instances (stopped, reloaded),
# PostgreSQL, nginx, both dispatchers (HTTP and RabbitMQ: killed, and frozen
# past their lease) and the RabbitMQ consumer are killed or restarted;
# then every acknowledged request has exactly one workflow
# and one workflow.created event, nothing is orphaned, every event reached
# a sink and no event was delivered more often than the dispatchers
# recorded attempts for it, every event a killed dispatcher had delivered
# without recording it was delivered again, the clients never saw an error
# besides 503 (and 409 in-flight), a replay of every request is
# byte-identical, 20 simultaneous same-key requests over both
# instances made 1 creation and 19 replays, and every saga run beside the
# load (some failing, some cancelled, some with a compensating job's
# lease running out) undid exactly its completed compensable steps, each
# once, latest first. Two checks test the harness,
# and say so: the consumers' inbox applied each event once, and every
# fault kind hit what it names (a worker still serving when killed, a
# reload that replaced every worker, a dispatcher that died holding events
# not recorded as delivered, a live process). Last, "idemflow audit" and
# "idemflow audit --rebuild" run on the database: every workflow's rows
# follow from its events. When the built idemflow-dispatch delivers to
# tenant endpoints, the saga tenant has three (a healthy receiver, a
# flapping one that answers 500 or drops requests during the load, and one
# whose filter passes no event of the run): every matching endpoint got
# every event its filter passes at least once, in per-workflow order,
# signed with its secret, and nothing else; the third got nothing.
# scripts/chaos checks and prints all of it; its exit status is this
# test's.
#
# scripts/chaos starts and stops its own stack (t/run-test starts nothing
# for t/chaos). About 50 s. The JSON record (and the stack's logs, when it
# fails) go to t/chaos/out/ in the build tree, which make clean removes.
set -euo pipefail

: "${top_srcdir:?run me from make check}" "${top_builddir:?}"

exec python3 "$top_srcdir/scripts/chaos" --builddir "$top_builddir" \
	--out "$top_builddir/t/chaos/out"
