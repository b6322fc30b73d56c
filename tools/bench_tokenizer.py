#!/usr/bin/env python3
"""HF tokenizers' side of `./strata bench tokenizer`: the same corpus, the same rounds, one
thread (TOKENIZERS_PARALLELISM=false; `encode` per text, as strata-bench-tokenizer does), only
encode timed; prints the same key=value line, with the FNV-1a hash of one round's ids."""
import argparse
import json
import os
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ids-out", help="write one round's ids, a line per text")
    a = ap.parse_args()
    tok = tokenizers.Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    texts = []
    for line in open(a.corpus, encoding="utf-8"):
        v = json.loads(line)
        v = v.get("text") if isinstance(v, dict) else v
        if isinstance(v, str):
            texts.append(v)
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    h, n_ids = 1469598103934665603, 0
    out = open(a.ids_out, "w") if a.ids_out else None
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        n_ids += len(ids)
        if out:
            out.write(" ".join(map(str, ids)) + "\n")
        for i in ids:
            h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    if out:
        out.close()
    # `encode` per text is what a server calling the Python API pays; `encode_batch` over the
    # whole corpus (still one thread) is the library's own speed without per-call overhead.
    modes = [("encode", lambda: [tok.encode(t, add_special_tokens=False) for t in texts]),
             ("encode_batch", lambda: tok.encode_batch(texts, add_special_tokens=False))]
    for mode, run in modes:
        t0 = time.perf_counter()
        for _ in range(a.repeat):
            run()
        s = time.perf_counter() - t0
        print(f"impl=hf-tokenizers-{tokenizers.__version__}-{mode} texts={len(texts)} bytes={nbytes} "
              f"ids={n_ids} rounds={a.repeat} seconds={s:.4f} mb_per_s={nbytes * a.repeat / s / 1e6:.3f} "
              f"ids_fnv={h:016x}")


if __name__ == "__main__":
    main()
