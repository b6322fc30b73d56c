/* Video decoding with FFmpeg, frame for frame as torchcodec hands them to transformers (see
 * video.h and docs/qwen3-vl-video.md). */
#include "runtime/vision/video.h"

#include <dlfcn.h>
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/log.h>
#include <libswscale/swscale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

/* FFmpeg is opened at run time (the sonames of the headers this file was built against), not
 * linked: its libraries pull in every codec and container library of the distribution (over
 * 140 MB on Debian 12), which a process that never sees a video — a language stage, the GPU
 * bundle — should not carry. Its functions, with their own types, are resolved once; where the
 * libraries are missing video_open says so. */
#define FF_SONAME(lib, major) "lib" lib ".so." AV_STRINGIFY(major)
#define FF_FUNCTIONS(X)                                                                            \
    X(av_dict_free)                                                                                \
    X(av_dict_set)                                                                                 \
    X(av_find_best_stream)                                                                         \
    X(av_frame_alloc)                                                                              \
    X(av_frame_free)                                                                               \
    X(av_frame_unref)                                                                              \
    X(av_free)                                                                                     \
    X(av_freep)                                                                                    \
    X(av_get_pix_fmt_name)                                                                         \
    X(av_log_set_level)                                                                            \
    X(av_malloc)                                                                                   \
    X(av_packet_alloc)                                                                             \
    X(av_packet_free)                                                                              \
    X(av_packet_unref)                                                                             \
    X(av_read_frame)                                                                               \
    X(av_strerror)                                                                                 \
    X(avcodec_alloc_context3)                                                                      \
    X(avcodec_free_context)                                                                        \
    X(avcodec_get_name)                                                                            \
    X(avcodec_open2)                                                                               \
    X(avcodec_parameters_to_context)                                                               \
    X(avcodec_receive_frame)                                                                       \
    X(avcodec_send_packet)                                                                         \
    X(avformat_alloc_context)                                                                      \
    X(avformat_close_input)                                                                        \
    X(avformat_find_stream_info)                                                                   \
    X(avformat_free_context)                                                                       \
    X(avformat_open_input)                                                                         \
    X(avio_alloc_context)                                                                          \
    X(avio_context_free)                                                                           \
    X(sws_freeContext)                                                                             \
    X(sws_getCachedContext)                                                                        \
    X(sws_getCoefficients)                                                                         \
    X(sws_getColorspaceDetails)                                                                    \
    X(sws_scale)                                                                                   \
    X(sws_setColorspaceDetails)
static struct {
#define FF_POINTER(name) __typeof__(&name) name;
    FF_FUNCTIONS(FF_POINTER)
#undef FF_POINTER
} ff;
static pthread_once_t ff_once = PTHREAD_ONCE_INIT;
static char ff_missing[320]; /* why video cannot be decoded, "" once loaded */

static void ff_open(void) {
    static const char *const libs[] = {FF_SONAME("avutil", LIBAVUTIL_VERSION_MAJOR),
                                       FF_SONAME("avcodec", LIBAVCODEC_VERSION_MAJOR),
                                       FF_SONAME("avformat", LIBAVFORMAT_VERSION_MAJOR),
                                       FF_SONAME("swscale", LIBSWSCALE_VERSION_MAJOR)};
    void *handle[4];
    for (int i = 0; i < 4; i++)
        if (!(handle[i] = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL))) {
            snprintf(ff_missing, sizeof ff_missing,
                     "video decoding needs FFmpeg's %s (Debian: libavformat59, libavcodec59, "
                     "libavutil57, libswscale6): %s",
                     libs[i], dlerror());
            return;
        }
