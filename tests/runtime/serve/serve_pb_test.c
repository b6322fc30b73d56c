/* The gRPC front's messages (runtime/serve/serve_pb): requests packed with the generated
 * protobuf-c code decode into the same serve_params the HTTP front fills (defaults, presence
 * of the optional scalars, every field), each bad request is refused with its field, and the
 * packed responses read back as what was put in. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/serve/serve_pb.h"
#include "runtime/serve/strata.pb-c.h"

static const struct serve_limits LIMITS = {"qwen3", 512};

/* Packs m and decodes it with `parse`; returns its result (p and err filled). */
static int roundtrip(const ProtobufCMessage *m,
                     int (*parse)(struct serve_params *, const uint8_t *, size_t,
                                  const struct serve_limits *, struct serve_error *),
                     struct serve_params *p, struct serve_error *err) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n + 1);
    assert_non_null(buf);
    protobuf_c_message_pack(m, buf);
    int rc = parse(p, buf, n, &LIMITS, err);
    free(buf);
    return rc;
}

static int generate_ids(Strata__V1__GenerationParams *params, struct serve_params *p,
                        struct serve_error *err) {
    int32_t ids[] = {9707, 11, 1879};
    Strata__V1__TokenIds t = STRATA__V1__TOKEN_IDS__INIT;
    Strata__V1__GenerateRequest m = STRATA__V1__GENERATE_REQUEST__INIT;
    t.n_ids = 3;
    t.ids = ids;
    m.prompt_case = STRATA__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    m.token_ids = &t;
    m.params = params;
    return roundtrip(&m.base, serve_pb_parse_generate, p, err);
}

static void generate_defaults(void **state) {
    struct serve_params p;
    struct serve_error err;
    (void)state;
    assert_int_equal(generate_ids(NULL, &p, &err), 0);
    assert_int_equal(p.kind, SERVE_COMPLETION);
    assert_null(p.prompt);
    assert_int_equal(p.n_prompt_ids, 3);
    assert_int_equal(p.prompt_ids[0], 9707);
    assert_int_equal(p.prompt_ids[2], 1879);
    assert_true(p.temperature == 1.0f && p.top_p == 1.0f);
    assert_int_equal(p.max_tokens, 0);
    assert_int_equal(p.top_k, 0);
    assert_int_equal(p.n_stops, 0);
    assert_int_equal(p.ignore_eos, 0);
    serve_params_free(&p);
}

static void generate_every_field(void **state) {
    struct serve_params p;
    struct serve_error err;
    char *stops[] = {"\n\n", "", "END"};
    Strata__V1__GenerationParams g = STRATA__V1__GENERATION_PARAMS__INIT;
    (void)state;
    g.max_tokens = 7;
    g.temperature_opt_case = STRATA__V1__GENERATION_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
    g.temperature = 0.0f; /* set to 0 (greedy) is not the same as absent (1) */
    g.top_p_opt_case = STRATA__V1__GENERATION_PARAMS__TOP_P_OPT_TOP_P;
    g.top_p = 0.5f;
    g.top_k = 40;
    g.seed_opt_case = STRATA__V1__GENERATION_PARAMS__SEED_OPT_SEED;
    g.seed = 18446744073709551615ull;
    g.n_stop = 3;
    g.stop = stops;
    g.ignore_eos = 1;
    g.speculate = STRATA__V1__SPECULATE__SPECULATE_NGRAM;
    g.speculate_k = 5;
    assert_int_equal(generate_ids(&g, &p, &err), 0);
    assert_int_equal(p.speculate, SERVE_SPECULATE_NGRAM);
    assert_int_equal(p.speculate_k, 5);
    assert_int_equal(p.max_tokens, 7);
    assert_true(p.temperature == 0.0f && p.top_p == 0.5f);
    assert_int_equal(p.top_k, 40);
    assert_true(p.seed == 18446744073709551615ull);
    assert_int_equal(p.n_stops, 2); /* the empty one is ignored, as in the HTTP API */
    assert_string_equal(p.stops[0], "\n\n");
    assert_string_equal(p.stops[1], "END");
    assert_int_equal(p.ignore_eos, 1);
    serve_params_free(&p);
}

static void generate_text_and_model(void **state) {
    struct serve_params p;
    struct serve_error err;
    Strata__V1__GenerateRequest m = STRATA__V1__GENERATE_REQUEST__INIT;
    (void)state;
    m.model = "qwen3";
    m.prompt_case = STRATA__V1__GENERATE_REQUEST__PROMPT_TEXT;
    m.text = "Once upon a time";
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_generate, &p, &err), 0);
    assert_string_equal(p.prompt, "Once upon a time");
    assert_null(p.prompt_ids);
    serve_params_free(&p);
    m.model = "gpt-4";
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_generate, &p, &err), -1);
    assert_string_equal(err.param, "model");
    assert_string_equal(err.code, "model_not_found");
    assert_non_null(strstr(err.message, "'gpt-4' does not exist"));
    serve_params_free(&p);
}

