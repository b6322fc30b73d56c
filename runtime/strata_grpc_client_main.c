/* strata-grpc-client: a small client of strata-serve's gRPC service (runtime/serve/strata.proto)
 * on gRPC core's C API and protobuf-c: Generate (token ids or text), Chat, Health and Info.
 * The answer's text streams to stdout as it arrives; the tokens, finish reason, usage and the
 * call's status go to stderr. --cancel-after and --deadline-ms end a stream early and
 * --raw-request sends any bytes, for tests. Exit codes: 0 status OK, 1 any other status or a
 * failure, 2 usage. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/serve/strata.pb-c.h"

#define MAX_STOPS 4
#define MAX_IDS 65536

static void usage(FILE *out) {
    fprintf(out, "usage: strata-grpc-client --addr HOST:PORT|--port-file F [what] [options]\n"
                 "A client of strata-serve --grpc-port (service strata.v1.Strata).\n"
                 "what (one):\n"
                 "  --prompt 1,2,3       Generate from token ids\n"
                 "  --text T             Generate from text (tokenized as is)\n"
                 "  --chat MSG           Chat: one user message (after --system S when given)\n"
                 "  --health             Health        --info   Info\n"
                 "  --method PATH        call PATH (e.g. /strata.v1.Strata/Generate) with the\n"
                 "                       request --raw-request FILE (bytes sent as they are)\n"
                 "options:\n"
                 "  --host H             with --port-file (default 127.0.0.1)\n"
                 "  --model NAME         the model id to ask for (default: the served one)\n"
                 "  --max-tokens N --temperature T --top-p P --top-k K --seed S\n"
                 "  --stop S             a stop string (up to 4)\n"
                 "  --ignore-eos         generate past end-of-sequence ids\n"
                 "  --think              Chat: let Qwen3 think\n"
                 "  --deadline-ms MS     the call's deadline (default none)\n"
                 "  --cancel-after N     cancel the call after N response messages\n"
                 "  --chunks             one line per response message on stdout instead of text\n"
                 "  --help               this text\n"
                 "stderr ends with 'tokens: ...', 'finish: ...', 'usage: ...' (streams) and\n"
                 "'status: CODE NAME: message'.\n");
}

struct args {
    char addr[300];
    const char *host, *port_file, *text, *chat, *system, *model, *method, *raw_request;
    int32_t *ids;
    size_t n_ids;
    int health, info, chunks, think, ignore_eos;
    int max_tokens, top_k, deadline_ms, cancel_after;
    int has_temperature, has_top_p, has_seed;
    float temperature, top_p;
    unsigned long long seed;
    const char *stops[MAX_STOPS];
    int n_stops;
};

static int parse_ids(struct args *a, const char *text) {
    a->ids = calloc(MAX_IDS, sizeof(int32_t));
    char *copy = strdup(text), *save = NULL;
    if (!a->ids || !copy) return -1;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int v;
        if (a->n_ids == MAX_IDS || cli_parse_int(t, INT32_MIN, INT32_MAX, &v) < 0) {
            free(copy);
            return -1;
        }
        a->ids[a->n_ids++] = v;
    }
    free(copy);
    return a->n_ids ? 0 : -1;
}

static int parse_float(const char *text, float *out) {
    char *end;
    *out = strtof(text, &end);
    return *end || end == text ? -1 : 0;
}

static int parse_option(struct args *a, int c) {
    switch (c) {
    case 'a': snprintf(a->addr, sizeof a->addr, "%s", optarg); return 0;
    case 'H': a->host = optarg; return 0;
    case 'F': a->port_file = optarg; return 0;
    case 'p': return parse_ids(a, optarg);
    case 't': a->text = optarg; return 0;
    case 'c': a->chat = optarg; return 0;
    case 'S': a->system = optarg; return 0;
    case 'h': a->health = 1; return 0;
    case 'i': a->info = 1; return 0;
    case 'M': a->method = optarg; return 0;
    case 'r': a->raw_request = optarg; return 0;
    case 'm': a->model = optarg; return 0;
    case 'n': return cli_parse_int(optarg, 0, 1 << 30, &a->max_tokens);
    case 'T': a->has_temperature = 1; return parse_float(optarg, &a->temperature);
    case 'P': a->has_top_p = 1; return parse_float(optarg, &a->top_p);
    case 'K': return cli_parse_int(optarg, 0, 1 << 30, &a->top_k);
    case 's': a->has_seed = 1; return sscanf(optarg, "%llu", &a->seed) == 1 ? 0 : -1;
    case 'o':
        if (a->n_stops == MAX_STOPS) return -1;
        a->stops[a->n_stops++] = optarg;
        return 0;
    case 'e': a->ignore_eos = 1; return 0;
    case 'k': a->think = 1; return 0;
    case 'd': return cli_parse_int(optarg, 1, 1 << 30, &a->deadline_ms);
    case 'C': return cli_parse_int(optarg, 1, 1 << 30, &a->cancel_after);
    case 'u': a->chunks = 1; return 0;
    default: return -1;
    }
}

/* Returns the exit code, or -1 to go on. */
static int parse_args(struct args *a, int argc, char **argv) {
    static const struct option options[] = {{"addr", 1, 0, 'a'},
                                            {"host", 1, 0, 'H'},
                                            {"port-file", 1, 0, 'F'},
                                            {"prompt", 1, 0, 'p'},
                                            {"text", 1, 0, 't'},
                                            {"chat", 1, 0, 'c'},
                                            {"system", 1, 0, 'S'},
                                            {"health", 0, 0, 'h'},
                                            {"info", 0, 0, 'i'},
                                            {"method", 1, 0, 'M'},
                                            {"raw-request", 1, 0, 'r'},
                                            {"model", 1, 0, 'm'},
                                            {"max-tokens", 1, 0, 'n'},
                                            {"temperature", 1, 0, 'T'},
                                            {"top-p", 1, 0, 'P'},
                                            {"top-k", 1, 0, 'K'},
                                            {"seed", 1, 0, 's'},
                                            {"stop", 1, 0, 'o'},
                                            {"ignore-eos", 0, 0, 'e'},
                                            {"think", 0, 0, 'k'},
                                            {"deadline-ms", 1, 0, 'd'},
                                            {"cancel-after", 1, 0, 'C'},
                                            {"chunks", 0, 0, 'u'},
                                            {"help", 0, 0, 'x'},
                                            {0, 0, 0, 0}};
    int c, bad = 0;
    memset(a, 0, sizeof *a);
    a->host = "127.0.0.1";
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (c == 'x') {
            usage(stdout);
            return STRATA_EXIT_OK;
        }
        if (parse_option(a, c) < 0) {
            fprintf(stderr, "strata-grpc-client: bad value for --%s\n",
                    optind > 0 && optind <= argc ? argv[optind - 1] : "?");
            bad = 1;
        }
    }
    int what = (a->ids != NULL) + !!a->text + !!a->chat + a->health + a->info + !!a->method;
    if (bad || optind < argc || what != 1 || (!a->addr[0] == !a->port_file) ||
        (!a->method != !a->raw_request)) {
        fprintf(stderr, "strata-grpc-client: need one of --addr / --port-file and one of "
                        "--prompt, --text, --chat, --health, --info, --method with "
                        "--raw-request\n");
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

static Strata__V1__GenerationParams *params_of(const struct args *a,
                                               Strata__V1__GenerationParams *p) {
    strata__v1__generation_params__init(p);
    p->max_tokens = (uint32_t)a->max_tokens;
    p->top_k = (uint32_t)a->top_k;
    p->ignore_eos = a->ignore_eos;
    if (a->has_temperature) {
        p->temperature_opt_case = STRATA__V1__GENERATION_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
        p->temperature = a->temperature;
    }
    if (a->has_top_p) {
        p->top_p_opt_case = STRATA__V1__GENERATION_PARAMS__TOP_P_OPT_TOP_P;
        p->top_p = a->top_p;
    }
    if (a->has_seed) {
        p->seed_opt_case = STRATA__V1__GENERATION_PARAMS__SEED_OPT_SEED;
        p->seed = a->seed;
    }
    p->n_stop = (size_t)a->n_stops;
    p->stop = (char **)a->stops;
    return p;
}

/* The request message's bytes (malloc'ed) and the method it goes to. */
static int build_request(const struct args *a, uint8_t **out, size_t *len, const char **method) {
    Strata__V1__GenerationParams params;
    Strata__V1__GenerateRequest gen = STRATA__V1__GENERATE_REQUEST__INIT;
    Strata__V1__TokenIds ids = STRATA__V1__TOKEN_IDS__INIT;
    Strata__V1__ChatRequest chat = STRATA__V1__CHAT_REQUEST__INIT;
    Strata__V1__ChatMessage msgs[2] = {STRATA__V1__CHAT_MESSAGE__INIT,
                                       STRATA__V1__CHAT_MESSAGE__INIT};
    Strata__V1__ChatMessage *msg_ptrs[2] = {&msgs[0], &msgs[1]};
    Strata__V1__HealthRequest health = STRATA__V1__HEALTH_REQUEST__INIT;
    Strata__V1__InfoRequest info = STRATA__V1__INFO_REQUEST__INIT;
    const ProtobufCMessage *m;
    if (a->raw_request) {
        *method = a->method;
        return cli_read_file((char **)out, len, a->raw_request);
    }
    if (a->chat) {
        size_t n = 0;
        if (a->system) {
            msgs[n].role = "system";
            msgs[n++].content = (char *)a->system;
        }
        msgs[n].role = "user";
        msgs[n++].content = (char *)a->chat;
        chat.model = (char *)(a->model ? a->model : "");
        chat.n_messages = n;
        chat.messages = msg_ptrs;
        chat.params = params_of(a, &params);
        chat.enable_thinking = a->think;
        m = &chat.base;
        *method = "/strata.v1.Strata/Chat";
    } else if (a->health || a->info) {
        m = a->health ? &health.base : &info.base;
        *method = a->health ? "/strata.v1.Strata/Health" : "/strata.v1.Strata/Info";
    } else {
        gen.model = (char *)(a->model ? a->model : "");
        if (a->text) {
            gen.prompt_case = STRATA__V1__GENERATE_REQUEST__PROMPT_TEXT;
            gen.text = (char *)a->text;
        } else {
            ids.n_ids = a->n_ids;
            ids.ids = a->ids;
            gen.prompt_case = STRATA__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
            gen.token_ids = &ids;
        }
        gen.params = params_of(a, &params);
        m = &gen.base;
        *method = "/strata.v1.Strata/Generate";
    }
    *len = protobuf_c_message_get_packed_size(m);
    *out = malloc(*len ? *len : 1);
    if (!*out) return strata_set_error(STRATA_ENOMEM, "no memory");
    protobuf_c_message_pack(m, *out);
    return 0;
}

static const char *status_name(grpc_status_code code) {
    static const char *names[] = {"OK",
                                  "CANCELLED",
                                  "UNKNOWN",
                                  "INVALID_ARGUMENT",
                                  "DEADLINE_EXCEEDED",
                                  "NOT_FOUND",
                                  "ALREADY_EXISTS",
                                  "PERMISSION_DENIED",
                                  "RESOURCE_EXHAUSTED",
                                  "FAILED_PRECONDITION",
                                  "ABORTED",
                                  "OUT_OF_RANGE",
                                  "UNIMPLEMENTED",
                                  "INTERNAL",
                                  "UNAVAILABLE",
                                  "DATA_LOSS",
                                  "UNAUTHENTICATED"};
    return (unsigned)code < sizeof names / sizeof names[0] ? names[code] : "?";
}

/* What a stream told so far. */
struct result {
    int32_t *tokens;
    size_t n_tokens, cap;
    int messages;
    const char *finish;
    unsigned prompt_tokens, completion_tokens;
    int has_usage;
};

static int add_tokens(struct result *r, const int32_t *ids, size_t n) {
    if (r->n_tokens + n > r->cap) {
        size_t cap = (r->n_tokens + n) * 2;
        int32_t *t = realloc(r->tokens, cap * sizeof *t);
        if (!t) return -1;
        r->tokens = t;
        r->cap = cap;
    }
    memcpy(r->tokens + r->n_tokens, ids, n * sizeof *ids);
    r->n_tokens += n;
    return 0;
}

static void print_chunk(const Strata__V1__GenerateResponse *m, int k) {
    cJSON *s = cJSON_CreateString(m->text);
    char *json = s ? cJSON_PrintUnformatted(s) : NULL;
    printf("chunk %d: ids", k);
    for (size_t i = 0; i < m->n_token_ids; i++)
        printf("%s%d", i ? "," : "=", (int)m->token_ids[i]);
    printf(" text=%s finish=%d\n", json ? json : "?", (int)m->finish_reason);
    free(json);
    cJSON_Delete(s);
}

/* One GenerateResponse. -1 when it is not one. */
static int on_generate(const struct args *a, struct result *r, const uint8_t *data, size_t len) {
    Strata__V1__GenerateResponse *m = strata__v1__generate_response__unpack(NULL, len, data);
    if (!m) return strata_set_error(STRATA_EFORMAT, "a response is not a GenerateResponse");
    if (a->chunks)
        print_chunk(m, r->messages);
    else
        fputs(m->text, stdout);
    fflush(stdout);
    int rc = add_tokens(r, m->token_ids, m->n_token_ids);
    if (m->finish_reason == STRATA__V1__FINISH_REASON__FINISH_REASON_STOP) r->finish = "stop";
    if (m->finish_reason == STRATA__V1__FINISH_REASON__FINISH_REASON_LENGTH) r->finish = "length";
    if (m->usage) {
        r->has_usage = 1;
        r->prompt_tokens = m->usage->prompt_tokens;
        r->completion_tokens = m->usage->completion_tokens;
    }
    strata__v1__generate_response__free_unpacked(m, NULL);
    return rc;
}

static int on_health_or_info(const struct args *a, const uint8_t *data, size_t len) {
    if (a->health) {
        Strata__V1__HealthResponse *m = strata__v1__health_response__unpack(NULL, len, data);
        if (!m) return strata_set_error(STRATA_EFORMAT, "the response is not a HealthResponse");
        const char *s =
            m->status == STRATA__V1__HEALTH_RESPONSE__SERVING_STATUS__SERVING       ? "SERVING"
            : m->status == STRATA__V1__HEALTH_RESPONSE__SERVING_STATUS__NOT_SERVING ? "NOT_SERVING"
                                                                                    : "UNKNOWN";
        printf("health: %s%s%s\n", s, m->message[0] ? ": " : "", m->message);
        strata__v1__health_response__free_unpacked(m, NULL);
        return 0;
    }
    Strata__V1__InfoResponse *m = strata__v1__info_response__unpack(NULL, len, data);
    if (!m) return strata_set_error(STRATA_EFORMAT, "the response is not an InfoResponse");
    printf("model: %s\nmax_seq: %u\nvocab_size: %u\neos_ids:", m->model, (unsigned)m->max_seq,
           (unsigned)m->vocab_size);
    for (size_t i = 0; i < m->n_eos_ids; i++)
        printf(" %d", (int)m->eos_ids[i]);
    printf("\nchat_template: %s\nwire_version: %s\ngrpc_version: %s\nstrata_version: %s\n",
           m->chat_template ? "yes" : "no", m->wire_version, m->grpc_version, m->strata_version);
    if (m->stages_error[0]) printf("stages_error: %s\n", m->stages_error);
    for (size_t i = 0; i < m->n_stages; i++) { /* "stage 0 layers [0,2) roles embed ..." */
        const Strata__V1__StageInfo *e = m->stages[i];
        printf("stage %d layers [%d,%d) roles %s%s%s%s grid %dx%d threads %d weights %s "
               "version %s device %s\n",
               (int)e->stage_index, (int)e->layer_start, (int)e->layer_end, e->embed ? "embed" : "",
               e->vision ? (e->embed ? ",vision" : "vision") : "",
               e->head ? (e->embed || e->vision ? ",head" : "head") : "",
               e->embed || e->vision || e->head ? "" : "-", (int)e->tp, (int)e->kvp,
               (int)e->threads, e->weights_dtype, e->version, e->device);
    }
    strata__v1__info_response__free_unpacked(m, NULL);
    return 0;
}

static int on_message(const struct args *a, struct result *r, grpc_byte_buffer *bb) {
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return strata_set_error(STRATA_EIO, "cannot read a response");
    grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    const uint8_t *data = GRPC_SLICE_START_PTR(s);
    size_t len = GRPC_SLICE_LENGTH(s);
    int rc;
    if (a->method)
        rc = (printf("message: %zu bytes\n", len), 0);
    else if (a->health || a->info)
        rc = on_health_or_info(a, data, len);
    else
        rc = on_generate(a, r, data, len);
    grpc_slice_unref(s);
    r->messages++;
    return rc;
}

/* The call's state on the client's one queue. */
struct call {
    grpc_completion_queue *cq;
    grpc_call *call;
    int status_done;
};

static char tag_start, tag_recv, tag_status;

/* Waits for `tag` (noting the status on the way). 1 on success, 0 on failure. */
static int wait_for(struct call *c, void *tag) {
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(c->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE) return 0;
        if (ev.tag == &tag_status) c->status_done = 1;
        if (ev.tag == tag) return ev.success != 0;
    }
}

