/* The performance model's arithmetic on configs small enough to price by hand: a dense model's
 * decode step is its weight bytes over the profile's streaming rate (or its multiply-adds over
 * the matmul rate, whichever is slower) plus its KV over the read bandwidth; a MoE layer reads
 * only the experts its rows route to, E (1 - (1 - k/E)^b); the pipeline adds its hops; the
 * batch prediction overlaps the stages; the profile JSON round-trips and bad ones are refused
 * naming the field; gemm by K interpolates in log K; a layer's row ops are priced per row once
 * the profile measured them; fewer rows than 64 are priced at the profile's rate by rows; a
 * probed link prices each hop by its frame's size. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/perf_model.h"
#include "runtime/model/perf_place.h"
#include "runtime/model/stage_plan.h"

#define NEAR(a, b) assert_true(fabs((a) - (b)) <= 1e-9 * fabs(b) + 1e-12)

static const char *dense_json =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 1000,"
    " \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,"
    " \"torch_dtype\": \"bfloat16\", \"tie_word_embeddings\": true}";

static const char *moe_json =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\","
    " \"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 16, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 32, \"decoder_sparse_step\": 1, \"torch_dtype\": \"bfloat16\"}";

static struct perf_device device(double gemv, double gemm, double read) {
    struct perf_device d;
    memset(&d, 0, sizeof d);
    d.gemv_gbps = gemv;
    d.gemm_gflops = gemm;
    d.read_gbps = read;
    return d;
}

static void dense_decode_and_pipeline(void **state) {
    (void)state;
    struct model_config cfg;
    assert_int_equal(model_config_parse(&cfg, dense_json, strlen(dense_json), "t"), 0);
    static struct perf_layers pl;
    assert_int_equal(perf_layers_build(&pl, &cfg), 0);
    /* a layer: q, k, v 64 x (4 + 2 + 2) x 16 = 8192; o 64 x 64 = 4096; MLP 3 x 64 x 128 =
     * 24576; norms 2 x 64 + 2 x 16 = 160 -> 37024 parameters, 74048 bytes */
    NEAR(pl.layer[0].dense_bytes, 74048.0);
    NEAR(pl.head_bytes, (1000.0 * 64 + 64) * 2);
    struct perf_device d[2] = {device(1.0, 1000.0, 10.0), device(1.0, 1000.0, 10.0)};
    struct perf_link link = {.latency_us = 100.0, .gbps = 1.0};
    struct perf_options opt = {
        .batch = 1, .prompt_tokens = 100, .chunk_tokens = 100, .kv_bytes = 2};
    struct stage_range one[1] = {{0, 4}}, two[2] = {{0, 2}, {2, 4}};
    static struct perf_prediction p1, p2;
    assert_int_equal(perf_predict(&p1, &pl, one, 1, d, &link, &opt), 0);
    /* streaming: (4 x 74048 + 128128) bytes at 1 GB/s; KV: 2 x 4 x 2 x 16 x 2 bytes x 100
     * positions at 10 GB/s */
    double bytes = 4 * 74048.0 + 128128.0, kv = 2.0 * 4 * 2 * 16 * 2 * 100;
    NEAR(p1.stages[0].bytes_per_token, bytes);
    NEAR(p1.stages[0].decode_ms_1, 1e3 * (bytes / 1e9 + kv / 10e9));
    NEAR(p1.tokens_per_s_1, 1e3 / p1.stages[0].decode_ms_1); /* one stage: no hop */
    /* the same stage as a TP group of 2 over a 5 us, 10 GB/s link: each rank streams half the
     * bytes and half the KV (2 KV heads, one each), then per layer two ring all-reduces of the
     * row's 64 x 4 bytes: 5 us + 2 (t - 1) / t x 256 bytes at 10 GB/s */
    struct perf_device tp2 = d[0];
    perf_device_set_tp(&tp2, 2, &(struct perf_link){.latency_us = 5.0, .gbps = 10.0});
    static struct perf_prediction pt;
    assert_int_equal(perf_predict(&pt, &pl, one, 1, &tp2, &link, &opt), 0);
    NEAR(pt.stages[0].decode_ms_1,
         1e3 * (bytes / 2 / 1e9 + kv / 2 / 10e9 + 4 * 2 * (5e-6 + 256 / 10e9)));
    /* KVP 2 over the same link, 64 positions a rank of 128: every rank streams all the
     * weights; the step's attention runs on the rank holding the most of its 100 positions
     * (64 of them), then per layer two all-gathers from the other rank: the 4 heads' maxima
     * (16 bytes), then their partial sums (4 x (16 + 2) x 4 bytes); each rank holds half the
     * KV of a sequence. */
    struct perf_device kvp2 = d[0];
    perf_device_set_tp(&kvp2, 1, &(struct perf_link){.latency_us = 5.0, .gbps = 10.0});
    perf_device_set_kvp(&kvp2, 2, 64, 128, 100);
    NEAR(kvp2.kvp_kv, 0.5);
    NEAR(kvp2.kvp_attn, 0.64);
    assert_int_equal(perf_predict(&pt, &pl, one, 1, &kvp2, &link, &opt), 0);
    NEAR(pt.stages[0].decode_ms_1, 1e3 * (bytes / 1e9 + kv * 0.64 / 10e9 +
                                          4 * ((5e-6 + 16 / 10e9) + (5e-6 + 4 * 18 * 4 / 10e9))));
    const struct stage_plan_entry e = {
        .weight_bytes = 1000, .kv_bytes = 800, .workspace_bytes = 10};
    assert_int_equal(perf_place_rank_bytes(&e, &kvp2, 2), 1000 + 400 + 10);
    perf_device_set_tp(&kvp2, 2, NULL); /* TP 2 x KVP 2: a TP rank's half of each */
    assert_int_equal(perf_place_rank_bytes(&e, &kvp2, 2), 500 + 200 + 10);
    assert_int_equal(perf_predict(&p2, &pl, two, 2, d, &link, &opt), 0);
    /* two stages: the same work split, plus a hop of 64 x 4 bytes and a frame's header to
     * stage 1 and the token's frame (the header) back, each after 100 us */
    const double row_hop = 0.1 + 1e3 * (256 + PERF_FRAME_HEADER_BYTES) / 1e9,
                 token_hop = 0.1 + 1e3 * PERF_FRAME_HEADER_BYTES / 1e9,
                 hop = (row_hop + token_hop) / 2;
    NEAR(p2.hop_ms_1, hop);
    NEAR(1e3 / p2.tokens_per_s_1, p2.stages[0].decode_ms_1 + p2.stages[1].decode_ms_1 + 2 * hop);
    /* a link per hop: stage 0 -> 1 as before, the token's way back 20 ms slower; the first
     * token pays both hops too */
    static struct perf_prediction ph;
    struct perf_link hops[2] = {link, {.latency_us = 20100.0, .gbps = 1.0}};
    assert_int_equal(perf_predict_hops(&ph, &pl, two, 2, d, hops, &opt), 0);
    NEAR(1e3 / ph.tokens_per_s_1, 1e3 / p2.tokens_per_s_1 + 20.0);
    NEAR(ph.hop_ms_1, hop + 10.0); /* the mean hop */
    NEAR(ph.ttft_ms, p2.ttft_ms + 20.0);
    assert_int_equal(ph.bottleneck_stage, -1); /* 40 ms of hops against ~0.2 ms stages */
    /* batch 1 on 2 stages is one request in flight: the batch figure is the batch-1 one (the
     * bottleneck stage runs one step per round, not S) */
    NEAR(p2.tokens_per_s_b, p2.tokens_per_s_1);
    assert_int_equal(perf_groups_in_flight(1, 8), 1);
    assert_int_equal(perf_groups_in_flight(5, 8), 5);
    assert_int_equal(perf_groups_in_flight(9, 8), 5); /* rows of 2: 5 groups */
    assert_int_equal(perf_groups_in_flight(64, 8), 8);
    assert_int_equal(p2.bottleneck_stage, 1); /* the head is on the last stage */
    /* batch 4 over 2 stages: 2 rows a step, the stages overlapped (memory-bound: a step of 2
     * rows streams the same weights, so 4 tokens per round of about one step per stage) */
    opt.batch = 4;
    assert_int_equal(perf_predict(&p2, &pl, two, 2, d, &link, &opt), 0);
    double round = p2.stages[0].decode_ms_b + p2.stages[1].decode_ms_b +
                   (0.1 + 1e3 * (512 + PERF_FRAME_HEADER_BYTES) / 1e9) + token_hop;
    double pace = 2 * fmax(p2.stages[0].decode_ms_b, p2.stages[1].decode_ms_b);
    NEAR(p2.tokens_per_s_b, 1e3 * 4 / fmax(round, pace));
    /* the prompt is priced in the chunks stage 0 cuts it into: at least one per stage (50
     * rows on 2 stages, though --chunk allows 100), 64 by default; the first token comes after
     * every chunk through the slowest stage and the last chunk through the rest, then the head
     * for the last row: its 128128 bytes streamed at 1 GB/s (the matmul of one row is faster) */
    assert_int_equal(p2.chunk_rows, 50);
    NEAR(p2.ttft_ms, p2.stages[0].prefill_ms_chunk + p2.stages[1].prefill_ms_chunk +
                         fmax(p2.stages[0].prefill_ms_chunk, p2.stages[1].prefill_ms_chunk) +
                         1e3 * 128128.0 / 1e9 + 2 * p2.hop_ms_chunk);
    NEAR(p2.hop_ms_chunk, (0.1 + 1e3 * (50 * 256 + PERF_FRAME_HEADER_BYTES) / 1e9 + token_hop) / 2);
    /* a prefill chunk of 50 rows after 25 positions on stage 0's 2 layers: its weights, 2 x
     * 74048 bytes streamed at 1 GB/s (slower than their matmuls, 2 x 50 x 2 x 37024 flops at
     * 1000 GFLOP/s), and attention over 50 x (25 + 25.5) pairs per layer, 4 x pairs x 4 heads
     * x 16 flops at the gemm rate (the profile has no attention rate) */
    NEAR(p2.stages[0].prefill_ms_chunk,
         1e3 * (2 * 74048.0 / 1e9 + 2 * 4.0 * 50 * 50.5 * 4 * 16 / 1e12));
    opt.chunk_tokens = 0;
    opt.prompt_tokens = 1000;
    assert_int_equal(perf_predict(&p2, &pl, two, 2, d, &link, &opt), 0);
    assert_int_equal(p2.chunk_rows, STAGE_PLAN_DEFAULT_CHUNK);
    /* refusals: ranges that do not cover the model */
    struct stage_range gap[2] = {{0, 1}, {2, 4}};
    assert_int_equal(perf_predict(&p2, &pl, gap, 2, d, &link, &opt), STRATA_ERANGE);
    printf("ok: refused: %s\n", strata_last_error());
}

