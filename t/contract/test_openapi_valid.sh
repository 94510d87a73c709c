#!/usr/bin/env bash
# t/contract/test_openapi_valid.sh - doc/openapi.yaml is valid OpenAPI 3.1.
#
# Runs the validator that scripts/deps installs from scripts/node's lock
# (@seriousme/openapi-schema-validator: the OpenAPI 3.1 JSON Schema, and
# every $ref resolved) on the document, and fails on any error it reports.
# First it runs it on a copy with one dangling $ref, which must fail: a
# validator that passes everything would prove nothing.
#
# Usage: t/contract/test_openapi_valid.sh [DOCUMENT]
# Environment: IDEMFLOW_OPENAPI_VALIDATOR (default
# /usr/local/lib/idemflow-node/node_modules/.bin/validate-api).
set -euo pipefail

HERE=$(cd "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
SRCDIR=$(cd "${top_srcdir:-$HERE/../..}" && pwd)
DOC=${1:-$SRCDIR/doc/openapi.yaml}
VALIDATOR=${IDEMFLOW_OPENAPI_VALIDATOR:-/usr/local/lib/idemflow-node/node_modules/.bin/validate-api}

if [[ ! -x $VALIDATOR ]]; then
	echo "test_openapi_valid: $VALIDATOR is missing: run scripts/deps as root" >&2
	exit 1
fi

TMP=$(mktemp -d /tmp/idemflow-openapi.XXXXXX)
trap 'rm -rf -- "$TMP"' EXIT

# The broken copy: the first schema reference made dangling.
sed -e '0,/"#\/components\/schemas\//s//"#\/components\/schemas\/no-such-/' \
	"$DOC" >"$TMP/broken.yaml"
if cmp -s -- "$DOC" "$TMP/broken.yaml"; then
	echo "test_openapi_valid: could not break a copy of $DOC (no schema \$ref?)" >&2
	exit 1
fi
if "$VALIDATOR" "$TMP/broken.yaml" >"$TMP/broken.out" 2>&1; then
	echo "test_openapi_valid: the validator accepted a document with a dangling \$ref:" >&2
	cat -- "$TMP/broken.out" >&2
	exit 1
fi
echo "ok - the validator refuses a dangling \$ref: $(tr -d '\n\t' <"$TMP/broken.out")"

if ! "$VALIDATOR" "$DOC" >"$TMP/doc.out" 2>&1; then
	echo "not ok - $DOC is not valid OpenAPI 3.1:" >&2
	cat -- "$TMP/doc.out" >&2
	exit 1
fi
if ! grep -q '"valid": true' "$TMP/doc.out"; then
	echo "not ok - the validator did not say valid:" >&2
	cat -- "$TMP/doc.out" >&2
	exit 1
fi
echo "ok - $DOC is valid OpenAPI $(sed -n 's/^openapi: *//p' "$DOC")"
