#!/usr/bin/env python3
"""End-to-end Qwen3-VL goldens from image files (tests/golden/<case>/e2e/), made by HF itself.

For each VL golden checkpoint (tests/golden/qwen3_vl, qwen3_vl_moe: tiny random bf16 weights
written by generate.py, vision tower included) this script
  1. writes `preprocessor_config.json` into the checkpoint directory (patch 4, merge 2,
     temporal 2, a small pixel budget and CLIP's mean/std, so the file's values matter),
  2. writes small committed image files into <case>/e2e/ once (PNG and JPEG; kept when present,
     so a Pillow upgrade does not change the inputs),
  3. runs HF's default image processor (AutoImageProcessor = the fast, torchvision processor)
     on the files opened with PIL, and the slow (PIL) processor for the record,
  4. builds a token-id prompt with ONE image_token_id per image (what a Strata user sends),
     expands it exactly as Qwen3VLProcessor does (t*h*w/merge^2 pads per image),
  5. decodes greedily with HF `generate` (fp32, eager), keeping the raw logits of every step,
  6. records the vision tower's outputs (merger + DeepStack) and get_rope_index's positions.

Output <case>/e2e/: image files, e2e.json (below), pixel_values_fast.f32, pixel_values_slow.f32,
vision_embeds.f32, deepstack.f32, logits.f32 (all float32 little-endian).
e2e.json: images [{file, size [w,h], grid_thw, resized [h,w]}], prompt_ids (one image token per
image), expanded_ids, generated_ids, n_steps, vocab_size, margins, min_margin, position_ids [3][n],
rope_delta, shapes, versions.

Usage: python tools/golden/vl_image_golden.py --golden tests/golden [--only CASE ...]
Deterministic: fixed seeds, one torch thread. Needs tools/requirements.txt (torchvision, Pillow).
"""
import argparse
import json
import os
import sys

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image
from transformers import (AutoImageProcessor, GenerationConfig, Qwen2VLImageProcessor,
                          Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration)

MIN_MARGIN = 0.05
MAX_SEED_TRIES = 64

# A tiny budget for the tiny vision tower (factor = patch 4 * merge 2 = 8): 256..1024 pixels, so
# the images below are downscaled, kept or upscaled by smart_resize (spec §4).
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1.0 / 255,
    "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True,
    "patch_size": 4, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 256, "longest_edge": 1024},
    # 4.5x-era files also carry these; transformers 4.57.1's slow processor needs them: its
    # __init__ replaces any valid `size` with its class default (the `else` of its key check).
    "min_pixels": 256, "max_pixels": 1024,
}

# (file, mode, w, h, save kwargs) per case: downscaled RGB PNG + baseline JPEG in portrait for
# the dense case; an upscaled progressive JPEG + a gray PNG kept at its size for the MoE case.
CASES = {
    "qwen3_vl": dict(cls=Qwen3VLForConditionalGeneration, seed=9000, n_steps=24, images=[
        ("image0.png", "RGB", 45, 31, {}),
        ("image1.jpg", "RGB", 30, 44, {"quality": 90})]),
    "qwen3_vl_moe": dict(cls=Qwen3VLMoeForConditionalGeneration, seed=9100, n_steps=24, images=[
        ("image0.jpg", "RGB", 11, 9, {"quality": 85, "progressive": True}),
        ("image1.png", "L", 40, 20, {})]),
}
TOKENS = dict(image=500, video=501, start=502, end=503)


def picture(w, h, salt):
    """A smooth gradient plus spec §10.3's pattern, so resizing has edges and slopes to mix."""
    y, x = np.mgrid[0:h, 0:w]
    planes = []
    for c in range(3):
        smooth = (255 * (x * (c + 1) + y * (3 - c)) / ((w + h) * 3)).astype(np.int64)
        pat = (37 * x + 91 * y + 53 * c + 11 * ((x * y) % 7) + salt) % 64
        planes.append(np.clip(smooth + pat, 0, 255))
    return np.stack(planes, axis=-1).astype(np.uint8)


def ensure_images(case_dir, specs):
    paths = []
    for i, (name, mode, w, h, kw) in enumerate(specs):
        path = os.path.join(case_dir, name)
        if not os.path.exists(path):
            im = Image.fromarray(picture(w, h, 17 * i), "RGB")
            if mode != "RGB":
                im = im.convert(mode)
            im.save(path, **kw)
        paths.append(path)
    return paths


def open_rgb_inputs(paths):
    """PIL images as a user's code hands them to the processor (it converts to RGB itself)."""
    ims = []
    for p in paths:
        im = Image.open(p)
        im.load()
        ims.append(im)
    return ims


def prompt_for(gen, n_images):
    """text(3) [start image end text(2)] * n: one image token per image, as users send ids."""
    ids = torch.randint(0, 500, (3 + 2 * n_images,), generator=gen).tolist()
    prompt = ids[:3]
    for i in range(n_images):
        prompt += [TOKENS["start"], TOKENS["image"], TOKENS["end"]] + ids[3 + 2 * i: 5 + 2 * i]
    return prompt


