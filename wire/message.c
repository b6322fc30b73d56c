/* Strata messages on top of our FlatBuffers core: the schema of wire/strata.fbs written
 * down as field-id tables, message builders, and readers that add the semantic checks
 * (known enums, tensor byte length == numel x value size, KV shapes) to the structural
 * verification. wire_verify runs the same parse as the readers, into a scratch struct.
 * The Request message is message_request.c, the vision stage's message_vision.c, Control
 * Describe's stage list message_describe.c (shared helpers: message_internal.h). */
#include "wire/message.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "runtime/base/status.h"
#include "wire/codec.h"
#include "wire/flatbuf.h"
#include "wire/message_internal.h"

/* ---- schema (field ids = declaration order in strata.fbs; Request: message_request.c) ---- */

enum {
    TENSOR_DEFINED,
    TENSOR_DTYPE,
    TENSOR_SHAPE,
    TENSOR_NBYTES,
    TENSOR_CODEC,
    TENSOR_DATA,
    TENSOR_SCALES
};
static const struct fb_field_desc tensor_fields[] = {
    SCALAR(1), SCALAR(1), VECTOR(8, 8), SCALAR(8), SCALAR(1), VECTOR(1, 1), VECTOR(4, 4),
};
const struct fb_table_desc wmsg_tensor_desc = {"Tensor", 7, tensor_fields};

enum {
    HELLO_MAJOR,
    HELLO_MINOR,
    HELLO_FINGERPRINT,
    HELLO_STAGE,
    HELLO_LAYER_START,
    HELLO_LAYER_END,
    HELLO_ROLE,
    HELLO_CHALLENGE,
    HELLO_PROOF,
    HELLO_NAME
};
static const struct fb_field_desc hello_fields[] = {
    SCALAR(2), SCALAR(2), VECTOR(1, 1), SCALAR(4),    SCALAR(4),
    SCALAR(4), SCALAR(1), VECTOR(1, 1), VECTOR(1, 1), STRING,
};
static const struct fb_table_desc hello_desc = {"Hello", 10, hello_fields};

#define SEGMENT_BYTES 16
enum {
    ACT_FROM,
    ACT_TO,
    ACT_STEP,
    ACT_POS,
    ACT_NONCE,
    ACT_HIDDEN,
    ACT_MASK,
    ACT_POSITIONS,
    ACT_VISUAL,
    ACT_DEEPSTACK,
    ACT_SEGMENTS,
    ACT_DRAFT_IDS,
    ACT_FED_ID
};
static const struct fb_field_desc activation_fields[] = {
    SCALAR(4),
    SCALAR(4),
    SCALAR(8),
    SCALAR(8),
    SCALAR(8),
    TABLE(wmsg_tensor_desc),
    TABLE(wmsg_tensor_desc),
    TABLE(wmsg_tensor_desc),
    TABLE(wmsg_tensor_desc),
    TABLE(wmsg_tensor_desc),
    VECTOR(SEGMENT_BYTES, 8),
    VECTOR(4, 4),
    SCALAR(4),
};
static const struct fb_table_desc activation_desc = {"Activation", 13, activation_fields};

enum {
    KV_FROM,
    KV_TO,
    KV_STEP,
    KV_NONCE,
    KV_LAYER_START,
    KV_LAYER_END,
    KV_LENGTHS,
    KV_K,
    KV_V,
    KV_STORED_DTYPE
};
static const struct fb_field_desc kv_fields[] = {
    SCALAR(4),
    SCALAR(4),
    SCALAR(8),
    SCALAR(8),
    SCALAR(4),
    SCALAR(4),
    VECTOR(4, 4),
    TABLE(wmsg_tensor_desc),
    TABLE(wmsg_tensor_desc),
    SCALAR(4),
};
static const struct fb_table_desc kv_desc = {"KvBlock", 10, kv_fields};

enum {
    TOKEN_NONCE,
    TOKEN_STEP,
    TOKEN_TOKENS,
    TOKEN_LOGPROBS,
    TOKEN_FINISH,
    TOKEN_CACHED_TOKENS,
    TOKEN_ACCEPTED,
    TOKEN_REJECTED,
    TOKEN_PROMPT_TOKENS,
    TOKEN_BLOCK_KEYS
};
static const struct fb_field_desc token_fields[] = {
    SCALAR(8), SCALAR(8), VECTOR(4, 4), VECTOR(4, 4), SCALAR(1),
    SCALAR(4), SCALAR(4), SCALAR(4),    SCALAR(4),    VECTOR(8, 8),
};
/* The verifier checks only the fields a table's descriptor lists, and the readers trust it:
 * a field without one would be read unchecked. */
_Static_assert(sizeof token_fields / sizeof token_fields[0] == TOKEN_BLOCK_KEYS + 1,
               "every TokenResult field needs its descriptor");
static const struct fb_table_desc token_desc = {
    "TokenResult", (int)(sizeof token_fields / sizeof token_fields[0]), token_fields};

