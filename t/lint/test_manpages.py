#!/usr/bin/env python3
"""t/lint/test_manpages.py - every manual page names what the code has.

The lists of doc/*.1, *.3, *.5 and *.8 are checked against the sources
they describe, so that a route, a key, a metric, a command or an option
added to the code cannot be left out of its page, and one removed cannot
stay in it:

- routes: every template of app/server/route.c's table is named in
  idemflow-fcgi(8); every /v1/ path any page names is one of them (or one
  followed by "/...");
- configuration keys: idemflow.conf(5) has an entry (".TP" then ".B key")
  for every key of app/core/conf.c's table, with its default, and no
  entry for a key the table lacks; each program's page names, in its
  section listed below, every key its own code reads (a field of struct
  conf read as "c->key" under its directory), and no key it does not read;
- metrics: each page names every metric its program writes (found by the
  "# TYPE name" lines of the exposition, or a "name", "type" pair of
  string literals, as app/server/metrics.c's help() takes them; a name
  ending in _%s is expanded with the first column of the file's
  { "word", "Help text" } table), and every idemflow_... name of a METRICS
  section is a metric of that program;
- commands and options: idemflow(1) names every command of the usage text
  ("tenant set-ttl") and every page names every option of its program's
  usage text ("--max-runtime", "-T");
- libidemflow-inbox(3) names every function app/inbox/inbox.h declares.

The sources are read, never run. How each list is read from the code is
one small function below (conf_table() for the keys, routes(), metrics(),
usage_text()), so that a change of the code's shape is one place to adapt.
Prints one line per problem and exits 1 if there is one.
"""
import os
import re
import sys

top = os.environ.get("top_srcdir", ".")


def src(path):
    with open(os.path.join(top, path), encoding="utf-8") as f:
        return f.read()


def c_files(d):
    out = []
    for dirpath, _, files in os.walk(os.path.join(top, d)):
        out += [os.path.join(dirpath, f) for f in files if f.endswith((".c", ".h"))]
    return sorted(out)


# ---------------------------------------------------------------- the code's lists


def conf_table():
    """{key: (default, test_only)} from app/core/conf.c's table of keys.

    An entry is a brace that opens with the key's name as a string literal
    then the programs that read it and its type (identifiers, the programs
    joined by |), its first other string literal being the default:
    { "workers", P_SRV, T_WORKERS, OFF(workers), "auto", ... }. Entries
    inside #ifdef IDEMFLOW_TEST_HOOKS exist only in test builds."""
    text = src("app/core/conf.c")
    # The table alone: from "conf_keys[] = {" to the "};" that closes it.
    start = re.search(r"\bconf_keys\s*\[\s*\]\s*=\s*\{", text)
    if start is None:
        sys.exit("app/core/conf.c: no conf_keys[] table; adapt conf_table()")
    text = text[start.end():text.index("\n};", start.end())]
    keys = {}
    test_only = False
    entry = re.compile(
        r'\{\s*"([a-z][a-z0-9_]*)"\s*,\s*[A-Za-z_][A-Za-z0-9_|\s]*,[^"{}]*"((?:[^"\\]|\\.)*)"')
    lines = text.split("\n")
    # Mark the lines of test-only blocks, then match entries line-spanning.
    mask = []
    for line in lines:
        if re.match(r"\s*#\s*ifdef\s+IDEMFLOW_TEST_HOOKS", line):
            test_only = True
        elif test_only and re.match(r"\s*#\s*endif", line):
            test_only = False
        mask.append(test_only)
    for m in entry.finditer(text):
        line_no = text.count("\n", 0, m.start())
        keys[m.group(1)] = (m.group(2), mask[line_no])
    if len(keys) < 10:
        sys.exit("app/core/conf.c: found %d keys; adapt conf_table() to the table's shape"
                 % len(keys))
    return keys


