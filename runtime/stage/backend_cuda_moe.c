/* The CUDA backend's MoE ops (reference/forward.c forward_moe is the block, written once;
 * see backend_cuda.c), all on the device with no host round trip, so a decode step holding
 * MoE layers is still one CUDA graph. Launch shapes depend only on the row count:
 *   1. routing, one thread per row (cuda_moe_route_rows: the reference's moe_route with
 *      CUDA's expf);
 *   2. grouping by expert (cuda_moe_group, the reference's moe_group): the held experts
 *      [experts_lo, experts_hi) in ascending index, inside one the slots (row, choice) in
 *      ascending order; per expert its rows' offsets, per slot its grouped position;
 *   3. the grouped rows gathered (cuda_ops_weight_rows; positions past the held count
 *      gather row 0, never read back) and every expert's SwiGLU MLP as three grouped
 *      matmuls (cuda_matmul_grouped: the experts' row counts are device data, each tile of
 *      rows runs matmul.cu's half-warp dot on its expert's weight, so every element is
 *      cuda_matmul's / cuda_matmul_split's, bitwise and batch-invariant);
 *   4. the reference's sum (cuda_moe_expert_sum, the reference's moe_expert_sum): each
 *      (row, choice) slot = weight × expert output, the row's held slots added by the
 *      halving tree over expert indices [experts_lo, experts_hi), zeros for a row holding
 *      none; under TP --moe expert a rank's rows are one node of that tree, which the
 *      layer's TP reduce completes by its top.
 * What it gives up against host routing: the routing's expf is CUDA's (within 2 ulp of
 * glibc's), like the experts' SwiGLU already was; the summation order is the reference's.
 * Checked on the host by tests/backend_ops (the emulation and kernels/cuda_cpu) and
 * tests/kernels:moe_group_test on a device. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "kernels/moe_combine.h"
#include "kernels/moe_group.h"
#include "kernels/moe_route.h"
#include "kernels/ops_weight_row.h"
#include "kernels/swiglu.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "reference/forward.h"
#include "runtime/stage/backend_cuda_internal.h"

/* The common dtype and shape of a layer's held experts for one weight (data NULL), or an
 * error when they differ (one grouped launch takes one shape). */
static int common_shape(struct ops_weight *out, const struct ops_weight *w, int lo, int hi,
                        int layer, const char *what) {
    *out = (struct ops_weight){NULL, w[lo].dtype, w[lo].rows, w[lo].cols};
    for (int e = lo; e < hi; ++e)
        if (!w[e].data || w[e].dtype != out->dtype || w[e].rows != out->rows ||
            w[e].cols != out->cols)
            return strata_set_error(STRATA_EINVAL,
                                    "cuda backend: layer %d expert %d %s: %s (the held experts' "
                                    "matrices must share one shape and dtype)",
                                    layer, e, what, w[e].data ? "another shape" : "not loaded");
    return 0;
}

int backend_cuda_moe_open(struct cuda_context *c) {
    const int E = c->cfg->num_experts, lo = c->experts_lo, hi = c->experts_hi;
    int moe_layers = 0, rc = 0;
    for (int l = 0; l < c->n_layers; ++l)
        moe_layers += c->layers[l].is_moe;
    if (!moe_layers) return 0;
    if (lo < 0 || hi > E || lo >= hi || E > MOE_MAX_EXPERTS)
        return strata_set_error(STRATA_EINVAL,
                                "cuda backend: held experts [%d, %d) of %d (at most %d experts)",
                                lo, hi, E, MOE_MAX_EXPERTS);
    c->moe = calloc((size_t)c->n_layers, sizeof *c->moe);
    const void **host = calloc((size_t)moe_layers * 3 * (size_t)E, sizeof *host);
    const size_t bytes = (size_t)moe_layers * 3 * (size_t)E * sizeof *host;
    if (!c->moe || !host) rc = strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
    if (!rc) rc = cuda_malloc((void **)&c->moe_ptrs, bytes);
    for (int l = 0, k = 0; l < c->n_layers && !rc; ++l) {
        const struct layer_weights *L = &c->layers[l];
        struct cuda_moe_layer *M = &c->moe[l];
        if (!L->is_moe) continue;
        const struct ops_weight *mats[3] = {L->expert_gate, L->expert_up, L->expert_down};
        struct ops_weight *shapes[3] = {&M->gate, &M->up, &M->down};
        const void *const **tables[3] = {&M->gate_ptrs, &M->up_ptrs, &M->down_ptrs};
        static const char *const names[3] = {"gate", "up", "down"};
        for (int j = 0; j < 3 && !rc; ++j, ++k) {
            rc = common_shape(shapes[j], mats[j], lo, hi, L->index, names[j]);
            for (int e = lo; e < hi; ++e) /* NULL for another TP rank's experts */
                host[(size_t)k * E + e] = mats[j][e].data;
            *tables[j] = c->moe_ptrs + (size_t)k * E;
        }
    }
    if (!rc) rc = cuda_memcpy_to_device(c->moe_ptrs, host, bytes);
    free(host);
    return rc;
}

