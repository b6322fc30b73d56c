/* The CUDA backend's MoE block (reference/model.c moe_block; see backend_cuda.c): routing on
 * the host with the reference's moe_route, each held expert's tokens gathered into one
 * matrix and its SwiGLU MLP run as one matmul per weight (experts side by side on the MoE
 * streams), then the reference's sum: every (row, choice) slot = weight × expert output, the
 * row's held slots added by the halving tree over expert indices [experts_lo, experts_hi)
 * (expert_tree: node [a, b) = [a, mid) + [mid, b), empty nodes skipped).
 *
 * The tree on the device: the host walks each row's tree once and lists its additions
 * (dst slot += src slot) with their height (1 + the higher child's); additions of one height
 * touch disjoint slots, so each height is one gather of the src slots and one scatter-add
 * into the dst slots (cuda_ops_weight_rows, cuda_moe_combine with weight 1: x + y·1 = x + y),
 * lowest height first. Every slot sum is then the reference's, whatever the launch order, so
 * the block is the CPU's order (bitwise but for CUDA's expf in the experts' SwiGLU), and
 * under TP --moe expert a rank's rows are one node of the tree whose nodes the TP reduce adds
 * by its top: the ranks give one rank's bits. (Only a slot that is exactly -0 becomes +0
 * here: 0 + (-0).) */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/matmul.h"
#include "kernels/moe_combine.h"
#include "kernels/ops_weight_row.h"
#include "kernels/swiglu.h"
#include "reference/ops.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend_cuda_internal.h"

/* A row's additions: appends (dst, src, height) for the tree over slots ids[0..n) whose
 * experts ex[0..n) ascend inside [a, b); returns the root's height (0: a leaf). */
static int plan_tree(struct cuda_context *c, int *n_pairs, const int *ids, const int *ex, int n,
                     int a, int b) {
    while (n > 1) {
        const int mid = a + (b - a) / 2;
        int s = 0;
        while (s < n && ex[s] < mid)
            ++s;
        if (s == 0 || s == n) { /* one half is empty: descend into the other */
            if (s == 0)
                a = mid;
            else
                b = mid;
            continue;
        }
        const int hl = plan_tree(c, n_pairs, ids, ex, s, a, mid);
        const int hr = plan_tree(c, n_pairs, ids + s, ex + s, n - s, mid, b);
        const int h = 1 + (hl > hr ? hl : hr), k = (*n_pairs)++;
        c->h_pair_level[k] = h;
        c->h_pair_tmp[2 * k] = ids[0];
        c->h_pair_tmp[2 * k + 1] = ids[s];
        return h;
    }
    return 0;
}

/* The sum's plan for N rows (routing in h_route_e), in h_moe_plan [4][N*K]: the additions'
 * src and dst slots sorted by height (h_level_first[h] = the first of height h), then the
 * root slot and the row of every row holding a slot; *n_pairs, *n_roots, *top = the highest
 * height. */
static void plan_sum(struct cuda_context *c, int N, int *n_pairs, int *n_roots, int *top) {
    const int K = c->cfg->num_experts_per_tok, cap = N * K;
    int ids[MOE_MAX_TOP_K], ex[MOE_MAX_TOP_K];
    *n_pairs = *n_roots = *top = 0;
    int32_t *roots = c->h_moe_plan + 2 * (size_t)cap;
    for (int i = 0; i < N; ++i) {
        int n = 0;
        for (int t = 0; t < K; ++t) { /* held slots, ascending expert (insertion) */
            const int e = c->h_route_e[(size_t)i * K + t];
            if (e < c->experts_lo || e >= c->experts_hi) continue;
            int at = n++;
            for (; at > 0 && ex[at - 1] > e; --at) {
                ex[at] = ex[at - 1];
                ids[at] = ids[at - 1];
            }
            ex[at] = e;
            ids[at] = i * K + t;
        }
        if (!n) continue;
        const int h = plan_tree(c, n_pairs, ids, ex, n, c->experts_lo, c->experts_hi);
        if (h > *top) *top = h;
        roots[*n_roots] = ids[0];
        roots[cap + *n_roots] = i;
        (*n_roots)++;
    }
    /* Counting sort by height into [src][dst]. */
    for (int h = 0; h <= *top + 1; ++h)
        c->h_level_first[h] = 0;
    for (int k = 0; k < *n_pairs; ++k)
        c->h_level_first[c->h_pair_level[k] + 1]++;
    for (int h = 1; h <= *top + 1; ++h)
        c->h_level_first[h] += c->h_level_first[h - 1];
    int fill[MOE_MAX_TOP_K + 2];
    memcpy(fill, c->h_level_first, (size_t)(*top + 2) * sizeof(int));
    for (int k = 0; k < *n_pairs; ++k) {
        const int at = fill[c->h_pair_level[k]]++;
        c->h_moe_plan[at] = c->h_pair_tmp[2 * k + 1];   /* src */
        c->h_moe_plan[cap + at] = c->h_pair_tmp[2 * k]; /* dst */
    }
}

