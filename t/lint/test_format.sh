#!/usr/bin/env bash
# t/lint/test_format.sh - every C source of app/ and t/ is in the house
# format (.clang-format), as scripts/format --check finds it with the
# pinned clang-format. Skipped (77) when that version is not installed
# (scripts/deps installs it on Debian 12).
set -euo pipefail

: "${top_srcdir:?run me from make check}"
exec "$top_srcdir/scripts/format" --check