enum { ERROR_CODE, ERROR_MESSAGE, ERROR_NONCE };
static const struct fb_field_desc error_fields[] = {SCALAR(4), STRING, SCALAR(8)};
static const struct fb_table_desc error_desc = {"Error", 3, error_fields};

enum { CONTROL_KIND, CONTROL_NONCE, CONTROL_SEQ, CONTROL_STAGES = WMSG_CONTROL_STAGES };
static const struct fb_field_desc control_fields[] = {
    SCALAR(1), SCALAR(8), SCALAR(8), {FB_TABLE_VECTOR, 4, 4, &wmsg_stage_info_desc, NULL, 0}};
static const struct fb_table_desc control_desc = {"Control", 4, control_fields};

static const struct fb_table_desc *const message_members[] = {
    NULL,
    &hello_desc,
    &activation_desc,
    &kv_desc,
    &token_desc,
    &error_desc,
    &control_desc,
    &wmsg_request_desc,
    &wmsg_vision_block_desc,
    &wmsg_vision_ack_desc,
};
#define NUM_MEMBERS 10

enum { FRAME_MAJOR, FRAME_MINOR, FRAME_BODY_TYPE, FRAME_BODY };
static const struct fb_field_desc frame_fields[] = {
    SCALAR(2),
    SCALAR(2),
    {FB_UNION_TYPE, 1, 1, NULL, NULL, 0},
    {FB_UNION, 4, 4, NULL, message_members, NUM_MEMBERS},
};
static const struct fb_table_desc frame_desc = {"Frame", 4, frame_fields};

/* ---- names ---- */

const char *wire_kind_name(enum wire_kind kind) {
    static const char *names[] = {"NONE",  "Hello",   "Activation", "KvBlock",     "TokenResult",
                                  "Error", "Control", "Request",    "VisionBlock", "VisionAck"};
    return (unsigned)kind < NUM_MEMBERS ? names[kind] : "unknown";
}

const char *wire_dtype_name(enum wire_dtype dtype) {
    static const char *names[] = {"f32", "bf16", "f16", "i64", "i32", "u8"};
    return (unsigned)dtype < 6 ? names[dtype] : "unknown";
}

const char *wire_codec_name(enum wire_codec codec) {
    static const char *names[] = {"none", "fp16", "bf16", "int8-row"};
    return (unsigned)codec < 4 ? names[codec] : "unknown";
}

int64_t wire_tensor_numel(const struct wire_tensor *t) {
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; ++i) {
        if (t->shape[i] < 0) return -1;
        if (t->shape[i] != 0 && numel > INT64_MAX / t->shape[i]) return -1;
        numel *= t->shape[i];
    }
    return numel;
}

/* Rows of a tensor for per-row scales: the product of all but the last dimension. */
static int64_t tensor_rows(const struct wire_tensor *t) {
    int64_t rows = 1;
    for (int i = 0; i + 1 < t->ndim; ++i)
        rows *= t->shape[i];
    return rows;
}

/* Semantic checks shared by builder (before writing) and reader (after parsing). */
int wmsg_check_tensor(const struct wire_tensor *t, const char *msg, const char *name) {
    if (!t->defined) return 0;
    size_t value_bytes = wire_codec_value_bytes(t->dtype, t->codec);
    if (!value_bytes)
        return strata_set_error(
            STRATA_EFORMAT, "wire: %s.%s: codec %s (%d) is invalid for dtype %s (%d)", msg, name,
            wire_codec_name(t->codec), (int)t->codec, wire_dtype_name(t->dtype), (int)t->dtype);
    if (t->ndim < 0 || t->ndim > WIRE_MAX_DIMS)
        return strata_set_error(STRATA_EFORMAT, "wire: %s.%s: rank %d outside 0..%d", msg, name,
                                t->ndim, WIRE_MAX_DIMS);
    int64_t numel = wire_tensor_numel(t);
    if (numel < 0 || (uint64_t)numel > ((uint64_t)1 << 31))
        return strata_set_error(STRATA_EFORMAT, "wire: %s.%s: bad shape (negative or too large)",
                                msg, name);
    uint64_t expected = (uint64_t)numel * value_bytes;
    if (t->nbytes != expected)
        return strata_set_error(STRATA_EFORMAT,
                                "wire: %s.%s: payload is %zu bytes, shape needs %" PRId64
                                " x %zu = %" PRIu64,
                                msg, name, t->nbytes, numel, value_bytes, expected);
    if (t->nbytes && !t->data)
        return strata_set_error(STRATA_EFORMAT, "wire: %s.%s: payload missing", msg, name);
    size_t want_scales = t->codec == WIRE_CODEC_INT8_ROW ? (size_t)tensor_rows(t) : 0;
    if (t->codec == WIRE_CODEC_INT8_ROW && t->ndim == 0)
        return strata_set_error(STRATA_EFORMAT, "wire: %s.%s: int8-row needs rank >= 1", msg, name);
    if (t->num_scales != want_scales || (want_scales && !t->scales))
        return strata_set_error(STRATA_EFORMAT, "wire: %s.%s: %zu scales, codec %s needs %zu", msg,
                                name, t->num_scales, wire_codec_name(t->codec), want_scales);
    return 0;
}

