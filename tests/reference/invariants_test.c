/* The determinism invariants the pipeline relies on (model.h):
 *  - KV-cached decode equals a full recompute of the same positions (<= 1e-5, printed);
 *  - layers [0,k) then [k,L) give bit-identical logits to [0,L) for every k, and so do
 *    4-stage and embed-only / head-only splits;
 *  - 1, 2 and 3 threads give bit-identical logits;
 *  - a request batched with others (prefill next to decode) equals the request run alone;
 *  - a replay (recovery) prefill of prompt + n generated tokens in chunks gives, row for row,
 *    the logits of the decode steps it replaces, and decoding on from it the same logits.
 * Inputs are teacher-forced: the golden prompt, then the golden generated ids. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "runtime/base/status.h"
#include "tests/reference/golden_case.h"

#define MAX_STAGES 16

/* A request: prefill `prompt`, then feed feed[s] at step s+1; one logits row per step. */
struct request {
    const int32_t *prompt;
    int n_prompt;
    const int32_t *feed; /* [n_steps - 1] */
    int n_steps;
};

static struct request golden_request(const struct golden_case *gc) {
    struct request r = {gc->prompt, gc->n_prompt, gc->generated, gc->n_steps};
    return r;
}

/* A chain of stage models over `bounds` [n_stages + 1] (stage i owns [bounds[i], bounds[i+1])),
 * plus an embed-only first and head-only last stage when `separate_ends`. */
struct chain {
    struct reference_model *stage[MAX_STAGES];
    struct kv_cache kv[MAX_STAGES];
    int n;
};

static void chain_open(struct chain *ch, const struct golden_case *gc, const int *bounds,
                       int n_stages, int separate_ends, int threads, int slots, int max_seq) {
    memset(ch, 0, sizeof *ch);
    const struct model_config *c = &gc->cfg;
    int i = 0;
    if (separate_ends) {
        if (golden_model(&ch->stage[i++], gc, 0, 0, 1, 0, threads))
            fail_msg("%s", strata_last_error());
    }
    for (int s = 0; s < n_stages; ++s, ++i) {
        int embed = !separate_ends && s == 0, head = !separate_ends && s == n_stages - 1;
        if (golden_model(&ch->stage[i], gc, bounds[s], bounds[s + 1], embed, head, threads))
            fail_msg("stage [%d,%d): %s", bounds[s], bounds[s + 1], strata_last_error());
        if (kv_cache_init(&ch->kv[i], bounds[s], bounds[s + 1], c->num_kv_heads, c->head_dim,
                          max_seq, slots, 0, OPS_F32))
            fail_msg("%s", strata_last_error());
    }
    if (separate_ends) {
        if (golden_model(&ch->stage[i++], gc, 0, 0, 0, 1, threads))
            fail_msg("%s", strata_last_error());
    }
    ch->n = i;
}

static void chain_close(struct chain *ch) {
    for (int i = 0; i < ch->n; ++i) {
        reference_model_free(ch->stage[i]);
        kv_cache_free(&ch->kv[i]);
    }
}

/* Runs one forward call of `n_items` requests through every stage; writes each item's
 * last-row logits to logits [n_items, V]. */
static void chain_step(struct chain *ch, const struct golden_case *gc,
                       const struct forward_item *items, const int32_t *tokens, int n_items,
                       float *logits) {
    int H = gc->cfg.hidden_size, V = gc->cfg.vocab_size, rows = 0;
    for (int i = 0; i < n_items; ++i)
        rows += items[i].n_tokens;
    float *hidden = malloc((size_t)rows * (size_t)H * sizeof(float));
    assert_non_null(hidden);
    if (reference_embed(ch->stage[0], hidden, tokens, rows)) fail_msg("%s", strata_last_error());
    for (int s = 0; s < ch->n; ++s) {
        struct kv_cache *kv = ch->kv[s].blocks.num_slots ? &ch->kv[s] : NULL;
        if (reference_forward(ch->stage[s], kv, hidden, items, n_items))
            fail_msg("%s", strata_last_error());
    }
    int row = 0;
    for (int i = 0; i < n_items; ++i) {
        row += items[i].n_tokens;
        if (reference_logits(ch->stage[ch->n - 1], logits + (size_t)i * (size_t)V,
                             hidden + (size_t)(row - 1) * (size_t)H, 1))
            fail_msg("%s", strata_last_error());
    }
    free(hidden);
}

