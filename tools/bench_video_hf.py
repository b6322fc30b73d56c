#!/usr/bin/env python3
"""The peer row of `./strata bench vision`'s video part: transformers' Qwen3-VL video processor
(torchcodec decoding, exact seek mode, as apply_chat_template runs it) on the same file with the
same configuration (the class defaults, or --config video_preprocessor_config.json), timed like
Strata's decode + sample + preprocess: the median of --repeat calls, one torch thread.

Usage: bench_video_hf.py FILE [--config JSON] [--repeat R]   (in the golden venv: tools/venv.sh)
"""
import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--config")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    import torchcodec.decoders as tcd
    cls = tcd.VideoDecoder

    class CpuDefault(cls):  # transformers 4.57.1 passes device=None, torchcodec 0.8 wants a str
        def __init__(self, *args, device=None, **kw):
            super().__init__(*args, device="cpu" if device is None else device, **kw)

    tcd.VideoDecoder = CpuDefault
    proc = Qwen3VLVideoProcessor(**(json.load(open(a.config)) if a.config else {}))
    times, out = [], None
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        out = proc(videos=[a.file], return_tensors="pt")
        times.append(time.perf_counter() - t0)
    grid = out["video_grid_thw"][0].tolist()
    print(f"transformers {transformers.__version__} Qwen3VLVideoProcessor (torchcodec, 1 torch "
          f"thread): decode + sample + preprocess {1e3 * statistics.median(times):.1f} ms "
          f"(median of {a.repeat}), grid {grid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
