/* Response builders of the OpenAI-compatible front: the error shape, whole answers and
 * streamed chunks of both endpoints, usage, SSE framing, the models list, metrics text, and
 * stop strings over streamed text (cut before the stop, held-back bytes, UTF-8 boundaries). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/serve/serve_json.h"
#include "runtime/serve/serve_metrics.h"
#include "runtime/serve/serve_text.h"

static const struct serve_reply_info CHAT = {SERVE_CHAT, "chatcmpl-1", 1700000000, "m"};
static const struct serve_reply_info COMPLETION = {SERVE_COMPLETION, "cmpl-1", 1700000000, "m"};

static void check(char *json, const char *want) {
    assert_non_null(json);
    assert_string_equal(json, want);
    free(json);
}

static void error_shape(void **state) {
    struct serve_error err;
    (void)state;
    serve_error_set(&err, 400, "top_p", "invalid_value", "bad \"%s\"", "x");
    check(serve_json_error(&err), "{\"error\":{\"message\":\"bad \\\"x\\\"\",\"type\":"
                                  "\"invalid_request_error\",\"param\":\"top_p\",\"code\":"
                                  "\"invalid_value\"}}");
    serve_error_set(&err, 503, NULL, NULL, "down");
    check(serve_json_error(&err), "{\"error\":{\"message\":\"down\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":null}}");
}

static void whole_answers(void **state) {
    struct serve_usage u = {5, 3, 0, 2, 6};
    (void)state;
    check(serve_json_answer(&CHAT, "hi\n", "stop", &u),
          "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,"
          "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
          "\"content\":\"hi\\n\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,"
          "\"completion_tokens\":3,\"total_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":"
          "0},\"completion_tokens_details\":{\"accepted_prediction_tokens\":2,"
          "\"rejected_prediction_tokens\":6}}}");
    check(serve_json_answer(&COMPLETION, "x", "length", &u),
          "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":"
          "\"m\",\"choices\":[{\"index\":0,\"text\":\"x\",\"logprobs\":null,\"finish_reason\":"
          "\"length\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,"
          "\"total_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":0},"
          "\"completion_tokens_details\":{\"accepted_prediction_tokens\":2,"
          "\"rejected_prediction_tokens\":6}}}");
}

static void chunks_and_sse(void **state) {
    struct serve_usage u = {2, 1, 0, 0, 0};
    struct serve_buf b = {0};
    const char *head = "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"
                       "1700000000,\"model\":\"m\",\"choices\":";
    char want[512];
    (void)state;
    snprintf(want, sizeof want,
             "%s[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":"
             "\"\"},\"finish_reason\":null}]}",
             head);
    check(serve_json_chunk(&CHAT, 1, "", NULL, NULL), want);
    snprintf(want, sizeof want, "%s[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}",
             head);
    check(serve_json_chunk(&CHAT, 0, NULL, "length", NULL), want);
    /* The final chunk carries the usage next to its finish_reason. */
    snprintf(want, sizeof want,
             "%s[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{"
             "\"prompt_tokens\":2,\"completion_tokens\":1,\"total_tokens\":3,\"prompt_tokens_"
             "details\":{\"cached_tokens\":0},\"completion_tokens_details\":{\"accepted_prediction_"
             "tokens\":0,\"rejected_prediction_tokens\":0}}}",
             head);
    check(serve_json_chunk(&CHAT, 0, NULL, "stop", &u), want);
    check(serve_json_chunk(&COMPLETION, 0, NULL, "length", &u),
          "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,"
          "\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":"
          "\"length\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1,"
          "\"total_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":0},"
          "\"completion_tokens_details\":{\"accepted_prediction_tokens\":0,"
          "\"rejected_prediction_tokens\":0}}}");
    snprintf(want, sizeof want,
             "%s[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1,"
             "\"total_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":0},"
             "\"completion_tokens_details\":{\"accepted_prediction_tokens\":0,"
             "\"rejected_prediction_tokens\":0}}}",
             head);
    check(serve_json_chunk(&CHAT, 0, NULL, NULL, &u), want);
    check(serve_json_chunk(&COMPLETION, 0, "é", NULL, NULL),
          "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":"
          "\"m\",\"choices\":[{\"index\":0,\"text\":\"é\",\"finish_reason\":null}]}");
    assert_int_equal(serve_sse_event(&b, strdup("{}")), 0);
    assert_int_equal(serve_sse_done(&b), 0);
    assert_string_equal(b.data, "data: {}\n\ndata: [DONE]\n\n");
    assert_int_equal(serve_sse_event(&b, NULL), -2); /* STRATA_ENOMEM */
    serve_buf_free(&b);
}

