/* Strata wire messages: plain C structs, a FlatBuffers builder and a verifying reader.
 *
 * Every message travels as one FlatBuffers buffer whose root table is `Frame { version_major,
 * version_minor, body: union Message }` with file identifier "STRA" (schema: wire/strata.fbs).
 * The code here is our own implementation of the binary format (no flatcc), checked against
 * the official flatc compiler in tests/wire.
 *
 * Building: a `wire_arena` is a byte buffer filled back to front, as FlatBuffers builders
 * do. It either grows (heap, 64-byte aligned) or uses a caller buffer of fixed size. Each
 * `wire_build_*` resets the arena and writes one complete frame; tensor payloads are copied
 * exactly once and start 64-byte aligned in the frame.
 *
 * Reading: `wire_verify` checks every offset, length, alignment and nesting bound of a
 * received buffer before any field is read. Each `wire_read_*` verifies the frame again
 * (cheap: it never scans payload bytes) and fills a struct whose pointers point into the
 * received buffer: tensor payloads, strings and vectors are zero copy and stay valid only
 * as long as that buffer does. Small fixed fields (shapes, fingerprints) are copied.
 *
 * Versioning: a frame of another major version fails with STRATA_EVERSION and a message
 * naming both versions; a newer minor is read (its extra fields are skipped); a body of a
 * union member this minor does not know fails with STRATA_EVERSION, never a crash. */
#ifndef STRATA_WIRE_MESSAGE_H
#define STRATA_WIRE_MESSAGE_H

#include <stddef.h>
#include <stdint.h>

#define WIRE_VERSION_MAJOR 1
#define WIRE_VERSION_MINOR 1 /* 1.1: vision stage (Role Vision, image files, VisionBlock/Ack) */
#define WIRE_FILE_IDENTIFIER "STRA"

#define WIRE_MAX_DIMS 8           /* tensor rank limit */
#define WIRE_FINGERPRINT_BYTES 32 /* SHA-256 of config.json + dtype */
#define WIRE_NONCE_BYTES 32       /* Hello challenge */
#define WIRE_PROOF_BYTES 32       /* HMAC-SHA256 */
#define WIRE_PAYLOAD_ALIGN 64     /* where our builder places tensor payloads */
#define WIRE_MAX_DEPTH 64         /* verifier nesting limit */
#define WIRE_MAX_TABLES 1000000   /* verifier table-count limit */

/* The message inside a frame (values equal the schema's union type ids). */
enum wire_kind {
    WIRE_KIND_NONE = 0,
    WIRE_KIND_HELLO = 1,
    WIRE_KIND_ACTIVATION = 2,
    WIRE_KIND_KV_BLOCK = 3,
    WIRE_KIND_TOKEN_RESULT = 4,
    WIRE_KIND_ERROR = 5,
    WIRE_KIND_CONTROL = 6,
    WIRE_KIND_REQUEST = 7,
    WIRE_KIND_VISION_BLOCK = 8, /* 1.1 */
    WIRE_KIND_VISION_ACK = 9    /* 1.1 */
};
#define WIRE_KIND_LAST WIRE_KIND_VISION_ACK /* highest member this build knows */

/* Element type of a tensor's values (schema enum DType). */
enum wire_dtype {
    WIRE_DTYPE_F32 = 0,
    WIRE_DTYPE_BF16 = 1,
    WIRE_DTYPE_F16 = 2,
    WIRE_DTYPE_I64 = 3,
    WIRE_DTYPE_I32 = 4,
    WIRE_DTYPE_U8 = 5
};

/* How the payload encodes the values (schema enum Codec). FP16, BF16 and INT8_ROW apply
 * to F32 tensors only: the payload holds 2-byte floats, or int8 values with one f32 scale
 * per row (a row is the last dimension). */
enum wire_codec {
    WIRE_CODEC_NONE = 0,
    WIRE_CODEC_FP16 = 1,
    WIRE_CODEC_BF16 = 2,
    WIRE_CODEC_INT8_ROW = 3
};

enum wire_role {
    WIRE_ROLE_CLIENT = 0,
    WIRE_ROLE_STAGE = 1,
    WIRE_ROLE_SERVER = 2,
    WIRE_ROLE_VISION = 3 /* 1.1: a vision stage connecting to stage 0 */
};

/* A media file's format as a Request names it (schema enum ImageFormat): the image and
 * video files for a vision stage share one list, in the prompt's order of their pad tokens. */
