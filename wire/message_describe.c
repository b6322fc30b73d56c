/* The Control Describe's stage list (wire 1.1, appended): the StageInfo table, its builder
 * and its checks, on message.c's helpers (message_internal.h). Kept apart from message.c so
 * the ring-describe exchange (runtime/stage/stage_describe.c) reads as one piece.
 *
 * Entries are a vector of tables, not of structs, because each carries strings (the device
 * as the backend words it, the weights dtype, the build) and a table can grow fields in a
 * later minor where a struct cannot. */
#include <stddef.h>
#include <string.h>

#include "runtime/base/status.h"
#include "wire/flatbuf.h"
#include "wire/message_internal.h"

enum {
    INFO_STAGE,
    INFO_NUM_STAGES,
    INFO_LAYER_START,
    INFO_LAYER_END,
    INFO_EMBED,
    INFO_HEAD,
    INFO_VISION,
    INFO_DEVICE,
    INFO_TP,
    INFO_KVP,
    INFO_THREADS,
    INFO_WEIGHTS_DTYPE,
    INFO_VERSION,
    INFO_MAX_SEQ,
    INFO_MAX_BATCH,
    INFO_KV_IN_USE,
    INFO_QUEUE_DEPTH,
    INFO_REQUESTS_WAITING,
    INFO_KV_BLOCKS,
    INFO_KV_BLOCKS_USED,
    INFO_KV_BLOCKS_RESERVED,
    INFO_KV_BLOCKS_CACHED,
    INFO_REQUESTS_QUEUED, /* the totals, in struct wire_stage_totals's order */
    INFO_TOTALS_END = INFO_REQUESTS_QUEUED + 10,
    INFO_NEXT = INFO_TOTALS_END, /* appended after the totals */
    INFO_FRONT,
    INFO_SPEC_STEPS, /* appended: the speculation totals, in struct wire_stage_totals's order */
    INFO_FIELDS = INFO_SPEC_STEPS + 4
};
#define NUM_TOTALS 14 /* 10 from INFO_REQUESTS_QUEUED, 4 from INFO_SPEC_STEPS */
#define S4 SCALAR(4)
#define S1 SCALAR(1)
#define STR STRING
#define S8 SCALAR(8)
static const struct fb_field_desc info_fields[] = {
    S4, S4, S4, S4, S1, S1, S1, STR, S4, S4, S4, STR, STR, S4,  S4, S4, S4, S4, S4,
    S4, S4, S4, S8, S8, S8, S8, S8,  S8, S8, S8, S8,  S8,  STR, S1, S8, S8, S8, S8};
const struct fb_table_desc wmsg_stage_info_desc = {"StageInfo", INFO_FIELDS, info_fields};

/* Where each total lives in struct wire_stage_totals, in field order. */
static const size_t totals_offset[NUM_TOTALS] = {
    offsetof(struct wire_stage_totals, requests_queued),
    offsetof(struct wire_stage_totals, queue_admitted),
    offsetof(struct wire_stage_totals, queue_refused_full),
    offsetof(struct wire_stage_totals, queue_expired),
    offsetof(struct wire_stage_totals, queue_wait_ms),
    offsetof(struct wire_stage_totals, prefix_lookups),
    offsetof(struct wire_stage_totals, prefix_hits),
    offsetof(struct wire_stage_totals, prefix_cached_tokens),
    offsetof(struct wire_stage_totals, prefix_prompt_tokens),
    offsetof(struct wire_stage_totals, prefix_fallbacks),
    offsetof(struct wire_stage_totals, spec_steps),
    offsetof(struct wire_stage_totals, spec_drafted),
    offsetof(struct wire_stage_totals, spec_accepted),
    offsetof(struct wire_stage_totals, spec_withheld)};

static uint64_t *total(struct wire_stage_totals *t, int i) {
    return (uint64_t *)(void *)((char *)t + totals_offset[i]);
}

/* Total i's field: the first ten follow one another, the later ones were appended after
 * other fields. */
static int total_field(int i) {
    const int first = INFO_TOTALS_END - INFO_REQUESTS_QUEUED;
    return i < first ? INFO_REQUESTS_QUEUED + i : INFO_SPEC_STEPS + (i - first);
}