/* Each bad parameter is refused with 400 naming its field. */
static void bad_params(void **state) {
    (void)state;
    struct serve_params p;
    struct serve_error err;
    Strata__V1__GenerationParams g;
    float bad_temps[] = {-0.5f, 2.5f, NAN};
    for (int i = 0; i < 3; i++) {
        g = (Strata__V1__GenerationParams)STRATA__V1__GENERATION_PARAMS__INIT;
        g.temperature_opt_case = STRATA__V1__GENERATION_PARAMS__TEMPERATURE_OPT_TEMPERATURE;
        g.temperature = bad_temps[i];
        assert_int_equal(generate_ids(&g, &p, &err), -1);
        assert_int_equal(err.http_status, 400);
        assert_string_equal(err.param, "temperature");
        serve_params_free(&p);
    }
    float bad_top_p[] = {0.0f, 1.5f, -1.0f};
    for (int i = 0; i < 3; i++) {
        g = (Strata__V1__GenerationParams)STRATA__V1__GENERATION_PARAMS__INIT;
        g.top_p_opt_case = STRATA__V1__GENERATION_PARAMS__TOP_P_OPT_TOP_P;
        g.top_p = bad_top_p[i];
        assert_int_equal(generate_ids(&g, &p, &err), -1);
        assert_string_equal(err.param, "top_p");
        serve_params_free(&p);
    }
    g = (Strata__V1__GenerationParams)STRATA__V1__GENERATION_PARAMS__INIT;
    g.max_tokens = 513;
    assert_int_equal(generate_ids(&g, &p, &err), -1);
    assert_string_equal(err.param, "max_tokens");
    serve_params_free(&p);
    g.max_tokens = 4000000000u; /* past INT_MAX: no wrap to a negative count */
    assert_int_equal(generate_ids(&g, &p, &err), -1);
    assert_string_equal(err.param, "max_tokens");
    serve_params_free(&p);
    g = (Strata__V1__GenerationParams)STRATA__V1__GENERATION_PARAMS__INIT;
    g.top_k = 3000000000u;
    assert_int_equal(generate_ids(&g, &p, &err), -1);
    assert_string_equal(err.param, "top_k");
    serve_params_free(&p);
    g = (Strata__V1__GenerationParams)STRATA__V1__GENERATION_PARAMS__INIT;
    g.speculate = (Strata__V1__Speculate)7; /* an enum value from a newer client */
    assert_int_equal(generate_ids(&g, &p, &err), -1);
    assert_string_equal(err.param, "speculate");
    serve_params_free(&p);
    g = (Strata__V1__GenerationParams)STRATA__V1__GENERATION_PARAMS__INIT;
    g.speculate_k = 17;
    assert_int_equal(generate_ids(&g, &p, &err), -1);
    assert_string_equal(err.param, "speculate_k");
    serve_params_free(&p);
}

static void bad_stops(void **state) {
    struct serve_params p;
    struct serve_error err;
    char *five[] = {"a", "b", "c", "d", "e"};
    char long_stop[SERVE_MAX_STOP_LEN + 2];
    char *one[] = {long_stop};
    Strata__V1__GenerationParams g = STRATA__V1__GENERATION_PARAMS__INIT;
    (void)state;
    g.n_stop = 5;
    g.stop = five;
    assert_int_equal(generate_ids(&g, &p, &err), -1);
    assert_string_equal(err.param, "stop");
    serve_params_free(&p);
    memset(long_stop, 'x', sizeof long_stop - 1);
    long_stop[sizeof long_stop - 1] = '\0';
    g.n_stop = 1;
    g.stop = one;
    assert_int_equal(generate_ids(&g, &p, &err), -1);
    assert_string_equal(err.param, "stop");
    serve_params_free(&p);
}

