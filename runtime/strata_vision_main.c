/* strata-stage --role vision: the vision stage in front of stage 0 (runtime/stage/
 * vision_stage.h). Loads only the model's vision tower and preprocessor_config.json,
 * prints what it serves, and serves clients until SIGINT/SIGTERM. Linked into strata-stage,
 * whose main hands over when it sees --role vision. Exit codes as strata-stage's: 0 ok,
 * 1 runtime failure, 2 usage, 3 bad model, config or weights. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/vision_encoder.h"
#include "runtime/base/cli.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/text/tokenizer.h"
#include "runtime/stage/vision_cuda.h"
#include "runtime/stage/vision_stage.h"
#include "runtime/strata_stage_args.h"
#include "wire/auth.h"
#include "wire/tls.h"

int strata_vision_main(int argc, char **argv);

static volatile sig_atomic_t vision_stop;

static void on_signal(int sig) {
    (void)sig;
    vision_stop = 1;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata-stage --role vision --model DIR (--next-port P | --next-port-file F)\n"
            "                    [--listen [ADDR:]PORT] [--port-file F] [options]\n"
            "The vision stage: clients send it requests with image and video files\n"
            "(strata-client --image / --video); it decodes them (PNG, JPEG; EXIF orientation\n"
            "is not applied, as HF does not for image objects; MP4 / WebM with H.264, HEVC,\n"
            "VP8, VP9 or AV1, frames as torchcodec gives them to transformers), preprocesses\n"
            "them exactly as HF's default processors for DIR/preprocessor_config.json and\n"
            "DIR/video_preprocessor_config.json, writes each video's timestamps into the\n"
            "prompt with DIR/tokenizer.json, runs the vision tower and sends the merged\n"
            "embeddings and DeepStack features to stage 0 in resumable blocks, then the\n"
            "request. Text-only requests go to stage 0 unchanged. Clients connect here as\n"
            "to stage 0; stage 0 keeps serving direct clients too.\n"
            "  --model DIR            model directory: config.json, the vision tower's\n"
            "                         safetensors (model.visual.*), preprocessor_config.json\n"
            "                         (Qwen3-VL's values when absent)\n"
            "  --listen [ADDR:]PORT   listen address for clients (default 127.0.0.1:0)\n"
            "  --port-file F          write the bound port to F\n"
            "  --next-host H          stage 0's host (default 127.0.0.1)\n"
            "  --next-port P          stage 0's port\n"
            "  --next-port-file F     read stage 0's port from F (re-read on reconnect)\n"
            "  --threads T            vision encoder threads (default 1)\n"
            "  --cpus LIST            run on these CPUs only (0-3,8; strata-stage --help)\n"
            "  --device cpu|cuda:N    where the tower runs: the CPU encoder (default) or GPU N\n"
            "                         (runtime/stage/vision_cuda.h; weights uploaded once)\n"
            "  --vision-block-tokens N  image tokens per transfer block (default %d)\n"
            "  --max-image-bytes N    largest image file (default %zu)\n"
            "  --max-video-bytes N    largest video file (default %zu)\n"
            "  --max-video-frames N   frames in a video's stream, counted before decoding\n"
            "                         (default %lld)\n"
            "  --tokenizer DIR        tokenizer.json for videos' timestamp text (default: the\n"
            "                         model directory; without one, videos are refused)\n"
            "  --max-request-bytes N  largest client request frame (default %zu)\n"
            "  --max-pixels N         decoded pixels per image, checked before decoding\n"
            "                         (default %lld, Pillow's decompression-bomb limit)\n"
            "  --auth-key-file F | --tls-cert F --tls-key F --tls-ca F | --insecure\n"
            "                         link security, as strata-stage's other roles\n"
            "  --test-drop-after-block K  testing: once per request, drop the link to stage 0\n"
            "                         right after sending block K (the transfer resumes)\n"
            "  --log-level L          error|warn|info|debug (default info)\n"
            "  --help                 this text\n"
            "Exit codes: 0 ok (stopped by SIGINT/SIGTERM), 1 runtime failure (listen),\n"
            "2 bad command line, 3 bad model, config or weights.\n",
            VISION_DEFAULT_BLOCK_TOKENS, VISION_DEFAULT_MAX_IMAGE_BYTES,
            VISION_DEFAULT_MAX_VIDEO_BYTES, (long long)VIDEO_DEFAULT_MAX_FRAMES,
            VISION_DEFAULT_MAX_REQUEST_BYTES, (long long)IMAGE_DEFAULT_MAX_PIXELS);
}

struct vargs {
    const char *model, *listen, *port_file, *next_host, *next_port_file, *auth, *cert, *key, *ca;
    const char *tokenizer;
    int next_port, threads, block_tokens, insecure, drop_after, max_image, max_request;
    int max_video, max_video_frames;
    int device;          /* -1: CPU encoder; else the CUDA device index */
    struct cpu_pin cpus; /* --cpus, where pin_cpus */
    int pin_cpus;
    long long max_pixels;
    enum stage_log_level log_level;
};

