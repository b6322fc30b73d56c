#!/usr/bin/env python3
"""Where Hugging Face tokenizers' NFC differs from utf8proc's: the C table runtime/text uses.

HF tokenizers normalises with the Rust `unicode-normalization` crate, whose tables are on an
older Unicode version than the utf8proc Strata links: code points that are newer than HF's
tables behave there like unassigned ones (canonical combining class 0, no decomposition, no
composition). This script, run once by hand (never from `./strata test`), enumerates every
Unicode scalar value X and compares HF's `normalizers.NFC()` with utf8proc's NFC (called
through ctypes on the very libutf8proc.so Strata links) on probes for each property NFC uses:

  ccc240, ccc230, ccc1: "q" U+0345 X, "q" U+0301 X, "q" X U+0334 (marks of class 240, 230,
                1: any class > 0 reorders against at least one of them, class 0 against none)
  decomp:       X alone (decomposition)
  comp:         the canonical decomposition of every primary composite X (utf8proc's NFD of
                X where utf8proc's NFC keeps X): composition
  mark:         X U+0301 (composition with a following mark, reordering)
  comp-part:    not a probe: of a pair HF does not compose, the part HF does not know

Every X where any probe differs goes into the table. Strata treats the table's code points as
HF does (inert: a boundary NFC never reorders, decomposes or composes across) and runs utf8proc's
NFC on the text between them (runtime/text/nfc.c). The script checks that model against HF on
every probe of the table's code points and on seeded random strings mixing them with marks and
starters, and fails if anything differs. It writes the C table and a JSON-lines file of HF
outputs for the unit test (tests/runtime/text/nfc_test.c).

Usage (the tokenizers venv, e.g. ~/.cache/strata/tokenizers-venv/bin/python):
  python tools/golden/nfc_table.py --table runtime/text/nfc_table.c \
      --cases tests/runtime/text/testdata/nfc_hf.jsonl
"""
import argparse
import ctypes
import ctypes.util
import json
import random
import sys
import textwrap

import tokenizers
from tokenizers import normalizers

SEED = 20261125
N_RANDOM = 100000
# Characters that trip other normalisers (HF keeps their order after U+0301; U+0323, U+1AB5 reorder).
LISTED = [0x07FD, 0x1DF9, 0x0D3B, 0x08D3, 0x10F46, 0x0EBA, 0x16FF0, 0x1DFA, 0x0323, 0x1AB5]

UTF8PROC_STABLE, UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE = 1 << 1, 1 << 3, 1 << 4