static int check_info(const struct wire_stage_info *s, size_t i, int code) {
    if (s->num_stages < 1 || s->stage_index < 0 || s->stage_index >= s->num_stages ||
        s->layer_start < 0 || s->layer_end < s->layer_start || s->tp < 1 || s->kvp < 1 ||
        s->threads < 0 || s->max_seq < 0 || s->max_batch < 0 || s->kv_slots_in_use < 0 ||
        s->queue_depth < 0 || s->requests_waiting < 0 || s->kv_blocks < 0 ||
        s->kv_blocks_used < 0 || s->kv_blocks_reserved < 0 || s->kv_blocks_used > s->kv_blocks ||
        s->kv_blocks_cached < 0 ||
        (int64_t)s->kv_blocks_reserved + s->kv_blocks_cached >
            (int64_t)s->kv_blocks - s->kv_blocks_used)
        return strata_set_error(
            code,
            "wire: Control Describe entry %zu: stage %d of %d, layers [%d, %d), "
            "tp %d, kvp %d, threads %d, max_seq %d, max_batch %d, kv blocks %d (%d used, %d "
            "reserved) out of range",
            i, (int)s->stage_index, (int)s->num_stages, (int)s->layer_start, (int)s->layer_end,
            (int)s->tp, (int)s->kvp, (int)s->threads, (int)s->max_seq, (int)s->max_batch,
            (int)s->kv_blocks, (int)s->kv_blocks_used, (int)s->kv_blocks_reserved);
    return 0;
}

static uint32_t string_of(struct wire_arena *a, const char *s) {
    return s && *s ? fb_string(a, s, strlen(s)) : 0;
}

uint32_t wmsg_build_stages(struct wire_arena *a, const struct wire_control *m) {
    uint32_t tables[WIRE_MAX_DESCRIBE_STAGES];
    if (!m->num_stages) return 0;
    if (m->num_stages > WIRE_MAX_DESCRIBE_STAGES || !m->stages) {
        if (!a->error)
            a->error = strata_set_error(STRATA_EINVAL,
                                        "wire: Control Describe with %zu stages "
                                        "(at most %d)",
                                        m->num_stages, WIRE_MAX_DESCRIBE_STAGES);
        return 0;
    }
    for (size_t i = 0; i < m->num_stages; i++) {
        const struct wire_stage_info *s = &m->stages[i];
        if (check_info(s, i, STRATA_EINVAL) < 0) {
            if (!a->error) a->error = STRATA_EINVAL;
            return 0;
        }
        uint32_t device = string_of(a, s->device), dtype = string_of(a, s->weights_dtype),
                 version = string_of(a, s->version), next = string_of(a, s->next);
        fb_table_start(a);
        fb_add_u32(a, INFO_STAGE, (uint32_t)s->stage_index, 0);
        fb_add_u32(a, INFO_NUM_STAGES, (uint32_t)s->num_stages, 0);
        fb_add_u32(a, INFO_LAYER_START, (uint32_t)s->layer_start, 0);
        fb_add_u32(a, INFO_LAYER_END, (uint32_t)s->layer_end, 0);
        fb_add_offset(a, INFO_DEVICE, device);
        fb_add_u32(a, INFO_TP, (uint32_t)s->tp, 1);
        fb_add_u32(a, INFO_KVP, (uint32_t)s->kvp, 1);
        fb_add_u32(a, INFO_THREADS, (uint32_t)s->threads, 0);
        fb_add_offset(a, INFO_WEIGHTS_DTYPE, dtype);
        fb_add_offset(a, INFO_VERSION, version);
        fb_add_offset(a, INFO_NEXT, next);
        fb_add_u32(a, INFO_MAX_SEQ, (uint32_t)s->max_seq, 0);
        fb_add_u32(a, INFO_MAX_BATCH, (uint32_t)s->max_batch, 0);
        fb_add_u32(a, INFO_KV_IN_USE, (uint32_t)s->kv_slots_in_use, 0);
        fb_add_u32(a, INFO_QUEUE_DEPTH, (uint32_t)s->queue_depth, 0);
        fb_add_u32(a, INFO_REQUESTS_WAITING, (uint32_t)s->requests_waiting, 0);
        fb_add_u32(a, INFO_KV_BLOCKS, (uint32_t)s->kv_blocks, 0);
        fb_add_u32(a, INFO_KV_BLOCKS_USED, (uint32_t)s->kv_blocks_used, 0);
        fb_add_u32(a, INFO_KV_BLOCKS_RESERVED, (uint32_t)s->kv_blocks_reserved, 0);
        fb_add_u32(a, INFO_KV_BLOCKS_CACHED, (uint32_t)s->kv_blocks_cached, 0);
        struct wire_stage_totals t = s->totals;
        for (int k = 0; k < NUM_TOTALS; k++)
            fb_add_u64(a, total_field(k), *total(&t, k), 0);
        fb_add_u8(a, INFO_EMBED, s->embed != 0, 0);
        fb_add_u8(a, INFO_HEAD, s->head != 0, 0);
        fb_add_u8(a, INFO_VISION, s->vision != 0, 0);
        fb_add_u8(a, INFO_FRONT, s->front != 0, 0);
        tables[i] = fb_table_end(a);
    }
    return fb_offset_vector(a, tables, m->num_stages);
}

