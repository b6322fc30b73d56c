/* golden_backends_test's checks on one backend beyond the splits (golden_backends.h): a
 * second request batched with the golden one, speculative steps whose wrong draft's row is
 * dropped, and the KV pool under a budget; each against the solo run, bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kv_blocks.h"
#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "tests/backend_ops/golden_backends.h"

/* The golden request (slot a) and a second one (slot b: the same prompt, decoding its own
 * greedy ids) in one backend, every forward holding both; a's logits must equal `solo`
 * [n_steps, V] bit for bit. 0 when they do, else 1 with a line. */
int check_batched(const struct golden_case *gc, const char *name, const float *solo) {
    int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt, L = gc->cfg.num_layers;
    int slots[2] = {0, 0}, diff = -1, rc;
    struct stage_backend *be = NULL;
    struct prefill p;
    struct forward_item items[2];
    int32_t tokens[2], mrope[3];
    float *hidden = calloc((size_t)2 * S * H, sizeof(float));
    float *logits = calloc((size_t)2 * V, sizeof(float)), *last = calloc((size_t)2 * H, 4);
    memset(&p, 0, sizeof p);
    rc = hidden && logits && last ? open_on(&be, device, gc, 0, L, S + gc->n_steps) : STRATA_ENOMEM;
    if (rc == 0) rc = stage_backend_kv_acquire(be, &slots[0]);
    if (rc == 0) rc = stage_backend_kv_acquire(be, &slots[1]);
    if (rc == 0) rc = prefill_inputs(&p, gc, be);
    for (int step = 0; rc == 0 && step < gc->n_steps; ++step) {
        int n = step ? 1 : S;
        for (int r = 0; r < 2; ++r) {
            items[r] =
                step ? (struct forward_item){.slot = slots[r], .pos = S + step - 1, .n_tokens = 1}
                     : p.item;
            items[r].slot = slots[r];
            if (step && gc->has_vision) {
                mrope[0] = mrope[1] = mrope[2] = items[r].pos + gc->rope_delta;
                items[r].mrope_positions = mrope;
            }
        }
        if (step == 0) {
            memcpy(hidden, p.hidden, sizeof(float) * (size_t)S * H);
            memcpy(hidden + (size_t)S * H, p.hidden, sizeof(float) * (size_t)S * H);
        } else {
            tokens[0] = gc->generated[step - 1];
            tokens[1] = argmax(logits + V, V);
            rc = stage_backend_embed(be, hidden, tokens, 2);
        }
        if (rc == 0) rc = stage_backend_forward(be, hidden, items, 2);
        for (int r = 0; r < 2; ++r)
            memcpy(last + (size_t)r * H, hidden + ((size_t)r * n + n - 1) * H, sizeof(float) * H);
        if (rc == 0) rc = stage_backend_logits(be, logits, last, 2);
        if (rc == 0 && diff < 0 && memcmp(logits, solo + (size_t)step * V, sizeof(float) * V))
            diff = step;
    }
    if (be) count_graphs(be);
    stage_backend_free(be);
    free(p.hidden), free(p.deepstack), free(p.visual);
    free(hidden), free(logits), free(last);
    if (rc < 0) {
        printf("  %s: batched with a second request: %s\n", name, strata_last_error());
        return 1;
    }
    if (diff >= 0) {
        printf("  %s: batched with a second request: logits differ from the solo run at step "
               "%d\n",
               name, diff);
        return 1;
    }
    printf("  %s: batched with a second request: bit-identical to the solo run\n", name);
    return 0;
}

/* Speculative decoding as a stage does it (runtime/stage/stage_speculate.c), on one backend:
 * steps of the fed id, a right draft and a wrong one; the wrong row's KV is dropped and the
 * next step starts there. Rows 0 and 1 must give the solo run's logits bit for bit. */
