/* The Qwen3-VL vision encoder's ops (shared spec qwen3-architecture.md §6), one function per
 * op in the style of ops.h: output first, sizes last, a shape comment on every tensor. The
 * matmuls and the RoPE rotation themselves are ops.h's (matmul, rope_apply).
 *
 * Determinism: as in ops.h, every output element is computed by one thread with a fixed
 * reduction order (LayerNorm moments in double, ascending; attention's dots in matmul's fixed
 * order), so results do not depend on the thread count, and a row's result does not depend on
 * which other images share the call. */
#ifndef STRATA_REFERENCE_OPS_VISION_H
#define STRATA_REFERENCE_OPS_VISION_H

#include <stddef.h>
#include <stdint.h>

#include "reference/thread_pool.h"

/* out [n, dim] = LayerNorm(x [n, dim]) * weight [dim] + bias [dim] with the biased variance
 * (torch.nn.LayerNorm, spec §6.4): mean and variance accumulated in double, ascending index.
 * out may equal x. */
void layernorm(float *out, const float *x, const float *weight, const float *bias, float eps, int n,
               int dim);

/* x [n, dim] += bias [dim] on every row. */
void add_bias(float *x, const float *bias, int n, int dim);

/* out [n] = gelu_pytorch_tanh(x [n]) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), fp32.
 * out may equal x. */
void gelu_tanh(float *out, const float *x, int n);

/* out [n] = exact GELU 0.5 x (1 + erf(x / sqrt(2))) (nn.GELU(), the mergers' activation),
 * fp32. out may equal x. */
void gelu_erf(float *out, const float *x, int n);

/* torch.linspace(0, end, steps) in fp32, the scalar form of ATen's CPU kernel: step =
 * end / (steps - 1); value i = step * i for i < steps / 2, else end - step * (steps - 1 - i),
 * so both ends are exact. (ATen's vectorised loop may round an interior value differently in
 * the last bit; that moves an interpolation weight by ~1e-7 relative.) steps == 1 gives [0].
 * out [steps]. */
void linspace_f32(float *out, float end, int steps);

/* fast_pos_embed_interpolate for one image or video (spec §6.2): bilinear interpolation of the
 * learned grid table [grid * grid, dim] at an h x w raster (fp32 weights, the four products
 * summed in the order (h0,w0), (h0,w1), (h1,w0), (h1,w1)), repeated over t frames and written
 * in the patch row order (t, bh, bw, ih, iw) with merge windows of merge x merge.
 * out [t * h * w, dim]; h and w multiples of merge. */
void vision_pos_embed(float *out, const float *table, int grid, int t, int h, int w, int merge,
                      int dim);

/* The 2-D rotary table of one patch at full-resolution (row, col) (spec §6.3): with
 * f = concat(row * inv_freq, col * inv_freq) (fp32 products), cos_out/sin_out [2 * quarter] =
 * cos/sin(f). Since emb = concat(f, f), this is the half-table rope_apply pairs j with
 * j + head_dim/2 on. inv_freq [quarter], quarter = head_dim / 4. */
void vision_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int row, int col,
                         int quarter);

/* Non-causal multi-head attention, full within each segment [cu_seqlens[s], cu_seqlens[s+1])
 * (one image frame each, spec §6.4). qkv [n, 3 * nh * head_dim] holds per row q, then k, then
 * v, each [nh, head_dim] (q and k already rotated); out [n, nh * head_dim]. Scores are
 * (q·k) * head_dim^-0.5 (the dot in matmul's fixed order, ops.h), softmax in fp32, and each
 * output element is the matmul-ordered dot of the probabilities with v over the segment.
 * cu_seqlens [n_segments + 1] ascending from 0 to n. scratch: vision_attention_scratch(n,
 * longest segment, nh, head_dim, pool size) floats (q, k and v packed per head, and per-worker
 * score blocks). Tasks are (head, block of 16 query rows). */
void vision_attention(float *out, const float *qkv, float *scratch, const int *cu_seqlens,
                      int n_segments, int n, int nh, int head_dim, struct thread_pool *pool);

/* Floats of scratch vision_attention needs. */
size_t vision_attention_scratch(int n, int longest, int nh, int head_dim, int threads);

#endif