/* ---- builders ---- */

size_t wmsg_tensor_bytes_estimate(const struct wire_tensor *t) {
    return t->defined ? t->nbytes + 4 * t->num_scales + 8 * WIRE_MAX_DIMS + 256 : 0;
}

uint32_t wmsg_build_tensor(struct wire_arena *a, const struct wire_tensor *t) {
    if (!t->defined) return 0;
    uint32_t data = fb_vector(a, t->data, t->nbytes, 1, WIRE_PAYLOAD_ALIGN);
    uint32_t shape = fb_vector(a, t->shape, (size_t)t->ndim, 8, 8);
    uint32_t scales = t->num_scales ? fb_vector(a, t->scales, t->num_scales, 4, 4) : 0;
    fb_table_start(a);
    fb_add_u64(a, TENSOR_NBYTES, t->nbytes, 0);
    fb_add_offset(a, TENSOR_SHAPE, shape);
    fb_add_offset(a, TENSOR_DATA, data);
    fb_add_offset(a, TENSOR_SCALES, scales);
    fb_add_u8(a, TENSOR_DEFINED, 1, 0);
    fb_add_u8(a, TENSOR_DTYPE, (uint8_t)t->dtype, 0);
    fb_add_u8(a, TENSOR_CODEC, (uint8_t)t->codec, 0);
    return fb_table_end(a);
}

/* Wraps a finished body table in the Frame root and finishes the buffer. */
int wmsg_finish_frame(struct wire_arena *a, enum wire_kind kind, uint32_t body) {
    fb_table_start(a);
    fb_add_offset(a, FRAME_BODY, body);
    fb_add_u16(a, FRAME_MAJOR, WIRE_VERSION_MAJOR, 0);
    fb_add_u16(a, FRAME_MINOR, WIRE_VERSION_MINOR, 0);
    fb_add_u8(a, FRAME_BODY_TYPE, (uint8_t)kind, 0);
    uint32_t root = fb_table_end(a);
    fb_finish(a, root, WIRE_FILE_IDENTIFIER);
    return a->error;
}

static uint32_t optional_bytes(struct wire_arena *a, int present, const uint8_t *bytes, size_t n) {
    return present ? fb_vector(a, bytes, n, 1, 1) : 0;
}

int wire_build_hello(struct wire_arena *a, const struct wire_hello *m) {
    fb_begin(a, 1024);
    size_t name_len = strnlen(m->name, sizeof m->name);
    uint32_t name = name_len ? fb_string(a, m->name, name_len) : 0;
    uint32_t fingerprint =
        optional_bytes(a, m->has_fingerprint, m->fingerprint, WIRE_FINGERPRINT_BYTES);
    uint32_t challenge = optional_bytes(a, m->has_challenge, m->challenge, WIRE_NONCE_BYTES);
    uint32_t proof = optional_bytes(a, m->has_proof, m->proof, WIRE_PROOF_BYTES);
    fb_table_start(a);
    fb_add_u32(a, HELLO_STAGE, (uint32_t)m->stage_index, (uint32_t)-1);
    fb_add_u32(a, HELLO_LAYER_START, (uint32_t)m->layer_start, 0);
    fb_add_u32(a, HELLO_LAYER_END, (uint32_t)m->layer_end, 0);
    fb_add_offset(a, HELLO_FINGERPRINT, fingerprint);
    fb_add_offset(a, HELLO_CHALLENGE, challenge);
    fb_add_offset(a, HELLO_PROOF, proof);
    fb_add_offset(a, HELLO_NAME, name);
    fb_add_u16(a, HELLO_MAJOR, m->version_major, 0);
    fb_add_u16(a, HELLO_MINOR, m->version_minor, 0);
    fb_add_u8(a, HELLO_ROLE, (uint8_t)m->role, 0);
    return wmsg_finish_frame(a, WIRE_KIND_HELLO, fb_table_end(a));
}