/* Logits [n_steps, V] of one request run alone through a chain. */
static float *run_alone(const struct golden_case *gc, const struct request *r, const int *bounds,
                        int n_stages, int separate_ends, int threads) {
    struct chain ch;
    chain_open(&ch, gc, bounds, n_stages, separate_ends, threads, 1, r->n_prompt + r->n_steps);
    int V = gc->cfg.vocab_size, pos = 0;
    for (int s = 0; s < ch.n; ++s)
        if (ch.kv[s].blocks.num_slots) kv_cache_acquire(&ch.kv[s], &(int){0});
    float *logits = malloc((size_t)r->n_steps * (size_t)V * sizeof(float));
    assert_non_null(logits);
    for (int step = 0; step < r->n_steps; ++step) {
        struct forward_item item = {.slot = 0, .pos = pos, .n_tokens = step ? 1 : r->n_prompt};
        chain_step(&ch, gc, &item, step ? &r->feed[step - 1] : r->prompt, 1,
                   logits + (size_t)step * (size_t)V);
        pos += item.n_tokens;
    }
    chain_close(&ch);
    return logits;
}

static int full_model(const struct golden_case *gc, int *bounds) {
    bounds[0] = 0;
    bounds[1] = gc->cfg.num_layers;
    return 1;
}

static const char *const invariant_cases[] = {"qwen3_gqa_tied", "qwen3_deep8", "qwen3_moe",
                                              "qwen3_moe_nonorm", NULL};

static void test_kv_cache_equals_recompute(void **state) {
    (void)state;
    for (int ci = 0; invariant_cases[ci]; ++ci) {
        struct golden_case gc;
        if (golden_case_open(&gc, invariant_cases[ci])) fail_msg("%s", strata_last_error());
        int V = gc.cfg.vocab_size, bounds[2], n = full_model(&gc, bounds);
        struct request r = golden_request(&gc);
        float *cached = run_alone(&gc, &r, bounds, n, 0, 2);
        int32_t *seq = malloc((size_t)(gc.n_prompt + gc.n_steps) * sizeof *seq);
        assert_non_null(seq);
        double max_delta = 0.0;
        for (int step = 0; step < gc.n_steps; ++step) {
            /* Recompute from scratch: the whole sequence up to this step as one prefill. */
            golden_sequence(&gc, seq, gc.n_prompt + step);
            struct request full = {seq, gc.n_prompt + step, NULL, 1};
            float *again = run_alone(&gc, &full, bounds, n, 0, 2);
            for (int v = 0; v < V; ++v) {
                double d =
                    fabs((double)again[v] - (double)cached[(size_t)step * (size_t)V + (size_t)v]);
                if (d > max_delta) max_delta = d;
            }
            free(again);
        }
        printf("%-18s KV-cached decode vs full recompute over %d steps: max |dlogit| = %.3g\n",
               gc.name, gc.n_steps, max_delta);
        assert_true(max_delta <= 1e-5);
        free(seq);
        free(cached);
        golden_case_close(&gc);
    }
}

static void test_every_split_is_bit_identical(void **state) {
    (void)state;
    for (int ci = 0; invariant_cases[ci]; ++ci) {
        struct golden_case gc;
        if (golden_case_open(&gc, invariant_cases[ci])) fail_msg("%s", strata_last_error());
        int L = gc.cfg.num_layers, V = gc.cfg.vocab_size, bounds[MAX_STAGES];
        size_t bytes = (size_t)gc.n_steps * (size_t)V * sizeof(float);
        struct request r = golden_request(&gc);
        float *whole = run_alone(&gc, &r, bounds, full_model(&gc, bounds), 0, 2);
        for (int k = 1; k < L; ++k) {
            int split[3] = {0, k, L};
            float *parts = run_alone(&gc, &r, split, 2, 0, 2);
            if (memcmp(parts, whole, bytes))
                fail_msg("%s: split at %d differs from [0,%d)", gc.name, k, L);
            free(parts);
        }
        /* Four stages of (nearly) equal size, and embed / head as their own stages. */
        int four[5];
        for (int s = 0; s <= 4; ++s)
            four[s] = s * L / 4;
        float *staged = run_alone(&gc, &r, four, 4, 1, 2);
        if (memcmp(staged, whole, bytes))
            fail_msg("%s: 4 stages + separate embed/head differ", gc.name);
        free(staged);
        printf("%-18s splits k=1..%d, 4 stages, separate embed/head: bit-identical\n", gc.name,
               L - 1);
        free(whole);
        golden_case_close(&gc);
    }
}

