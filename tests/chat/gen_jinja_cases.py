#!/usr/bin/python3
"""Writes jinja_cases.json: small templates with the output (or the exception type) that Python's
jinja2, configured like transformers' apply_chat_template, produces for them. test_jinja checks
the C++ engine against this file, so the unit tests need no Python at run time; re-run this
script (with Debian's python3-jinja2) after adding cases:

    /usr/bin/python3 tests/chat/gen_jinja_cases.py > tests/chat/jinja_cases.json
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datetime import datetime  # noqa: E402

from render_jinja2 import make_env  # noqa: E402

NOW = "2025-03-07T14:05:09.123456"

V = {
    "xs": [3, 1, 2],
    "words": ["banana", "Apple", "cherry", "apple"],
    "d": {"b": 2, "a": 1, "items": "key-named-items"},
    "s": "Hello, World",
    "u": "héllo wörld ß ǅ Σ 你好 🚀",
    "n": None,
    "t": True,
    "f": 1.5,
    "i": 7,
    "neg": -7,
    "big": 12345678901234,
    "empty": "",
    "el": [],
    "ed": {},
    "msgs": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi", "tags": ["a", "b"]},
        {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "user", "content": "bye"},
    ],
    "nested": {"a": {"b": [10, {"c": "deep"}]}},
    "people": [{"name": "bo", "age": 30, "city": "Oslo"}, {"name": "al", "age": 25, "city": "Bonn"},
               {"name": "cy", "age": 30, "city": "oslo"}, {"name": "di"}],
    "html": "<b>\"x\" & 'y'</b>",
    "multiline": "line one\nline two\n\nline four",
    "numstr": " 42 ",
    "fstr": "3.75",
}

CASES = []


def c(name, template, vars=None):
    CASES.append((name, template, V if vars is None else vars))


# --- output and Python str() of values ------------------------------------------------------------
c("print_scalars", "{{ 1 }}|{{ 1.0 }}|{{ -0.0 }}|{{ 1e16 }}|{{ 1.5e-7 }}|{{ 0.1 + 0.2 }}|{{ true }}|{{ none }}|{{ 'x' }}")
c("print_floats", "{{ 1/3 }}|{{ 2/3 }}|{{ 10/4 }}|{{ 1e15 }}|{{ 123456789.123 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 1e300*1e10 }}")
c("print_list_repr", "{{ [1, 'a', none, true, 1.5, {'k': 'v'}, ('t',), (), [[]]] }}")
c("print_quotes_repr", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'back\\\\slash', 'tab\\tnl\\n'] }}")
c("print_unicode_repr", "{{ ['é', '你好', '🚀', '\\x00\\x7f\\x85\\xa0\\u2028\\u200b', 'ǅ'] }}")
c("print_dict_repr", "{{ d }}|{{ nested }}|{{ msgs[1] }}")
c("print_undefined", "[{{ nothing }}][{{ nothing.__class__ if false }}][{{ d.missing }}][{{ xs[10] }}][{{ n.attr }}]")
c("print_dict_views", "{{ d.items() }}|{{ d.keys() }}|{{ d.values() }}|{{ range(3) }}|{{ range(1, 10, 3) }}")
c("print_markup", "{{ 'a<b'|safe }}|{{ ['a<b'|safe] }}|{{ html|e }}|{{ (html|e)|length }}")
c("print_big_int", "{{ big * 1000 }}|{{ 2 ** 62 }}|{{ -big }}")
c("print_namespace", "{% set ns = namespace(a=1, b='x') %}{{ ns.a }}{{ ns.b }}{{ ns.missing }}")

# --- literals ------------------------------------------------------------------------------------
c("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f\\x41\\u00e9\\U0001F600\\101\\q' }}")
c("string_concat_adjacent", "{{ 'a' 'b' \"c\" }}")
c("numbers", "{{ 0x1F }}|{{ 0o17 }}|{{ 0b101 }}|{{ 1_000 }}|{{ 1.5e3 }}")
c("tuples_lists_dicts", "{{ (1,) }}{{ (1, 2) }}{{ [1, 2,] }}{{ {'a': 1, 'b': [2]} }}{{ {1: 'i', 1.0: 'f', true: 'b'} }}")
c("err_dict_unhashable_key", "{{ {[1]: 2} }}")
c("none_spellings", "{{ none }}{{ None }}{{ true }}{{ True }}{{ false }}{{ False }}")

# --- arithmetic ----------------------------------------------------------------------------------
c("arith_int", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 // -2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}")
c("arith_float", "{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 2.0 ** 0.5 }} {{ 1 + true }} {{ true + true }}")
c("arith_precedence", "{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 2 * 3 ~ 4 }} {{ 1 ~ 2 + 3 ~ 4 }}")
c("unary", "{{ -i }} {{ +i }} {{ -f }} {{ - -3 }} {{ -xs[0] }} {{ -3|abs }} {{ not true }} {{ not 0 }}")
c("str_mul", "{{ 'ab' * 3 }}|{{ 3 * 'ab' }}|{{ 'ab' * 0 }}|{{ 'ab' * -1 }}|{{ [1, 2] * 2 }}|{{ 'x' * true }}")
c("str_add", "{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ (1,) + (2,) }}")
c("err_str_plus_int", "{{ 'a' + 1 }}")
c("err_int_plus_str", "{{ 1 + 'a' }}")
c("err_list_plus_tuple", "{{ [1] + (2,) }}")
c("err_div_zero", "{{ 1 / 0 }}")
c("err_floordiv_zero", "{{ 1 // 0 }}")
c("err_mod_zero", "{{ 1 % 0 }}")
c("err_float_div_zero", "{{ 1.5 / 0.0 }}")
c("err_undefined_add", "{{ nothing + 1 }}")
c("err_none_add", "{{ n + 1 }}")
c("err_neg_str", "{{ -'a' }}")
c("err_str_mul_float", "{{ 'a' * 1.5 }}")
c("err_sub_str", "{{ 'a' - 'b' }}")

# --- comparisons and logic -----------------------------------------------------------------------
c("compare", "{{ 1 < 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 1 == true }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ (1, 2) == [1, 2] }} {{ none == none }} {{ nothing == nothing }} {{ 2 >= 2 }} {{ 2 <= 1 }} {{ 'a' != 'a' }}")
c("compare_unicode", "{{ 'é' > 'z' }} {{ 'B' < 'a' }} {{ [1, 'a'] == [1, 'a'] }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }}")
c("err_compare_types", "{{ 1 < 'a' }}")
c("err_compare_none", "{{ none < none }}")
c("err_compare_undefined", "{{ nothing < 1 }}")
c("in_operator", "{{ 'a' in 'cat' }} {{ 'x' not in 'cat' }} {{ 2 in xs }} {{ 'a' in d }} {{ 'z' in d }} {{ 'x' in nothing }} {{ 1 in [1.0] }} {{ (1, 2) in [(1, 2)] }} {{ 'rol' in msgs[0] }}")
c("err_in_int_str", "{{ 1 in 'abc' }}")
c("err_in_none", "{{ 'a' in n }}")
c("err_in_unhashable", "{{ [1] in d }}")
c("and_or_values", "{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ '' and 'z' }}|{{ none or [] }}|{{ [] or {} or 0 }}|{{ 'a' and 'b' or 'c' }}|{{ nothing or 'def' }}")
c("truthiness", "{% for v in [0, 1, 0.0, '', ' ', [], [0], {}, none, true, false, nothing] %}{{ 'T' if v else 'F' }}{% endfor %}")
c("condexpr", "{{ 'y' if t else 'n' }}|{{ 'y' if n else 'n' }}|{{ 'a' if false else 'b' if false else 'c' }}|[{{ 'x' if false }}]|{{ ('x' if false) is defined }}")

# --- whitespace control --------------------------------------------------------------------------
c("ws_trim_blocks", "a\n{% if true %}\nb\n{% endif %}\nc\n")
c("ws_lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc")
c("ws_minus", "a   {%- if true -%}   b   {%- endif -%}   c")
c("ws_var_minus", "a   {{- 'x' -}}   b\n  {{ 'y' }}  \n")
c("ws_plus", "a\n    {%+ if true %}b{% endif +%}\nc")
c("ws_comment", "a\n  {# comment #}\nb {#- c2 -#} c\n{# c3 +#}\nd")
c("ws_multiline_comment", "x{# line1\nline2 #}y\n  {#- x\n -#}\n z")
c("ws_lstrip_not_var", "  {{ 'v' }}\n  {% if true %}k{% endif %}")
c("ws_tabs", "\t\t{% if true %}\n\tx\n\t{% endif %}\n")
c("ws_trailing_newline", "a\n\n")
c("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n")
c("ws_raw", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|  {%- raw -%}  x  {%- endraw -%}  |")
c("ws_mixed_minus_newlines", "{%- set x = 1 -%}\n\n  {{ x }}\n\n{%- if x %}\n  yes\n{%- endif %}\n")
c("ws_inline_block_mid_line", "text {% if true %}\ninner\n{% endif %} tail")
c("ws_unicode_space", "a\u00a0\u3000{%- if true %}b{% endif %}")
c("ws_line_starting_lstrip", "{% set x = 1 %}   {% if true %}A{% endif %}")

# --- statements ----------------------------------------------------------------------------------
c("if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %},{% endfor %}")
c("for_loop_vars", "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}/{% endfor %}")
c("for_prev_next", "{% for x in xs %}[{{ loop.previtem }}|{{ x }}|{{ loop.nextitem }}|{{ loop.previtem is defined }}]{% endfor %}")
c("for_cycle_changed", "{% for x in [1, 1, 2, 2, 3] %}{{ loop.cycle('a', 'b', 'c') }}{{ loop.changed(x) }} {% endfor %}")
c("for_else", "{% for x in el %}{{ x }}{% else %}empty{% endfor %}|{% for x in xs %}{{ x }}{% else %}no{% endfor %}")
c("for_filter", "{% for x in xs if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }}:{{ loop.last }} {% endfor %}")
c("for_filter_else", "{% for x in xs if x > 10 %}{{ x }}{% else %}none>10{% endfor %}")
c("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, (b, c) in [(1, (2, 3))] %}{{ a }}{{ b }}{{ c }}{% endfor %}")
c("for_dict_keys", "{% for k in d %}{{ k }},{% endfor %}")
c("for_string", "{% for ch in 'héllo' %}{{ ch }}.{% endfor %}")
c("for_undefined", "{% for x in nothing %}{{ x }}{% else %}u{% endfor %}")
c("err_for_none", "{% for x in n %}{{ x }}{% endfor %}")
c("err_for_int", "{% for x in 5 %}{% endfor %}")
c("err_unpack_count", "{% for a, b in [[1, 2, 3]] %}{% endfor %}")
c("for_nested_loop", "{% for a in [1, 2] %}{% for b in [1, 2] %}{{ loop.index }}{{ a }}{% endfor %}{{ loop.index }};{% endfor %}")
c("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}")
c("for_break_else_quirk", "{% for x in [1] %}{% break %}{% else %}E{% endfor %}|{% for x in [1, 2] %}{% continue %}{% else %}E2{% endfor %}|{% for x in [1, 2] %}{% if x == 2 %}{% break %}{% endif %}{% else %}E3{% endfor %}")
c("for_scope", "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }}|{% endfor %}{{ x }}")
c("for_scope_if", "{% for i in xs %}{% if i == 1 %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}[{{ y }}]")
c("for_recursive", "{% for item in [{'n': 'a', 'c': [{'n': 'b', 'c': [{'n': 'c', 'c': []}]}]}, {'n': 'd', 'c': []}] recursive %}{{ item.n }}{{ loop.depth }}{% if item.c %}({{ loop(item.c) }}){% endif %}{% endfor %}")
c("for_loop_length_generator", "{% for x in xs|select('odd') %}{{ x }}/{{ loop.length }}/{{ loop.revindex }} {% endfor %}")
c("for_iter_mutation_pop", "{% set l = [1, 2, 3, 4] %}{% for x in l %}{{ x }}{{ l.pop() }};{% endfor %}{{ l }}")
c("set_basic", "{% set a = 1 %}{% set b, c = 2, 3 %}{% set t = 4, 5 %}{{ a }}{{ b }}{{ c }}{{ t }}")
c("set_block", "{% set x %}  inner {{ 1 + 1 }}\n{% endset %}[{{ x }}]{% set y | upper | trim %}  yo  {% endset %}[{{ y }}]")
c("set_if_toplevel", "{% if true %}{% set z = 3 %}{% endif %}{{ z }}")
c("namespace_assign", "{% set ns = namespace(count=0, items=[]) %}{% for x in xs %}{% set ns.count = ns.count + x %}{% set ns.items = ns.items + [x] %}{% endfor %}{{ ns.count }}{{ ns.items }}")
c("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns['a'] }}")
c("err_ns_assign_non_namespace", "{% set d2 = {} %}{% set d2.x = 1 %}")
c("err_ns_private_attr", "{% set ns = namespace(_p=1) %}{{ ns._p + 1 }}")
c("with_block", "{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}")
c("filter_block", "{% filter upper %}hello {{ 'world' }}{% endfilter %}|{% filter replace('a', 'o') | trim %}  banana  {% endfilter %}")
c("macro_basic", "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }}|{{ greet('Al', 'Hi') }}|{{ greet(greeting='Yo', name='Cy') }}|{{ greet() }}")
c("macro_closure_late", "{% macro m() %}{{ q }}{% endmacro %}{% set q = 1 %}{{ m() }}{% set q = 2 %}{{ m() }}")
c("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}")
c("macro_default_refs_arg", "{% macro m(a, b=a * 2) %}{{ a }}-{{ b }}{% endmacro %}{{ m(3) }}")
c("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1)|int) }}{% endif %}{% endmacro %}{{ fact(10) }}")
c("macro_caller", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inside {{ 1 + 2 }}{% endcall %}")
c("macro_caller_args", "{% macro each(items) %}{% for i in items %}{{ caller(i, loop.index) }}{% endfor %}{% endmacro %}{% call(x, n) each(['a', 'b']) %}{{ n }}={{ x }};{% endcall %}")
c("macro_scope_isolated", "{% set v = 'outer' %}{% macro m() %}{% set v = 'inner' %}{{ v }}{% endmacro %}{{ m() }}{{ v }}")
c("macro_returns_string", "{% macro m() %}42{% endmacro %}{{ m() + '1' }}|{{ m() is string }}")
c("err_macro_too_many", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}")
c("err_macro_bad_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}")
c("err_macro_infinite", "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}")
c("err_raise_exception", "{{ raise_exception('Custom failure: ' ~ 42) }}")
c("raise_in_branch", "{% if msgs[0].role != 'system' %}{{ raise_exception('no system') }}{% endif %}ok")
c("strftime_now", "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %b %d %B %A %j %y %I %p %f [%Z] [%z] %%') }}")
c("strftime_now_glibc_flags", "{{ strftime_now('%-d %-m %e') }}")
c("generation_tag", "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% set inner = 1 %}{% endgeneration %}{% endif %}{% endfor %}[{{ inner }}]")
c("print_stmt", "{% print 'a', 1 + 1 %}")
c("block_tag", "{% block body %}B{{ s }}{% endblock %}")

# --- attribute and item access -------------------------------------------------------------------
c("getattr_dict", "{{ msgs[0].role }}|{{ msgs[0]['content'] }}|{{ nested.a.b[1].c }}|{{ nested['a']['b'][0] }}|{{ xs.0 }}|{{ xs[-1] }}")
c("getattr_dict_method_shadow", "{{ d.items is callable }}|{{ d['items'] }}|{{ d.get('a') }}|{{ d.get('zz', 'def') }}|{{ d.get('zz') }}")
c("getitem_method_fallback", "{{ {'x': 1}['items'] is callable }}|{{ s['upper']() }}|{{ xs['count'](1) }}")
c("getitem_string", "{{ s[0] }}{{ s[-1] }}|[{{ s[100] }}]|{{ u[1] }}{{ u[-1] }}")
c("slicing", "{{ xs[1:] }}{{ xs[:1] }}{{ xs[::-1] }}{{ xs[::2] }}{{ s[::-1] }}{{ s[2:5] }}{{ s[-5:] }}{{ u[::-1] }}{{ u[3:8] }}{{ xs[5:10] }}{{ s[-100:2] }}")
c("slicing_tuple", "{{ (1, 2, 3)[1:] }}{{ 'abc'[1:][0] }}")
c("err_slice_step_zero", "{{ xs[::0] }}")
c("err_slice_dict", "{{ d[1:] }}")
c("err_slice_undefined", "{{ nothing[1:] }}")
c("err_slice_float", "{{ xs[1.5:] }}")
c("err_attr_of_undefined", "{{ nothing.attr }}")
c("err_item_of_undefined", "{{ nothing['x'] }}")
c("err_attr_chain_missing", "{{ d.missing.deeper }}")
c("none_attr_is_undefined", "[{{ n.x }}][{{ n['x'] }}][{{ n.x is defined }}]")
c("err_call_undefined", "{{ nothing() }}")
c("err_call_string", "{{ s() }}")
c("sandbox_dunder", "[{{ s.__class__ }}][{{ d.__class__ is defined }}]")
c("err_sandbox_dunder_call", "{{ s.__class__() }}")
c("err_sandbox_append", "{% set l = [] %}{{ l.append(1) }}")
c("sandbox_append_printed", "{% set l = [] %}[{{ l.append }}]")
c("err_sandbox_dict_update", "{{ d.update({'x': 1}) }}")
c("sandbox_list_pop_allowed", "{% set l = [1, 2, 3] %}{{ l.pop() }}{{ l.pop(0) }}{{ l }}")

# --- string methods ------------------------------------------------------------------------------
c("str_case", "{{ s.upper() }}|{{ s.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'hello WORLD'.capitalize() }}|{{ s.swapcase() }}|{{ u.upper() }}|{{ u.title() }}|{{ 'ΣΑΣ'.lower() }}")
c("str_strip", "[{{ '  x  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\u3000x\u00a0'.strip() }}][{{ 'abcba'.strip('ab') }}]")
c("str_split", "{{ 'a,b,,c'.split(',') }}{{ '  a  b c '.split() }}{{ 'a b c'.split(' ', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ '  a  b  '.rsplit(None, 1) }}{{ ''.split() }}{{ ''.split(',') }}{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'x'.split(sep='x') }}")
c("err_split_empty_sep", "{{ 'abc'.split('') }}")
c("str_find", "{{ s.find('o') }}{{ s.rfind('o') }}{{ s.find('zz') }}{{ s.count('l') }}{{ u.find('wö') }}{{ s.index('W') }}{{ s.find('o', 5) }}{{ s.startswith('He') }}{{ s.endswith(('x', 'ld')) }}{{ s.startswith('World', 7) }}")
c("err_str_index_missing", "{{ s.index('zzz') }}")
c("str_replace", "{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 2) }}|{{ 'ab'.replace('', '-') }}")
c("str_join_format", "{{ '-'.join(['a', 'b']) }}|{{ ', '.join(words) }}|{{ '{} {}!'.format('Hi', 'you') }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name}:{n:03d}'.format(name='x', n=7) }}|{{ '{:>6}|{:<6}|{:^7}|{:.2f}|{:+d}|{:,}'.format('r', 'l', 'c', 3.14159, 5, 1234567) }}")
c("str_format_field_access", "{{ '{0[role]} {0.content} {1[0]}'.format(msgs[0], xs) }}")
c("err_join_int", "{{ '-'.join([1, 2]) }}")
c("str_predicates", "{{ 'abc'.isalpha() }}{{ '123'.isdigit() }}{{ 'a1'.isalnum() }}{{ '  '.isspace() }}{{ 'ABC'.isupper() }}{{ 'abc'.islower() }}{{ 'Ab Cd'.istitle() }}{{ ''.isalpha() }}{{ '²'.isdigit() }}{{ '²'.isdecimal() }}")
c("str_misc", "{{ 'ab'.center(6, '*') }}{{ 'ab'.ljust(4, '.') }}{{ 'ab'.rjust(4) }}{{ '42'.zfill(5) }}{{ '-4'.zfill(4) }}{{ 'a=b=c'.partition('=') }}{{ 'a=b=c'.rpartition('=') }}{{ 'prefix-x'.removeprefix('prefix-') }}")
c("percent_format", "{{ '%s-%d-%05.2f-%x-%r-%5s|%-5s|' % ('a', 3, 3.14159, 255, 'q', 'r', 'l') }}|{{ '%(a)s+%(b)s' % {'a': 1, 'b': 2} }}|{{ '%s' % [1, 2] }}|{{ '%%' % () }}|{{ '%e %g %G %o %X %#x %c %c' % (12345.678, 0.00001234, 1e20, 8, 255, 255, 65, 'z') }}")
c("err_percent_too_few", "{{ '%s %s' % ('a',) }}")
c("err_percent_too_many", "{{ '%s' % ('a', 'b') }}")
c("err_percent_bad_type", "{{ '%d' % 'x' }}")

# --- filters -------------------------------------------------------------------------------------
c("f_tojson", "{{ msgs[2]|tojson }}|{{ u|tojson }}|{{ [1.0, 1e16, none, true, 'a\"b\\\\c\\n\\u0001\\u007f'] | tojson }}|{{ {'k': {'n': []}, 'e': {}}|tojson }}")
c("f_tojson_indent", "{{ nested|tojson(indent=2) }}|{{ xs|tojson(indent=0) }}|{{ d|tojson(indent='\\t') }}|{{ [[], {}]|tojson(indent=2) }}")
c("f_tojson_options", "{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(sort_keys=true) }}|{{ u|tojson(ensure_ascii=true) }}|{{ {1: 'a', 2.5: 'b', none: 'c', true: 'd'}|tojson }}")
c("err_tojson_undefined", "{{ nothing|tojson }}")
c("err_tojson_namespace", "{{ namespace(a=1)|tojson }}")
c("f_trim_length", "[{{ '  a b  '|trim }}][{{ 'xxaxx'|trim('x') }}]{{ s|length }}{{ u|length }}{{ xs|count }}{{ d|length }}{{ nothing|length }}")
c("err_length_int", "{{ 5|length }}")
c("err_length_generator", "{{ xs|map('string')|length }}")
c("f_join", "{{ xs|join }}|{{ xs|join(', ') }}|{{ people|join(',', attribute='name') }}|{{ [1, none, nothing, 'a']|join('-') }}")
c("f_default", "{{ nothing|default('d') }}|{{ n|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ nothing|d }}|{{ 0|d('z', boolean=true) }}")
c("f_first_last", "{{ xs|first }}{{ xs|last }}{{ s|first }}{{ s|last }}{{ d|first }}{{ d|last }}[{{ el|first }}][{{ el|last }}]{{ (xs|select('odd'))|first }}")
c("err_last_generator", "{{ xs|select('odd')|last }}")
c("f_map", "{{ people|map(attribute='name')|list }}{{ people|map(attribute='age', default=0)|list }}{{ xs|map('string')|list }}{{ words|map('upper')|join(',') }}{{ msgs|selectattr('tool_calls', 'defined')|map(attribute='tool_calls.0.function.name')|list }}")
c("f_map_lazy_none", "{{ n|map('upper')|list }}{{ (xs|map('string')) is iterable }}")
c("err_map_no_args", "{{ xs|map|list }}")
c("f_select_reject", "{{ xs|select('odd')|list }}{{ xs|reject('odd')|list }}{{ [0, 1, '', 'a', none]|select|list }}{{ xs|select('greaterthan', 1)|list }}{{ xs|select('equalto', 2)|list }}{{ words|select('in', ['Apple', 'x'])|list }}")
c("f_selectattr", "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|{{ people|selectattr('age')|map(attribute='name')|list }}|{{ people[:3]|rejectattr('age', 'gt', 26)|map(attribute='name')|list }}|{{ msgs|selectattr('tool_calls', 'defined')|list|length }}")
c("generator_truthy_quirk", "{% set g = xs|select('greaterthan', 100) %}{% if g %}truthy{% endif %}|{{ g|list }}")
c("generator_consumed_once", "{% set g = xs|select('odd') %}{{ g|list }}{{ g|list }}")
c("err_select_unknown_test", "{{ xs|select('nosuchtest')|list }}")
c("f_unique", "{{ words|unique|list }}{{ words|unique(case_sensitive=true)|list }}{{ people|unique(attribute='age')|map(attribute='name')|list }}{{ [1, 1.0, true, 2]|unique|list }}")
c("f_list_string", "{{ 'abc'|list }}{{ d|list }}{{ nothing|list }}{{ 5|string }}{{ (5|string) is string }}{{ nothing|string }}[{{ none|string }}]")
c("err_list_none", "{{ n|list }}")
c("f_int_float", "{{ '42'|int }}{{ numstr|int }}{{ fstr|int }}{{ 'x'|int }}{{ 'x'|int(-1) }}{{ 3.99|int }}{{ -3.99|int }}{{ true|int }}{{ none|int }}{{ '0x1A'|int(0, 16) }}{{ '1_000'|int }}|{{ '2.5'|float }}{{ 'x'|float }}{{ 3|float }}{{ ' 1e3 '|float }}{{ 'inf'|float }}{{ 'nan'|float }}")
c("err_int_undefined", "{{ nothing|int }}")
c("f_abs_round", "{{ -3|abs }}{{ -2.5|abs }}|{{ 2.5|round }}{{ 3.5|round }}{{ 2.675|round(2) }}{{ 5|round }}{{ 1.25|round(1, 'floor') }}{{ 1.21|round(1, 'ceil') }}{{ -0.5|round }}{{ 1234|round(-2) }}{{ 0.125|round(2) }}")
c("f_case", "{{ 'hello world'|capitalize }}|{{ 'hello-world foo(bar) [x'|title }}|{{ \"they're bill's\"|title }}|{{ 'MiXeD'|lower }}|{{ 'MiXeD'|upper }}|{{ u|upper }}|{{ u|capitalize }}")
c("f_replace", "{{ s|replace('o', '0') }}|{{ s|replace('o', '0', 1) }}|{{ 5|replace('5', 'five') }}")
c("f_indent", "[{{ multiline|indent }}][{{ multiline|indent(2, true) }}][{{ multiline|indent('> ', first=true, blank=true) }}][{{ ''|indent }}][{{ 'x\\n'|indent }}]")
c("err_indent_undefined", "{{ nothing|indent }}")
c("f_items_dictsort", "{{ d|items|list }}{{ d|dictsort }}{{ d|dictsort(reverse=true) }}{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }}{{ {'b': 1, 'A': 2, 'a': 3}|dictsort(true) }}{{ {'x': 2, 'y': 1}|dictsort(by='value') }}{{ nothing|items|list }}")
c("err_items_list", "{{ xs|items|list }}")
c("err_dictsort_bad_by", "{{ d|dictsort(by='x') }}")
c("f_sort", "{{ xs|sort }}{{ xs|sort(reverse=true) }}{{ words|sort }}{{ words|sort(case_sensitive=true) }}{{ people[:3]|sort(attribute='age')|map(attribute='name')|list }}{{ people[:3]|sort(attribute='city,name')|map(attribute='name')|list }}")
c("err_sort_mixed", "{{ [1, 'a']|sort }}")
c("f_reverse", "{{ xs|reverse|list }}{{ s|reverse }}{{ (xs|reverse) is iterable }}{{ xs|select('odd')|reverse }}{{ d|reverse|list }}")
c("err_reverse_none", "{{ n|reverse }}")
c("f_batch_slice", "{{ range(7)|batch(3)|list }}{{ range(7)|batch(3, 'x')|list }}{{ range(7)|slice(3)|list }}{{ range(7)|slice(3, 0)|list }}")
c("f_wordcount_center", "{{ 'Hello, big world! x_y 42'|wordcount }}|{{ 'ab'|center(7) }}|{{ u|wordcount }}")
c("f_escape_safe", "{{ html|escape }}|{{ html|e|e }}|{{ html|safe }}|{{ html|forceescape }}|{{ (html|safe) + '<i>' }}|{{ '<i>' + (html|safe) }}|{{ html|safe ~ '<i>' }}|{{ none|e }}")
c("f_format", "{{ '%s=%d'|format('x', 3) }}|{{ '%(a)s'|format(a=5) }}|{{ '%.3f'|format(1/3) }}")
c("f_min_max_sum", "{{ xs|min }}{{ xs|max }}{{ words|min }}{{ words|max }}{{ people|max(attribute='age')|attr('name') if false else 'z' }}{{ xs|sum }}{{ people|sum(attribute='age', start=0) if false else 1 }}{{ [1.5, 2]|sum }}{{ [[1], [2]]|sum(start=[]) }}[{{ el|min }}]")
c("f_groupby", "{% for g in people[:3]|groupby('city') %}{{ g.grouper }}:{{ g.list|map(attribute='name')|join(',') }};{% endfor %}|{% for city, items in people|groupby('city', default='none') %}{{ city }}={{ items|length }};{% endfor %}")
c("f_truncate_striptags", "{{ 'The quick brown fox jumps over'|truncate(12) }}|{{ 'The quick brown fox jumps over'|truncate(12, true) }}|{{ 'short'|truncate(10) }}|{{ '<p>a  <b>b</b></p><!-- c -->  d &amp; e'|striptags }}")
c("f_urlencode_xmlattr", "{{ 'a b/c&d'|urlencode }}|{{ {'q': 'a b', 'n': 1}|urlencode }}|{{ {'class': 'x', 'id': none, 'data': '<&>'}|xmlattr }}")
c("f_filesizeformat", "{{ 1|filesizeformat }}{{ 1000|filesizeformat }}{{ 1234567|filesizeformat }}{{ 1234567|filesizeformat(true) }}{{ 500|filesizeformat }}")
c("f_attr", "{{ d|attr('items') is callable }}|{{ d|attr('a') is defined }}|{{ s|attr('upper')() }}")
c("f_chain_on_negative", "{{ -1|abs }} {{ (-1)|abs }} {{ -xs|length if false else 'x' }}")
c("err_unknown_filter", "{{ x|nosuchfilter }}")
c("unknown_filter_in_if_not_run", "{% if false %}{{ x|nosuchfilter }}{% endif %}ok")
c("err_unknown_filter_in_if_run", "{% if true %}{{ x|nosuchfilter }}{% endif %}")
c("err_unknown_filter_in_loop_in_if", "{% if false %}{% for x in xs %}{{ x|nosuchfilter }}{% endfor %}{% endif %}")
c("unknown_test_in_condexpr", "{{ 'a' if false else ((x is nosuchtest) if false else 'b') }}")
c("err_unknown_test", "{{ x is nosuchtest }}")

# --- tests ---------------------------------------------------------------------------------------
c("tests_types", "{% for v in [1, 1.5, true, 'a', [1], {'a': 1}, none, nothing, (1,), range(2)] %}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is boolean }}{{ v is string }}{{ v is sequence }}{{ v is mapping }}{{ v is iterable }}{{ v is none }}{{ v is defined }}{{ v is callable }};{% endfor %}")
c("tests_values", "{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'a' is in 'abc' }}{{ 2 is in xs }}")
c("tests_compare", "{{ 2 is eq 2 }}{{ 2 is equalto 3 }}{{ 2 is ne 3 }}{{ 3 is gt 2 }}{{ 3 is greaterthan 4 }}{{ 2 is ge 2 }}{{ 1 is lt 2 }}{{ 1 is lessthan 0 }}{{ 2 is le 2 }}")
c("tests_sameas_escaped", "{{ none is sameas none }}{{ true is sameas true }}{{ xs is sameas xs }}{{ [1] is sameas [1] }}{{ 5 is sameas 5 }}{{ (html|e) is escaped }}{{ html is escaped }}{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'odd' is test }}")
c("tests_callable", "{{ range is callable }}{{ d.get is callable }}{{ s.upper is callable }}{{ namespace is callable }}{{ 5 is callable }}{{ nothing is callable }}{{ loop is callable }}")
c("tests_not", "{{ x is not defined }}{{ n is not none }}{{ not xs is defined }}{{ 1 is not string }}")
c("err_odd_string", "{{ 'a' is odd }}")
c("err_odd_undefined", "{{ nothing is odd }}")

# --- globals -------------------------------------------------------------------------------------
c("range_global", "{{ range(5)|list }}{{ range(2, 8, 2)|list }}{{ range(5, 0, -2)|list }}{{ range(0)|list }}{{ range(3)|length }}")
c("err_range_too_big", "{{ range(100001)|length }}")
c("err_range_float", "{{ range(1.5) }}")
c("dict_global", "{{ dict(a=1, b=2) }}{{ dict([('x', 1)]) }}{{ dict(d, z=0) }}")
c("cycler_joiner", "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}{% set j = joiner('|') %}{% for x in xs %}{{ j() }}{{ x }}{% endfor %}")
c("override_global", "{% set range = 5 %}{{ range }}")

# --- syntax errors -------------------------------------------------------------------------------
c("err_syntax_unclosed_if", "{% if true %}x")
c("err_syntax_unknown_tag", "{% frobnicate %}")
c("err_syntax_do_tag", "{% do xs.append(1) %}")
c("err_syntax_endfor_mismatch", "{% for x in xs %}{% endif %}")
c("err_syntax_bad_expr", "{{ 1 + }}")
c("err_syntax_unclosed_var", "{{ x ")
c("err_syntax_unclosed_comment", "{# x ")
c("err_syntax_unbalanced", "{{ (1 }}")
c("err_syntax_break_outside", "{% break %}")
c("err_syntax_break_in_macro", "{% for x in xs %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}")
c("err_syntax_assign_loop", "{% for loop in xs %}{% endfor %}")
c("err_syntax_chained_is", "{{ x is defined is defined }}")
c("err_syntax_bad_char", "{{ x ! y }}")
c("err_syntax_unclosed_string", "{{ 'abc }}")
c("err_syntax_bad_escape", "{{ '\\x4' }}")
c("err_syntax_default_order", "{% macro m(a=1, b) %}{% endmacro %}")
c("err_syntax_include", "{% include 'other.jinja' %}")
c("lone_braces_are_text", "a { b } c {{ '{' }} } %} #} d")
c("comment_only", "{# just a comment #}")
c("err_syntax_empty_expression", "{{ }}")
c("err_map_attr_on_undefined", "{{ msgs|map(attribute='tool_calls.0.function.name')|list }}")
c("err_sort_attr_missing", "{{ people|sort(attribute='age') }}")

# --- jinja2 quirks found by differential fuzzing --------------------------------------------------
c("quirk_const_slice_folds_to_undefined", "[{{ 1[1:] }}][{{ 'x' ~ 42[::-1] }}][{{ 42[::-1] is defined }}][{{ {'k': 'v'}[::-1] }}]")
c("err_quirk_const_slice_not_folded_in_list", "{% set l = [1[::-1], 2] %}{{ l }}")
c("err_quirk_const_slice_then_arith", "{{ 7.5 % 2[::-1] }}")
c("err_quirk_tuple_subscript_with_slice", "{{ xs[1, :] }}")
c("quirk_str_mod_undefined", "{{ 'abc' % nothing }}|{{ 'abc' % [1] }}|{{ '%s' % nothing }}|{{ '%d' is odd }}|{{ '%s' is divisibleby 2 }}")
c("err_quirk_str_mod_unused_arg", "{{ 'abc' % 5 }}")
c("err_quirk_percent_flags_on_percent", "{{ '%5%' % () }}")
c("quirk_format_numbering", "{{ '{0[role]} {}'.format(msgs[0]) }}|{{ '{0[}]}'.format({'}': 5}) }}|{{ '{0[x]:>{1}}'.format({'x': 5}, 4) }}")
c("err_quirk_format_numbering_switch", "{{ '{0}{}'.format(1, 2) }}")
c("err_quirk_for_trailing_comma_target", "{% for a, in [[1], [2]] %}{{ a }}{% endfor %}")
c("quirk_comment_open_at_end", "a{{ 1 }}{#")
c("err_quirk_dict_of_undefined", "{{ dict(nothing) }}")
c("err_quirk_namespace_of_undefined", "{% set ns = namespace(nothing) %}")
c("quirk_int_filter_bad_base", "{{ '0x1A'|int(0, nothing) }}{{ 5|int(base=2) }}{{ 'z'|int(7, 36) }}")
c("err_quirk_round_ceil_undefined", "{{ nothing|round(1, 'ceil') }}")
c("err_quirk_round_undefined", "{{ nothing|round }}")
c("err_quirk_abs_undefined", "{{ nothing|abs }}")
c("err_quirk_slice_undefined_count", "{{ [1, 2]|slice(nothing)|list }}")
c("err_quirk_ns_assign_checked_first", "{% set ns.count = ns.count + 1 %}")
c("err_quirk_sort_reverse_not_int", "{{ xs|sort(reverse=nothing) }}")
c("quirk_loop_repr", "{% for x in xs if x > 1 %}{{ loop }}{% endfor %}")
c("quirk_undefined_dunder_attr", "[{{ nothing.__class__ }}][{{ s._s.__class__ is defined }}]")
c("err_quirk_repeated_kwarg", "{{ dict(a=1, a=2) }}")
c("quirk_self_ref_namespace_repr", "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}")

# --- realistic fragments -------------------------------------------------------------------------
c("chat_like", """{{- bos_token }}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {{- '<|system|>\\n' + message['content'] | trim + '\\n' }}
    {%- elif message.role == 'assistant' and message.tool_calls is defined %}
        {%- for tc in message.tool_calls %}
            {{- '<tool_call>' + tc.function | tojson + '</tool_call>' }}
        {%- endfor %}
    {%- else %}
        {{- '<|' + message.role + '|>\\n' + message.content + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}""",
  dict(V, messages=V["msgs"], bos_token="<s>", add_generation_prompt=True))
c("last_user_index", """{%- set ns = namespace(last=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}
{{- ns.last }}|{{ messages[::-1]|selectattr('role', 'eq', 'user')|first|attr('content') if false else (messages|selectattr('role', 'eq', 'user')|list|last).content }}""",
  dict(V, messages=V["msgs"]))


def main():
    env = make_env(datetime.fromisoformat(NOW))
    out = []
    for name, template, vars in CASES:
        entry = {"name": name, "template": template, "vars": vars}
        try:
            entry["expect"] = env.from_string(template).render(**vars)
        except Exception as e:  # noqa: BLE001
            entry["error"] = type(e).__name__
            entry["message"] = str(e)
        out.append(entry)
    json.dump({"now": NOW, "cases": out}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