int wire_build_activation(struct wire_arena *a, const struct wire_activation *m) {
    const struct wire_tensor *tensors[] = {&m->hidden, &m->attention_mask, &m->position_ids,
                                           &m->visual_mask, &m->deepstack};
    static const char *names[] = {"hidden", "attention_mask", "position_ids", "visual_mask",
                                  "deepstack"};
    size_t expected = 1024 + SEGMENT_BYTES * m->num_segments + 4 * m->num_draft_ids;
    for (int i = 0; i < 5; ++i) {
        int rc = wmsg_check_tensor(tensors[i], "Activation", names[i]);
        if (rc) return rc;
        expected += wmsg_tensor_bytes_estimate(tensors[i]);
    }
    if (m->num_segments && !m->segments)
        return strata_set_error(STRATA_EINVAL, "wire: Activation: %zu segments but no array",
                                m->num_segments);
    if ((m->num_draft_ids && !m->draft_ids) || m->num_draft_ids > WIRE_SPECULATE_MAX_K ||
        (m->has_fed_id && m->fed_id < 0))
        return strata_set_error(STRATA_EINVAL,
                                "wire: Activation: %zu draft ids (at most %d), fed id %d",
                                m->num_draft_ids, WIRE_SPECULATE_MAX_K, (int)m->fed_id);
    fb_begin(a, expected);
    uint32_t offsets[5];
    for (int i = 0; i < 5; ++i)
        offsets[i] = wmsg_build_tensor(a, tensors[i]);
    uint32_t segments = 0;
    if (m->num_segments) {
        /* struct wire_segment has exactly the schema's layout on a little-endian host. */
        _Static_assert(sizeof(struct wire_segment) == SEGMENT_BYTES, "Segment layout");
        segments = fb_vector(a, m->segments, m->num_segments, SEGMENT_BYTES, 8);
    }
    uint32_t drafts = m->num_draft_ids ? fb_vector(a, m->draft_ids, m->num_draft_ids, 4, 4) : 0;
    fb_table_start(a);
    fb_add_u64(a, ACT_STEP, m->step, 0);
    fb_add_u64(a, ACT_POS, m->pos, 0);
    fb_add_u64(a, ACT_NONCE, m->nonce, 0);
    fb_add_u32(a, ACT_FROM, (uint32_t)m->stage_from, 0);
    fb_add_u32(a, ACT_TO, (uint32_t)m->stage_to, 0);
    for (int i = 0; i < 5; ++i)
        fb_add_offset(a, ACT_HIDDEN + i, offsets[i]);
    fb_add_offset(a, ACT_SEGMENTS, segments);
    fb_add_offset(a, ACT_DRAFT_IDS, drafts);
    if (m->has_fed_id) fb_add_u32(a, ACT_FED_ID, (uint32_t)m->fed_id, (uint32_t)-1);
    return wmsg_finish_frame(a, WIRE_KIND_ACTIVATION, fb_table_end(a));
}

int wire_build_kv_block(struct wire_arena *a, const struct wire_kv_block *m) {
    int rc = wmsg_check_tensor(&m->k, "KvBlock", "k");
    if (!rc) rc = wmsg_check_tensor(&m->v, "KvBlock", "v");
    if (rc) return rc;
    if (m->num_lengths && !m->lengths)
        return strata_set_error(STRATA_EINVAL, "wire: KvBlock: %zu lengths but no array",
                                m->num_lengths);
    fb_begin(a, 1024 + 4 * m->num_lengths + wmsg_tensor_bytes_estimate(&m->k) +
                    wmsg_tensor_bytes_estimate(&m->v));
    uint32_t k = wmsg_build_tensor(a, &m->k);
    uint32_t v = wmsg_build_tensor(a, &m->v);
    uint32_t lengths = fb_vector(a, m->lengths, m->num_lengths, 4, 4);
    fb_table_start(a);
    fb_add_u64(a, KV_STEP, m->step, 0);
    fb_add_u64(a, KV_NONCE, m->nonce, 0);
    fb_add_u32(a, KV_FROM, (uint32_t)m->stage_from, 0);
    fb_add_u32(a, KV_TO, (uint32_t)m->stage_to, 0);
    fb_add_u32(a, KV_LAYER_START, (uint32_t)m->layer_start, 0);
    fb_add_u32(a, KV_LAYER_END, (uint32_t)m->layer_end, 0);
    fb_add_u32(a, KV_STORED_DTYPE, (uint32_t)m->stored_dtype, 0);
    fb_add_offset(a, KV_LENGTHS, lengths);
    fb_add_offset(a, KV_K, k);
    fb_add_offset(a, KV_V, v);
    return wmsg_finish_frame(a, WIRE_KIND_KV_BLOCK, fb_table_end(a));
}

int wire_build_token_result(struct wire_arena *a, const struct wire_token_result *m) {
    if ((m->num_tokens && !m->tokens) || (m->num_logprobs && !m->logprobs) ||
        (m->num_block_keys && !m->block_keys))
        return strata_set_error(STRATA_EINVAL, "wire: TokenResult: counts without arrays");
    fb_begin(a, 1024 + 4 * (m->num_tokens + m->num_logprobs) + 8 * m->num_block_keys);
    uint32_t keys = m->num_block_keys ? fb_vector(a, m->block_keys, m->num_block_keys, 8, 8) : 0;
    uint32_t tokens = fb_vector(a, m->tokens, m->num_tokens, 4, 4);
    uint32_t logprobs = m->num_logprobs ? fb_vector(a, m->logprobs, m->num_logprobs, 4, 4) : 0;
    fb_table_start(a);
    fb_add_u64(a, TOKEN_NONCE, m->nonce, 0);
    fb_add_u64(a, TOKEN_STEP, m->step, 0);
    fb_add_offset(a, TOKEN_TOKENS, tokens);
    fb_add_offset(a, TOKEN_LOGPROBS, logprobs);
    fb_add_offset(a, TOKEN_BLOCK_KEYS, keys);
    fb_add_u32(a, TOKEN_CACHED_TOKENS, (uint32_t)m->cached_tokens, 0);
    fb_add_u32(a, TOKEN_ACCEPTED, (uint32_t)m->accepted_tokens, 0);
    fb_add_u32(a, TOKEN_REJECTED, (uint32_t)m->rejected_tokens, 0);
    fb_add_u32(a, TOKEN_PROMPT_TOKENS, (uint32_t)m->prompt_tokens, 0);
    fb_add_u8(a, TOKEN_FINISH, (uint8_t)m->finish, 0);
    return wmsg_finish_frame(a, WIRE_KIND_TOKEN_RESULT, fb_table_end(a));
}

