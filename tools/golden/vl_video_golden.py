#!/usr/bin/env python3
"""Qwen3-VL video goldens from committed video files (tests/golden/<case>/video/), made by HF itself.

For each VL golden checkpoint (tests/golden/qwen3_vl, qwen3_vl_moe: tiny random bf16 weights
written by generate.py, vision tower included) this script
  1. writes `video_preprocessor_config.json` into the checkpoint directory (patch 4, merge 2,
     temporal 2, fps 2, min 4 frames, a small pixel budget and CLIP's mean/std, so every field
     matters),
  2. writes short video files into <case>/video/ once with the `ffmpeg` command line (H.264 in
     MP4 tagged BT.709, a width that is a multiple of 32; VP9 in WebM, a width that is not, so
     both of torchcodec's colour-conversion paths are exercised; kept when present, so an
     encoder upgrade does not change the inputs), and a byte-level tokenizer inside the model's
     512-id vocabulary (tests/pipeline/vl_chat_tokenizer.py's recipe) for the timestamp text,
  3. runs transformers' Qwen3VLProcessor on a chat-style text with one
     <|vision_start|><|video_pad|><|vision_end|> per video (and an image for the mixed case):
     the video processor decodes the files through torchcodec (exact seek mode), samples
     frames at `fps`, resizes, normalises and patchifies them, and the processor expands the
     prompt with "<t seconds>" per temporal patch,
  4. decodes greedily with HF `generate` (fp32, eager), keeping the raw logits of every step.

Output <case>/video/: the video files, tokenizer.json, tokenizer_config.json, video.json (below),
frames_<i>.u8 (torchcodec's RGB frames at the sampled indices, [n][h][w][3]),
pixel_values_videos.f32, logits.f32 (float32 little-endian).
video.json: videos [{file, size [w,h], num_frames, fps, indices, timestamps, grid_thw}],
images [...] (mixed case), text, prompt_ids (the text tokenized, one video pad per video),
expanded_ids (HF's input_ids), generated_ids, margins, versions.

Usage: python tools/golden/vl_video_golden.py --golden tests/golden [--only CASE ...]
Deterministic: fixed seeds, one torch thread. Needs tools/requirements.txt (torchcodec, av) and
the `ffmpeg` command (Debian's, with libx264 and libvpx) only to write missing video files.
"""
import argparse
import json
import os
import subprocess
import sys

import av
import numpy as np
import torch
import torchcodec
import transformers
from PIL import Image
from torchcodec.decoders import VideoDecoder
from transformers import (AutoImageProcessor, GenerationConfig, Qwen2TokenizerFast,
                          Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration,
                          Qwen3VLProcessor)
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
QWEN3_TOKENIZER = os.path.join(ROOT, "tests/runtime/text/testdata/qwen3-tokenizer/tokenizer.json")
MIN_MARGIN = 0.05
MAX_SEED_TRIES = 64

# factor = patch 4 * merge 2 = 8. The budget counts frames too (smart_resize for video): the MP4
# (6 sampled frames of 64x48) is downscaled, the WebM (5 frames of 40x30) kept near its size.
VIDEO_PREPROCESSOR = {
    "video_processor_type": "Qwen3VLVideoProcessor",
    "processor_class": "Qwen3VLProcessor",
    "do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1.0 / 255,
    "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True,
    "patch_size": 4, "temporal_patch_size": 2, "merge_size": 2,
    "fps": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": True,
    "size": {"shortest_edge": 1024, "longest_edge": 6144},
}

# name -> (width, height, frames, rate, ffmpeg encoder arguments)
VIDEOS = {
    "clip0.mp4": (64, 48, 36, 12, ["-c:v", "libx264", "-preset", "medium", "-crf", "18",
                                   "-pix_fmt", "yuv420p", "-colorspace", "bt709",
                                   "-color_primaries", "bt709", "-color_trc", "bt709",
                                   "-movflags", "+faststart"]),
    "clip1.webm": (40, 30, 16, 6, ["-c:v", "libvpx-vp9", "-b:v", "0", "-crf", "20",
                                   "-pix_fmt", "yuv420p", "-deadline", "good", "-cpu-used", "4"]),
}

CASES = {
    "qwen3_vl": dict(cls=Qwen3VLForConditionalGeneration, seed=9200, n_steps=16,
                     videos=["clip0.mp4"], images=[], label=False),
    # mixed: an image (the image golden's file) before the video, "Picture 1: " / "Video 1: "
    # labels, so the first timestamp's text joins the label's trailing space in one pre-token
    "qwen3_vl_moe": dict(cls=Qwen3VLMoeForConditionalGeneration, seed=9300, n_steps=16,
                         videos=["clip1.webm"], images=["../e2e/image0.jpg"], label=True),
}