int check_speculative(const struct golden_case *gc, const char *name, const float *solo) {
    int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt, L = gc->cfg.num_layers;
    int slot = 0, diff = -1, rc, steps = 0;
    struct stage_backend *be = NULL;
    struct prefill p;
    int32_t ids[3], mrope[3 * 3];
    float *hidden = calloc((size_t)(S > 3 ? S : 3) * H, sizeof(float));
    float *logits = calloc((size_t)3 * V, sizeof(float));
    memset(&p, 0, sizeof p);
    rc = hidden && logits ? open_on(&be, device, gc, 0, L, S + gc->n_steps + 1) : STRATA_ENOMEM;
    if (rc == 0) rc = stage_backend_kv_acquire(be, &slot);
    if (rc == 0) rc = prefill_inputs(&p, gc, be);
    if (rc == 0) rc = stage_backend_forward(be, p.hidden, &p.item, 1);
    if (rc == 0) rc = stage_backend_logits(be, logits, p.hidden + (size_t)(S - 1) * H, 1);
    if (rc == 0 && memcmp(logits, solo, sizeof(float) * V)) diff = 0;
    /* Step s feeds generated[s - 1] at S + s - 1; its rows give steps s, s + 1. */
    for (int s = 1; rc == 0 && diff < 0 && s < gc->n_steps; s += 2) {
        const int n = s + 1 < gc->n_steps ? 3 : 1, pos = S + s - 1;
        ids[0] = gc->generated[s - 1];
        ids[1] = gc->generated[s];
        ids[2] = (gc->generated[s + 1 < gc->n_steps ? s + 1 : s] + 1) % V; /* never right */
        struct forward_item item = {.slot = slot, .pos = pos, .n_tokens = n};
        if (gc->has_vision) {
            for (int r = 0; r < 3; ++r)
                for (int i = 0; i < n; ++i)
                    mrope[r * n + i] = pos + i + gc->rope_delta;
            item.mrope_positions = mrope;
        }
        rc = stage_backend_embed(be, hidden, ids, n);
        if (rc == 0) rc = stage_backend_forward(be, hidden, &item, 1);
        if (rc == 0) rc = stage_backend_logits(be, logits, hidden, n);
        for (int i = 0; rc == 0 && i < (n == 3 ? 2 : 1); ++i)
            if (diff < 0 &&
                memcmp(logits + (size_t)i * V, solo + (size_t)(s + i) * V, sizeof(float) * V))
                diff = s + i;
        /* The wrong draft's row is rejected: its position is written again next step. */
        if (rc == 0 && n == 3) rc = stage_backend_kv_truncate(be, slot, pos + 2);
        steps++;
    }
    if (be) count_graphs(be);
    stage_backend_free(be);
    free(p.hidden), free(p.deepstack), free(p.visual);
    free(hidden), free(logits);
    if (rc < 0) {
        printf("  %s: speculative steps: %s\n", name, strata_last_error());
        return 1;
    }
    if (diff >= 0) {
        printf("  %s: speculative steps: logits differ from the solo run at step %d\n", name, diff);
        return 1;
    }
    printf("  %s: %d speculative steps (a right and a wrong draft each, the wrong row dropped): "
           "bit-identical to the solo run\n",
           name, steps);
    return 0;
}

/* 1 with a line naming `what` when the pool's counts are not the ones expected. */
static int usage_is(const struct stage_backend *be, const char *name, const char *what, int blocks,
                    int free_blocks, int promised, size_t block_bytes) {
    struct stage_kv_usage u;
    stage_backend_kv_usage(be, &u);
    if (u.blocks == blocks && u.free == free_blocks && u.promised == promised &&
        u.block_positions == 16 && u.block_bytes == block_bytes)
        return 0;
    printf("  %s: KV pool %s: %d blocks, %d free, %d promised, %d positions and %zu bytes each; "
           "expected %d, %d, %d, 16, %zu\n",
           name, what, u.blocks, u.free, u.promised, u.block_positions, u.block_bytes, blocks,
           free_blocks, promised, block_bytes);
    return 1;
}

/* 1 with a line when `rc` is not `want`. */
static int rc_is(int rc, int want, const char *name, const char *what) {
    if (rc == want) return 0;
    printf("  %s: %s gave %d, expected %d (%s)\n", name, what, rc, want,
           rc ? strata_last_error() : "no error");
    return 1;
}

/* The KV pool under a budget of one request's blocks and two more (+ half a block: whole
 * blocks only), one backend over [0, L): a filler request d takes two blocks (17 positions),
 * the golden request g reserves all it will need (the rest of the pool), d can then reserve
 * no more and a new request of one block is refused (slot -1 asks); d is released, its
 * blocks return at once, and g's prefill and teacher-forced decode take blocks from its
 * reservation, the later ones d's (stale keys and values, out of order in g's table): g's
 * logits must equal its solo run's `solo` [n_steps, V] bit for bit, and the counts follow
 * reference/kv_blocks.h at every step. Text cases only (the first). 0 when all holds, else 1
 * with a line per fault. */