int wire_build_error(struct wire_arena *a, const struct wire_error *m) {
    const char *text = m->message ? m->message : "";
    size_t len = strlen(text);
    fb_begin(a, 1024 + len);
    uint32_t message = fb_string(a, text, len);
    fb_table_start(a);
    fb_add_u64(a, ERROR_NONCE, m->nonce, 0);
    fb_add_u32(a, ERROR_CODE, (uint32_t)m->code, 0);
    fb_add_offset(a, ERROR_MESSAGE, message);
    return wmsg_finish_frame(a, WIRE_KIND_ERROR, fb_table_end(a));
}

int wire_build_control(struct wire_arena *a, const struct wire_control *m) {
    fb_begin(a, 256 + 512 * (m->num_stages <= WIRE_MAX_DESCRIBE_STAGES ? m->num_stages : 0));
    uint32_t stages = wmsg_build_stages(a, m);
    fb_table_start(a);
    fb_add_offset(a, CONTROL_STAGES, stages);
    fb_add_u64(a, CONTROL_NONCE, m->nonce, 0);
    fb_add_u64(a, CONTROL_SEQ, m->seq, 0);
    fb_add_u8(a, CONTROL_KIND, (uint8_t)m->kind, 0);
    return wmsg_finish_frame(a, WIRE_KIND_CONTROL, fb_table_end(a));
}

/* ---- readers ---- */

int wmsg_read_tensor(struct wire_tensor *out, const struct fb_table *parent, int id,
                     const char *msg, const char *name) {
    struct fb_table t;
    memset(out, 0, sizeof *out);
    if (!fb_get_table(&t, parent, id) || !fb_get_scalar(&t, TENSOR_DEFINED, 1, 0)) return 0;
    out->defined = 1;
    out->dtype = (enum wire_dtype)fb_get_scalar(&t, TENSOR_DTYPE, 1, 0);
    out->codec = (enum wire_codec)fb_get_scalar(&t, TENSOR_CODEC, 1, 0);
    size_t ndim;
    const uint8_t *shape = fb_get_vector(&t, TENSOR_SHAPE, &ndim);
    if (ndim > WIRE_MAX_DIMS)
        return strata_set_error(STRATA_EFORMAT, "wire: %s.%s: rank %zu above %d", msg, name, ndim,
                                WIRE_MAX_DIMS);
    out->ndim = (int)ndim;
    for (size_t i = 0; i < ndim; ++i)
        memcpy(&out->shape[i], shape + 8 * i, 8);
    uint64_t nbytes = fb_get_scalar(&t, TENSOR_NBYTES, 8, 0);
    size_t data_count;
    out->data = fb_get_vector(&t, TENSOR_DATA, &data_count);
    if (nbytes != data_count)
        return strata_set_error(STRATA_EFORMAT,
                                "wire: %s.%s: nbytes %" PRIu64 " but %zu payload bytes", msg, name,
                                nbytes, data_count);
    out->nbytes = data_count;
    out->scales = (const float *)fb_get_vector(&t, TENSOR_SCALES, &out->num_scales);
    return wmsg_check_tensor(out, msg, name);
}

static void read_fixed_bytes(uint8_t *dst, int *has, const struct fb_table *t, int id) {
    size_t count;
    const uint8_t *bytes = fb_get_vector(t, id, &count);
    *has = bytes != NULL;
    if (bytes) memcpy(dst, bytes, count);
}

