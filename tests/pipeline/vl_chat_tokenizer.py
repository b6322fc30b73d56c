"""The byte-level BPE tokenizer for chat tests on the Qwen3-VL golden checkpoint.

The golden VL model has a 512-token vocabulary and no tokenizer. This writes, into OUT_DIR, a
tokenizer.json made from the real Qwen3 tokenizer.json inside the model's vocabulary: the 256
byte tokens, the first 249 of Qwen3's merges that apply, and the specials at the ids the
model's config gives them (<|image_pad|> 500, <|vision_start|> 502, <|vision_end|> 503, eos
<|im_end|> 511), so every id the model can generate decodes; and a tokenizer_config.json naming
the eos. Used by serve_vision_test and serve_console_vision_test with the real Qwen3-VL chat
template, so strata-serve and strata-client share one model directory.

usage: vl_chat_tokenizer.py QWEN3_TOKENIZER_JSON OUT_DIR
"""
import json, sys
src, out = sys.argv[1], sys.argv[2]
t = json.load(open(src))
real = t["model"]["vocab"]
vocab = {tok: i for tok, i in real.items() if i < 256}  # Qwen3's byte tokens are ids 0..255
specials = {500: "<|image_pad|>", 501: "<|video_pad|>", 502: "<|vision_start|>",
            503: "<|vision_end|>", 504: "<|endoftext|>", 505: "<|im_start|>", 506: "<think>",
            507: "</think>", 508: "<|vision_pad|>", 509: "<tool_call>", 510: "</tool_call>",
            511: "<|im_end|>"}
free_ids = [i for i in range(256, 512) if i not in specials]
merges = []
for m in t["model"]["merges"]:
    a, b = m if isinstance(m, list) else m.split(" ", 1)
    if a in vocab and b in vocab and a + b not in vocab:
        vocab[a + b] = free_ids[len(merges)]
        merges.append([a, b])
        if len(merges) == len(free_ids):
            break
assert len(vocab) == 512 - len(specials)
t["model"]["vocab"] = vocab
t["model"]["merges"] = merges
t["added_tokens"] = [{"id": i, "content": c, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}
                     for i, c in sorted(specials.items())]
t["post_processor"] = None
json.dump(t, open(out + "/tokenizer.json", "w"))
json.dump({"eos_token": "<|im_end|>"}, open(out + "/tokenizer_config.json", "w"))
