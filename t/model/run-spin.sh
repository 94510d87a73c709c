#!/usr/bin/env bash
# t/model/run-spin.sh - model-check the key claim, the outbox (and its fan-out to
# tenant endpoints) and compensation with spin.
#
# Every check builds one model with spin -a and some -D options, compiles
# pan and runs it: a correct build must end with "errors: 0" after a
# complete search, a broken variant with a counterexample that breaks the
# very property the variant targets. The property is read from what spin
# reports, never assumed: an assertion's by replaying the trail (spin -t
# names the model's line, and that line's "property NAME" comment names
# it), an acceptance cycle's from the never claim pan searched ("never
# claim + (live)"), an invalid end state as "end". One line per check.
# Exit 0 when every check came out as expected, 1 otherwise, 77
# (skipped) when spin or a C compiler is missing. t/model/README.md says
# what each model and variant is.
#
#   t/model/run-spin.sh            every check
#   t/model/run-spin.sh -k NAME    the checks whose name contains NAME
#   t/model/run-spin.sh -l         list the checks
#   SPIN_KEEP=1                    keep the build directories (and trails)
set -uo pipefail

HERE=$(cd "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
CC=${CC:-cc}
only=
list=0
while getopts "k:lh" o; do
	case $o in
	k) only=$OPTARG ;;
	l) list=1 ;;
	*) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 64 ;;
	esac
done

if ! command -v spin >/dev/null 2>&1; then
	echo "1..0 # SKIP spin is not installed (scripts/deps installs it)"
	exit 77
fi
if ! command -v "$CC" >/dev/null 2>&1; then
	echo "1..0 # SKIP no C compiler ($CC) for spin's pan"
	exit 77
fi

# name|model|expect (ok: errors: 0; else the property the counterexample
# must break)|spin -D options|pan compile options|pan run options
#
# The outbox is checked in two layouts (README: why): "order", events 1
# and 2 of one workflow with every fault (a death, a failed claim, a
# requeue); "pipe", one event in each of two workflows, so that a
# dispatcher holds two batches at once, with a failed claim or (batches
# of two) an unusable sink. drain() before its fix broke "recording"
# (README, "What the model found"): outbox-claim-fails-late and
# outbox-sink-fails-mid-batch show it with that order
# (-DEXIT_UNRECORDED); the code, which records batch k before the run
# ends, is checked whole by outbox-order, outbox-pipe and
# outbox-liveness. The checks of the other broken variants leave
# "recording" out (-DSKIP_RECORDING), so that the property each targets
# is the one their counterexample breaks. Broken variants are searched
# breadth-first (-DBFS), which finds them fast and prints the shortest
# counterexample.
SAFE="-O1 -DSAFETY"
BFS="-O0 -DSAFETY -DBFS"
LIVE="-O1"
PIPE="-DNE=2 -DTWO_WORKFLOWS -DMAXDEATHS=0 -DMAXREQUEUE=0"
CHECKS=(
	"keyclaim|keyclaim.pml|ok||$SAFE|"
	"keyclaim-reuse|keyclaim.pml|ok|-DREUSE|$SAFE|"
	"keyclaim-no-on-conflict|keyclaim.pml|once|-DNO_ON_CONFLICT|$BFS|"
	"keyclaim-ack-before-commit|keyclaim.pml|acked|-DACK_BEFORE_COMMIT|$BFS|"
	"keyclaim-prune-no-cutoff|keyclaim.pml|cache|-DPRUNE_NO_CUTOFF|$BFS|"
	"keyclaim-rcache-no-expiry-cap|keyclaim.pml|cache|-DRCACHE_NO_EXPIRY_CAP|$BFS|"
	"keyclaim-rcache-from-answer|keyclaim.pml|cache|-DRCACHE_FROM_ANSWER|$BFS|"
	"keyclaim-store-before-commit|keyclaim.pml|replay|-DSTORE_BEFORE_COMMIT|$BFS|"
	"outbox-order|outbox.pml|ok|-DNE=2|$SAFE|"
	"outbox-pipe|outbox.pml|ok|$PIPE|$SAFE|"
	"outbox-claim-fails-late|outbox.pml|recording|$PIPE -DEXIT_UNRECORDED|$BFS|"
	"outbox-sink-fails-mid-batch|outbox.pml|recording|$PIPE -DMAXCFAIL=0 -DMAXSFAIL=1 -DBATCH=2 -DEXIT_UNRECORDED|$BFS|"
	"outbox-liveness|outbox.pml|ok|-DLIVENESS -DNE=2|$LIVE|-a -f"
	"outbox-liveness-slow-dispatcher|outbox.pml|live|-DLIVENESS -DNE=2 -DSKIP_RECORDING -DSLOW_DISPATCHER|$LIVE|-a -f"
	"outbox-liveness-lease-never-ends|outbox.pml|live|-DLIVENESS -DNE=2 -DSKIP_RECORDING -DLEASE_NEVER_ENDS|$LIVE|-a -f"
	"outbox-no-owner-guard|outbox.pml|lease|-DNE=2 -DSKIP_RECORDING -DNO_OWNER_GUARD|$BFS|"
	"outbox-owner-per-process|outbox.pml|lease|-DNE=2 -DSKIP_RECORDING -DOWNER_PER_PROCESS|$BFS|"
	"outbox-no-not-exists|outbox.pml|order|-DNE=2 -DSKIP_RECORDING -DNO_NOT_EXISTS|$BFS|"
	"outbox-no-lease-guard|outbox.pml|lease|-DNE=2 -DSKIP_RECORDING -DNO_LEASE_GUARD|$BFS|"
	"outbox-same-tx|outbox.pml|recording|$PIPE -DSAME_TX|$BFS|"
	"outbox-requeue-clears-lease|outbox.pml|lease|-DNE=2 -DSKIP_RECORDING -DREQUEUE_CLEARS_LEASE|$BFS|"
	"outbox-fanout|outbox.pml|ok|-DFANOUT|$SAFE|"
	"outbox-fanout-materialise-after-commit|outbox.pml|subscribed|-DFANOUT -DMATERIALISE_AFTER_COMMIT|$BFS|"
	"outbox-fanout-no-endpoint-order|outbox.pml|order|-DFANOUT -DNO_ENDPOINT_ORDER|$BFS|"
	"outbox-fanout-order-across-endpoints|outbox.pml|isolation|-DFANOUT -DORDER_ACROSS_ENDPOINTS|$BFS|"
	"outbox-fanout-no-filter|outbox.pml|matching|-DFANOUT -DNO_FILTER|$BFS|"
	"compensation|compensation.pml|ok||$SAFE|"
	"compensation-stale-cancel|compensation.pml|final|-DSTALE_CANCEL|$BFS|"
	"compensation-unlocked-complete|compensation.pml|final|-DUNLOCKED_COMPLETE|$BFS|"
	"compensation-cancel-compensating|compensation.pml|ends|-DCANCEL_COMPENSATING|$BFS|"
)

