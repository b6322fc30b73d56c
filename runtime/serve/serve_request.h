/* OpenAI-shaped request bodies (POST /v1/chat/completions and /v1/completions) parsed and
 * checked into plain parameters, and the OpenAI error shape they fail with. Pure: no I/O, no
 * tokenizer, so the unit tests drive it with strings. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_REQUEST_H
#define STRATA_RUNTIME_SERVE_SERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#define SERVE_MAX_STOPS 4
#define SERVE_MAX_STOP_LEN 256

/* Images a chat request may carry as image_url data URIs (the request's bytes are bounded by
 * the body limit: strata-serve --max-body-bytes, SERVE_MAX_BODY in serve_http.h by default). */
#define SERVE_DEFAULT_MAX_IMAGE_BYTES (512L * 1024) /* one decoded image file */
#define SERVE_DEFAULT_MAX_IMAGES 16                 /* images per request */
#define SERVE_DEFAULT_MAX_VIDEO_BYTES (768L * 1024) /* one video: what base64 fits in 1 MiB */
#define SERVE_DEFAULT_MAX_VIDEOS 2                  /* videos per request */

/* A media file's format, told from its first bytes (never from the URI's media type). */
enum serve_image_format {
    SERVE_IMAGE_PNG = 1,
    SERVE_IMAGE_JPEG = 2,
    SERVE_VIDEO_MP4 = 3, /* MP4 / MOV ("ftyp" box) */
    SERVE_VIDEO_WEBM = 4 /* Matroska / WebM (EBML header) */
};

/* An HTTP status with the OpenAI error fields ("param" and "code" may be empty: null). */
struct serve_error {
    int http_status;
    char type[32];
    char message[512];
    char param[48];
    char code[48];
};

/* Fills *err (type invalid_request_error unless http_status >= 500) and returns -1. */
int serve_error_set(struct serve_error *err, int http_status, const char *param, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

enum serve_kind { SERVE_CHAT = 1, SERVE_COMPLETION = 2 };

struct serve_params {
    enum serve_kind kind;
    char *messages_json; /* chat: the "messages" array as compact JSON (malloc'ed) */
    char *prompt;        /* completion: the prompt text (malloc'ed), or NULL when... */
    int32_t *prompt_ids; /* ...the prompt is given as token ids (gRPC), malloc'ed */
    int n_prompt_ids;
    int max_tokens;    /* 0 when not given: the room left in the pipeline */
    float temperature; /* default 1.0, as OpenAI */
    float top_p;       /* default 1.0 */
    int top_k;         /* extension (vLLM's): default 0, no cut */
    uint64_t seed;     /* 0 when not given */
    int n_stops;
    char stops[SERVE_MAX_STOPS][SERVE_MAX_STOP_LEN + 1];
    int stream, include_usage;
    int enable_thinking; /* chat_template_kwargs.enable_thinking, default 0 like the CLI */
    int ignore_eos;      /* generate past the tokenizer's eos ids (benchmarks: a fixed length) */
    /* Speculative decoding (extension): SERVE_SPECULATE_* (0: the pipeline's default) and
     * drafts per step (0: the pipeline's; at most SERVE_MAX_SPECULATE_K). The tokens are the
     * same either way. */
    int speculate, speculate_k;
    /* Chat image and video parts, in prompt order: file i is image_sizes[i] bytes of
     * image_bytes (all decoded files concatenated), format image_formats[i]. Each part is
     * rewritten to {"type":"image"} / {"type":"video"} in messages_json, which the template
     * renders as one image / video pad. n_images counts every file, n_videos the videos. */
    uint8_t *image_bytes;
    uint32_t *image_sizes;
    uint8_t *image_formats; /* enum serve_image_format */
    int n_images, n_videos;
};

/* Limits the server checks a request against. */
struct serve_limits {
    const char *model_id; /* the one served model; "model" must name it when given */
    int max_tokens;       /* most tokens a request may ask for (the pipeline's KV room) */
};

/* Limits on a chat request's images and videos (0 = the default). */
struct serve_image_limits {
    long max_image_bytes; /* largest decoded image file; SERVE_DEFAULT_MAX_IMAGE_BYTES */
    int max_images;       /* images per request; SERVE_DEFAULT_MAX_IMAGES */
    long max_video_bytes; /* largest decoded video file; SERVE_DEFAULT_MAX_VIDEO_BYTES */
    int max_videos;       /* videos per request; SERVE_DEFAULT_MAX_VIDEOS */
};

/* Parses body [len] for `kind`. On failure returns -1 with *err filled (400: malformed JSON,
 * unknown model, empty messages, bad sampling values, an image_url that is not a base64
 * PNG / JPEG data URI or a video_url that is not a base64 MP4 / WebM one (no URL is ever
 * fetched), audio parts; 413: an image or video over the limits). Free with serve_params_free (also after a
 * failure). */
int serve_params_parse(struct serve_params *p, enum serve_kind kind, const char *body, size_t len,
                       const struct serve_limits *limits, struct serve_error *err);
void serve_params_free(struct serve_params *p);
/* The same with image limits other than the defaults (images: NULL = the defaults). */
int serve_params_parse_with(struct serve_params *p, enum serve_kind kind, const char *body,
                            size_t len, const struct serve_limits *limits,
                            const struct serve_image_limits *images, struct serve_error *err);

/* "speculate" (JSON "off" / "ngram" / "draft"): the wire's enum values (wire/message.h). */
enum {
    SERVE_SPECULATE_DEFAULT = 0,
    SERVE_SPECULATE_OFF = 1,
    SERVE_SPECULATE_NGRAM = 2,
    SERVE_SPECULATE_DRAFT = 3
};
#define SERVE_MAX_SPECULATE_K 16

/* The allowed sampling ranges, shared by the JSON and protobuf decoders. */
#define SERVE_MAX_TEMPERATURE 2.0
#define SERVE_MAX_TOP_K 1000000

/* Sets the defaults (temperature and top_p 1, as OpenAI) on a zeroed *p of `kind`. */
void serve_params_defaults(struct serve_params *p, enum serve_kind kind);

/* Checks already-typed values (the protobuf front's): temperature in [0, 2], top_p in
 * (0, 1], top_k <= 10^6, max_tokens in 0..limits->max_tokens (0 = the room left). -1 with
 * *err naming the field. */
int serve_params_check(const struct serve_params *p, const struct serve_limits *limits,
                       struct serve_error *err);

/* Adds one decoded image file (its format told from its first bytes) to p's images.
 * -1 with *err: 400 when it is neither PNG nor JPEG, 413 past the limits. `param` names the
 * field in the error. */
int serve_params_add_image(struct serve_params *p, const uint8_t *data, size_t len,
                           const struct serve_image_limits *limits, const char *param,
                           struct serve_error *err);

/* The same for a video file: 400 when it is neither MP4 / MOV nor Matroska / WebM by its first
 * bytes, 413 past the video limits. */
int serve_params_add_video(struct serve_params *p, const uint8_t *data, size_t len,
                           const struct serve_image_limits *limits, const char *param,
                           struct serve_error *err);

/* Adds one stop string (empty ones are ignored: they would end every answer at once). */
int serve_params_add_stop(struct serve_params *p, const char *s, struct serve_error *err);

#endif