static void bad_prompts(void **state) {
    struct serve_params p;
    struct serve_error err;
    Strata__V1__GenerateRequest m = STRATA__V1__GENERATE_REQUEST__INIT;
    Strata__V1__TokenIds t = STRATA__V1__TOKEN_IDS__INIT;
    (void)state;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_generate, &p, &err), -1);
    assert_string_equal(err.code, "missing");
    serve_params_free(&p);
    m.prompt_case = STRATA__V1__GENERATE_REQUEST__PROMPT_TEXT;
    m.text = "";
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_generate, &p, &err), -1);
    assert_string_equal(err.param, "text");
    serve_params_free(&p);
    m.prompt_case = STRATA__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    m.token_ids = &t;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_generate, &p, &err), -1);
    assert_string_equal(err.param, "token_ids");
    serve_params_free(&p);
    int32_t *ids = calloc(512, sizeof *ids);
    assert_non_null(ids);
    t.n_ids = 512; /* the prompt alone fills the pipeline's 512 positions */
    t.ids = ids;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_generate, &p, &err), -1);
    assert_string_equal(err.code, "context_length_exceeded");
    serve_params_free(&p);
    free(ids);
}

static void malformed_bytes(void **state) {
    struct serve_params p;
    struct serve_error err;
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff};
    static const uint8_t truncated[] = {0x12, 0x05, 'a'}; /* text, 5 bytes long, 1 given */
    (void)state;
    assert_int_equal(serve_pb_parse_generate(&p, garbage, sizeof garbage, &LIMITS, &err), -1);
    assert_string_equal(err.code, "invalid_message");
    assert_int_equal(serve_pb_status(&err), SERVE_GRPC_INVALID_ARGUMENT);
    serve_params_free(&p);
    assert_int_equal(serve_pb_parse_chat(&p, truncated, sizeof truncated, &LIMITS, &err), -1);
    assert_non_null(strstr(err.message, "strata.v1.ChatRequest"));
    serve_params_free(&p);
}

static void chat_messages(void **state) {
    struct serve_params p;
    struct serve_error err;
    Strata__V1__ChatMessage m0 = STRATA__V1__CHAT_MESSAGE__INIT,
                            m1 = STRATA__V1__CHAT_MESSAGE__INIT;
    Strata__V1__ChatMessage *msgs[] = {&m0, &m1};
    Strata__V1__ChatRequest m = STRATA__V1__CHAT_REQUEST__INIT;
    (void)state;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_chat, &p, &err), -1);
    assert_string_equal(err.param, "messages");
    serve_params_free(&p);
    m0.role = "system";
    m0.content = "Be \"brief\".";
    m1.role = "user";
    m1.content = "Hi\n";
    m.n_messages = 2;
    m.messages = msgs;
    m.enable_thinking = 1;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_chat, &p, &err), 0);
    assert_int_equal(p.kind, SERVE_CHAT);
    assert_string_equal(p.messages_json, "[{\"role\":\"system\",\"content\":\"Be \\\"brief\\\".\"},"
                                         "{\"role\":\"user\",\"content\":\"Hi\\n\"}]");
    assert_int_equal(p.enable_thinking, 1);
    serve_params_free(&p);
}

/* Image parts: bytes into the images in order, {"type":"image"} in the list content; content
 * and parts together, a part with neither text nor image, bytes neither PNG nor JPEG are
 * refused; a video part's MP4 bytes become {"type":"video"}, other bytes are refused. */
static void chat_image_parts(void **state) {
    struct serve_params p;
    struct serve_error err;
    static uint8_t png[] = "\x89PNG\r\n\x1a\nabc", gif[] = "GIF89a";
    Strata__V1__ChatPart img = STRATA__V1__CHAT_PART__INIT, txt = STRATA__V1__CHAT_PART__INIT,
                         none = STRATA__V1__CHAT_PART__INIT;
    Strata__V1__ChatPart *parts[] = {&img, &txt};
    Strata__V1__ChatMessage m0 = STRATA__V1__CHAT_MESSAGE__INIT;
    Strata__V1__ChatMessage *msgs[] = {&m0};
    Strata__V1__ChatRequest m = STRATA__V1__CHAT_REQUEST__INIT;
    (void)state;
    img.part_case = STRATA__V1__CHAT_PART__PART_IMAGE;
    img.image.data = png;
    img.image.len = 11;
    txt.part_case = STRATA__V1__CHAT_PART__PART_TEXT;
    txt.text = "What is it?";
    m0.role = "user";
    m0.n_parts = 2;
    m0.parts = parts;
    m.n_messages = 1;
    m.messages = msgs;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_chat, &p, &err), 0);
    assert_string_equal(p.messages_json, "[{\"role\":\"user\",\"content\":[{\"type\":\"image\"},"
                                         "{\"type\":\"text\",\"text\":\"What is it?\"}]}]");
    assert_int_equal(p.n_images, 1);
    assert_int_equal(p.image_sizes[0], 11);
    assert_int_equal(p.image_formats[0], SERVE_IMAGE_PNG);
    assert_memory_equal(p.image_bytes, png, 11);
    serve_params_free(&p);
    m0.content = "both";
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_chat, &p, &err), -1);
    assert_int_equal(err.http_status, 400);
    serve_params_free(&p);
    m0.content = "";
    parts[1] = &none;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_chat, &p, &err), -1);
    assert_non_null(strstr(err.message, "'text', 'image' or 'video'"));
    serve_params_free(&p);
    img.image.data = gif;
    img.image.len = 6;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_chat, &p, &err), -1);
    assert_string_equal(err.code, "unsupported_image_format");
    serve_params_free(&p);
    /* a video part: MP4 bytes, {"type":"video"}; an image's bytes as a video are refused */
    static uint8_t mp4[] = "\0\0\0\x18" "ftypisomabcd";
    parts[1] = &txt;
    img.part_case = STRATA__V1__CHAT_PART__PART_VIDEO;
    img.video.data = mp4;
    img.video.len = 16;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_chat, &p, &err), 0);
    assert_string_equal(p.messages_json, "[{\"role\":\"user\",\"content\":[{\"type\":\"video\"},"
                                         "{\"type\":\"text\",\"text\":\"What is it?\"}]}]");
    assert_int_equal(p.n_images, 1);
    assert_int_equal(p.n_videos, 1);
    assert_int_equal(p.image_formats[0], SERVE_VIDEO_MP4);
    serve_params_free(&p);
    img.video.data = png;
    img.video.len = 11;
    assert_int_equal(roundtrip(&m.base, serve_pb_parse_chat, &p, &err), -1);
    assert_string_equal(err.code, "unsupported_video_format");
    serve_params_free(&p);
}