/* Routes N tokens on the host with the reference's moe_route (the router logits come back
 * once: the one synchronisation of a MoE layer), groups the held experts' tokens in expert
 * order (rows, weights, slot ids), plans the sum, and sends all of it. *total = rows. */
static int moe_route_on_host(struct cuda_context *c, const struct layer_weights *L, int N,
                             int *total, int *n_pairs, int *n_roots, int *top) {
    const struct model_config *m = c->cfg;
    int E = m->num_experts, K = m->num_experts_per_tok, rc;
    void *s = c->stream;
    if ((rc = cuda_memcpy_async(c->h_router, c->router, (size_t)N * E * sizeof(float),
                                CUDA_COPY_TO_HOST, s)) ||
        (rc = backend_cuda_sync(c)))
        return rc;
    for (int i = 0; i < N; ++i)
        moe_route(c->h_route_e + (size_t)i * K, c->h_route_w + (size_t)i * K,
                  c->h_router + (size_t)i * E, m->norm_topk_prob, E, K);
    /* The stream is idle here, so the previous layer's copies from the pinned buffers are
     * done and they may be refilled. */
    int n = 0;
    for (int e = 0; e < E; ++e) {
        c->h_expert_count[e] = 0;
        if (!L->expert_gate[e].data) continue; /* another TP rank's expert */
        for (int i = 0; i < N; ++i)
            for (int t = 0; t < K; ++t)
                if (c->h_route_e[(size_t)i * K + t] == e) {
                    c->h_moe_row[n] = i;
                    c->h_moe_w[n] = c->h_route_w[(size_t)i * K + t];
                    c->h_moe_slot[n] = i * K + t;
                    n++;
                    c->h_expert_count[e]++;
                }
    }
    *total = n;
    plan_sum(c, N, n_pairs, n_roots, top);
    const size_t ids = (size_t)n * sizeof(int32_t), cap = (size_t)N * (size_t)K;
    if ((rc = cuda_memcpy_async(c->moe_row, c->h_moe_row, ids, CUDA_COPY_TO_DEVICE, s)) ||
        (rc = cuda_memcpy_async(c->moe_slot, c->h_moe_slot, ids, CUDA_COPY_TO_DEVICE, s)) ||
        (rc = cuda_memcpy_async(c->moe_plan, c->h_moe_plan, 4 * cap * sizeof(int32_t),
                                CUDA_COPY_TO_DEVICE, s)) ||
        (rc = cuda_memcpy_async(c->moe_one, c->h_moe_one, cap * sizeof(float), CUDA_COPY_TO_DEVICE,
                                s)))
        return rc;
    return cuda_memcpy_async(c->moe_w, c->h_moe_w, (size_t)n * sizeof(float), CUDA_COPY_TO_DEVICE,
                             s);
}

/* Runs every active expert's SwiGLU MLP on its own rows: expert e's tokens [first, first +
 * count) of the concatenated lists are gathered into moe_x rows [first, ...), and its
 * outputs land in moe_y rows [first, ...), so no two experts share a buffer row. The experts
 * are spread over the MoE streams, forked from the backend stream after the routing and
 * joined back into it before returning. */