lib = ctypes.CDLL("libutf8proc.so.2")
libc = ctypes.CDLL(ctypes.util.find_library("c"))
lib.utf8proc_map.argtypes = [ctypes.c_char_p, ctypes.c_ssize_t,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
lib.utf8proc_map.restype = ctypes.c_ssize_t
lib.utf8proc_version.restype = ctypes.c_char_p
lib.utf8proc_unicode_version.restype = ctypes.c_char_p
libc.free.argtypes = [ctypes.c_void_p]
HF = normalizers.NFC()


def u8p(s, options):
    """utf8proc_map(s, options) as str."""
    b = s.encode()
    out = ctypes.c_void_p()
    n = lib.utf8proc_map(b, len(b), ctypes.byref(out), options)
    if n < 0:
        raise RuntimeError(f"utf8proc_map failed on {s!r}: {n}")
    r = ctypes.string_at(out, n).decode()
    libc.free(out)
    return r


def u8p_nfc(s):
    return u8p(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE)


def u8p_nfd(s):
    return u8p(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE)


def scalars():
    return [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def probes(x):
    """Every probe string of code point x (see the module comment)."""
    c = chr(x)
    out = {"ccc240": "q\u0345" + c, "ccc230": "q\u0301" + c, "ccc1": "q" + c + "\u0334",
           "decomp": c, "mark": c + "\u0301"}
    d = u8p_nfd(c)
    if d != c and u8p_nfc(c) == c:
        out["comp"] = d
    return out


def find_differences():
    """{code point: [names of the probes where HF and utf8proc differ]}."""
    diff = {}
    for x in scalars():
        for name, p in probes(x).items():
            if HF.normalize_str(p) != u8p_nfc(p):
                diff.setdefault(x, []).append(name)
    return diff


def comp_parts(diff):
    """For each primary composite whose composition HF lacks: the part of its decomposition
    HF treats as unassigned (then it never composes): the second one, unless some pair HF does
    compose ends with it, else the first. Returns the set of those parts."""
    second_ok = set()
    for x in scalars():
        d = u8p_nfd(chr(x))
        if len(d) == 2 and u8p_nfc(chr(x)) == chr(x) and HF.normalize_str(d) == chr(x):
            second_ok.add(ord(d[1]))
    parts = set()
    for x, names in diff.items():
        if "comp" in names:
            a, b = (ord(c) for c in u8p_nfd(chr(x)))
            parts.add(a if b in second_ok else b)
    return parts


def ranges(cps):
    out = []
    for c in sorted(cps):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def model_nfc(s, inert):
    """Strata's NFC: utf8proc's NFC between the inert code points, which stay as they are."""
    out, seg = [], []
    for ch in s:
        if ord(ch) in inert:
            out.append(u8p_nfc("".join(seg)) if seg else "")
            out.append(ch)
            seg = []
        else:
            seg.append(ch)
    if seg:
        out.append(u8p_nfc("".join(seg)))
    return "".join(out)


def check_model(inert, diff):
    """The model must equal HF on every probe of the table and on mixed random strings."""
    bad = []
    for x in sorted(inert):
        for p in probes(x).values():
            if model_nfc(p, inert) != HF.normalize_str(p):
                bad.append(p)
    rng = random.Random(SEED)
    table = sorted(inert)
    # Marks of many classes, starters that compose, Hangul, and the composites' parts.
    pool = [0x0301, 0x0334, 0x0345, 0x0323, 0x0302, 0x0308, 0x05B0, 0x0E48, 0x093C, 0x0F71,
            0x1AB5, 0x302A, 0x3099, 0x0041, 0x0065, 0x006F, 0x0915, 0x0B47, 0x0B3E, 0x0B57,
            0x1100, 0x1161, 0x11A8, 0xAC00, 0x11347, 0x1133E, 0x114B9, 0x114BA, 0x115B8,
            0x115AF, 0x0020, 0x0071]
    for x in diff:
        pool += [ord(ch) for ch in u8p_nfd(chr(x))]
    for _ in range(N_RANDOM):
        s = "".join(chr(rng.choice(table) if rng.random() < 0.3 else rng.choice(pool))
                    for _ in range(rng.randint(1, 8)))
        if model_nfc(s, inert) != HF.normalize_str(s):
            bad.append(s)
    return bad


def write_table(path, rs, diff):
    """The C table, one range a line with the probes that differed (clang-format stable)."""
    kinds = {}
    for names in diff.values():
        for n in names:
            kinds[n] = kinds.get(n, 0) + 1
    probes_line = ("Probes that differed (code points per probe): "
                   + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ".")
    lines = [
        "/* GENERATED by tools/golden/nfc_table.py; do not edit. Regenerate (by hand, with the",
        " * tokenizers venv) when tokenizers or utf8proc change.",
        f" * HF tokenizers {tokenizers.__version__} NFC vs utf8proc "
        f"{lib.utf8proc_version().decode()} (Unicode {lib.utf8proc_unicode_version().decode()}):",
        f" * {len(diff)} code points where HF's NFC differs from utf8proc's, in {len(rs)} ranges.",
        " * HF's tables predate them: it treats them as class 0, not decomposed, not composed.",
    ]
    lines += [" * " + ln for ln in textwrap.wrap(probes_line, 92, break_on_hyphens=False)]
    lines += [
        " * Checked: utf8proc's NFC between these code points (kept as they are) equals HF's NFC",
        f" * on every probe of them and on {N_RANDOM} seeded random strings. */",
        '#include "runtime/text/nfc.h"',
        "",
        "const struct nfc_range nfc_hf_inert[] = {",
    ]
    for lo, hi in rs:
        names = sorted(set(sum((diff.get(c, []) for c in range(lo, hi + 1)), [])))
        entry = f"{{0x{lo:04X}, 0x{hi:04X}}},".ljust(19)
        lines.append(f"    {entry} /* {' '.join(names)} */")
    lines += ["};", "const size_t nfc_hf_inert_n = sizeof nfc_hf_inert / sizeof *nfc_hf_inert;",
              ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_cases(path, diff):
    """HF's NFC of the listed characters' probes and of one probe set per table range end."""
    cps = set(LISTED)
    for lo, hi in ranges(diff):
        cps |= {lo, hi}
    with open(path, "w") as f:
        f.write(json.dumps({"generator": "tools/golden/nfc_table.py",
                            "tokenizers": tokenizers.__version__}) + "\n")
        for x in sorted(cps):
            for name, p in sorted(probes(x).items()):
                f.write(json.dumps({"cp": x, "probe": name, "text": p,
                                    "nfc": HF.normalize_str(p)}) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--cases", required=True)
    a = ap.parse_args()
    diff = find_differences()
    for x in comp_parts(diff):
        diff.setdefault(x, []).append("comp-part")
    rs = ranges(diff)
    print(f"{len(diff)} code points differ, {len(rs)} ranges", file=sys.stderr)
    for lo, hi in rs:
        print(f"  {lo:04X}..{hi:04X} {sorted(set(sum((diff[c] for c in range(lo, hi + 1)), [])))}",
              file=sys.stderr)
    bad = check_model(set(diff), diff)
    if bad:
        for s in bad[:20]:
            print("model differs from HF:", " ".join(f"{ord(c):04X}" for c in s), file=sys.stderr)
        sys.exit(f"{len(bad)} strings where the model differs from HF")
    write_table(a.table, rs, diff)
    write_cases(a.cases, diff)


if __name__ == "__main__":
    main()
