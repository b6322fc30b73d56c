/* The reference decoder's ops, one function per op (llm.c style): output first, sizes last,
 * a shape comment on every tensor. kernels/<op>.cu twins keep these names and are tested
 * against them.
 *
 * Determinism: every output element is computed entirely by one thread with a fixed
 * reduction order, independent of the thread count and of which other rows share the call.
 *
 * Dot-product order (matmul, and so every projection): for an input row x [K] and weight
 * row w [K], two 8-lane fp32 accumulators a0, a1 start at 0; for k0 = 0, 16, 32, ... while
 * k0 + 16 <= K: a0[l] = fma(w[k0+l], x[k0+l], a0[l]) and a1[l] = fma(w[k0+8+l], x[k0+8+l],
 * a1[l]) for l = 0..7. Then s = a0 + a1 (lane-wise), t[i] = s[i] + s[i+4] (i < 4),
 * r = (t[0] + t[2]) + (t[1] + t[3]), and the K % 16 tail is r = fma(w[k], x[k], r) in
 * ascending k. bf16 weights are widened exactly (bits << 16) before the fma. The AVX-512F
 * path (a0 = low, a1 = high half of one zmm), the AVX2+FMA path and the portable path (libm
 * fmaf) perform this same sequence of correctly rounded operations, so they agree bit for
 * bit: machines with different instruction sets give identical logits and may share a
 * pipeline (no instruction-set check is needed in the Hello). A faster path that changed the
 * bits (e.g. vdpbf16ps, which rounds activations to bf16) would need one.
 *
 * Split-invariant sums (tensor and KV parallelism): a sum that TP or KVP cuts into
 * per-rank parts is defined as a fixed tree whose subtrees are exactly the ranks' parts, so
 * computing it on one rank or on 2, 4, 8 gives the same bits:
 *   - matmul_split (the row-parallel o_proj / down / expert down): each dot product is
 *     OPS_SPLIT_LEAVES contiguous leaves, each leaf in the order above, combined by the
 *     balanced binary tree; a rank holding 1/T of K computes the subtree of its leaves and
 *     the ranks' partials are combined by the top of the same tree (ops_tree_sum).
 *   - attention: softmax with the max over every key seen (exact in any order), then the sum
 *     of exponentials and of weighted values per aligned block of OPS_ATTN_BLOCK positions
 *     (sequential in ascending position), the blocks combined by the aligned binary tree over
 *     block indices (empty blocks skipped). A KVP rank holding an aligned power-of-two
 *     number of blocks computes one subtree; attention_merge combines the subtrees.
 *
 * Other reductions (RMSNorm's sum of squares, softmax's sum, attention's q·k, exps' sum and
 * weighted values) run sequentially in ascending index order; attention's q·k and weighted
 * values accumulate by fused multiply-adds (fmaf: one rounding per term, as the vector FMA
 * instructions and CUDA's __fmaf_rn do), its exponentials are ops_expf. */
#ifndef STRATA_REFERENCE_OPS_H
#define STRATA_REFERENCE_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "reference/thread_pool.h"
#include "runtime/base/dtype.h"
#include "runtime/base/op_contract.h" /* struct ops_weight, the order constants */

struct forward_item; /* runtime/model/decoder_io.h */

/* out [n] = one row of w widened (or, for OPS_Q8, dequantised) to f32; row in [0, w->rows). */
void ops_weight_row(float *out, const struct ops_weight *w, int row);

/* out [n, H] = RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * weight [H].
 * The sum of squares is accumulated in double in ascending order. out may equal x. */
void rmsnorm(float *out, const float *x, const float *weight, float eps, int n, int dim);

/* Builds the RoPE table of one token: cos/sin [half] for angle f[j] = pos_j * inv_freq[j]
 * (fp32 product), where pos_j = pos_t, except with M-RoPE (mrope_section != NULL; spec §5.1
 * interleaved layout): j % 3 == 1 && j < 3*section[1] takes pos_h, j % 3 == 2 &&
 * j < 3*section[2] takes pos_w. inv_freq [half], half = head_dim / 2. */
void rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int pos_t, int pos_h,
                  int pos_w, const int *mrope_section, int half);

