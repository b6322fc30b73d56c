/* The sample messages (see samples.h). Values are chosen to exercise every field: negative
 * ints, 64-bit values above 2^32, non-default enums, every tensor slot, segments. */
#include "tests/wire/samples.h"

#include <string.h>

#include "wire/codec.h"

static const float hidden_values[2][3] = {{1.5f, -2.25f, 0.0f}, {3.0f, 1e-3f, -7.5f}};
static const int32_t positions[3][2] = {{4, 5}, {4, 6}, {4, 7}}; /* M-RoPE [3, T=2] */
static const uint8_t visual[2] = {0, 1};
static const float deepstack_values[1][2][3] = {{{0.5f, 0.25f, -1.0f}, {2.0f, -0.5f, 4.0f}}};
static const uint16_t mask_bf16[2] = {0x3f80, 0x0000}; /* 1.0, 0.0 as bf16 */
static const struct wire_segment segments[2] = {{0x1122334455667788ull, 4, 1},
                                                {0x99aabbccddeeff00ull, 9, 1}};
static const int8_t kv_int8[1][1][1][2][2] = {{{{{-127, 64}, {1, 127}}}}};
static const float kv_scales[2] = {0.5f, 0.25f};
static const float kv_v[1][1][1][2][2] = {{{{{1.0f, 2.0f}, {3.0f, 4.0f}}}}};
static const int32_t kv_lengths[1] = {2};
static const int32_t tokens[3] = {151643, 13, -1};
static const uint64_t answer_keys[2] = {0x0123456789abcdefull, 42};
static const float logprobs[3] = {-0.125f, -2.5f, 0.0f};
static const int32_t prompt_ids[4] = {151644, 872, 0, 2147483647};
static const int32_t stop_ids[2] = {151645, 151643};
static const int32_t draft_ids[1] = {151644};             /* one draft: T = 2 rows */
static const int32_t image_grids[6] = {1, 4, 6, 1, 2, 2}; /* two images: 6 + 1 tokens */
static const uint8_t image_files[12] = {0x89, 'P', 'N', 'G', 13, 10, 0xff, 0xd8, 0xff, 0xe0, 0, 16};
static const uint32_t image_file_sizes[2] = {6, 6};
static const uint8_t image_formats[2] = {WIRE_IMAGE_PNG, WIRE_IMAGE_JPEG};
static const float block_embeds[2][3] = {{0.75f, -1.5f, 8.0f}, {-0.125f, 3.5f, 1e-4f}};
static const float block_deepstack[2][5][3] = {
    {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {-1, -2, -3}, {0.5f, 0, 1}},
    {{9, 8, 7}, {6, 5, 4}, {3, 2, 1}, {-4, -5, -6}, {0, 0.25f, 2}}};

static struct wire_tensor tensor(enum wire_dtype dtype, enum wire_codec codec, const void *data,
                                 size_t nbytes, int ndim, const int64_t *shape) {
    struct wire_tensor t;
    memset(&t, 0, sizeof t);
    t.defined = 1;
    t.dtype = dtype;
    t.codec = codec;
    t.data = data;
    t.nbytes = nbytes;
    t.ndim = ndim;
    for (int i = 0; i < ndim; ++i)
        t.shape[i] = shape[i];
    return t;
}

static void sample_hello(struct wire_hello *m) {
    memset(m, 0, sizeof *m);
    m->version_major = 1;
    m->version_minor = 1;
    m->has_fingerprint = 1;
    for (int i = 0; i < WIRE_FINGERPRINT_BYTES; ++i)
        m->fingerprint[i] = (uint8_t)(i * 7 + 1);
    m->stage_index = 2;
    m->layer_start = 12;
    m->layer_end = 24;
    m->role = WIRE_ROLE_STAGE;
    m->has_challenge = 1;
    for (int i = 0; i < WIRE_NONCE_BYTES; ++i)
        m->challenge[i] = (uint8_t)(255 - i);
    m->has_proof = 1;
    for (int i = 0; i < WIRE_PROOF_BYTES; ++i)
        m->proof[i] = (uint8_t)(i ^ 0x5a);
    strcpy(m->name, "stage-2");
}