static int parse_hello(struct wire_hello *out, const struct fb_table *t) {
    static const int ids[] = {HELLO_FINGERPRINT, HELLO_CHALLENGE, HELLO_PROOF};
    static const char *names[] = {"model_fingerprint", "challenge", "auth_proof"};
    memset(out, 0, sizeof *out);
    for (int i = 0; i < 3; ++i) {
        size_t count;
        if (fb_get_vector(t, ids[i], &count) && count != 32)
            return strata_set_error(STRATA_EFORMAT, "wire: Hello.%s is %zu bytes, expected 32",
                                    names[i], count);
    }
    out->version_major = (uint16_t)fb_get_scalar(t, HELLO_MAJOR, 2, 0);
    out->version_minor = (uint16_t)fb_get_scalar(t, HELLO_MINOR, 2, 0);
    read_fixed_bytes(out->fingerprint, &out->has_fingerprint, t, HELLO_FINGERPRINT);
    read_fixed_bytes(out->challenge, &out->has_challenge, t, HELLO_CHALLENGE);
    read_fixed_bytes(out->proof, &out->has_proof, t, HELLO_PROOF);
    out->stage_index = wmsg_get_i32(t, HELLO_STAGE, -1);
    out->layer_start = wmsg_get_i32(t, HELLO_LAYER_START, 0);
    out->layer_end = wmsg_get_i32(t, HELLO_LAYER_END, 0);
    out->role = (enum wire_role)fb_get_scalar(t, HELLO_ROLE, 1, 0);
    if (out->role > WIRE_ROLE_VISION)
        return strata_set_error(STRATA_EVERSION, "wire: Hello.role %d unknown", (int)out->role);
    size_t name_len;
    const uint8_t *name = fb_get_vector(t, HELLO_NAME, &name_len);
    if (name_len >= sizeof out->name) name_len = sizeof out->name - 1;
    if (name) memcpy(out->name, name, name_len);
    return 0;
}

static int parse_activation(struct wire_activation *out, const struct fb_table *t) {
    static const char *names[] = {"hidden", "attention_mask", "position_ids", "visual_mask",
                                  "deepstack"};
    struct wire_tensor *tensors[] = {&out->hidden, &out->attention_mask, &out->position_ids,
                                     &out->visual_mask, &out->deepstack};
    memset(out, 0, sizeof *out);
    out->stage_from = wmsg_get_i32(t, ACT_FROM, 0);
    out->stage_to = wmsg_get_i32(t, ACT_TO, 0);
    out->step = fb_get_scalar(t, ACT_STEP, 8, 0);
    out->pos = fb_get_scalar(t, ACT_POS, 8, 0);
    out->nonce = fb_get_scalar(t, ACT_NONCE, 8, 0);
    for (int i = 0; i < 5; ++i) {
        int rc = wmsg_read_tensor(tensors[i], t, ACT_HIDDEN + i, "Activation", names[i]);
        if (rc) return rc;
    }
    out->segments_raw = fb_get_vector(t, ACT_SEGMENTS, &out->num_segments);
    out->draft_ids = (const int32_t *)fb_get_vector(t, ACT_DRAFT_IDS, &out->num_draft_ids);
    out->fed_id = wmsg_get_i32(t, ACT_FED_ID, -1);
    out->has_fed_id = out->fed_id >= 0;
    if (out->fed_id < -1)
        return strata_set_error(STRATA_EFORMAT, "wire: Activation.fed_id %d", (int)out->fed_id);
    if (out->num_draft_ids > WIRE_SPECULATE_MAX_K)
        return strata_set_error(STRATA_EFORMAT, "wire: Activation with %zu draft ids (at most %d)",
                                out->num_draft_ids, WIRE_SPECULATE_MAX_K);
    return 0;
}

struct wire_segment wire_activation_segment(const struct wire_activation *msg, size_t i) {
    struct wire_segment seg;
    if (msg->segments) return msg->segments[i];
    memcpy(&seg, msg->segments_raw + SEGMENT_BYTES * i, sizeof seg);
    return seg;
}

static int check_kv_tensor(const struct wire_tensor *t, const struct wire_kv_block *m,
                           const char *name) {
    if (!t->defined) return 0;
    int64_t layers = (int64_t)m->layer_end - m->layer_start;
    if (t->ndim != 5 || t->shape[0] != layers || t->shape[1] != (int64_t)m->num_lengths)
        return strata_set_error(STRATA_EFORMAT,
                                "wire: KvBlock.%s: shape must be [L=%" PRId64
                                ", B=%zu, kv_heads, S, head_dim]"
                                " (rank %d, first dims %" PRId64 ", %" PRId64 ")",
                                name, layers, m->num_lengths, t->ndim,
                                t->ndim > 0 ? t->shape[0] : 0, t->ndim > 1 ? t->shape[1] : 0);
    for (size_t b = 0; b < m->num_lengths; ++b)
        if (m->lengths[b] < 0 || m->lengths[b] > t->shape[3])
            return strata_set_error(STRATA_EFORMAT,
                                    "wire: KvBlock: lengths[%zu] = %d outside [0, S=%" PRId64 "]",
                                    b, (int)m->lengths[b], t->shape[3]);
    return 0;
}