int check_kv_pool(const struct golden_case *gc, const char *name, const float *solo) {
    const int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt;
    const int L = gc->cfg.num_layers, max_seq = S + gc->n_steps, per = (max_seq + 15) / 16;
    const size_t block_bytes = 2 * ops_kv_elem_bytes(kv_dtype) * (size_t)L *
                               (size_t)gc->cfg.num_kv_heads * 16 * (size_t)gc->cfg.head_dim;
    const int blocks = per + 2, FILL = 17;
    struct stage_backend *be = NULL;
    int d = -1, g = -1, bad = 0, diff = -1;
    float *hidden = calloc((size_t)(S > FILL ? S : FILL) * H, sizeof(float));
    float *logits = calloc((size_t)V, sizeof(float));
    int32_t *fill = calloc(FILL, sizeof(int32_t));
    open_kv_memory = block_bytes * (size_t)blocks + block_bytes / 2;
    int rc = hidden && logits && fill ? open_on(&be, device, gc, 0, L, max_seq) : STRATA_ENOMEM;
    open_kv_memory = 0;
    if (rc == 0) bad += usage_is(be, name, "opened", blocks, blocks, 0, block_bytes);
    if (rc == 0) rc = stage_backend_kv_acquire(be, &d);
    if (rc == 0) rc = stage_backend_kv_acquire(be, &g);
    for (int i = 0; i < FILL; ++i)
        fill[i] = gc->prompt[i % S];
    if (rc == 0) rc = stage_backend_embed(be, hidden, fill, FILL);
    struct forward_item item = {.slot = d, .pos = 0, .n_tokens = FILL};
    if (rc == 0) rc = stage_backend_forward(be, hidden, &item, 1);
    if (rc == 0) {
        bad += usage_is(be, name, "after 17 positions", blocks, blocks - 2, 0, block_bytes);
        bad += rc_is(stage_backend_kv_reserve(be, g, max_seq), 0, name, "reserving the rest");
        bad += usage_is(be, name, "reserved", blocks, blocks - 2, per, block_bytes);
        bad += rc_is(stage_backend_kv_reserve(be, d, FILL + 16), STRATA_EBUSY, name,
                     "reserving past the pool");
        bad += rc_is(stage_backend_kv_reserve(be, -1, 16), STRATA_EBUSY, name,
                     "asking for a block of a full pool");
        stage_backend_kv_release(be, d);
        bad += usage_is(be, name, "released", blocks, blocks, per, block_bytes);
        bad += rc_is(stage_backend_kv_reserve(be, -1, 32), 0, name, "asking for the freed blocks");
    }
    if (rc == 0) rc = stage_backend_embed(be, hidden, gc->prompt, S);
    item = (struct forward_item){.slot = g, .pos = 0, .n_tokens = S};
    for (int step = 0; rc == 0 && step < gc->n_steps; ++step) {
        if (step) {
            item = (struct forward_item){.slot = g, .pos = S + step - 1, .n_tokens = 1};
            rc = stage_backend_embed(be, hidden, &gc->generated[step - 1], 1);
        }
        if (rc == 0) rc = stage_backend_forward(be, hidden, &item, 1);
        if (rc == 0)
            rc = stage_backend_logits(be, logits, hidden + (size_t)(item.n_tokens - 1) * H, 1);
        if (rc == 0 && diff < 0 && memcmp(logits, solo + (size_t)step * V, sizeof(float) * V))
            diff = step;
    }
    const int held = (S + gc->n_steps - 1 + 15) / 16;
    if (rc == 0) {
        bad += usage_is(be, name, "decoded", blocks, blocks - held, per - held, block_bytes);
        stage_backend_kv_release(be, g);
        bad += usage_is(be, name, "all released", blocks, blocks, 0, block_bytes);
    }
    if (be) count_graphs(be);
    stage_backend_free(be);
    free(hidden), free(logits), free(fill);
    if (rc < 0) {
        printf("  %s: KV pool under a budget: %s\n", name, strata_last_error());
        return 1;
    }
    if (diff >= 0)
        printf("  %s: KV pool under a budget: logits differ from the solo run at step %d\n", name,
               diff);
    else if (!bad)
        printf("  %s: KV pool of %d blocks: reservations, releases and counts as kept; decoding "
               "into freed blocks bit-identical to the solo run\n",
               name, blocks);
    return bad || diff >= 0;
}

/* The answer's blocks kept for a chat's next turn (runtime/stage/stage_prefix.c), on one
 * backend [0, L): request a prefills the prompt and decodes the golden's tokens a step at a
 * time (every one but the last fed back); its full blocks but the last row's, prompt and
 * answer, are registered and it is released; request b, the prompt and the answer, attaches
 * them and prefills the rest in one chunk. b's rows must give the solo run's logits bit for
 * bit: KV that decode steps wrote equals what a prefill of the same ids writes, which is what
 * lets a turn reuse an answer. Qwen3-VL cases too: the answer's rows follow the picture, at
 * M-RoPE positions cache index + rope_delta in both the decode steps and b's prefill. */
