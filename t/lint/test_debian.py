#!/usr/bin/env python3
"""t/lint/test_debian.py - debian/tests/control is valid autopkgtest, and
the project's addresses agree.

debian/tests/control (autopkgtest(5), deb822): every paragraph has
either Tests or Test-Command, only fields autopkgtest knows, Restrictions
and Features it knows, a Depends that parses (packages with optional
version and architecture, alternatives, @, @builddeps@, @recommends@);
every test it names is an executable file of debian/tests whose #! line
names a shell or Python, and a shell script parses (sh -n, bash -n).

The addresses: configure.ac's AC_INIT bug address is its URL followed by
/issues; debian/control's Homepage and Vcs-Browser are that URL and
Vcs-Git that URL followed by .git; debian/copyright's Source is the URL
and its Upstream-Contact the bug address.

Prints one line per problem and exits 1 if there is one.
"""
import os
import re
import subprocess
import sys

top = os.environ.get("top_srcdir", ".")
problems = []

FIELDS = {"Tests", "Test-Command", "Restrictions", "Features", "Depends", "Tests-Directory",
          "Classes", "Architecture"}
RESTRICTIONS = {"allow-stderr", "breaks-testbed", "build-needed", "flaky", "hint-testsuite-triggers",
                "isolation-container", "isolation-machine", "needs-internet", "needs-reboot",
                "needs-root", "needs-sudo", "rw-build-tree", "skip-foreign-architecture",
                "skip-not-installable", "skippable", "superficial", "needs-recommends"}
FEATURES = {"test-name"}
PKG = r"[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?"
DEP = re.compile(r"^(?:@|@builddeps@|@recommends@|%s(?:\s*\((?:<<|<=|=|>=|>>)\s*[^()\s]+\))?"
                 r"(?:\s*\[[^]]+\])?)$" % PKG)


def read(rel):
    with open(os.path.join(top, rel), encoding="utf-8") as f:
        return f.read()


def deb822(text, where):
    """[{field: value}] of a deb822 text; comments dropped."""
    paras = []
    for chunk in re.split(r"\n[ \t]*\n", text.strip()):
        fields, name = {}, None
        for n, line in enumerate(chunk.split("\n")):
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t"):
                if name is None:
                    problems.append("%s: a continuation line with no field: %r" % (where, line))
                    continue
                fields[name] += " " + line.strip()
                continue
            m = re.match(r"([A-Za-z][A-Za-z0-9-]*):\s*(.*)$", line)
            if m is None:
                problems.append("%s: not a field: %r" % (where, line))
                continue
            name = m.group(1)
            if name in fields:
                problems.append("%s: field %s given twice" % (where, name))
            fields[name] = m.group(2).strip()
        if fields:
            paras.append(fields)
    return paras


# ---------------------------------------------------------------- debian/tests/control
CONTROL = "debian/tests/control"
if not os.path.exists(os.path.join(top, CONTROL)):
    problems.append("%s: missing" % CONTROL)
    paras = []
else:
    paras = deb822(read(CONTROL), CONTROL)
    if not paras:
        problems.append("%s: no test" % CONTROL)
tests = []
for i, p in enumerate(paras, 1):
    where = "%s: paragraph %d" % (CONTROL, i)
    for f in sorted(set(p) - FIELDS):
        problems.append("%s: unknown field %s" % (where, f))
    if ("Tests" in p) == ("Test-Command" in p):
        problems.append("%s: needs exactly one of Tests and Test-Command" % where)
    for r in re.split(r"[\s,]+", p.get("Restrictions", "").strip()):
        if r and r not in RESTRICTIONS:
            problems.append("%s: unknown restriction %s" % (where, r))
    for f in re.split(r"[\s,]+", p.get("Features", "").strip()):
        if f and f.split("=")[0] not in FEATURES:
            problems.append("%s: unknown feature %s" % (where, f))
    if "Depends" in p:
        for item in p["Depends"].split(","):
            for alt in item.split("|"):
                if not DEP.match(alt.strip()):
                    problems.append("%s: Depends: cannot parse %r" % (where, alt.strip()))
    d = p.get("Tests-Directory", "debian/tests")
    tests += [(where, os.path.join(d, t)) for t in re.split(r"[\s,]+", p.get("Tests", "")) if t]

for where, t in tests:
    path = os.path.join(top, t)
    if not os.path.isfile(path):
        problems.append("%s: test %s: no such file" % (where, t))
        continue
    if not os.access(path, os.X_OK):
        problems.append("%s: test %s is not executable" % (where, t))
    first = open(path, encoding="utf-8").readline()
    m = re.match(r"#!\s*(\S+)(?:\s+(\S+))?", first)
    interp = m and os.path.basename(m.group(2) if m.group(1).endswith("/env") else m.group(1))
    if interp in ("sh", "bash", "dash"):
        r = subprocess.run([interp, "-n", path], capture_output=True, text=True)
        if r.returncode != 0:
            problems.append("%s: %s -n %s: %s" % (where, interp, t, r.stderr.strip()))
    elif interp not in ("python3",):
        problems.append("%s: test %s: #! line names no shell nor python3: %r"
                        % (where, t, first.strip()))

# ---------------------------------------------------------------- the addresses
m = re.search(r"AC_INIT\(\[([^]]*)\],\s*\[([^]]*)\],\s*\[([^]]*)\],\s*\[([^]]*)\],\s*\[([^]]*)\]\)",
              read("configure.ac"))
if m is None:
    problems.append("configure.ac: AC_INIT lacks a bug address and a URL "
                    "(AC_INIT([name], [version], [bugs], [tarname], [url]))")
else:
    bugs, url = m.group(3), m.group(5)
    if not re.match(r"https://\S+$", url):
        problems.append("configure.ac: AC_INIT's URL is not https://...: %r" % url)
    if bugs != url + "/issues":
        problems.append("configure.ac: AC_INIT's bug address %r is not %s/issues" % (bugs, url))
    source = deb822(read("debian/control"), "debian/control")[0]
    for field, want in (("Homepage", url), ("Vcs-Browser", url), ("Vcs-Git", url + ".git")):
        if source.get(field) != want:
            problems.append("debian/control: %s is %r, not %r (configure.ac's URL)"
                            % (field, source.get(field), want))
    header = deb822(read("debian/copyright"), "debian/copyright")[0]
    for field, want in (("Source", url), ("Upstream-Contact", bugs)):
        if header.get(field) != want:
            problems.append("debian/copyright: %s is %r, not %r (configure.ac's AC_INIT)"
                            % (field, header.get(field), want))

for p in problems:
    print(p)
print("%d autopkgtest tests; %d problems" % (len(tests), len(problems)))
sys.exit(1 if problems else 0)
