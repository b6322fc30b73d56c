/* strata-client: sends one or more prompts (token ids) to stage 0 of a pipeline at once,
 * streams the generated tokens and prints them per request with tokens/s. With --model DIR and
 * --text or --chat it is text in, text out: the prompt is tokenized here (--chat renders one
 * user message with the model's chat template first), the answer is decoded as it streams,
 * generation stops at the tokenizer's eos ids, and usage goes to stderr. With --grid and
 * --vision-embeds (+ --deepstack) every request carries images for a Qwen3-VL model: the
 * vision encoder's outputs read from little-endian f32 files (what a vision stage will send).
 * Exit codes: 0 all requests finished, 1 a request failed or the pipeline went away,
 * 2 usage. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/vl_prompt.h"
#include "runtime/stage/client.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/strata_client_args.h"

#define MAX_PROMPT 65536

struct job {
    int32_t *prompt;
    int prompt_len;
    uint64_t nonce;
    int32_t *tokens;
    int n_tokens;
    int done, failed, cancelled;
    enum wire_finish finish;
    char error[600];
    double t_first, t_done, t_last;
    double *gaps;           /* [max_tokens] seconds between consecutive tokens */
    int accepted, rejected; /* its draft tokens so far (speculative decoding) */
};

/* "LABEL 1,2,3" */
static void print_ids(FILE *out, const char *label, const int32_t *ids, int n) {
    fprintf(out, "%s ", label);
    for (int i = 0; i < n; i++)
        fprintf(out, i ? ",%d" : "%d", ids[i]);
    fprintf(out, "\n");
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Text mode's tokenizer, its streaming decoder (skips special tokens, so the eos that ends
 * the answer is not printed) and the tokenized prompt. */
static struct {
    struct tokenizer *tok;
    struct tokenizer_stream *stream;
    struct tokenizer_ids prompt;
} g_text;

/* Reads an f32 file whose value count is a multiple of `unit`; *count = values / unit. */
static int read_f32_file(char **data, size_t *count, const char *path, size_t unit,
                         const char *what) {
    size_t len = 0;
    if (cli_read_file(data, &len, path) < 0) {
        fprintf(stderr, "strata-client: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    if (len == 0 || len % (4 * unit)) {
        fprintf(stderr,
                "strata-client: %s %s has %zu bytes: not f32 values in rows of %zu (the grids' "
                "image tokens x H)\n",
                what, path, len, unit);
        return STRATA_EXIT_USAGE;
    }
    *count = len / (4 * unit);
    return -1;
}

/* --grid / --vision-embeds / --deepstack: the images every request carries. H comes from
 * the embeddings' size (image tokens from the grids), K from the DeepStack file's. Returns
 * -1 to go on, else the exit code. */
static int load_vision(struct client_args *a) {
    int64_t n_img = 0;
    size_t H = 0, K = 0;
    int rc;
    if (!a->num_images && !a->embeds_file && !a->deepstack_file) return -1;
    if (!a->num_images || !a->embeds_file) {
        fprintf(stderr, "strata-client: images need --grid and --vision-embeds\n");
        return STRATA_EXIT_USAGE;
    }
    if (vl_total_image_tokens(&n_img, a->grids, a->num_images, a->merge) < 0 || n_img < 1) {
        fprintf(stderr, "strata-client: --grid: %s\n", strata_last_error());
        return STRATA_EXIT_USAGE;
    }
    rc = read_f32_file(&a->embeds, &H, a->embeds_file, (size_t)n_img, "--vision-embeds");
    if (rc < 0 && a->deepstack_file)
        rc = read_f32_file(&a->deepstack, &K, a->deepstack_file, (size_t)n_img * H, "--deepstack");
    if (rc >= 0) return rc;
    a->vision = (struct request_vision){.grids = a->grids,
                                        .num_images = a->num_images,
                                        .n_image_tokens = (int)n_img,
                                        .hidden_size = (int)H,
                                        .embeds = (const float *)a->embeds,
                                        .num_deepstack = (int)K,
                                        .deepstack = (const float *)a->deepstack};
    a->base.vision = &a->vision;
    return -1;
}

/* --image files: read, concatenated, each format told from its first bytes (the vision
 * stage checks it again). Returns -1 to go on, else the exit code. */
static int load_images(struct client_args *a) {
    size_t total = 0;
    if (!a->num_image_files) return -1;
    if (a->num_images || a->embeds_file || a->deepstack_file) {
        fprintf(stderr, "strata-client: --image sends files to a vision stage; --grid / "
                        "--vision-embeds / --deepstack send its outputs: give one or the other\n");
        return STRATA_EXIT_USAGE;
    }
    for (int i = 0; i < a->num_image_files; i++) {
        char *data = NULL;
        size_t len = 0;
        if (cli_read_file(&data, &len, a->image_paths[i]) < 0) {
            fprintf(stderr, "strata-client: --image: %s\n", strata_last_error());
            return STRATA_EXIT_FAILURE;
        }
        uint8_t *grown = len && len <= UINT32_MAX ? realloc(a->image_bytes, total + len) : NULL;
        if (!grown) {
            fprintf(stderr, "strata-client: --image %s: %s\n", a->image_paths[i],
                    len ? "too large" : "empty file");
            free(data);
            return len ? STRATA_EXIT_FAILURE : STRATA_EXIT_USAGE;
        }
        a->image_bytes = grown;
        memcpy(a->image_bytes + total, data, len);
        const uint8_t *b = (const uint8_t *)data;
        if (a->image_is_video[i]) /* the vision stage checks the bytes against it */
            a->image_formats[i] = len >= 12 && !memcmp(b + 4, "ftyp", 4) ? WIRE_IMAGE_MP4
                                  : len >= 4 && !memcmp(b, "\x1a\x45\xdf\xa3", 4)
                                      ? WIRE_IMAGE_WEBM
                                      : WIRE_IMAGE_UNKNOWN;
        else
            a->image_formats[i] = len >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8) ? WIRE_IMAGE_PNG
                                  : len >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff
                                      ? WIRE_IMAGE_JPEG
                                      : WIRE_IMAGE_UNKNOWN;
        a->image_sizes[i] = (uint32_t)len;
        total += len;
        free(data);
    }
    a->base.image_files = a->image_bytes;
    a->base.image_file_sizes = a->image_sizes;
    a->base.image_formats = a->image_formats;
    a->base.num_image_files = a->num_image_files;
    return -1;
}

