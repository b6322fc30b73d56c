"""Strata's CPU reference decoder against llama.cpp (llama-cpp-python) on one checkpoint.

Subcommands (tools/bench_peers.sh drives them; a benchmark, not a test):
  gguf SRC OUT.gguf {bf16,q8_0} TOKENIZER_DIR  convert a Strata Qwen3 checkpoint to GGUF
  llama GGUF THREADS PROMPT STEPS               one llama.cpp greedy decode; prints JSON
  table RESULTS.jsonl                           medians, ratios and the read roofline
  forced GGUF STRATA_OUT PROMPT_IDS              teacher-forced agreement: llama.cpp reads the
                                                prompt and Strata's generated ids (strata-generate
                                                --out) in one batch; per position, does its argmax
                                                equal Strata's id, and how far apart are the logits

The GGUF writer uses the `gguf` package directly (Qwen3 needs no tensor permutation; the
vocabulary is padded with unused tokens up to the checkpoint's vocab_size the way llama.cpp's
convert_hf_to_gguf.py does), so the converter needs neither torch nor llama.cpp's source.
"""
import json
import os
import statistics
import sys
import time

import numpy as np


def read_safetensors(path):
    """Yields (name, dtype, shape, raw uint8 view) without copying (numpy has no bf16)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        yield name, meta["dtype"], meta["shape"], data[a:b]


def bf16_to_f32(raw):
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(name):
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    parts = name.split(".")  # model.layers.N.<module>.weight
    return "blk.%s.%s.weight" % (parts[2], LAYER_NAMES[".".join(parts[3:-1])])


def add_tokenizer(w, tok_dir, vocab_size, eos):
    import gguf

    tok = json.load(open(tok_dir + "/tokenizer.json"))
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    types = {i: gguf.TokenType.NORMAL for i in by_id}
    for t in tok["added_tokens"]:
        by_id[t["id"]] = t["content"]
        types[t["id"]] = gguf.TokenType.CONTROL if t["special"] else gguf.TokenType.USER_DEFINED
    tokens, ttypes = [], []
    for i in range(vocab_size):
        tokens.append(by_id.get(i, "[PAD%d]" % i))
        ttypes.append(types.get(i, gguf.TokenType.UNUSED))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)


def cmd_gguf(src, out, kind, tok_dir):
    import gguf

    cfg = json.load(open(src + "/config.json"))
    q8 = kind == "q8_0"
    w = gguf.GGUFWriter(out, "qwen3")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.MOSTLY_BF16)
    add_tokenizer(w, tok_dir, cfg["vocab_size"], cfg["eos_token_id"])
    for name, dtype, shape, raw in read_safetensors(src + "/model.safetensors"):
        assert dtype == "BF16", (name, dtype)
        if len(shape) == 1:  # norms stay f32, as llama.cpp's converter keeps them
            w.add_tensor(gguf_name(name), bf16_to_f32(raw).copy())
        elif q8:
            f = bf16_to_f32(raw).reshape(shape)
            q = gguf.quants.quantize(f, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gguf_name(name), q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            byte_shape = (shape[0], shape[1] * 2)
            w.add_tensor(gguf_name(name), np.asarray(raw).reshape(byte_shape),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cmd_llama(path, threads, prompt, steps):
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads,
                n_ctx=prompt + steps + 8, n_batch=prompt + steps + 8, verbose=False)
    vocab = llm.n_vocab()
    # The same prompt ids strata-bench-decode uses.
    ids = [(i * 7919 + 13) % vocab for i in range(prompt)]
    # Prefill: once untimed (first touch of the mmapped GGUF), then timed from an empty
    # cache (eval drops the KV past n_tokens): the prompt in one batch and the last row's
    # logits, what strata-bench-decode's prefill column times.
    llm.eval(ids)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    vocab_logits = lambda: np.ctypeslib.as_array(  # noqa: E731  (the last position's logits)
        llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
    out = []
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = int(np.argmax(vocab_logits()))
        out.append(tok)
        llm.eval([tok])
    dt = time.perf_counter() - t0
    print(json.dumps({"tok_s": steps / dt, "prefill_tok_s": prompt / prefill_s, "ids": out}))


def cmd_table(path):
    """Medians per (threads, engine). Strata bf16 is compared with llama.cpp BF16 and Strata
    q8 with llama.cpp Q8_0 (the same format family); the roofline divides the read bandwidth
    measured beside each Strata run by the bytes that engine family reads per token."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    keys = sorted({(r["threads"], r["engine"]) for r in rows})
    med, load = {}, {}
    for k in keys:
        vals = [r for r in rows if (r["threads"], r["engine"]) == k]
        med[k] = statistics.median(r["tok_s"] for r in vals)
        load[k] = statistics.median(r.get("load", 0.0) for r in vals)
        if k[1].startswith("strata"):
            med[(k[0], k[1] + ":read")] = statistics.median(r["read_gbs"] for r in vals)
            med[(k[0], k[1] + ":mb")] = vals[0]["mb_per_token"]
    print("decode tokens/s, median of %d interleaved runs (load: median 1-minute load average "
          "before the runs, %d cores)" % (max(
              len([r for r in rows if (r["threads"], r["engine"]) == k]) for k in keys),
              os.cpu_count() or 0))
    print("%7s %-16s %9s %14s %10s %15s %10s %6s" % (
        "threads", "engine", "tok/s", "strata/this", "read GB/s", "roofline tok/s", "% of roof",
        "load"))
    for t in sorted({k[0] for k in keys}):
        for k in [k for k in keys if k[0] == t]:
            q8 = "q8" in k[1]
            ours = "strata-q8" if q8 else "strata"
            s = med.get((t, ours))
            read = med.get((t, ours + ":read"))
            mb = med.get((t, ours + ":mb"))
            roof = read * 1e3 / mb if read and mb else None
            v = med[k]
            ratio = "%.2fx" % (s / v) if s and not k[1].startswith("strata") else "-"
            pct = "%.0f%%" % (100 * v / roof) if roof else "-"
            print("%7d %-16s %9.2f %14s %10.2f %15.2f %10s %6.1f" % (
                t, k[1], v, ratio, read or 0, roof or 0, pct, load[k]))
    pre = {k: statistics.median(r["prefill_tok_s"] for r in rows
                                if (r["threads"], r["engine"]) == k and "prefill_tok_s" in r)
           for k in keys if any("prefill_tok_s" in r for r in rows
                                if (r["threads"], r["engine"]) == k)}
    if pre:
        n = next((r["prompt"] for r in rows if "prompt" in r), 0)
        print("prefill tokens/s (a %d-token prompt in one call, with the last row's logits), "
              "medians of the same runs" % n)
        print("%7s %-16s %9s %14s" % ("threads", "engine", "tok/s", "strata/this"))
        for k in sorted(pre):
            ours = "strata-q8" if "q8" in k[1] else "strata"
            s = pre.get((k[0], ours))
            ratio = "%.2fx" % (s / pre[k]) if s and not k[1].startswith("strata") else "-"
            print("%7d %-16s %9.2f %14s" % (k[0], k[1], pre[k], ratio))