static void models_list(void **state) {
    (void)state;
    check(serve_json_models("qwen3", 5), "{\"object\":\"list\",\"data\":[{\"id\":\"qwen3\","
                                         "\"object\":\"model\",\"created\":5,\"owned_by\":"
                                         "\"strata\"}]}");
}

static void stages_list(void **state) {
    static struct client_describe d = {.num_stages = 2,
                                       .stages = {{.stage_index = 0,
                                                   .num_stages = 2,
                                                   .layer_start = 0,
                                                   .layer_end = 1,
                                                   .embed = 1,
                                                   .vision = 1,
                                                   .tp = 1,
                                                   .kvp = 2,
                                                   .threads = 2,
                                                   .max_seq = 64,
                                                   .max_batch = 4,
                                                   .totals = {.requests_queued = 9,
                                                              .queue_admitted = 7,
                                                              .queue_refused_full = 1,
                                                              .queue_expired = 1,
                                                              .queue_wait_ms = 1500,
                                                              .prefix_lookups = 20,
                                                              .prefix_hits = 12,
                                                              .prefix_cached_tokens = 960,
                                                              .prefix_prompt_tokens = 2000,
                                                              .prefix_fallbacks = 1,
                                                              .spec_steps = 40,
                                                              .spec_drafted = 120,
                                                              .spec_accepted = 70},
                                                   .device = "cpu, 2 threads",
                                                   .weights_dtype = "bf16",
                                                   .version = "strata 0.1.0",
                                                   .next = "10.0.0.2:7002"},
                                                  {.stage_index = 1,
                                                   .num_stages = 2,
                                                   .layer_start = 1,
                                                   .layer_end = 4,
                                                   .head = 1,
                                                   .tp = 1,
                                                   .kvp = 1,
                                                   .threads = 1,
                                                   .max_seq = 64,
                                                   .max_batch = 4,
                                                   .kv_slots_in_use = 3,
                                                   .queue_depth = 2,
                                                   .requests_waiting = 5,
                                                   .kv_blocks = 320,
                                                   .kv_blocks_used = 12,
                                                   .kv_blocks_reserved = 30,
                                                   .device = "cpu, 1 \"thread\"",
                                                   .weights_dtype = "q8",
                                                   .version = "strata 0.1.0"}}};
    (void)state;
    check(serve_json_stages(&d, NULL, NULL),
          "{\"object\":\"list\",\"data\":[{\"stage\":0,\"num_stages\":2,\"layers\":[0,1],"
          "\"roles\":[\"embed\",\"vision\"],\"device\":\"cpu, 2 threads\",\"tp\":1,\"kvp\":2,"
          "\"threads\":2,\"weights_dtype\":\"bf16\",\"version\":\"strata 0.1.0\","
          "\"next\":\"10.0.0.2:7002\",\"front\":false,\"state\":\"up\",\"max_seq\":64,"
          "\"max_batch\":4,\"kv_slots_in_use\":0,\"queue_depth\":0,\"requests_waiting\":0,"
          "\"kv_blocks\":0,\"kv_blocks_used\":0,\"kv_blocks_reserved\":0,\"kv_blocks_cached\":0,"
          "\"totals\":{\"requests_queued\":9,\"queue_admitted\":7,\"queue_refused_full\":1,"
          "\"queue_expired\":1,\"queue_wait_ms\":1500,\"prefix_lookups\":20,\"prefix_hits\":12,"
          "\"prefix_cached_tokens\":960,\"prefix_prompt_tokens\":2000,\"prefix_fallbacks\":1,"
          "\"spec_steps\":40,\"spec_drafted\":120,\"spec_accepted\":70,\"spec_withheld\":0}},{"
          "\"stage\":1,\"num_stages\":2,"
          "\"layers\":[1,4],\"roles\":[\"head\"],"
          "\"device\":\"cpu, 1 \\\"thread\\\"\",\"tp\":1,\"kvp\":1,\"threads\":1,"
          "\"weights_dtype\":\"q8\",\"version\":\"strata "
          "0.1.0\",\"next\":\"\",\"front\":false,\"state\":\"up\","
          "\"max_seq\":64,\"max_batch\":4,"
          "\"kv_slots_in_use\":3,\"queue_depth\":2,\"requests_waiting\":5,\"kv_blocks\":320,"
          "\"kv_blocks_used\":12,\"kv_blocks_reserved\":30,\"kv_blocks_cached\":0}]}");
}

