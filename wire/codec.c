/* fp32 <-> bf16 / fp16 conversion (round to nearest even) and int8 per-row quantisation.
 * The 2-byte conversions use integer bit manipulation, so they never depend on compiler
 * flags, the FPU mode or hardware conversion instructions. See codec.h. */
#include "wire/codec.h"

#include <math.h>
#include <string.h>

#include "runtime/base/status.h"

size_t wire_dtype_size(enum wire_dtype dtype) {
    switch (dtype) {
    case WIRE_DTYPE_F32: return 4;
    case WIRE_DTYPE_BF16: return 2;
    case WIRE_DTYPE_F16: return 2;
    case WIRE_DTYPE_I64: return 8;
    case WIRE_DTYPE_I32: return 4;
    case WIRE_DTYPE_U8: return 1;
    }
    return 0;
}

size_t wire_codec_value_bytes(enum wire_dtype dtype, enum wire_codec codec) {
    switch (codec) {
    case WIRE_CODEC_NONE: return wire_dtype_size(dtype);
    case WIRE_CODEC_FP16:
    case WIRE_CODEC_BF16: return dtype == WIRE_DTYPE_F32 ? 2 : 0;
    case WIRE_CODEC_INT8_ROW: return dtype == WIRE_DTYPE_F32 ? 1 : 0;
    }
    return 0;
}

int wire_encode_f32(void *dst, float *scales, const float *src, size_t rows, size_t cols,
                    enum wire_codec codec) {
    size_t n = rows * cols;
    if (cols && rows > SIZE_MAX / cols)
        return strata_set_error(STRATA_EINVAL, "wire codec: size overflow");
    switch (codec) {
    case WIRE_CODEC_NONE:
        if (n) memcpy(dst, src, n * 4);
        return 0;
    case WIRE_CODEC_BF16:
    case WIRE_CODEC_FP16: {
        uint8_t *out = dst;
        for (size_t i = 0; i < n; ++i) {
            uint16_t half = codec == WIRE_CODEC_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
            out[2 * i] = (uint8_t)half;
            out[2 * i + 1] = (uint8_t)(half >> 8);
        }
        return 0;
    }
    case WIRE_CODEC_INT8_ROW: {
        int8_t *out = dst;
        if (!scales)
            return strata_set_error(STRATA_EINVAL, "wire codec: int8-row needs a scales array");
        for (size_t r = 0; r < rows; ++r) {
            const float *row = src + r * cols;
            float max_abs = 0.0f;
            for (size_t c = 0; c < cols; ++c) {
                if (!isfinite(row[c]))
                    return strata_set_error(
                        STRATA_EINVAL, "wire codec: int8-row of non-finite value at [%zu, %zu]", r,
                        c);
                float a = fabsf(row[c]);
                if (a > max_abs) max_abs = a;
            }
            float scale = max_abs / 127.0f;
            scales[r] = scale;
            for (size_t c = 0; c < cols; ++c) {
                float q = scale > 0.0f ? nearbyintf(row[c] / scale) : 0.0f;
                if (q > 127.0f) q = 127.0f;
                if (q < -127.0f) q = -127.0f;
                out[r * cols + c] = (int8_t)q;
            }
        }
        return 0;
    }
    }
    return strata_set_error(STRATA_EINVAL, "wire codec: unknown codec %d", (int)codec);
}

int wire_tensor_encode_f32(struct wire_tensor *t, void *encoded, float *scales, const float *src,
                           size_t rows, size_t cols, enum wire_codec codec) {
    memset(t, 0, sizeof *t);
    size_t value_bytes = wire_codec_value_bytes(WIRE_DTYPE_F32, codec);
    if (!value_bytes)
        return strata_set_error(STRATA_EINVAL, "wire codec: unknown codec %d", (int)codec);
    t->defined = 1;
    t->dtype = WIRE_DTYPE_F32;
    t->codec = codec;
    t->ndim = 2;
    t->shape[0] = (int64_t)rows;
    t->shape[1] = (int64_t)cols;
    t->nbytes = rows * cols * value_bytes;
    if (codec == WIRE_CODEC_NONE && !encoded) {
        t->data = src;
        return 0;
    }
    int rc = wire_encode_f32(encoded, scales, src, rows, cols, codec);
    if (rc) return rc;
    t->data = encoded;
    if (codec == WIRE_CODEC_INT8_ROW) {
        t->scales = scales;
        t->num_scales = rows;
    }
    return 0;
}

int wire_tensor_decode_f32(float *dst, const struct wire_tensor *t) {
    if (!t->defined)
        return strata_set_error(STRATA_EINVAL, "wire codec: decoding an undefined tensor");
    int64_t numel = wire_tensor_numel(t);
    size_t value_bytes = wire_codec_value_bytes(t->dtype, t->codec);
    if (numel < 0 || !value_bytes || (uint64_t)numel * value_bytes != t->nbytes)
        return strata_set_error(STRATA_EFORMAT,
                                "wire codec: tensor byte length does not match its shape");
    const uint8_t *p = t->data;
    size_t n = (size_t)numel;
    size_t cols = t->ndim ? (size_t)t->shape[t->ndim - 1] : 1;
    for (size_t i = 0; i < n; ++i) {
        const uint8_t *v = p + i * value_bytes;
        uint16_t half = (uint16_t)(v[0] | (value_bytes > 1 ? v[1] << 8 : 0));
        switch (t->codec) {
        case WIRE_CODEC_FP16: dst[i] = f16_to_f32(half); continue;
        case WIRE_CODEC_BF16: dst[i] = bf16_to_f32(half); continue;
        case WIRE_CODEC_INT8_ROW: {
            float scale;
            memcpy(&scale, (const uint8_t *)t->scales + 4 * (i / cols), 4);
            dst[i] = (float)(int8_t)v[0] * scale;
            continue;
        }
        case WIRE_CODEC_NONE: break;
        }
        switch (t->dtype) {
        case WIRE_DTYPE_F32: memcpy(&dst[i], v, 4); break;
        case WIRE_DTYPE_BF16: dst[i] = bf16_to_f32(half); break;
        case WIRE_DTYPE_F16: dst[i] = f16_to_f32(half); break;
        case WIRE_DTYPE_I64: {
            int64_t x;
            memcpy(&x, v, 8);
            dst[i] = (float)x;
            break;
        }
        case WIRE_DTYPE_I32: {
            int32_t x;
            memcpy(&x, v, 4);
            dst[i] = (float)x;
            break;
        }
        case WIRE_DTYPE_U8: dst[i] = (float)v[0]; break;
        }
    }
    return 0;
}

void wire_codec_error(double *max_abs, double *rms, const float *original, const float *decoded,
                      size_t n) {
    double worst = 0.0, sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double d = fabs((double)original[i] - (double)decoded[i]);
        if (d > worst) worst = d;
        sum += d * d;
    }
    *max_abs = worst;
    *rms = n ? sqrt(sum / (double)n) : 0.0;
}
