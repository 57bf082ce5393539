#!/usr/bin/python3
"""Writes the seed corpora of the chat fuzzers (fuzz_jinja, fuzz_chat_parse).

  /usr/bin/python3 fuzz/seeds_chat/make_seeds.py OUT_DIR SHARED_DIR

OUT_DIR/jinja: every real chat template under SHARED_DIR/testdata/chat_templates as is (rendered with the fuzzer's fixed
conversation), the real templates once more with a conversation of tests/chat/conversations.json as the first line,
each golden case of tests/chat/jinja_cases.json as "<its vars as one JSON line>\\n<template>", and the hostile
one-liners of jinja_edge.txt.
OUT_DIR/parse: realistic model outputs of every tool-call family (reasoning, content, single and parallel calls,
truncated and malformed markup), written here because no other file holds raw model outputs.
"""
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(path, data):
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def one_line(obj):
    # json.dumps escapes newlines inside strings, so the context stays on the first line.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def jinja_seeds(out, shared):
    os.makedirs(out, exist_ok=True)
    templates = sorted(glob.glob(os.path.join(shared, "testdata", "chat_templates", "**", "*.jinja*"), recursive=True))
    if not templates:
        sys.exit(f"make_seeds: no chat templates under {shared}/testdata/chat_templates")
    convs = json.load(open(os.path.join(ROOT, "tests", "chat", "conversations.json"), encoding="utf-8"))
    n = 0
    for i, path in enumerate(templates):
        src = open(path, encoding="utf-8").read()
        name = os.path.basename(path).split(".")[0]
        write(os.path.join(out, f"tpl-{name}"), src)
        # The same template with one of the test conversations (rotating, so each is used by some template).
        c = convs[i % len(convs)]
        ctx = dict(c.get("vars", {}))
        ctx.update(c["conversation"])
        ctx["add_generation_prompt"] = c.get("add_generation_prompt", True)
        write(os.path.join(out, f"tpl-{name}-{c['name']}"), one_line(ctx) + "\n" + src)
        n += 2
    # Hostile one-liners (huge widths, long searches, millions of small strings, self-referencing namespaces, ...):
    # the inputs behind the bugs fixed so far and their neighbours, one template per line.
    with open(os.path.join(HERE, "jinja_edge.txt"), encoding="utf-8") as f:
        for i, line in enumerate(l for l in f.read().split("\n") if l):
            write(os.path.join(out, f"edge-{i:03d}"), line)
            n += 1
    cases = json.load(open(os.path.join(ROOT, "tests", "chat", "jinja_cases.json"), encoding="utf-8"))["cases"]
    for i, c in enumerate(cases):
        vars_ = c.get("vars") or {}
        write(os.path.join(out, f"case-{i:03d}"), (one_line(vars_) + "\n" if vars_ else "") + c["template"])
        n += 1
    return n


DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_SEP = "<｜tool▁sep｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"

PARSE_SEEDS = {
    # Hermes / Qwen JSON
    "hermes-call": '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris", "days": 2}}\n</tool_call>',
    "hermes-reasoning-parallel": "<think>\nThe user wants the weather and the time.\n</think>\n\nLet me look.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris", "tags": ["a", "b"], "ratio": null}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>',
    "hermes-args-first": '<tool_call>\n{"arguments": {"city": "A\\"B \\u00e9"}, "name": "get_time"}\n</tool_call> done',
    "hermes-list": '<tool_call>[{"name": "get_time", "arguments": {"city": "X"}}, {"name": "x", "arguments": "{}"}]</tool_call>',
    "hermes-truncated": 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Par',
    "hermes-unknown": '<tool_call>\n{"name": "nope", "arguments": {"a": [1, 2.5e3, -0, true, false, null, {}]}}\n</tool_call>',
    "plain-prose": "  The weather in Paris is sunny, 24°C.\n\nAnything else? { not json } <b>html</b> ",
    "think-only": "Let me think about this carefully\n</think>\n\nParis is the capital of France.",
    # Qwen3-Coder XML
    "coder-call": "I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nNew York\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n<parameter=detailed>\ntrue\n</parameter>\n<parameter=options>\n"
    '{"a": [1, 2]}\n</parameter>\n<parameter=tags>\n["x"]\n</parameter>\n</function>\n</tool_call>',
    "coder-multiline": "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n<parameter=content>\n"
    "def f(x):\n    return x < 3 and x > 1\n</para\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
    "<function=get_time>\n<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>",
    "coder-bare-function": "<function=get_time>\n<parameter=city>\nLima\n</parameter>\n</function>",
    "seed-oss": "<seed:think>plan</seed:think><seed:tool_call>\n<function=get_time>\n<parameter=city>\nRome\n"
    "</parameter>\n</function>\n</seed:tool_call>",
    # Llama 3
    "llama-json": '{"name": "get_weather", "parameters": {"location": "Paris", "days": 3}}',
    "llama-python-tag": '<|python_tag|>brave_search.call(query="a, (b)", n=2)',
    "llama-code": "<|python_tag|>print('hi')\nx = {\"a\": 1}",
    "llama-two": '{"name": "get_time", "parameters": {"city": "A"}}; {"name": "get_time", "parameters": {"city": "B"}}',
    "llama-answer": '{"name": "Bob"} is a JSON answer',
    "llama-tag-json": '<|python_tag|>{"name": "get_time", "parameters": {"city": "Kyiv"}}<|eom_id|>',
    # Mistral
    "mistral-list": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris"}, "id": "abc123def"}, '
    '{"name": "get_time", "arguments": {}}]',
    "mistral-args": "[THINK]Hmm [TOOL_CALLS] maybe[/THINK]Text[TOOL_CALLS]get_time[ARGS]{\"city\": \"A\"}"
    '[TOOL_CALLS]get_time[CALL_ID]123456789[ARGS]{"city": "B"}',
    # DeepSeek
    "deepseek-r1": "<think>\nR\n</think>\n\n" + DS_CALLS_BEGIN + DS_CALL_BEGIN + "function" + DS_SEP
    + 'get_weather\n```json\n{"location": "Paris"}\n```' + DS_CALL_END + "\n" + DS_CALL_BEGIN + "function" + DS_SEP
    + "get_time\n```json\n{}\n```" + DS_CALL_END + DS_CALLS_END,
    "deepseek-v31": "Text" + DS_CALLS_BEGIN + DS_CALL_BEGIN + "get_time" + DS_SEP + '{"city": "Paris"}' + DS_CALL_END
    + DS_CALLS_END,
    # GPT-OSS harmony
    "gptoss-call": "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary<|message|>Pre."
    "<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
    '{"location": "Tokyo"}<|call|>',
    "gptoss-final": "<|channel|>analysis<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>Answer <b>.<|return|>",
    "gptoss-bare": ' to=functions.get_time<|channel|>commentary<|message|>{"city": "X"}',
    # bytes that are not UTF-8, split sequences, escapes
    "bad-utf8": b'<tool_call>\n{"name": "get_time", "arguments": {"city": "\xc3\xa9\xff\xf0\x9f\x98 \\ud83d"}}\n</tool_call>\xe2\x82',
}


def parse_seeds(out):
    os.makedirs(out, exist_ok=True)
    for name, text in PARSE_SEEDS.items():
        write(os.path.join(out, name), text)
    return len(PARSE_SEEDS)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out, shared = sys.argv[1], sys.argv[2]
    nj = jinja_seeds(os.path.join(out, "jinja"), shared)
    np_ = parse_seeds(os.path.join(out, "parse"))
    print(f"make_seeds: {nj} template seeds, {np_} model-output seeds in {out}")


if __name__ == "__main__":
    main()