/* Renders --chat (an optional system message and the user message, generation prompt on,
 * thinking off unless --think) with the model's chat template and tokenizes it. */
static int encode_chat(const struct client_args *a) {
    enum chat_template_kind kind;
    struct chat_message m[2] = {{CHAT_ROLE_SYSTEM, a->system, NULL, 0, NULL},
                                {CHAT_ROLE_USER, a->chat, NULL, 0, NULL}};
    static struct chat_part parts[VL_MAX_IMAGES + 1];
    if (a->num_image_files) { /* Qwen3-VL: the images and videos, then the text, one turn */
        for (int i = 0; i < a->num_image_files; i++)
            parts[i] =
                (struct chat_part){a->image_is_video[i] ? CHAT_PART_VIDEO : CHAT_PART_IMAGE, NULL};
        parts[a->num_image_files] = (struct chat_part){CHAT_PART_TEXT, a->chat};
        m[1] = (struct chat_message){CHAT_ROLE_USER, NULL, parts, (size_t)a->num_image_files + 1,
                                     NULL};
    }
    struct chat_options o = {1, a->think ? CHAT_THINKING_ON : CHAT_THINKING_OFF, 0};
    char *text = NULL;
    size_t len = 0;
    int rc = chat_template_load(&kind, a->model);
    if (rc == 0)
        rc = chat_template_render(kind, a->system ? m : m + 1, a->system ? 2 : 1, &o, &text, &len);
    if (rc == 0) rc = tokenizer_encode(g_text.tok, text, len, &g_text.prompt);
    free(text);
    return rc;
}

/* Text mode: loads the tokenizer, tokenizes the prompt and adds the eos ids to the stop ids.
 * Returns -1 to go on, else the exit code. */
