/* The CPU backend: the reference decoder (reference/model.h) and its host KV cache
 * (reference/kv_cache.h) behind the stage backend table (backend.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"
#include "wire/collective.h"

/* One sub-group of the stage's group (its TP group, or its KVP group): the members
 * first, first + stride, ... (count of them), in rank order. */
struct cpu_group {
    struct coll *coll;
    int first, stride, count;
    float *tmp; /* [group size, n] when the sub-group is not the whole group */
    size_t cap;
};

struct cpu_context {
    struct reference_model *model;
    struct kv_cache kv;
    int num_threads;
    int tp, tp_rank;   /* tensor parallelism: this rank's place (1, 0 without) */
    int kvp, kvp_rank; /* KV parallelism: likewise */
    struct cpu_group tp_group, kvp_group;
    enum reference_weights_dtype weights_dtype;
};

/* Every rank's n floats into g->tmp [size, n] (the whole group's all-gather). */
static int gather_all(struct cpu_group *g, const float *in, size_t n) {
    const size_t need = (size_t)coll_size(g->coll) * n;
    if (need > g->cap) {
        float *p = realloc(g->tmp, need * sizeof *p);
        if (!p) return strata_set_error(STRATA_ENOMEM, "CPU backend: no memory for a collective");
        g->tmp = p;
        g->cap = need;
    }
    return coll_allgather(g->coll, g->tmp, in, n);
}

/* The decoder's hooks (reference/model.h). When the sub-group is the whole group they are
 * the group's own operations; otherwise (TP x KVP) an all-gather of the whole group and the
 * members' sum in rank order, ((x0 + x1) + x2) + ..., the order of coll_allreduce_sum, so
 * the bits do not depend on the other dimension. */
static int cpu_allreduce(void *ctx, float *data, size_t n) {
    struct cpu_group *g = ctx;
    if (g->count == coll_size(g->coll)) return coll_allreduce_sum(g->coll, data, n);
    int rc = gather_all(g, data, n);
    if (rc) return rc;
    for (size_t i = 0; i < n; ++i) {
        float sum = g->tmp[(size_t)g->first * n + i];
        for (int k = 1; k < g->count; ++k)
            sum += g->tmp[(size_t)(g->first + k * g->stride) * n + i];
        data[i] = sum;
    }
    return STRATA_OK;
}

static int cpu_allgather(void *ctx, float *out, const float *in, size_t n) {
    struct cpu_group *g = ctx;
    if (g->count == coll_size(g->coll)) return coll_allgather(g->coll, out, in, n);
    int rc = gather_all(g, in, n);
    if (rc) return rc;
    for (int k = 0; k < g->count; ++k)
        memcpy(out + (size_t)k * n, g->tmp + (size_t)(g->first + k * g->stride) * n,
               n * sizeof(float));
    return STRATA_OK;
}

static struct cpu_context *ctx(const struct stage_backend *be) {
    return be->context;
}

static int cpu_embed(struct stage_backend *be, float *hidden, const int32_t *tokens, int n) {
    return reference_embed(ctx(be)->model, hidden, tokens, n);
}

static int cpu_forward(struct stage_backend *be, float *hidden, const struct forward_item *items,
                       int n_items) {
    return reference_forward(ctx(be)->model, &ctx(be)->kv, hidden, items, n_items);
}

static int cpu_logits(struct stage_backend *be, float *logits, const float *hidden, int n) {
    return reference_logits(ctx(be)->model, logits, hidden, n);
}

static int cpu_argmax(struct stage_backend *be, int32_t *ids, const float *hidden, int n) {
    return reference_logits_argmax(ctx(be)->model, ids, hidden, n);
}

static int cpu_kv_acquire(struct stage_backend *be, int *slot) {
    return kv_cache_acquire(&ctx(be)->kv, slot);
}

static int cpu_kv_reserve(struct stage_backend *be, int slot, int positions) {
    struct cpu_context *c = ctx(be);
    return kv_blocks_reserve(&c->kv.blocks, slot, reference_model_kv_held(c->model, positions));
}

/* A KVP rank holds global blocks [lo, hi) of every sequence (at local indices 0..): the
 * keys of its range among the first n. */
static void kvp_block_range(const struct cpu_context *c, int n, int *lo, int *hi) {
    kv_blocks_rank_range(n, reference_model_kv_first(c->model), c->kv.blocks.max_seq, lo, hi);
}

/* Under KVP, this rank's part of the group's answer (the TP leader gathers the least). */
static int cpu_kv_lookup(const struct stage_backend *be, const uint64_t *keys, int n, int *cached) {
    const struct cpu_context *c = ctx(be);
    if (c->kvp <= 1) return kv_blocks_lookup(&c->kv.blocks, keys, n, cached);
    int lo, hi;
    kvp_block_range(c, n, &lo, &hi);
    return kv_blocks_lookup_range(&c->kv.blocks, keys, n, lo, hi, cached);
}