def read_strata_out(path):
    """tokens I32 [n] and logits F32 [n, V] from strata-generate --out (plain safetensors)."""
    out = {}
    for name, dtype, shape, raw in read_safetensors(path):
        out[name] = np.frombuffer(raw, dtype={"I32": np.int32, "F32": np.float32}[dtype]).reshape(shape)
    return out["tokens"], out["logits"]


def cmd_forced(path, strata_out, prompt_ids):
    """Greedy ids diverge for good at the first near-tie (random weights have many), so the
    free-running agreement says little once they do. Here both engines see the same ids at
    every position: llama.cpp's argmax is compared with Strata's id position by position."""
    from llama_cpp import Llama

    tokens, logits = read_strata_out(strata_out)
    prompt = [int(v) for v in prompt_ids.split(",")]
    seq = prompt + [int(t) for t in tokens[:-1]]
    llm = Llama(model_path=path, n_threads=2, n_ctx=len(seq) + 8, n_batch=len(seq) + 8,
                logits_all=True, verbose=False)
    llm.eval(seq)
    theirs = np.asarray(llm.scores[len(prompt) - 1:len(seq)], dtype=np.float32)[:, :logits.shape[1]]
    same = int(np.sum(np.argmax(theirs, axis=1) == tokens))
    diff = np.abs(theirs - logits)
    print("teacher-forced: %d/%d positions with llama.cpp's argmax = Strata's id; "
          "max |dlogit| %.3f, mean %.4f" % (same, len(tokens), diff.max(), diff.mean()))


def main(argv):
    if len(argv) >= 5 and argv[0] == "gguf":
        cmd_gguf(argv[1], argv[2], argv[3], argv[4])
    elif len(argv) == 5 and argv[0] == "llama":
        cmd_llama(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
    elif len(argv) == 2 and argv[0] == "table":
        cmd_table(argv[1])
    elif len(argv) == 4 and argv[0] == "forced":
        cmd_forced(argv[1], argv[2], argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
