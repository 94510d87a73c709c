#!/usr/bin/env python3
"""t/lint/test_model_map.py [README [APPDIR]] - the models' step map names code that exists.

t/model/README.md maps each step of the spin models to the code it stands
for. A map that names a function, a file or a statement the code no
longer has says nothing about the code, and no model check notices. This
test reads every name the README cites inside backticks:
  - a call, `name()` or `name(args)`: a function defined in app/ (a line
    that opens a definition: the name at the start of a declarator, not
    indented, the line not ending in ";");
  - a path, `app/...`: a file that exists;
  - a constant alone, `Q_KEY_CLAIM`, `DQ_CLAIM`, `PRUNE_KEYS`: a word of
    some source in app/, unless it is one of the models' own build options
    (a broken variant, `#ifdef NO_OWNER_GUARD` in a .pml file).
Prints every name it cannot find and exits 1 if there is one; README
defaults to $top_srcdir/t/model/README.md, APPDIR to $top_srcdir/app.
"""
import os
import re
import sys

top = os.environ.get("top_srcdir", ".")
readme = sys.argv[1] if len(sys.argv) > 1 else os.path.join(top, "t", "model", "README.md")
root = sys.argv[2] if len(sys.argv) > 2 else os.path.join(top, "app")

sources = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith((".c", ".h")):
            p = os.path.join(d, f)
            sources[os.path.relpath(p, os.path.dirname(root.rstrip("/")))] = open(
                p, errors="replace").read()
if not sources:
    sys.exit("no sources under %s" % root)

# Function definitions: "static int name(" or "name(" at the start of a
# line (the house style puts the type on the same line), never a
# prototype (those end with ";").
defined = set()
for text in sources.values():
    for line in text.split("\n"):
        if not line or line[0] in " \t#/*}" or line.rstrip().endswith(";"):
            continue
        m = re.match(r"[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(", line)
        if m:
            defined.add(m.group(1))
words = set()
for text in sources.values():
    words.update(re.findall(r"\b[A-Za-z_]\w*\b", text))

# The models' build options: the broken variants' names.
variants = set()
mdir = os.path.dirname(os.path.abspath(readme))
for f in os.listdir(mdir):
    if f.endswith(".pml"):
        pml = open(os.path.join(mdir, f), errors="replace").read()
        variants.update(re.findall(r"#\s*(?:el)?if(?:n?def\s+|.*?defined\()(\w+)", pml))

# Promela and SQL words that may appear as calls in a span.
NOT_C = {"now", "count", "unnest", "coalesce", "min", "floor", "extract", "ANY", "EXISTS",
         "SELECT", "VALUES", "IN", "spin", "pan"}

problems = []
cited = 0
text = open(readme, errors="replace").read()
# Fenced blocks are commands, not citations.
text = re.sub(r"```.*?```", "", text, flags=re.S)
for n, line in enumerate(text.split("\n"), 1):
    for span in re.findall(r"`([^`]+)`", line):
        for name in re.findall(r"(?<![\w.])([A-Za-z_]\w*)\(", span):
            if name in NOT_C:
                continue
            cited += 1
            if name not in defined:
                problems.append("%s:%d: function %s() is not defined in %s" %
                                (readme, n, name, root))
        for path in re.findall(r"\bapp/[\w/.-]+\.[ch]\b", span):
            cited += 1
            if path not in sources:
                problems.append("%s:%d: %s does not exist" % (readme, n, path))
        if re.fullmatch(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+", span) and span not in variants:
            cited += 1
            if span not in words:
                problems.append("%s:%d: %s is in no source of %s" % (readme, n, span, root))

for p in problems:
    print(p)
if cited == 0:
    sys.exit("%s: cites nothing: is it the model README?" % readme)
print("%d names cited, %d missing" % (cited, len(problems)))
sys.exit(1 if problems else 0)
