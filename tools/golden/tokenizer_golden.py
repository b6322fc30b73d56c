#!/usr/bin/env python3
"""Golden ids for the C tokenizer (runtime/text), recorded with Hugging Face `tokenizers`.

For every string of a fixed, seeded set it writes one JSON line:
  {"text": str, "ids": [int], "decode": str, "decode_skip": str, "roundtrip": bool}
where ids = Tokenizer.encode(text, add_special_tokens=False).ids, decode = decode(ids,
skip_special_tokens=False), decode_skip = decode(ids, skip_special_tokens=True) and roundtrip
says whether encode(decode) gives the same ids back. The first line is a header naming the
tokenizers version. Strings never contain U+0000 (the C test reads them with cJSON, which
stops a string at NUL).

Usage: python tools/golden/tokenizer_golden.py --tokenizer DIR --out FILE.jsonl
Only needs `tokenizers` (pinned in tools/requirements.txt); deterministic (fixed seed).
"""
import argparse
import json
import random
import unicodedata

import tokenizers

N_RANDOM = 900
SEED = 20261124

PROSE = [
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune,"
    " must be in want of a wife.", "don't", "I'll", "we've", "they're", "she'd", "I'm", "it's",
    "DON'T", "I'LL", "We'Ve", "'s 't 're 've 'm 'll 'd", "rock'n'roll", "o'clock",
    "Mr. O'Neil said: \"don't!\"", "a", " a", "  a", "a ", "a  ", "A.B.C.", "e.g. i.e. etc.",
    "(parenthesised) [bracketed] {braced} <angled>", "hyphen-ated words -- and dashes",
    "email@example.com https://example.org/path?q=1&r=2#frag", "CamelCaseIdentifier",
    "snake_case_identifier", "ALLCAPS SHOUTING", "Mixed123Numbers456", "x=y+z*2/3-4%5",
]

CODE = [
    "def f(x):\n    return x * 2\n", "int main(void) {\n\treturn 0;\n}\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "if x == 1:\n\tprint('one')\nelif x == 2:\n\tprint(\"two\")\n",
    "#include <stdio.h>\n", "const char *s = \"\\n\";", "    indented\n        more\n",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}", "<div class=\"x\">text</div>",
    "SELECT * FROM t WHERE a >= 10 AND b <> 'x';", "x->y->z; a::b::c; p?.q ?? r",
    "fn main() { println!(\"{}\", 1_000_000u64); }", "$ ls -la | grep foo > out.txt 2>&1",
    "// comment\n/* block */\n# hash\n", "lambda x: x**2 if x else -x", "a\\b\\c", "~!@#$%^&*()_+`",
]

NUMBERS = [
    "0", "7", "42", "123", "1234", "12345", "3.14159", "-273.15", "1e10", "6.022e23",
    "1,000,000", "2026-11-24", "12:34:56", "0x1F", "007", "99 bottles", "π ≈ 3.14",
    "12345678901234567890123456789012345678901234567890", "٣٤٥", "१२३", "１２３", "Ⅻ", "½ ¾",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", "a\r\nb",
    "line one\nline two\n", "trailing spaces   ", "   leading", "a \n b", "a  \n\n  b",
    "tab\tseparated\tvalues", " \t \n \r\n ", "x\n\n\n\ny", "end\n", "a\u00a0b", "a\u3000b",
    "a\u2003b", "a\u2028b", "a\u0085b", "a\u180eb", " \u180e ", "\u200b", "a\u200bb",
    "a\u202fb", "\u000b\u000c", "word \n", "word  \n  ", "    ", "\n   \n",
]

WORLD = [
    "你好，世界！", "我爱自然语言处理。", "日本語のテキストです。", "カタカナとひらがな",
    "안녕하세요, 세계!", "한국어 문장입니다.", "مرحبا بالعالم", "السلام عليكم ورحمة الله",
    "नमस्ते दुनिया", "हिन्दी में लिखा गया वाक्य।", "Привет, мир!", "Γειά σου Κόσμε",
    "שלום עולם", "ภาษาไทย", "Tiếng Việt có dấu", "ქართული", "Ελληνικά και English mixed",
    "中文English混合123", "Ｆｕｌｌｗｉｄｔｈ　ｆｏｒｍｓ！", "ＡＢＣ１２３", "ｶﾀｶﾅ",
    "'ſ", "'S", "'ſt", "'\u212a", "İstanbul", "straße STRASSE", "ﬁ ligature", "Å Å Å",
]