/* A broken ring: the error first, then the last whole ring with each stage's state and, when
 * not up, the reason. */
static void stages_broken_ring(void **state) {
    static struct client_describe d = {.num_stages = 2,
                                       .stages = {{.stage_index = 0,
                                                   .num_stages = 2,
                                                   .layer_end = 1,
                                                   .embed = 1,
                                                   .tp = 1,
                                                   .kvp = 1,
                                                   .next = "127.0.0.1:7001"},
                                                  {.stage_index = 1,
                                                   .num_stages = 2,
                                                   .layer_start = 1,
                                                   .layer_end = 2,
                                                   .head = 1,
                                                   .tp = 1,
                                                   .kvp = 1,
                                                   .next = "127.0.0.1:7000"}}};
    struct serve_stage_status st[2] = {
        {SERVE_STAGE_UNKNOWN, "listening at 127.0.0.1:7000; the ring is broken elsewhere"},
        {SERVE_STAGE_DOWN, "wire: connect 127.0.0.1:7001: Connection refused"}};
    struct serve_error err;
    (void)state;
    serve_error_set(&err, 503, NULL, "pipeline_unavailable", "the link to stage 1 is down");
    char *json = serve_json_stages(&d, st, &err);
    assert_non_null(json);
    assert_non_null(strstr(json, "{\"error\":{\"message\":\"the link to stage 1 is down\","
                                 "\"type\":\"server_error\",\"param\":null,"
                                 "\"code\":\"pipeline_unavailable\"},\"object\":\"list\""));
    assert_non_null(strstr(json,
                           "\"next\":\"127.0.0.1:7001\",\"front\":false,\"state\":\"unknown\","
                           "\"reason\":\"listening at 127.0.0.1:7000; the ring is broken "
                           "elsewhere\""));
    assert_non_null(strstr(json,
                           "\"next\":\"127.0.0.1:7000\",\"front\":false,\"state\":\"down\","
                           "\"reason\":\"wire: connect 127.0.0.1:7001: Connection refused\""));
    free(json);
}

/* Streams pieces through a serve_text and returns everything taken (final at the end). */
static char *stream_through(struct serve_text *t, const char **pieces, int n, int *stopped) {
    static char out[256];
    const char *s;
    size_t len;
    out[0] = '\0';
    *stopped = 0;
    for (int i = 0; i < n && !*stopped; i++) {
        *stopped = serve_text_push(t, pieces[i], strlen(pieces[i]));
        serve_text_take(t, 0, &s, &len);
        strncat(out, s, len);
    }
    serve_text_take(t, 1, &s, &len);
    strncat(out, s, len);
    return out;
}