/* Reads response messages until the stream ends (or --cancel-after). */
static int read_stream(const struct args *a, struct call *c, struct result *r) {
    for (;;) {
        grpc_byte_buffer *bb = NULL;
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &bb;
        if (grpc_call_start_batch(c->call, &op, 1, &tag_recv, NULL) != GRPC_CALL_OK ||
            !wait_for(c, &tag_recv) || !bb)
            return 0;
        int rc = on_message(a, r, bb);
        grpc_byte_buffer_destroy(bb);
        if (rc < 0) return rc;
        if (a->cancel_after && r->messages >= a->cancel_after) {
            fprintf(stderr, "cancelling after %d messages\n", r->messages);
            grpc_call_cancel(c->call, NULL);
        }
    }
}

static void print_summary(const struct args *a, const struct result *r) {
    if (a->health || a->info || a->method) return;
    if (!a->chunks && r->messages) printf("\n");
    fprintf(stderr, "tokens: ");
    for (size_t i = 0; i < r->n_tokens; i++)
        fprintf(stderr, "%s%d", i ? "," : "", (int)r->tokens[i]);
    fprintf(stderr, "\nmessages: %d\nfinish: %s\n", r->messages, r->finish ? r->finish : "none");
    if (r->has_usage)
        fprintf(stderr, "usage: prompt %u completion %u\n", r->prompt_tokens, r->completion_tokens);
}