static void sample_activation(struct wire_activation *m) {
    static const int64_t hidden_shape[2] = {2, 3}, mask_shape[2] = {1, 2}, pos_shape[2] = {3, 2},
                         visual_shape[1] = {2}, deep_shape[3] = {1, 2, 3};
    memset(m, 0, sizeof *m);
    m->stage_from = 0;
    m->stage_to = 1;
    m->step = 5000000000ull;
    m->pos = 4;
    m->nonce = 0xdeadbeefcafef00dull;
    m->hidden = tensor(WIRE_DTYPE_F32, WIRE_CODEC_NONE, hidden_values, sizeof hidden_values, 2,
                       hidden_shape);
    m->attention_mask =
        tensor(WIRE_DTYPE_BF16, WIRE_CODEC_NONE, mask_bf16, sizeof mask_bf16, 2, mask_shape);
    m->position_ids =
        tensor(WIRE_DTYPE_I32, WIRE_CODEC_NONE, positions, sizeof positions, 2, pos_shape);
    m->visual_mask = tensor(WIRE_DTYPE_U8, WIRE_CODEC_NONE, visual, sizeof visual, 1, visual_shape);
    m->deepstack = tensor(WIRE_DTYPE_F32, WIRE_CODEC_NONE, deepstack_values,
                          sizeof deepstack_values, 3, deep_shape);
    m->segments = segments;
    m->num_segments = 2;
    m->draft_ids = draft_ids;
    m->num_draft_ids = 1;
    m->has_fed_id = 1;
    m->fed_id = 151643;
}

static void sample_kv_block(struct wire_kv_block *m) {
    static const int64_t shape[5] = {1, 1, 1, 2, 2};
    memset(m, 0, sizeof *m);
    m->stage_from = 1;
    m->stage_to = 2;
    m->step = 7;
    m->nonce = 42;
    m->layer_start = 3;
    m->layer_end = 4;
    m->lengths = kv_lengths;
    m->num_lengths = 1;
    m->k = tensor(WIRE_DTYPE_F32, WIRE_CODEC_INT8_ROW, kv_int8, sizeof kv_int8, 5, shape);
    m->k.scales = kv_scales;
    m->k.num_scales = 2;
    m->v = tensor(WIRE_DTYPE_F32, WIRE_CODEC_NONE, kv_v, sizeof kv_v, 5, shape);
}

static void sample_token_result(struct wire_token_result *m) {
    memset(m, 0, sizeof *m);
    m->nonce = 0xfedcba9876543210ull;
    m->step = 3;
    m->tokens = tokens;
    m->num_tokens = 3;
    m->logprobs = logprobs;
    m->num_logprobs = 3;
    m->finish = WIRE_FINISH_LENGTH;
    m->cached_tokens = 32;
    m->accepted_tokens = 11;
    m->rejected_tokens = 5;
    m->prompt_tokens = 137;
    m->block_keys = answer_keys;
    m->num_block_keys = 2;
}

static void sample_error(struct wire_error *m) {
    m->code = -7;
    m->message = "peer speaks protocol 2.0";
    m->nonce = 99;
}

static void sample_control(struct wire_control *m) {
    memset(m, 0, sizeof *m);
    m->kind = WIRE_CONTROL_CANCEL;
    m->nonce = 12345678901ull;
    m->seq = 17;
}

