#!/usr/bin/python3
"""t/contract/test_openapi_examples.py - doc/openapi.yaml is friendly to code
generators and every one of its examples is true.

Checks, on the document as scripts/embed-openapi reads it:
- info.license is MIT (name and SPDX identifier);
- no schema uses `const` (a single-value `enum` instead) nor
  `if`/`then`/`else` (`oneOf` of plain schemas instead), which generators
  such as openapi-typescript do not follow;
- every operation, of paths and of webhooks, has an example for each media
  type of its request body and of each of its 2xx answers that has a body;
- every example in the document, wherever it is (request, answer, shared
  answer), is valid against the schema beside it (JSON Schema Draft
  2020-12, Debian's python3-jsonschema, every $ref resolved in the
  document).
First it breaks one example (the created workflow without its `id`) and
expects the validator to refuse it: a check that passes everything would
prove nothing. Prints what it counted.
"""

import copy
import warnings
import os
import sys

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.environ.get("top_srcdir") or os.path.join(HERE, "..", "..")
DOC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SRCDIR, "doc", "openapi.yaml")
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
NOT_FOR_GENERATORS = ("const", "if", "then", "else")


class TextLoader(yaml.SafeLoader):
    """safe_load without the implicit timestamp type, as scripts/embed-openapi."""


TextLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def resolve(doc, node):
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = doc
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def schema_keywords(node, where, found):
    """Every NOT_FOR_GENERATORS keyword in a schema, examples left out."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("example", "examples"):
                continue
            if k in NOT_FOR_GENERATORS and where.rsplit("/", 1)[-1] != "properties":
                found.append(f"{where}/{k}")
            schema_keywords(v, f"{where}/{k}", found)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            schema_keywords(v, f"{where}/{i}", found)


def media_types(doc, node, where):
    """(where, media type object) of every content map under node."""
    if isinstance(node, dict):
        if "content" in node and isinstance(node["content"], dict) and "$ref" not in node:
            for mt, obj in node["content"].items():
                if isinstance(obj, dict) and "schema" in obj:
                    yield f"{where}/content/{mt}", obj
        for k, v in node.items():
            if k in ("example", "examples", "schema"):
                continue
            yield from media_types(doc, v, f"{where}/{k}")


def examples_of(obj):
    if "example" in obj:
        yield "example", obj["example"]
    for name, ex in (obj.get("examples") or {}).items():
        yield f"examples/{name}", ex["value"]


def validator(doc, schema):
    resolver = jsonschema.RefResolver(base_uri="", referrer=doc)
    return jsonschema.Draft202012Validator(schema, resolver=resolver)


def main():
    warnings.simplefilter("ignore", DeprecationWarning)  # RefResolver, as test_contract.py
    with open(DOC, encoding="utf-8") as f:
        doc = yaml.load(f, Loader=TextLoader)  # noqa: S506 (a SafeLoader)
    failures = []

    lic = doc.get("info", {}).get("license")
    if lic != {"name": "MIT", "identifier": "MIT"}:
        failures.append(f"info.license is {lic!r}, not MIT")
    else:
        print("ok - info.license: MIT")

    found = []
    schema_keywords(doc, "#", found)
    if found:
        failures += [f"{w}: not for code generators" for w in found]
    else:
        print("ok - no const, if, then or else in any schema")

    # Every operation: its request and its 2xx answers have examples.
    ops = 0
    for section in ("paths", "webhooks"):
        for key, item in doc.get(section, {}).items():
            for method in METHODS:
                op = item.get(method)
                if op is None:
                    continue
                ops += 1
                name = f"{section} {key} {method} ({op.get('operationId')})"
                body = resolve(doc, op.get("requestBody"))
                for mt, obj in (body or {}).get("content", {}).items():
                    if not list(examples_of(obj)):
                        failures.append(f"{name}: no request example for {mt}")
                for status, resp in op.get("responses", {}).items():
                    if not str(status).startswith("2"):
                        continue
                    for mt, obj in (resolve(doc, resp).get("content") or {}).items():
                        if not list(examples_of(obj)):
                            failures.append(f"{name}: no example of the {status} answer, {mt}")
    print(f"{'ok' if not failures else 'not ok'} - {ops} operations, each with its examples")

    # A broken example must be refused.
    created = doc["paths"]["/v1/workflows"]["post"]["responses"]["201"]["content"][
        "application/json"]
    broken = copy.deepcopy(created.get("example", {"id": None}))
    del broken["id"]
    if validator(doc, created["schema"]).is_valid(broken):
        failures.append("the validator accepted a created workflow without its id")
    else:
        print("ok - the validator refuses an example without a required member")

    n = 0
    for where, obj in media_types(doc, doc, "#"):
        v = validator(doc, obj["schema"])
        for name, value in examples_of(obj):
            n += 1
            errors = sorted(v.iter_errors(value), key=lambda e: list(e.path))
            for e in errors[:3]:
                failures.append(f"{where}/{name}: {'/'.join(map(str, e.path))}: {e.message[:300]}")
    print(f"{'ok' if not failures else 'not ok'} - {n} examples checked against their schemas")

    for f in failures:
        print(f"not ok - {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
