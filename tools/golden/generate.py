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
                          Qwen3MoeForCausalLM, Qwen3VLConfig,
                          Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig,
                          Qwen3VLMoeForConditionalGeneration)

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
    # Qwen3-VL text stacks driven by a real (tiny) vision tower: the prompt holds one image
    # (grid T=1, 4x6 patches -> 6 merged tokens), so prefill uses interleaved M-RoPE positions
    # and DeepStack adds; decode continues at cache index + rope_delta.
    dict(name="qwen3_vl",
         about="Qwen3-VL dense text stack, 4 layers, GQA 4q/2kv, head_dim 16, mrope_section [2,3,3], "
               "untied, 2 DeepStack layers, one 6-token image in a 13-token prompt",
         kind="qwen3_vl", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
         tie_word_embeddings=False, rope_theta=5000000.0, mrope_section=[2, 3, 3],
         deepstack_visual_indexes=[0, 1], n_steps=24, seed=7000),
    dict(name="qwen3_vl_moe",
         about="Qwen3-VL-MoE text stack, fused input-major experts gate_up_proj [E,H,2I] / down_proj "
               "[E,I,H], E=4 top-2 (always renormalised), tied, mrope_section [2,3,3], 3 DeepStack "
               "layers, one 6-token image in a 13-token prompt",
         kind="qwen3_vl_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
         vocab_size=512, tie_word_embeddings=True, rope_theta=5000000.0, num_experts=4,
         num_experts_per_tok=2, mrope_section=[2, 3, 3], deepstack_visual_indexes=[0, 1, 2],
         n_steps=24, seed=8000),
]

# Special tokens of the VL cases (inside the small vocabularies).
VL_TOKENS = dict(image_token_id=500, video_token_id=501, vision_start_token_id=502,
                 vision_end_token_id=503)
VL_GRID = (1, 4, 6)  # image_grid_thw in patch units
VL_PATCH, VL_MERGE, VL_TEMPORAL = 4, 2, 2


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
    if case["kind"] in ("qwen3_vl", "qwen3_vl_moe"):
        return build_vl_config(case, common)
    return Qwen3MoeConfig(**common, moe_intermediate_size=case["moe_intermediate_size"],
                          num_experts=case["num_experts"],
                          num_experts_per_tok=case["num_experts_per_tok"],
                          norm_topk_prob=case["norm_topk_prob"],
                          decoder_sparse_step=case["decoder_sparse_step"],
                          mlp_only_layers=case["mlp_only_layers"]), Qwen3MoeForCausalLM


def build_vl_config(case, common):
    text = dict(common)
    # transformers 4.57 ties lm_head by the *text* config's flag
    # (get_text_config(decoder=True).tie_word_embeddings); keep both flags equal.
    for key in ("bos_token_id", "eos_token_id"):
        text.pop(key)
    text.pop("rope_theta")
    text.update(rope_theta=case["rope_theta"],
                rope_scaling=dict(rope_type="default", mrope_section=case["mrope_section"],
                                  mrope_interleaved=True))
    vision = dict(depth=len(case["deepstack_visual_indexes"]) + 1, hidden_size=32,
                  intermediate_size=64, num_heads=2, in_channels=3, patch_size=VL_PATCH,
                  spatial_merge_size=VL_MERGE, temporal_patch_size=VL_TEMPORAL,
                  out_hidden_size=case["hidden_size"], num_position_embeddings=16,
                  deepstack_visual_indexes=case["deepstack_visual_indexes"])
    top = dict(vision_config=vision, tie_word_embeddings=case["tie_word_embeddings"],
               eos_token_id=case["vocab_size"] - 1, **VL_TOKENS)
    if case["kind"] == "qwen3_vl":
        return Qwen3VLConfig(text_config=text, **top), Qwen3VLForConditionalGeneration
    text.update(moe_intermediate_size=case["moe_intermediate_size"], num_experts=case["num_experts"],
                num_experts_per_tok=case["num_experts_per_tok"], decoder_sparse_step=1,
                mlp_only_layers=[], norm_topk_prob=True)
    return Qwen3VLMoeConfig(text_config=text, **top), Qwen3VLMoeForConditionalGeneration


@torch.no_grad()
def widen(model, gen):
    """Redraws every parameter so activations stay O(1) through the stack: projections get
    N(0, 1/fan_in), the embedding N(0, 0.5^2), norm weights 1 + N(0, 0.2^2). Residual-branch
    outputs (o_proj, down_proj) get a gain of 2 so a token's own embedding does not dominate the
    last hidden state (which makes tied models repeat it), and an untied lm_head a gain of 4 so
    logits spread over a few units and top-2 margins are comfortably above MIN_MARGIN."""
    for name, p in model.named_parameters():
        if ("norm" in name and name.endswith(".weight") and p.ndim == 1) or "layernorm" in name:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
        elif "embed_tokens" in name:
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        else:
            # Fused input-major experts ([E, H, 2I], [E, I, H]) read their input on dim 1.
            fan_in = p.shape[1] if name.endswith(("experts.gate_up_proj", "experts.down_proj")) else p.shape[-1]
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