/* --device cpu | cuda | cuda:N into *device (-1 = the CPU encoder). */
static int vdevice(const char *v, int *device) {
    struct cli_device d;
    if (cli_parse_device(v, &d) < 0) {
        fprintf(stderr, "strata-stage: --device: %s\n", strata_last_error());
        return -1;
    }
    *device = d.kind == CLI_DEVICE_CUDA ? d.index : -1;
    return 0;
}

static int vparse_one(struct vargs *a, int c, const char *v) {
    int px = 0;
    switch (c) {
    case 'r': return strcmp(v, "vision") == 0 ? 0 : -1;
    case 'm': a->model = v; return 0;
    case 'l': a->listen = v; return 0;
    case 'p': a->port_file = v; return 0;
    case 'h': a->next_host = v; return 0;
    case 'n': return strata_stage_flag_int("--next-port", v, 1, 65535, &a->next_port);
    case 'f': a->next_port_file = v; return 0;
    case 't': return strata_stage_flag_int("--threads", v, 1, 1024, &a->threads);
    case 'c':
        if (strata_stage_flag_cpus(v, &a->cpus) < 0) return -1;
        a->pin_cpus = 1;
        return 0;
    case 'D': return vdevice(v, &a->device);
    case 'b':
        return strata_stage_flag_int("--vision-block-tokens", v, 1, 1 << 24, &a->block_tokens);
    case 'i': return strata_stage_flag_int("--max-image-bytes", v, 1, 1 << 30, &a->max_image);
    case 'v': return strata_stage_flag_int("--max-video-bytes", v, 1, 1 << 30, &a->max_video);
    case 'F':
        return strata_stage_flag_int("--max-video-frames", v, 1, 1 << 30, &a->max_video_frames);
    case 'T': a->tokenizer = v; return 0;
    case 'q':
        return strata_stage_flag_int("--max-request-bytes", v, 1024, 1 << 30, &a->max_request);
    case 'x':
        if (strata_stage_flag_int("--max-pixels", v, 1, 2000000000, &px) < 0) return -1;
        a->max_pixels = px;
        return 0;
    case 'a': a->auth = v; return 0;
    case 'C': a->cert = v; return 0;
    case 'K': a->key = v; return 0;
    case 'A': a->ca = v; return 0;
    case 'I': a->insecure = 1; return 0;
    case 'd':
        return strata_stage_flag_int("--test-drop-after-block", v, 0, 1 << 24, &a->drop_after);
    case 'L': return strata_stage_parse_log_level(v, &a->log_level);
    default: return -1;
    }
}

/* 0 go on, 1 --help, -1 bad command line (printed). */
static int vparse(struct vargs *a, int argc, char **argv) {
    static const struct option opts[] = {{"role", 1, 0, 'r'},
                                         {"model", 1, 0, 'm'},
                                         {"listen", 1, 0, 'l'},
                                         {"port-file", 1, 0, 'p'},
                                         {"next-host", 1, 0, 'h'},
                                         {"next-port", 1, 0, 'n'},
                                         {"next-port-file", 1, 0, 'f'},
                                         {"threads", 1, 0, 't'},
                                         {"cpus", 1, 0, 'c'},
                                         {"device", 1, 0, 'D'},
                                         {"vision-block-tokens", 1, 0, 'b'},
                                         {"max-image-bytes", 1, 0, 'i'},
                                         {"max-video-bytes", 1, 0, 'v'},
                                         {"max-video-frames", 1, 0, 'F'},
                                         {"tokenizer", 1, 0, 'T'},
                                         {"max-request-bytes", 1, 0, 'q'},
                                         {"max-pixels", 1, 0, 'x'},
                                         {"auth-key-file", 1, 0, 'a'},
                                         {"tls-cert", 1, 0, 'C'},
                                         {"tls-key", 1, 0, 'K'},
                                         {"tls-ca", 1, 0, 'A'},
                                         {"insecure", 0, 0, 'I'},
                                         {"test-drop-after-block", 1, 0, 'd'},
                                         {"log-level", 1, 0, 'L'},
                                         {"help", 0, 0, 'H'},
                                         {0, 0, 0, 0}};
    int c;
    memset(a, 0, sizeof *a);
    a->threads = 1;
    a->drop_after = -1;
    a->device = -1;
    a->log_level = STAGE_LOG_INFO;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'H') return 1;
        if (vparse_one(a, c, optarg) < 0) {
            if (c == 'r') fprintf(stderr, "strata-stage: --role is language or vision\n");
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "strata-stage: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!a->model || (!a->next_port && !a->next_port_file)) {
        fprintf(stderr, "strata-stage: --role vision needs --model DIR and --next-port or "
                        "--next-port-file (stage 0)\n");
        return -1;
    }
    return 0;
}

