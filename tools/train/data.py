"""Synthetic instruction conversations with checkable answers, plus Python standard-library code text.

Every generator returns a Sample: the conversation (OpenAI-style messages, optional tools) and a
checker that decides whether a model's reply to the last user turn is right. The same generators,
with another seed, make the held-out evaluation set.
"""
import json
import os
import random
import sysconfig
from dataclasses import dataclass, field
from typing import Callable, List, Optional

WORDS = ("cat dog sun tree river apple house green lemon piano rocket silver garden window bridge candle "
         "forest planet yellow orange purple bottle pencil castle dragon falcon island jungle kitten ladder "
         "marble needle ocean parrot quartz rabbit saddle ticket umbrella violin walnut zebra anchor basket "
         "cactus dolphin engine feather glacier harbor igloo jacket kettle lantern meadow nugget oyster").split()
NAMES = "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Oscar Peggy Rupert Sybil Trent Victor Wendy".split()
CITIES = "Paris London Tokyo Berlin Madrid Rome Cairo Lima Oslo Seoul Sydney Toronto Dublin Vienna Prague Lisbon".split()
# Words, names and cities reserved for the held-out set, so its string, counting and tool questions
# are ones the training data never asked.
HELDOUT_WORDS, HELDOUT_NAMES, HELDOUT_CITIES = WORDS[-12:], NAMES[-4:], CITIES[-4:]
WORDS, NAMES, CITIES = WORDS[:-12], NAMES[:-4], CITIES[:-4]


@dataclass
class Sample:
    family: str
    messages: list
    tools: Optional[list] = None
    check: Optional[Callable[[str, str], bool]] = None  # (reply content, reply reasoning) -> correct
    meta: dict = field(default_factory=dict)


def _final_number(text: str) -> Optional[int]:
    import re
    nums = re.findall(r"-?\d+", text.replace(",", ""))
    return int(nums[-1]) if nums else None


# ---------------------------------------------------------------- arithmetic
def _digits(n):
    return [int(c) for c in str(n)][::-1]


def add_steps(a, b):
    da, db = _digits(a), _digits(b)
    carry, lines = 0, []
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        s = x + y + carry
        expr = f"{x} + {y}" + (f" + {carry}" if carry else "")
        nxt = s // 10
        lines.append(f"{expr} = {s}, write {s % 10}" + (f", carry {nxt}." if nxt else "."))
        carry = nxt
    if carry:
        lines.append(f"write the carry {carry}.")
    return "\n".join(lines)


def sub_steps(a, b):
    da, db = _digits(a), _digits(b)
    borrow, lines = 0, []
    for i in range(len(da)):
        x = da[i] - borrow
        y = db[i] if i < len(db) else 0
        if x < y:
            lines.append(f"{x} - {y} needs a borrow: {x + 10} - {y} = {x + 10 - y}, write {x + 10 - y}.")
            borrow = 1
        else:
            lines.append(f"{x} - {y} = {x - y}, write {x - y}.")
            borrow = 0
    return "\n".join(lines)


def gen_arith(rng: random.Random) -> Sample:
    kind = rng.choices(["add", "sub", "mul"], weights=[6, 3, 2])[0]
    if kind == "add":
        a = rng.randint(0, 10 ** rng.randint(1, 4) - 1)
        b = rng.randint(0, 10 ** rng.randint(1, 4) - 1)
        q = rng.choice(["What is {a} + {b}?", "Compute {a} + {b}.", "Add {a} and {b}.", "{a} + {b} = ?",
                        "What is the sum of {a} and {b}?"]).format(a=a, b=b)
        ans, op, steps = a + b, "+", add_steps(a, b)
    elif kind == "sub":
        a = rng.randint(0, 10 ** rng.randint(1, 4) - 1)
        b = rng.randint(0, a)
        q = rng.choice(["What is {a} - {b}?", "Compute {a} - {b}.", "Subtract {b} from {a}.", "{a} - {b} = ?"]).format(a=a, b=b)
        ans, op, steps = a - b, "-", sub_steps(a, b)
    else:
        a, b = rng.randint(2, 99), rng.randint(2, 9)
        q = rng.choice(["What is {a} * {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.", "{a} x {b} = ?"]).format(a=a, b=b)
        ans, op = a * b, "*"
        tens, ones = a // 10 * 10, a % 10
        steps = f"{tens} * {b} = {tens * b}.\n{ones} * {b} = {ones * b}.\n{tens * b} + {ones * b} = {ans}."
    content = f"{a} {op} {b} = {ans}."
    fam = f"arith_{kind}" + ("_3digit" if kind == "add" and a >= 100 and b >= 100 and a < 1000 and b < 1000 else "")
    return Sample(fam, [{"role": "user", "content": q}, {"role": "assistant", "reasoning_content": steps, "content": content}],
                  check=lambda c, r, ans=ans: _final_number(c) == ans, meta={"answer": ans})


