/* libFuzzer over the video path Strata owns around FFmpeg: the in-memory I/O callbacks, the
 * demuxer / decoder whitelist, the scan (frame count, fps), frame sampling, decoding the
 * sampled frames and their conversion to RGB, and for small frames the whole preprocessing
 * chain. Seeds (fuzz_corpus/video): 32x32, 6-frame H.264 / HEVC MP4s (one full range), a VP8
 * and a VP9 WebM and an AV1 Matroska, written with the ffmpeg command line. The limits are
 * lowered so a forged header cannot make a run allocate gigabytes or decode for long. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/vision/video.h"
#include "runtime/vision/video_preprocess.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct video_limits lim = {
        .max_frame_pixels = (int64_t)1 << 16, .max_frames = 512, .threads = 1};
    struct video *v = NULL;
    if (video_open(&v, data, size, &lim) != 0) return 0;
    const struct video_info *in = video_get_info(v);
    struct vision_video_config cfg = vision_video_config_defaults();
    cfg.pp.patch_size = 4; /* factor 8: the seeds' 32x32 frames pass smart_resize */
    cfg.pp.min_pixels = 256;
    cfg.pp.max_pixels = 16384;
    cfg.max_frames = 8;
    int n = vision_video_sample_count(&cfg, in->num_frames, in->fps);
    int64_t idx[8];
    size_t frame = (size_t)in->width * (size_t)in->height * 3;
    uint8_t *rgb = n >= 1 && n <= 8 ? malloc(frame * (size_t)n) : NULL;
    if (rgb) {
        vision_video_sample_indices(idx, n, in->num_frames);
        if (video_decode_frames(v, idx, n, rgb) == 0 && frame <= 3 * 4096) {
            struct vision_video vv = {0};
            if (vision_preprocess_video(&vv, &cfg, rgb, n, in->width, in->height) == 0)
                free(vv.pixel_values);
        }
        free(rgb);
    }
    video_close(v);
    return 0;
}