if ((list)); then
	for c in "${CHECKS[@]}"; do
		IFS='|' read -r name model expect dopts _ _ <<<"$c"
		printf '%-34s %-12s %-9s %s\n' "$name" "$model" "$expect" "$dopts"
	done
	exit 0
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idemflow-spin.XXXXXX")
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() { [[ -n ${SPIN_KEEP:-} ]] || rm -rf -- "$WORK"; }
trap cleanup EXIT

# property DIR MODEL DOPTS: the property the counterexample in DIR breaks,
# from pan's first error line ("pan:1: assertion violated ...").
property() {
	local dir=$1 model=$2 dopts=$3 what line
	what=$(grep -m1 -E '^pan:[0-9]+: ' "$dir/pan.log")
	case $what in
	*"acceptance cycle"* | *"non-progress cycle"*)
		sed -n 's/.*never claim[[:space:]]*+ (\([A-Za-z_0-9]*\)).*/\1/p' "$dir/pan.log" | head -1
		;;
	*"invalid end state"*) echo end ;;
	*"assertion violated"*)
		# shellcheck disable=SC2086 # option list
		line=$(cd "$dir" && spin $dopts -t "$model" 2>&1 |
			sed -n "s/^spin: $model:\([0-9]*\), Error: assertion violated.*/\1/p" | head -1)
		[[ -n $line ]] &&
			sed -n "${line}s/.*property \([a-z]*\).*/\1/p" "$dir/$model"
		;;
	esac
}

failed=0
n=0
for c in "${CHECKS[@]}"; do
	IFS='|' read -r name model expect dopts ccopts runopts <<<"$c"
	[[ -z $only || $name == *"$only"* ]] || continue
	n=$((n + 1))
	dir=$WORK/$name
	mkdir -p -- "$dir"
	cp -- "$HERE/$model" "$dir/"
	t0=$(date +%s.%N)
	# shellcheck disable=SC2086 # option lists
	if ! (cd "$dir" && spin $dopts -a "$model" >spin.log 2>&1); then
		echo "not ok $n - $name: spin -a failed"
		sed 's/^/# /' "$dir/spin.log"
		failed=1
		continue
	fi
	# Bounded memory (MB) and depth: a model that outgrows them fails.
	# shellcheck disable=SC2086
	if ! (cd "$dir" && $CC -w $ccopts -DMEMLIM=1024 -o pan pan.c >cc.log 2>&1); then
		echo "not ok $n - $name: compiling pan failed"
		sed 's/^/# /' "$dir/cc.log"
		failed=1
		continue
	fi
	# shellcheck disable=SC2086
	(cd "$dir" && ./pan -m1000000 $runopts >pan.log 2>&1)
	t1=$(date +%s.%N)
	errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$dir/pan.log" | tail -1)
	states=$(sed -n 's/^ *\([0-9][0-9]*\) states, stored.*/\1/p' "$dir/pan.log" | tail -1)
	what=$(grep -m1 -E '^pan:[0-9]+: ' "$dir/pan.log")
	secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
	line="$name: errors: ${errors:-?}, states ${states:-?}, ${secs} s"
	ok=0
	# A correct build must have searched everything; a counterexample
	# counts however deep the search went, if it breaks the property
	# its variant targets.
	if [[ -z $errors ]]; then
		ok=0
	elif [[ $expect == ok ]]; then
		[[ $errors == 0 ]] &&
			! grep -q -E 'max search depth too small|out of memory' "$dir/pan.log" &&
			ok=1
	elif [[ $errors -gt 0 ]]; then
		prop=$(property "$dir" "$model" "$dopts")
		depth=$(sed -n 's/.*(at depth \([0-9]*\)).*/\1/p' <<<"$what")
		line="$line, property ${prop:-?} broken at depth ${depth:-?}"
		[[ $prop == "$expect" ]] && ok=1
	fi
	if ((ok)); then
		echo "ok $n - $line"
	else
		echo "not ok $n - $line (expected $([[ $expect == ok ]] && echo 'errors: 0' ||
			echo "a counterexample breaking $expect"))"
		tail -n 20 "$dir/pan.log" | sed 's/^/# /'
		failed=1
	fi
done
echo "1..$n"
exit "$failed"