static const char *get_string(const struct fb_table *t, int id) {
    size_t len;
    const char *s = (const char *)fb_get_vector(t, id, &len);
    return s ? s : "";
}

static struct wire_stage_info parse_info(const struct fb_table *e) {
    struct wire_stage_info s =
        (struct wire_stage_info){.stage_index = wmsg_get_i32(e, INFO_STAGE, 0),
                                 .num_stages = wmsg_get_i32(e, INFO_NUM_STAGES, 0),
                                 .layer_start = wmsg_get_i32(e, INFO_LAYER_START, 0),
                                 .layer_end = wmsg_get_i32(e, INFO_LAYER_END, 0),
                                 .embed = fb_get_scalar(e, INFO_EMBED, 1, 0) != 0,
                                 .head = fb_get_scalar(e, INFO_HEAD, 1, 0) != 0,
                                 .vision = fb_get_scalar(e, INFO_VISION, 1, 0) != 0,
                                 .device = get_string(e, INFO_DEVICE),
                                 .tp = wmsg_get_i32(e, INFO_TP, 1),
                                 .kvp = wmsg_get_i32(e, INFO_KVP, 1),
                                 .threads = wmsg_get_i32(e, INFO_THREADS, 0),
                                 .weights_dtype = get_string(e, INFO_WEIGHTS_DTYPE),
                                 .version = get_string(e, INFO_VERSION),
                                 .max_seq = wmsg_get_i32(e, INFO_MAX_SEQ, 0),
                                 .max_batch = wmsg_get_i32(e, INFO_MAX_BATCH, 0),
                                 .kv_slots_in_use = wmsg_get_i32(e, INFO_KV_IN_USE, 0),
                                 .queue_depth = wmsg_get_i32(e, INFO_QUEUE_DEPTH, 0),
                                 .requests_waiting = wmsg_get_i32(e, INFO_REQUESTS_WAITING, 0),
                                 .kv_blocks = wmsg_get_i32(e, INFO_KV_BLOCKS, 0),
                                 .kv_blocks_used = wmsg_get_i32(e, INFO_KV_BLOCKS_USED, 0),
                                 .kv_blocks_reserved = wmsg_get_i32(e, INFO_KV_BLOCKS_RESERVED, 0),
                                 .kv_blocks_cached = wmsg_get_i32(e, INFO_KV_BLOCKS_CACHED, 0),
                                 .next = get_string(e, INFO_NEXT),
                                 .front = fb_get_scalar(e, INFO_FRONT, 1, 0) != 0};
    for (int k = 0; k < NUM_TOTALS; k++)
        *total(&s.totals, k) = fb_get_scalar(e, total_field(k), 8, 0);
    return s;
}

int wmsg_parse_control_stages(struct wire_control *out, const struct fb_table *t, int id) {
    size_t n;
    fb_get_vector(t, id, &n);
    if (n > WIRE_MAX_DESCRIBE_STAGES)
        return strata_set_error(STRATA_EFORMAT,
                                "wire: Control Describe with %zu stages (at most %d)", n,
                                WIRE_MAX_DESCRIBE_STAGES);
    out->num_stages = n;
    out->stages_frame = t->buf;
    out->stages_table = t->pos;
    for (size_t i = 0; i < n; i++) {
        struct fb_table e;
        fb_get_vector_table(&e, t, id, i);
        struct wire_stage_info s = parse_info(&e);
        int rc = check_info(&s, i, STRATA_EFORMAT);
        if (rc) return rc;
    }
    return 0;
}

struct wire_stage_info wire_control_stage(const struct wire_control *msg, size_t i) {
    struct fb_table t, e;
    fb_table_at(&t, msg->stages_frame, msg->stages_table);
    fb_get_vector_table(&e, &t, WMSG_CONTROL_STAGES, i);
    return parse_info(&e);
}
