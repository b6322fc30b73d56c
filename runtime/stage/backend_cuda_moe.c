/* The CUDA backend's MoE block (reference/model.c moe_block; see backend_cuda.c), all of it
 * on the device with no host round trip, so a decode step holding MoE layers is still one
 * CUDA graph (issue 17). Per layer, on the backend stream, launch shapes depending only on
 * the row count N:
 *   1. router logits (cuda_matmul) and routing, one thread per row (cuda_moe_route_rows:
 *      the reference's moe_route with CUDA's expf);
 *   2. grouping by expert (cuda_moe_group): the held experts [experts_lo, experts_hi) in
 *      ascending index, inside one the slots (row, choice) in ascending order, as the
 *      reference gathers them; per expert its rows' offsets, per slot its grouped position;
 *   3. the N·K grouped rows gathered (cuda_ops_weight_rows; positions past the held count
 *      gather row 0, never read back) and every expert's SwiGLU MLP as three grouped
 *      matmuls (cuda_matmul_grouped: the experts' row counts are device data, each tile of
 *      rows runs matmul.cu's half-warp dot on its expert's weight, so every element is
 *      cuda_matmul's / cuda_matmul_split's, bitwise and batch-invariant);
 *   4. the reference's sum (cuda_moe_expert_sum): each (row, choice) slot = weight × expert
 *      output, the row's held slots added by the halving tree over expert indices
 *      [experts_lo, experts_hi) (reference/ops.h moe_sum_rows), zeros for a row holding none;
 *      under TP --moe expert a rank's rows are one node of that tree, which the layer's TP
 *      reduce completes by its top.
 * The same path runs eagerly and inside a graph. What it gives up against the former host
 * routing: the routing's expf is CUDA's (within 2 ulp of glibc's), like the experts' SwiGLU
 * already was; the summation order is the reference's. Never run on a GPU: the emulation
 * (tests/backend_ops/cuda_emulated.c) and tests/kernels:moe_group_test (skipped here) are
 * all that checked it. */
#include <limits.h>
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

/* out [N, H] for one chunk of rows: the four steps of the header. */
static int moe_rows(struct cuda_context *c, const struct layer_weights *L, float *out,
                    const float *x, int N) {
    const struct model_config *m = c->cfg;
    const struct cuda_moe_layer *M = &c->moe[L->index - c->role.layer_start];
    const int H = m->hidden_size, E = m->num_experts, K = m->num_experts_per_tok;
    const int I = M->gate.rows, cap = N * K;
    const struct ops_weight xs = {x, OPS_F32, N, H};
    void *s = c->stream;
    int rc;
    if ((rc = cuda_matmul(c->router, x, &L->router, N, s)) ||
        (rc = cuda_moe_route_rows(c->moe_expert, c->moe_w, c->router, m->norm_topk_prob, E, K, N,
                                  s)) ||
        (rc = cuda_moe_group(c->moe_offsets, c->moe_row, c->moe_slot, c->moe_expert, N, K, E,
                             c->experts_lo, c->experts_hi, s)))
        return rc;
    for (int j0 = 0; j0 < cap && !rc; j0 += MAX_GRID_ROWS) {
        const int k = cap - j0 < MAX_GRID_ROWS ? cap - j0 : MAX_GRID_ROWS;
        rc = cuda_ops_weight_rows(c->moe_x + (size_t)j0 * H, &xs, c->moe_row + j0, k, s);
    }
    if (rc ||
        (rc = cuda_matmul_grouped(c->ffn_gate, c->moe_x, &M->gate, M->gate_ptrs, c->moe_offsets, E,
                                  cap, 1, s)) ||
        (rc = cuda_matmul_grouped(c->ffn_up, c->moe_x, &M->up, M->up_ptrs, c->moe_offsets, E, cap,
                                  1, s)) ||
        (rc = cuda_swiglu(c->ffn_gate, c->ffn_gate, c->ffn_up, cap * I, s)) ||
        (rc = cuda_matmul_grouped(c->moe_y, c->ffn_gate, &M->down, M->down_ptrs, c->moe_offsets, E,
                                  cap, OPS_SPLIT_LEAVES, s)))
        return rc;
    return cuda_moe_expert_sum(out, c->moe_y, c->moe_slot, c->moe_expert, c->moe_w, N, K,
                               c->experts_lo, c->experts_hi, H, s);
}

int backend_cuda_moe_block(struct cuda_context *c, const struct layer_weights *L, float *out,
                           const float *x, int N) {
    const int H = c->cfg->hidden_size, K = c->cfg->num_experts_per_tok;
    const int I = c->moe[L->index - c->role.layer_start].gate.rows;
    /* Chunks of rows (a row's result never depends on its call): a grouped launch covers at
     * most 65535 tiles of 4 rows, cap + 3·E rows' worth (kernels/matmul.h), and the
     * SwiGLU's cap·I elements are an int. At least 2 rows (E <= MOE_MAX_EXPERTS). */
    int chunk = (4 * 65535 - 3 * c->cfg->num_experts) / K;
    if (I > 0 && chunk > INT_MAX / K / I) chunk = INT_MAX / K / I;
    int rc = 0;
    for (int i0 = 0; i0 < N && !rc; i0 += chunk) {
        const int n = N - i0 < chunk ? N - i0 : chunk;
        rc = moe_rows(c, L, out + (size_t)i0 * H, x + (size_t)i0 * H, n);
    }
    return rc;
}