static void moe_reads_routed_experts(void **state) {
    (void)state;
    struct model_config cfg;
    assert_int_equal(model_config_parse(&cfg, moe_json, strlen(moe_json), "t"), 0);
    static struct perf_layers pl;
    assert_int_equal(perf_layers_build(&pl, &cfg), 0);
    /* an expert: 3 x 64 x 32 = 6144 parameters, 12288 bytes */
    NEAR(pl.layer[0].expert_bytes, 12288.0);
    assert_int_equal(pl.layer[0].experts, 8);
    struct perf_device d = device(1.0, 1e9, 1e9); /* streaming dominates everything else */
    struct perf_link link = {.latency_us = 0, .gbps = 1};
    struct perf_options opt = {.batch = 64, .prompt_tokens = 1, .kv_bytes = 2};
    struct stage_range all[1] = {{0, 2}};
    static struct perf_prediction p;
    assert_int_equal(perf_predict(&p, &pl, all, 1, &d, &link, &opt), 0);
    /* batch 1: 2 of 8 experts; 64 rows: 8 (1 - (3/4)^64) ~ all 8 */
    double dense = 2 * pl.layer[0].dense_bytes + pl.head_bytes;
    NEAR(p.stages[0].bytes_per_token, dense + 2 * 2 * 12288.0);
    double e64 = 8 * (1 - pow(0.75, 64));
    assert_true(fabs(p.stages[0].decode_ms_b - 1e3 * (dense + 2 * e64 * 12288.0) / 1e9) < 1e-6);
}