static int cpu_kv_attach(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    struct cpu_context *c = ctx(be);
    int lo = 0, hi = n;
    if (c->kvp > 1) kvp_block_range(c, n, &lo, &hi);
    const int want = hi > lo ? hi - lo : 0;
    const int got = want ? kv_blocks_attach(&c->kv.blocks, slot, keys + lo, want, n * KV_BLOCK) : 0;
    if (got < 0) return got;
    if (got < want) return got * KV_BLOCK; /* a miss: the caller refuses */
    c->kv.blocks.len[slot] = n * KV_BLOCK; /* lengths are global under KVP */
    return n * KV_BLOCK;
}

static void cpu_kv_register(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    struct cpu_context *c = ctx(be);
    int lo = 0, hi = n;
    if (c->kvp > 1) kvp_block_range(c, n, &lo, &hi);
    if (hi > lo) kv_blocks_register(&c->kv.blocks, slot, keys + lo, hi - lo);
}

static void cpu_kv_forget(struct stage_backend *be) {
    kv_blocks_forget(&ctx(be)->kv.blocks);
}

static void cpu_kv_release(struct stage_backend *be, int slot) {
    kv_cache_release(&ctx(be)->kv, slot);
}

static int cpu_kv_truncate(struct stage_backend *be, int slot, int positions) {
    return kv_blocks_truncate(&ctx(be)->kv.blocks, slot, positions);
}

static size_t cpu_kv_bytes(const struct stage_backend *be) {
    return kv_cache_bytes(&ctx(be)->kv);
}

static void cpu_kv_usage(const struct stage_backend *be, struct stage_kv_usage *out) {
    const struct kv_cache *kv = &ctx(be)->kv;
    *out = (struct stage_kv_usage){
        .dtype = kv->dtype,
        .blocks = kv->blocks.num_blocks,
        .free = kv->blocks.num_free,
        .cached = kv->blocks.num_cached,
        .promised = kv->blocks.promised,
        .block_positions = KV_BLOCK,
        .block_bytes =
            2 * ops_kv_elem_bytes(kv->dtype) *
            kv_cache_block_floats(kv->layer_end - kv->layer_start, kv->num_kv_heads, kv->head_dim)};
}

static int cpu_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots, int n) {
    return kv_cache_pack(out, &ctx(be)->kv, slots, n);
}

static int cpu_kv_restore(struct stage_backend *be, const int *slots, int n,
                          const struct kv_handoff *in) {
    return kv_cache_restore(&ctx(be)->kv, slots, n, in);
}

static void cpu_describe(const struct stage_backend *be, struct stage_backend_info *out) {
    const struct cpu_context *c = ctx(be);
    /* The kernels cpuid picked (every path gives the same bits, so this is about speed: an
     * operator comparing two boxes' tokens/s wants to know which ran). */
    const enum ops_path path = ops_matmul_path();
    out->kind = "cpu";
    out->threads = c->num_threads;
    out->kernels = ops_path_name(path);
    out->q8 = c->weights_dtype == REFERENCE_WEIGHTS_Q8;
    out->q8_on_vnni = out->q8 && path == OPS_PATH_AVX512 && ops_avx512_vnni_available();
    out->weight_tensors = reference_model_num_tensors(c->model);
    out->weight_bytes = reference_model_weight_bytes(c->model);
    out->widened_bytes = reference_model_extra_bytes(c->model);
    out->q8_bytes = reference_model_q8_bytes(c->model, &out->q8_replaced_bytes);
    out->moved_bytes = reference_model_copied_bytes(c->model, &out->huge_page_bytes);
    if (c->tp > 1 || c->kvp > 1) {
        out->tp = c->tp;
        out->tp_rank = c->tp_rank;
        out->kvp = c->kvp;
        out->kvp_rank = c->kvp_rank;
    }
}

static void cpu_free(struct stage_backend *be) {
    struct cpu_context *c = ctx(be);
    if (!c) return;
    reference_model_free(c->model);
    kv_cache_free(&c->kv);
    free(c->tp_group.tmp);
    free(c->kvp_group.tmp);
    free(c);
    be->context = NULL;
}

static void cpu_idle(struct stage_backend *be) {
    struct cpu_context *c = ctx(be);
    reference_model_park_threads(c->model);
}

static const struct stage_backend_i cpu_iface = {
    .embed = cpu_embed,
    .forward = cpu_forward,
    .logits = cpu_logits,
    .argmax = cpu_argmax,
    .kv_acquire = cpu_kv_acquire,
    .kv_reserve = cpu_kv_reserve,
    .kv_release = cpu_kv_release,
    .kv_truncate = cpu_kv_truncate,
    .kv_bytes = cpu_kv_bytes,
    .kv_usage = cpu_kv_usage,
    .kv_lookup = cpu_kv_lookup,
    .kv_attach = cpu_kv_attach,
    .kv_register = cpu_kv_register,
    .kv_forget = cpu_kv_forget,
    .kv_pack = cpu_kv_pack,
    .kv_restore = cpu_kv_restore,
    .describe = cpu_describe,
    .idle = cpu_idle,
    .free = cpu_free,
};

