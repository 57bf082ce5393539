#!/usr/bin/env python3
"""Independent check for test_json_schema: validates JSON instances against their schemas with the
jsonschema package (Debian python3-jsonschema), formats checked. Input: a JSON list of
{"schema": ..., "instances": [text...]}; output: a list of lists of [valid, reason]."""
import json
import sys

import jsonschema


def check(schema, text):
    try:
        value = json.loads(text)
    except ValueError as e:
        return [False, "not JSON: %s" % e]
    # The draft 2020-12 format checker (FormatChecker() would also apply draft 3's 'time').
    fc = getattr(jsonschema, "draft202012_format_checker", None) or jsonschema.Draft202012Validator.FORMAT_CHECKER
    v = jsonschema.Draft202012Validator(schema, format_checker=fc)
    errs = list(v.iter_errors(value))
    return [not errs, errs[0].message[:300] if errs else ""]


def main():
    jobs = json.load(open(sys.argv[1], encoding="utf-8"))
    out = [[check(j["schema"], t) for t in j["instances"]] for j in jobs]
    json.dump(out, open(sys.argv[2], "w", encoding="utf-8"))


if __name__ == "__main__":
    main()