static void test_thread_counts_are_bit_identical(void **state) {
    (void)state;
    for (int ci = 0; invariant_cases[ci]; ++ci) {
        struct golden_case gc;
        if (golden_case_open(&gc, invariant_cases[ci])) fail_msg("%s", strata_last_error());
        int V = gc.cfg.vocab_size, bounds[2], n = full_model(&gc, bounds);
        size_t bytes = (size_t)gc.n_steps * (size_t)V * sizeof(float);
        struct request r = golden_request(&gc);
        float *one = run_alone(&gc, &r, bounds, n, 0, 1);
        for (int threads = 2; threads <= 3; ++threads) {
            float *many = run_alone(&gc, &r, bounds, n, 0, threads);
            if (memcmp(one, many, bytes))
                fail_msg("%s: %d threads differ from 1", gc.name, threads);
            free(many);
        }
        printf("%-18s 1, 2, 3 threads: bit-identical\n", gc.name);
        free(one);
        golden_case_close(&gc);
    }
}

/* Request A (the golden) and request B (another prompt) share forward calls: B's prefill
 * lands in the same call as A's third decode step, then both decode together. */
static void test_batched_equals_alone(void **state) {
    (void)state;
    for (int ci = 0; invariant_cases[ci]; ++ci) {
        struct golden_case gc;
        if (golden_case_open(&gc, invariant_cases[ci])) fail_msg("%s", strata_last_error());
        int V = gc.cfg.vocab_size, L = gc.cfg.num_layers, bounds[3] = {0, L / 2, L};
        struct request a = golden_request(&gc);
        int nb = gc.n_steps / 2, b_start = 3;
        int32_t b_prompt[64], b_feed[64];
        for (int i = 0; i < nb; ++i) {
            b_prompt[i] = gc.generated[gc.n_steps - 1 - i];
            b_feed[i] = (gc.generated[i] * 7 + 3) % V;
        }
        struct request b = {b_prompt, 5, b_feed, nb};
        float *alone_a = run_alone(&gc, &a, bounds, 2, 0, 2);
        float *alone_b = run_alone(&gc, &b, bounds, 2, 0, 2);

        struct chain ch;
        chain_open(&ch, &gc, bounds, 2, 0, 2, 3, a.n_prompt + a.n_steps + 8);
        int sa, sb, dummy;
        for (int s = 0; s < ch.n; ++s) {
            kv_cache_acquire(&ch.kv[s], &dummy); /* slot 0 stays empty: slots need not be dense */
            kv_cache_acquire(&ch.kv[s], &sb);
            kv_cache_acquire(&ch.kv[s], &sa);
        }
        float *logits = malloc(2 * (size_t)V * sizeof(float));
        int32_t tokens[128];
        int pos_a = 0, pos_b = 0;
        for (int step = 0; step < a.n_steps; ++step) {
            struct forward_item items[2];
            int n_items = 0, nt = 0, bstep = step - b_start;
            items[n_items++] =
                (struct forward_item){.slot = sa, .pos = pos_a, .n_tokens = step ? 1 : a.n_prompt};
            if (step)
                tokens[nt++] = a.feed[step - 1];
            else
                for (int i = 0; i < a.n_prompt; ++i)
                    tokens[nt++] = a.prompt[i];
            if (bstep >= 0 && bstep < b.n_steps) {
                items[n_items++] = (struct forward_item){
                    .slot = sb, .pos = pos_b, .n_tokens = bstep ? 1 : b.n_prompt};
                if (bstep)
                    tokens[nt++] = b.feed[bstep - 1];
                else
                    for (int i = 0; i < b.n_prompt; ++i)
                        tokens[nt++] = b.prompt[i];
            }
            chain_step(&ch, &gc, items, tokens, n_items, logits);
            pos_a += items[0].n_tokens;
            if (memcmp(logits, alone_a + (size_t)step * (size_t)V, (size_t)V * sizeof(float)))
                fail_msg("%s: request A step %d differs when batched", gc.name, step);
            if (n_items == 2) {
                pos_b += items[1].n_tokens;
                if (memcmp(logits + V, alone_b + (size_t)bstep * (size_t)V,
                           (size_t)V * sizeof(float)))
                    fail_msg("%s: request B step %d differs when batched", gc.name, bstep);
            }
        }
        printf("%-18s two requests batched (prefill beside decode) == each alone: bit-identical\n",
               gc.name);
        free(logits);
        chain_close(&ch);
        free(alone_a);
        free(alone_b);
        golden_case_close(&gc);
    }
}

/* Logits row [V] of the replay's row at absolute position p (step p - P + 1), compared with
 * the undisturbed run's step. */