enum wire_image_format {
    WIRE_IMAGE_UNKNOWN = 0, /* tell from the bytes */
    WIRE_IMAGE_PNG = 1,
    WIRE_IMAGE_JPEG = 2,
    WIRE_IMAGE_MP4 = 3, /* a video: MP4 / MOV */
    WIRE_IMAGE_WEBM = 4 /* a video: Matroska / WebM */
};

/* How a request drafts tokens for speculative decoding (schema enum Speculate). */
enum wire_speculate {
    WIRE_SPECULATE_DEFAULT = 0, /* the stage's --speculate */
    WIRE_SPECULATE_OFF = 1,
    WIRE_SPECULATE_NGRAM = 2, /* model-free: continue an earlier occurrence of the last tokens */
    WIRE_SPECULATE_DRAFT = 3  /* a smaller model with the same tokenizer, on stage 0 */
};
/* The most draft tokens one decode step may carry (Request.speculate_k, Activation draft_ids). */
#define WIRE_SPECULATE_MAX_K 16

enum wire_finish {
    WIRE_FINISH_NONE = 0,
    WIRE_FINISH_STOP = 1,
    WIRE_FINISH_LENGTH = 2,
    WIRE_FINISH_CANCELLED = 3,
    WIRE_FINISH_ERROR = 4
};

enum wire_control_kind {
    WIRE_CONTROL_PING = 0,
    WIRE_CONTROL_PONG = 1,
    WIRE_CONTROL_CANCEL = 2,
    WIRE_CONTROL_DRAIN = 3,
    WIRE_CONTROL_SHUTDOWN = 4,
    WIRE_CONTROL_RESET = 5,    /* recovery: drop every held request, forward (stage_recovery.c) */
    WIRE_CONTROL_DESCRIBE = 6, /* the ring's stages, each appending its own (stage_describe.c) */
    /* prefix reuse: after a Request with cached blocks, round the ring back to stage 0; seq
     * 0 while every stage attached them, 1 once one did not (stage_prefix.c) */
    WIRE_CONTROL_PREFIX_CHECK = 7
};

/* One tensor. On build, `data` points at `nbytes` of payload already in the codec's
 * encoding (see wire/codec.h); on read, `data` and `scales` point into the frame.
 * nbytes must equal numel x wire_codec_value_bytes(dtype, codec). An undefined tensor
 * (defined == 0) is written as absent and read back zeroed. */
struct wire_tensor {
    int defined;
    enum wire_dtype dtype;        /* logical element type */
    int ndim;                     /* 0 .. WIRE_MAX_DIMS */
    int64_t shape[WIRE_MAX_DIMS]; /* each >= 0 */
    enum wire_codec codec;
    const void *data; /* [nbytes]; at least 4-byte aligned when read */
    size_t nbytes;
    const float *scales; /* INT8_ROW: [numel / shape[ndim-1]], else NULL */
    size_t num_scales;
};

/* Connection greeting (see wire/auth.h for the handshake that uses it). */
struct wire_hello {
    uint16_t version_major, version_minor; /* the sender's protocol version */
    int has_fingerprint;
    uint8_t fingerprint[WIRE_FINGERPRINT_BYTES];
    int32_t stage_index;            /* -1 when not a stage */
    int32_t layer_start, layer_end; /* owned layer range [start, end) */
    enum wire_role role;
    int has_challenge;
    uint8_t challenge[WIRE_NONCE_BYTES];
    int has_proof;
    uint8_t proof[WIRE_PROOF_BYTES];
    char name[64]; /* free-form peer name, NUL-terminated */
};

/* One request's rows inside a batched activation (schema struct Segment). */
struct wire_segment {
    uint64_t nonce;
    uint32_t pos;
    uint32_t n_tokens;
};

/* Hidden states handed from stage_from to stage_to. T = total rows, H = hidden size. */
struct wire_activation {
    int32_t stage_from, stage_to;
    uint64_t step;
    uint64_t pos;                      /* first cache position (single request) */
    uint64_t nonce;                    /* request nonce (single request) */
    struct wire_tensor hidden;         /* [T, H] */
    struct wire_tensor attention_mask; /* optional */
    struct wire_tensor position_ids;   /* optional, [T] or [3, T] M-RoPE ids */
    struct wire_tensor visual_mask;    /* optional, [T] u8 */
    struct wire_tensor deepstack;      /* optional, [num_deepstack, T, H] */
    /* Optional segments, 0 = one request (nonce, pos). On build `segments` is an array of
     * num_segments; on read it is NULL and wire_activation_segment() decodes entry i. */
    const struct wire_segment *segments;
    const uint8_t *segments_raw; /* read only: [num_segments][16] little-endian */
    size_t num_segments;
    /* 1.1, speculative decoding: the draft tokens fed in rows 1 .. T - 1 of a decode step
     * (T - 1 of them; absent otherwise). Points into the frame on read. */
    const int32_t *draft_ids;
    size_t num_draft_ids;
    /* 1.1: the id fed in row 0 of a decode step (speculation with several steps in flight),
     * sent when has_fed_id (>= 0); on read has_fed_id says whether it came. */
    int has_fed_id;
    int32_t fed_id;
};

