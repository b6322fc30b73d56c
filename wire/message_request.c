/* The Request message (wire/strata.fbs): its schema, builder, parser and the semantic
 * checks both share (sampling parameters, stop ids, resume tokens, the Qwen3-VL grids,
 * vision tensors and image files of wire 1.1). Kept beside message.c, on its Tensor and
 * frame helpers (message_internal.h), because it is the largest message and the one that
 * grows with each minor version; wire_verify and wire_read_request reach it through
 * wmsg_parse_request. */
#include <stdint.h>
#include <string.h>

#include "runtime/base/status.h"
#include "wire/flatbuf.h"
#include "wire/message.h"
#include "wire/message_internal.h"

/* ---- schema (field ids = declaration order in strata.fbs) ---- */

enum {
    REQUEST_NONCE,
    REQUEST_PROMPT,
    REQUEST_MAX_TOKENS,
    REQUEST_TEMPERATURE,
    REQUEST_TOP_K,
    REQUEST_TOP_P,
    REQUEST_SEED,
    REQUEST_STOP_IDS,
    REQUEST_IMAGE_GRIDS,
    REQUEST_VISION_EMBEDS,
    REQUEST_DEEPSTACK,
    REQUEST_IMAGE_FILES,
    REQUEST_IMAGE_FILE_SIZES,
    REQUEST_IMAGE_FORMATS,
    REQUEST_RESUME_TOKENS,
    REQUEST_BLOCK_KEYS,
    REQUEST_CACHED_BLOCKS,
    REQUEST_SPECULATE,
    REQUEST_SPECULATE_K
};
static const struct fb_field_desc request_fields[] = {
    SCALAR(8),
    VECTOR(4, 4),
    SCALAR(4),
    SCALAR(4),
    SCALAR(4),
    SCALAR(4),
    SCALAR(8),
    VECTOR(4, 4),
    VECTOR(4, 4),
    TABLE(wmsg_tensor_desc),
    TABLE(wmsg_tensor_desc),
    VECTOR(1, 1),
    VECTOR(4, 4),
    VECTOR(1, 1),
    VECTOR(4, 4),
    VECTOR(8, 8),
    SCALAR(4),
    SCALAR(1),
    SCALAR(4),
};
const struct fb_table_desc wmsg_request_desc = {"Request", 19, request_fields};
#define REQUEST_TOP_P_DEFAULT 0x3f800000u /* 1.0f: the schema default */

/* ---- builder ---- */

