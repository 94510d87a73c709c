#!/usr/bin/env bash
# t/schema/test_tenant_routing.sh - the schema and the server's SQL stay
# routable by tenant (doc/distribution.md): t/schema/tenant_routing.py over a
# database built from the migrations, which must pass; then, one at a time,
# a unique index without tenant_id, a foreign key from a reference table to
# a distributed one, a statement and a function statement without the tenant
# and a table without a placement, which must each fail
# it with their own message (so the check is known to bite).
#
# Starts its own throwaway PostgreSQL (scripts/lib/stack.sh, about 5 s);
# t/run-test starts nothing for t/schema.
set -euo pipefail

: "${top_srcdir:?run me from make check}" "${top_builddir:?}"
top_srcdir=$(cd "$top_srcdir" && pwd)
# shellcheck source=scripts/lib/stack.sh
source "$top_srcdir/scripts/lib/stack.sh"
STACK_LOG_PREFIX=test_tenant_routing

trap stack_scratch_stop EXIT
stack_scratch_start schema "$top_builddir/app/idemflow" || exit 99
DIR=$STACK_SCRATCH

check() {
	python3 "$top_srcdir/t/schema/tenant_routing.py" --db "$DATABASE_URL" \
		--srcdir "$top_srcdir" --builddir "$top_builddir" "$@"
}
sql() {
	psql "$DATABASE_URL" -XAtq -v ON_ERROR_STOP=1 -c "$1" >/dev/null
}

fails=0
# expect_fail WHAT PATTERN [ARGS...]: the check fails and says PATTERN.
expect_fail() {
	local what=$1 pattern=$2 out rc=0
	shift 2
	out=$(check "$@") || rc=$?
	if ((rc == 1)) && grep -q -- "$pattern" <<<"$out"; then
		echo "ok - $what: refused"
	else
		echo "not ok - $what: exit $rc, expected 1 and \"$pattern\""
		printf '%s\n' "$out"
		fails=$((fails + 1))
	fi
}

echo "# the schema and the server's statements as they are"
if check; then
	echo "ok - routable by tenant"
else
	echo "not ok - the schema or a statement breaks single-tenant routing"
	fails=$((fails + 1))
fi

sql "CREATE UNIQUE INDEX workflows_type_bk ON workflows (type, business_key)"
expect_fail "a unique index without tenant_id" \
	"unique index workflows_type_bk on workflows(type,business_key) does not include tenant_id"
sql "DROP INDEX workflows_type_bk"

sql "ALTER TABLE api_tokens ADD COLUMN last_workflow uuid,
     ADD CONSTRAINT api_tokens_last_wf FOREIGN KEY (tenant_id, last_workflow)
     REFERENCES workflows (tenant_id, id)"
expect_fail "a foreign key from a reference table to a distributed one" \
	"foreign key api_tokens_last_wf api_tokens(tenant_id,last_workflow) -> workflows"
sql "ALTER TABLE api_tokens DROP COLUMN last_workflow"

# shellcheck disable=SC2016 # $1 is the statement's parameter
printf 'wf_by_id\tSELECT id FROM workflows WHERE id = $1\n' >"$DIR/extra.sql"
expect_fail "a statement without the tenant" "statement wf_by_id on workflows" \
	--extra-sql "$DIR/extra.sql"

sql "CREATE FUNCTION idemflow_touch(p_tenant bigint, p_wf uuid) RETURNS void
     LANGUAGE sql AS 'UPDATE workflows SET updated_at = now() WHERE id = p_wf'"
expect_fail "a function statement without the tenant" \
	"function idemflow_touch: a statement on workflows does not fix the tenant"
sql "DROP FUNCTION idemflow_touch"

sql "CREATE TABLE notes (id bigint PRIMARY KEY)"
expect_fail "a table without a placement" "table notes has no placement"
sql "DROP TABLE notes"

exit $((fails > 0))