/* Runs one call: sends the request, reads the stream, prints the status. Exit code. */
static int run_call(const struct args *a, grpc_channel *ch, grpc_completion_queue *cq,
                    const char *method, uint8_t *req, size_t req_len) {
    gpr_timespec deadline = a->deadline_ms
                                ? gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                               gpr_time_from_millis(a->deadline_ms, GPR_TIMESPAN))
                                : gpr_inf_future(GPR_CLOCK_REALTIME);
    grpc_slice method_slice = grpc_slice_from_static_string(method);
    struct call c = {cq,
                     grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method_slice,
                                              NULL, deadline, NULL),
                     0};
    grpc_slice req_slice = grpc_slice_new(req, req_len, free);
    grpc_byte_buffer *req_bb = grpc_raw_byte_buffer_create(&req_slice, 1);
    grpc_slice_unref(req_slice);
    grpc_metadata_array initial_md, trailing_md;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    grpc_call_start_batch(c.call, ops, 4, &tag_start, NULL);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[0].data.recv_status_on_client.status = &status;
    ops[0].data.recv_status_on_client.status_details = &details;
    grpc_call_start_batch(c.call, ops, 1, &tag_status, NULL);
    wait_for(&c, &tag_start);
    struct result r = {0};
    int rc = read_stream(a, &c, &r);
    if (rc < 0) {
        fprintf(stderr, "strata-grpc-client: %s\n", strata_last_error());
        grpc_call_cancel(c.call, NULL);
    }
    if (!c.status_done) wait_for(&c, &tag_status);
    print_summary(a, &r);
    char *msg = grpc_slice_to_c_string(details);
    fprintf(stderr, "status: %d %s: %s\n", (int)status, status_name(status), msg);
    gpr_free(msg);
    free(r.tokens);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_byte_buffer_destroy(req_bb);
    grpc_call_unref(c.call);
    return rc == 0 && status == GRPC_STATUS_OK ? STRATA_EXIT_OK : STRATA_EXIT_FAILURE;
}

