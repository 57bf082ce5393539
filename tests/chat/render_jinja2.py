#!/usr/bin/python3
"""Reference renderer for the chat-template parity tests: Python's jinja2 set up the way Hugging
Face transformers sets it up in apply_chat_template (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols and the {% generation %} tag; tojson with
ensure_ascii=False; raise_exception; strftime_now), with the render arguments transformers passes.

Single render (same flags as `peregrine chat-template`):
    render_jinja2.py --template FILE --messages CONV.json [--no-generation-prompt]
                     [--now ISO8601] [--vars JSON]
Batch (used by test_chat_template_parity):
    render_jinja2.py --batch JOBS.json --out RESULTS.json
JOBS.json is a list of {"template": path, "conversation": {...}, "add_generation_prompt": bool,
"vars": {...}, "now": iso8601} (a chat render) or {"source": text, "vars": {...}, "now": iso8601}
(a bare template); RESULTS.json gets one {"ok": true, "text": ...} or {"ok": false, "error": "..."}
per job.

Needs Debian's python3-jinja2; exits with status 3 when it is missing (the C++ test then fails).
"""
import argparse
import json
import re
import signal
import sys
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:  # pragma: no cover
    sys.stderr.write(f"render_jinja2.py: python3-jinja2 is required: {e}\n")
    sys.exit(3)


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers uses it to mark assistant tokens; the
    body renders unchanged (as the body of a call block)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def make_env(now):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        return (now if now is not None else datetime.now()).strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def compile_template(env_cache, key, source, now):
    if key not in env_cache:
        env = make_env(now)
        try:
            env_cache[key] = env.from_string(source)
        except Exception as e:  # compile errors are recorded per job
            env_cache[key] = e
    tpl = env_cache[key]
    if isinstance(tpl, Exception):
        raise tpl
    return tpl


def render(env_cache, template_path, conversation, add_generation_prompt, extra_vars, now):
    key = (template_path, now)
    if key not in env_cache:
        with open(template_path, encoding="utf-8") as f:
            source = f.read()
        env = make_env(now)
        try:
            env_cache[key] = env.from_string(source)
        except Exception as e:  # compile errors are recorded per job
            env_cache[key] = e
    tpl = env_cache[key]
    if isinstance(tpl, Exception):
        raise tpl
    if isinstance(conversation, list):
        messages, tools = conversation, None
    else:
        messages, tools = conversation["messages"], conversation.get("tools")
    kwargs = {"bos_token": "<s>", "eos_token": "</s>"}
    kwargs.update(extra_vars or {})
    return tpl.render(
        messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **kwargs
    )


def parse_now(s):
    return datetime.fromisoformat(s) if s else None


SURROGATE = re.compile("[\ud800-\udfff]")


class JobTimeout(BaseException):
    """A bare template ran past its job's "timeout" (seconds)."""


def _on_alarm(signum, frame):
    raise JobTimeout("render timed out")


signal.signal(signal.SIGALRM, _on_alarm)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template")
    ap.add_argument("--messages")
    ap.add_argument("--no-generation-prompt", action="store_true")
    ap.add_argument("--now")
    ap.add_argument("--vars")
    ap.add_argument("--batch")
    ap.add_argument("--out")
    a = ap.parse_args()
    cache = {}
    if a.batch:
        with open(a.batch, encoding="utf-8") as f:
            jobs = json.load(f)
        results = []
        for job in jobs:
            try:
                if "source" in job:  # a bare template rendered with job["vars"] as its variables
                    now = parse_now(job.get("now"))
                    signal.alarm(int(job.get("timeout", 0)))
                    try:
                        tpl = compile_template({}, None, job["source"], now)
                        text = tpl.render(**job.get("vars", {}))
                    finally:
                        signal.alarm(0)
                else:
                    text = render(cache, job["template"], job["conversation"], job["add_generation_prompt"],
                                  job.get("vars"), parse_now(job.get("now")))
                # Lone surrogates cannot be UTF-8; the C++ engine writes U+FFFD for them.
                results.append({"ok": True, "text": SURROGATE.sub("\ufffd", text)})
            except (Exception, JobTimeout) as e:
                results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(results, f, ensure_ascii=False)
        return 0
    if not a.template or not a.messages:
        ap.error("--template and --messages are required (or --batch)")
    with open(a.messages, encoding="utf-8") as f:
        conv = json.load(f)
    try:
        text = render(cache, a.template, conv, not a.no_generation_prompt,
                      json.loads(a.vars) if a.vars else {}, parse_now(a.now))
    except Exception as e:
        sys.stderr.write(f"error: {type(e).__name__}: {e}\n")
        return 1
    sys.stdout.buffer.write(SURROGATE.sub("\ufffd", text).encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