/* inv_freq [head_dim / 2] = 1 / theta ** (2j / head_dim), all in fp32 as HF computes it
 * (1 / base ** (arange(0, D, 2).float() / D)). */
void rope_inv_freq(float *inv_freq, float theta, int head_dim);

/* The RoPE tables of a whole microbatch: cos/sin [rows][half], one row per token in item
 * order, each by rope_cos_sin at the item's cache position (or its M-RoPE t/h/w ids). */
void rope_tables(float *cos_out, float *sin_out, const float *inv_freq,
                 const struct forward_item *items, int n_items, const int *mrope_section, int half);

/* x [n_heads, head_dim] rotated in place with rotate_half pairing (j with j + head_dim/2):
 * x'[j] = x[j] cos[j] - x[j+half] sin[j]; x'[j+half] = x[j+half] cos[j] + x[j] sin[j]. */
void rope_apply(float *x, const float *cos_t, const float *sin_t, int n_heads, int head_dim);

/* A layer's queries and keys made ready for attention, in place: every head of q [rows,
 * heads, head_dim] and of k [rows, kv_heads, head_dim] RMSNorm'd by q_norm / k_norm
 * [head_dim] (rmsnorm), then rotated by its row's cos / sin [rows][head_dim / 2]
 * (rope_apply). One op, so that a device runs the four steps as one launch. */
void qk_norm_rope(float *q, float *k, const float *q_norm, const float *k_norm, float eps,
                  const float *cos_t, const float *sin_t, int rows, int heads, int kv_heads,
                  int head_dim);

/* out [n, w->rows] = x [n, w->cols] @ w^T, rows split across the pool's threads.
 * out must not alias x. */
void matmul(float *out, const float *x, const struct ops_weight *w, int n,
            struct thread_pool *pool);

/* outs[i] [n, ws[i]->rows] = x [n, K] @ ws[i]^T for i < count (every ws[i]->cols == K), in
 * ONE pool dispatch (q/k/v, gate/up: one barrier instead of three or two). Each output
 * element is computed exactly as matmul computes it (same tiles, same order): the same
 * bits. No out may alias x or another out. */
void matmul_multi(float *const *outs, const struct ops_weight *const *ws, int count, const float *x,
                  int n, struct thread_pool *pool);

/* matmul with each dot product over K computed as `leaves` contiguous leaves (leaf j covers
 * columns [j·K/leaves, (j+1)·K/leaves), rounded down), each in the dot-product order above,
 * combined by the balanced binary tree. leaves is a power of two <= OPS_SPLIT_LEAVES. A TP
 * rank holding columns [t·K/T, (t+1)·K/T) passes OPS_SPLIT_LEAVES / T and gets exactly the
 * subtree of the whole product's tree (T | K and T | OPS_SPLIT_LEAVES). leaves == 1 is
 * matmul. OPS_Q8 weights ignore `leaves` (their dot products are q8 blocks: not split). */
void matmul_split(float *out, const float *x, const struct ops_weight *w, int n, int leaves,
                  struct thread_pool *pool);

/* out [n] = the balanced binary tree sum over parts [count][n] (count a power of two <=
 * OPS_SPLIT_LEAVES): the top of matmul_split's tree, combining TP ranks' partials in the
 * order one rank adds its leaves. out may equal parts. */
void ops_tree_sum(float *out, const float *parts, int count, size_t n);

/* matmul computed entirely on the calling thread, for ops that split work at a coarser grain
 * themselves (e.g. one task per attention head): the same bits as matmul. */
void matmul_serial(float *out, const float *x, const struct ops_weight *w, int n);

/* Attention's exponential: e^x within about half an ulp, the same bits on every machine and
 * path (reference/ops_exp.c says how; libm's expf differs between C libraries). */
float ops_expf(float x);

/* dst[i] = ops_expf(src[i]) for i < 16: in vector lanes on the AVX2 and AVX-512 paths, the
 * same bits. */
void ops_expf16(float *dst, const float *src);

/* attention()'s largest query heads per KV head run together (GQA groups beyond it run one
 * head per task: the same bits). */