def expand(prompt, grids, merge):
    """Qwen3VLProcessor's expansion: each image token becomes t*h*w/merge^2 image tokens."""
    out, k = [], 0
    for t in prompt:
        if t == TOKENS["image"]:
            g = grids[k]
            out += [TOKENS["image"]] * int(g[0] * g[1] * g[2] // (merge * merge))
            k += 1
        else:
            out.append(t)
    assert k == len(grids)
    return out


@torch.no_grad()
def run(model, expanded, pixel_values, grid, n_steps):
    ids = torch.tensor([expanded], dtype=torch.long)
    mask = torch.ones_like(ids)
    gcfg = GenerationConfig(do_sample=False, max_new_tokens=n_steps, min_new_tokens=0,
                            eos_token_id=None, pad_token_id=0)
    out = model.generate(input_ids=ids, attention_mask=mask, pixel_values=pixel_values,
                         image_grid_thw=grid, generation_config=gcfg, output_logits=True,
                         return_dict_in_generate=True)
    generated = out.sequences[0, len(expanded):].tolist()
    assert len(generated) == n_steps, "generate stopped early (an eos id was chosen)"
    logits = torch.stack([lg[0].float() for lg in out.logits])
    assert generated == torch.argmax(logits, -1).tolist(), "generate disagrees with its own logits"
    embeds, deepstack = model.model.get_image_features(pixel_values, grid)
    position_ids, delta = model.model.get_rope_index(ids, grid, None, attention_mask=mask)
    return generated, logits, torch.cat(embeds).float(), torch.stack(list(deepstack)).float(), \
        position_ids[:, 0, :].tolist(), int(delta.item())


def write_case(golden_root, name, spec):
    case_dir = os.path.join(golden_root, name)
    with open(os.path.join(case_dir, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f, indent=2)
        f.write("\n")
    e2e = os.path.join(case_dir, "e2e")
    os.makedirs(e2e, exist_ok=True)
    paths = ensure_images(e2e, spec["images"])
    fast = AutoImageProcessor.from_pretrained(case_dir)
    slow = AutoImageProcessor.from_pretrained(case_dir, use_fast=False)
    assert type(fast).__name__.endswith("Fast"), type(fast).__name__
    assert isinstance(slow, Qwen2VLImageProcessor), type(slow).__name__
    f_out = fast(images=open_rgb_inputs(paths), return_tensors="pt")
    s_out = slow(images=open_rgb_inputs(paths), return_tensors="pt")
    pv = f_out["pixel_values"].float().contiguous()
    grid = f_out["image_grid_thw"]
    assert torch.equal(grid, s_out["image_grid_thw"])
    grids = grid.tolist()
    model = spec["cls"].from_pretrained(case_dir, dtype=torch.float32, attn_implementation="eager").eval()
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt
        prompt = prompt_for(torch.Generator().manual_seed(seed), len(paths))
        expanded = expand(prompt, grids, PREPROCESSOR["merge_size"])
        generated, logits, embeds, deepstack, pos, delta = run(model, expanded, pv, grid, spec["n_steps"])
        top2 = torch.topk(logits, 2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        if min(margins) >= MIN_MARGIN and len(set(generated)) >= max(4, len(generated) // 4):
            break
        print(f"  {name}: seed {seed} rejected (min margin {min(margins):.4f})")
    else:
        raise SystemExit(f"{name}: no seed reached margin {MIN_MARGIN}")
    pv.numpy().astype("<f4").tofile(os.path.join(e2e, "pixel_values_fast.f32"))
    s_out["pixel_values"].float().numpy().astype("<f4").tofile(os.path.join(e2e, "pixel_values_slow.f32"))
    embeds.numpy().astype("<f4").tofile(os.path.join(e2e, "vision_embeds.f32"))
    deepstack.numpy().astype("<f4").tofile(os.path.join(e2e, "deepstack.f32"))
    logits.numpy().astype("<f4").tofile(os.path.join(e2e, "logits.f32"))
    images = []
    for p, g, (_, _, w, h, _) in zip(paths, grids, spec["images"]):
        images.append(dict(file=os.path.basename(p), size=[w, h], grid_thw=g,
                           resized=[g[1] * PREPROCESSOR["patch_size"], g[2] * PREPROCESSOR["patch_size"]]))
    doc = dict(case=name, seed=seed, images=images, prompt_ids=prompt, expanded_ids=expanded,
               generated_ids=generated, n_steps=len(generated), vocab_size=int(logits.shape[1]),
               min_margin=min(margins), margins=[round(m, 6) for m in margins],
               position_ids=pos, rope_delta=delta,
               pixel_values_shape=list(pv.shape), vision_embeds_shape=list(embeds.shape),
               deepstack_shape=list(deepstack.shape), logits_shape=list(logits.shape),
               image_token_id=TOKENS["image"], vision_start_token_id=TOKENS["start"],
               vision_end_token_id=TOKENS["end"],
               reference=dict(torch=torch.__version__.split("+")[0], torchvision=torchvision.__version__.split("+")[0],
                              transformers=transformers.__version__, pillow=PIL.__version__,
                              processor=type(fast).__name__, dtype="float32", attn_implementation="eager",
                              decode="HF generate, greedy, raw logits per step"))
    with open(os.path.join(e2e, "e2e.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{name}: seed {seed}, grids {grids}, prompt {len(prompt)} -> {len(expanded)} ids, "
          f"min margin {min(margins):.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golden", required=True, help="golden root, normally tests/golden")
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name, spec in CASES.items():
        if args.only and name not in args.only:
            continue
        write_case(args.golden, name, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