def gen_add3(rng: random.Random) -> Sample:
    """3-digit addition exactly (the held-out family the model card reports)."""
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    q = rng.choice(["What is {a} + {b}?", "Compute {a} + {b}.", "Add {a} and {b}."]).format(a=a, b=b)
    return Sample("arith_add_3digit", [{"role": "user", "content": q},
                                       {"role": "assistant", "reasoning_content": add_steps(a, b), "content": f"{a} + {b} = {a + b}."}],
                  check=lambda c, r, ans=a + b: _final_number(c) == ans)


# ---------------------------------------------------------------- unit conversions
UNITS = [  # (from, to, factor, plural forms)
    ("km", "m", 1000), ("m", "cm", 100), ("cm", "mm", 10), ("kg", "g", 1000), ("l", "ml", 1000),
    ("hours", "minutes", 60), ("minutes", "seconds", 60), ("feet", "inches", 12), ("yards", "feet", 3),
    ("days", "hours", 24), ("weeks", "days", 7), ("m", "mm", 1000),
]


def mul_steps(x, f):
    if f in (10, 100, 1000):
        return f"Multiplying by {f} appends {len(str(f)) - 1} zero{'s' if f > 10 else ''}: {x * f}."
    tens, ones = x // 10 * 10, x % 10
    if tens == 0:
        return f"{x} * {f} = {x * f}."
    return f"{tens} * {f} = {tens * f}.\n{ones} * {f} = {ones * f}.\n{tens * f} + {ones * f} = {x * f}."


def gen_convert(rng: random.Random) -> Sample:
    src, dst, f = rng.choice(UNITS)
    x = rng.randint(1, 999) if f in (10, 100, 1000) else rng.randint(1, 99)
    q = rng.choice(["Convert {x} {s} to {d}.", "How many {d} are in {x} {s}?", "{x} {s} is how many {d}?",
                    "Express {x} {s} in {d}."]).format(x=x, s=src, d=dst)
    steps = f"1 {src.rstrip('s') if src.endswith('s') else src} = {f} {dst}.\n{x} * {f}: " + mul_steps(x, f)
    return Sample("convert", [{"role": "user", "content": q},
                              {"role": "assistant", "reasoning_content": steps, "content": f"{x} {src} = {x * f} {dst}."}],
                  check=lambda c, r, ans=x * f: _final_number(c) == ans)


# ---------------------------------------------------------------- strings and counting
def gen_string(rng: random.Random) -> Sample:
    w = rng.choice(WORDS)
    kind = rng.choice(["reverse", "upper", "length", "first", "last"])
    letters = ", ".join(w)
    if kind == "reverse":
        q, ans = rng.choice(["Reverse the word \"{w}\".", "Spell \"{w}\" backwards."]).format(w=w), w[::-1]
        steps = f"The letters are {letters}.\nBackwards: {', '.join(w[::-1])}."
        content = f"\"{w}\" reversed is \"{ans}\"."
    elif kind == "upper":
        q, ans = f"Write \"{w}\" in capital letters.", w.upper()
        steps = f"Each letter in upper case: {', '.join(w.upper())}."
        content = f"\"{ans}\""
    elif kind == "length":
        q, ans = rng.choice(["How many letters are in \"{w}\"?", "What is the length of the word \"{w}\"?"]).format(w=w), str(len(w))
        steps = "Counting: " + ", ".join(f"{c} ({i + 1})" for i, c in enumerate(w)) + "."
        content = f"\"{w}\" has {len(w)} letters."
    elif kind == "first":
        q, ans = f"What is the first letter of \"{w}\"?", w[0]
        steps = f"The letters are {letters}. The first is {w[0]}."
        content = f"The first letter of \"{w}\" is \"{w[0]}\"."
    else:
        q, ans = f"What is the last letter of \"{w}\"?", w[-1]
        steps = f"The letters are {letters}. The last is {w[-1]}."
        content = f"The last letter of \"{w}\" is \"{w[-1]}\"."
    return Sample("string", [{"role": "user", "content": q}, {"role": "assistant", "reasoning_content": steps, "content": content}],
                  check=lambda c, r, ans=ans: (f"\"{ans}\"" in c) or (ans.isdigit() and _final_number(c) == int(ans)))