def vl_prompt(case, gen):
    """Three text tokens, <vision_start>, one image's pad tokens, <vision_end>, two text tokens."""
    t, h, w = VL_GRID
    n_image = t * (h // VL_MERGE) * (w // VL_MERGE)
    text = torch.randint(0, 500, (5,), generator=gen).tolist()
    return (text[:3] + [VL_TOKENS["vision_start_token_id"]] + [VL_TOKENS["image_token_id"]] * n_image
            + [VL_TOKENS["vision_end_token_id"]] + text[3:])


@torch.no_grad()
def greedy_decode_vl(model, prompt, pixel_values, grid, n_steps):
    """Prefill with the image through the full model (HF computes M-RoPE positions and DeepStack),
    then one token per step with explicit cache_position (decode positions = index + rope_delta)."""
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model(input_ids=ids, pixel_values=pixel_values, image_grid_thw=grid,
                attention_mask=torch.ones_like(ids), use_cache=True)
    past = out.past_key_values
    logits, generated = [], []
    step_logits = out.logits[0, -1].float()
    pos = len(prompt)
    for step in range(n_steps):
        logits.append(step_logits.clone())
        token = int(torch.argmax(step_logits))
        generated.append(token)
        if step + 1 == n_steps:
            break
        out = model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True,
                    attention_mask=torch.ones((1, pos + 1), dtype=torch.long),
                    cache_position=torch.tensor([pos]))
        past = out.past_key_values
        pos += 1
        step_logits = out.logits[0, -1].float()
    return generated, torch.stack(logits)


@torch.no_grad()
def vl_extras(model, prompt, pixel_values, grid):
    """What a text-stack implementation needs to reproduce the prefill without a vision tower:
    the merger outputs, the DeepStack features and HF's M-RoPE position ids."""
    image_embeds, deepstack = model.model.get_image_features(pixel_values, grid)
    ids = torch.tensor([prompt], dtype=torch.long)
    position_ids, rope_delta = model.model.get_rope_index(ids, grid, None, attention_mask=torch.ones_like(ids))
    return dict(vision_embeds=torch.cat(image_embeds).float(),
                deepstack=torch.stack(list(deepstack)).float(),
                position_ids=position_ids[:, 0, :].tolist(), rope_delta=int(rope_delta.item()))


def top2_margins(logits):
    top2 = torch.topk(logits, 2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


def try_seed(case, seed, workdir):
    config, cls = build_config(case)
    torch.manual_seed(seed)
    model = cls(config).eval()
    gen = torch.Generator().manual_seed(seed)
    widen(model, gen)
    vl = case["kind"].startswith("qwen3_vl")
    if vl:
        prompt = vl_prompt(case, gen)
        t, h, w = VL_GRID
        pixel_values = torch.randn((t * h * w, 3 * VL_TEMPORAL * VL_PATCH * VL_PATCH), generator=gen)
        grid = torch.tensor([list(VL_GRID)])
    else:
        prompt = torch.randint(0, case["vocab_size"] - 1, (case["prompt_len"],), generator=gen).tolist()

    if os.path.isdir(workdir):
        shutil.rmtree(workdir)
    model.to(torch.bfloat16).save_pretrained(workdir, safe_serialization=True)
    reloaded = cls.from_pretrained(workdir, dtype=torch.float32, attn_implementation="eager").eval()
    extras = None
    if vl:
        generated, logits = greedy_decode_vl(reloaded, prompt, pixel_values, grid, case["n_steps"])
        extras = vl_extras(reloaded, prompt, pixel_values, grid)
        extras["pixel_values"] = pixel_values
    else:
        generated, logits = greedy_decode(reloaded, prompt, case["n_steps"])
    return prompt, generated, logits, top2_margins(logits), extras


def write_case(case, out_root):
    final = os.path.join(out_root, case["name"])
    work = final + ".tmp"
    for attempt in range(MAX_SEED_TRIES):
        seed = case["seed"] + attempt
        prompt, generated, logits, margins, extras = try_seed(case, seed, work)
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
    if extras is not None:
        golden["vision"] = dict(
            image_grid_thw=[list(VL_GRID)], pixel_values_file="pixel_values.f32",
            pixel_values_shape=list(extras["pixel_values"].shape),
            vision_embeds_file="vision_embeds.f32",
            vision_embeds_shape=list(extras["vision_embeds"].shape),
            deepstack_file="deepstack.f32", deepstack_shape=list(extras["deepstack"].shape),
            position_ids=extras["position_ids"], rope_delta=extras["rope_delta"], **VL_TOKENS)
        extras["pixel_values"].numpy().astype("<f4").tofile(os.path.join(work, "pixel_values.f32"))
        extras["vision_embeds"].numpy().astype("<f4").tofile(os.path.join(work, "vision_embeds.f32"))
        extras["deepstack"].numpy().astype("<f4").tofile(os.path.join(work, "deepstack.f32"))
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