/* Packed KV of a layer range: k and v are [L, B, kv_heads, S, head_dim], L = layer_end -
 * layer_start, with lengths[b] valid positions in row b (the rest zero). */
struct wire_kv_block {
    int32_t stage_from, stage_to;
    uint64_t step;
    uint64_t nonce;
    int32_t layer_start, layer_end;
    const int32_t *lengths; /* [num_lengths] = [B]; points into the frame on read */
    size_t num_lengths;
    struct wire_tensor k;
    struct wire_tensor v;
    int32_t stored_dtype; /* what the packing cache stored (0: f32); k and v are f32 */
};

struct wire_token_result {
    uint64_t nonce;
    uint64_t step;
    const int32_t *tokens; /* [num_tokens] */
    size_t num_tokens;
    const float *logprobs; /* [num_logprobs]: 0 or num_tokens */
    size_t num_logprobs;
    enum wire_finish finish;
    int32_t cached_tokens; /* stage 0 -> client: prompt positions reused from the KV cache */
    /* stage 0 -> client: the request's drafts so far, accepted and rejected (>= 0). */
    int32_t accepted_tokens, rejected_tokens;
    /* stage 0 -> client: the prompt's positions as run (expansions included; 0: unknown). */
    int32_t prompt_tokens;
    /* stage 0 -> later stages, with a finish: the keys of the request's full blocks after its
     * prompt's [num_block_keys] (runtime/stage/stage_prefix_internal.h); 0: none. */
    const uint64_t *block_keys;
    size_t num_block_keys;
};

/* A failed request (nonce != 0), or, with nonce 0, the connection itself: the sender
 * closes the connection after it (nonce 0 is never a request's). */
struct wire_error {
    int32_t code;        /* a STRATA_E* status */
    const char *message; /* NUL-terminated; points into the frame on read */
    uint64_t nonce;
};

/* One stage as it describes itself in a Control Describe (schema table StageInfo). The reader
 * checks 0 <= stage_index < num_stages, 0 <= layer_start <= layer_end, tp, kvp >= 1 and the
 * counts >= 0;
 * strings point into the frame ("" when absent). */
#define WIRE_MAX_DESCRIBE_STAGES 256 /* entries in one Describe */
/* Stage 0's counters since it started (strata.fbs StageInfo): its admission queue (requests
 * that waited, admitted from it, refused full or past their deadline, the admitted ones'
 * total wait) and the prefix cache (prompts looked up, those that reused blocks, the prompt
 * tokens reused and looked up, reuses that fell back to a cold prefill) and speculative
 * decoding (decode steps with drafts, drafts sent, drafts accepted, drafts held back by the
 * budget under load). */
struct wire_stage_totals {
    uint64_t requests_queued, queue_admitted, queue_refused_full, queue_expired, queue_wait_ms;
    uint64_t prefix_lookups, prefix_hits, prefix_cached_tokens, prefix_prompt_tokens,
        prefix_fallbacks;
    uint64_t spec_steps, spec_drafted, spec_accepted, spec_withheld;
};

struct wire_stage_info {
    int32_t stage_index, num_stages;
    int32_t layer_start, layer_end; /* owned decoder layers [layer_start, layer_end) */
    int embed, head, vision;        /* the roles it holds */
    const char *device;             /* the backend's own words ("cpu, 4 threads", "cuda:0, ...") */
    int32_t tp, kvp;                /* grid degrees (1 = none) */
    int32_t threads;
    const char *weights_dtype; /* "bf16", "q8" */
    const char *version;       /* "strata X.Y.Z" */
    int32_t max_seq, max_batch;
    int32_t kv_slots_in_use, queue_depth; /* load when the describe passed the stage */
    int32_t requests_waiting;             /* stage 0: its admission queue then */
    int32_t kv_blocks, kv_blocks_used;    /* the KV pool and the blocks requests hold */
    int32_t kv_blocks_reserved;           /* free blocks promised to running requests */
    int32_t kv_blocks_cached;             /* kept for prefix reuse, held by no request */
    struct wire_stage_totals totals;      /* stage 0's counters (0 elsewhere) */
    const char *next; /* the link onwards as the stage dialled it, "host:port" ("" = down) */
    int front;        /* in front of stage 0, outside the ring: the vision stage */
};

