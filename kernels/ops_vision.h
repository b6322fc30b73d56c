/* CUDA twins of reference/ops_vision.h (naming convention: kernels/README.md): the Qwen3-VL
 * vision encoder's own ops, for `--role vision` on a GPU. The encoder's matmuls (patch
 * embed, qkv, proj, MLP, mergers) and the RoPE rotation are cuda_matmul and
 * cuda_rope_apply_rows; its attention is cuda_vision_attention below. One header for
 * the reference header's ops. Plain C header: no CUDA types; all pointers are device
 * pointers, every call is asynchronous on `stream` and returns 0 or STRATA_EINVAL /
 * STRATA_EDEVICE. */
#ifndef STRATA_KERNELS_OPS_VISION_H
#define STRATA_KERNELS_OPS_VISION_H

/* out [n, dim] = LayerNorm(x [n, dim]) * weight [dim] + bias [dim], biased variance; out
 * may equal x. One block per row: mean and variance are double sums like the reference's,
 * but summed as a tree (the reference: ascending), so the double moments may differ in
 * their last bits and the float mean / rstd very rarely by one ulp; the rest is the
 * reference's fp32 sequence. NMSE-close (bound 1e-7), nearly always bitwise. */
int cuda_layernorm(float *out, const float *x, const float *weight, const float *bias, float eps,
                   int n, int dim, void *stream);

/* x [n, dim] += bias [dim] on every row: bitwise the reference (one launch, where the stage
 * backend used one vec_add per row). */
int cuda_add_bias(float *x, const float *bias, int n, int dim, void *stream);

/* out [n] = gelu_pytorch_tanh(x [n]); the reference's fp32 sequence with CUDA's tanhf
 * (ulps from glibc's): NMSE-close. out may equal x. */
int cuda_gelu_tanh(float *out, const float *x, int n, void *stream);

/* out [n] = 0.5 x (1 + erf(x / sqrt(2))); CUDA's erff: NMSE-close. out may equal x. */
int cuda_gelu_erf(float *out, const float *x, int n, void *stream);

/* out [steps] = torch.linspace(0, end, steps) as the reference computes it: bitwise. */
int cuda_linspace_f32(float *out, float end, int steps, void *stream);

/* out [t * h * w, dim] = the interpolated position table (reference vision_pos_embed): one
 * thread per element, the reference's fp32 weights, products and left-to-right sums:
 * bitwise. table [grid * grid, dim]; h and w multiples of merge. */
int cuda_vision_pos_embed(float *out, const float *table, int grid, int t, int h, int w, int merge,
                          int dim, void *stream);

/* cos_out/sin_out [2 * quarter] of one patch (reference vision_rope_cos_sin): the angles
 * are the reference's fp32 products, cosf/sinf are CUDA's: NMSE-close. inv_freq
 * [quarter]. */
int cuda_vision_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int row,
                             int col, int quarter, void *stream);

/* Scores scratch of cuda_vision_attention: one [nh][longest] row block per query row of a
 * launch, as many rows as fit CUDA_VISION_ATTN_SCRATCH floats (at least one row). */
#define CUDA_VISION_ATTN_SCRATCH ((size_t)1 << 26)
static inline size_t cuda_vision_attention_scratch(int longest, int nh) {
    size_t row = (size_t)nh * (size_t)(longest > 0 ? longest : 1);
    size_t all = row * (size_t)(longest > 0 ? longest : 1);
    if (all <= CUDA_VISION_ATTN_SCRATCH) return all;
    return row > CUDA_VISION_ATTN_SCRATCH ? row : CUDA_VISION_ATTN_SCRATCH;
}

/* Twin of reference/ops_vision.h vision_attention: non-causal attention within each segment
 * [cu_seqlens[s], cu_seqlens[s+1]). qkv [n, 3 * nh * head_dim] (q, k, v per row; q and k
 * rotated), out [n, nh * head_dim], device pointers. Differences from the reference's
 * argument list: cu_seqlens [n_segments + 1] is a HOST array (the launches are per segment
 * and per tile of query rows, sized on the host); scratch holds
 * cuda_vision_attention_scratch(longest segment, nh) device floats (scores, not the
 * reference's packed copies); the pool is replaced by `stream`.
 *
 * Numerics: one block per (query row, head); each score is the reference's matmul-ordered
 * dot (reference/ops.h) times (float)(1 / sqrt((double)D)), the softmax takes the exact max,
 * CUDA's expf, the sum sequential in ascending j and times 1 / sum (reference softmax), and
 * each output element is the matmul-ordered dot of the probabilities with v: the
 * reference's operation sequence but for expf (NMSE-close; bitwise when every exp is exact,
 * e.g. q = 0). head_dim at most 256. 0 or STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_vision_attention(float *out, const float *qkv, float *scratch, const int *cu_seqlens,
                          int n_segments, int n, int nh, int head_dim, void *stream);

#endif
