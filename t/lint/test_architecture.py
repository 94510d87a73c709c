#!/usr/bin/env python3
"""t/lint/test_architecture.py [APPDIR [DOC]] - the architecture tour names
every source file.

Every *.c, *.h, *.py and *.mjs file under app/ must be named in
doc/architecture.md by its path from app/ ("server/wf.c", with or without
"app/" before it), so that the tour cannot drift from the tree. A module
is named by either of its files: "server/wf.c" names server/wf.h too.
A file that the build generates in app/ ("core/migrations.c") is named
there like the others. Prints every file not named and exits 1 if there
is one; APPDIR defaults to $top_srcdir/app, DOC to
$top_srcdir/doc/architecture.md.
"""
import os
import re
import sys

EXTENSIONS = (".c", ".h", ".py", ".mjs")

top = os.environ.get("top_srcdir", ".")
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(top, "app")
doc = sys.argv[2] if len(sys.argv) > 2 else os.path.join(top, "doc", "architecture.md")
text = open(doc, encoding="utf-8").read()

files = []
for d, dirs, fs in os.walk(root):
    dirs[:] = [x for x in dirs if not x.startswith(".") and x != "__pycache__"]
    for f in fs:
        if f.endswith(EXTENSIONS):
            files.append(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
if not files:
    sys.exit("no sources under %s" % root)


def named(rel):
    """rel, as a whole path: not the tail of a longer name or path."""
    return re.search(r"(?<![\w./-])(app/)?%s(?![\w-])" % re.escape(rel), text) is not None


missing = []
for rel in sorted(files):
    stem, ext = os.path.splitext(rel)
    forms = [rel]
    if ext in (".c", ".h"):
        forms = [stem + ".c", stem + ".h"]
    if not any(named(f) for f in forms):
        missing.append(rel)
for rel in missing:
    print("app/%s: not named in %s" % (rel, os.path.relpath(doc, top)))
print("%d files under app/, %d not named in the architecture tour" % (len(files), len(missing)))
sys.exit(1 if missing else 0)
