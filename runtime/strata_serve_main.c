/* strata-serve: an OpenAI-compatible HTTP front and, with --grpc-port, the gRPC service
 * (runtime/serve, strata.proto) in front of a running pipeline's stage 0: one process, one
 * stage-0 connection and one request path for both. Loads the model directory's tokenizer
 * and chat template, listens, and serves until SIGINT/SIGTERM. Exit codes: 0 stopped by a signal, 1
 * runtime failure, 2 usage, 3 bad model directory. */
#include <getopt.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/log.h"
#include "runtime/base/status.h"
#include "runtime/serve/serve_grpc.h"
#include "runtime/serve/serve_http.h"
#include "runtime/serve/serve_ring.h"
#include "wire/tls.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata-serve --model DIR --stage0-port P|--stage0-port-file F [options]\n"
            "OpenAI-compatible HTTP server in front of a pipeline's stage 0:\n"
            "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, /v1/stages,\n"
            "/health, /metrics, and a web console: GET / (chat) and /pipeline (the ring, live);\n"
            "with --grpc-port also the gRPC service of runtime/serve/strata.proto.\n"
            "  --model DIR              tokenizer.json + chat template of the served model\n"
            "  --served-model-name N    the model id (default: DIR's basename)\n"
            "  --stage0-host H          stage 0 host (default 127.0.0.1)\n"
            "  --stage0-port P          stage 0 port\n"
            "  --stage0-port-file F     read stage 0's port from F (waits up to 20 s for it)\n"
            "  --host H                 listen address, IPv4 (default 127.0.0.1)\n"
            "  --port P                 listen port (default 0: any free port)\n"
            "  --port-file F            write the bound port to F\n"
            "  --grpc-port P            also serve gRPC (strata.v1.Strata: Generate, Chat,\n"
            "                           Health, Info) on P (0: any free port); plaintext HTTP/2\n"
            "  --grpc-port-file F       write the bound gRPC port to F (implies --grpc-port 0)\n"
            "  --no-http                serve gRPC only\n"
            "  --no-console             no web console (GET / and /pipeline answer 404)\n"
            "  --max-seq N              the stages' --max-seq: prompt + answer (default 512)\n"
            "  --token-timeout-ms MS    longest wait for the next token (default 60000)\n"
            "  --max-image-bytes N      largest decoded image_url image (default 524288; the\n"
            "                           vision stage's --max-image-bytes also applies)\n"
            "  --max-images N           images per chat request (default 16, at most 256)\n"
            "  --max-body-bytes N       largest request body and gRPC message (default 1048576;\n"
            "                           raise it for larger video_url / image_url data URIs)\n"
            "  --max-video-bytes N      largest decoded video_url video (default: what base64\n"
            "                           fits in the body, 786432 at the default body; the vision\n"
            "                           stage's --max-video-bytes also applies)\n"
            "  --max-videos N           videos per chat request (default 2, at most 64)\n"
            "  --auth-key-file F        the pipeline's pre-shared key (else $STRATA_AUTH_KEY):\n"
            "                           TLS 1.3 PSK to stage 0 (HMAC Hello with --insecure)\n"
            "  --tls-cert F --tls-key F --tls-ca F   TLS 1.3 to stage 0 with certificates\n"
            "  --insecure               plaintext to stage 0; one of a key, certificates or\n"
            "                           --insecure is required\n"
            "  --help                   this text\n");
}

struct serve_args {
    const char *model, *name, *stage0_host, *stage0_port_file, *host, *port_file, *key_file;
    const char *tls_cert, *tls_key, *tls_ca;
    const char *grpc_port_file;
    int insecure, no_http, no_console;
    int stage0_port, port, max_seq, token_timeout_ms, max_image_bytes, max_images;
    int max_video_bytes, max_videos, max_body;
    int grpc_port; /* -1: no gRPC */
};

