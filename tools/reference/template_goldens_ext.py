"""More chat-template goldens, made with transformers' apply_chat_template on the GPU
machine: every template in tests/fixtures/templates over conversations that the
shared goldens leave out (multi-turn and parallel tool calls, tool results,
reasoning in history, thinking on/off, content parts, unusual characters in
arguments, string arguments, an empty tool list, a trailing assistant turn).

usage: python3 template_goldens_ext.py TOKENIZER_DIR TEMPLATE_DIR OUT.json
"""
import json, os, sys

from transformers import AutoTokenizer

tok_dir, tpl_dir, out = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(tok_dir)

TOOLS = [
    {"type": "function", "function": {
        "name": "edit_file", "description": "Replace text in a file.\nUse exact matches.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "relative path"},
            "old": {"type": "string"}, "new": {"type": "string"},
            "count": {"type": "integer", "minimum": 1},
            "mode": {"type": "string", "enum": ["once", "all"]},
            "opts": {"type": "object", "properties": {"dry": {"type": "boolean"}}}},
            "required": ["path", "old", "new"]}}},
    {"type": "function", "function": {
        "name": "run", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"},
                                                        "timeout": {"type": "number"}},
                       "required": ["cmd"]}}},
]


def call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


WEIRD = {"path": "src/ünï \"quoted\".c", "old": "a\tb\n\\n{}", "new": "😀 </tool_call> <think>",
         "count": 3, "mode": "all", "opts": {"dry": True, "list": [1, 2.5, None, ""]}}
CONVS = [
    {"messages": [{"role": "system", "content": "You are a careful coding agent.\n\nBe brief."},
                  {"role": "user", "content": "Fix the bug in main.c"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "run tests"},
                  {"role": "assistant", "content": "I'll run them.", "tool_calls": [call("run", {"cmd": "make test"})]},
                  {"role": "tool", "content": "3 passed, 1 failed"},
                  {"role": "assistant", "content": "", "tool_calls": [call("run", {"cmd": "make test V=1", "timeout": 60.5})]},
                  {"role": "tool", "content": "FAIL: test_x"},
                  {"role": "assistant", "content": "test_x fails."},
                  {"role": "user", "content": "fix it"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "three things at once"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      call("run", {"cmd": "ls"}), call("run", {"cmd": "pwd"}),
                      call("edit_file", {"path": "a", "old": "x", "new": "y"})]},
                  {"role": "tool", "content": "a b"}, {"role": "tool", "content": "/w"},
                  {"role": "tool", "content": "ok"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4", "reasoning_content": "two plus two"},
                  {"role": "user", "content": "and 3+3?"}]},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "<think>\nsay hi\n</think>\n\nHello!"},
                  {"role": "user", "content": "again"}], "enable_thinking": False},
    {"messages": [{"role": "user", "content": "hi"}], "enable_thinking": True},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                               {"type": "text", "text": "part two"}]}]},
    {"messages": [{"role": "user", "content": "weird"},
                  {"role": "assistant", "content": "", "tool_calls": [call("edit_file", WEIRD)]},
                  {"role": "tool", "content": "done \u2028 \x01"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "string args"},
                  {"role": "assistant", "content": "", "tool_calls": [call("run", "{\"cmd\": \"ls\"}")]}],
     "tools": TOOLS},
    {"messages": [{"role": "user", "content": "no tools"}], "tools": []},
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "write"},
                  {"role": "assistant", "content": "Sure, here"}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                  {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
                  {"role": "user", "content": "   spaced   "}], "enable_thinking": False},
]

goldens = []
for name in sorted(os.listdir(tpl_dir)):
    src = open(os.path.join(tpl_dir, name)).read()
    for cv in CONVS:
        kw = {"enable_thinking": cv["enable_thinking"]} if "enable_thinking" in cv else {}
        for agp in (True, False):
            rec = {"template": name, "input": cv, "add_generation_prompt": agp}
            try:
                rec["rendered"] = tok.apply_chat_template(cv["messages"], tools=cv.get("tools"), chat_template=src,
                                                          add_generation_prompt=agp, tokenize=False, **kw)
            except Exception as e:
                rec["error"] = repr(e)
            goldens.append(rec)
json.dump(goldens, open(out, "w"), ensure_ascii=False, indent=1)
print(len(goldens), "cases,", sum("error" in g for g in goldens), "raised")
