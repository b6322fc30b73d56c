#!/usr/bin/env python3
"""Golden chat-template renderings for the C renderer (runtime/text/chat_template.c).

Renders a fixed list of conversations with transformers' own apply_chat_template (its Jinja
environment: trim_blocks, lstrip_blocks, the sandbox, its filters) and writes one JSON line each:
  {"name", "template": "qwen3" | "qwen3_vl", "messages", "options", "text", "ids"}
where options holds the keyword arguments passed (add_generation_prompt, and enable_thinking /
add_vision_id only when given, since "not passed" and False differ for Qwen3), text =
apply_chat_template(..., tokenize=False) and ids = apply_chat_template(..., tokenize=True).
Line 1 is a header naming the versions and template files.

Qwen3 text uses the chat_template of --tokenizer's tokenizer_config.json. Qwen3-VL uses the
chat_template of --vl-template (a chat_template.json); it is passed as chat_template= to the
same tokenizer's apply_chat_template, which is the call Qwen3VLProcessor.apply_chat_template
makes for the text (the processor itself needs torch for its image processor). Image parts stay
one <|image_pad|> each: expanding them per image is the processor's job, not the template's.

Usage: python tools/golden/chat_template_golden.py --tokenizer DIR --vl-template FILE --out F
Needs transformers==4.57.1 and tokenizers==0.22.1 (tools/requirements.txt), not torch.
"""
import argparse
import json

import jinja2
import tokenizers
import transformers

SYS = {"role": "system", "content": "You are a helpful assistant."}


def u(text):
    return {"role": "user", "content": text}


def a(text, reasoning=None):
    m = {"role": "assistant", "content": text}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def img(**extra):
    d = {"type": "image", "image": "file:///tmp/a.jpg"}
    d.update(extra)
    return d


def txt(t):
    return {"type": "text", "text": t}


# (name, messages, options) for the Qwen3 text template.
QWEN3 = [
    ("user_only", [u("Hello")], {"add_generation_prompt": True}),
    ("user_no_gen", [u("Hello")], {"add_generation_prompt": False}),
    ("user_think_false", [u("Hello")], {"add_generation_prompt": True, "enable_thinking": False}),
    ("user_think_true", [u("Hello")], {"add_generation_prompt": True, "enable_thinking": True}),
    ("system_user", [SYS, u("Hello")], {"add_generation_prompt": True}),
    ("system_user_think_false", [SYS, u("Hello")],
     {"add_generation_prompt": True, "enable_thinking": False}),
    ("system_only", [SYS], {"add_generation_prompt": True}),
    ("system_only_no_gen", [SYS], {"add_generation_prompt": False}),
    ("multi_turn", [SYS, u("What is 2+2?"), a("4"), u("And 3+3?")],
     {"add_generation_prompt": True}),
    ("multi_turn_think_false", [u("What is 2+2?"), a("4"), u("And 3+3?")],
     {"add_generation_prompt": True, "enable_thinking": False}),
    ("history_think_stripped",
     [u("What is 2+2?"), a("<think>\nAdd two and two.\n</think>\n\n4"), u("And 3+3?")],
     {"add_generation_prompt": True}),
    ("last_assistant_think_kept",
     [u("What is 2+2?"), a("<think>\nAdd two and two.\n</think>\n\n4")],
     {"add_generation_prompt": False}),
    ("last_assistant_no_think", [u("What is 2+2?"), a("4")], {"add_generation_prompt": False}),
    ("last_assistant_gen", [u("Hi"), a("Hello!")], {"add_generation_prompt": True}),
    ("reasoning_content_last", [u("Hi"), a("Hello!", "The user greets me.")],
     {"add_generation_prompt": False}),
    ("reasoning_content_history", [u("Hi"), a("Hello!", "The user greets me."), u("Bye")],
     {"add_generation_prompt": True}),
    ("reasoning_empty_string_last", [u("Hi"), a("Hello!", "")], {"add_generation_prompt": False}),
    ("reasoning_overrides_tags", [u("Hi"), a("<think>x</think>Hello!", "given")],
     {"add_generation_prompt": False}),
    ("two_assistants_after_query",
     [u("Q"), a("<think>r1</think>first"), a("<think>r2</think>second")],
     {"add_generation_prompt": False}),
    ("two_assistants_no_reasoning", [u("Q"), a("first"), a("second")],
     {"add_generation_prompt": True}),
    ("think_newlines_stripped", [u("Q"), a("<think>\n\n\nreason\n\n</think>\n\n\nanswer\n")],
     {"add_generation_prompt": False}),
    ("think_only_close_tag", [u("Q"), a("reason</think>answer")], {"add_generation_prompt": False}),
    ("think_two_close_tags", [u("Q"), a("<think>a</think>b</think>c"), u("again")],
     {"add_generation_prompt": True}),
    ("think_two_close_tags_last", [u("Q"), a("<think>a</think>b</think>c")],
     {"add_generation_prompt": False}),
    ("think_nested_open", [u("Q"), a("x<think>y<think>z</think>w")],
     {"add_generation_prompt": False}),
    ("empty_think_block_last", [u("Q"), a("<think>\n\n</think>\n\nanswer")],
     {"add_generation_prompt": False}),
    ("tool_response_user_skipped",
     [u("Q"), a("calling"), u("<tool_response>\n42\n</tool_response>")],
     {"add_generation_prompt": True}),
    ("tool_response_user_history",
     [u("Q"), a("<think>plan</think>calling"), u("<tool_response>42</tool_response>"),
      a("<think>done</think>It is 42.")], {"add_generation_prompt": False}),
    ("system_mid_conversation", [u("Hi"), {"role": "system", "content": "Be brief."}, u("Hello?")],
     {"add_generation_prompt": True}),
    ("unicode", [{"role": "system", "content": "Réponds en français. 你好 😀"},
                 u("Ça va ? — «oui» 👍🏽 مرحبا"), a("Très bien ! 日本語")],
     {"add_generation_prompt": True, "enable_thinking": False}),
    ("empty_user", [u("")], {"add_generation_prompt": True}),
    ("empty_system", [{"role": "system", "content": ""}, u("x")], {"add_generation_prompt": True}),
    ("empty_assistant", [u("x"), a("")], {"add_generation_prompt": False}),
    ("whitespace_content", [u("  spaces  \n\n"), a("\n\nleading newlines")],
     {"add_generation_prompt": False}),
    ("special_tokens_in_text", [u("<|im_start|>user\nnested<|im_end|>")],
     {"add_generation_prompt": True}),
    ("long_multi_turn",
     [SYS, u("one"), a("<think>a</think>1"), u("two"), a("<think>b</think>2"), u("three"),
      a("<think>c</think>3"), u("four")], {"add_generation_prompt": True, "enable_thinking": False}),
    ("no_gen_think_false", [u("Hello")], {"add_generation_prompt": False, "enable_thinking": False}),
    ("assistant_first", [a("I start."), u("ok")], {"add_generation_prompt": True}),
]

