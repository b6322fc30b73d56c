/* strata-chat: an interactive chat with a running pipeline, the history kept. Each line read
 * from stdin is a user turn; the whole conversation (an optional system message, every user
 * and assistant turn so far, the generation prompt) is rendered with the model's chat
 * template, tokenized and sent to stage 0 as one request; the answer streams to stdout as
 * text (never a broken UTF-8 character) and becomes the next assistant turn. Each turn ends
 * with a usage line on stderr (prompt and generated tokens, time to first token, tokens/s).
 * Lines starting with '/' are commands: /reset forgets the history, /quit (or end of input)
 * ends the chat. Messages given as arguments are sent as turns in order (history kept)
 * instead of reading stdin, for scripts and one-shot questions. A refused turn (e.g. the
 * conversation outgrew the stages' --max-seq) prints the reason and the chat goes on; a lost
 * connection ends it (exit 1). Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad tokenizer or
 * template files. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/stage/client.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "wire/auth.h"
#include "wire/tls.h"

#define PROG "strata-chat"
#define MAX_TURNS 256

static void usage(FILE *out) {
    fprintf(out,
            "usage: " PROG " --model DIR (--port P | --port-file F) [options] [MESSAGE...]\n"
            "\n"
            "Interactive chat with a running pipeline: every stdin line is a user turn, the\n"
            "answer streams to stdout, the history is kept (rendered with DIR's chat template).\n"
            "Commands: /reset (forget the history), /quit (or end of input). MESSAGEs given\n"
            "as arguments are sent as turns in order instead of reading stdin.\n"
            "\n"
            "  --model DIR          tokenizer.json, tokenizer_config.json (chat template)\n"
            "  --host H             stage 0's host (default 127.0.0.1)\n"
            "  --port P | --port-file F   stage 0's client port\n"
            "  --system T           a system message before the conversation\n"
            "  --think              let Qwen3 think (default: the empty think block)\n"
            "  --max-tokens N       tokens per answer at most (default 256)\n"
            "  --temperature F --top-k K --top-p P --seed S   sampling (default greedy)\n"
            "  --auth-key-file F | --tls-cert F --tls-key F --tls-ca F | --insecure\n"
            "                       link security, as for strata-client (one is required)\n"
            "  --timeout-ms N       give up on a silent pipeline after N ms (default 60000)\n"
            "  -h, --help           this text\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 bad tokenizer or template files.\n");
}

struct chat_args {
    const char *model, *host, *port_file, *system, *key_file, *tls_cert, *tls_key, *tls_ca;
    int port, think, max_tokens, timeout_ms, insecure;
    struct sampler_params sampling;
};

static int parse_sampling(struct chat_args *a, int c, const char *arg) {
    char *end = NULL;
    double v = strtod(arg, &end);
    if (!end || *end || end == arg) return -1;
    switch (c) {
    case 't': a->sampling.temperature = (float)v; return v >= 0 ? 0 : -1;
    case 'p': a->sampling.top_p = (float)v; return v > 0 && v <= 1 ? 0 : -1;
    case 'k': a->sampling.top_k = (int)v; return v >= 0 && v == (int)v ? 0 : -1;
    default: a->sampling.seed = (uint64_t)v; return v >= 0 && v == (double)(uint64_t)v ? 0 : -1;
    }
}

/* Returns -1 to go on, else the exit code. */
static int parse_args(struct chat_args *a, int argc, char **argv) {
    static const struct option opts[] = {{"model", 1, 0, 'm'},
                                         {"host", 1, 0, 'H'},
                                         {"port", 1, 0, 'P'},
                                         {"port-file", 1, 0, 'F'},
                                         {"system", 1, 0, 'y'},
                                         {"think", 0, 0, 'Z'},
                                         {"max-tokens", 1, 0, 'n'},
                                         {"temperature", 1, 0, 't'},
                                         {"top-k", 1, 0, 'k'},
                                         {"top-p", 1, 0, 'p'},
                                         {"seed", 1, 0, 's'},
                                         {"auth-key-file", 1, 0, 'a'},
                                         {"tls-cert", 1, 0, 'E'},
                                         {"tls-key", 1, 0, 'K'},
                                         {"tls-ca", 1, 0, 'A'},
                                         {"insecure", 0, 0, 'I'},
                                         {"timeout-ms", 1, 0, 'T'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    *a = (struct chat_args){.host = "127.0.0.1", .max_tokens = 256, .timeout_ms = 60000};
    a->sampling.top_p = 1.0f;
    int c, bad = 0;
    while (!bad && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'H': a->host = optarg; break;
        case 'P': bad = cli_parse_int(optarg, 1, 65535, &a->port) < 0; break;
        case 'F': a->port_file = optarg; break;
        case 'y': a->system = optarg; break;
        case 'Z': a->think = 1; break;
        case 'n': bad = cli_parse_int(optarg, 1, 1 << 20, &a->max_tokens) < 0; break;
        case 'T': bad = cli_parse_int(optarg, 1, 1 << 30, &a->timeout_ms) < 0; break;
        case 't':
        case 'k':
        case 'p':
        case 's': bad = parse_sampling(a, c, optarg) < 0; break;
        case 'a': a->key_file = optarg; break;
        case 'E': a->tls_cert = optarg; break;
        case 'K': a->tls_key = optarg; break;
        case 'A': a->tls_ca = optarg; break;
        case 'I': a->insecure = 1; break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: bad = 1;
        }
    }
    if (!bad && a->port_file && cli_read_port_file(a->port_file, &a->port) < 0) {
        fprintf(stderr, PROG ": %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    if (bad || !a->model || a->port <= 0) {
        if (!bad) fprintf(stderr, PROG ": need --model and --port or --port-file\n");
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

/* The conversation and what a turn needs. */
struct chat {
    struct tokenizer *tok;
    enum chat_template_kind kind;
    struct chat_message turns[MAX_TURNS + 1]; /* [0] = system when given */
    char *owned[MAX_TURNS + 1];
    int n_turns, first; /* first = 1 when there is no system message */
    int32_t eos[TOKENIZER_MAX_EOS];
    int n_eos;
    uint64_t nonce;
};

static void chat_reset(struct chat *ch) {
    for (int i = 1; i < ch->n_turns; ++i) {
        free(ch->owned[i]);
        ch->owned[i] = NULL;
    }
    ch->n_turns = 1;
}

static int chat_push(struct chat *ch, enum chat_role role, char *text) {
    if (ch->n_turns > MAX_TURNS) {
        free(text);
        return strata_set_error(STRATA_ERANGE, "more than %d turns: /reset", MAX_TURNS);
    }
    ch->owned[ch->n_turns] = text;
    ch->turns[ch->n_turns++] = (struct chat_message){role, text, NULL, 0, NULL};
    return 0;
}

/* The conversation so far with the generation prompt, as token ids. */
static int chat_encode(struct chat *ch, const struct chat_args *a, struct tokenizer_ids *ids) {
    struct chat_options o = {1, a->think ? CHAT_THINKING_ON : CHAT_THINKING_OFF, 0};
    char *text = NULL;
    size_t len = 0;
    int rc = chat_template_render(ch->kind, ch->turns + ch->first,
                                  (size_t)(ch->n_turns - ch->first), &o, &text, &len);
    ids->n = 0;
    if (rc == 0) rc = tokenizer_encode(ch->tok, text, len, ids);
    free(text);
    return rc;
}

/* Growable answer text. */
struct text_buf {
    char *data;
    size_t len, cap;
};

static int text_append(struct text_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->data, cap);
        if (!p) return strata_set_error(STRATA_ENOMEM, "out of memory for the answer");
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

/* Streams one answer: prints its text as it completes and keeps it in `answer` (eos and other
 * special tokens are not part of the text). Returns 0, 1 for a refused request (the chat
 * goes on), or a negative status for a lost connection. */
static int stream_answer(struct strata_client *cl, struct chat *ch, const struct chat_args *a,
                         struct text_buf *answer, int *n_gen, double *ttft) {
    struct tokenizer_stream *ts = NULL;
    int rc = tokenizer_stream_new(&ts, ch->tok, 1);
    double t0 = cli_now_sec();
    const char *piece;
    size_t len;
    while (rc == 0) {
        struct request_event ev;
        rc = client_next_event(cl, &ev, a->timeout_ms);
        if (rc < 0) break;
        if (ev.kind != REQUEST_EVENT_TOKEN) {
            fprintf(stderr, "\n" PROG ": %s\n", ev.message);
            rc = ev.kind == REQUEST_EVENT_ERROR ? 1 : STRATA_ECLOSED;
            break;
        }
        if (ev.nonce != ch->nonce) continue; /* a late token of a turn given up on */
        if ((*n_gen)++ == 0) *ttft = cli_now_sec() - t0;
        rc = tokenizer_stream_push(ts, ev.token, &piece, &len);
        if (rc == 0 && len) {
            fwrite(piece, 1, len, stdout);
            fflush(stdout);
            rc = text_append(answer, piece, len);
        }
        if (ev.finish != WIRE_FINISH_NONE) break;
    }
    if (rc == 0 && tokenizer_stream_flush(ts, &piece, &len) == 0 && len) {
        fwrite(piece, 1, len, stdout);
        rc = text_append(answer, piece, len);
    }
    tokenizer_stream_free(ts);
    return rc;
}

/* One user turn: render, submit, stream, keep the answer. Returns 0 (also for a refused
 * turn, which leaves the history as it was) or a negative status that ends the chat. */
static int chat_turn(struct strata_client *cl, struct chat *ch, const struct chat_args *a,
                     const char *line) {
    struct tokenizer_ids ids = {0};
    struct text_buf answer = {0};
    char *user = strdup(line);
    int n_gen = 0, rc = user ? chat_push(ch, CHAT_ROLE_USER, user) : STRATA_ENOMEM;
    double ttft = 0, t0 = cli_now_sec();
    if (rc == 0) rc = chat_encode(ch, a, &ids);
    if (rc == 0) {
        struct stage_request req = {.nonce = ++ch->nonce,
                                    .prompt = ids.ids,
                                    .prompt_len = (int)ids.n,
                                    .max_tokens = a->max_tokens,
                                    .sampling = a->sampling};
        req.num_stop_ids = ch->n_eos;
        memcpy(req.stop_ids, ch->eos, sizeof(int32_t) * (size_t)ch->n_eos);
        rc = client_submit(cl, &req);
        if (rc == 0) rc = stream_answer(cl, ch, a, &answer, &n_gen, &ttft);
    }
    if (rc == 0) {
        double s = cli_now_sec() - t0;
        printf("\n");
        fprintf(stderr, "[%zu prompt tokens, %d generated, first token %.0f ms, %.1f tokens/s]\n",
                ids.n, n_gen, ttft * 1e3, n_gen > 1 ? (n_gen - 1) / (s - ttft) : 0.0);
        rc = chat_push(ch, CHAT_ROLE_ASSISTANT, answer.data ? answer.data : strdup(""));
        answer.data = NULL;
    } else if (rc > 0 || rc == STRATA_EINVAL || rc == STRATA_ERANGE) {
        if (rc < 0) fprintf(stderr, PROG ": %s\n", strata_last_error());
        free(ch->owned[--ch->n_turns]); /* the refused user turn leaves the history */
        ch->owned[ch->n_turns] = NULL;
        rc = 0;
    }
    free(answer.data);
    tokenizer_ids_free(&ids);
    return rc;
}

/* Sends each argument as a turn. Returns the exit code. */
static int chat_args_turns(struct strata_client *cl, struct chat *ch, const struct chat_args *a,
                           char **msgs, int n) {
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; ++i)
        rc = chat_turn(cl, ch, a, msgs[i]);
    if (rc) fprintf(stderr, PROG ": %s\n", strata_last_error());
    return rc ? STRATA_EXIT_FAILURE : STRATA_EXIT_OK;
}

/* Reads turns until /quit or end of input. Returns the exit code. */
static int chat_loop(struct strata_client *cl, struct chat *ch, const struct chat_args *a) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int tty = isatty(0), rc = 0;
    if (tty) fprintf(stderr, "chat with %s (/reset, /quit)\n> ", a->model);
    while (rc == 0 && (n = getline(&line, &cap, stdin)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            chat_reset(ch);
            fprintf(stderr, "(history cleared)\n");
        } else if (line[0] == '/') {
            fprintf(stderr, "unknown command %s (/reset, /quit)\n", line);
        } else if (n > 0) {
            rc = chat_turn(cl, ch, a, line);
        }
        if (tty && rc == 0) fprintf(stderr, "> ");
    }
    free(line);
    if (rc) fprintf(stderr, PROG ": %s\n", strata_last_error());
    return rc ? STRATA_EXIT_FAILURE : STRATA_EXIT_OK;
}

static int open_link(struct strata_client *cl, struct wire_auth_key *key, struct wire_security *sec,
                     const struct chat_args *a) {
    struct wire_security_flags flags = {a->tls_cert, a->tls_key, a->tls_ca, a->insecure, key};
    int rc = wire_auth_key_load(key, a->key_file, NULL);
    if (rc == 0) rc = wire_security_setup(sec, &flags);
    if (rc < 0) {
        fprintf(stderr, PROG ": %s\n", strata_last_error());
        return rc == STRATA_EINVAL ? STRATA_EXIT_USAGE : STRATA_EXIT_FAILURE;
    }
    if (sec->warning) fprintf(stderr, PROG ": warning: %s\n", sec->warning);
    if (client_connect_tls(cl, a->host, a->port, sec->tls, sec->hello_key, 5000) < 0) {
        fprintf(stderr, PROG ": %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    return -1;
}

int main(int argc, char **argv) {
    static struct chat_args a;
    static struct chat ch;
    struct strata_client cl = {0};
    struct wire_auth_key key = {0};
    struct wire_security sec = {0};
    signal(SIGPIPE, SIG_IGN);
    int rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    if (tokenizer_load(&ch.tok, a.model) < 0 || chat_template_load(&ch.kind, a.model) < 0) {
        fprintf(stderr, PROG ": %s\n", strata_last_error());
        tokenizer_free(ch.tok);
        return STRATA_EXIT_INPUT;
    }
    ch.n_eos = tokenizer_eos_ids(ch.tok, ch.eos);
    ch.turns[0] = (struct chat_message){CHAT_ROLE_SYSTEM, a.system, NULL, 0, NULL};
    ch.first = a.system ? 0 : 1;
    ch.n_turns = 1;
    rc = open_link(&cl, &key, &sec, &a);
    if (rc < 0)
        rc = optind < argc ? chat_args_turns(&cl, &ch, &a, argv + optind, argc - optind)
                           : chat_loop(&cl, &ch, &a);
    chat_reset(&ch);
    client_close(&cl);
    wire_security_free(&sec);
    tokenizer_free(ch.tok);
    return rc;
}