static void stop_strings(void **state) {
    struct serve_params p;
    struct serve_text t;
    int stopped;
    (void)state;
    memset(&p, 0, sizeof p);
    p.n_stops = 2;
    strcpy(p.stops[0], "END");
    strcpy(p.stops[1], "\n\n");
    const char *split[] = {"hello E", "N", "D world"};
    serve_text_init(&t, &p);
    assert_string_equal(stream_through(&t, split, 3, &stopped), "hello ");
    assert_int_equal(stopped, 1);
    serve_text_free(&t);
    const char *none[] = {"a", "EN", "b\n", "c"};
    serve_text_init(&t, &p);
    assert_string_equal(stream_through(&t, none, 4, &stopped), "aENb\nc");
    assert_int_equal(stopped, 0);
    serve_text_free(&t);
    /* Held-back bytes never split a character: "é" is 2 bytes, the hold-back 2. */
    const char *utf8[] = {"x\xc3\xa9", "\xc3\xa9", "y"};
    const char *s;
    size_t len;
    serve_text_init(&t, &p);
    serve_text_push(&t, utf8[0], strlen(utf8[0]));
    serve_text_take(&t, 0, &s, &len);
    assert_int_equal(len, 1); /* "x"; the held-back 2 bytes start at a character boundary */
    serve_text_push(&t, utf8[1], strlen(utf8[1]));
    serve_text_take(&t, 0, &s, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(s, "\xc3\xa9", 2);
    serve_text_free(&t);
}

static void metrics_text(void **state) {
    struct serve_metrics m;
    struct serve_buf out = {0};
    (void)state;
    serve_metrics_init(&m);
    serve_metrics_request(&m, 200);
    serve_metrics_request(&m, 200);
    serve_metrics_request(&m, 400);
    serve_metrics_tokens(&m, 10, 3, 4);
    serve_metrics_in_flight(&m, 1);
    serve_metrics_ttft(&m, 0.02);
    serve_metrics_itl(&m, 100);
    serve_metrics_grpc(&m, 0);
    serve_metrics_grpc(&m, 3);
    serve_metrics_grpc(&m, 3);
    serve_metrics_grpc(&m, 99); /* not a gRPC code: ignored */
    assert_int_equal(serve_metrics_render(&m, &out), 0);
    assert_non_null(strstr(out.data, "strata_serve_grpc_requests_total{code=\"OK\"} 1\n"));
    assert_non_null(
        strstr(out.data, "strata_serve_grpc_requests_total{code=\"INVALID_ARGUMENT\"} 2\n"));
    assert_null(strstr(out.data, "code=\"CANCELLED\""));
    assert_non_null(strstr(out.data, "strata_serve_requests_total{status=\"200\"} 2\n"));
    assert_non_null(strstr(out.data, "strata_serve_requests_total{status=\"400\"} 1\n"));
    assert_non_null(strstr(out.data, "strata_serve_prompt_tokens_cached_total 3\n"));
    assert_non_null(strstr(out.data, "strata_serve_prompt_tokens_total 10\n"));
    assert_non_null(strstr(out.data, "strata_serve_completion_tokens_total 4\n"));
    assert_non_null(strstr(out.data, "strata_serve_requests_in_flight 1\n"));
    assert_non_null(
        strstr(out.data, "strata_serve_time_to_first_token_seconds_bucket{le=\"0.01\"} 0\n"));
    assert_non_null(
        strstr(out.data, "strata_serve_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
    assert_non_null(
        strstr(out.data, "strata_serve_inter_token_latency_seconds_bucket{le=\"2.5\"} 0\n"));
    assert_non_null(
        strstr(out.data, "strata_serve_inter_token_latency_seconds_bucket{le=\"+Inf\"} 1\n"));
    serve_buf_free(&out);
    serve_metrics_destroy(&m);
}

/* The per-stage gauges /metrics appends from a ring describe; without one, stages_up 0. */
static void metrics_stages(void **state) {
    static struct client_describe d = {
        .num_stages = 2,
        .stages = {{.stage_index = 0,
                    .max_batch = 8,
                    .kv_slots_in_use = 2,
                    .queue_depth = 1,
                    .requests_waiting = 7,
                    .kv_blocks = 64,
                    .kv_blocks_used = 9,
                    .kv_blocks_reserved = 3,
                    .totals = {.requests_queued = 5,
                               .queue_admitted = 3,
                               .queue_refused_full = 1,
                               .queue_expired = 1,
                               .queue_wait_ms = 2500,
                               .prefix_lookups = 4,
                               .prefix_hits = 2,
                               .prefix_cached_tokens = 64,
                               .prefix_prompt_tokens = 200,
                               .spec_steps = 6,
                               .spec_drafted = 18,
                               .spec_accepted = 11}},
                   {.stage_index = 1, .max_batch = 8, .kv_slots_in_use = 2, .queue_depth = 0}}};
    struct serve_buf out = {0};
    (void)state;
    assert_int_equal(serve_metrics_render_stages(&d, &out), 0);
    for (const char *line =
             "strata_serve_stages_up 1\n\0strata_stage_kv_slots{stage=\"1\"} 8\n\0"
             "strata_stage_kv_slots_in_use{stage=\"0\"} 2\n\0"
             "strata_stage_queue_depth{stage=\"0\"} 1\n\0"
             "strata_stage_requests_waiting{stage=\"0\"} 7\n\0"
             "strata_stage_kv_blocks{stage=\"0\"} 64\n\0"
             "strata_stage_kv_blocks_used{stage=\"0\"} 9\n\0"
             "strata_stage_kv_blocks_reserved{stage=\"0\"} 3\n\0"
             "# TYPE strata_stage_queue_depth gauge\n\0"
             "strata_stage_queue_requests_total{stage=\"0\"} 5\n\0"
             "strata_stage_queue_admitted_total{stage=\"0\"} 3\n\0"
             "strata_stage_queue_refused_total{stage=\"0\",reason=\"full\"} 1\n"
             "strata_stage_queue_refused_total{stage=\"0\",reason=\"deadline\"} 1\n\0"
             "strata_stage_queue_wait_seconds_total{stage=\"0\"} 2.500\n\0"
             "strata_stage_prefix_hits_total{stage=\"0\"} 2\n\0"
             "strata_stage_prefix_cached_tokens_total{stage=\"0\"} 64\n\0"
             "strata_stage_prefix_prompt_tokens_total{stage=\"0\"} 200\n\0"
             "strata_stage_prefix_fallbacks_total{stage=\"0\"} 0\n\0"
             "strata_stage_spec_decode_steps_total{stage=\"0\"} 6\n\0"
             "strata_stage_spec_decode_draft_tokens_total{stage=\"0\"} 18\n\0"
             "strata_stage_spec_decode_accepted_tokens_total{stage=\"0\"} 11\n\0"
             "# TYPE strata_stage_prefix_lookups_total counter\n\0";
         *line; line += strlen(line) + 1)
        if (!strstr(out.data, line)) fail_msg("metrics lack '%s' in:\n%s", line, out.data);
    serve_buf_free(&out);
    assert_int_equal(serve_metrics_render_stages(NULL, &out), 0);
    assert_non_null(strstr(out.data, "strata_serve_stages_up 0\n"));
    assert_null(strstr(out.data, "strata_stage_kv_slots{"));
    assert_null(strstr(out.data, "strata_stage_queue_requests_total"));
    serve_buf_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(error_shape),    cmocka_unit_test(whole_answers),
        cmocka_unit_test(chunks_and_sse), cmocka_unit_test(models_list),
        cmocka_unit_test(stages_list),    cmocka_unit_test(stages_broken_ring),
        cmocka_unit_test(metrics_stages), cmocka_unit_test(stop_strings),
        cmocka_unit_test(metrics_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
