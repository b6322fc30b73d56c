/* The CPU backend: the reference decoder (reference/model.h) and its host KV cache
 * (reference/kv_cache.h) behind the stage backend table (backend.h). */
#include <stdio.h>
#include <stdlib.h>

#include "reference/kv_cache.h"
#include "reference/model.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"

struct cpu_context {
    struct reference_model *model;
    struct kv_cache kv;
    int num_threads;
    enum reference_weights_dtype weights_dtype;
};

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

static int cpu_kv_acquire(struct stage_backend *be, int *slot) {
    return kv_cache_acquire(&ctx(be)->kv, slot);
}

static void cpu_kv_release(struct stage_backend *be, int slot) {
    kv_cache_release(&ctx(be)->kv, slot);
}

static size_t cpu_kv_bytes(const struct stage_backend *be) {
    return kv_cache_bytes(&ctx(be)->kv);
}

static int cpu_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots, int n) {
    return kv_cache_pack(out, &ctx(be)->kv, slots, n);
}

static int cpu_kv_restore(struct stage_backend *be, const int *slots, int n,
                          const struct kv_handoff *in) {
    return kv_cache_restore(&ctx(be)->kv, slots, n, in);
}

static void cpu_describe(const struct stage_backend *be, char *buf, size_t cap) {
    const struct cpu_context *c = ctx(be);
    size_t replaced, q8 = reference_model_q8_bytes(c->model, &replaced);
    int n = snprintf(
        buf, cap, "device: cpu, %d thread%s\nweights: %d tensors, %zu bytes (+%zu bytes widened)",
        c->num_threads, c->num_threads == 1 ? "" : "s", reference_model_num_tensors(c->model),
        reference_model_weight_bytes(c->model), reference_model_extra_bytes(c->model));
    if (c->weights_dtype == REFERENCE_WEIGHTS_Q8 && n >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, "; q8: %zu bytes of 8-bit copies replace %zu bytes", q8,
                 replaced);
}

static void cpu_free(struct stage_backend *be) {
    struct cpu_context *c = ctx(be);
    if (!c) return;
    reference_model_free(c->model);
    kv_cache_free(&c->kv);
    free(c);
    be->context = NULL;
}

static const struct stage_backend_i cpu_iface = {
    .embed = cpu_embed,
    .forward = cpu_forward,
    .logits = cpu_logits,
    .kv_acquire = cpu_kv_acquire,
    .kv_release = cpu_kv_release,
    .kv_bytes = cpu_kv_bytes,
    .kv_pack = cpu_kv_pack,
    .kv_restore = cpu_kv_restore,
    .describe = cpu_describe,
    .free = cpu_free,
};

int backend_cpu_open(struct stage_backend **out, const struct stage_backend_options *opt) {
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
    rc = reference_weights_dtype_parse(&c->weights_dtype,
                                       opt->weights_dtype ? opt->weights_dtype : "bf16");
    if (rc == 0)
        rc = reference_model_load(
            &c->model, cfg, opt->weights,
            &(struct reference_load_options){.layer_start = role->layer_start,
                                             .layer_end = role->layer_end,
                                             .with_embed = role->with_embed,
                                             .with_head = role->with_head,
                                             .num_threads = opt->num_threads,
                                             .weights_dtype = c->weights_dtype});
    if (rc == 0)
        rc = kv_cache_init(&c->kv, role->layer_start, role->layer_end, cfg->num_kv_heads,
                           cfg->head_dim, opt->max_seq, opt->num_slots);
    if (rc < 0) {
        stage_backend_free(be);
        return rc;
    }
    *out = be;
    return 0;
}