static void check_replay_row(const struct golden_case *gc, struct chain *ch, const float *row,
                             int p, const float *alone, int n, int chunk) {
    int V = gc->cfg.vocab_size, step = p - gc->n_prompt + 1;
    float *logits = malloc((size_t)V * sizeof(float));
    assert_non_null(logits);
    if (reference_logits(ch->stage[ch->n - 1], logits, row, 1)) fail_msg("%s", strata_last_error());
    if (memcmp(logits, alone + (size_t)step * (size_t)V, (size_t)V * sizeof(float)))
        fail_msg("%s: replay of %d tokens in chunks of %d: step %d differs from the decode",
                 gc->name, n, chunk, step);
    free(logits);
}

/* Recovery (runtime/stage/stage_recovery.c) replays a request after a ring break as a
 * prefill of prompt + the n tokens generated so far, cut in chunks, and samples step n from
 * its last row (with --out the rows before it give steps 0..n-1 again). That holds only if a
 * row's result does not depend on whether it was a decode step or one row of a chunked
 * prefill: checked bit for bit here for several n and chunk sizes, and decoding on from the
 * replayed KV cache gives the undisturbed logits too. */
static void test_replay_prefill_is_bit_identical(void **state) {
    (void)state;
    for (int ci = 0; invariant_cases[ci]; ++ci) {
        struct golden_case gc;
        if (golden_case_open(&gc, invariant_cases[ci])) fail_msg("%s", strata_last_error());
        int V = gc.cfg.vocab_size, H = gc.cfg.hidden_size, L = gc.cfg.num_layers;
        int P = gc.n_prompt, bounds[3] = {0, L / 2, L}, slot;
        struct request r = golden_request(&gc);
        float *alone = run_alone(&gc, &r, bounds, 2, 0, 2);
        int32_t *seq = malloc((size_t)(P + gc.n_steps) * sizeof *seq);
        float *hidden = malloc((size_t)8 * (size_t)H * sizeof(float));
        float *logits = malloc((size_t)V * sizeof(float));
        assert_true(seq && hidden && logits);
        golden_sequence(&gc, seq, P + gc.n_steps);
        const int ns[3] = {1, gc.n_steps / 2, gc.n_steps - 1}, chunks[2] = {3, 8};
        for (int ni = 0; ni < 3; ++ni) {
            for (int k = 0; k < 2 && ns[ni] >= 1; ++k) {
                int n = ns[ni], chunk = chunks[k], R = P + n;
                struct chain ch;
                chain_open(&ch, &gc, bounds, 2, 0, 2, 1, P + gc.n_steps);
                for (int s = 0; s < ch.n; ++s)
                    kv_cache_acquire(&ch.kv[s], &slot);
                for (int pos = 0; pos < R; pos += chunk) {
                    int rows = R - pos < chunk ? R - pos : chunk;
                    struct forward_item item = {.slot = 0, .pos = pos, .n_tokens = rows};
                    if (reference_embed(ch.stage[0], hidden, seq + pos, rows))
                        fail_msg("%s", strata_last_error());
                    for (int s = 0; s < ch.n; ++s)
                        if (reference_forward(ch.stage[s], &ch.kv[s], hidden, &item, 1))
                            fail_msg("%s", strata_last_error());
                    for (int j = 0; j < rows; ++j)
                        if (pos + j >= P - 1)
                            check_replay_row(&gc, &ch, hidden + (size_t)j * (size_t)H, pos + j,
                                             alone, n, chunk);
                }
                for (int step = n + 1; step < gc.n_steps; ++step) { /* decoding on */
                    struct forward_item item = {.slot = 0, .pos = P + step - 1, .n_tokens = 1};
                    chain_step(&ch, &gc, &item, &seq[P + step - 1], 1, logits);
                    if (memcmp(logits, alone + (size_t)step * (size_t)V, (size_t)V * sizeof(float)))
                        fail_msg("%s: decode step %d after a replay of %d tokens differs", gc.name,
                                 step, n);
                }
                chain_close(&ch);
            }
        }
        printf("%-18s replay of n = 1, %d, %d tokens in chunks of 3 and 8 == the decode steps: "
               "bit-identical\n",
               gc.name, gc.n_steps / 2, gc.n_steps - 1);
        free(seq);
        free(hidden);
        free(logits);
        free(alone);
        golden_case_close(&gc);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_cache_equals_recompute),
        cmocka_unit_test(test_every_split_is_bit_identical),
        cmocka_unit_test(test_thread_counts_are_bit_identical),
        cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_replay_prefill_is_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