static void profile_round_trip_and_refusals(void **state) {
    (void)state;
    struct perf_device d = device(5.5, 90.0, 18.0), back;
    snprintf(d.name, sizeof d.name, "box");
    snprintf(d.source, sizeof d.source, "measured");
    snprintf(d.device, sizeof d.device, "cpu");
    d.threads = 2;
    d.mem_bytes = 1ull << 34;
    d.gemm_by_k = (struct perf_points){2, {1024, 4096}, {120, 80}};
    char *json = NULL;
    assert_int_equal(perf_device_format(&d, &json), 0);
    assert_int_equal(perf_device_parse(&back, json, strlen(json)), 0);
    free(json);
    assert_string_equal(back.name, "box");
    assert_int_equal(back.threads, 2);
    assert_true(back.mem_bytes == 1ull << 34 && back.gemm_by_k.n == 2 &&
                back.gemm_by_k.key[1] == 4096);
    NEAR(back.gemv_gbps, 5.5);
    /* log-linear in K: K = 2048 is halfway between 1024 and 4096 */
    NEAR(perf_device_gemm_gflops(&back, 2048), 100.0);
    NEAR(perf_device_gemm_gflops(&back, 512), 120.0);
    NEAR(perf_device_gemm_gflops(&back, 65536), 80.0);
    /* the streaming rate by working set: 4 MiB -> 16 GB/s, 64 MiB -> 8 GB/s, log-linear */
    d.gemv_by_bytes = (struct perf_points){2, {4 << 20, 64 << 20}, {16, 8}};
    assert_int_equal(perf_device_format(&d, &json), 0);
    assert_int_equal(perf_device_parse(&back, json, strlen(json)), 0);
    free(json);
    assert_int_equal(back.gemv_by_bytes.n, 2);
    NEAR(perf_device_gemv_gbps(&back, 16 << 20), 12.0);
    NEAR(perf_device_gemv_gbps(&back, 1 << 20), 16.0);
    NEAR(perf_device_gemv_gbps(&back, 1e12), 8.0);
    /* the row-parallel (split) matrices' rate: the plain one until measured, then its own */
    NEAR(perf_device_gemm_split_gflops(&back, 2048), 100.0);
    d.gemm_split_by_k = (struct perf_points){2, {1024, 4096}, {60, 80}};
    assert_int_equal(perf_device_format(&d, &json), 0);
    assert_int_equal(perf_device_parse(&back, json, strlen(json)), 0);
    free(json);
    assert_int_equal(back.gemm_split_by_k.n, 2);
    NEAR(perf_device_gemm_split_gflops(&back, 2048), 70.0);
    NEAR(perf_device_gemm_gflops(&back, 2048), 100.0);
    /* a prefill chunk's attention rate by its rows' average context */
    d.attn_by_ctx = (struct perf_points){2, {32, 512}, {10, 30}};
    d.attn_gflops = 30;
    d.attn_gbps = 10;
    assert_int_equal(perf_device_format(&d, &json), 0);
    assert_int_equal(perf_device_parse(&back, json, strlen(json)), 0);
    free(json);
    assert_int_equal(back.attn_by_ctx.n, 2);
    static struct perf_layers apl;
    apl.heads = 2;
    apl.head_dim = 8;
    apl.kv_heads = 1;
    /* 10 rows at an average context of 32: 4 x 320 pairs x 2 heads x 8 at 10 GFLOP/s */
    NEAR(perf_layer_attn_sec(&apl, &back, 0, 10, 320, 2), 4.0 * 320 * 2 * 8 / 10e9);
    /* a layer's row ops beyond SwiGLU: priced once the profile measured them, per row at
     * PERF_ROW_OPS_ELEMS (4 x 64 + 2 x (4 + 2) x 16 + 2 x 2 x 16 = 512 for the dense model) */
    struct model_config rcfg;
    assert_int_equal(model_config_parse(&rcfg, dense_json, strlen(dense_json), "t"), 0);
    static struct perf_layers rpl;
    assert_int_equal(perf_layers_build(&rpl, &rcfg), 0);
    const double plain = perf_layer_matmul_sec(&rpl, 0, &back, 10);
    assert_true(back.row_ops_gelems == 0);
    d.row_ops_gelems = 2;
    assert_int_equal(perf_device_format(&d, &json), 0);
    assert_int_equal(perf_device_parse(&back, json, strlen(json)), 0);
    free(json);
    NEAR(back.row_ops_gelems, 2.0);
    NEAR(PERF_ROW_OPS_ELEMS(64, 4, 2, 16), 512.0);
    NEAR(perf_layer_matmul_sec(&rpl, 0, &back, 10) - plain, 10 * 512.0 / 2e9);
    /* gemm by rows: below PERF_GEMM_ROWS every matmul rate is scaled by by_rows(r) /
     * by_rows(PERF_GEMM_ROWS) (log-linear between points, flat beyond), never above 1 */
    const double row_ops32 = 32 * 512.0 / 2e9, at32 = perf_layer_matmul_sec(&rpl, 0, &back, 32),
                 head1 = perf_head_matmul_sec(&rpl, &back, 1);
    NEAR(perf_device_gemm_rows_factor(&back, 32), 1.0); /* no points: no scaling */
    d.gemm_by_rows = (struct perf_points){3, {8, 32, 64}, {20, 80, 100}};
    assert_int_equal(perf_device_format(&d, &json), 0);
    assert_int_equal(perf_device_parse(&back, json, strlen(json)), 0);
    free(json);
    assert_int_equal(back.gemm_by_rows.n, 3);
    NEAR(perf_device_gemm_rows_factor(&back, 32), 0.8);
    NEAR(perf_device_gemm_rows_factor(&back, 16), 0.5); /* halfway from 8 to 32 in log rows */
    NEAR(perf_device_gemm_rows_factor(&back, 1), 0.2);
    NEAR(perf_device_gemm_rows_factor(&back, 64), 1.0);
    NEAR(perf_device_gemm_rows_factor(&back, 256), 1.0);
    NEAR(perf_layer_matmul_sec(&rpl, 0, &back, 32) - row_ops32, (at32 - row_ops32) / 0.8);
    NEAR(perf_head_matmul_sec(&rpl, &back, 1), head1 / 0.2);
    back.gemm_by_rows = (struct perf_points){2, {32, 64}, {110, 100}}; /* noise: 32 outran 64 */
    NEAR(perf_device_gemm_rows_factor(&back, 32), 1.0);
#define BY_K_DESCENDING                                                                            \
    "{\"read_gbps\": 1, \"gemv_gbps\": 1, \"gemm_gflops\": 1, \"gemm_gflops_by_k\": "              \
    "{\"4096\": 1, \"1024\": 2}}"
    static const char *const bad[] = {
        "[]",
        "{\"gemv_gbps\": 1, \"gemm_gflops\": 1}",
        "{\"read_gbps\": -1, \"gemv_gbps\": 1, \"gemm_gflops\": 1}",
        "{\"read_gbps\": 1, \"gemv_gbps\": 1, \"gemm_gflops\": 1, \"source\": \"guess\"}",
        BY_K_DESCENDING,
        "{\"read_gbps\": 1, \"gemv_gbps\": 1, \"gemm_gflops\": 1, \"gemm_split_gflops_by_k\": 3}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(perf_device_parse(&back, bad[i], strlen(bad[i])), STRATA_EFORMAT);
        printf("ok: refused: %s\n", strata_last_error());
    }
}