#define OPS_ATTN_MAX_GROUP 16

/* Floats of attention()'s scratch per pool thread for a call over ctx = pos + n positions:
 * ctx scores when it runs one task per query head (groups above OPS_ATTN_MAX_GROUP); else a
 * task runs the nh / nkv query heads of a KV head for a tile of query tokens (16 query
 * vectors, or one token's group when that is more), with their scores [vectors][ctx] and
 * block trees' stacks [vectors][32][head_dim + 1] (on the AVX-512 path the same space holds
 * them with the queries as vector lanes). Never decreases as ctx grows, so a buffer
 * sized for the longest context serves every shorter call. */
size_t attention_scratch_floats(int ctx, int nh, int nkv, int head_dim);

/* Appends n rows of one request to its cache (struct ops_kv: where its positions live): for
 * i < n, g < nkv, d < head_dim, position pos + i of kv head g gets
 *   keys:   k [i * row_stride + g * head_dim + d]
 *   values: v [i * row_stride + g * head_dim + d]
 * (an exact copy). The blocks that positions pos .. pos + n - 1 fall in are the table's. */
void kv_store(const struct ops_kv *kv, const float *k, const float *v, int row_stride, int pos,
              int n, int nkv, int head_dim);

/* Causal GQA attention of one request over its cache.
 * out [n, nh*D]; q [n, nh*D] (post q-norm and RoPE); query i sits at cache position pos+i
 * and sees positions 0..pos+i of kv (struct ops_kv: its blocks, each one leaf of the tree
 * below). Query head h uses kv head h / (nh/nkv). Scores s_j = (q·k_j) * D^-0.5
 * (from 0, fmaf(q[d], k_j[d], s) in ascending d), M = max_j s_j, e_j = ops_expf(s_j - M);
 * per block b of OPS_ATTN_BLOCK positions l_b = Σ e_j (from 0, ascending j) and
 * o_b[d] = fmaf(e_j, v_j[d], o_b[d]) from 0 in ascending j; (l, o) = the aligned tree over
 * the blocks; out = o * (1/l). Where the blocks lie does not change the bits.
 * scratch [thread_pool_size(pool)][attention_scratch_floats(pos + n, nh, nkv, head_dim)]
 * floats, the caller's (attention allocates nothing: it runs per layer in decode); each pool
 * thread uses its own row. D <= OPS_ATTN_MAX_HEAD_DIM. */
void attention(float *out, const float *q, const struct ops_kv *kv, float *scratch, int pos, int n,
               int nh, int nkv, int head_dim, struct thread_pool *pool);

/* KV parallelism (Medha), in two steps around the group's all-gathers so the ranks give
 * attention()'s bits. A KVP rank holds global positions [lo, lo + held) at cache positions
 * 0 .. held-1 of kv (same layout and GQA mapping as attention()); lo is a multiple of
 * OPS_ATTN_BLOCK · 2^p and every rank holds the same power-of-two number of blocks (the last
 * may be cut short), so its keys are one subtree of attention()'s block tree. Query i sits
 * at global position pos+i and sees the held keys up to it.
 *
 * Step 1: scores [n*nh][held] = the query's scores over the keys (kv->k) it sees here (kept
 * for step 2), max [n*nh] = their max (-inf when it sees none). The group's max of max
 * (exact) is attention()'s M. */
void attention_partial_max(float *max, float *scores, const float *q, const struct ops_kv *kv,
                           int pos, int n, int lo, int held, int nh, int nkv, int head_dim,
                           struct thread_pool *pool);

/* Between the steps: max [n] <- the group's max of the ranks' maxima all [ranks][n]:
 * starting from max[t] (this rank's), every all[k][t] greater than it replaces it, in
 * ascending k (exact in any order). */
void attention_group_max(float *max, const float *all, int ranks, size_t n);

/* Step 2: part [n, nh, D+2] per (query, head): o [D] and l of this rank's subtree (values
 * kv->v) with exponentials e_j = exp(s_j - M[query, head]), then 1 if the query sees a key
 * here, else 0 (and o = l = 0). M [n*nh] is the group's max; scores from step 1. */