static int parse_kv_block(struct wire_kv_block *out, const struct fb_table *t) {
    memset(out, 0, sizeof *out);
    out->stage_from = wmsg_get_i32(t, KV_FROM, 0);
    out->stage_to = wmsg_get_i32(t, KV_TO, 0);
    out->step = fb_get_scalar(t, KV_STEP, 8, 0);
    out->nonce = fb_get_scalar(t, KV_NONCE, 8, 0);
    out->layer_start = wmsg_get_i32(t, KV_LAYER_START, 0);
    out->layer_end = wmsg_get_i32(t, KV_LAYER_END, 0);
    out->stored_dtype = wmsg_get_i32(t, KV_STORED_DTYPE, 0);
    if (out->layer_end < out->layer_start || out->layer_start < 0)
        return strata_set_error(STRATA_EFORMAT, "wire: KvBlock: bad layer range [%d, %d)",
                                (int)out->layer_start, (int)out->layer_end);
    out->lengths = (const int32_t *)fb_get_vector(t, KV_LENGTHS, &out->num_lengths);
    int rc = wmsg_read_tensor(&out->k, t, KV_K, "KvBlock", "k");
    if (!rc) rc = wmsg_read_tensor(&out->v, t, KV_V, "KvBlock", "v");
    if (!rc) rc = check_kv_tensor(&out->k, out, "k");
    if (!rc) rc = check_kv_tensor(&out->v, out, "v");
    if (!rc && out->k.defined != out->v.defined)
        rc = strata_set_error(STRATA_EFORMAT,
                              "wire: KvBlock: k and v must both be present or absent");
    if (!rc && out->k.defined && memcmp(out->k.shape, out->v.shape, sizeof out->k.shape) != 0)
        rc = strata_set_error(STRATA_EFORMAT, "wire: KvBlock: k and v shapes differ");
    return rc;
}

static int parse_token_result(struct wire_token_result *out, const struct fb_table *t) {
    memset(out, 0, sizeof *out);
    out->nonce = fb_get_scalar(t, TOKEN_NONCE, 8, 0);
    out->step = fb_get_scalar(t, TOKEN_STEP, 8, 0);
    out->tokens = (const int32_t *)fb_get_vector(t, TOKEN_TOKENS, &out->num_tokens);
    out->logprobs = (const float *)fb_get_vector(t, TOKEN_LOGPROBS, &out->num_logprobs);
    out->finish = (enum wire_finish)fb_get_scalar(t, TOKEN_FINISH, 1, 0);
    out->cached_tokens = wmsg_get_i32(t, TOKEN_CACHED_TOKENS, 0);
    out->accepted_tokens = wmsg_get_i32(t, TOKEN_ACCEPTED, 0);
    out->rejected_tokens = wmsg_get_i32(t, TOKEN_REJECTED, 0);
    out->prompt_tokens = wmsg_get_i32(t, TOKEN_PROMPT_TOKENS, 0);
    out->block_keys = (const uint64_t *)fb_get_vector(t, TOKEN_BLOCK_KEYS, &out->num_block_keys);
    if (out->cached_tokens < 0 || out->accepted_tokens < 0 || out->rejected_tokens < 0 ||
        out->prompt_tokens < 0)
        return strata_set_error(STRATA_EFORMAT,
                                "wire: TokenResult.cached_tokens %d, accepted_tokens %d, "
                                "rejected_tokens %d, prompt_tokens %d (counts are >= 0)",
                                (int)out->cached_tokens, (int)out->accepted_tokens,
                                (int)out->rejected_tokens, (int)out->prompt_tokens);
    if (out->finish > WIRE_FINISH_ERROR)
        return strata_set_error(STRATA_EVERSION, "wire: TokenResult.finish %d unknown",
                                (int)out->finish);
    if (out->num_logprobs && out->num_logprobs != out->num_tokens)
        return strata_set_error(STRATA_EFORMAT, "wire: TokenResult: %zu logprobs for %zu tokens",
                                out->num_logprobs, out->num_tokens);
    return 0;
}

static int parse_error(struct wire_error *out, const struct fb_table *t) {
    size_t len;
    memset(out, 0, sizeof *out);
    out->code = wmsg_get_i32(t, ERROR_CODE, 0);
    out->nonce = fb_get_scalar(t, ERROR_NONCE, 8, 0);
    out->message = (const char *)fb_get_vector(t, ERROR_MESSAGE, &len);
    if (!out->message) out->message = "";
    return 0;
}

static int parse_control(struct wire_control *out, const struct fb_table *t) {
    memset(out, 0, sizeof *out);
    out->kind = (enum wire_control_kind)fb_get_scalar(t, CONTROL_KIND, 1, 0);
    out->nonce = fb_get_scalar(t, CONTROL_NONCE, 8, 0);
    out->seq = fb_get_scalar(t, CONTROL_SEQ, 8, 0);
    if (out->kind > WIRE_CONTROL_PREFIX_CHECK)
        return strata_set_error(STRATA_EVERSION, "wire: Control.kind %d unknown", (int)out->kind);
    return wmsg_parse_control_stages(out, t, CONTROL_STAGES);
}