static int parse_args(struct serve_args *a, int argc, char **argv) {
    static const struct option options[] = {{"model", 1, 0, 'm'},
                                            {"served-model-name", 1, 0, 'n'},
                                            {"stage0-host", 1, 0, 'H'},
                                            {"stage0-port", 1, 0, 'P'},
                                            {"stage0-port-file", 1, 0, 'F'},
                                            {"host", 1, 0, 'h'},
                                            {"port", 1, 0, 'p'},
                                            {"port-file", 1, 0, 'f'},
                                            {"max-seq", 1, 0, 's'},
                                            {"auth-key-file", 1, 0, 'a'},
                                            {"token-timeout-ms", 1, 0, 't'},
                                            {"tls-cert", 1, 0, 'C'},
                                            {"tls-key", 1, 0, 'K'},
                                            {"tls-ca", 1, 0, 'A'},
                                            {"insecure", 0, 0, 'I'},
                                            {"grpc-port", 1, 0, 'g'},
                                            {"grpc-port-file", 1, 0, 'G'},
                                            {"no-http", 0, 0, 'N'},
                                            {"no-console", 0, 0, 'O'},
                                            {"max-image-bytes", 1, 0, 'B'},
                                            {"max-images", 1, 0, 'M'},
                                            {"max-video-bytes", 1, 0, 'V'},
                                            {"max-videos", 1, 0, 'W'},
                                            {"max-body-bytes", 1, 0, 'Z'},
                                            {"help", 0, 0, 'x'},
                                            {0, 0, 0, 0}};
    int c, bad = 0;
    memset(a, 0, sizeof *a);
    a->stage0_host = a->host = "127.0.0.1";
    a->max_seq = 512;
    a->token_timeout_ms = 60000;
    a->grpc_port = -1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'n': a->name = optarg; break;
        case 'H': a->stage0_host = optarg; break;
        case 'P': bad |= cli_parse_int(optarg, 1, 65535, &a->stage0_port) < 0; break;
        case 'F': a->stage0_port_file = optarg; break;
        case 'h': a->host = optarg; break;
        case 'p': bad |= cli_parse_int(optarg, 0, 65535, &a->port) < 0; break;
        case 'f': a->port_file = optarg; break;
        case 's': bad |= cli_parse_int(optarg, 2, 1 << 24, &a->max_seq) < 0; break;
        case 't': bad |= cli_parse_int(optarg, 1, 1 << 30, &a->token_timeout_ms) < 0; break;
        case 'a': a->key_file = optarg; break;
        case 'C': a->tls_cert = optarg; break;
        case 'K': a->tls_key = optarg; break;
        case 'A': a->tls_ca = optarg; break;
        case 'I': a->insecure = 1; break;
        case 'g': bad |= cli_parse_int(optarg, 0, 65535, &a->grpc_port) < 0; break;
        case 'G': a->grpc_port_file = optarg; break;
        case 'N': a->no_http = 1; break;
        case 'O': a->no_console = 1; break;
        case 'B': bad |= cli_parse_int(optarg, 1, 1 << 30, &a->max_image_bytes) < 0; break;
        case 'M': bad |= cli_parse_int(optarg, 1, 256, &a->max_images) < 0; break;
        case 'V': bad |= cli_parse_int(optarg, 1, 1 << 30, &a->max_video_bytes) < 0; break;
        case 'W': bad |= cli_parse_int(optarg, 1, 64, &a->max_videos) < 0; break;
        case 'Z': bad |= cli_parse_int(optarg, 1024, 1 << 30, &a->max_body) < 0; break;
        case 'x': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (bad || optind < argc || !a->model || (!a->stage0_port == !a->stage0_port_file)) {
        fprintf(stderr, "strata-serve: need --model and one of --stage0-port / "
                        "--stage0-port-file, with valid numbers\n");
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    if (a->grpc_port_file && a->grpc_port < 0) a->grpc_port = 0;
    if (a->no_http && a->grpc_port < 0) {
        fprintf(stderr, "strata-serve: --no-http needs --grpc-port or --grpc-port-file\n");
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

/* Stage 0 may still be starting: its port file appears when it listens. */
static int read_stage0_port(struct serve_args *a) {
    for (int i = 0; a->stage0_port_file && i < 400; i++) {
        if (cli_read_port_file(a->stage0_port_file, &a->stage0_port) == 0) return 0;
        usleep(50000);
    }
    if (a->stage0_port > 0) return 0;
    fprintf(stderr, "strata-serve: no port in %s\n", a->stage0_port_file);
    return -1;
}

/* The tokenizer and (when the model has one) its chat template. Returns the exit code or -1. */
static int load_model(struct serve_app *app, struct tokenizer **tok, const struct serve_args *a) {
    if (tokenizer_load(tok, a->model) < 0) {
        fprintf(stderr, "strata-serve: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    app->tok = *tok;
    int rc = chat_template_load(&app->template_kind, a->model);
    app->have_template = rc == 0;
    if (rc == STRATA_EFORMAT) {
        fprintf(stderr, "strata-serve: %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    if (rc < 0) strata_log(STRATA_LOG_WARN, "no chat template: /v1/chat/completions refused");
    return -1;
}

/* The link security to stage 0 from the flags, as strata-client decides it
 * (wire_security_setup). Returns the exit code or -1. */
static int open_security(struct wire_security *sec, struct wire_auth_key *key,
                         const struct serve_args *a) {
    if (wire_auth_key_load(key, a->key_file, NULL) < 0) {
        fprintf(stderr, "strata-serve: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    struct wire_security_flags flags = {a->tls_cert, a->tls_key, a->tls_ca, a->insecure, key};
    int rc = wire_security_setup(sec, &flags);
    if (rc < 0) {
        fprintf(stderr, "strata-serve: %s\n", strata_last_error());
        return rc == STRATA_EINVAL ? STRATA_EXIT_USAGE : STRATA_EXIT_FAILURE;
    }
    if (sec->warning) strata_log(STRATA_LOG_WARN, "%s", sec->warning);
    return -1;
}

/* Starts the fronts asked for and writes their port files. Returns the exit code or -1. */
static int start_fronts(struct serve_server **http, struct serve_grpc **grpc, struct serve_app *app,
                        const struct serve_args *a) {
    if (!a->no_http && serve_server_start(http, app, a->host, a->port) < 0) return -2;
    if (*http && a->port_file && cli_write_port_file(a->port_file, serve_server_port(*http)) < 0)
        return -2;
    if (a->grpc_port >= 0 && serve_grpc_start(grpc, app, a->host, a->grpc_port) < 0) return -2;
    if (*grpc && a->grpc_port_file &&
        cli_write_port_file(a->grpc_port_file, serve_grpc_port(*grpc)) < 0)
        return -2;
    if (*http)
        strata_log(STRATA_LOG_INFO, "serving model '%s' on http://%s:%d (stage 0 at %s:%d)",
                   app->model_id, a->host, serve_server_port(*http), a->stage0_host,
                   a->stage0_port);
    if (*http && app->console)
        strata_log(STRATA_LOG_INFO,
                   "web console: chat at http://%s:%d/, the pipeline at "
                   "http://%s:%d/pipeline",
                   a->host, serve_server_port(*http), a->host, serve_server_port(*http));
    if (*grpc)
        strata_log(STRATA_LOG_INFO, "serving model '%s' over gRPC on %s:%d (stage 0 at %s:%d)",
                   app->model_id, a->host, serve_grpc_port(*grpc), a->stage0_host, a->stage0_port);
    return -1;
}

static int serve(struct serve_app *app, const struct serve_args *a) {
    struct serve_server *http = NULL;
    struct serve_grpc *grpc = NULL;
    int code = start_fronts(&http, &grpc, app, a);
    if (code == -2) {
        fprintf(stderr, "strata-serve: %s\n", strata_last_error());
        code = STRATA_EXIT_FAILURE;
    } else {
        while (!g_stop)
            usleep(100000);
        strata_log(STRATA_LOG_INFO, "stopping");
        code = STRATA_EXIT_OK;
    }
    serve_grpc_stop(grpc);
    serve_server_stop(http);
    return code;
}

int main(int argc, char **argv) {
    static struct serve_args a;
    static struct serve_engine engine;
    static struct serve_metrics metrics;
    static struct serve_ring ring;
    struct serve_app app;
    struct wire_auth_key key;
    struct wire_security sec = {0};
    struct tokenizer *tok = NULL;
    char name[256];
    int code = parse_args(&a, argc, argv);
    if (code >= 0) return code;
    strata_log_setup("serve", STRATA_LOG_INFO);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (read_stage0_port(&a) < 0) return STRATA_EXIT_FAILURE;
    snprintf(name, sizeof name, "%s", a.model);
    memset(&app, 0, sizeof app);
    app.model_id = a.name ? a.name : basename(name);
    app.max_seq = a.max_seq;
    app.token_timeout_ms = a.token_timeout_ms;
    app.max_image_bytes = a.max_image_bytes;
    app.max_images = a.max_images;
    app.max_body = a.max_body;
    /* by default a video may take what base64 fits in the body (3 bytes per 4 characters) */
    app.max_video_bytes =
        a.max_video_bytes ? a.max_video_bytes : (a.max_body ? (long)a.max_body / 4 * 3 : 0);
    app.max_videos = a.max_videos;
    app.console = !a.no_console;
    app.created = (long)time(NULL);
    code = load_model(&app, &tok, &a);
    if (code < 0) code = open_security(&sec, &key, &a);
    if (code < 0 &&
        serve_engine_init(&engine, a.stage0_host, a.stage0_port, sec.tls, sec.hello_key) < 0)
        code = STRATA_EXIT_FAILURE;
    wire_auth_key_clear(&key);
    if (code < 0) {
        serve_metrics_init(&metrics);
        serve_ring_init(&ring);
        app.engine = &engine;
        app.metrics = &metrics;
        app.ring = &ring;
        code = serve(&app, &a);
        serve_engine_shutdown(&engine);
        serve_ring_free(&ring);
        serve_metrics_destroy(&metrics);
    }
    wire_security_free(&sec);
    tokenizer_free(tok);
    return code;
}