static int build_text_prompt(struct client_args *a) {
    int32_t eos[TOKENIZER_MAX_EOS];
    int rc = tokenizer_load(&g_text.tok, a->model);
    if (rc == 0)
        rc = a->chat ? encode_chat(a)
                     : tokenizer_encode(g_text.tok, a->text, strlen(a->text), &g_text.prompt);
    if (rc == 0) rc = tokenizer_stream_new(&g_text.stream, g_text.tok, 1);
    if (rc < 0) {
        fprintf(stderr, "strata-client: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    if (g_text.prompt.n < 1 || g_text.prompt.n > MAX_PROMPT) {
        fprintf(stderr, "strata-client: the prompt has %zu tokens (1..%d)\n", g_text.prompt.n,
                MAX_PROMPT);
        return STRATA_EXIT_USAGE;
    }
    int n_eos = tokenizer_eos_ids(g_text.tok, eos);
    for (int i = 0; i < n_eos && a->base.num_stop_ids < REQUEST_MAX_STOP_IDS; i++)
        a->base.stop_ids[a->base.num_stop_ids++] = eos[i];
    if (a->print_ids) print_ids(stderr, "prompt ids:", g_text.prompt.ids, (int)g_text.prompt.n);
    return -1;
}

/* Text mode: decodes one generated token (or, with flush, the held-back bytes) to stdout as
 * soon as it is complete UTF-8. */
static void emit_text(int32_t token, int flush) {
    const char *piece;
    size_t len;
    int rc = flush ? tokenizer_stream_flush(g_text.stream, &piece, &len)
                   : tokenizer_stream_push(g_text.stream, token, &piece, &len);
    if (rc < 0) {
        fprintf(stderr, "strata-client: decode: %s\n", strata_last_error());
        return;
    }
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
}

/* Allocates one job per prompt copy with its parsed prompt and nonce. Returns -1 to go on,
 * else the exit code. */
static int make_jobs(struct job *jobs, int *num_jobs, const struct client_args *a) {
    /* Top bit clear, so nonce_base + i + 1 never wraps to the reserved nonce 0. */
    uint64_t nonce_base =
        (((uint64_t)time(NULL) << 20) ^ ((uint64_t)getpid() << 8)) & (UINT64_MAX >> 1);
    for (int i = 0; i < a->num_prompts * a->copies; i++) {
        struct job *j = &jobs[(*num_jobs)++];
        const char *prompt = a->prompts[i % a->num_prompts];
        j->prompt = malloc(sizeof(int32_t) * MAX_PROMPT);
        j->tokens = calloc((size_t)a->max_tokens, sizeof(int32_t));
        j->gaps = calloc((size_t)a->max_tokens, sizeof(double));
        if (!j->prompt || !j->tokens || !j->gaps) return STRATA_EXIT_FAILURE;
        if (client_text_mode(a)) {
            memcpy(j->prompt, g_text.prompt.ids, g_text.prompt.n * sizeof(int32_t));
            j->prompt_len = (int)g_text.prompt.n;
            prompt = "(text)";
        } else {
            j->prompt_len = cli_parse_ids(j->prompt, MAX_PROMPT, prompt, 0, INT32_MAX);
        }
        if (j->prompt_len < 1) {
            fprintf(stderr, "strata-client: bad --prompt '%s'\n", prompt);
            return STRATA_EXIT_USAGE;
        }
        j->nonce = nonce_base + (uint64_t)i + 1;
    }
    return -1;
}

/* Loads the key, sets up TLS (wire_security_setup) and connects to stage 0. Returns -1 to
 * go on, else the exit code. */
static int open_client(struct strata_client *client, struct wire_auth_key *key,
                       struct wire_security *sec, const struct client_args *a) {
    signal(SIGPIPE, SIG_IGN);
    if (wire_auth_key_load(key, a->key_file, NULL) < 0) {
        fprintf(stderr, "strata-client: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    struct wire_security_flags flags = {a->tls_cert, a->tls_key, a->tls_ca, a->insecure, key};
    int rc = wire_security_setup(sec, &flags);
    if (rc < 0) {
        fprintf(stderr, "strata-client: %s\n", strata_last_error());
        return rc == STRATA_EINVAL ? STRATA_EXIT_USAGE : STRATA_EXIT_FAILURE;
    }
    if (sec->warning) fprintf(stderr, "strata-client: warning: %s\n", sec->warning);
    if (client_connect_tls(client, a->host, a->port, sec->tls, sec->hello_key, 5000) < 0) {
        fprintf(stderr, "strata-client: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    return -1;
}

/* Sends every job's request. Returns -1 to go on, else the exit code. */
static int submit_all(struct strata_client *client, struct job *jobs, int num_jobs,
                      const struct client_args *a) {
    for (int i = 0; i < num_jobs; i++) {
        struct stage_request req = a->base;
        req.nonce = jobs[i].nonce;
        req.prompt = jobs[i].prompt;
        req.prompt_len = jobs[i].prompt_len;
        req.max_tokens = a->max_tokens;
        if (client_submit(client, &req) < 0) {
            fprintf(stderr, "strata-client: submit: %s\n", strata_last_error());
            return STRATA_EXIT_FAILURE;
        }
    }
    return -1;
}

/* Marks every unfinished job failed by a connection error (nonce 0: stage 0 is closing
 * this connection; every request on it is lost). */
static void fail_all(struct job *jobs, int num_jobs, const struct request_event *ev) {
    fprintf(stderr, "strata-client: stage 0 ended the connection: %s: %s\n",
            strata_status_name(ev->code), ev->message);
    for (int i = 0; i < num_jobs; i++)
        if (!jobs[i].done) {
            snprintf(jobs[i].error, sizeof jobs[i].error, "connection error: %s: %s",
                     strata_status_name(ev->code), ev->message);
            jobs[i].failed = jobs[i].done = 1;
        }
}

/* Applies one event to its job; returns 1 when that job is now done, else 0. */
static int on_event(struct strata_client *client, struct job *jobs, struct job *j,
                    const struct request_event *ev, const struct client_args *a) {
    if (ev->kind == REQUEST_EVENT_ERROR && ev->code == STRATA_ECANCELED && j == &jobs[0] &&
        a->cancel_after >= 0) {
        j->cancelled = j->done = 1;
        return 1;
    }
    if (ev->kind == REQUEST_EVENT_ERROR) {
        snprintf(j->error, sizeof j->error, "%s: %s", strata_status_name(ev->code), ev->message);
        j->failed = j->done = 1;
        j->t_done = cli_now_sec();
        return 1;
    }
    if (ev->step != (uint64_t)j->n_tokens || j->n_tokens >= a->max_tokens) {
        snprintf(j->error, sizeof j->error, "token for step %llu out of order",
                 (unsigned long long)ev->step);
        j->failed = j->done = 1;
        return 1;
    }
    double t = cli_now_sec();
    if (j->n_tokens == 0)
        j->t_first = t;
    else
        j->gaps[j->n_tokens - 1] = t - j->t_last;
    j->t_last = t;
    j->tokens[j->n_tokens++] = ev->token;
    j->accepted = ev->accepted_tokens;
    j->rejected = ev->rejected_tokens;
    if (g_text.stream) emit_text(ev->token, 0);
    if (ev->finish != WIRE_FINISH_NONE) {
        j->finish = ev->finish;
        j->done = 1;
        j->t_done = cli_now_sec();
        return 1;
    }
    if (j == &jobs[0] && a->cancel_after >= 0 && j->n_tokens == a->cancel_after) {
        if (client_cancel(client, j->nonce) < 0)
            fprintf(stderr, "strata-client: cancel: %s\n", strata_last_error());
    }
    return 0;
}

/* Stage 0 went away (--reconnect-timeout-ms): connects to it again and resubmits every
 * unfinished job from the tokens it has (client_resubmit). 0, or -1 (reported). */
static int resubmit_all(struct strata_client *client, struct job *jobs, int num_jobs,
                        const struct client_args *a, const char *why) {
    fprintf(stderr, "strata-client: stage 0 lost (%s); reconnecting for up to %d ms\n", why,
            a->reconnect_timeout_ms);
    if (client_reconnect(client, a->host, a->port, a->port_file, a->sec->tls, a->sec->hello_key,
                         a->reconnect_timeout_ms) < 0) {
        fprintf(stderr, "strata-client: %s\n", strata_last_error());
        return -1;
    }
    for (int i = 0; i < num_jobs; i++) {
        struct stage_request req = a->base;
        if (jobs[i].done) continue;
        req.nonce = jobs[i].nonce;
        req.prompt = jobs[i].prompt;
        req.prompt_len = jobs[i].prompt_len;
        req.max_tokens = a->max_tokens;
        if (client_resubmit(client, &req, jobs[i].tokens, jobs[i].n_tokens) < 0) {
            fprintf(stderr, "strata-client: resubmit: %s\n", strata_last_error());
            return -1;
        }
        fprintf(stderr, "strata-client: request %d resubmitted after %d tokens\n", i,
                jobs[i].n_tokens);
    }
    return 0;
}

/* Streams events until every job is done or the connection fails; returns the exit code
 * so far. */
static int run_events(struct strata_client *client, struct job *jobs, int num_jobs,
                      const struct client_args *a) {
    int remaining = num_jobs;
    while (remaining > 0) {
        struct request_event ev;
        struct job *j = NULL;
        int rc = client_next_event(client, &ev, a->timeout_ms);
        if (a->reconnect_timeout_ms > 0 && a->sec &&
            ((rc < 0 && rc != STRATA_ETIMEOUT) ||
             (rc == 0 && ev.kind == REQUEST_EVENT_CONNECTION_ERROR))) {
            char why[600];
            snprintf(why, sizeof why, "%s", rc < 0 ? strata_last_error() : ev.message);
            if (resubmit_all(client, jobs, num_jobs, a, why) == 0) continue;
            return STRATA_EXIT_FAILURE;
        }
        if (rc < 0) {
            fprintf(stderr, "strata-client: %s\n",
                    rc == STRATA_ETIMEOUT ? "no answer from the pipeline in time"
                                          : strata_last_error());
            return STRATA_EXIT_FAILURE;
        }
        if (ev.kind == REQUEST_EVENT_CONNECTION_ERROR) {
            fail_all(jobs, num_jobs, &ev);
            return STRATA_EXIT_FAILURE;
        }
        for (int i = 0; i < num_jobs; i++)
            if (jobs[i].nonce == ev.nonce && !jobs[i].done) j = &jobs[i];
        if (j) remaining -= on_event(client, jobs, j, &ev, a);
    }
    return STRATA_EXIT_OK;
}

/* Prints one finished job's lines; returns 1 when it counts as a failure. */
static int print_job(int i, struct job *j, double t0, const struct client_args *a) {
    if (!j->done) {
        printf("request %d: error: no result\n", i);
        return 1;
    }
    if (j->cancelled) {
        printf("request %d: cancelled after %d tokens\n", i, j->n_tokens);
        return 0;
    }
    if (j->failed) {
        printf("request %d: error %s\n", i, j->error);
        return 1;
    }
    if (!a->quiet) {
        printf("request %d: tokens", i);
        for (int k = 0; k < j->n_tokens; k++)
            printf(" %d", j->tokens[k]);
        printf("\n");
    }
    printf("request %d: %d tokens (%s), first token %.1f ms, %.1f tokens/s\n", i, j->n_tokens,
           j->finish == WIRE_FINISH_STOP ? "stop" : "length", (j->t_first - t0) * 1e3,
           j->t_done > j->t_first && j->n_tokens > 1 ? (j->n_tokens - 1) / (j->t_done - j->t_first)
                                                     : 0.0);
    if (j->accepted + j->rejected > 0) /* a line of its own: the one above is parsed by scripts */
        printf("request %d: %d of %d draft tokens accepted\n", i, j->accepted,
               j->accepted + j->rejected);
    if (a->latency && j->n_tokens > 2) {
        int n = j->n_tokens - 1;
        qsort(j->gaps, (size_t)n, sizeof(double), compare_double);
        printf("request %d: inter-token gap p50 %.1f us, p99 %.1f us\n", i, j->gaps[n / 2] * 1e6,
               j->gaps[(int)(n * 0.99)] * 1e6);
    }
    return 0;
}

/* Text mode's end: the rest of the text and a newline on stdout, the usage on stderr.
 * Returns 1 when the request failed. */
static int text_report(const struct job *j, double t0, const struct client_args *a) {
    emit_text(0, 1);
    printf("\n");
    fflush(stdout);
    if (!j->done || j->failed) {
        fprintf(stderr, "strata-client: error: %s\n", j->done ? j->error : "no result");
        return 1;
    }
    if (a->print_ids) print_ids(stderr, "generated ids:", j->tokens, j->n_tokens);
    fprintf(stderr,
            "usage: %d prompt tokens, %d generated tokens (%s), first token %.1f ms, "
            "%.1f tokens/s\n",
            j->prompt_len, j->n_tokens, j->finish == WIRE_FINISH_STOP ? "eos" : "max-tokens",
            (j->t_first - t0) * 1e3,
            j->t_done > j->t_first && j->n_tokens > 1 ? (j->n_tokens - 1) / (j->t_done - j->t_first)
                                                      : 0.0);
    if (j->accepted + j->rejected > 0)
        fprintf(stderr, "speculation: %d of %d draft tokens accepted\n", j->accepted,
                j->accepted + j->rejected);
    return 0;
}

/* Submits every job, streams the answers and prints the report; returns the exit code. */
static int run(struct strata_client *client, struct job *jobs, int num_jobs,
               const struct client_args *a) {
    double t0 = cli_now_sec(), total_time;
    long total_tokens = 0;
    int code = submit_all(client, jobs, num_jobs, a);
    if (code >= 0) return code;
    code = run_events(client, jobs, num_jobs, a);
    total_time = cli_now_sec() - t0;
    if (client_text_mode(a)) return text_report(&jobs[0], t0, a) ? STRATA_EXIT_FAILURE : code;
    for (int i = 0; i < num_jobs; i++) {
        total_tokens += jobs[i].n_tokens;
        if (print_job(i, &jobs[i], t0, a)) code = STRATA_EXIT_FAILURE;
    }
    printf("total: %d requests, %ld tokens in %.3f s = %.1f tokens/s\n", num_jobs, total_tokens,
           total_time, total_time > 0 ? total_tokens / total_time : 0.0);
    return code;
}

/* --describe: the stages as a table on stdout; returns the exit code. */
static int describe(struct strata_client *client, const struct client_args *a) {
    static struct client_describe d;
    static char table[CLIENT_MAX_STAGES * 320];
    if (client_describe(client, &d, a->timeout_ms) < 0) {
        fprintf(stderr, "strata-client: describe: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    client_describe_table(table, sizeof table, &d);
    fputs(table, stdout);
    /* The counters on stderr: stdout stays the table (a header and one row per stage). */
    client_describe_totals(table, sizeof table, &d);
    fputs(table, stderr);
    return STRATA_EXIT_OK;
}

int main(int argc, char **argv) {
    static struct client_args a;
    struct strata_client client;
    struct wire_auth_key key;
    struct wire_security sec = {0};
    struct job *jobs = NULL;
    int num_jobs = 0, code = client_parse_args(&a, argc, argv);
    if (code >= 0) return code;
    memset(&client, 0, sizeof client);
    memset(&key, 0, sizeof key);
    client.conn.fd = -1;
    jobs = calloc((size_t)(a.num_prompts * a.copies), sizeof *jobs);
    if (!jobs) return STRATA_EXIT_FAILURE;
    if (client_text_mode(&a)) code = build_text_prompt(&a);
    if (code < 0) code = load_vision(&a);
    if (code < 0) code = load_images(&a);
    if (code < 0 && !a.describe) code = make_jobs(jobs, &num_jobs, &a);
    if (code < 0) code = open_client(&client, &key, &sec, &a);
    a.sec = &sec;
    if (code < 0 && a.describe) code = describe(&client, &a);
    if (code < 0) code = run(&client, jobs, num_jobs, &a);
    client_close(&client);
    wire_security_free(&sec);
    wire_auth_key_clear(&key);
    for (int i = 0; i < num_jobs; i++) {
        free(jobs[i].prompt);
        free(jobs[i].tokens);
        free(jobs[i].gaps);
    }
    free(jobs);
    free(a.embeds);
    free(a.deepstack);
    free(a.image_bytes);
    tokenizer_stream_free(g_text.stream);
    tokenizer_ids_free(&g_text.prompt);
    tokenizer_free(g_text.tok);
    return code;
}
