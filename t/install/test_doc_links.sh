#!/usr/bin/env bash
# t/install/test_doc_links.sh - every relative link in README.md and
# doc/*.md resolves: the file exists in the source tree, and an anchor
# (#section) names a heading of its target, spelled as GitHub spells
# heading anchors. External links (http:, https:, mailto:) are not followed,
# nor links into var/ (the plots scripts/bench makes; var/ is not committed).
#
# Run by "make check" (t/run-test runs it as is); by hand:
#   top_srcdir=. t/install/test_doc_links.sh [FILE.md ...]
set -euo pipefail

: "${top_srcdir:?run me from make check, or set top_srcdir}"
cd "$top_srcdir"
if (($#)); then
	files=("$@")
else
	files=(README.md doc/*.md)
fi

python3 - "${files[@]}" <<'EOF'
import os, re, sys

def strip_code(lines):
    """The lines outside fenced code blocks, with inline code removed."""
    fence = False
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield n, re.sub(r"`[^`]*`", "", line)

def anchors(path, cache={}):
    """GitHub's anchors for the headings of a markdown file."""
    if path not in cache:
        seen, out = {}, set()
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        fence = False
        for line in lines:
            if line.lstrip().startswith("```"):
                fence = not fence
            m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower()).replace(" ", "-")
            k = seen.get(slug, 0)
            seen[slug] = k + 1
            out.add(slug if k == 0 else "%s-%d" % (slug, k))
        cache[path] = out
    return cache[path]

bad = 0
checked = 0
for md in sys.argv[1:]:
    with open(md, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in strip_code(lines):
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if dest.split(os.sep)[0] == "var":
                continue  # scripts/bench's plots: made by a run, never committed
            checked += 1
            if not os.path.exists(dest):
                print("%s:%d: %s: no such file %s" % (md, n, target, dest))
                bad += 1
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                print("%s:%d: %s: %s has no heading #%s" % (md, n, target, dest, anchor))
                bad += 1
print("%d relative links checked in %d files, %d broken" % (checked, len(sys.argv) - 1, bad))
sys.exit(1 if bad else 0)
EOF