/* Structural verification plus the version and union checks; returns the body table. */
static int open_frame(struct fb_table *body, enum wire_kind *kind, uint16_t *minor,
                      const void *frame, size_t len) {
    struct fb_table root;
    if (frame && (uintptr_t)frame % 4 != 0)
        return strata_set_error(STRATA_EINVAL, "wire: frame address %p is not 4-byte aligned",
                                frame);
    int rc = fb_verify_buffer(&root, frame, len, WIRE_FILE_IDENTIFIER, &frame_desc);
    if (rc) return rc;
    unsigned major = (unsigned)fb_get_scalar(&root, FRAME_MAJOR, 2, 0);
    unsigned frame_minor = (unsigned)fb_get_scalar(&root, FRAME_MINOR, 2, 0);
    if (major != WIRE_VERSION_MAJOR)
        return strata_set_error(STRATA_EVERSION,
                                "wire: peer speaks protocol %u.%u, this build speaks %d.%d "
                                "(major versions must match)",
                                major, frame_minor, WIRE_VERSION_MAJOR, WIRE_VERSION_MINOR);
    unsigned type = (unsigned)fb_get_scalar(&root, FRAME_BODY_TYPE, 1, 0);
    if (type == 0) return strata_set_error(STRATA_EFORMAT, "wire: frame has no message body");
    if (type >= NUM_MEMBERS)
        return strata_set_error(STRATA_EVERSION,
                                "wire: message type %u unknown to protocol %d.%d (frame is %u.%u)",
                                type, WIRE_VERSION_MAJOR, WIRE_VERSION_MINOR, major, frame_minor);
    if (!fb_get_table(body, &root, FRAME_BODY))
        return strata_set_error(STRATA_EFORMAT, "wire: frame names a %s body but has none",
                                wire_kind_name((enum wire_kind)type));
    *kind = (enum wire_kind)type;
    if (minor) *minor = (uint16_t)frame_minor;
    return 0;
}

int wmsg_open_kind(struct fb_table *body, enum wire_kind want, const void *frame, size_t len) {
    enum wire_kind kind;
    int rc = open_frame(body, &kind, NULL, frame, len);
    if (rc) return rc;
    if (kind != want)
        return strata_set_error(STRATA_EFORMAT, "wire: expected a %s frame, got %s",
                                wire_kind_name(want), wire_kind_name(kind));
    return 0;
}

int wire_verify(enum wire_kind *kind, uint16_t *version_minor, const void *frame, size_t len) {
    struct fb_table body;
    enum wire_kind found = WIRE_KIND_NONE;
    int rc = open_frame(&body, &found, version_minor, frame, len);
    if (kind) *kind = found;
    if (rc) return rc;
    union {
        struct wire_hello hello;
        struct wire_activation activation;
        struct wire_kv_block kv;
        struct wire_token_result token;
        struct wire_error error;
        struct wire_control control;
        struct wire_request request;
        struct wire_vision_block block;
        struct wire_vision_ack ack;
    } scratch;
    switch (found) {
    case WIRE_KIND_HELLO: return parse_hello(&scratch.hello, &body);
    case WIRE_KIND_ACTIVATION: return parse_activation(&scratch.activation, &body);
    case WIRE_KIND_KV_BLOCK: return parse_kv_block(&scratch.kv, &body);
    case WIRE_KIND_TOKEN_RESULT: return parse_token_result(&scratch.token, &body);
    case WIRE_KIND_ERROR: return parse_error(&scratch.error, &body);
    case WIRE_KIND_CONTROL: return parse_control(&scratch.control, &body);
    case WIRE_KIND_REQUEST: return wmsg_parse_request(&scratch.request, &body);
    case WIRE_KIND_VISION_BLOCK: return wmsg_parse_vision_block(&scratch.block, &body);
    case WIRE_KIND_VISION_ACK: return wmsg_parse_vision_ack(&scratch.ack, &body);
    default: return strata_set_error(STRATA_EFORMAT, "wire: no message body");
    }
}

#define DEFINE_READER(fn, type, kind, parse)                                                       \
    int fn(struct type *out, const void *frame, size_t len) {                                      \
        struct fb_table body;                                                                      \
        memset(out, 0, sizeof *out);                                                               \
        int rc = wmsg_open_kind(&body, kind, frame, len);                                          \
        return rc ? rc : parse(out, &body);                                                        \
    }

DEFINE_READER(wire_read_hello, wire_hello, WIRE_KIND_HELLO, parse_hello)
DEFINE_READER(wire_read_activation, wire_activation, WIRE_KIND_ACTIVATION, parse_activation)
DEFINE_READER(wire_read_kv_block, wire_kv_block, WIRE_KIND_KV_BLOCK, parse_kv_block)
DEFINE_READER(wire_read_token_result, wire_token_result, WIRE_KIND_TOKEN_RESULT, parse_token_result)
DEFINE_READER(wire_read_error, wire_error, WIRE_KIND_ERROR, parse_error)
DEFINE_READER(wire_read_control, wire_control, WIRE_KIND_CONTROL, parse_control)
DEFINE_READER(wire_read_request, wire_request, WIRE_KIND_REQUEST, wmsg_parse_request)