int check_answer_reuse(const struct golden_case *gc, const char *name, const float *solo) {
    const int V = gc->cfg.vocab_size, H = gc->cfg.hidden_size, S = gc->n_prompt;
    const int L = gc->cfg.num_layers, n = gc->n_steps, written = S + n - 1;
    const int blocks = (written - 1) / 16, pos0 = blocks * 16, T = written - pos0;
    struct stage_backend *be = NULL;
    struct prefill p;
    int a = -1, b = -1, diff = -1, got = 0;
    uint64_t keys[64];
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)written);
    int32_t *mrope = malloc(sizeof(int32_t) * 3 * (size_t)(T > 1 ? T : 1));
    float *hidden = calloc((size_t)(T > 1 ? T : 1) * H, sizeof(float));
    float *logits = calloc((size_t)V, sizeof(float));
    memset(&p, 0, sizeof p);
    if (pos0 <= S || blocks > 64) {
        printf("  %s: answer reuse: not checked (the answer fills no whole block before its last "
               "row)\n",
               name);
        free(ids), free(mrope), free(hidden), free(logits);
        return 0;
    }
    int rc =
        ids && mrope && hidden && logits ? open_on(&be, device, gc, 0, L, S + n) : STRATA_ENOMEM;
    if (rc == 0) {
        memcpy(ids, gc->prompt, sizeof(int32_t) * (size_t)S);
        memcpy(ids + S, gc->generated, sizeof(int32_t) * (size_t)(n - 1));
        for (int i = 0; i < blocks; ++i)
            keys[i] = 0x5eed0000u + (uint64_t)i;
        rc = stage_backend_kv_acquire(be, &a);
    }
    if (rc == 0) rc = prefill_inputs(&p, gc, be);
    if (rc == 0) rc = stage_backend_forward(be, p.hidden, &p.item, 1);
    for (int s = 1; rc == 0 && s < n; ++s) {
        struct forward_item item = {.slot = a, .pos = S + s - 1, .n_tokens = 1};
        if (gc->has_vision) {
            mrope[0] = mrope[1] = mrope[2] = item.pos + gc->rope_delta;
            item.mrope_positions = mrope;
        }
        rc = stage_backend_embed(be, hidden, &gc->generated[s - 1], 1);
        if (rc == 0) rc = stage_backend_forward(be, hidden, &item, 1);
    }
    if (rc == 0) {
        stage_backend_kv_register(be, a, keys, blocks);
        stage_backend_kv_release(be, a);
        rc = stage_backend_kv_acquire(be, &b);
    }
    if (rc == 0) rc = got = stage_backend_kv_attach(be, b, keys, blocks);
    if (rc > 0) rc = 0;
    if (rc == 0 && got != pos0)
        rc = strata_set_error(STRATA_EINVAL, "attached %d positions of %d registered", got, pos0);
    struct forward_item item = {.slot = b, .pos = pos0, .n_tokens = T};
    if (gc->has_vision) {
        for (int r = 0; r < 3; ++r)
            for (int i = 0; i < T; ++i)
                mrope[r * T + i] = pos0 + i + gc->rope_delta;
        item.mrope_positions = mrope;
    }
    if (rc == 0) rc = stage_backend_embed(be, hidden, ids + pos0, T);
    if (rc == 0) rc = stage_backend_forward(be, hidden, &item, 1);
    for (int i = 0; rc == 0 && diff < 0 && i < T; ++i) {
        const int step = pos0 + i - S + 1; /* the row at position p gives step p - S + 1 */
        rc = stage_backend_logits(be, logits, hidden + (size_t)i * H, 1);
        if (rc == 0 && memcmp(logits, solo + (size_t)step * V, sizeof(float) * V)) diff = step;
    }
    if (be) count_graphs(be);
    stage_backend_free(be);
    free(p.hidden), free(p.deepstack), free(p.visual);
    free(ids), free(mrope), free(hidden), free(logits);
    if (rc < 0) {
        printf("  %s: answer reuse: %s\n", name, strata_last_error());
        return 1;
    }
    if (diff >= 0) {
        printf("  %s: answer reuse: logits differ from the solo run at step %d\n", name, diff);
        return 1;
    }
    printf("  %s: answer reuse: %d blocks written by a prefill and %d decode steps, attached by "
           "a next turn that prefills %d rows: bit-identical to the solo run\n",
           name, blocks, n - 1, T);
    return 0;
}
