#!/usr/bin/env python3
"""Golden fixtures for the CPU reference decoder (tests/golden/<case>/).

Every case is a tiny random-weight checkpoint built with transformers' own model classes,
seeded. The weights are widened (unit-variance projections, non-trivial norm weights) so that
greedy decoding is not degenerate, saved in bf16 with save_pretrained, reloaded in fp32 with
eager attention, and decoded greedily with the KV cache. A case whose smallest top-2 logit
margin over all steps is below MIN_MARGIN is rebuilt with the next seed.

Output per case (format in tests/golden/README.md): config.json, model.safetensors (bf16),
prompt_ids.json, golden.json, logits.f32 (float32 little-endian [n_steps, vocab]).

Usage: python tools/golden/generate.py --out tests/golden [--only CASE ...]
The result is deterministic: fixed seeds, one torch thread, no timestamps.
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import (Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

MIN_MARGIN = 0.05
MAX_SEED_TRIES = 64

# Every case has >= 4 layers (the pipeline tests split into 4 stages) and small dims so each
# directory stays well under 1 MB.
CASES = [
    dict(name="qwen3_gqa_tied",
         about="dense, GQA 4q/2kv, head_dim 32 != hidden/heads 16, tied embeddings, theta 1e4, 1-token prompt",
         kind="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
         num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512,
         tie_word_embeddings=True, rope_theta=10000.0, prompt_len=1, n_steps=32, seed=1000),
    dict(name="qwen3_mha_untied",
         about="dense, MHA 4q/4kv, head_dim 24 == hidden/heads, untied lm_head, theta 1e6, 17-token prompt",
         kind="qwen3", hidden_size=96, intermediate_size=160, num_hidden_layers=4,
         num_attention_heads=4, num_key_value_heads=4, head_dim=24, vocab_size=640,
         tie_word_embeddings=False, rope_theta=1000000.0, prompt_len=17, n_steps=24, seed=2000),
    dict(name="qwen3_deep8",
         about="dense, 8 layers, GQA 8q/2kv, head_dim 16, untied, theta 5e5, 16-token prompt",
         kind="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=8,
         num_attention_heads=8, num_key_value_heads=2, head_dim=16, vocab_size=512,
         tie_word_embeddings=False, rope_theta=500000.0, prompt_len=16, n_steps=32, seed=3000),
    dict(name="qwen3_moe",
         about="MoE, per-expert tensors (v4 save format), norm_topk_prob true, decoder_sparse_step 2, "
               "mlp_only_layers [3], E=8 top-2, GQA 4q/2kv, tied, 16-token prompt",
         kind="qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=48,
         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
         vocab_size=512, tie_word_embeddings=True, rope_theta=10000.0, num_experts=8,
         num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3],
         prompt_len=16, n_steps=24, seed=4000),
    dict(name="qwen3_moe_nonorm",
         about="MoE, per-expert tensors, norm_topk_prob false, decoder_sparse_step 1, mlp_only_layers [1], "
               "E=6 top-3, GQA 4q/1kv, head_dim 32, untied, theta 1e6, 1-token prompt",
         kind="qwen3_moe", hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
         vocab_size=512, tie_word_embeddings=False, rope_theta=1000000.0, num_experts=6,
         num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
         prompt_len=1, n_steps=24, seed=5000),
    dict(name="qwen3_long_prompt",
         about="dense, GQA 6q/2kv, head_dim 16, tied, theta 1e4, 40-token prompt, 24 steps",
         kind="qwen3", hidden_size=96, intermediate_size=128, num_hidden_layers=4,
         num_attention_heads=6, num_key_value_heads=2, head_dim=16, vocab_size=1000,
         tie_word_embeddings=True, rope_theta=10000.0, prompt_len=40, n_steps=24, seed=6000),
]


def build_config(case):
    common = dict(vocab_size=case["vocab_size"], hidden_size=case["hidden_size"],
                  intermediate_size=case["intermediate_size"],
                  num_hidden_layers=case["num_hidden_layers"],
                  num_attention_heads=case["num_attention_heads"],
                  num_key_value_heads=case["num_key_value_heads"], head_dim=case["head_dim"],
                  rope_theta=case["rope_theta"], tie_word_embeddings=case["tie_word_embeddings"],
                  rms_norm_eps=1e-6, max_position_embeddings=4096, bos_token_id=None,
                  eos_token_id=case["vocab_size"] - 1, attention_bias=False)
    if case["kind"] == "qwen3":
        return Qwen3Config(**common), Qwen3ForCausalLM
    return Qwen3MoeConfig(**common, moe_intermediate_size=case["moe_intermediate_size"],
                          num_experts=case["num_experts"],
                          num_experts_per_tok=case["num_experts_per_tok"],
                          norm_topk_prob=case["norm_topk_prob"],
                          decoder_sparse_step=case["decoder_sparse_step"],
                          mlp_only_layers=case["mlp_only_layers"]), Qwen3MoeForCausalLM


@torch.no_grad()
def widen(model, gen):
    """Redraws every parameter so activations stay O(1) through the stack: projections get
    N(0, 1/fan_in), the embedding N(0, 0.5^2), norm weights 1 + N(0, 0.2^2). Residual-branch
    outputs (o_proj, down_proj) get a gain of 2 so a token's own embedding does not dominate the
    last hidden state (which makes tied models repeat it), and an untied lm_head a gain of 4 so
    logits spread over a few units and top-2 margins are comfortably above MIN_MARGIN."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
        elif "embed_tokens" in name:
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        else:
            fan_in = p.shape[-1]
            gain = 1.0
            if "o_proj" in name or "down_proj" in name:
                gain = 2.0
            elif name.startswith("lm_head"):
                gain = 4.0
            p.copy_(gain * torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


@torch.no_grad()
def greedy_decode(model, prompt, n_steps):
    """Prefill the prompt, then feed one token per step through the KV cache (DynamicCache).
    Returns generated ids [n_steps] and the logits that chose them [n_steps, V] (fp32)."""
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    logits, generated = [], []
    step_logits = out.logits[0, -1].float()
    for step in range(n_steps):
        logits.append(step_logits.clone())
        token = int(torch.argmax(step_logits))
        generated.append(token)
        if step + 1 == n_steps:
            break
        out = model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        step_logits = out.logits[0, -1].float()
    return generated, torch.stack(logits)


def top2_margins(logits):
    top2 = torch.topk(logits, 2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


def try_seed(case, seed, workdir):
    config, cls = build_config(case)
    torch.manual_seed(seed)
    model = cls(config).eval()
    gen = torch.Generator().manual_seed(seed)
    widen(model, gen)
    prompt = torch.randint(0, case["vocab_size"] - 1, (case["prompt_len"],), generator=gen).tolist()

    if os.path.isdir(workdir):
        shutil.rmtree(workdir)
    model.to(torch.bfloat16).save_pretrained(workdir, safe_serialization=True)
    reloaded = cls.from_pretrained(workdir, dtype=torch.float32, attn_implementation="eager").eval()
    generated, logits = greedy_decode(reloaded, prompt, case["n_steps"])
    return prompt, generated, logits, top2_margins(logits)


def write_case(case, out_root):
    final = os.path.join(out_root, case["name"])
    work = final + ".tmp"
    for attempt in range(MAX_SEED_TRIES):
        seed = case["seed"] + attempt
        prompt, generated, logits, margins = try_seed(case, seed, work)
        distinct = len(set(generated))
        if min(margins) >= MIN_MARGIN and distinct >= max(4, len(generated) // 4):
            break
        print(f"  {case['name']}: seed {seed} rejected (min margin {min(margins):.4f}, "
              f"{distinct} distinct tokens)")
    else:
        raise SystemExit(f"{case['name']}: no seed in {MAX_SEED_TRIES} tries reached margin {MIN_MARGIN}")

    gen_cfg = os.path.join(work, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    with open(os.path.join(work, "prompt_ids.json"), "w") as f:
        json.dump(prompt, f)
        f.write("\n")
    golden = dict(case=case["name"], about=case["about"], model_type=case["kind"], seed=seed,
                  prompt_ids=prompt, generated_ids=generated, n_steps=len(generated),
                  vocab_size=case["vocab_size"], min_margin=min(margins),
                  margins=[round(m, 6) for m in margins], logits_file="logits.f32",
                  logits_dtype="float32-le", logits_shape=[len(generated), case["vocab_size"]],
                  reference=dict(torch=torch.__version__.split("+")[0],
                                 transformers=transformers.__version__, dtype="float32",
                                 attn_implementation="eager", weights_saved_as="bfloat16",
                                 decode="greedy argmax, DynamicCache, one token per step"))
    with open(os.path.join(work, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    logits.numpy().astype("<f4").tofile(os.path.join(work, "logits.f32"))

    if os.path.isdir(final):
        shutil.rmtree(final)
    os.rename(work, final)
    size = sum(os.path.getsize(os.path.join(final, n)) for n in os.listdir(final))
    print(f"{case['name']}: seed {seed}, prompt {len(prompt)}, steps {len(generated)}, "
          f"min top-2 margin {min(margins):.4f}, {size / 1024:.0f} KiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output root, normally tests/golden")
    ap.add_argument("--only", nargs="*", help="case names to (re)generate (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    names = {c["name"] for c in CASES}
    for name in args.only or []:
        if name not in names:
            sys.exit(f"unknown case {name}; known: {sorted(names)}")
    for case in CASES:
        if args.only and case["name"] not in args.only:
            continue
        write_case(case, args.out)


if __name__ == "__main__":
    main()