/* A link file as a probe writes it: its mean one-way time by frame bytes prices each hop by
 * its frame (a row's frame on a lossy link stalls more than the token's), linear between the
 * sizes, the smallest's below, the largest's plus the rest at gbps above; without points,
 * latency + bytes / gbps; malformed files are refused naming themselves. */
static int write_text(char *path, const char *text) {
    strcpy(path, "/tmp/perf_link_XXXXXX");
    const char *dir = getenv("TEST_TMPDIR");
    if (dir && strlen(dir) < 200) snprintf(path, 256, "%s/perf_link_XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    int rc = f && fputs(text, f) >= 0 ? 0 : -1;
    if (f) fclose(f);
    return rc;
}

static void probed_link(void **state) {
    (void)state;
    char path[256];
    assert_int_equal(
        write_text(path, "{\"latency_us\": 2990, \"gbps\": 0.5, \"source\": \"x\", "
                         "\"points\": [{\"bytes\": 196, \"mean_us\": 3000, \"p50_us\": 1000}, "
                         "{\"bytes\": 4288, \"mean_us\": 5000}, "
                         "{\"bytes\": 262336, \"mean_us\": 9000}]}"),
        0);
    struct perf_link l;
    assert_int_equal(perf_link_load(&l, path), 0);
    unlink(path);
    assert_int_equal(l.mean_us.n, 3);
    NEAR(perf_link_one_way_us(&l, 100), 3000.0);
    NEAR(perf_link_one_way_us(&l, 196), 3000.0);
    NEAR(perf_link_one_way_us(&l, 2242), 4000.0);
    NEAR(perf_link_one_way_us(&l, 4288), 5000.0);
    NEAR(perf_link_one_way_us(&l, 262336 + 5e5), 9000.0 + 1000.0); /* 0.5 GB/s: 2 ns a byte */
    const struct perf_link plain = {.latency_us = 2990, .gbps = 0.5};
    NEAR(perf_link_one_way_us(&plain, 4288), 2990 + 4288 * 2e-3);
    /* two stages of the dense model (H 64): a row's frame, 448 bytes, and the token's, 192 */
    struct model_config cfg;
    assert_int_equal(model_config_parse(&cfg, dense_json, strlen(dense_json), "t"), 0);
    static struct perf_layers pl;
    assert_int_equal(perf_layers_build(&pl, &cfg), 0);
    NEAR(perf_hop_ms(&pl, &l, 1), (3000.0 + 2000.0 * (448 - 196) / (4288 - 196)) / 1e3);
    NEAR(perf_hop_ms(&pl, &l, 0), 3.0);
    struct perf_device d[2] = {device(1.0, 1000.0, 10.0), device(1.0, 1000.0, 10.0)};
    const struct stage_range two[2] = {{0, 2}, {2, 4}};
    struct perf_options opt = {.batch = 1, .prompt_tokens = 16};
    static struct perf_prediction p;
    assert_int_equal(perf_predict(&p, &pl, two, 2, d, &l, &opt), 0);
    NEAR(1e3 / p.tokens_per_s_1, p.stages[0].decode_ms_1 + p.stages[1].decode_ms_1 +
                                     perf_hop_ms(&pl, &l, 1) + perf_hop_ms(&pl, &l, 0));
#define POINTS_DESCENDING                                                                          \
    "{\"latency_us\": 1, \"gbps\": 1, \"points\": [{\"bytes\": 9, \"mean_us\": 1}, "               \
    "{\"bytes\": 4, \"mean_us\": 2}]}"
    static const char *const bad[] = {
        "{\"latency_us\": 1, \"gbps\": 1, \"points\": {}}",
        POINTS_DESCENDING,
        "{\"latency_us\": 1, \"gbps\": 1, \"points\": [{\"bytes\": 9}]}",
        "{\"latency_us\": 1, \"points\": []}",
        "not json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(write_text(path, bad[i]), 0);
        assert_int_equal(perf_link_load(&l, path), STRATA_EFORMAT);
        assert_non_null(strstr(strata_last_error(), path));
        printf("ok: refused: %s\n", strata_last_error());
        unlink(path);
    }
}

/* Placement: with room on one box, the latency goal keeps the model there (hops only cost);
 * when no box holds it alone, it splits over the two, the faster box taking the larger share;
 * a model no set of boxes holds is refused saying how much it needs. */
static void placement(void **state) {
    (void)state;
    struct model_config cfg;
    assert_int_equal(model_config_parse(&cfg, dense_json, strlen(dense_json), "t"), 0);
    static struct perf_layers pl;
    static struct stage_memory_model mm;
    struct stage_memory_options mo = {2, 128, 1, 16, 0};
    assert_int_equal(perf_layers_build(&pl, &cfg), 0);
    assert_int_equal(stage_memory_model_build(&mm, &cfg, NULL, &mo), 0);
    static struct perf_hosts h;
    memset(&h, 0, sizeof h);
    h.n = 2;
    snprintf(h.host[0].name, sizeof h.host[0].name, "slow");
    snprintf(h.host[1].name, sizeof h.host[1].name, "fast");
    h.host[0].dev = device(1.0, 1000.0, 10.0);
    h.host[1].dev = device(4.0, 4000.0, 40.0);
    h.host[0].mem_bytes = h.host[1].mem_bytes = 64 << 20;
    h.link = (struct perf_link){.latency_us = 100.0, .gbps = 1.0};
    struct perf_options opt = {.batch = 1, .prompt_tokens = 16, .chunk_tokens = 16, .kv_bytes = 2};
    static struct perf_placement pp;
    assert_int_equal(perf_place(&pp, &pl, &mm, &h, &opt, PERF_GOAL_LATENCY), 0);
    assert_int_equal(pp.num_stages, 1);
    assert_int_equal(pp.host[0], 1); /* the fast box, alone */
    NEAR(pp.orders_tried, 4.0);      /* 2 singles + 2 orders of both */
    /* neither holds it alone: both, the fast one with more layers */
    uint64_t whole;
    struct stage_range all = {0, 4};
    perf_place_memory(&whole, &mm, NULL, &all, 1, pl.kv_heads);
    h.host[0].mem_bytes = h.host[1].mem_bytes = whole * 3 / 4;
    assert_int_equal(perf_place(&pp, &pl, &mm, &h, &opt, PERF_GOAL_LATENCY), 0);
    assert_int_equal(pp.num_stages, 2);
    int fast = pp.host[0] == 1 ? 0 : 1;
    int fast_layers = pp.ranges[fast].layer_end - pp.ranges[fast].layer_start;
    assert_true(fast_layers >= 2);
    for (int s = 0; s < 2; s++)
        assert_true(pp.stage_bytes[s] <= h.host[pp.host[s]].mem_bytes);
    printf("ok: split over both: %s [%d, %d) + %s [%d, %d), %.1f tokens/s\n",
           h.host[pp.host[0]].name, pp.ranges[0].layer_start, pp.ranges[0].layer_end,
           h.host[pp.host[1]].name, pp.ranges[1].layer_start, pp.ranges[1].layer_end,
           pp.pred.tokens_per_s_1);
    h.host[0].mem_bytes = h.host[1].mem_bytes = whole / 4;
    assert_int_equal(perf_place(&pp, &pl, &mm, &h, &opt, PERF_GOAL_LATENCY), STRATA_ERANGE);
    /* ... until the slow box holds 4 such devices as one TP group: its stage is each device's
     * quarter of the weights, half the KV (2 KV heads) and the workspace */
    perf_device_set_tp(&h.host[0].dev, 4, NULL);
    h.host[0].mem_bytes = whole / 2;
    assert_int_equal(perf_place(&pp, &pl, &mm, &h, &opt, PERF_GOAL_LATENCY), 0);
    assert_int_equal(pp.num_stages, 1);
    assert_int_equal(pp.host[0], 0);
    assert_true(pp.stage_bytes[0] <= whole / 2);
    printf("ok: TP 4 on the slow box: %llu bytes per device of the %llu a stage needs\n",
           (unsigned long long)pp.stage_bytes[0], (unsigned long long)whole);
    /* Three equal boxes, each holding 3/4 of the model: two stages, on whichever pair has the
     * fast link; the pairs listed are slow (a and b across a WAN, a and c too), so b + c. */
    memset(&h, 0, sizeof h);
    h.n = 3;
    for (int x = 0; x < 3; x++) {
        snprintf(h.host[x].name, sizeof h.host[x].name, "%c", 'a' + x);
        h.host[x].dev = device(4.0, 4000.0, 40.0);
        h.host[x].mem_bytes = whole * 3 / 4;
    }
    h.link = (struct perf_link){.latency_us = 100.0, .gbps = 1.0};
    h.n_pairs = 2;
    h.pair[0] = (struct perf_pair){0, 1, {.latency_us = 20000.0, .gbps = 0.1}};
    h.pair[1] = (struct perf_pair){2, 0, {.latency_us = 20000.0, .gbps = 0.1}};
    assert_true(perf_hosts_link(&h, 1, 0)->latency_us == 20000.0); /* either way */
    assert_true(perf_hosts_link(&h, 1, 2)->latency_us == 100.0);   /* the default */
    assert_int_equal(perf_place(&pp, &pl, &mm, &h, &opt, PERF_GOAL_LATENCY), 0);
    assert_int_equal(pp.num_stages, 2);
    assert_true((pp.host[0] == 1 && pp.host[1] == 2) || (pp.host[0] == 2 && pp.host[1] == 1));
    NEAR(pp.pred.hop_ms_1, 0.1 + 1e3 * (256 + 2 * PERF_FRAME_HEADER_BYTES) / 2 / 1e9);
    /* with b and c's link slow as well, a 20 ms pair cannot be avoided: the prediction pays it */
    h.pair[h.n_pairs++] = (struct perf_pair){2, 1, {.latency_us = 20000.0, .gbps = 0.1}};
    assert_int_equal(perf_place(&pp, &pl, &mm, &h, &opt, PERF_GOAL_LATENCY), 0);
    assert_true(pp.pred.hop_ms_1 > 20.0);
    printf("ok: the fast pair b + c chosen; with every pair slow, %.2f ms a hop\n",
           pp.pred.hop_ms_1);
    printf("ok: refused: %s\n", strata_last_error());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dense_decode_and_pipeline),
        cmocka_unit_test(moe_reads_routed_experts),
        cmocka_unit_test(profile_round_trip_and_refusals),
        cmocka_unit_test(probed_link),
        cmocka_unit_test(placement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