def torchcodec_cpu_default():
    """transformers 4.57.1's read_video_torchcodec passes device=kwargs.get("device"), i.e. None
    through the processor, and torchcodec 0.8 (the release for torch 2.9) refuses None where 0.7
    took it as the CPU. Only that argument is mended: None means "cpu", as it did."""
    import transformers.video_utils as vu
    import torchcodec.decoders as tcd
    cls = tcd.VideoDecoder

    class CpuDefault(cls):
        def __init__(self, *a, device=None, **kw):
            super().__init__(*a, device="cpu" if device is None else device, **kw)

    tcd.VideoDecoder = CpuDefault
    assert vu.is_torchcodec_available()


def frame_picture(w, h, k):
    """A moving gradient with a sharp pattern, so frames differ and chroma has edges."""
    y, x = np.mgrid[0:h, 0:w]
    planes = []
    for c in range(3):
        smooth = (255 * ((x + 3 * k) * (c + 1) + y * (3 - c)) / ((w + h + 9 * k) * 3)).astype(np.int64)
        pat = (29 * x + 71 * y + 53 * c + 17 * k + 11 * ((x * y + k) % 5)) % 96
        planes.append(np.clip(smooth + pat, 0, 255))
    return np.stack(planes, axis=-1).astype(np.uint8)


def ensure_video(path, spec):
    if os.path.exists(path):
        return
    w, h, n, rate, enc = spec
    raw = b"".join(frame_picture(w, h, k).tobytes() for k in range(n))
    cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24",
           "-s", f"{w}x{h}", "-r", str(rate), "-i", "-"] + enc + ["-an", "-map_metadata", "-1",
                                                                  "-fflags", "+bitexact", path]
    subprocess.run(cmd, input=raw, check=True)


def write_tokenizer(out_dir):
    """The real Qwen3 tokenizer squeezed into the golden model's 512 ids (256 byte tokens, the
    first merges that fit, specials at 500..511): tests/pipeline/vl_chat_tokenizer.py's, run."""
    subprocess.run([sys.executable, os.path.join(ROOT, "tests/pipeline/vl_chat_tokenizer.py"),
                    QWEN3_TOKENIZER, out_dir], check=True)
    return Qwen2TokenizerFast(tokenizer_file=os.path.join(out_dir, "tokenizer.json"),
                              eos_token="<|im_end|>")


def text_for(spec, gen):
    """A user turn: [Picture 1: image] [Video 1: ]video, then random words (the seed's)."""
    words = ["".join(chr(97 + int(c)) for c in torch.randint(0, 26, (int(n),), generator=gen))
             for n in torch.randint(2, 7, (4,), generator=gen)]
    body = ""
    for i, _ in enumerate(spec["images"]):
        body += (f"Picture {i + 1}: " if spec["label"] else "") + \
            "<|vision_start|><|image_pad|><|vision_end|>"
    for i, _ in enumerate(spec["videos"]):
        body += (f"Video {i + 1}: " if spec["label"] else "") + \
            "<|vision_start|><|video_pad|><|vision_end|>"
    return "<|im_start|>user\n" + body + " ".join(words) + "<|im_end|>\n<|im_start|>assistant\n"


def torchcodec_frames(path, indices):
    dec = VideoDecoder(path, seek_mode="exact")
    frames = dec.get_frames_at(indices=list(indices)).data  # [n, 3, h, w] uint8
    return frames.permute(0, 2, 3, 1).contiguous().numpy(), dec.metadata


def pyav_frames(path, indices):
    with av.open(path) as c:
        all_frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    return np.stack([all_frames[i] for i in indices])


@torch.no_grad()
def run(model, inputs, n_steps):
    gcfg = GenerationConfig(do_sample=False, max_new_tokens=n_steps, min_new_tokens=0,
                            eos_token_id=None, pad_token_id=0)
    out = model.generate(**inputs, generation_config=gcfg, output_logits=True,
                         return_dict_in_generate=True)
    n = inputs["input_ids"].shape[1]
    generated = out.sequences[0, n:].tolist()
    assert len(generated) == n_steps, "generate stopped early"
    logits = torch.stack([lg[0].float() for lg in out.logits])
    assert generated == torch.argmax(logits, -1).tolist(), "generate disagrees with its own logits"
    return generated, logits