def keys_read(dirs, keys):
    """The keys whose struct conf field the C files under dirs read."""
    text = "".join(open(f, encoding="utf-8").read() for d in dirs for f in c_files(d)
                   if not f.endswith("/conf.c"))
    return {k for k in keys if re.search(r"\b(c|conf|cfg)->%s\b" % k, text)}


def routes():
    """The route templates of app/server/route.c, "other" included."""
    found = re.findall(r'\[ROUTE_[A-Z_]+\]\s*=\s*\{\s*"([^"]+)"', src("app/server/route.c"))
    if len(found) < 5:
        sys.exit("app/server/route.c: found %d routes; adapt routes()" % len(found))
    return found


def metrics(paths):
    """Metric names written by the files under paths (C, SQL or Python)."""
    names = set()
    files = []
    for p in paths:
        full = os.path.join(top, p)
        if os.path.isdir(full):
            for dirpath, _, fs in os.walk(full):
                files += [os.path.join(dirpath, f) for f in fs
                          if f.endswith((".c", ".h", ".sql", ".py"))]
        else:
            files.append(full)
    for f in sorted(files):
        text = open(f, encoding="utf-8").read()
        found = re.findall(r"# TYPE (idemflow_[a-z0-9_]*(?:%s)?)", text)
        found += re.findall(r'"(idemflow_[a-z0-9_]+)",\s*"(?:counter|gauge|histogram|summary)"',
                            text)
        words = re.findall(r'\{\s*"([a-z][a-z0-9_]*)",\s*"[A-Z]', text)
        for n in found:
            if n.endswith("_%s"):
                if not words:
                    sys.exit("%s: cannot expand %s; adapt metrics()" % (f, n))
                names |= {n[:-2] + w for w in words}
            else:
                names.add(n)
    return names


def c_strings(body):
    """The concatenated C string literals of body, escapes decoded."""
    out = []
    for m in re.finditer(r'"((?:[^"\\\n]|\\.)*)"', body):
        out.append(re.sub(r"\\(.)", lambda e: {"n": "\n", "t": "\t"}.get(e.group(1), e.group(1)),
                          m.group(1)))
    return "".join(out)


def usage_text(path, func):
    """The text printed by the function func(FILE *out) of path."""
    text = src(path)
    m = re.search(r"\n(?:static )?void %s\(FILE \*out\)\n\{\n(.*?)\n\}\n" % func, text, re.S)
    if m is None:
        sys.exit("%s: no function %s(FILE *out); adapt usage_text()" % (path, func))
    return c_strings(m.group(1))


