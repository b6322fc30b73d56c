/* 8-bit weights (OPS_Q8, `--weights-dtype q8`): llama.cpp's Q8_0 idea, quantised at load
 * from bf16 / f32.
 *
 * Format. Each weight row [cols] is cut into blocks of OPS_Q8_BLOCK = 32 consecutive values;
 * a block keeps one f32 scale d = max|x| / 127 and 32 int8 values q = round(x / d)
 * (f32 division; round to nearest, ties to even; q in [-127, 127]; an all-zero block has
 * d = 0, q = 0), so x ~ q * d with |x - q d| <= d / 2 up to f32 rounding. A row whose length is not
 * a multiple of 32 ends with a partial block, padded with q = 0 (which adds exactly 0 to every sum
 * below; the goldens' MoE experts have 48 columns). An ops_weight of dtype OPS_Q8 has data = int8
 * [rows][ld] (ld = cols rounded up to 32) immediately followed by the f32 scales [rows][ld / 32]
 * (one buffer, so struct ops_weight needs no new field): 1.125 bytes per weight (bf16: 2).
 *
 * Why an f32 scale and not llama.cpp's f16: the bound |x - q d| <= d / 2 then holds for every
 * block (an f16 scale is rounded after q is chosen, adds up to 127 * 2^-11 d, and loses
 * precision in f16's subnormal range below 6e-5, i.e. rows with max|x| < 7.8e-3), and no path
 * needs F16C. It costs 1/16 byte per weight (1.125 vs 1.0625 bytes, +6% of the bytes a decode
 * reads).
 *
 * Arithmetic (the same on every path, so every path gives identical bits). Activations are
 * quantised the same way, per token and block (llama.cpp's vec_dot_q8_0_q8_0): x ~ qx * dx.
 * For one weight row and one token, sixteen f32 lanes acc[0..15] start at 0; for each block b
 * in ascending order, with d = dw[b] * dx[b] (one f32 product), p_l the exact int32 sum of
 * q[32b + 4l + j] * qx[32b + 4l + j] over j = 0..3, and g = 8 (b mod 2) (even blocks in the low
 * eight lanes, odd ones in the high eight):
 *     acc[g + l] = fma(d, (float)p_l, acc[g + l])        for l = 0..7
 * then s_l = acc[l] + acc[8 + l] and the result is ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 +
 * s7)), the lane tree of ops.h (as bf16's two 8-lane accumulators). |p_l| <= 4 * 127^2 is exact
 * in f32. Why 16 lanes (session 24; the first version had 8): a pair of blocks is then one
 * 512-bit conversion and one FMA, where 8 lanes needed two dependent 256-bit FMAs and an
 * extract per pair; the AVX-512 prefill ran 107 GMAC/s instead of 59 (3072 x 1024, 64 tokens,
 * one Zen 5 core). AVX2 keeps two 8-lane accumulators, so its cost is unchanged. The AVX2 kernel
 * computes p_l with vpmaddubsw (|q| times sign-moved qx: at most 2 * 127^2, no int16 saturation)
 * and vpmaddwd, whose lane l is exactly bytes 4l..4l+3 of the block. The activation quantiser is
 * one C function shared by all paths. Each output element is one row x one token computed whole:
 * results do not depend on the thread count, on batching, or on how tokens are chunked.
 *
 * Why quantised activations rather than f32 activations times widened weights: on AVX2 the
 * integer path multiplies 32 weights in 3 instructions (vpsignb, vpmaddubsw, vpmaddwd) plus
 * one f32 fma per block, where widening needs 4 x (vpmovsxbd, vcvtdq2ps, vfmadd) per block;
 * measured numbers are in reference/README.md. The cost is a second rounding (of the
 * activations), included in the measured error on the goldens (tests/reference/q8_golden_test).
 *
 * AVX-512: where the CPU has AVX-512BW, VL and VNNI (ops_avx512_vnni_available), the avx512 path
 * forms a block pair's p_l with one vpdpbusd (its int32 lane l of each 256-bit half sums bytes
 * 4l..4l+3 of its block: the same exact integers) and applies both blocks' scales in one FMA
 * over the 16 lanes; otherwise it runs the AVX2 kernels. */
#ifndef STRATA_REFERENCE_OPS_Q8_H
#define STRATA_REFERENCE_OPS_Q8_H

#include <stddef.h>
#include <stdint.h>

#include "reference/ops.h"
#include "reference/thread_pool.h"

#define OPS_Q8_BLOCK 32
/* Widest row accepted: one quantised activation row (cols + cols / 8 bytes) must fit the
 * kernel's 64 KiB stack buffer. Every Qwen3 / Qwen3-VL dimension is far below. */
#define OPS_Q8_MAX_COLS 32768

/* 1 if a matrix with `cols` columns can be stored as q8 (1 .. OPS_Q8_MAX_COLS). */
int ops_q8_supported(int cols);

/* Bytes of a q8 matrix [rows, cols]: rows * ld int8 + rows * ld / 32 f32 scales. */
size_t ops_q8_bytes(int rows, int cols);

/* The row stride of q8 values: cols rounded up to a whole block. */
static inline size_t ops_q8_ld(int cols) {
    return ((size_t)cols + OPS_Q8_BLOCK - 1) / OPS_Q8_BLOCK * OPS_Q8_BLOCK;
}

/* The scales [rows][ld / 32] of an OPS_Q8 matrix (they follow the int8 values). */
static inline const float *ops_q8_scales(const struct ops_weight *w) {
    return (const float *)((const int8_t *)w->data + (size_t)w->rows * ops_q8_ld(w->cols));
}

/* Quantises x [k] to q [ops_q8_ld(k)] and scale [ops_q8_ld(k) / 32] (format above; the
 * padding of a last partial block is 0). */
void ops_q8_quantize_row(int8_t *q, float *scale, const float *x, int k);

/* out = src (bf16 or f32, ops_q8_supported(cols)) quantised into `buf` (ops_q8_bytes
 * bytes, 4-byte aligned, owned by the caller), rows split over the pool. out may equal src. */
void ops_q8_quantize_weight(struct ops_weight *out, void *buf, const struct ops_weight *src,
                            struct thread_pool *pool);

/* out [cols] = row `row` of a q8 matrix dequantised (q * d). */
void ops_q8_dequantize_row(float *out, const struct ops_weight *w, int row);

/* matmul (ops.h) for an OPS_Q8 weight: out [n, rows] = x [n, cols] @ w^T with the arithmetic
 * above; pool NULL runs on the calling thread. Called by matmul / matmul_serial. */
void ops_q8_matmul(float *out, const float *x, const struct ops_weight *w, int n,
                   struct thread_pool *pool);

/* matmul_multi for q8 matrices of one column count (ops.h): outs[i] [n, ws[i]->rows], each
 * element ops_q8_matmul's bits; the tokens are quantised once and the matrices' rows shared
 * out in one pool run (pool NULL: the calling thread). Other column counts run one
 * ops_q8_matmul each. */
void ops_q8_matmul_multi(float *const *outs, const struct ops_weight *const *ws, int count,
                         const float *x, int n, struct thread_pool *pool);

#endif