def write_case(golden_root, name, spec):
    case_dir = os.path.join(golden_root, name)
    with open(os.path.join(case_dir, "video_preprocessor_config.json"), "w") as f:
        json.dump(VIDEO_PREPROCESSOR, f, indent=2)
        f.write("\n")
    vdir = os.path.join(case_dir, "video")
    os.makedirs(vdir, exist_ok=True)
    paths = []
    for v in spec["videos"]:
        paths.append(os.path.join(vdir, v))
        ensure_video(paths[-1], VIDEOS[v])
    tok = write_tokenizer(vdir)
    vproc = Qwen3VLVideoProcessor.from_pretrained(case_dir)
    proc = Qwen3VLProcessor(image_processor=AutoImageProcessor.from_pretrained(case_dir),
                            tokenizer=tok, video_processor=vproc)
    images = [Image.open(os.path.join(vdir, p)) for p in spec["images"]]
    for im in images:
        im.load()
    # What the video processor decoded and sampled (same calls as inside the processor).
    meta = vproc(videos=paths, return_metadata=True)["video_metadata"]
    model = spec["cls"].from_pretrained(case_dir, dtype=torch.float32, attn_implementation="eager").eval()
    for attempt in range(MAX_SEED_TRIES):
        seed = spec["seed"] + attempt
        text = text_for(spec, torch.Generator().manual_seed(seed))
        inputs = proc(text=[text], images=images or None, videos=paths, return_tensors="pt")
        generated, logits = run(model, inputs, spec["n_steps"])
        top2 = torch.topk(logits, 2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()
        if min(margins) >= MIN_MARGIN and len(set(generated)) >= max(4, len(generated) // 4):
            break
        print(f"  {name}: seed {seed} rejected (min margin {min(margins):.4f})")
    else:
        raise SystemExit(f"{name}: no seed reached margin {MIN_MARGIN}")
    grids = inputs["video_grid_thw"].tolist()
    videos = []
    for i, (p, m, g) in enumerate(zip(paths, meta, grids)):
        idx = [int(k) for k in m.frames_indices]
        frames, tc_meta = torchcodec_frames(p, idx)
        same = bool(np.array_equal(frames, pyav_frames(p, idx)))
        frames.tofile(os.path.join(vdir, f"frames_{i}.u8"))
        ts = proc._calculate_timestamps(list(idx), m.fps, vproc.merge_size)
        w, h = VIDEOS[os.path.basename(p)][:2]
        videos.append(dict(file=os.path.basename(p), size=[w, h], num_frames=int(m.total_num_frames),
                           fps=float(m.fps), fps_repr=repr(float(m.fps)), indices=idx,
                           timestamps=[f"<{t:.1f} seconds>" for t in ts], grid_thw=g,
                           resized=[g[1] * VIDEO_PREPROCESSOR["patch_size"], g[2] * VIDEO_PREPROCESSOR["patch_size"]],
                           frames_file=f"frames_{i}.u8", frames_shape=list(frames.shape),
                           pyav_frames_equal=same,
                           begin_seconds=tc_meta.begin_stream_seconds_from_content,
                           end_seconds=tc_meta.end_stream_seconds_from_content))
    pv = inputs["pixel_values_videos"].float().contiguous()
    pv.numpy().astype("<f4").tofile(os.path.join(vdir, "pixel_values_videos.f32"))
    logits.numpy().astype("<f4").tofile(os.path.join(vdir, "logits.f32"))
    prompt_ids = tok(text)["input_ids"]
    doc = dict(case=name, seed=seed, text=text, videos=videos,
               images=[dict(file=p, grid_thw=g) for p, g in
                       zip(spec["images"], inputs["image_grid_thw"].tolist() if images else [])],
               prompt_ids=prompt_ids, expanded_ids=inputs["input_ids"][0].tolist(),
               generated_ids=generated, n_steps=len(generated), vocab_size=int(logits.shape[1]),
               min_margin=min(margins), margins=[round(m, 6) for m in margins],
               pixel_values_videos_shape=list(pv.shape), logits_shape=list(logits.shape),
               video_token_id=501, image_token_id=500, vision_start_token_id=502,
               vision_end_token_id=503,
               reference=dict(torch=torch.__version__.split("+")[0], transformers=transformers.__version__,
                              torchcodec=torchcodec.__version__, av=av.__version__,
                              processor="Qwen3VLProcessor + Qwen3VLVideoProcessor (torchcodec, exact seek)",
                              dtype="float32", attn_implementation="eager",
                              decode="HF generate, greedy, raw logits per step"))
    with open(os.path.join(vdir, "video.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{name}: seed {seed}, video grids {grids}, fps {[v['fps'] for v in videos]}, "
          f"prompt {len(prompt_ids)} -> {len(doc['expanded_ids'])} ids, min margin {min(margins):.4f}, "
          f"pyav equal {[v['pyav_frames_equal'] for v in videos]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golden", required=True, help="golden root, normally tests/golden")
    ap.add_argument("--only", nargs="*", help="case names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torchcodec_cpu_default()
    for name, spec in CASES.items():
        if args.only and name not in args.only:
            continue
        write_case(args.golden, name, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
