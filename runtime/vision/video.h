/* Video decoding: a container in memory -> the RGB u8 frames at chosen indices, as transformers'
 * Qwen3-VL video processor receives them from torchcodec ("exact" seek mode), with FFmpeg's own
 * libraries (libavformat, libavcodec, libswscale; docs/qwen3-vl-video.md).
 *
 * What torchcodec does and this module does the same way:
 *   - a scan reads every packet of the best video stream (no decoding): the frame count is the
 *     number of packets, and the stream's begin / end are the smallest pts and the largest
 *     pts + duration (dts when a packet has no pts), in seconds as pts * num / den;
 *   - average fps = frames / (end - begin), where begin and end have first been printed with
 *     six decimals and read back (torchcodec hands its metadata to Python as text), so a WebM
 *     at a nominal 6 fps can measure 6.0015;
 *   - frame i is the i-th frame in pts order: decoding goes forward and the first frame whose
 *     pts is at or past frame i's pts is frame i;
 *   - YUV -> RGB24 by libswscale with SWS_BILINEAR and the frame's own colour matrix
 *     (sws_getCoefficients(frame->colorspace): BT.709 material is converted as BT.709); for a
 *     width that is not a multiple of 32 torchcodec goes through FFmpeg's "scale" filter
 *     instead, which also takes the frame's range (full / limited) when the frame states one.
 * A plain float BT.601 formula would be off by up to 3 levels, enough to move logits.
 *
 * Only MP4 / MOV and Matroska / WebM containers and H.264, HEVC, VP8, VP9 and AV1 streams are
 * accepted (the demuxer and decoder names are checked before any frame is decoded): a small
 * attack surface, and what cameras, phones and browsers produce. Failures never crash and
 * never print (FFmpeg's log is silenced): a truncated, corrupt or unsupported file, a frame
 * size or frame count over the limits (from the headers and the scan, before decoding) return
 * a negative STRATA_E* status with a message in strata_last_error(). */
#ifndef STRATA_RUNTIME_VISION_VIDEO_H
#define STRATA_RUNTIME_VISION_VIDEO_H

#include <stddef.h>
#include <stdint.h>

/* Defaults for struct video_limits fields left at 0. */
#define VIDEO_DEFAULT_MAX_FRAME_PIXELS (7680LL * 4320LL) /* 8K UHD */
#define VIDEO_DEFAULT_MAX_FRAMES 108000LL                /* one hour at 30 fps */

struct video_limits {
    int64_t max_frame_pixels; /* width * height of a frame, from the stream header */
    int64_t max_frames;       /* packets in the video stream, from the scan */
    int threads;              /* decoder threads; 0 lets FFmpeg choose (the output is the same) */
};

/* What the scan found: torchcodec's exact-mode metadata. */
struct video_info {
    int width, height;  /* frame size (the stream's coded parameters) */
    int64_t num_frames; /* packets of the video stream */
    double fps;         /* num_frames / (end_seconds - begin_seconds), see above */
    double begin_seconds, end_seconds;
    char container[32]; /* "mp4", "webm", ... (the demuxer's first name) */
    char codec[32];     /* "h264", "vp9", ... */
};

struct video; /* an opened, scanned stream */

/* Opens and scans `len` bytes of a video file. The bytes are read in place: keep them alive and
 * unchanged until video_close. `lim` may be NULL for the defaults. STRATA_EFORMAT: not a
 * supported container or codec, no video stream, malformed or empty; STRATA_ERANGE: over a
 * limit; STRATA_ENOMEM. */
int video_open(struct video **out, const void *data, size_t len, const struct video_limits *lim);

const struct video_info *video_get_info(const struct video *v);

/* Decodes the frames at `indices` [n] (non-decreasing, each in [0, num_frames)) into rgb
 * [n][height][width][3]. One forward pass over the stream. STRATA_EINVAL for bad indices,
 * STRATA_EFORMAT when decoding fails or the stream holds fewer decodable frames than its
 * packets (the message names the frame), or a frame's size differs from the stream's. */
int video_decode_frames(struct video *v, const int64_t *indices, int n, uint8_t *rgb);

/* The same, one frame at a time: on_frame(ctx, i, rgb) gets the frame for indices[i] as
 * [height][width][3] (valid during the call), so a caller that resizes at once never holds the
 * full-size frames. A non-zero return stops decoding and is returned. */
typedef int (*video_frame_fn)(void *ctx, int i, const uint8_t *rgb);
int video_decode_each(struct video *v, const int64_t *indices, int n, video_frame_fn on_frame,
                      void *ctx);

void video_close(struct video *v); /* NULL is fine */

/* The format named by the first bytes: 1 for an ISO-BMFF ("ftyp" box: MP4 / MOV), 2 for
 * EBML (Matroska / WebM), 0 otherwise. A cheap check before a file is handed to video_open. */
int video_detect_container(const void *data, size_t len);

#endif