struct wire_control {
    enum wire_control_kind kind;
    uint64_t nonce;
    uint64_t seq;
    /* Describe (1.1, appended): the stages so far, in ring order. On build `stages` is an
     * array of num_stages (0 .. WIRE_MAX_DESCRIBE_STAGES); on read it is NULL and
     * wire_control_stage() decodes entry i. */
    const struct wire_stage_info *stages;
    size_t num_stages;
    const uint8_t *stages_frame; /* read only: the frame and the Control table's position */
    size_t stages_table;
};

/* A client's request (client -> stage 0, then forwarded stage to stage). The reader checks
 * nonce != 0, prompt_len >= 1, max_tokens >= 1 and that temperature / top_p are numbers;
 * limits that depend on the stage (vocabulary, stop-id count, KV length) are the runtime's.
 * On read `prompt` and `stop_ids` point into the frame. */
struct wire_request {
    uint64_t nonce;        /* != 0 (0 is reserved for connection-level errors) */
    const int32_t *prompt; /* [prompt_len] token ids */
    size_t prompt_len;
    int32_t max_tokens;
    float temperature; /* <= 0 means greedy */
    int32_t top_k;     /* <= 0 means no top-k cut */
    float top_p;       /* >= 1 means no nucleus cut (schema default 1.0) */
    uint64_t seed;
    const int32_t *stop_ids; /* [num_stop_ids] */
    size_t num_stop_ids;
    /* Qwen3-VL inputs (all optional; the stage checks them against the model): image grids
     * (t, h, w) in vision patches in prompt order, the merged vision embeddings that replace
     * the image-pad rows, and the DeepStack features. The reader checks only that the grids
     * come in triples; tensors are checked as every tensor is. */
    const int32_t *image_grids; /* [3 * num_images] */
    size_t num_images;
    struct wire_tensor vision_embeds; /* [image tokens, H] */
    struct wire_tensor deepstack;     /* [K, image tokens, H] */
    /* 1.1: image files for a vision stage (optional): num_image_files files, file i is
     * image_file_sizes[i] bytes of image_files (concatenated in prompt order); formats is
     * NULL (all unknown) or [num_image_files]. The reader checks that the sizes add up. */
    const uint8_t *image_files;
    size_t image_files_len;
    const uint32_t *image_file_sizes; /* [num_image_files] */
    size_t num_image_files;
    const uint8_t *image_formats; /* [num_image_files] enum wire_image_format, or NULL */
    /* 1.1, in-flight recovery: tokens generated before a ring break (steps 0..n-1); the request
     * resumes at step n. The reader checks n < max_tokens. */
    const int32_t *resume_tokens; /* [num_resume_tokens] */
    size_t num_resume_tokens;
    /* Prefix reuse: the prompt's full blocks' keys [num_block_keys] (at most prompt_len /
     * 16) and how many leading ones are attached from the cache (cached_blocks x 16 <
     * prompt_len: at least the last prompt row is computed). */
    const uint64_t *block_keys;
    size_t num_block_keys;
    int32_t cached_blocks;
    /* 1.1, speculative decoding (stage 0 reads them): enum wire_speculate and the most draft
     * tokens per step (0: the stage's default). The reader refuses an unknown mode. */
    uint8_t speculate;
    int32_t speculate_k;
};

/* 1.1: one block of a request's vision encoder output (vision stage -> stage 0). The reader
 * checks nonce != 0, index < num_blocks, embeds F32 [n >= 1, H] within total_tokens, and a
 * deepstack, when present, F32 [K, total_tokens, H] in block 0 only. */
struct wire_vision_block {
    uint64_t nonce;
    uint32_t index, num_blocks;
    uint32_t token_start, total_tokens;
    struct wire_tensor embeds;    /* F32 [n, H] */
    struct wire_tensor deepstack; /* block 0 only: F32 [K, total_tokens, H] */
};