static void pack_chunks(void **state) {
    int32_t ids[] = {5, 6};
    struct serve_usage usage = {3, 2, 1, 4, 7};
    struct serve_pb_chunk c = {ids, 2, "h\xc3\xa9llo", 6, NULL, NULL};
    uint8_t *buf;
    size_t len;
    (void)state;
    assert_int_equal(serve_pb_pack_chunk(&c, &buf, &len), 0);
    Strata__V1__GenerateResponse *m = strata__v1__generate_response__unpack(NULL, len, buf);
    assert_non_null(m);
    assert_int_equal(m->n_token_ids, 2);
    assert_int_equal(m->token_ids[1], 6);
    assert_string_equal(m->text, "h\xc3\xa9llo");
    assert_int_equal(m->finish_reason, STRATA__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED);
    assert_null(m->usage);
    strata__v1__generate_response__free_unpacked(m, NULL);
    free(buf);
    struct serve_pb_chunk last = {NULL, 0, NULL, 0, "length", &usage};
    assert_int_equal(serve_pb_pack_chunk(&last, &buf, &len), 0);
    m = strata__v1__generate_response__unpack(NULL, len, buf);
    assert_non_null(m);
    assert_int_equal(m->n_token_ids, 0);
    assert_string_equal(m->text, "");
    assert_int_equal(m->finish_reason, STRATA__V1__FINISH_REASON__FINISH_REASON_LENGTH);
    assert_non_null(m->usage);
    assert_int_equal(m->usage->prompt_tokens, 3);
    assert_int_equal(m->usage->completion_tokens, 2);
    assert_int_equal(m->usage->cached_tokens, 1);
    assert_int_equal(m->usage->accepted_prediction_tokens, 4);
    assert_int_equal(m->usage->rejected_prediction_tokens, 7);
    strata__v1__generate_response__free_unpacked(m, NULL);
    free(buf);
}

