#!/usr/bin/env python3
"""Seeds for fuzz_grammar: hand-written GBNF (mode byte 0) and JSON Schemas (mode byte 1), the latter
from the BFCL tool definitions in shared/testdata/bench/bfcl (first 60) plus keyword samples."""
import glob
import json
import os
import sys

out, shared = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
gbnf = [
    'root ::= "a" | "b" ( "c" )* [d-f]{2,3}\n',
    'root ::= list\nlist ::= "[" ( item ( "," item )* )? "]"\nitem ::= [0-9]+ | list\n',
    'root ::= [^"\\\\]* "\\u00e9" . # comment\n',
    'root ::= x{0,5} y?\nx ::= "ab" | ""\ny ::= [\\x00-\\x7F]+\n',
]
schemas = [
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+\\d{2}$"}, "b": {"type": "integer", "minimum": -3, "maximum": 77}}, "required": ["a"]},
    {"$defs": {"n": {"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}}, "$ref": "#/$defs/n"},
    {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}, {"enum": [1, "x", [2]]}]},
    {"type": "array", "prefixItems": [{"type": "boolean"}], "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
]
path = os.path.join(shared, "testdata/bench/bfcl/BFCL_v4_live_simple.json")
with open(path, encoding="utf-8") as f:
    for i, line in enumerate(f):
        if i >= 60:
            break
        for fn in json.loads(line)["function"]:
            s = json.dumps(fn["parameters"]).replace('"dict"', '"object"').replace('"float"', '"number"')
            schemas.append(json.loads(s))
for i, g in enumerate(gbnf):
    open(os.path.join(out, "gbnf-%d" % i), "wb").write(b"\x00" + g.encode())
for i, s in enumerate(schemas):
    open(os.path.join(out, "schema-%d" % i), "wb").write(b"\x01" + json.dumps(s).encode())
