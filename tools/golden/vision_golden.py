#!/usr/bin/env python3
"""Golden Qwen3-VL image decoding + preprocessing for runtime/vision (optional recorder).

Writes a few small deterministic images with Pillow (PNG: L, LA, P + tRNS, RGB, RGBA, I;16;
JPEG: baseline, progressive, gray, CMYK) into --images, then for each one writes a JSON line:
  {"name", "file",
   "rgb_composite": {"width", "height", "sha256"},   # transformers 5 convert_to_rgb (§3)
   "rgb_drop":      {"width", "height", "sha256"},   # transformers 4.57 img.convert("RGB")
   "resized": [h, w], "grid_thw": [t, h, w],
   "sum": f64 sum of pixel_values, "sha256": of the f32 little-endian bytes,
   "row0": pixel_values[0][:8]}
pixel_values come from the default fast image processor (torchvision on CPU) with
Qwen3-VL's preprocessor_config values, fed the composited RGB u8 array, so the C side checks
image_decode_memory (both alpha modes) and vision_preprocess against the same file. Line 1 is
a header with the library versions. References: shared spec qwen3-vl-preprocessing.md §2–§7.

Usage: python tools/golden/vision_golden.py --images DIR --out FILE.jsonl
Needs transformers (4.57.1 or 5.x), torch, torchvision, Pillow and numpy; it is not part of
tools/requirements.txt nor of regenerate.sh yet (torchvision and Pillow are not pinned there).
"""
import argparse
import hashlib
import json
import os

import numpy as np
import PIL
import torch
import transformers
from PIL import Image

try:  # 4.57: the fast (torchvision) class; 5.x: one class, torchvision backend by default
    from transformers import Qwen2VLImageProcessorFast as FastProcessor
except ImportError:
    from transformers import Qwen2VLImageProcessor as FastProcessor

QWEN3_VL = dict(size={"shortest_edge": 65536, "longest_edge": 16777216}, patch_size=16,
                temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5],
                image_std=[0.5, 0.5, 0.5])


def pattern(w, h):
    """Spec §10.3's p(x,y,c) = (37x + 91y + 53c + 11((x*y) mod 7)) mod 256, as HxWx3 u8."""
    y, x = np.mgrid[0:h, 0:w]
    planes = [(37 * x + 91 * y + 53 * c + 11 * ((x * y) % 7)) % 256 for c in range(3)]
    return np.stack(planes, axis=-1).astype(np.uint8)


def make_images(out_dir):
    """Deterministic inputs, a few KB each; returns [(name, path)]."""
    os.makedirs(out_dir, exist_ok=True)
    rgb = pattern(61, 47)
    alpha = ((np.arange(61)[None, :] * 5 + np.arange(47)[:, None] * 3) % 256).astype(np.uint8)
    imgs = {
        "gray8.png": Image.fromarray(rgb[:, :, 0], "L"),
        "gray_alpha.png": Image.fromarray(np.stack([rgb[:, :, 1], alpha], -1), "LA"),
        "rgb8.png": Image.fromarray(rgb, "RGB"),
        "rgba8.png": Image.fromarray(np.concatenate([rgb, alpha[:, :, None]], -1), "RGBA"),
        "gray16.png": Image.fromarray((rgb[:, :, 2].astype(np.uint16) * 3), "I;16"),
    }
    pal = Image.fromarray(rgb, "RGB").quantize(colors=16, dither=Image.Dither.NONE)
    pal.info["transparency"] = 3
    imgs["palette_trns.png"] = pal
    files = []
    for name, im in imgs.items():
        path = os.path.join(out_dir, name)
        if "transparency" in im.info:
            im.save(path, transparency=im.info["transparency"])
        else:
            im.save(path)
        files.append((name, path))
    base = Image.fromarray(rgb, "RGB")
    for name, kw in [("baseline.jpg", {}), ("progressive.jpg", {"progressive": True})]:
        path = os.path.join(out_dir, name)
        base.save(path, quality=90, **kw)
        files.append((name, path))
    for name, im in [("gray.jpg", base.convert("L")), ("cmyk.jpg", base.convert("CMYK"))]:
        path = os.path.join(out_dir, name)
        im.save(path, quality=90)
        files.append((name, path))
    return files


def rgb_composite(im):
    """transformers 5 image_transforms.convert_to_rgb on a PIL image (spec §3)."""
    if "A" in im.getbands() or "transparency" in im.info:
        im = im.convert("RGBA")
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, im).convert("RGB")
    return im.convert("RGB")


def describe(arr):
    return {"width": int(arr.shape[1]), "height": int(arr.shape[0]),
            "sha256": hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()}


def record(proc, name, path):
    im = Image.open(path)
    im.load()
    comp = np.asarray(rgb_composite(im), dtype=np.uint8)
    drop = np.asarray(im.convert("RGB"), dtype=np.uint8)
    out = proc(images=[comp], return_tensors="pt")
    pv = out["pixel_values"].to(torch.float32).contiguous()
    grid = [int(v) for v in out["image_grid_thw"][0]]
    return {"name": name, "file": os.path.basename(path), "rgb_composite": describe(comp),
            "rgb_drop": describe(drop), "resized": [grid[1] * 16, grid[2] * 16],
            "grid_thw": grid, "sum": float(pv.double().sum()),
            "sha256": hashlib.sha256(pv.numpy().astype("<f4").tobytes()).hexdigest(),
            "row0": [float(v) for v in pv[0, :8]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", required=True, help="directory the inputs are written to")
    ap.add_argument("--out", required=True, help="JSONL output")
    args = ap.parse_args()
    proc = FastProcessor(**QWEN3_VL)
    with open(args.out, "w") as f:
        f.write(json.dumps({"header": True, "transformers": transformers.__version__,
                            "torch": torch.__version__, "pillow": PIL.__version__,
                            "processor": type(proc).__name__}) + "\n")
        for name, path in make_images(args.images):
            f.write(json.dumps(record(proc, name, path)) + "\n")


if __name__ == "__main__":
    main()
