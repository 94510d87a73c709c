#!/usr/bin/env bash
# t/schema/test_schema.sh - sql/schema.sql is the schema the migrations build.
#
# Runs scripts/schema into a temporary file (a database built from the
# migrations the programs carry, in its own throwaway PostgreSQL, about 5 s;
# t/run-test starts nothing for t/schema) and fails, printing the diff, when
# that dump differs from the committed sql/schema.sql: a migration changed
# without the file being regenerated, or the file edited by hand.
set -euo pipefail

: "${top_srcdir:?run me from make check}" "${top_builddir:?}"
top_srcdir=$(cd "$top_srcdir" && pwd)
OUT=$(mktemp /tmp/idemflow-schema-dump.XXXXXX)
trap 'rm -f -- "$OUT"' EXIT

IDEMFLOW_BUILDDIR=$top_builddir "$top_srcdir/scripts/schema" -o "$OUT" || exit 99
if diff -u --label sql/schema.sql --label "the migrations" "$top_srcdir/sql/schema.sql" "$OUT"; then
	echo "ok - sql/schema.sql is what the migrations build"
else
	echo "not ok - sql/schema.sql differs from what the migrations build" \
		"(scripts/schema writes it; sql/README.md)"
	exit 1
fi
