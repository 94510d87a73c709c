#!/usr/bin/env bash
# t/install/test_shellcheck.sh - every shell script of the project passes
# ShellCheck with no finding of any level.
#
# The scripts are found, not listed: under scripts/, t/, debian/ and .ci/,
# every file named *.sh and every file whose first line is a #! of sh, bash
# or dash (scripts/run, t/run-test, debian/postinst, ...), so a new script is
# checked without editing this test. Build output and fuzz inputs are left
# out. Sourced files (a "source=" directive) are followed (-x), from the
# top of the source tree. Skipped (77) without shellcheck (scripts/deps
# installs it). An exception is an inline "disable=SCxxxx" directive with
# its reason, next to the line it excuses.
set -euo pipefail

: "${top_srcdir:?run me from make check}"
command -v shellcheck >/dev/null 2>&1 || { echo "skip: shellcheck is not installed"; exit 77; }
cd "$top_srcdir"

# is_shell FILE: named *.sh, or a #! line naming sh, bash or dash.
is_shell() {
	local first=
	[[ $1 == *.sh ]] && return 0
	IFS= read -r -n 128 first <"$1" 2>/dev/null || [[ -n $first ]] || return 1
	[[ $first =~ ^#!.*(/|env[[:space:]]+)(ba|da)?sh([[:space:]]|$) ]]
}

files=()
while IFS= read -r -d '' f; do
	is_shell "$f" && files+=("${f#./}")
done < <(find ./scripts ./t ./debian ./.ci \
	\( -path ./debian/idemflow -o -path ./debian/.debhelper -o -path ./debian/tmp \
	-o -path ./t/chaos/out -o -path ./t/fuzz/corpus -o -path ./t/fuzz/regress \
	-o -name __pycache__ -o -name .deps \) -prune \
	-o -type f -print0 2>/dev/null | sort -z)

if ((${#files[@]} < 20)); then
	echo "not ok - found only ${#files[@]} shell scripts: ${files[*]}"
	exit 1
fi
if shellcheck -x "${files[@]}"; then
	echo "ok - ${#files[@]} shell scripts pass shellcheck $(shellcheck --version | sed -n 's/^version: //p')"
else
	echo "not ok - shellcheck finds the above (${#files[@]} shell scripts checked)"
	exit 1
fi
