#!/usr/bin/env python3
"""t/lint/test_licence.py - every place that states idemflow's licence says MIT.

LICENSE is the MIT licence with the project's copyright line; the others
must agree with it:

- debian/copyright (DEP-5): every Files paragraph is "License: MIT" with
  LICENSE's copyright holder, and its stand-alone "License: MIT"
  paragraph holds LICENSE's text, word for word;
- every package.json of the tree (node_modules left out) says
  "license": "MIT", and so does the root package of a package-lock.json;
- configure.ac's AC_COPYRIGHT names LICENSE's copyright line and MIT;
- doc/openapi.yaml's info.license is MIT (name, and identifier if given).

Prints one line per disagreement and exits 1 if there is one.
"""
import json
import os
import re
import sys

import yaml

top = os.environ.get("top_srcdir", ".")
LICENCE = "MIT"
problems = []


def read(rel):
    with open(os.path.join(top, rel), encoding="utf-8") as f:
        return f.read()


# LICENSE: "MIT License", the copyright line, then the permission text.
if not os.path.exists(os.path.join(top, "LICENSE")):
    sys.exit("LICENSE: missing")
lic = read("LICENSE").split("\n")
if lic[0] != "MIT License":
    problems.append('LICENSE: first line is "%s", not "MIT License"' % lic[0])
m = re.match(r"Copyright \(c\) (\d{4}(?:-\d{4})?) (.+)$", lic[2] if len(lic) > 2 else "")
if m is None:
    sys.exit('LICENSE: the third line is not "Copyright (c) YEAR HOLDER"')
year, holder = m.groups()
body = "\n".join(lic[4:]).strip()
for phrase in ("Permission is hereby granted, free of charge, to any person obtaining a copy",
               "The above copyright notice and this permission notice shall be included in all",
               'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR'):
    if phrase not in body:
        problems.append("LICENSE: the MIT text lacks: %s" % phrase)

# debian/copyright, a deb822 file: paragraphs of fields, continuation
# lines indented, "." for an empty line.
paras = []
for chunk in re.split(r"\n\s*\n", read("debian/copyright").strip()):
    fields, name = {}, None
    for line in chunk.split("\n"):
        if line.startswith((" ", "\t")) and name:
            fields[name] += "\n" + ("" if line.strip() == "." else line[1:])
        else:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    paras.append(fields)
files = [p for p in paras if "Files" in p]
if not files:
    problems.append("debian/copyright: no Files paragraph")
for p in files:
    if p.get("License", "").split("\n")[0] != LICENCE:
        problems.append("debian/copyright: Files: %s is License: %s, not %s"
                        % (p["Files"], p.get("License", "(none)").split("\n")[0], LICENCE))
    if "%s %s" % (year, holder) not in p.get("Copyright", ""):
        problems.append('debian/copyright: Files: %s: Copyright is not "%s %s" as in LICENSE'
                        % (p["Files"], year, holder))
texts = [p["License"].split("\n", 1) for p in paras if "Files" not in p and "License" in p]
texts = {t[0]: t[1].strip() if len(t) > 1 else "" for t in texts}
if LICENCE not in texts:
    problems.append("debian/copyright: no stand-alone License: %s paragraph" % LICENCE)
elif texts[LICENCE] != body:
    problems.append("debian/copyright: the License: %s text differs from LICENSE's" % LICENCE)

# package.json, and the root package of package-lock.json.
skip = {"node_modules", ".git", "var", "autom4te.cache"}
for d, dirs, fs in os.walk(top):
    dirs[:] = [x for x in dirs if x not in skip]
    for f in fs:
        path = os.path.join(d, f)
        rel = os.path.relpath(path, top)
        if f == "package.json":
            got = json.load(open(path, encoding="utf-8")).get("license")
        elif f == "package-lock.json":
            got = json.load(open(path, encoding="utf-8")).get("packages", {}).get(
                "", {}).get("license")
        else:
            continue
        if got != LICENCE:
            problems.append('%s: "license" is %s, not "%s"' % (rel, json.dumps(got), LICENCE))

# configure.ac: AC_COPYRIGHT([Copyright (c) YEAR HOLDER. MIT License: ...]).
m = re.search(r"AC_COPYRIGHT\(\[(.*?)\]\)", read("configure.ac"), re.S)
if m is None:
    problems.append("configure.ac: no AC_COPYRIGHT")
else:
    if "Copyright (c) %s %s" % (year, holder) not in m.group(1):
        problems.append("configure.ac: AC_COPYRIGHT does not name LICENSE's copyright line")
    if not re.search(r"\b%s\b" % LICENCE, m.group(1)):
        problems.append("configure.ac: AC_COPYRIGHT does not name the %s licence" % LICENCE)

# doc/openapi.yaml: info.license.
info_lic = (yaml.safe_load(read("doc/openapi.yaml")).get("info") or {}).get("license") or {}
if info_lic.get("name") != LICENCE:
    problems.append("doc/openapi.yaml: info.license.name is %s, not %s"
                    % (json.dumps(info_lic.get("name")), LICENCE))
if "identifier" in info_lic and info_lic["identifier"] != LICENCE:
    problems.append("doc/openapi.yaml: info.license.identifier is %s, not %s"
                    % (json.dumps(info_lic["identifier"]), LICENCE))

for p in problems:
    print(p)
print("licence %s, copyright %s %s: %d disagreements" % (LICENCE, year, holder, len(problems)))
sys.exit(1 if problems else 0)