void attention_partial(float *part, const float *scores, const float *m, const struct ops_kv *kv,
                       int pos, int n, int lo, int held, int nh, int nkv, int head_dim,
                       struct thread_pool *pool);

/* Merges the partials of `ranks` KVP ranks, [ranks][n][nh][D+2], by the top of the aligned
 * tree (ranks that see no key skipped): out [n, nh*D] = o * (1/l), attention()'s bits. */
void attention_merge(float *out, const float *parts, int ranks, int n, int nh, int head_dim);

/* out [n] = silu(gate [n]) * up [n], silu(z) = z / (1 + exp(-z)). out may equal gate. */
void swiglu(float *out, const float *gate, const float *up, int n);

/* x [n] = softmax(x) in place (max-subtracted, fp32). */
void softmax(float *x, int n);

/* MoE routing of one token (spec §4): p = softmax(router_logits [E]); take the top_k largest
 * (descending; equal values keep the lower expert index first); if renormalize, divide them
 * by their sum. experts [top_k], weights [top_k]. */
void moe_route(int *experts, float *weights, const float *router_logits, int renormalize,
               int num_experts, int top_k);

/* moe_route of each of n rows: experts [n, top_k], weights [n, top_k], router_logits
 * [n, num_experts] (a row's result never depends on the others). */
void moe_route_rows(int *experts, float *weights, const float *router_logits, int renormalize,
                    int num_experts, int top_k, int n);

/* The routed slots of n rows grouped by expert, for the held experts [experts_lo,
 * experts_hi): expert after expert in ascending index, inside one expert the slots (i, t)
 * in ascending row i then choice t:
 *   offsets [num_experts + 1]: expert e's grouped rows are [offsets[e], offsets[e + 1])
 *     (none for an expert not held); offsets[num_experts] = the held slots' count, total;
 *   rows [n * top_k]: rows[j] = the token row of grouped position j for j < total, 0 past
 *     it (so a gather over all n * top_k positions reads valid rows);
 *   slot_pos [n * top_k]: slot i * top_k + t's grouped position, or -1 when not held.
 * experts [n, top_k]: moe_route_rows' ids. 0 <= experts_lo <= experts_hi <= num_experts. */
void moe_group(int32_t *offsets, int32_t *rows, int32_t *slot_pos, const int *experts, int n,
               int top_k, int num_experts, int experts_lo, int experts_hi);

/* out [n, cols] = rows [n] of w (ops_weight_row each): a gather, e.g. of the MoE block's
 * grouped token rows from an f32 view of the activations. */
void ops_weight_rows(float *out, const struct ops_weight *w, const int32_t *rows, int n);

/* Many matmuls over one activation matrix, row ranges given by offsets [n_groups + 1]
 * (ascending; rows at or past cap ignored): rows [offsets[g], offsets[g + 1]) of out
 * [cap, ws[g].rows] = those rows of x [cap, ws[g].cols] @ ws[g]^T, as matmul (leaves 1) or
 * matmul_split with `leaves` leaves computes them on exactly those rows. A group with no
 * rows may have no weight (data NULL); rows outside every group are not written. */
void matmul_grouped(float *out, const float *x, const struct ops_weight *ws, const int32_t *offsets,
                    int n_groups, int cap, int leaves, struct thread_pool *pool);

/* The MoE block's sum (moe_expert_sum's tree, on slots in slot order): out [n, dim] row i = the
 * held slots of row i added by the halving tree over expert indices [experts_lo, experts_hi): node
 * [a, b) = [a, mid) + [mid, b), mid = a + (b - a) / 2, empty nodes skipped, the row's slots in
 * ascending expert order; zeros for a row holding none. Slot i*top_k + t of slots
 * [n*top_k, dim] is choice t's weight × expert output; it is held when experts
 * [n*top_k]'s entry lies in [experts_lo, experts_hi) (all of them, or a TP rank's node of
 * the tree). `slots` is the tree's scratch (overwritten). top_k <= OPS_MOE_MAX_TOP_K. */
void moe_sum_rows(float *out, float *slots, const int *experts, int n, int top_k, int experts_lo,
                  int experts_hi, int dim);