EMOJI = [
    "😀", "👍", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪🇯🇵", "❤️", "✨ sparkle ✨",
    "I ❤️ NY", "🧑🏾‍💻 coding", "😀😃😄😁", "1️⃣ 2️⃣", "👩‍❤️‍💋‍👨", "🫠🫡🫶",
]

# Decomposed forms that NFC composes (and some it must not reorder wrongly).
COMBINING = [
    "e\u0301", "cafe\u0301", "A\u030a", "n\u0303o", "o\u0308\u0304", "\u1100\u1161\u11a8",
    "a\u0323\u0302", "a\u0302\u0323", "e\u0301\u0301", "\u0301", " \u0301", "x\u0338",
    ">\u0338", "=\u0338", "Å", "ﬃ", "\u212b", "\u2126", "\u0958", "\u0915\u093c",
]

SPECIAL = [
    "<|im_start|>user\nhi<|im_end|>", "<|im_start|>system\nYou are helpful.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<think>", "</think>", "<think>\nreasoning\n</think>\n\nanswer",
    "<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>",
    "<|endoftext|>", "a<|endoftext|>b", "<|im_end|><|im_end|>", "<|im_start|", "<|im_start|>>",
    "<<|im_start|>", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<|fim_prefix|>x<|fim_suffix|>",
    "<|box_start|>(1,2)<|box_end|>", "<think> </think>", " <think> ", "<thinking>",
    "<|object_ref_start|>the cat<|object_ref_end|>", "<|quad_start|><|quad_end|>",
    "<|repo_name|>r<|file_sep|>f", "<tool_response>ok</tool_response>", "<|vision_pad|>",
    "x<|image_pad|><|image_pad|><|image_pad|>y", "<|IM_START|>", "<|im_start|>\u0301",
    "<think>\u0338",
]

LONG = [
    "word " * 400, "a" * 3000, " " * 2000, "\n" * 500, "1234567890" * 100,
    "混合" * 700, "😀" * 300, ("The quick brown fox. " * 50 + "\n") * 5,
]


def random_string(rng):
    """A string of valid Unicode scalar values (no surrogates, no NUL) across planes."""
    n = rng.randint(1, 24)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.25:
            cp = rng.randint(0x20, 0x7E)
        elif r < 0.35:
            cp = rng.choice([0x09, 0x0A, 0x0D, 0x20, 0x20, 0x3000, 0x0301, 0x200D])
        elif r < 0.55:
            cp = rng.randint(0x80, 0x7FF)
        elif r < 0.80:
            cp = rng.randint(0x800, 0xFFFD)
        elif r < 0.95:
            cp = rng.randint(0x10000, 0x2FFFF)
        else:
            cp = rng.randint(0x30000, 0x10FFFF)
        if 0xD800 <= cp <= 0xDFFF or cp == 0:
            cp = 0x41
        out.append(chr(cp))
    return "".join(out)


def combined(rng, pools):
    """Joins pieces of the fixed sets so boundaries between kinds of text are covered."""
    k = rng.randint(2, 4)
    seps = ["", " ", "\n", "  ", "\t", "\r\n"]
    return "".join(rng.choice(rng.choice(pools)) + rng.choice(seps) for _ in range(k))


def all_strings():
    rng = random.Random(SEED)
    fixed = PROSE + CODE + NUMBERS + WHITESPACE + WORLD + EMOJI + COMBINING + SPECIAL + LONG
    pools = [PROSE, CODE, NUMBERS, WHITESPACE, WORLD, EMOJI, COMBINING, SPECIAL]
    out = list(fixed)
    out += [s.upper() for s in PROSE] + [unicodedata.normalize("NFD", s) for s in WORLD]
    out += [combined(rng, pools) for _ in range(900)]
    out += [random_string(rng) for _ in range(N_RANDOM)]
    seen, unique = set(), []
    for s in out:
        if s and s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="directory with tokenizer.json")
    ap.add_argument("--out", required=True, help="JSONL file to write")
    args = ap.parse_args()
    tok = tokenizers.Tokenizer.from_file(args.tokenizer + "/tokenizer.json")
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps({"tokenizers": tokenizers.__version__, "seed": SEED}) + "\n")
        for s in all_strings():
            ids = tok.encode(s, add_special_tokens=False).ids
            dec = tok.decode(ids, skip_special_tokens=False)
            again = tok.encode(dec, add_special_tokens=False).ids
            rec = {"text": s, "ids": ids, "decode": dec,
                   "decode_skip": tok.decode(ids, skip_special_tokens=True),
                   "roundtrip": again == ids}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
