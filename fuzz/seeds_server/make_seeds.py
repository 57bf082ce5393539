# Regenerates fuzz/seeds_server/corpus (fuzz_server_request seeds): request bodies taken from
# tests/server/test_requests.cpp and tests/e2e/*.mjs, each prefixed by its route digit (see
# fuzz/fuzz_server_request.cpp). Usage: /usr/bin/python3 fuzz/seeds_server/make_seeds.py fuzz/seeds_server/corpus
# (crash reproducers kept in the corpus, such as 9-crash-number-overflow, are not generated).
import json, os, sys, hashlib
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
CHAT, COMPL, RESP, MSGS, COUNT, TOK, DETOK, APPLY = '01234567'
story = [{"role": "user", "content": "Tell me a story about a cat."}]
weather = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
history = story + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21\u00b0C"}]
user = [{"role": "user", "content": "hi"}]
atool = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
seeds = [
  (CHAT, {"model": "x", "messages": story, "max_tokens": 12, "temperature": 0, "logit_bias": {"2": -100}}),
  (CHAT, {"model": "x", "messages": story, "max_tokens": 24, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}),
  (CHAT, {"model": "x", "messages": story, "max_tokens": 60, "stop": ["NEVER", "cat"]}),
  (CHAT, {"model": "x", "messages": story, "max_tokens": 6, "logprobs": True, "top_logprobs": 3}),
  (CHAT, {"model": "x", "messages": story, "max_tokens": 16, "temperature": 1.0, "top_k": 0, "top_p": 1, "seed": 42, "min_p": 0.1, "typical_p": 0.9,
          "presence_penalty": 0.5, "frequency_penalty": -0.5, "repeat_penalty": 1.1, "repeat_last_n": 64, "ignore_eos": True}),
  (CHAT, {"model": "x", "messages": story, "max_tokens": 1, "tools": [weather], "tool_choice": "auto"}),
  (CHAT, {"model": "x", "messages": story, "max_tokens": 1, "tools": [weather], "tool_choice": "none"}),
  (CHAT, {"model": "x", "messages": history, "tools": [weather], "max_tokens": 4}),
  (CHAT, {"model": "x", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [weather],
          "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 12}),
  (CHAT, {"messages": user, "tools": [weather], "tool_choice": "required", "parallel_tool_calls": False}),
  (CHAT, {"model": "m", "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "system", "content": "second system"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, "bare"]},
      {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}], "reasoning_content": "hmm", "name": "bot",
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "42"}], "name": "f"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}, {"type": "web_search"}],
    "stop": "END", "max_completion_tokens": 7, "temperature": 0.5, "seed": 3, "user": "u", "some_new_field": 1,
    "logprobs": True, "top_logprobs": 2, "stream": True, "stream_options": {"include_usage": True},
    "response_format": {"type": "text"}, "modalities": ["text"], "n": 1,
    "chat_template_kwargs": {"enable_thinking": False, "custom": [1, 2]}, "reasoning_effort": "none"}),
  (CHAT, {"messages": user, "max_tokens": -1}),
  (CHAT, {"messages": user, "max_tokens": 1e300}),
  (CHAT, {"messages": user, "temperature": "hot"}),
  (CHAT, {"messages": user, "n": 3}),
  (CHAT, {"messages": user, "logit_bias": {"abc": 3}}),
  (CHAT, {"messages": user, "logit_bias": {"100000": 3}}),
  (CHAT, {"messages": user, "max_tokens": 100000}),
  (CHAT, {"messages": [{"role": "user", "content": "Once upon a time there was a little cat. " * 80}]}),
  (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]}),
  (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}),
  (CHAT, {"messages": user, "functions": [], "function_call": "auto"}),
  (CHAT, {"messages": user, "response_format": {"type": "json_schema", "json_schema": {}}}),
  # Structured output and reasoning budgets (server/structured.cpp).
  (CHAT, {"messages": user, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": {
      "type": "object", "properties": {"a": {"type": "integer", "minimum": 1}, "b": {"enum": ["x", 1, None]}}, "required": ["a"]}}}}),
  (CHAT, {"messages": user, "grammar": "root ::= (\"a\" | [0-9]{1,3})+ x\nx ::= [^\"]*"}),
  (CHAT, {"messages": user, "json_schema": {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"}}),
  (CHAT, {"messages": user, "tools": [dict(weather, function=dict(weather["function"], strict=True))], "tool_choice": "required", "reasoning_budget_tokens": 3}),
  (RESP, {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "pattern": "^a+$"}}}, "reasoning": {"effort": "low"}}),
  (MSGS, {"model": "m", "max_tokens": 5, "messages": user, "output_format": {"type": "json_schema", "schema": {"type": "boolean"}},
          "thinking": {"type": "enabled", "budget_tokens": 1}}),
  (COMPL, {"prompt": "x", "grammar": "root ::= \"1\"", "max_tokens": 2}),
  # Lazy grammars (grammar_lazy / grammar_triggers / preserved_tokens) and strict tools under "auto".
  (COMPL, {"prompt": "x", "grammar": "root ::= \"ab\" [0-9]*", "grammar_lazy": True, "max_tokens": 6,
           "grammar_triggers": [{"type": "word", "value": "ab"}, {"type": "pattern", "value": "[\\s\\S]*?(a(b|c)+?)"},
                                {"type": "pattern_full", "value": "\\s*(\\{)[\\s\\S]*"}, {"type": "token", "value": 5}, {"type": 2, "value": "^x{2,3}$"}],
           "preserved_tokens": ["<tool_call>"]}),
  (CHAT, {"messages": user, "json_schema": {"type": "object"}, "grammar_lazy": True, "grammar_triggers": [{"type": "token", "value": "<tool_call>"}, {"word": "{"}]}),
  (CHAT, {"messages": user, "grammar": "root ::= \"a\"", "grammar_lazy": True, "grammar_triggers": [{"type": "pattern", "value": "(?=a)(b"}]}),
  (CHAT, {"messages": user, "grammar": "root ::= \"a\"", "grammar_lazy": True, "grammar_triggers": [{"type": "token", "value": 99999999}]}),
  (CHAT, {"messages": user, "tools": [dict(weather, function=dict(weather["function"], strict=True))], "tool_choice": "auto", "parallel_tool_calls": False}),
  (CHAT, {"messages": [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, {"role": "system", "content": "c"}, {"role": "user", "content": "d"}]}),
  (COMPL, {"model": "x", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "logit_bias": {"2": -100}}),
  (COMPL, {"model": "x", "prompt": [1, 2, 3, 4], "max_tokens": 10, "echo": True, "logprobs": 2}),
  (COMPL, {"prompt": [[4, 5]], "stream": True, "stream_options": {"include_usage": True}}),
  (COMPL, {"prompt": ["a"], "stop": ["x", "y"], "n": 1, "best_of": 1}),
  (COMPL, {"prompt": ["a", "b"]}),
  (COMPL, {"prompt": [1, -2]}),
  (COMPL, {"prompt": [1, 99999]}),
  (COMPL, {"prompt": "a", "suffix": "b"}),
  (COMPL, {"prompt": "<|im_start|>user\nhi<|im_end|>", "max_tokens": 3000}),
  (RESP, {"model": "x", "instructions": "Be nice.", "input": "Tell me a story.", "max_output_tokens": 8, "temperature": 0}),
  (RESP, {"model": "x", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}], "max_output_tokens": 12, "stream": True}),
  (RESP, {"model": "x", "input": "Weather in Paris?", "max_output_tokens": 12,
          "tools": [{"type": "function", "name": "get_weather", "parameters": weather["function"]["parameters"]}, {"type": "web_search"}],
          "tool_choice": {"type": "function", "name": "get_weather"}}),
  (RESP, {"model": "x", "max_output_tokens": 4, "tools": [{"type": "function", "name": "get_weather"}],
          "input": [{"role": "user", "content": "Weather in Paris?"},
                    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}], "content": [{"type": "reasoning_text", "text": "deep"}]},
                    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                    {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                    {"type": "custom_tool_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "ok"}]},
                    {"type": "web_search_call", "id": "ws_1"},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
                    {"type": "message", "role": "developer", "content": "dev"}],
          "reasoning": {"effort": "high", "summary": "auto"}, "text": {"format": {"type": "text"}}, "store": False,
          "include": ["reasoning.encrypted_content"], "parallel_tool_calls": True, "tool_choice": "auto",
          "prompt_cache_key": "k", "chat_template_kwargs": {"enable_thinking": True}}),
  (RESP, {"input": "x", "previous_response_id": "resp_1"}),
  (RESP, {"input": [{"type": "message", "role": "robot", "content": "x"}]}),
  (RESP, {"input": [{"type": "function_call_output", "call_id": "c", "output": {"structured": [1, 2]}}]}),
  (RESP, {"input": [{"type": "item_reference", "id": "x"}]}),
  (RESP, {"input": "x", "max_output_tokens": -1}),
  (MSGS, {"model": "claude-x", "max_tokens": 10, "temperature": 0, "system": "You tell stories.", "messages": [{"role": "user", "content": "Tell me a story about a dog."}]}),
  (MSGS, {"model": "claude-x", "max_tokens": 16, "stream": True, "stop_sequences": ["dog"], "top_k": 5, "top_p": 0.9, "messages": [{"role": "user", "content": "Tell me"}]}),
  (MSGS, {"model": "claude-x", "max_tokens": 5,
          "system": [{"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}}],
          "tools": [atool, {"type": "web_search_20250305", "name": "web_search"}, {"name": "later", "defer_loading": True, "input_schema": {}}],
          "messages": [{"role": "user", "content": "Weather in Paris?"},
                       {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "redacted_thinking", "data": "x"},
                                                         {"type": "text", "text": "Let me check."}, {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"}, {"type": "text", "text": "And tomorrow?"}]},
                       {"role": "system", "content": "late system"}]}),
  (MSGS, {"model": "claude-x", "max_tokens": 12, "tools": [atool], "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
          "messages": [{"role": "user", "content": "Weather in Paris?"}]}),
  (MSGS, {"model": "claude-x", "max_tokens": 12, "tools": [atool], "tool_choice": {"type": "any"}, "messages": user,
          "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}, "output_config": {"effort": "low"},
          "metadata": {"user_id": "u"}, "chat_template_kwargs": {"x": 1}}),
  (MSGS, {"model": "m", "messages": user}),
  (MSGS, {"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "only a system turn"}]}),
  (MSGS, {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
  (MSGS, {"model": "m", "max_tokens": 4, "messages": user, "tools": [{"name": "f"}]}),
  (MSGS, {"model": "m", "max_tokens": 4, "messages": user, "tool_choice": {"type": "tool", "name": "nope"}}),
  (MSGS, {"model": "m", "max_tokens": 100000, "messages": user}),
  (COUNT, {"model": "claude-x", "system": "You tell stories.", "messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "disabled"}}),
  (COUNT, {"messages": "x"}),
  (TOK, {"content": "Once upon a time"}),
  (TOK, {"content": "Once upon a time", "add_special": True}),
  (TOK, {"content": "<|im_start|>Once upon", "with_pieces": True, "parse_special": False}),
  (TOK, {"content": 5}),
  (DETOK, {"tokens": [1, 2, 300, 1000]}),
  (DETOK, {"tokens": [1, -2]}),
  (DETOK, {"tokens": [1, 100000]}),
  (APPLY, {"messages": story, "tools": [weather]}),
  (APPLY, {"messages": history, "tools": [weather]}),
]
raw = [(CHAT, '{"messages": ['), (CHAT, '[1,2,3]'), (CHAT, ''), (MSGS, '{bad json'), (CHAT, '{"messages":[{"role":"user","content":"\\u00e9\\ud83d\\ude00"}]}')]
# At the limits of parse_body / template_arguments (nesting, numbers beyond double's range).
deep = '[' * 130 + ']' * 130
raw += [(CHAT, '{"messages":[{"role":"user","content":"hi"}],"x":' + deep + '}'),
        (CHAT, '{"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":' +
         json.dumps('{"a":' + deep + '}') + '}}]}]}'),
        (RESP, '{"input":"x","temperature":1e400}')]
for route, body in seeds + raw:
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    data = (route + text).encode()
    name = route + '-' + hashlib.sha1(data).hexdigest()[:12]
    open(os.path.join(out, name), 'wb').write(data)
print(len(seeds) + len(raw), 'seeds')