def gen_count(rng: random.Random) -> Sample:
    w = rng.choice(WORDS) + rng.choice(["", "", rng.choice(WORDS)])
    ch = rng.choice(w) if rng.random() < 0.8 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    n = w.count(ch)
    q = rng.choice(["How many times does the letter \"{c}\" appear in \"{w}\"?", "Count the letter \"{c}\" in \"{w}\"."]).format(c=ch, w=w)
    running, k = [], 0
    for c in w:
        if c == ch:
            k += 1
            running.append(f"{c} ({k})")
        else:
            running.append(c)
    steps = "Going through the letters: " + ", ".join(running) + f".\nTotal: {n}."
    return Sample("count", [{"role": "user", "content": q},
                            {"role": "assistant", "reasoning_content": steps,
                             "content": f"The letter \"{ch}\" appears {n} time{'s' if n != 1 else ''} in \"{w}\"."}],
                  check=lambda c, r, n=n: _final_number(c) == n)


# ---------------------------------------------------------------- python functions from a specification
PY_SPECS = [
    ("returns {p} plus {k}", "return {p} + {k}", lambda k: (lambda x: x + k)),
    ("returns {p} times {k}", "return {p} * {k}", lambda k: (lambda x: x * k)),
    ("returns {p} minus {k}", "return {p} - {k}", lambda k: (lambda x: x - k)),
    ("returns the square of {p}", "return {p} * {p}", lambda k: (lambda x: x * x)),
    ("returns True if {p} is even and False otherwise", "return {p} % 2 == 0", lambda k: (lambda x: x % 2 == 0)),
    ("returns True if {p} is greater than {k}", "return {p} > {k}", lambda k: (lambda x: x > k)),
    ("returns the absolute value of {p}", "return abs({p})", lambda k: (lambda x: abs(x))),
    ("returns the remainder of {p} divided by {k}", "return {p} % {k}", lambda k: (lambda x: x % k)),
]
FN_NAMES = "compute transform helper apply calc process score adjust".split()
PARAMS = "x n value num a v".split()


def gen_python(rng: random.Random) -> Sample:
    spec, body, ref = rng.choice(PY_SPECS)
    k = rng.randint(2, 9)
    name = rng.choice(FN_NAMES) + "_" + rng.choice(["it", "num", "val", str(k)])
    p = rng.choice(PARAMS)
    q = f"Write a Python function `{name}({p})` that {spec.format(p=p, k=k)}."
    code = f"def {name}({p}):\n    {body.format(p=p, k=k)}\n"
    content = f"```python\n{code}```"
    f = ref(k)

    def check(c, r, name=name, f=f):
        import re
        m = re.search(r"```python\n(.*?)```", c, re.S)
        if not m:
            return False
        env = {}
        try:
            exec(compile(m.group(1), "<model>", "exec"), {"__builtins__": {"abs": abs}}, env)
            g = env[name]
            return all(g(x) == f(x) for x in (-7, -1, 0, 1, 2, 5, 12, 33))
        except Exception:
            return False
    return Sample("python", [{"role": "user", "content": q}, {"role": "assistant", "content": content}], check=check)


