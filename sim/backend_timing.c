/* The simulator's timing-only backend (device "timing"): a stage backend that computes
 * nothing and holds no weights, so that strata-sim --no-weights can run a plan of a model
 * whose checkpoint is not on this machine (a 235B model's config.json is enough) and charge
 * each step what the performance model says (--compute model).
 *
 * What it keeps is what timing depends on: the KV pool's bookkeeping (reference/kv_blocks.h:
 * blocks taken as positions arrive, reservations, prefix reuse, the same refusals as the
 * CPU backend, from the same --kv-memory budget priced at the role's real block bytes), so
 * admission, queueing and cached prefixes behave as on a real stage. Hidden rows are zeros
 * and every greedy token is id 0 (a request runs to its max_tokens unless 0 is a stop id),
 * so no bits mean anything here: the simulator compares none in this mode. Linked only into
 * strata-sim; a stage binary has no such device. */
#include <stdlib.h>
#include <string.h>

#include "reference/kv_blocks.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"

struct timing_context {
    struct kv_blocks blocks;
    enum ops_dtype kv_dtype;
    size_t block_bytes; /* K and V of one block over the role's layers, as a real stage stores */
};

static struct timing_context *ctx(const struct stage_backend *be) {
    return be->context;
}

static int timing_embed(struct stage_backend *be, float *hidden, const int32_t *tokens, int n) {
    const int V = be->cfg->vocab_size;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return strata_set_error(STRATA_ERANGE, "timing embed: token id %d outside [0, %d)",
                                    tokens[i], V);
    memset(hidden, 0, sizeof(float) * (size_t)n * (size_t)be->cfg->hidden_size);
    return 0;
}

/* Nothing is computed; each item's positions are taken in the pool as a real forward would. */
static int timing_forward(struct stage_backend *be, float *hidden, const struct forward_item *items,
                          int n_items) {
    struct kv_blocks *b = &ctx(be)->blocks;
    int rows = 0, longest = 0;
    (void)hidden;
    int rc = forward_items_check("timing forward", items, n_items, b->len, b->in_use, b->num_slots,
                                 b->max_seq, be->cfg->num_layers, &rows, &longest);
    for (int i = 0; rc == 0 && i < n_items; i++) {
        const int end = items[i].pos + items[i].n_tokens;
        rc = be->role.layer_end > be->role.layer_start ? kv_blocks_grow(b, items[i].slot, end) : 0;
        if (rc == 0) b->len[items[i].slot] = end;
    }
    return rc;
}

static int timing_logits(struct stage_backend *be, float *logits, const float *hidden, int n) {
    (void)hidden;
    memset(logits, 0, sizeof(float) * (size_t)n * (size_t)be->cfg->vocab_size);
    return 0;
}

static int timing_argmax(struct stage_backend *be, int32_t *ids, const float *hidden, int n) {
    (void)be;
    (void)hidden;
    memset(ids, 0, sizeof(int32_t) * (size_t)n); /* argmax of a row of zeros */
    return 0;
}

static int timing_kv_acquire(struct stage_backend *be, int *slot) {
    return kv_blocks_acquire(&ctx(be)->blocks, slot);
}

static int timing_kv_reserve(struct stage_backend *be, int slot, int positions) {
    return kv_blocks_reserve(&ctx(be)->blocks, slot, positions);
}

static void timing_kv_release(struct stage_backend *be, int slot) {
    kv_blocks_release(&ctx(be)->blocks, slot);
}

static int timing_kv_truncate(struct stage_backend *be, int slot, int positions) {
    return kv_blocks_truncate(&ctx(be)->blocks, slot, positions);
}

/* What a real stage of this role would hold (nothing is allocated here). */
static size_t timing_kv_bytes(const struct stage_backend *be) {
    return (size_t)ctx(be)->blocks.num_blocks * ctx(be)->block_bytes;
}

static void timing_kv_usage(const struct stage_backend *be, struct stage_kv_usage *out) {
    const struct timing_context *c = ctx(be);
    *out = (struct stage_kv_usage){.dtype = c->kv_dtype,
                                   .blocks = c->blocks.num_blocks,
                                   .free = c->blocks.num_free,
                                   .cached = c->blocks.num_cached,
                                   .promised = c->blocks.promised,
                                   .block_positions = KV_BLOCK,
                                   .block_bytes = c->block_bytes};
}

static int timing_kv_lookup(const struct stage_backend *be, const uint64_t *keys, int n,
                            int *cached) {
    return kv_blocks_lookup(&ctx(be)->blocks, keys, n, cached);
}