static const struct wire_stage_info describe_stages[3] = {
    {.stage_index = 0,
     .num_stages = 3,
     .layer_start = 0,
     .layer_end = 2,
     .embed = 1,
     .vision = 1,
     .device = "cpu, 4 threads",
     .tp = 2,
     .kvp = 2,
     .threads = 4,
     .weights_dtype = "q8",
     .version = "strata 0.1.0",
     .max_seq = 4096,
     .max_batch = 16,
     .kv_slots_in_use = 3,
     .queue_depth = 7,
     .requests_waiting = 2,
     .kv_blocks = 4096,
     .kv_blocks_used = 100,
     .kv_blocks_reserved = 20,
     .kv_blocks_cached = 7,
     .next = "10.0.0.2:7002",
     .front = 1,
     .totals = {.requests_queued = 12,
                .queue_admitted = 10,
                .queue_refused_full = 1,
                .queue_expired = 1,
                .queue_wait_ms = 5000000000ull, /* past 32 bits */
                .prefix_lookups = 40,
                .prefix_hits = 30,
                .prefix_cached_tokens = 4800,
                .prefix_prompt_tokens = 9000,
                .prefix_fallbacks = 2,
                .spec_steps = 300,
                .spec_drafted = 900,
                .spec_accepted = 640,
                .spec_withheld = 48}},
    {.stage_index = 1, .num_stages = 3, .layer_start = 2, .layer_end = 2, .tp = 1, .kvp = 1},
    {.stage_index = 2,
     .num_stages = 3,
     .layer_start = 2,
     .layer_end = 36,
     .head = 1,
     .device = "cuda:1, NVIDIA H100 80GB HBM3, 79 GiB",
     .tp = 1,
     .kvp = 1,
     .threads = 1,
     .weights_dtype = "bf16",
     .version = "strata 0.1.0",
     .max_seq = 40960,
     .max_batch = 2}};

int sample_build_describe(struct wire_arena *arena) {
    struct wire_control m;
    memset(&m, 0, sizeof m);
    m.kind = WIRE_CONTROL_DESCRIBE;
    m.nonce = 0x0123456789abcdefull;
    m.seq = 3;
    m.stages = describe_stages;
    m.num_stages = 3;
    return wire_build_control(arena, &m);
}

static void sample_request(struct wire_request *m) {
    memset(m, 0, sizeof *m);
    m->nonce = 0x8877665544332211ull;
    m->prompt = prompt_ids;
    m->prompt_len = 4;
    m->max_tokens = 300;
    m->temperature = 0.5f;
    m->top_k = -1;
    m->top_p = 0.875f;
    m->seed = 0xfeedfacecafebeefull;
    m->stop_ids = stop_ids;
    m->num_stop_ids = 2;
    m->image_grids = image_grids;
    m->num_images = 2;
    m->vision_embeds = tensor(WIRE_DTYPE_F32, WIRE_CODEC_NONE, hidden_values, sizeof hidden_values,
                              2, (const int64_t[]){2, 3});
    m->deepstack = tensor(WIRE_DTYPE_F32, WIRE_CODEC_NONE, deepstack_values,
                          sizeof deepstack_values, 3, (const int64_t[]){1, 2, 3});
    m->image_files = image_files;
    m->image_files_len = sizeof image_files;
    m->image_file_sizes = image_file_sizes;
    m->num_image_files = 2;
    m->image_formats = image_formats;
    m->speculate = WIRE_SPECULATE_NGRAM;
    m->speculate_k = 7;
}

/* Block 0 of a 5-token transfer in blocks of 2 (with the DeepStack, K = 2, H = 3). */
static void sample_vision_block(struct wire_vision_block *m) {
    memset(m, 0, sizeof *m);
    m->nonce = 0x8877665544332211ull;
    m->index = 0;
    m->num_blocks = 3;
    m->token_start = 0;
    m->total_tokens = 5;
    m->embeds = tensor(WIRE_DTYPE_F32, WIRE_CODEC_NONE, block_embeds, sizeof block_embeds, 2,
                       (const int64_t[]){2, 3});
    m->deepstack = tensor(WIRE_DTYPE_F32, WIRE_CODEC_NONE, block_deepstack, sizeof block_deepstack,
                          3, (const int64_t[]){2, 5, 3});
}

static void sample_vision_ack(struct wire_vision_ack *m) {
    memset(m, 0, sizeof *m);
    m->nonce = 0x8877665544332211ull;
    m->next_block = 2;
}