/* TP and KVP: the shard, the two sub-groups and the decoder's hooks on them. */
static int grid_hooks(struct cpu_context *c, struct reference_load_options *lo,
                      struct tp_shard *shard, const struct stage_backend_options *opt) {
    const struct stage_tp_config *g = opt->tp;
    const int T = g->tp > 1 ? g->tp : 1, K = g->kvp > 1 ? g->kvp : 1;
    if (coll_size(g->coll) != T * K || coll_rank(g->coll) != g->kvp_rank * T + g->tp_rank)
        return strata_set_error(STRATA_EINVAL,
                                "TP rank %d of %d x KVP rank %d of %d, but the group says rank %d "
                                "of %d",
                                g->tp_rank, T, g->kvp_rank, K, coll_rank(g->coll),
                                coll_size(g->coll));
    c->tp = T;
    c->tp_rank = g->tp_rank;
    c->kvp = K;
    c->kvp_rank = g->kvp_rank;
    c->tp_group = (struct cpu_group){g->coll, g->kvp_rank * T, 1, T, NULL, 0};
    c->kvp_group = (struct cpu_group){g->coll, g->tp_rank, T, K, NULL, 0};
    if (T > 1) {
        int rc = tp_shard_init(shard, opt->cfg, T, g->tp_rank, g->moe);
        if (rc) return rc;
        lo->tp = shard;
        lo->coll = (struct reference_collective){
            .ctx = &c->tp_group, .allreduce_sum = cpu_allreduce, .allgather = cpu_allgather};
    }
    if (K > 1)
        lo->kvp =
            (struct reference_kvp){.kvp = K,
                                   .rank = g->kvp_rank,
                                   .tokens = g->kvp_tokens,
                                   .max_seq = opt->max_seq,
                                   .coll = {.ctx = &c->kvp_group, .allgather = cpu_allgather}};
    return STRATA_OK;
}

static int backend_cpu_open(struct stage_backend **out, const struct stage_backend_options *opt) {
    const struct model_config *cfg = opt->cfg;
    const struct stage_role *role = &opt->role;
    struct stage_backend *be = calloc(1, sizeof *be);
    struct cpu_context *c = calloc(1, sizeof *c);
    int rc;
    *out = NULL;
    if (!be || !c) {
        free(be);
        free(c);
        return strata_set_error(STRATA_ENOMEM, "out of memory for the CPU backend");
    }
    *be = (struct stage_backend){.iface = &cpu_iface,
                                 .context = c,
                                 .device_kind = "cpu",
                                 .cfg = cfg,
                                 .role = *role,
                                 .max_seq = opt->max_seq,
                                 .num_slots = opt->num_slots};
    c->num_threads = opt->num_threads;
    c->tp = c->kvp = 1;
    rc = reference_weights_dtype_parse(&c->weights_dtype,
                                       opt->weights_dtype ? opt->weights_dtype : "bf16");
    struct reference_load_options lo = {.layer_start = role->layer_start,
                                        .layer_end = role->layer_end,
                                        .with_embed = role->with_embed,
                                        .with_head = role->with_head,
                                        .num_threads = opt->num_threads,
                                        .weights_dtype = c->weights_dtype,
                                        .weights_in_file = opt->weights_in_file,
                                        .progress = opt->progress};
    struct tp_shard shard;
    if (rc == 0 && stage_tp_is_split(opt->tp)) rc = grid_hooks(c, &lo, &shard, opt);
    if (rc == 0) rc = reference_model_load(&c->model, cfg, opt->weights, &lo);
    int blocks = 0, kv_heads = 0, positions = 0;
    /* A stage without layers holds no KV: its slots need no budget (and blocks of 0 bytes
     * would make any budget one request's worth). */
    if (rc == 0) {
        kv_heads = reference_model_kv_heads(c->model);
        positions = reference_model_kv_positions(c->model, opt->max_seq);
    }
    if (rc == 0 && role->layer_end > role->layer_start) {
        rc = stage_backend_kv_blocks(
            opt, stage_host_available_bytes(),
            2 * ops_kv_elem_bytes(opt->kv_dtype) *
                kv_cache_block_floats(role->layer_end - role->layer_start, kv_heads, cfg->head_dim),
            positions, &blocks);
    }
    if (rc == 0)
        rc = kv_cache_init(&c->kv, role->layer_start, role->layer_end, kv_heads, cfg->head_dim,
                           positions, opt->num_slots, blocks, opt->kv_dtype);
    if (rc < 0) {
        stage_backend_free(be);
        return rc;
    }
    *out = be;
    return 0;
}

/* Registered when this target is linked (alwayslink): see backend.h. */
static const struct stage_backend_kind backend_cpu_kind = {"cpu", STAGE_BACKEND_Q8,
                                                           backend_cpu_open};

__attribute__((constructor)) static void backend_cpu_register(void) {
    stage_backend_register(&backend_cpu_kind);
}