def usage_options(usage):
    opts = set(re.findall(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)", usage))
    return {o for o in opts if o not in ("--KEY",)}


def usage_commands(usage):
    """"noun" or "noun verb" of each command line of the usage text."""
    part = usage.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    cmds = []
    for line in part.split("\n"):
        m = re.match(r"  ([a-z][\w-]*)(?: ([a-z][\w-]*))?(?=\s|$)", line)
        if m:
            cmds.append(" ".join(g for g in m.groups() if g))
    return cmds


def cli_nouns():
    return re.findall(r'\{\s*"([a-z]+)",\s*cli_[a-z]+\s*\}', src("app/cli/main.c"))


def inbox_functions():
    return sorted(set(re.findall(r"\b(idemflow_inbox_[a-z_]+)\s*\(", src("app/inbox/inbox.h"))))


# ---------------------------------------------------------------- the pages


def roff_args(s):
    """A macro line's arguments, as roff splits them."""
    args = []
    for m in re.finditer(r'"((?:[^"]|"")*)"|(\S+)', s):
        args.append(m.group(1).replace('""', '"') if m.group(1) is not None else m.group(2))
    return args


def plain(line):
    line = re.sub(r"\\f(\[[^]]*\]|.)", "", line)
    line = re.sub(r"\\\((dq|aq)", '"', line)
    line = line.replace("\\(+-", "+-").replace("\\-", "-").replace("\\&", "")
    return line.replace("\\e", "\\").replace("\\ ", " ")


def bold_parts(line):
    """The bold runs of a text line: \\fB...\\fR (or up to the next font)."""
    return [plain(b) for b in re.findall(r"\\fB(.*?)(?=\\f|$)", line)]


class Line:
    """One line of a page: its section, the macro that made it ("" for
    text, "TP" and the like for a paragraph mark), its plain text and its
    bold parts."""

    def __init__(self, section, macro, text, bold):
        self.section, self.macro, self.text, self.bold = section, macro, text, bold


def page_lines(path):
    """[Line] of a man page, font macros resolved."""
    out = []
    section = ""
    for raw in open(path, encoding="utf-8").read().split("\n"):
        if raw.startswith(".SH"):
            section = " ".join(roff_args(raw[3:]))
            continue
        m = re.match(r"\.(B|I|SM|BR|RB|BI|IB|IR|RI)\s(.*)", raw)
        if m:
            macro = m.group(1)
            args = roff_args(m.group(2))
            if macro in ("B", "I", "SM"):
                text = plain(" ".join(args))
                bold = [text] if macro == "B" else []
            else:
                text = plain("".join(args))
                first = 0 if macro[0] == "B" else 1 if macro[1] == "B" else None
                bold = [plain(a) for i, a in enumerate(args)
                        if first is not None and i % 2 == first]
            out.append(Line(section, macro, text, bold))
        elif raw.startswith("."):
            mark = re.match(r"\.(TP|PP|IP|RS|RE|nf|fi|br|TQ|SS)\b", raw)
            if mark:
                out.append(Line(section, mark.group(1), "", []))
        else:
            out.append(Line(section, "", plain(raw), bold_parts(raw)))
    return out


def joined(lines, sections=None):
    return " ".join(ln.text for ln in lines if sections is None or ln.section in sections)


def joined_bold(lines, sections=None):
    return " | ".join(b for ln in lines if sections is None or ln.section in sections
                      for b in ln.bold)


def names(text, name):
    """Does text name name as a whole (not a part of a longer word or path)?"""
    return re.search(r"(?<![\w./{}-])%s(?![\w/-])" % re.escape(name), text) is not None


problems = []


def missing(page, what, items, text):
    for i in sorted(items):
        if not names(text, i):
            problems.append("doc/%s: %s %s is not named" % (page, what, i))


def stale(page, what, found, known, hint):
    for i in sorted(set(found) - set(known)):
        problems.append("doc/%s: %s %s is not %s" % (page, what, i, hint))


def flag(key):
    return "--" + key.replace("_", "-")


def doc(page):
    return page_lines(os.path.join(top, "doc", page))


keys = conf_table()
prod_keys = {k for k, (d, t) in keys.items() if not t}
all_routes = routes()
all_metrics = set()
PAGES = sorted(f for f in os.listdir(os.path.join(top, "doc")) if re.search(r"\.[1358]$", f))

# page, program, the code's directories, its usage function, the section
# that lists its keys, its metrics' sources
PROGRAMS = [
    ("idemflow-fcgi.8", "idemflow-fcgi", ["app/server"], ("app/server/main.c", "usage"),
     "CONFIGURATION", ["app/server"]),
    ("idemflow-dispatch.8", "idemflow-dispatch", ["app/dispatch"],
     ("app/dispatch/main.c", "usage"), "OPTIONS", ["app/dispatch"]),
    ("idemflow.1", "idemflow", ["app/cli"], ("app/cli/cli.c", "cli_usage"), "OPTIONS",
     ["app/cli"]),
]
for page, prog, dirs, (upath, ufunc), ksection, msrc in PROGRAMS:
    lines = doc(page)
    read = keys_read(dirs, prod_keys)
    # Keys are named in bold, as the key or as its flag: "workers" and
    # "once" are words too.
    bold = joined_bold(lines, [ksection])
    for k in sorted(read):
        if not names(bold, k) and not names(bold, flag(k)):
            problems.append("doc/%s: key %s, which %s reads, is not named in %s"
                            % (page, k, prog, ksection))
    named_keys = {k for k in prod_keys if names(bold, k) or names(bold, flag(k))}
    stale(page, "key named in %s:" % ksection, named_keys, read, "one %s reads" % prog)
    missing(page, "option", usage_options(usage_text(upath, ufunc)), joined(lines))
    m = metrics(msrc)
    all_metrics |= m
    missing(page, "metric", m, joined(lines))
    stale(page, "metric in METRICS:", re.findall(r"\bidemflow_[a-z0-9_]+",
                                                 joined(lines, ["METRICS"])),
          m, "one %s writes" % prog)

# idemflow(1): every command of the usage, every noun of main.c's table.
cmds = usage_commands(usage_text("app/cli/cli.c", "cli_usage"))
for noun in cli_nouns():
    if not any(c.split()[0] == noun for c in cmds):
        problems.append("app/cli/cli.c: command %s of app/cli/main.c is not in the usage" % noun)
missing("idemflow.1", "command", cmds, joined(doc("idemflow.1"), ["COMMANDS"]))

# idemflow-fcgi(8): every route, among the route labels of METRICS.
missing("idemflow-fcgi.8", "route", all_routes, joined(doc("idemflow-fcgi.8"), ["METRICS"]))

# libidemflow-inbox(3): its functions and its metric.
lines = doc("libidemflow-inbox.3")
missing("libidemflow-inbox.3", "function", inbox_functions(), joined(lines))
m = metrics(["sql/consumer", "app/inbox"])
all_metrics |= m
missing("libidemflow-inbox.3", "metric", m, joined(lines))

# idemflow.conf(5): one entry per key (".TP", then ".B key", in a section
# named "... KEYS"), saying "Default: " and the table's default.
entries = {}
lines = doc("idemflow.conf.5")
for i, ln in enumerate(lines):
    if ln.macro == "TP" and ln.section.endswith("KEYS") and i + 1 < len(lines) \
            and lines[i + 1].macro == "B":
        body = []
        for nxt in lines[i + 2:]:
            if nxt.macro == "TP" or nxt.section != ln.section:
                break
            body.append(nxt.text)
        entries[lines[i + 1].text] = re.sub(r"\s+", " ", " ".join(body)).strip()
for k in sorted(set(keys) - set(entries)):
    problems.append("doc/idemflow.conf.5: key %s has no entry" % k)
stale("idemflow.conf.5", "entry", entries, keys, "a key of app/core/conf.c")
for k in sorted(set(keys) & set(entries)):
    m = re.search(r"Default: (\S+?)(?=[.,;]? |[.,;]?$)", entries[k])
    shown = {"empty": "", "none": ""}.get(m.group(1), m.group(1)) if m else None
    if shown != keys[k][0]:
        problems.append("doc/idemflow.conf.5: key %s: default %s, the code's %s"
                        % (k, "not given" if shown is None else '"%s"' % shown,
                           '"%s"' % keys[k][0]))

# Every page: a /v1/ path is a route; a name like a metric's is one.
for page in PAGES:
    text = joined(doc(page))
    for p in sorted(set(re.findall(r"(?<![\w.])/v1/[\w{}/.-]*", text))):
        p = p.rstrip(".")
        if p.endswith("/"):  # "/v1/jobs/{key}/...": the routes below it
            ok = any(r.startswith(p) for r in all_routes)
        else:
            ok = p in all_routes
        if not ok:
            problems.append("doc/%s: path %s is no route of app/server/route.c" % (page, p))
    for n in sorted(set(re.findall(r"\bidemflow_[a-z0-9_]+_(?:total|seconds)\b", text))):
        if n not in all_metrics:
            problems.append("doc/%s: metric %s is written by no program" % (page, n))

for p in problems:
    print(p)
print("%d pages; %d keys, %d routes, %d metrics in the code; %d problems"
      % (len(PAGES), len(keys), len(all_routes), len(all_metrics), len(problems)))
sys.exit(1 if problems else 0)