static int resolve_addr(struct args *a) {
    int port = 0;
    if (!a->port_file) return 0;
    for (int i = 0; i < 200 && cli_read_port_file(a->port_file, &port) < 0; i++)
        usleep(50000);
    if (port <= 0) {
        fprintf(stderr, "strata-grpc-client: no port in %s\n", a->port_file);
        return -1;
    }
    snprintf(a->addr, sizeof a->addr, "%s:%d", a->host, port);
    return 0;
}

int main(int argc, char **argv) {
    static struct args a;
    int code = parse_args(&a, argc, argv);
    if (code >= 0) return code;
    uint8_t *req = NULL;
    size_t req_len = 0;
    const char *method = NULL;
    if (resolve_addr(&a) < 0) return STRATA_EXIT_FAILURE;
    if (build_request(&a, &req, &req_len, &method) < 0) {
        fprintf(stderr, "strata-grpc-client: %s\n", strata_last_error());
        free(a.ids);
        return STRATA_EXIT_USAGE;
    }
    grpc_init();
    grpc_arg arg = {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = 1 << 24}};
    grpc_channel_args args = {1, &arg};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(a.addr, creds, &args);
    grpc_channel_credentials_release(creds);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    code = run_call(&a, ch, cq, method, req, req_len);
    grpc_channel_destroy(ch);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    grpc_shutdown();
    free(a.ids);
    return code;
}
