#!/usr/bin/env bash
# t/valgrind/memcheck_short.sh - make check's short memcheck run: the
# test_worker binary (one idemflow-fcgi worker under valgrind's memcheck,
# no memory error, no definite or indirect leak) over 200 requests of its
# mix instead of scripts/valgrind's 10,000. t/run-test starts the migrated
# PostgreSQL it needs. Skipped (77) without valgrind, and in sanitizer
# builds, whose programs cannot run under valgrind.
set -euo pipefail

: "${IDEMFLOW_FCGI:?run me through t/run-test}"
command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed"; exit 77; }
if ldd "$IDEMFLOW_FCGI" | grep -q 'lib\(a\|ub\|l\|t\)san'; then
	echo "SKIP: a sanitizer build cannot run under valgrind"
	exit 77
fi
BIN=${top_builddir:-.}/t/valgrind/test_worker
IDEMFLOW_VALGRIND_REQUESTS=${IDEMFLOW_VALGRIND_REQUESTS:-200} exec "$BIN" --verbose