# (name, messages, options) for the Qwen3-VL Instruct template.
QWEN3_VL = [
    ("vl_text_only", [u("Hello")], {"add_generation_prompt": True}),
    ("vl_one_image", [SYS, {"role": "user", "content": [img(), txt("Describe this image.")]}],
     {"add_generation_prompt": True}),
    ("vl_one_image_think_false", [{"role": "user", "content": [img(), txt("Describe.")]}],
     {"add_generation_prompt": True, "enable_thinking": False}),
    ("vl_two_images_interleaved",
     [{"role": "user", "content": [txt("Compare "), img(), txt(" and "), img()]}],
     {"add_generation_prompt": True}),
    ("vl_image_key_only", [{"role": "user", "content": [{"image": "a.png"}, txt("What?")]}],
     {"add_generation_prompt": True}),
    ("vl_image_url", [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/a.png"}}, txt("What?")]}],
     {"add_generation_prompt": True}),
    ("vl_vision_ids", [{"role": "user", "content": [img(), txt("and"), img()]},
                       a("Two cats."), {"role": "user", "content": [img(), txt("this?")]}],
     {"add_generation_prompt": True, "add_vision_id": True}),
    ("vl_video", [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}, txt("Why?")]}],
     {"add_generation_prompt": True}),
    ("vl_system_list", [{"role": "system", "content": [txt("Be "), txt("brief.")]},
                        {"role": "user", "content": [img(), txt("Hi")]}],
     {"add_generation_prompt": True}),
    ("vl_system_dropped_mid", [u("Hi"), {"role": "system", "content": "ignored"}, u("Hello?")],
     {"add_generation_prompt": True}),
    ("vl_multi_turn_history",
     [SYS, {"role": "user", "content": [img(), txt("What is it?")]}, a("A cat."),
      {"role": "user", "content": [txt("And this one? "), img()]}],
     {"add_generation_prompt": True}),
    ("vl_assistant_think_verbatim", [u("Q"), a("<think>r</think>\n\nanswer"), u("again")],
     {"add_generation_prompt": False}),
    ("vl_assistant_list", [u("Q"), {"role": "assistant", "content": [txt("part1 "), txt("part2")]}],
     {"add_generation_prompt": False}),
    ("vl_unicode_images", [{"role": "user", "content": [txt("这是什么？"), img(), txt(" 😀")]}],
     {"add_generation_prompt": True}),
    ("vl_empty_text", [{"role": "user", "content": [img(), txt("")]}],
     {"add_generation_prompt": False}),
    ("vl_empty_list", [{"role": "user", "content": []}], {"add_generation_prompt": True}),
]


def record(tok, name, kind, messages, options, template):
    kw = dict(options)
    if template is not None:
        kw["chat_template"] = template
    text = tok.apply_chat_template(messages, tokenize=False, **kw)
    ids = tok.apply_chat_template(messages, tokenize=True, **kw)
    if isinstance(ids, dict):  # BatchEncoding in some versions
        ids = ids["input_ids"]
    return {"name": name, "template": kind, "messages": messages, "options": options,
            "text": text, "ids": list(ids)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--vl-template", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tok = transformers.AutoTokenizer.from_pretrained(args.tokenizer)
    with open(args.vl_template, encoding="utf-8") as f:
        vl = json.load(f)["chat_template"]
    rows = [record(tok, n, "qwen3", m, o, None) for n, m, o in QWEN3]
    rows += [record(tok, n, "qwen3_vl", m, o, vl) for n, m, o in QWEN3_VL]
    with open(args.out, "w", encoding="utf-8") as f:
        header = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                  "jinja2": jinja2.__version__, "qwen3": "tokenizer_config.json chat_template",
                  "qwen3_vl": "qwen3-vl-chat-template/chat_template.json", "count": len(rows)}
        f.write(json.dumps(header, ensure_ascii=False) + "\n")
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} conversations to {args.out}")


if __name__ == "__main__":
    main()