int sample_build(struct wire_arena *arena, enum wire_kind kind) {
    switch (kind) {
    case WIRE_KIND_HELLO: {
        struct wire_hello m;
        sample_hello(&m);
        return wire_build_hello(arena, &m);
    }
    case WIRE_KIND_ACTIVATION: {
        struct wire_activation m;
        sample_activation(&m);
        return wire_build_activation(arena, &m);
    }
    case WIRE_KIND_KV_BLOCK: {
        struct wire_kv_block m;
        sample_kv_block(&m);
        return wire_build_kv_block(arena, &m);
    }
    case WIRE_KIND_TOKEN_RESULT: {
        struct wire_token_result m;
        sample_token_result(&m);
        return wire_build_token_result(arena, &m);
    }
    case WIRE_KIND_ERROR: {
        struct wire_error m;
        sample_error(&m);
        return wire_build_error(arena, &m);
    }
    case WIRE_KIND_CONTROL: {
        struct wire_control m;
        sample_control(&m);
        return wire_build_control(arena, &m);
    }
    case WIRE_KIND_REQUEST: {
        struct wire_request m;
        sample_request(&m);
        return wire_build_request(arena, &m);
    }
    case WIRE_KIND_VISION_BLOCK: {
        struct wire_vision_block m;
        sample_vision_block(&m);
        return wire_build_vision_block(arena, &m);
    }
    case WIRE_KIND_VISION_ACK: {
        struct wire_vision_ack m;
        sample_vision_ack(&m);
        return wire_build_vision_ack(arena, &m);
    }
    default: return -1;
    }
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) return __LINE__;                                                              \
    } while (0)

static int tensor_equal(const struct wire_tensor *got, const struct wire_tensor *want) {
    CHECK(got->defined == want->defined && got->dtype == want->dtype && got->codec == want->codec);
    CHECK(got->ndim == want->ndim && got->nbytes == want->nbytes &&
          got->num_scales == want->num_scales);
    CHECK(memcmp(got->shape, want->shape, sizeof got->shape) == 0);
    CHECK(got->nbytes == 0 || memcmp(got->data, want->data, got->nbytes) == 0);
    CHECK(got->num_scales == 0 || memcmp(got->scales, want->scales, 4 * got->num_scales) == 0);
    return 0;
}

int sample_check_hello(const struct wire_hello *m) {
    struct wire_hello want;
    sample_hello(&want);
    CHECK(memcmp(m, &want, sizeof want) == 0);
    return 0;
}

int sample_check_activation(const struct wire_activation *m) {
    struct wire_activation want;
    sample_activation(&want);
    CHECK(m->stage_from == want.stage_from && m->stage_to == want.stage_to);
    CHECK(m->step == want.step && m->pos == want.pos && m->nonce == want.nonce);
    int line;
    if ((line = tensor_equal(&m->hidden, &want.hidden))) return line;
    if ((line = tensor_equal(&m->attention_mask, &want.attention_mask))) return line;
    if ((line = tensor_equal(&m->position_ids, &want.position_ids))) return line;
    if ((line = tensor_equal(&m->visual_mask, &want.visual_mask))) return line;
    if ((line = tensor_equal(&m->deepstack, &want.deepstack))) return line;
    CHECK(m->num_segments == want.num_segments);
    for (size_t i = 0; i < m->num_segments; ++i) {
        struct wire_segment s = wire_activation_segment(m, i);
        CHECK(s.nonce == want.segments[i].nonce && s.pos == want.segments[i].pos &&
              s.n_tokens == want.segments[i].n_tokens);
    }
    CHECK(m->num_draft_ids == want.num_draft_ids &&
          memcmp(m->draft_ids, want.draft_ids, 4 * m->num_draft_ids) == 0);
    CHECK(m->has_fed_id == want.has_fed_id && m->fed_id == want.fed_id);
    return 0;
}