struct vrun {
    struct model_config cfg;
    char *config_json;
    size_t config_len;
    struct safetensors *st;
    struct vision_encoder *enc;
    struct vision_cuda *gpu; /* --device cuda[:N] */
    struct vision_frontend fe;
    struct tokenizer *tok; /* for videos' timestamps; NULL when the directory has none */
    struct wire_auth_key key;
    struct wire_security security;
};

static void vrun_close(struct vrun *r) {
    vision_cuda_free(r->gpu);
    vision_encoder_free(r->enc);
    tokenizer_free(r->tok);
    safetensors_close(r->st);
    wire_security_free(&r->security);
    wire_auth_key_clear(&r->key);
    free(r->config_json);
}

/* config.json, the vision tower, preprocessor_config.json: an exit code (0 = loaded). */
static int vopen(struct vrun *r, const struct vargs *a) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", a->model);
    int rc = model_config_read(&r->config_json, &r->config_len, path);
    if (rc == 0) rc = model_config_parse(&r->cfg, r->config_json, r->config_len, path);
    if (rc == 0 && !r->cfg.has_vision)
        rc = strata_set_error(STRATA_EFORMAT, "%s: model %s has no vision tower", path,
                              r->cfg.model_type_name);
    if (rc == 0) rc = safetensors_open(&r->st, a->model);
    if (rc == 0) rc = vision_encoder_load(&r->enc, &r->cfg, r->st, a->threads);
    snprintf(path, sizeof path, "%s/preprocessor_config.json", a->model);
    if (rc == 0) {
        rc = vision_preproc_config_load(&r->fe.pp, path);
        if (rc == STRATA_ENOTFOUND) { /* no file: Qwen3-VL's shipped values (spec §2) */
            r->fe.pp = vision_preproc_defaults();
            rc = 0;
        }
    }
    if (rc == 0) rc = vision_video_config_load_dir(&r->fe.vpp, a->model);
    if (rc == 0) { /* optional unless asked for: without it videos are refused per request */
        const char *dir = a->tokenizer ? a->tokenizer : a->model;
        rc = tokenizer_load(&r->tok, dir);
        if (rc == STRATA_ENOTFOUND && !a->tokenizer) rc = 0;
    }
    if (rc < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return rc == STRATA_ENOMEM ? STRATA_EXIT_FAILURE : STRATA_EXIT_INPUT;
    }
    r->fe.tok = r->tok;
    r->fe.image_token_id = r->cfg.image_token_id;
    r->fe.video_token_id = r->cfg.video_token_id;
    r->fe.vision_start_token_id = r->cfg.vision_start_token_id;
    r->fe.vision_end_token_id = r->cfg.vision_end_token_id;
    r->fe.max_video_bytes = a->max_video ? (size_t)a->max_video : VISION_DEFAULT_MAX_VIDEO_BYTES;
    r->fe.video.max_frames = a->max_video_frames;
    /* The GPU tower uploads the CPU encoder's weights (which it keeps for the checks). */
    if (a->device >= 0 && vision_cuda_open(&r->gpu, r->enc, a->device) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    r->fe.enc = r->enc;
    r->fe.gpu = r->gpu;
    r->fe.decode = image_decode_defaults();
    if (a->max_pixels) r->fe.decode.max_pixels = a->max_pixels;
    r->fe.max_image_bytes = a->max_image ? (size_t)a->max_image : VISION_DEFAULT_MAX_IMAGE_BYTES;
    return STRATA_EXIT_OK;
}

