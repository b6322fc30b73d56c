/* Tensor value codecs for the wire: fp32 <-> bf16 / fp16 with round to nearest even, and
 * int8 with one symmetric f32 scale per row.
 *
 * The default on the wire is lossless for the stage's compute dtype (fp32 activations
 * travel as F32/NONE), so pipeline splits stay bit-identical; the lossy codecs exist to
 * cut bandwidth where a deployment accepts the error (tests/wire/codec_*_test report it).
 * The 2-byte conversions are integer bit manipulation, so they are bit-exact and independent
 * of compiler flags and the FPU rounding mode; NaN stays NaN (quiet), infinities stay
 * infinities, fp16 overflow becomes infinity. int8 rounds value/scale to nearest (even on
 * ties, the default FPU mode) and clamps to [-127, 127]. */
#ifndef STRATA_WIRE_CODEC_H
#define STRATA_WIRE_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/base/dtype.h"
#include "wire/message.h"

/* Bytes of one value of `dtype` (0 for an unknown dtype). */
size_t wire_dtype_size(enum wire_dtype dtype);

/* Bytes per value on the wire for `dtype` encoded with `codec`; 0 if the pair is invalid
 * (lossy codecs apply to F32 only). */
size_t wire_codec_value_bytes(enum wire_dtype dtype, enum wire_codec codec);

/* Element conversions (bf16/f16 <-> f32, round to nearest even) are runtime/base/dtype.h's. */

/* Encodes src [rows, cols] f32 into dst with `codec`: dst holds rows*cols values of
 * wire_codec_value_bytes(F32, codec) bytes (little-endian), and for INT8_ROW `scales`
 * [rows] receives max|row| / 127 (0 for an all-zero row). `scales` may be NULL otherwise.
 * Non-finite values are an error for INT8_ROW. */
int wire_encode_f32(void *dst, float *scales, const float *src, size_t rows, size_t cols,
                    enum wire_codec codec);

/* Decodes any read tensor (any dtype/codec combination that verifies) to f32:
 * dst [numel]. Integer dtypes convert by value. */
int wire_tensor_decode_f32(float *dst, const struct wire_tensor *t);

/* Fills `t` to describe f32 values src [rows, cols] encoded with `codec` into the caller's
 * `encoded` buffer [rows * cols * value_bytes] and `scales` [rows] (INT8_ROW only); the
 * shape is [rows, cols]. For WIRE_CODEC_NONE `encoded` may be NULL and t->data = src. */
int wire_tensor_encode_f32(struct wire_tensor *t, void *encoded, float *scales, const float *src,
                           size_t rows, size_t cols, enum wire_codec codec);

/* Codec error of decoded vs original values [n]: max |a-b| and sqrt(mean (a-b)^2). */
void wire_codec_error(double *max_abs, double *rms, const float *original, const float *decoded,
                      size_t n);

#endif