static void pack_health_and_info(void **state) {
    uint8_t *buf;
    size_t len;
    int32_t eos[] = {151645, 151643};
    static struct client_describe stages = {.num_stages = 2,
                                            .stages = {{.stage_index = 0,
                                                        .num_stages = 2,
                                                        .layer_start = 0,
                                                        .layer_end = 2,
                                                        .embed = 1,
                                                        .tp = 2,
                                                        .kvp = 1,
                                                        .threads = 4,
                                                        .max_seq = 4096,
                                                        .max_batch = 8,
                                                        .device = "cpu, 4 threads",
                                                        .weights_dtype = "q8",
                                                        .version = "strata 0.1.0"},
                                                       {.stage_index = 1,
                                                        .num_stages = 2,
                                                        .layer_start = 2,
                                                        .layer_end = 4,
                                                        .head = 1,
                                                        .tp = 1,
                                                        .kvp = 1,
                                                        .threads = 1,
                                                        .max_seq = 4096,
                                                        .max_batch = 8,
                                                        .device = "cuda:0, NVIDIA H100",
                                                        .weights_dtype = "bf16",
                                                        .version = "strata 0.1.0"}}};
    struct serve_pb_info info = {"qwen3", 4096,     151669,  eos, 2,      1,
                                 "1.0",   "29.0.0", &stages, "",  "0.1.0"};
    (void)state;
    assert_int_equal(serve_pb_pack_health(0, "stage 0 does not answer", &buf, &len), 0);
    Strata__V1__HealthResponse *h = strata__v1__health_response__unpack(NULL, len, buf);
    assert_non_null(h);
    assert_int_equal(h->status, STRATA__V1__HEALTH_RESPONSE__SERVING_STATUS__NOT_SERVING);
    assert_string_equal(h->message, "stage 0 does not answer");
    strata__v1__health_response__free_unpacked(h, NULL);
    free(buf);
    /* SERVING alone is grpc.health.v1's HealthCheckResponse{status: SERVING}: 08 01. */
    assert_int_equal(serve_pb_pack_health(1, "", &buf, &len), 0);
    assert_int_equal(len, 2);
    assert_int_equal(buf[0], 0x08);
    assert_int_equal(buf[1], 0x01);
    free(buf);
    assert_int_equal(serve_pb_pack_info(&info, &buf, &len), 0);
    Strata__V1__InfoResponse *i = strata__v1__info_response__unpack(NULL, len, buf);
    assert_non_null(i);
    assert_string_equal(i->model, "qwen3");
    assert_int_equal(i->max_seq, 4096);
    assert_int_equal(i->vocab_size, 151669);
    assert_int_equal(i->n_eos_ids, 2);
    assert_int_equal(i->eos_ids[1], 151643);
    assert_true(i->chat_template);
    assert_string_equal(i->wire_version, "1.0");
    assert_string_equal(i->strata_version, "0.1.0");
    assert_string_equal(i->stages_error, "");
    assert_int_equal(i->n_stages, 2);
    assert_int_equal(i->stages[0]->layer_end, 2);
    assert_true(i->stages[0]->embed && !i->stages[0]->head);
    assert_int_equal(i->stages[0]->tp, 2);
    assert_string_equal(i->stages[0]->weights_dtype, "q8");
    assert_int_equal(i->stages[1]->stage_index, 1);
    assert_int_equal(i->stages[1]->layer_start, 2);
    assert_int_equal(i->stages[1]->layer_end, 4);
    assert_true(i->stages[1]->head && !i->stages[1]->embed);
    assert_string_equal(i->stages[1]->device, "cuda:0, NVIDIA H100");
    assert_string_equal(i->stages[1]->version, "strata 0.1.0");
    strata__v1__info_response__free_unpacked(i, NULL);
    free(buf);
    /* A broken ring: no stages, the reason in stages_error. */
    info.stages = NULL;
    info.stages_error = "EPEER: stage 0: cannot describe the pipeline: the link to stage 1 is down";
    assert_int_equal(serve_pb_pack_info(&info, &buf, &len), 0);
    i = strata__v1__info_response__unpack(NULL, len, buf);
    assert_non_null(i);
    assert_int_equal(i->n_stages, 0);
    assert_string_equal(i->stages_error, info.stages_error);
    strata__v1__info_response__free_unpacked(i, NULL);
    free(buf);
}

static void status_mapping(void **state) {
    struct serve_error err;
    (void)state;
    static const struct {
        int http;
        enum serve_grpc_code code;
    } map[] = {{400, SERVE_GRPC_INVALID_ARGUMENT},   {404, SERVE_GRPC_INVALID_ARGUMENT},
               {413, SERVE_GRPC_RESOURCE_EXHAUSTED}, {429, SERVE_GRPC_RESOURCE_EXHAUSTED},
               {500, SERVE_GRPC_INTERNAL},           {502, SERVE_GRPC_INTERNAL},
               {503, SERVE_GRPC_UNAVAILABLE},        {504, SERVE_GRPC_DEADLINE_EXCEEDED}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        serve_error_set(&err, map[i].http, NULL, NULL, "x");
        assert_int_equal(serve_pb_status(&err), map[i].code);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(generate_defaults),
        cmocka_unit_test(generate_every_field),
        cmocka_unit_test(generate_text_and_model),
        cmocka_unit_test(bad_params),
        cmocka_unit_test(bad_stops),
        cmocka_unit_test(bad_prompts),
        cmocka_unit_test(malformed_bytes),
        cmocka_unit_test(chat_messages),
        cmocka_unit_test(chat_image_parts),
        cmocka_unit_test(pack_chunks),
        cmocka_unit_test(pack_health_and_info),
        cmocka_unit_test(status_mapping),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