/* 1.1: blocks 0 .. next_block - 1 of request `nonce` are held by stage 0. */
struct wire_vision_ack {
    uint64_t nonce;
    uint32_t next_block;
};

/* Fields one table may set in a build (the largest, StageInfo, has 37). */
#define WIRE_MAX_TABLE_FIELDS 64

/* Back-to-front byte buffer the builders write into. */
struct wire_arena {
    uint8_t *buf; /* [cap] */
    size_t cap;
    size_t size;     /* bytes used at the end of buf */
    size_t minalign; /* largest alignment used by the current frame */
    int owns;        /* buf is ours and may grow */
    int in_table;    /* builder state: a table is open */
    size_t table_start;
    int num_fields;
    struct {
        int id;
        size_t off;
    } fields[WIRE_MAX_TABLE_FIELDS];
    uint32_t *vtables; /* [num_vtables] offsets-from-end of written vtables, for sharing */
    size_t num_vtables, vtables_cap;
    int error; /* first failure of the current build (sticky), 0 = none */
};

/* Growable arena with `initial_capacity` bytes (0 picks a small default). */
int wire_arena_init(struct wire_arena *arena, size_t initial_capacity);
/* Arena over a caller buffer [capacity]; building a larger frame fails with STRATA_ENOMEM. */
int wire_arena_init_fixed(struct wire_arena *arena, void *buffer, size_t capacity);
/* Accepts a zeroed or half-built arena. */
void wire_arena_free(struct wire_arena *arena);
/* The finished frame: its first byte and its length (valid until the next build). */
const uint8_t *wire_arena_frame(const struct wire_arena *arena);
size_t wire_arena_frame_len(const struct wire_arena *arena);

/* Builders: reset `arena` and write one complete frame of the current version. They check
 * the message (tensor byte lengths, ranks, dtypes) and fail with STRATA_EINVAL. */
int wire_build_hello(struct wire_arena *arena, const struct wire_hello *msg);
int wire_build_activation(struct wire_arena *arena, const struct wire_activation *msg);
int wire_build_kv_block(struct wire_arena *arena, const struct wire_kv_block *msg);
int wire_build_token_result(struct wire_arena *arena, const struct wire_token_result *msg);
int wire_build_error(struct wire_arena *arena, const struct wire_error *msg);
int wire_build_control(struct wire_arena *arena, const struct wire_control *msg);
int wire_build_request(struct wire_arena *arena, const struct wire_request *msg);
int wire_build_vision_block(struct wire_arena *arena, const struct wire_vision_block *msg);
int wire_build_vision_ack(struct wire_arena *arena, const struct wire_vision_ack *msg);

/* Checks a whole received frame [len] and reports which message it holds. Fails with
 * STRATA_EFORMAT (malformed), STRATA_EVERSION (other major, or a union member unknown
 * to this minor). `version_minor` may be NULL. */
int wire_verify(enum wire_kind *kind, uint16_t *version_minor, const void *frame, size_t len);

/* Readers: verify `frame` and fill `out` (pointers into `frame`). A frame of another
 * kind fails with STRATA_EFORMAT naming both kinds. */
int wire_read_hello(struct wire_hello *out, const void *frame, size_t len);
int wire_read_activation(struct wire_activation *out, const void *frame, size_t len);
int wire_read_kv_block(struct wire_kv_block *out, const void *frame, size_t len);
int wire_read_token_result(struct wire_token_result *out, const void *frame, size_t len);
int wire_read_error(struct wire_error *out, const void *frame, size_t len);
int wire_read_control(struct wire_control *out, const void *frame, size_t len);
int wire_read_request(struct wire_request *out, const void *frame, size_t len);
int wire_read_vision_block(struct wire_vision_block *out, const void *frame, size_t len);
int wire_read_vision_ack(struct wire_vision_ack *out, const void *frame, size_t len);

/* Entry i of a read Control Describe (0 <= i < num_stages; checked by the reader). */
struct wire_stage_info wire_control_stage(const struct wire_control *msg, size_t i);

/* Segment i of a read activation (0 <= i < num_segments). */
struct wire_segment wire_activation_segment(const struct wire_activation *msg, size_t i);

/* Number of elements of a tensor's shape (1 for rank 0); -1 if it overflows int64. */
int64_t wire_tensor_numel(const struct wire_tensor *t);

/* Short names for messages and logs. */
const char *wire_kind_name(enum wire_kind kind);
const char *wire_dtype_name(enum wire_dtype dtype);
const char *wire_codec_name(enum wire_codec codec);

#endif
