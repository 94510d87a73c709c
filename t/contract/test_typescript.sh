#!/usr/bin/env bash
# t/contract/test_typescript.sh - a TypeScript client generated from
# doc/openapi.yaml compiles, and describes the API precisely enough to use.
#
# openapi-typescript (locked in t/contract/ts, installed by scripts/deps)
# turns the document into types (paths, components, webhooks); tsc
# --noEmit --strict compiles them with t/contract/ts/usage.ts, a keyed
# create, its answers and problems, a job narrowed by its state, a message
# result by `correlated`, a webhook's event by its type. First it compiles
# t/contract/ts/bad.ts, which must fail (a create without its `type`, a
# deadline read from a job that may not be active): a compile that accepts
# everything would prove nothing.
#
# --default-non-nullable false: a member with a default is optional in
# what a client sends (the server fills it in), so the types must not make
# it required.
#
# Usage: t/contract/test_typescript.sh [DOCUMENT]
# Environment: IDEMFLOW_NODE_TS (default /usr/local/lib/idemflow-node-ts).
set -euo pipefail

HERE=$(cd "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
SRCDIR=$(cd "${top_srcdir:-$HERE/../..}" && pwd)
DOC=${1:-$SRCDIR/doc/openapi.yaml}
NODE_TS=${IDEMFLOW_NODE_TS:-/usr/local/lib/idemflow-node-ts}
GEN=$NODE_TS/node_modules/.bin/openapi-typescript
TSC=$NODE_TS/node_modules/.bin/tsc

for bin in "$GEN" "$TSC"; do
	if [[ ! -x $bin ]]; then
		echo "test_typescript: $bin is missing: run scripts/deps as root" >&2
		exit 1
	fi
done
if ! cmp -s -- "$SRCDIR/t/contract/ts/package-lock.json" "$NODE_TS/package-lock.json"; then
	echo "test_typescript: $NODE_TS is not t/contract/ts's lock: run scripts/deps as root" >&2
	exit 1
fi

TMP=$(mktemp -d /tmp/idemflow-ts.XXXXXX)
trap 'rm -rf -- "$TMP"' EXIT

if ! "$GEN" "$DOC" --default-non-nullable false -o "$TMP/idemflow.ts" >"$TMP/gen.out" 2>&1; then
	echo "not ok - openapi-typescript failed on $DOC:" >&2
	cat -- "$TMP/gen.out" >&2
	exit 1
fi
echo "ok - openapi-typescript $("$GEN" --version 2>/dev/null | tr -d '\n') generated" \
	"$(wc -l <"$TMP/idemflow.ts") lines"
cp -- "$SRCDIR/t/contract/ts/usage.ts" "$SRCDIR/t/contract/ts/bad.ts" "$TMP/"

compile() {
	"$TSC" --noEmit --strict --target es2022 --module nodenext --moduleResolution nodenext \
		--lib es2022,dom "$TMP/idemflow.ts" "$@"
}

if compile "$TMP/bad.ts" >"$TMP/bad.out" 2>&1; then
	echo "not ok - tsc accepted t/contract/ts/bad.ts" >&2
	exit 1
fi
for want in "bad.ts(9,14): error TS2741: Property 'type' is missing" \
	"bad.ts(12,3): error TS2322: Type 'string | undefined' is not assignable to type 'string'."; do
	if ! grep -qF -- "$want" "$TMP/bad.out"; then
		echo "not ok - tsc on bad.ts did not say: $want" >&2
		cat -- "$TMP/bad.out" >&2
		exit 1
	fi
done
echo "ok - tsc --strict refuses bad.ts: a create without type, a deadline of any job"

if ! compile "$TMP/usage.ts" >"$TMP/usage.out" 2>&1; then
	echo "not ok - the generated client and usage.ts do not compile:" >&2
	cat -- "$TMP/usage.out" >&2
	exit 1
fi
echo "ok - tsc $("$TSC" --version | sed 's/^Version //') --noEmit --strict: the generated" \
	"client and usage.ts compile"