static int timing_kv_attach(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    struct kv_blocks *b = &ctx(be)->blocks;
    const int got = kv_blocks_attach(b, slot, keys, n, n * KV_BLOCK);
    if (got < 0 || got < n) return got < 0 ? got : got * KV_BLOCK;
    b->len[slot] = n * KV_BLOCK;
    return n * KV_BLOCK;
}

static void timing_kv_register(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    kv_blocks_register(&ctx(be)->blocks, slot, keys, n);
}

static void timing_kv_forget(struct stage_backend *be) {
    kv_blocks_forget(&ctx(be)->blocks);
}

static int timing_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots,
                          int n) {
    (void)be;
    (void)out;
    (void)slots;
    (void)n;
    return strata_set_error(STRATA_EINVAL, "the timing backend holds no KV to hand over");
}

static int timing_kv_restore(struct stage_backend *be, const int *slots, int n,
                             const struct kv_handoff *in) {
    (void)be;
    (void)slots;
    (void)n;
    (void)in;
    return strata_set_error(STRATA_EINVAL, "the timing backend holds no KV to restore");
}

static void timing_describe(const struct stage_backend *be, struct stage_backend_info *out) {
    (void)be;
    out->kind = "timing";
    out->threads = 1;
}

static void timing_free(struct stage_backend *be) {
    struct timing_context *c = ctx(be);
    if (!c) return;
    kv_blocks_free(&c->blocks);
    free(c);
    be->context = NULL;
}

static const struct stage_backend_i timing_iface = {
    .embed = timing_embed,
    .forward = timing_forward,
    .logits = timing_logits,
    .argmax = timing_argmax,
    .kv_acquire = timing_kv_acquire,
    .kv_reserve = timing_kv_reserve,
    .kv_release = timing_kv_release,
    .kv_truncate = timing_kv_truncate,
    .kv_bytes = timing_kv_bytes,
    .kv_usage = timing_kv_usage,
    .kv_lookup = timing_kv_lookup,
    .kv_attach = timing_kv_attach,
    .kv_register = timing_kv_register,
    .kv_forget = timing_kv_forget,
    .kv_pack = timing_kv_pack,
    .kv_restore = timing_kv_restore,
    .describe = timing_describe,
    .free = timing_free,
};

static int backend_timing_open(struct stage_backend **out,
                               const struct stage_backend_options *opt) {
    const struct model_config *cfg = opt->cfg;
    if (stage_tp_is_split(opt->tp))
        return strata_set_error(STRATA_EINVAL, "the timing backend runs whole stages, not TP / "
                                               "KVP ranks");
    struct stage_backend *be = calloc(1, sizeof *be);
    struct timing_context *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!be || !c) {
        free(be);
        free(c);
        return strata_set_error(STRATA_ENOMEM, "out of memory for the timing backend");
    }
    *be = (struct stage_backend){.iface = &timing_iface,
                                 .context = c,
                                 .device_kind = "timing",
                                 .cfg = cfg,
                                 .role = opt->role,
                                 .max_seq = opt->max_seq,
                                 .num_slots = opt->num_slots};
    const int layers = opt->role.layer_end - opt->role.layer_start;
    c->kv_dtype = opt->kv_dtype;
    c->block_bytes = 2 * ops_kv_elem_bytes(opt->kv_dtype) * (size_t)layers *
                     (size_t)cfg->num_kv_heads * (size_t)KV_BLOCK * (size_t)cfg->head_dim;
    int blocks = 0;
    /* A fraction of free memory means the simulated box's, which this machine cannot tell:
     * only a size is a budget here. */
    int rc = opt->kv_memory_fraction > 0
                 ? strata_set_error(STRATA_EINVAL, "the timing backend takes a KV budget as a "
                                                   "size, not a share of free memory")
                 : 0;
    if (rc == 0 && layers > 0)
        rc = stage_backend_kv_blocks(opt, 0, c->block_bytes, opt->max_seq, &blocks);
    if (rc == 0) rc = kv_blocks_init(&c->blocks, opt->max_seq, opt->num_slots, blocks);
    if (rc < 0) {
        stage_backend_free(be);
        return rc;
    }
    *out = be;
    return 0;
}

/* Registered when this target is linked (alwayslink): see backend.h. */
static const struct stage_backend_kind backend_timing_kind = {"timing", STAGE_BACKEND_TIMING,
                                                              backend_timing_open};

__attribute__((constructor)) static void backend_timing_register(void) {
    stage_backend_register(&backend_timing_kind);
}