static uint32_t float_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static float bits_float(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* A Request's image files (1.1): sizes add up to the bytes, formats are known. */
static int check_request_images(const struct wire_request *m, int code) {
    uint64_t total = 0;
    if (m->num_image_files && !m->image_file_sizes)
        return strata_set_error(code, "wire: Request: %zu image files but no sizes",
                                m->num_image_files);
    for (size_t i = 0; i < m->num_image_files; ++i) {
        if (m->image_file_sizes[i] == 0)
            return strata_set_error(code, "wire: Request: image file %zu is empty", i);
        total += m->image_file_sizes[i];
    }
    if (total != m->image_files_len || (m->image_files_len && !m->image_files))
        return strata_set_error(code,
                                "wire: Request: image file sizes add up to %llu bytes, "
                                "image_files holds %zu",
                                (unsigned long long)total, m->image_files_len);
    for (size_t i = 0; m->image_formats && i < m->num_image_files; ++i)
        if (m->image_formats[i] > WIRE_IMAGE_WEBM)
            return strata_set_error(STRATA_EVERSION, "wire: Request: image format %d unknown",
                                    (int)m->image_formats[i]);
    return 0;
}

/* Semantic checks of a Request shared by builder and reader (see message.h). */
static int check_request(const struct wire_request *m, int code) {
    if (m->nonce == 0)
        return strata_set_error(code, "wire: Request.nonce 0 is reserved (connection errors)");
    if (m->prompt_len < 1 || !m->prompt)
        return strata_set_error(code, "wire: Request has no prompt token ids");
    if (m->max_tokens < 1)
        return strata_set_error(code, "wire: Request.max_tokens %d is invalid (need >= 1)",
                                (int)m->max_tokens);
    if (m->temperature != m->temperature || m->top_p != m->top_p)
        return strata_set_error(code, "wire: Request.temperature or top_p is NaN");
    if (m->num_stop_ids && !m->stop_ids)
        return strata_set_error(code, "wire: Request: %zu stop ids but no array", m->num_stop_ids);
    if (m->num_images && !m->image_grids)
        return strata_set_error(code, "wire: Request: %zu image grids but no array", m->num_images);
    if (m->num_resume_tokens &&
        (!m->resume_tokens || m->num_resume_tokens >= (size_t)m->max_tokens))
        return strata_set_error(code,
                                "wire: Request resumes after %zu tokens, which must be fewer than "
                                "max_tokens %d",
                                m->num_resume_tokens, (int)m->max_tokens);
    if ((m->num_block_keys && !m->block_keys) || m->num_block_keys > m->prompt_len / 16 ||
        m->cached_blocks < 0 || (size_t)m->cached_blocks > m->num_block_keys ||
        (size_t)m->cached_blocks * 16 >= m->prompt_len)
        return strata_set_error(code,
                                "wire: Request of %zu prompt tokens with %zu block keys, %d of "
                                "them cached (at most one per full block of 16, and the last "
                                "prompt token never cached)",
                                m->prompt_len, m->num_block_keys, (int)m->cached_blocks);
    if (m->speculate > WIRE_SPECULATE_DRAFT || m->speculate_k < 0 ||
        m->speculate_k > WIRE_SPECULATE_MAX_K)
        return strata_set_error(code,
                                "wire: Request.speculate %d with speculate_k %d (modes 0..%d, "
                                "0..%d draft tokens)",
                                (int)m->speculate, (int)m->speculate_k, WIRE_SPECULATE_DRAFT,
                                WIRE_SPECULATE_MAX_K);
    int rc = wmsg_check_tensor(&m->vision_embeds, "Request", "vision_embeds");
    if (!rc) rc = wmsg_check_tensor(&m->deepstack, "Request", "deepstack");
    return rc ? rc : check_request_images(m, code);
}

int wire_build_request(struct wire_arena *a, const struct wire_request *m) {
    int rc = check_request(m, STRATA_EINVAL);
    if (rc) return rc;
    fb_begin(
        a, 1024 + 4 * (m->prompt_len + m->num_stop_ids + 3 * m->num_images + m->num_resume_tokens) +
               wmsg_tensor_bytes_estimate(&m->vision_embeds) +
               wmsg_tensor_bytes_estimate(&m->deepstack) + m->image_files_len +
               5 * m->num_image_files + 8 * m->num_block_keys + 128);
    uint32_t files = m->num_image_files
                         ? fb_vector(a, m->image_files, m->image_files_len, 1, WIRE_PAYLOAD_ALIGN)
                         : 0;
    uint32_t sizes =
        m->num_image_files ? fb_vector(a, m->image_file_sizes, m->num_image_files, 4, 4) : 0;
    uint32_t formats = m->num_image_files && m->image_formats
                           ? fb_vector(a, m->image_formats, m->num_image_files, 1, 1)
                           : 0;
    uint32_t embeds = wmsg_build_tensor(a, &m->vision_embeds);
    uint32_t deepstack = wmsg_build_tensor(a, &m->deepstack);
    uint32_t prompt = fb_vector(a, m->prompt, m->prompt_len, 4, 4);
    uint32_t stop_ids = m->num_stop_ids ? fb_vector(a, m->stop_ids, m->num_stop_ids, 4, 4) : 0;
    uint32_t grids = m->num_images ? fb_vector(a, m->image_grids, 3 * m->num_images, 4, 4) : 0;
    uint32_t resume =
        m->num_resume_tokens ? fb_vector(a, m->resume_tokens, m->num_resume_tokens, 4, 4) : 0;
    uint32_t keys = m->num_block_keys ? fb_vector(a, m->block_keys, m->num_block_keys, 8, 8) : 0;
    fb_table_start(a);
    fb_add_offset(a, REQUEST_BLOCK_KEYS, keys);
    fb_add_offset(a, REQUEST_RESUME_TOKENS, resume);
    fb_add_offset(a, REQUEST_IMAGE_GRIDS, grids);
    fb_add_offset(a, REQUEST_VISION_EMBEDS, embeds);
    fb_add_offset(a, REQUEST_DEEPSTACK, deepstack);
    fb_add_offset(a, REQUEST_IMAGE_FILES, files);
    fb_add_offset(a, REQUEST_IMAGE_FILE_SIZES, sizes);
    fb_add_offset(a, REQUEST_IMAGE_FORMATS, formats);
    fb_add_u64(a, REQUEST_NONCE, m->nonce, 0);
    fb_add_u64(a, REQUEST_SEED, m->seed, 0);
    fb_add_offset(a, REQUEST_PROMPT, prompt);
    fb_add_offset(a, REQUEST_STOP_IDS, stop_ids);
    fb_add_u32(a, REQUEST_MAX_TOKENS, (uint32_t)m->max_tokens, 0);
    fb_add_u32(a, REQUEST_TEMPERATURE, float_bits(m->temperature), 0);
    fb_add_u32(a, REQUEST_TOP_K, (uint32_t)m->top_k, 0);
    fb_add_u32(a, REQUEST_TOP_P, float_bits(m->top_p), REQUEST_TOP_P_DEFAULT);
    fb_add_u32(a, REQUEST_CACHED_BLOCKS, (uint32_t)m->cached_blocks, 0);
    fb_add_u32(a, REQUEST_SPECULATE_K, (uint32_t)m->speculate_k, 0);
    fb_add_u8(a, REQUEST_SPECULATE, m->speculate, 0);
    return wmsg_finish_frame(a, WIRE_KIND_REQUEST, fb_table_end(a));
}

/* ---- reader ---- */

int wmsg_parse_request(struct wire_request *out, const struct fb_table *t) {
    memset(out, 0, sizeof *out);
    out->nonce = fb_get_scalar(t, REQUEST_NONCE, 8, 0);
    out->prompt = (const int32_t *)fb_get_vector(t, REQUEST_PROMPT, &out->prompt_len);
    out->max_tokens = wmsg_get_i32(t, REQUEST_MAX_TOKENS, 0);
    out->temperature = bits_float((uint32_t)fb_get_scalar(t, REQUEST_TEMPERATURE, 4, 0));
    out->top_k = wmsg_get_i32(t, REQUEST_TOP_K, 0);
    out->top_p = bits_float((uint32_t)fb_get_scalar(t, REQUEST_TOP_P, 4, REQUEST_TOP_P_DEFAULT));
    out->seed = fb_get_scalar(t, REQUEST_SEED, 8, 0);
    out->stop_ids = (const int32_t *)fb_get_vector(t, REQUEST_STOP_IDS, &out->num_stop_ids);
    size_t grid_values;
    out->image_grids = (const int32_t *)fb_get_vector(t, REQUEST_IMAGE_GRIDS, &grid_values);
    if (grid_values % 3)
        return strata_set_error(STRATA_EFORMAT,
                                "wire: Request.image_grids has %zu values, not (t, h, w) triples",
                                grid_values);
    out->num_images = grid_values / 3;
    int rc =
        wmsg_read_tensor(&out->vision_embeds, t, REQUEST_VISION_EMBEDS, "Request", "vision_embeds");
    if (!rc) rc = wmsg_read_tensor(&out->deepstack, t, REQUEST_DEEPSTACK, "Request", "deepstack");
    if (rc) return rc;
    out->resume_tokens =
        (const int32_t *)fb_get_vector(t, REQUEST_RESUME_TOKENS, &out->num_resume_tokens);
    out->block_keys = (const uint64_t *)fb_get_vector(t, REQUEST_BLOCK_KEYS, &out->num_block_keys);
    out->cached_blocks = wmsg_get_i32(t, REQUEST_CACHED_BLOCKS, 0);
    out->speculate = (uint8_t)fb_get_scalar(t, REQUEST_SPECULATE, 1, 0);
    out->speculate_k = wmsg_get_i32(t, REQUEST_SPECULATE_K, 0);
    size_t n_formats;
    out->image_files = fb_get_vector(t, REQUEST_IMAGE_FILES, &out->image_files_len);
    out->image_file_sizes =
        (const uint32_t *)fb_get_vector(t, REQUEST_IMAGE_FILE_SIZES, &out->num_image_files);
    out->image_formats = fb_get_vector(t, REQUEST_IMAGE_FORMATS, &n_formats);
    if (out->image_formats && n_formats != out->num_image_files)
        return strata_set_error(STRATA_EFORMAT,
                                "wire: Request: %zu image formats for %zu image files", n_formats,
                                out->num_image_files);
    return check_request(out, STRATA_EFORMAT);
}