# ---------------------------------------------------------------- tool calls
TOOLS = {
    "get_weather": ({"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                                     "required": ["city"]}}}),
    "get_time": ({"type": "function", "function": {"name": "get_time", "description": "Current local time in a city",
                                                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                                  "required": ["city"]}}}),
    "lookup_user": ({"type": "function", "function": {"name": "lookup_user", "description": "Find a user's email address",
                                                      "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                                                                     "required": ["name"]}}}),
}


def gen_tool(rng: random.Random) -> Sample:
    names = list(TOOLS)
    rng.shuffle(names)
    tools = [TOOLS[n] for n in names[:rng.randint(1, 3)]]
    avail = [t["function"]["name"] for t in tools]
    fn = rng.choice(avail)
    if fn == "get_weather":
        city = rng.choice(CITIES)
        q = rng.choice(["What's the weather in {c}?", "Is it raining in {c}?", "How warm is it in {c} right now?"]).format(c=city)
        args = {"city": city}
        temp = rng.randint(-5, 35)
        cond = rng.choice(["sunny", "cloudy", "raining", "snowing", "windy"])
        result = json.dumps({"temperature_c": temp, "condition": cond})
        final = f"It is {temp}°C and {cond} in {city}."
    elif fn == "get_time":
        city = rng.choice(CITIES)
        q = rng.choice(["What time is it in {c}?", "Tell me the current time in {c}."]).format(c=city)
        args = {"city": city}
        hh, mm = rng.randint(0, 23), rng.randint(0, 59)
        result = json.dumps({"time": f"{hh:02d}:{mm:02d}"})
        final = f"It is {hh:02d}:{mm:02d} in {city}."
    else:
        name = rng.choice(NAMES)
        q = rng.choice(["What is {n}'s email address?", "Find the email of {n}."]).format(n=name)
        args = {"name": name}
        email = f"{name.lower()}@example.com"
        result = json.dumps({"email": email})
        final = f"{name}'s email address is {email}."
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": fn, "arguments": args}}]}
    msgs = [{"role": "user", "content": q}, call, {"role": "tool", "content": result}, {"role": "assistant", "content": final}]

    def check(c, r, fn=fn, args=args):
        import re
        m = re.search(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", c, re.S)
        if not m:
            return False
        try:
            d = json.loads(m.group(1))
        except Exception:
            return False
        return d.get("name") == fn and d.get("arguments") == args
    # For evaluation the conversation stops at the user turn; the expected reply is the tool call.
    return Sample("tool_call", msgs, tools=tools, check=check, meta={"eval_upto": 1})


def gen_chat(rng: random.Random) -> Sample:
    pairs = [
        ("Hello!", "Hello! How can I help you today?"),
        ("Hi, who are you?", "I am a small demo assistant bundled with Peregrine. I can do arithmetic, unit conversions, "
                             "simple string tasks, short Python functions and tool calls."),
        ("Thank you!", "You're welcome!"),
        ("What can you do?", "I can add and subtract numbers, convert units, work with words, write small Python functions "
                             "and call tools you give me."),
        ("Good morning.", "Good morning! What would you like to do?"),
    ]
    q, a = rng.choice(pairs)
    return Sample("chat", [{"role": "user", "content": q}, {"role": "assistant", "content": a}])


GENERATORS = [(gen_arith, 30), (gen_add3, 10), (gen_convert, 15), (gen_string, 12), (gen_count, 8), (gen_python, 10),
              (gen_tool, 12), (gen_chat, 3)]


def make_samples(seed: int, n: int) -> List[Sample]:
    rng = random.Random(seed)
    gens, weights = zip(*GENERATORS)
    out = []
    for _ in range(n):
        s = rng.choices(gens, weights=weights)[0](rng)
        # Some conversations carry a system prompt, some ask to skip reasoning.
        if rng.random() < 0.2:
            s.messages.insert(0, {"role": "system", "content": rng.choice(
                ["You are a helpful assistant.", "Answer briefly.", "You are Peregrine's demo model."])})
        out.append(s)
    return out


def heldout(seed: int, per_family: int) -> dict:
    """per_family samples of each evaluated family, from a seed the training set never uses and with
    the reserved words, names and cities."""
    global WORDS, NAMES, CITIES
    rng = random.Random(seed)
    saved = WORDS, NAMES, CITIES
    WORDS, NAMES, CITIES = HELDOUT_WORDS, HELDOUT_NAMES, HELDOUT_CITIES
    try:
        return _heldout(rng, per_family)
    finally:
        WORDS, NAMES, CITIES = saved


def _heldout(rng, per_family):
    fams = {"arith_add_3digit": gen_add3, "convert": gen_convert, "string": gen_string, "count": gen_count,
            "python": gen_python, "tool_call": gen_tool, "arith": gen_arith}
    return {name: [g(rng) for _ in range(per_family)] for name, g in fams.items()}


def stdlib_code(max_bytes: int) -> List[str]:
    """Source files of the Python standard library on this machine (never committed)."""
    root = sysconfig.get_paths()["stdlib"]
    texts, total = [], 0
    for dirpath, dirnames, files in sorted(os.walk(root)):
        dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "site-packages", "idlelib", "lib2to3", "turtledemo"))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            try:
                t = open(os.path.join(dirpath, f), encoding="utf-8").read()
            except Exception:
                continue
            if 200 < len(t) < 60000:
                texts.append(t)
                total += len(t)
                if total >= max_bytes:
                    return texts
    return texts


if __name__ == "__main__":
    for s in make_samples(1, 8):
        print(s.family, json.dumps(s.messages)[:300])
    ho = heldout(2, 3)
    for fam, ss in ho.items():
        s = ss[0]
        ref = s.messages[1]
        c = ref.get("content", "")
        if s.family == "tool_call":
            c = "<tool_call>\n" + json.dumps({"name": ref["tool_calls"][0]["function"]["name"],
                                              "arguments": ref["tool_calls"][0]["function"]["arguments"]}) + "\n</tool_call>"
        print(fam, "self-check:", s.check(c, ref.get("reasoning_content", "")))
    print("stdlib bytes:", sum(map(len, stdlib_code(2_000_000))))