static int run_experts(struct cuda_context *c, const struct layer_weights *L, const float *x,
                       int N) {
    const struct model_config *m = c->cfg;
    int H = m->hidden_size, E = m->num_experts, I = m->moe_intermediate_size, active = 0, rc;
    const struct ops_weight xs = {x, OPS_F32, N, H};
    if ((rc = cuda_event_record(c->moe_fork, c->stream))) return rc;
    for (int k = 0; k < MOE_STREAMS && !rc; ++k)
        rc = cuda_stream_wait_event(c->moe_stream[k], c->moe_fork);
    for (int e = 0, first = 0; e < E && !rc; first += c->h_expert_count[e], ++e) {
        int count = c->h_expert_count[e];
        if (!count) continue;
        if (count > MAX_GRID_ROWS)
            return strata_set_error(STRATA_EINVAL, "cuda backend: %d tokens for one expert", count);
        void *es = c->moe_stream[active++ % MOE_STREAMS];
        float *ex = c->moe_x + (size_t)first * H, *ey = c->moe_y + (size_t)first * H;
        float *eg = c->ffn_gate + (size_t)first * I, *eu = c->ffn_up + (size_t)first * I;
        if ((rc = cuda_ops_weight_rows(ex, &xs, c->moe_row + first, count, es)) ||
            (rc = cuda_matmul(eg, ex, &L->expert_gate[e], count, es)) ||
            (rc = cuda_matmul(eu, ex, &L->expert_up[e], count, es)) ||
            (rc = cuda_swiglu(eg, eg, eu, count * I, es)))
            break;
        rc = cuda_matmul_split(ey, eg, &L->expert_down[e], count, OPS_SPLIT_LEAVES, es);
    }
    for (int k = 0; k < MOE_STREAMS && k < active && !rc; ++k)
        if (!(rc = cuda_event_record(c->moe_join[k], c->moe_stream[k])))
            rc = cuda_stream_wait_event(c->stream, c->moe_join[k]);
    return rc;
}

/* dst rows dst_ids[j] += rows src_ids[j] of `from` [rows, H], j < n (n at most one launch's
 * rows at a time): a gather into tmp, then a scatter-add with weight 1. */
static int gather_add(struct cuda_context *c, float *dst, const int32_t *dst_ids,
                      const struct ops_weight *from, const int32_t *src_ids, float *tmp, int n) {
    const int H = c->cfg->hidden_size;
    int rc = 0;
    for (int j0 = 0; j0 < n && !rc; j0 += MAX_GRID_ROWS) {
        const int k = n - j0 < MAX_GRID_ROWS ? n - j0 : MAX_GRID_ROWS;
        if (!(rc = cuda_ops_weight_rows(tmp, from, src_ids + j0, k, c->stream)))
            rc = cuda_moe_combine(dst, tmp, dst_ids + j0, c->moe_one, k, H, c->stream);
    }
    return rc;
}

int backend_cuda_moe_block(struct cuda_context *c, const struct layer_weights *L, float *out,
                           const float *x, int N) {
    const struct model_config *m = c->cfg;
    const int H = m->hidden_size, K = m->num_experts_per_tok, cap = N * K;
    int total = 0, n_pairs = 0, n_roots = 0, top = 0, rc;
    void *s = c->stream;
    float *slots = c->moe_x; /* [N*K][H]: free once the experts have joined */
    const struct ops_weight slot_rows = {slots, OPS_F32, cap, H};
    if ((rc = cuda_matmul(c->router, x, &L->router, N, s)) ||
        (rc = moe_route_on_host(c, L, N, &total, &n_pairs, &n_roots, &top)) ||
        (rc = cuda_memset_async(out, 0, (size_t)N * H * sizeof(float), s)) ||
        (rc = run_experts(c, L, x, N)) ||
        (rc = cuda_memset_async(slots, 0, (size_t)cap * H * sizeof(float), s)))
        return rc;
    /* slot (i, t) = 0 + y · w: the reference's weighted slot (y *= w). */
    for (int j0 = 0; j0 < total && !rc; j0 += MAX_GRID_ROWS) {
        const int k = total - j0 < MAX_GRID_ROWS ? total - j0 : MAX_GRID_ROWS;
        rc = cuda_moe_combine(slots, c->moe_y + (size_t)j0 * H, c->moe_slot + j0, c->moe_w + j0, k,
                              H, s);
    }
    for (int h = 1; h <= top && !rc; ++h) { /* the tree, lowest additions first */
        const int first = c->h_level_first[h], n = c->h_level_first[h + 1] - first;
        rc = gather_add(c, slots, c->moe_plan + cap + first, &slot_rows, c->moe_plan + first,
                        c->moe_y, n);
    }
    if (!rc) /* out row = its root slot (zeros without one) */
        rc = gather_add(c, out, c->moe_plan + 3 * (size_t)cap, &slot_rows,
                        c->moe_plan + 2 * (size_t)cap, c->moe_y, n_roots);
    return rc;
}