static void vsummary(const struct vrun *r, const struct vargs *a) {
    const struct vision_config *v = &r->cfg.vision;
    const struct vision_preproc_config *pp = &r->fe.pp;
    char summary[512];
    model_config_describe(&r->cfg, summary, sizeof summary);
    printf("strata-stage vision (in front of stage 0)\n");
    printf("config: %s\n", summary);
    printf("vision tower: depth %d, hidden %d, heads %d, patch %d, merge %d, temporal %d, "
           "out hidden %d, DeepStack %d; %zu weight bytes, %d thread(s)\n",
           v->depth, v->hidden_size, v->num_heads, v->patch_size, v->spatial_merge_size,
           v->temporal_patch_size, v->out_hidden_size, v->num_deepstack,
           vision_encoder_weight_bytes(r->enc), vision_encoder_num_threads(r->enc));
    if (r->gpu)
        printf("device: cuda:%d, %zu weight bytes uploaded\n", a->device,
               vision_cuda_weight_bytes(r->gpu));
    else
        printf("device: cpu\n");
    strata_stage_print_cpus(a->pin_cpus);
    printf("preprocessor: %lld..%lld pixels, patch %d, merge %d\n", (long long)pp->min_pixels,
           (long long)pp->max_pixels, pp->patch_size, pp->merge_size);
    const struct vision_video_config *vc = &r->fe.vpp;
    printf("video: %g frames per second sampled (%d..%d frames), %lld..%lld pixels x frames; "
           "timestamps %s; limits: %zu bytes per video, %lld frames per stream\n",
           vc->fps, vc->min_frames, vc->max_frames, (long long)vc->pp.min_pixels,
           (long long)vc->pp.max_pixels,
           r->tok ? "tokenized with the model's tokenizer" : "need a tokenizer (videos refused)",
           r->fe.max_video_bytes,
           (long long)(a->max_video_frames ? a->max_video_frames : VIDEO_DEFAULT_MAX_FRAMES));
    printf("transfer: blocks of %d image tokens; limits: %zu bytes per image, %zu per request, "
           "%lld pixels per image\n",
           a->block_tokens ? a->block_tokens : VISION_DEFAULT_BLOCK_TOKENS, r->fe.max_image_bytes,
           a->max_request ? (size_t)a->max_request : VISION_DEFAULT_MAX_REQUEST_BYTES,
           (long long)r->fe.decode.max_pixels);
    fflush(stdout);
}

static int vserve(struct vrun *r, const struct vargs *a) {
    struct vision_stage_options so;
    char host[256];
    int port = 0;
    memset(&so, 0, sizeof so);
    if (strata_stage_parse_listen(a->listen, host, sizeof host, &port) < 0)
        return STRATA_EXIT_USAGE;
    if (wire_auth_key_load(&r->key, a->auth, NULL) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    struct wire_security_flags flags = {a->cert, a->key, a->ca, a->insecure, &r->key};
    int rc = wire_security_setup(&r->security, &flags);
    if (rc < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return rc == STRATA_EINVAL ? STRATA_EXIT_USAGE : STRATA_EXIT_FAILURE;
    }
    if (r->security.warning) strata_log(STRATA_LOG_WARN, "%s", r->security.warning);
    so.listen_host = host;
    so.listen_port = port;
    so.port_file = a->port_file;
    so.next_host = a->next_host;
    so.next_port = a->next_port;
    so.next_port_file = a->next_port_file;
    so.tls = r->security.tls;
    so.key = r->security.hello_key;
    so.block_tokens = a->block_tokens;
    so.max_request_bytes = (size_t)a->max_request;
    so.drop_after_block = a->drop_after;
    char device[64];
    if (r->gpu)
        snprintf(device, sizeof device, "cuda:%d, vision tower", a->device);
    else
        snprintf(device, sizeof device, "cpu, %d thread%s, vision tower",
                 vision_encoder_num_threads(r->enc),
                 vision_encoder_num_threads(r->enc) == 1 ? "" : "s");
    so.device_words = device;
    so.threads = vision_encoder_num_threads(r->enc);
    /* The same fingerprint as the language stages: stage 0 refuses another model. */
    if (wire_model_fingerprint(so.fingerprint, r->config_json, r->config_len, "float32") < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (vision_stage_run(&r->fe, &so, &vision_stop) < 0) {
        fprintf(stderr, "strata-stage: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    return STRATA_EXIT_OK;
}

int strata_vision_main(int argc, char **argv) {
    struct vargs a;
    struct vrun r;
    int parsed = vparse(&a, argc, argv), code;
    if (parsed == 1) {
        usage(stdout);
        return STRATA_EXIT_OK;
    }
    if (parsed < 0) {
        fprintf(stderr, "usage: strata-stage --role vision --model DIR --next-port P ... "
                        "(strata-stage --role vision --help lists every flag)\n");
        return STRATA_EXIT_USAGE;
    }
    if (strata_stage_pin_cpus(a.pin_cpus ? &a.cpus : NULL, a.threads) < 0) return STRATA_EXIT_USAGE;
    strata_log_setup("vision", (enum strata_log_level)a.log_level);
    memset(&r, 0, sizeof r);
    code = vopen(&r, &a);
    if (code == STRATA_EXIT_OK) {
        vsummary(&r, &a);
        code = vserve(&r, &a);
    }
    vrun_close(&r);
    return code;
}
