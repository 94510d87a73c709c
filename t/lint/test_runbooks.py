#!/usr/bin/env python3
"""t/lint/test_runbooks.py - every alert can be acted on and is tested.

For every alert of etc/idemflow-rules.yml:
  - annotations.runbook_url is the installed doc/runbooks.md with an
    anchor, and the anchor is a section heading of doc/runbooks.md (as
    GitHub and most renderers make anchors: lower case, spaces to "-",
    punctuation dropped);
  - etc/idemflow-rules.test.yml has a promtool test in which it fires
    (exp_alerts not empty).
And every "## " section of doc/runbooks.md is an alert's, so no runbook
outlives its alert. Prints every problem and exits 1 if there is one.
"""
import os
import re
import sys

import yaml

BASE = "file:///usr/share/doc/idemflow/runbooks.md#"

top = os.environ.get("top_srcdir") or os.path.join(os.path.dirname(__file__), "..", "..")


def anchor(heading):
    a = heading.strip().lower()
    a = re.sub(r"[^\w\- ]", "", a)
    return a.replace(" ", "-")


def main():
    problems = []
    with open(os.path.join(top, "etc", "idemflow-rules.yml")) as f:
        rules = yaml.safe_load(f)
    with open(os.path.join(top, "etc", "idemflow-rules.test.yml")) as f:
        tests = yaml.safe_load(f)
    with open(os.path.join(top, "doc", "runbooks.md")) as f:
        sections = [anchor(m.group(1)) for m in re.finditer(r"^## (.+)$", f.read(), re.M)]

    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    fired = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])
             if t.get("exp_alerts")}
    names = set()
    for r in alerts:
        name = r["alert"]
        names.add(name.lower())
        url = (r.get("annotations") or {}).get("runbook_url")
        if url is None:
            problems.append(f"{name}: no annotations.runbook_url")
        elif not url.startswith(BASE):
            problems.append(f"{name}: runbook_url {url!r} is not {BASE}<section>")
        elif url[len(BASE):] not in sections:
            problems.append(f"{name}: runbook_url's anchor #{url[len(BASE):]} is no section "
                            "of doc/runbooks.md")
        if name not in fired:
            problems.append(f"{name}: no promtool test in etc/idemflow-rules.test.yml in "
                            "which it fires")
    for s in sections:
        if s not in names:
            problems.append(f"doc/runbooks.md: section #{s} is no alert's")
    for p in problems:
        print("FAIL:", p)
    print(f"{len(alerts)} alerts, {len(sections)} runbook sections, {len(fired)} alerts "
          f"fired in tests, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