#define FF_RESOLVE(name)                                                                           \
    for (int i = 0; i < 4 && !ff.name; i++)                                                        \
        ff.name = (__typeof__(ff.name))dlsym(handle[i], #name);                                    \
    if (!ff.name && !ff_missing[0])                                                                \
        snprintf(ff_missing, sizeof ff_missing, "FFmpeg's libraries lack %s", #name);
    FF_FUNCTIONS(FF_RESOLVE)
#undef FF_RESOLVE
    /* errors reach the caller as statuses, never on stderr (set once: it is process-wide) */
    if (!ff_missing[0]) ff.av_log_set_level(AV_LOG_QUIET);
}

/* 0 when FFmpeg's functions are there; else the status, the reason in strata_last_error. */
static int ff_loaded(void) {
    pthread_once(&ff_once, ff_open);
    return ff_missing[0] ? strata_set_error(STRATA_ENOTFOUND, "%s", ff_missing) : 0;
}

/* From here on the calls go through the resolved pointers. */
#define FF_CALL(name) ff.name
#define av_dict_free FF_CALL(av_dict_free)
#define av_dict_set FF_CALL(av_dict_set)
#define av_find_best_stream FF_CALL(av_find_best_stream)
#define av_frame_alloc FF_CALL(av_frame_alloc)
#define av_frame_free FF_CALL(av_frame_free)
#define av_frame_unref FF_CALL(av_frame_unref)
#define av_free FF_CALL(av_free)
#define av_freep FF_CALL(av_freep)
#define av_get_pix_fmt_name FF_CALL(av_get_pix_fmt_name)
#define av_log_set_level FF_CALL(av_log_set_level)
#define av_malloc FF_CALL(av_malloc)
#define av_packet_alloc FF_CALL(av_packet_alloc)
#define av_packet_free FF_CALL(av_packet_free)
#define av_packet_unref FF_CALL(av_packet_unref)
#define av_read_frame FF_CALL(av_read_frame)
#define av_strerror FF_CALL(av_strerror)
#define avcodec_alloc_context3 FF_CALL(avcodec_alloc_context3)
#define avcodec_free_context FF_CALL(avcodec_free_context)
#define avcodec_get_name FF_CALL(avcodec_get_name)
#define avcodec_open2 FF_CALL(avcodec_open2)
#define avcodec_parameters_to_context FF_CALL(avcodec_parameters_to_context)
#define avcodec_receive_frame FF_CALL(avcodec_receive_frame)
#define avcodec_send_packet FF_CALL(avcodec_send_packet)
#define avformat_alloc_context FF_CALL(avformat_alloc_context)
#define avformat_close_input FF_CALL(avformat_close_input)
#define avformat_find_stream_info FF_CALL(avformat_find_stream_info)
#define avformat_free_context FF_CALL(avformat_free_context)
#define avformat_open_input FF_CALL(avformat_open_input)
#define avio_alloc_context FF_CALL(avio_alloc_context)
#define avio_context_free FF_CALL(avio_context_free)
#define sws_freeContext FF_CALL(sws_freeContext)
#define sws_getCachedContext FF_CALL(sws_getCachedContext)
#define sws_getCoefficients FF_CALL(sws_getCoefficients)
#define sws_getColorspaceDetails FF_CALL(sws_getColorspaceDetails)
#define sws_scale FF_CALL(sws_scale)
#define sws_setColorspaceDetails FF_CALL(sws_setColorspaceDetails)

#define VIDEO_IO_BUFFER 65536

/* The bytes being demuxed: libavformat reads them through callbacks (no file, no copy). */
struct mem_io {
    const uint8_t *data;
    size_t len, pos;
};

struct video {
    struct video_info info;
    struct video_limits lim;
    struct mem_io io;
    int64_t *pts; /* [num_frames], every packet's pts (dts when none), sorted */
    struct SwsContext *sws;
    uint8_t *line_buf; /* swscale's destination: padded rows (see to_rgb) */
    size_t line_stride;
};

static int mem_read(void *opaque, uint8_t *buf, int size) {
    struct mem_io *m = opaque;
    size_t left = m->len - m->pos;
    if (left == 0) return AVERROR_EOF;
    size_t n = (size_t)size < left ? (size_t)size : left;
    memcpy(buf, m->data + m->pos, n);
    m->pos += n;
    return (int)n;
}

static int64_t mem_seek(void *opaque, int64_t offset, int whence) {
    struct mem_io *m = opaque;
    int64_t base;
    switch (whence & ~AVSEEK_FORCE) {
    case AVSEEK_SIZE: return (int64_t)m->len;
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = (int64_t)m->pos; break;
    case SEEK_END: base = (int64_t)m->len; break;
    default: return AVERROR(EINVAL);
    }
    if (offset > (int64_t)m->len - base || base + offset < 0) return AVERROR(EINVAL);
    m->pos = (size_t)(base + offset);
    return (int64_t)m->pos;
}

static const char *av_msg(int err, char *buf, size_t n) {
    av_strerror(err, buf, n);
    return buf;
}

static int is_allowed_codec(enum AVCodecID id) {
    return id == AV_CODEC_ID_H264 || id == AV_CODEC_ID_HEVC || id == AV_CODEC_ID_VP8 ||
           id == AV_CODEC_ID_VP9 || id == AV_CODEC_ID_AV1;
}

/* The container's name: "mp4" for the ISO demuxer ("mov,mp4,m4a,..."); "webm" or "matroska"
 * for "matroska,webm" by the EBML header's DocType string, which sits in its first bytes. */
static void container_name(char *out, size_t n, const AVFormatContext *fc,
                           const struct mem_io *io) {
    const char *name = fc->iformat->name;
    if (!strncmp(name, "mov", 3))
        snprintf(out, n, "mp4");
    else if (!strncmp(name, "matroska", 8)) {
        size_t head = io->len < 64 ? io->len : 64;
        int webm = 0;
        for (size_t i = 0; i + 4 <= head && !webm; i++)
            webm = !memcmp(io->data + i, "webm", 4);
        snprintf(out, n, "%s", webm ? "webm" : "matroska");
    } else
        snprintf(out, n, "%.*s", (int)strcspn(name, ","), name);
}

/* Opens the container over v->io from its start and finds the video stream, refusing what is
 * not allowed before anything is decoded. */
static int open_input(struct video *v, AVFormatContext **out_fc, int *stream,
                      const AVCodec **codec) {
    char err[128];
    *out_fc = NULL;
    v->io.pos = 0;
    AVFormatContext *fc = avformat_alloc_context();
    uint8_t *buf = av_malloc(VIDEO_IO_BUFFER);
    AVIOContext *pb =
        buf ? avio_alloc_context(buf, VIDEO_IO_BUFFER, 0, &v->io, mem_read, NULL, mem_seek) : NULL;
    if (!fc || !pb) {
        if (pb)
            av_freep(&pb->buffer);
        else
            av_free(buf);
        avio_context_free(&pb);
        avformat_free_context(fc);
        return strata_set_error(STRATA_ENOMEM, "out of memory opening the video");
    }
    fc->pb = pb;
    fc->flags |= AVFMT_FLAG_CUSTOM_IO;
    AVDictionary *opts = NULL;
    /* Demuxers and decoders by name: nothing else is ever probed or opened. */
    av_dict_set(&opts, "format_whitelist", "mov,matroska", 0);
    av_dict_set(&opts, "codec_whitelist",
                "h264,hevc,vp8,vp9,libvpx,libvpx-vp9,av1,libdav1d,libaom-av1", 0);
    int rc = avformat_open_input(&fc, NULL, NULL, &opts);
    av_dict_free(&opts);
    if (rc < 0) { /* avformat_open_input freed fc, not our custom pb */
        av_freep(&pb->buffer);
        avio_context_free(&pb);
        return strata_set_error(STRATA_EFORMAT,
                                "not a readable MP4 / MOV or Matroska / WebM file (%s)",
                                av_msg(rc, err, sizeof err));
    }
    *out_fc = fc;
    /* Frame sizes from the headers before find_stream_info decodes anything. */
    for (unsigned i = 0; i < fc->nb_streams; i++) {
        const AVCodecParameters *p = fc->streams[i]->codecpar;
        if (p->codec_type == AVMEDIA_TYPE_VIDEO &&
            (int64_t)p->width * p->height > v->lim.max_frame_pixels)
            return strata_set_error(STRATA_ERANGE,
                                    "the video's frames are %dx%d, over the limit of %lld pixels",
                                    p->width, p->height, (long long)v->lim.max_frame_pixels);
    }
    rc = avformat_find_stream_info(fc, NULL);
    if (rc < 0)
        return strata_set_error(STRATA_EFORMAT, "cannot read the video's streams (%s)",
                                av_msg(rc, err, sizeof err));
    rc = av_find_best_stream(fc, AVMEDIA_TYPE_VIDEO, -1, -1, codec, 0);
    if (rc == AVERROR_DECODER_NOT_FOUND) {
        for (unsigned i = 0; i < fc->nb_streams; i++)
            if (fc->streams[i]->codecpar->codec_type == AVMEDIA_TYPE_VIDEO)
                return strata_set_error(STRATA_EFORMAT,
                                        "the video codec %s is not supported (H.264, HEVC, VP8, "
                                        "VP9 and AV1 are)",
                                        avcodec_get_name(fc->streams[i]->codecpar->codec_id));
    }
    if (rc < 0) return strata_set_error(STRATA_EFORMAT, "the file has no video stream");
    *stream = rc;
    const AVCodecParameters *p = fc->streams[rc]->codecpar;
    if (!is_allowed_codec(p->codec_id))
        return strata_set_error(STRATA_EFORMAT,
                                "the video codec %s is not supported (H.264, HEVC, VP8, VP9 and "
                                "AV1 are)",
                                avcodec_get_name(p->codec_id));
    if (p->width <= 0 || p->height <= 0)
        return strata_set_error(STRATA_EFORMAT, "the video stream has no frame size");
    if ((int64_t)p->width * p->height > v->lim.max_frame_pixels)
        return strata_set_error(STRATA_ERANGE,
                                "the video's frames are %dx%d, over the limit of %lld pixels",
                                p->width, p->height, (long long)v->lim.max_frame_pixels);
    return STRATA_OK;
}

static void close_input(AVFormatContext **fc) {
    if (!*fc) return;
    AVIOContext *pb = (*fc)->pb;
    avformat_close_input(fc);
    if (pb) av_freep(&pb->buffer);
    avio_context_free(&pb);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* torchcodec's seconds: pts * num / den in double, then printed "%f" (std::to_string) and read
 * back by Python. */
static double stream_seconds(int64_t pts, AVRational tb) {
    char text[64];
    snprintf(text, sizeof text, "%f", (double)pts * tb.num / tb.den);
    return strtod(text, NULL);
}

/* The next packet of `stream` that counts (torchcodec skips AV_PKT_FLAG_DISCARD) into pkt:
 * 1, 0 at the end, a status when the container is corrupt or truncated. Other streams'
 * packets are dropped on the way. */
static int next_packet(AVFormatContext *fc, AVPacket *pkt, int stream) {
    char err[128];
    for (;;) {
        int r = av_read_frame(fc, pkt);
        if (r == AVERROR_EOF) return 0;
        if (r < 0)
            return strata_set_error(STRATA_EFORMAT, "the video is corrupt or truncated (%s)",
                                    av_msg(r, err, sizeof err));
        if (pkt->stream_index == stream && !(pkt->flags & AV_PKT_FLAG_DISCARD)) return 1;
        av_packet_unref(pkt);
    }
}

/* Every packet of the stream, as torchcodec's exact-mode scan counts them. */
static int scan(struct video *v, AVFormatContext *fc, int stream) {
    AVPacket *pkt = av_packet_alloc();
    int64_t begin = INT64_MAX, end = INT64_MIN, n = 0, cap = 0;
    int rc = pkt ? 0 : strata_set_error(STRATA_ENOMEM, "out of memory scanning the video");
    while (rc == 0) {
        int r = next_packet(fc, pkt, stream);
        if (r <= 0) {
            rc = r;
            break;
        }
        int64_t pts = pkt->pts == AV_NOPTS_VALUE ? pkt->dts : pkt->pts;
        if (pts < begin) begin = pts;
        if (pts + pkt->duration > end) end = pts + pkt->duration;
        if (n == v->lim.max_frames) {
            rc = strata_set_error(STRATA_ERANGE, "the video has more than %lld frames",
                                  (long long)v->lim.max_frames);
        } else if (n == cap) {
            cap = cap ? 2 * cap : 256;
            int64_t *grown = realloc(v->pts, (size_t)cap * sizeof *grown);
            if (!grown)
                rc = strata_set_error(STRATA_ENOMEM, "out of memory scanning");
            else
                v->pts = grown;
        }
        if (rc == 0) v->pts[n++] = pts;
        av_packet_unref(pkt);
    }
    av_packet_free(&pkt);
    if (rc) return rc;
    if (n == 0) return strata_set_error(STRATA_EFORMAT, "the video stream has no frames");
    qsort(v->pts, (size_t)n, sizeof *v->pts, cmp_i64);
    AVStream *st = fc->streams[stream];
    struct video_info *in = &v->info;
    in->num_frames = n;
    in->begin_seconds = stream_seconds(begin, st->time_base);
    in->end_seconds = stream_seconds(end, st->time_base);
    if (in->end_seconds != in->begin_seconds)
        in->fps = (double)n / (in->end_seconds - in->begin_seconds);
    else /* one frame, no durations: torchcodec falls back to the header's average rate */
        in->fps = av_q2d(st->avg_frame_rate);
    if (!(in->fps > 0) || in->fps > 1e6)
        return strata_set_error(STRATA_EFORMAT, "cannot tell the video's frame rate");
    return 0;
}

int video_open(struct video **out, const void *data, size_t len, const struct video_limits *lim) {
    *out = NULL;
    if (!data || len == 0) return strata_set_error(STRATA_EFORMAT, "the video file is empty");
    int loaded = ff_loaded();
    if (loaded) return loaded;
    struct video *v = calloc(1, sizeof *v);
    if (!v) return strata_set_error(STRATA_ENOMEM, "out of memory for a video");
    if (lim) v->lim = *lim;
    if (v->lim.max_frame_pixels <= 0) v->lim.max_frame_pixels = VIDEO_DEFAULT_MAX_FRAME_PIXELS;
    if (v->lim.max_frames <= 0) v->lim.max_frames = VIDEO_DEFAULT_MAX_FRAMES;
    v->io = (struct mem_io){data, len, 0};
    AVFormatContext *fc = NULL;
    const AVCodec *codec = NULL;
    int stream = -1;
    int rc = open_input(v, &fc, &stream, &codec);
    if (rc == 0) {
        const AVCodecParameters *p = fc->streams[stream]->codecpar;
        v->info.width = p->width;
        v->info.height = p->height;
        container_name(v->info.container, sizeof v->info.container, fc, &v->io);
        snprintf(v->info.codec, sizeof v->info.codec, "%s", avcodec_get_name(p->codec_id));
        rc = scan(v, fc, stream);
    }
    close_input(&fc);
    if (rc) {
        video_close(v);
        return rc;
    }
    *out = v;
    return 0;
}

const struct video_info *video_get_info(const struct video *v) {
    return &v->info;
}

/* One frame to tight RGB24 rows. swscale's x86 YUV -> RGB converters write whole groups of
 * pixels past the row's end, so the destination is a padded buffer, copied out row by row. */
static int to_rgb(struct video *v, const AVFrame *f, uint8_t *dst) {
    const int w = f->width, h = f->height;
    const size_t row = (size_t)w * 3;
    if (f->format == AV_PIX_FMT_RGB24) {
        for (int y = 0; y < h; y++)
            memcpy(dst + (size_t)y * row, f->data[0] + (size_t)y * f->linesize[0], row);
        return 0;
    }
    v->sws = sws_getCachedContext(v->sws, w, h, f->format, w, h, AV_PIX_FMT_RGB24, SWS_BILINEAR,
                                  NULL, NULL, NULL);
    if (!v->sws)
        return strata_set_error(STRATA_EFORMAT, "cannot convert the video's pixel format %s",
                                av_get_pix_fmt_name(f->format));
    int *inv = NULL, *tab = NULL, src_full, dst_full, bri, con, sat;
    if (sws_getColorspaceDetails(v->sws, &inv, &src_full, &tab, &dst_full, &bri, &con, &sat) < 0)
        return strata_set_error(STRATA_EFORMAT, "cannot convert the video's colours");
    /* torchcodec: swscale for widths that are multiples of 32, FFmpeg's "scale" filter for the
     * rest; both take the frame's matrix, only the filter also takes its stated range. */
    const int *coef = sws_getCoefficients(f->colorspace);
    if (w % 32 != 0 && f->color_range != AVCOL_RANGE_UNSPECIFIED)
        src_full = f->color_range == AVCOL_RANGE_JPEG;
    sws_setColorspaceDetails(v->sws, coef, src_full, coef, dst_full, bri, con, sat);
    size_t stride = (row + 64 + 63) & ~(size_t)63;
    if (stride != v->line_stride) {
        av_free(v->line_buf);
        v->line_buf = av_malloc(stride * ((size_t)h + 1));
        v->line_stride = v->line_buf ? stride : 0;
        if (!v->line_buf) return strata_set_error(STRATA_ENOMEM, "out of memory converting frames");
    }
    uint8_t *planes[4] = {v->line_buf, NULL, NULL, NULL};
    int strides[4] = {(int)stride, 0, 0, 0};
    if (sws_scale(v->sws, (const uint8_t *const *)f->data, f->linesize, 0, h, planes, strides) != h)
        return strata_set_error(STRATA_EFORMAT, "converting a video frame to RGB failed");
    for (int y = 0; y < h; y++)
        memcpy(dst + (size_t)y * row, v->line_buf + (size_t)y * stride, row);
    return 0;
}

struct decode_pass {
    const int64_t *indices;
    int n, next; /* the next wanted index's position in indices */
    video_frame_fn on_frame;
    void *ctx;
    uint8_t *rgb; /* one frame, converted, handed to on_frame */
    int64_t decoded;
};

/* Takes one decoded frame: it is every wanted frame whose pts it has reached. */
static int take_frame(struct video *v, struct decode_pass *d, const AVFrame *f) {
    int64_t pts = f->pts != AV_NOPTS_VALUE ? f->pts : f->pkt_dts;
    d->decoded++;
    if (pts == AV_NOPTS_VALUE) return 0;
    while (d->next < d->n && pts >= v->pts[d->indices[d->next]]) {
        if (f->width != v->info.width || f->height != v->info.height)
            return strata_set_error(
                STRATA_EFORMAT, "frame %lld is %dx%d, the stream's frames are %dx%d",
                (long long)d->indices[d->next], f->width, f->height, v->info.width, v->info.height);
        int rc = to_rgb(v, f, d->rgb);
        if (rc == 0) rc = d->on_frame(d->ctx, d->next, d->rgb);
        if (rc) return rc;
        d->next++;
    }
    return 0;
}

static int drain(struct video *v, struct decode_pass *d, AVCodecContext *cc, AVFrame *f) {
    char err[128];
    for (;;) {
        int r = avcodec_receive_frame(cc, f);
        if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return 0;
        if (r < 0)
            return strata_set_error(STRATA_EFORMAT,
                                    "decoding the video failed after %lld frames (%s)",
                                    (long long)d->decoded, av_msg(r, err, sizeof err));
        r = take_frame(v, d, f);
        av_frame_unref(f);
        if (r) return r;
        if (d->next == d->n) return 0;
    }
}

int video_decode_each(struct video *v, const int64_t *indices, int n, video_frame_fn on_frame,
                      void *ctx) {
    for (int i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= v->info.num_frames ||
            (i && indices[i] < indices[i - 1]))
            return strata_set_error(STRATA_EINVAL,
                                    "frame index %lld at %d: indices must be non-decreasing and "
                                    "below the %lld frames",
                                    (long long)indices[i], i, (long long)v->info.num_frames);
    if (n <= 0) return 0;
    AVFormatContext *fc = NULL;
    const AVCodec *codec = NULL;
    int stream = -1;
    AVCodecContext *cc = NULL;
    AVPacket *pkt = av_packet_alloc();
    AVFrame *f = av_frame_alloc();
    uint8_t *rgb = malloc((size_t)v->info.width * (size_t)v->info.height * 3);
    struct decode_pass d = {indices, n, 0, on_frame, ctx, rgb, 0};
    char err[128];
    int rc = pkt && f && rgb ? open_input(v, &fc, &stream, &codec)
                             : strata_set_error(STRATA_ENOMEM, "out of memory decoding the video");
    if (rc == 0) {
        cc = avcodec_alloc_context3(codec);
        if (!cc) rc = strata_set_error(STRATA_ENOMEM, "out of memory for the video decoder");
    }
    if (rc == 0) {
        int r = avcodec_parameters_to_context(cc, fc->streams[stream]->codecpar);
        cc->thread_count = v->lim.threads;
        if (r >= 0) r = avcodec_open2(cc, codec, NULL);
        if (r < 0)
            rc = strata_set_error(STRATA_EFORMAT, "cannot open the %s decoder (%s)", codec->name,
                                  av_msg(r, err, sizeof err));
    }
    while (rc == 0 && d.next < n) {
        int r = next_packet(fc, pkt, stream);
        if (r <= 0) {
            rc = r;
            break;
        }
        r = avcodec_send_packet(cc, pkt);
        if (r < 0 && r != AVERROR(EAGAIN))
            rc = strata_set_error(STRATA_EFORMAT,
                                  "the video's data is corrupt after %lld frames (%s)",
                                  (long long)d.decoded, av_msg(r, err, sizeof err));
        else
            rc = drain(v, &d, cc, f);
        av_packet_unref(pkt);
    }
    if (rc == 0 && d.next < n) { /* the decoder's delayed frames */
        avcodec_send_packet(cc, NULL);
        rc = drain(v, &d, cc, f);
    }
    if (rc == 0 && d.next < n)
        rc = strata_set_error(STRATA_EFORMAT,
                              "the video ended after %lld decoded frames, before frame %lld of "
                              "its %lld",
                              (long long)d.decoded, (long long)indices[d.next],
                              (long long)v->info.num_frames);
    avcodec_free_context(&cc);
    close_input(&fc);
    av_packet_free(&pkt);
    av_frame_free(&f);
    free(rgb);
    return rc;
}

/* video_decode_frames: each frame copied to its place in the caller's array. */
struct copy_ctx {
    uint8_t *rgb;
    size_t frame_bytes;
};

static int copy_frame(void *ctx, int i, const uint8_t *rgb) {
    struct copy_ctx *c = ctx;
    memcpy(c->rgb + (size_t)i * c->frame_bytes, rgb, c->frame_bytes);
    return 0;
}

int video_decode_frames(struct video *v, const int64_t *indices, int n, uint8_t *rgb) {
    struct copy_ctx c = {rgb, (size_t)v->info.width * (size_t)v->info.height * 3};
    return video_decode_each(v, indices, n, copy_frame, &c);
}

void video_close(struct video *v) {
    if (!v) return;
    sws_freeContext(v->sws);
    av_free(v->line_buf);
    free(v->pts);
    free(v);
}

int video_detect_container(const void *data, size_t len) {
    const uint8_t *p = data;
    if (len >= 12 && !memcmp(p + 4, "ftyp", 4)) return 1;
    if (len >= 4 && p[0] == 0x1A && p[1] == 0x45 && p[2] == 0xDF && p[3] == 0xA3) return 2;
    return 0;
}