int sample_check_kv_block(const struct wire_kv_block *m) {
    struct wire_kv_block want;
    sample_kv_block(&want);
    CHECK(m->stage_from == want.stage_from && m->stage_to == want.stage_to && m->step == want.step);
    CHECK(m->nonce == want.nonce && m->layer_start == want.layer_start &&
          m->layer_end == want.layer_end);
    CHECK(m->num_lengths == want.num_lengths &&
          memcmp(m->lengths, want.lengths, 4 * m->num_lengths) == 0);
    int line;
    if ((line = tensor_equal(&m->k, &want.k))) return line;
    return tensor_equal(&m->v, &want.v);
}

int sample_check_token_result(const struct wire_token_result *m) {
    struct wire_token_result want;
    sample_token_result(&want);
    CHECK(m->nonce == want.nonce && m->step == want.step && m->finish == want.finish);
    CHECK(m->num_tokens == want.num_tokens &&
          memcmp(m->tokens, want.tokens, 4 * m->num_tokens) == 0);
    CHECK(m->num_logprobs == want.num_logprobs &&
          memcmp(m->logprobs, want.logprobs, 4 * m->num_logprobs) == 0);
    CHECK(m->cached_tokens == want.cached_tokens && m->accepted_tokens == want.accepted_tokens &&
          m->rejected_tokens == want.rejected_tokens && m->prompt_tokens == want.prompt_tokens);
    CHECK(m->num_block_keys == want.num_block_keys &&
          memcmp(m->block_keys, want.block_keys, 8 * m->num_block_keys) == 0);
    return 0;
}

int sample_check_error(const struct wire_error *m) {
    struct wire_error want;
    sample_error(&want);
    CHECK(m->code == want.code && m->nonce == want.nonce && strcmp(m->message, want.message) == 0);
    return 0;
}

int sample_check_control(const struct wire_control *m) {
    struct wire_control want;
    sample_control(&want);
    CHECK(m->kind == want.kind && m->nonce == want.nonce && m->seq == want.seq);
    return 0;
}

static int same_string(const char *got, const char *want) {
    return strcmp(got, want ? want : "") == 0;
}

int sample_check_describe(const struct wire_control *m) {
    CHECK(m->kind == WIRE_CONTROL_DESCRIBE && m->nonce == 0x0123456789abcdefull && m->seq == 3);
    CHECK(m->num_stages == 3 && m->stages == NULL);
    for (size_t i = 0; i < 3; i++) {
        struct wire_stage_info got = wire_control_stage(m, i);
        const struct wire_stage_info *want = &describe_stages[i];
        CHECK(got.stage_index == want->stage_index && got.num_stages == want->num_stages);
        CHECK(got.layer_start == want->layer_start && got.layer_end == want->layer_end);
        CHECK(got.embed == want->embed && got.head == want->head && got.vision == want->vision);
        CHECK(got.tp == want->tp && got.kvp == want->kvp && got.threads == want->threads);
        CHECK(got.max_seq == want->max_seq && got.max_batch == want->max_batch);
        CHECK(got.kv_slots_in_use == want->kv_slots_in_use &&
              got.queue_depth == want->queue_depth &&
              got.requests_waiting == want->requests_waiting);
        CHECK(got.kv_blocks == want->kv_blocks && got.kv_blocks_used == want->kv_blocks_used &&
              got.kv_blocks_reserved == want->kv_blocks_reserved &&
              got.kv_blocks_cached == want->kv_blocks_cached);
        CHECK(!memcmp(&got.totals, &want->totals, sizeof got.totals));
        CHECK(same_string(got.device, want->device) &&
              same_string(got.weights_dtype, want->weights_dtype) &&
              same_string(got.version, want->version) && same_string(got.next, want->next) &&
              got.front == want->front);
    }
    return 0;
}