void backend_cuda_moe_close(struct cuda_context *c) {
    cuda_free(c->moe_ptrs);
    c->moe_ptrs = NULL;
    free(c->moe);
    c->moe = NULL;
}

int backend_cuda_moe_chunk(const struct cuda_context *c) {
    const int K = c->cfg->num_experts_per_tok, I = c->cfg->moe_intermediate_size;
    if (c->cfg->num_experts <= 0 || K < 1) return 0; /* no MoE layer */
    /* A grouped launch covers at most 65535 tiles of 4 rows, cap + 3·E rows' worth
     * (kernels/matmul.h), and the SwiGLU's cap·I elements are an int. At least 2 rows
     * (E <= MOE_MAX_EXPERTS). */
    int chunk = (4 * 65535 - 3 * c->cfg->num_experts) / K;
    if (I > 0 && chunk > INT_MAX / K / I) chunk = INT_MAX / K / I;
    return chunk;
}

int backend_cuda_op_moe_route(void *ctx, int *experts, float *weights, const float *router_logits,
                              int rows) {
    const struct cuda_context *c = ctx;
    const struct model_config *m = c->cfg;
    return cuda_moe_route_rows(experts, weights, router_logits, m->norm_topk_prob, m->num_experts,
                               m->num_experts_per_tok, rows, c->stream);
}

int backend_cuda_op_moe_group(void *ctx, int32_t *offsets, int32_t *grouped_rows, int32_t *slot_pos,
                              const int *experts, int rows) {
    const struct cuda_context *c = ctx;
    return cuda_moe_group(offsets, grouped_rows, slot_pos, experts, rows,
                          c->cfg->num_experts_per_tok, c->cfg->num_experts, c->experts_lo,
                          c->experts_hi, c->stream);
}

/* One grid row per gathered row: launches of at most MAX_GRID_ROWS. */
int backend_cuda_op_gather_rows(void *ctx, float *out, const float *x, const int32_t *rows, int n,
                                int dim) {
    const struct cuda_context *c = ctx;
    const struct ops_weight xs = {x, OPS_F32, INT32_MAX, dim};
    int rc = 0;
    for (int j0 = 0; j0 < n && !rc; j0 += MAX_GRID_ROWS) {
        const int k = n - j0 < MAX_GRID_ROWS ? n - j0 : MAX_GRID_ROWS;
        rc = cuda_ops_weight_rows(out + (size_t)j0 * (size_t)dim, &xs, rows + j0, k, c->stream);
    }
    return rc;
}

/* Whole experts on every rank (--moe split is refused at open), so the down projection
 * has the full tree's leaves. */
int backend_cuda_op_matmul_grouped(void *ctx, float *out, const float *x,
                                   const struct layer_weights *L, enum forward_expert_matrix which,
                                   const int32_t *offsets, int cap) {
    const struct cuda_context *c = ctx;
    const struct cuda_moe_layer *M = &c->moe[L->index - c->role.layer_start];
    const struct ops_weight *shape = which == FORWARD_EXPERT_GATE ? &M->gate
                                     : which == FORWARD_EXPERT_UP ? &M->up
                                                                  : &M->down;
    const void *const *ptrs = which == FORWARD_EXPERT_GATE ? M->gate_ptrs
                              : which == FORWARD_EXPERT_UP ? M->up_ptrs
                                                           : M->down_ptrs;
    return cuda_matmul_grouped(out, x, shape, ptrs, offsets, c->cfg->num_experts, cap,
                               which == FORWARD_EXPERT_DOWN ? OPS_SPLIT_LEAVES : 1, c->stream);
}

int backend_cuda_op_moe_expert_sum(void *ctx, float *out, float *y, const int32_t *slot_pos,
                                   const int *experts, const float *weights, int rows) {
    const struct cuda_context *c = ctx;
    return cuda_moe_expert_sum(out, y, slot_pos, experts, weights, rows,
                               c->cfg->num_experts_per_tok, c->experts_lo, c->experts_hi,
                               c->cfg->hidden_size, c->stream);
}