/* The MoE block's weighting and sum from grouped expert outputs: out [n, dim] row i =
 * moe_sum_rows' tree over row i's held slots s = i*top_k + t, each slot's value being
 * y[slot_pos[s], :] * weights[s] (one rounded product). y [*, dim] holds the grouped
 * outputs (moe_group's positions) and is the tree's scratch (overwritten); slot_pos,
 * experts and weights are [n * top_k]. top_k <= OPS_MOE_MAX_TOP_K. */
void moe_expert_sum(float *out, float *y, const int32_t *slot_pos, const int *experts,
                    const float *weights, int n, int top_k, int experts_lo, int experts_hi,
                    int dim);

/* x [n] += y [n]. */
void vec_add(float *x, const float *y, int n);

/* A residual add and the RMSNorm after it as one op: h [n, dim] += y, then out [n, dim] =
 * RMSNorm(h) * weight (vec_add, then rmsnorm). out aliases neither h nor y. */
void add_rmsnorm(float *out, float *h, const float *y, const float *weight, float eps, int n,
                 int dim);

/* The row-wise and element-wise ops on the pool, as the CPU backend runs them (ops_pooled.c):
 * rmsnorm and RoPE sliced by rows (rope_rows_pooled: `rows` rows of row_floats floats whose
 * first heads x head_dim rotate, cos/sin [rows][head_dim / 2]; qk_norm_rope_pooled: those
 * two on q and on k; add_rmsnorm_pooled: vec_add then rmsnorm), swiglu and vec_add by
 * OPS_ELEMENTWISE_SLICE floats (enough to pay a task's dispatch). Each output element is
 * computed whole by one call of the op above, so the bits are its bits for any thread
 * count; one row or slice runs on the caller. (A 128-token prefill of an H 1024 x 8 layer
 * model at 2 threads: 126 -> 120 ms against these ops on one thread.) */
#define OPS_ELEMENTWISE_SLICE 4096
void rmsnorm_pooled(float *out, const float *x, const float *weight, float eps, int n, int dim,
                    struct thread_pool *pool);
void rope_rows_pooled(float *x, const float *cos_t, const float *sin_t, int rows, int row_floats,
                      int heads, int head_dim, struct thread_pool *pool);
void qk_norm_rope_pooled(float *q, float *k, const float *q_norm, const float *k_norm, float eps,
                         const float *cos_t, const float *sin_t, int rows, int heads, int kv_heads,
                         int head_dim, struct thread_pool *pool);
void swiglu_pooled(float *out, const float *gate, const float *up, int n, struct thread_pool *pool);
void vec_add_pooled(float *x, const float *y, int n, struct thread_pool *pool);
void add_rmsnorm_pooled(float *out, float *h, const float *y, const float *weight, float eps, int n,
                        int dim, struct thread_pool *pool);

/* matmul implementations; all give identical bits (see the top of this file). */
enum ops_path { OPS_PATH_AUTO = 0, OPS_PATH_PORTABLE, OPS_PATH_AVX2, OPS_PATH_AVX512 };

/* 1 if this CPU can run `path` (OPS_PATH_AUTO and OPS_PATH_PORTABLE always can). */
int ops_path_available(enum ops_path path);

/* 1 if this CPU also has AVX-512BW, VL and VNNI: the avx512 path then runs q8 matmuls with
 * 512-bit integer dot products (ops_q8.h; the same bits as AVX2). */
int ops_avx512_vnni_available(void);

/* For tests and benchmarks: makes matmul use `path` (OPS_PATH_AUTO restores the CPU-detected
 * choice, the fastest available). Returns 1 if set, 0 if this CPU lacks the path (the
 * choice is left unchanged). Process-wide; not to be called while a matmul runs. */
int ops_force_path(enum ops_path path);

/* The path matmul uses now, and a short name ("portable", "avx2", "avx512", "auto"). */
enum ops_path ops_matmul_path(void);
const char *ops_path_name(enum ops_path path);

/* Older spelling: 1 forces the portable path, 0 restores the CPU-detected choice.
 * Returns whether the AVX2+FMA path is available on this CPU. */
int ops_force_portable(int force);

#endif