int sample_check_request(const struct wire_request *m) {
    struct wire_request want;
    sample_request(&want);
    CHECK(m->nonce == want.nonce && m->max_tokens == want.max_tokens && m->seed == want.seed);
    CHECK(m->temperature == want.temperature && m->top_k == want.top_k && m->top_p == want.top_p);
    CHECK(m->prompt_len == want.prompt_len &&
          memcmp(m->prompt, want.prompt, 4 * m->prompt_len) == 0);
    CHECK(m->num_stop_ids == want.num_stop_ids &&
          memcmp(m->stop_ids, want.stop_ids, 4 * m->num_stop_ids) == 0);
    CHECK(m->num_images == want.num_images &&
          memcmp(m->image_grids, want.image_grids, 12 * m->num_images) == 0);
    CHECK(m->vision_embeds.defined && m->vision_embeds.ndim == 2 &&
          m->vision_embeds.shape[0] == 2 && m->vision_embeds.shape[1] == 3 &&
          memcmp(m->vision_embeds.data, hidden_values, sizeof hidden_values) == 0);
    CHECK(m->deepstack.defined && m->deepstack.ndim == 3 && m->deepstack.shape[0] == 1 &&
          memcmp(m->deepstack.data, deepstack_values, sizeof deepstack_values) == 0);
    CHECK(m->num_image_files == 2 && m->image_files_len == sizeof image_files &&
          memcmp(m->image_files, image_files, sizeof image_files) == 0);
    CHECK(memcmp(m->image_file_sizes, image_file_sizes, sizeof image_file_sizes) == 0);
    CHECK(m->image_formats && memcmp(m->image_formats, image_formats, 2) == 0);
    CHECK(m->speculate == want.speculate && m->speculate_k == want.speculate_k);
    return 0;
}

int sample_check_vision_block(const struct wire_vision_block *m) {
    struct wire_vision_block want;
    sample_vision_block(&want);
    CHECK(m->nonce == want.nonce && m->index == want.index && m->num_blocks == want.num_blocks);
    CHECK(m->token_start == want.token_start && m->total_tokens == want.total_tokens);
    int line;
    if ((line = tensor_equal(&m->embeds, &want.embeds))) return line;
    return tensor_equal(&m->deepstack, &want.deepstack);
}

int sample_check_vision_ack(const struct wire_vision_ack *m) {
    struct wire_vision_ack want;
    sample_vision_ack(&want);
    CHECK(m->nonce == want.nonce && m->next_block == want.next_block);
    return 0;
}

int sample_read_and_check(enum wire_kind kind, const void *frame, size_t len) {
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
    } m;
    switch (kind) {
    case WIRE_KIND_HELLO:
        return wire_read_hello(&m.hello, frame, len) ? -1 : sample_check_hello(&m.hello);
    case WIRE_KIND_ACTIVATION:
        return wire_read_activation(&m.activation, frame, len)
                   ? -1
                   : sample_check_activation(&m.activation);
    case WIRE_KIND_KV_BLOCK:
        return wire_read_kv_block(&m.kv, frame, len) ? -1 : sample_check_kv_block(&m.kv);
    case WIRE_KIND_TOKEN_RESULT:
        return wire_read_token_result(&m.token, frame, len) ? -1
                                                            : sample_check_token_result(&m.token);
    case WIRE_KIND_ERROR:
        return wire_read_error(&m.error, frame, len) ? -1 : sample_check_error(&m.error);
    case WIRE_KIND_CONTROL:
        return wire_read_control(&m.control, frame, len) ? -1 : sample_check_control(&m.control);
    case WIRE_KIND_REQUEST:
        return wire_read_request(&m.request, frame, len) ? -1 : sample_check_request(&m.request);
    case WIRE_KIND_VISION_BLOCK:
        return wire_read_vision_block(&m.block, frame, len) ? -1
                                                            : sample_check_vision_block(&m.block);
    case WIRE_KIND_VISION_ACK:
        return wire_read_vision_ack(&m.ack, frame, len) ? -1 : sample_check_vision_ack(&m.ack);
    default: return -1;
    }
}

const char *sample_name(enum wire_kind kind) {
    static const char *names[] = {"none",  "hello",   "activation", "kv_block",     "token_result",
                                  "error", "control", "request",    "vision_block", "vision_ack"};
    return (unsigned)kind <= WIRE_KIND_LAST ? names[kind] : "unknown";
}
