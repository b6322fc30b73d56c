/* Ring describe: a client learns what the pipeline is - every stage's layer range, roles,
 * device, grid, threads, weights dtype and build, and its load as the describe passed (KV
 * slots in use, queued work items) - from the stages themselves.
 *
 *   client --Describe(nonce)--> stage 0 --[e0]--> stage 1 --[e0,e1]--> ... --> last
 *   client <--Describe(nonce, [e0..eS-1])-- stage 0 <--[e0..eS-1]-- last (the ring link)
 *
 * Stage 0 numbers each client's describe (`seq` on the ring: stage 0's own counter, so two
 * clients' nonces never collide), appends its own StageInfo and sends it on; every stage
 * appends its own and forwards it; the last stage's NEXT link is the ring link to stage 0,
 * which takes it back by seq, checks that it lists stages 0 .. S-1 in order, and answers the
 * client with the same nonce.
 *
 * Why the request ring and not a side path (stage 0 dialling each stage): the answer then
 * describes exactly the ring that serves requests - the stage each one really forwards to,
 * authenticated by the same Hello and TLS - with no extra ports, connections or credentials,
 * and a broken ring fails the describe as it would fail a request. It cannot disturb requests
 * in flight: it is one small Control frame, handled between microbatches like a Ping (no KV
 * slot, no work item, no request state), queued in order behind what the stage already sent.
 *
 * Never a hang: stage 0 answers at once with an Error when one of its ring links is down
 * (the driver's tick tells it), fails every describe in flight when a ring link goes down,
 * and fails one that has not come back within the driver's timeout (a stage further down
 * stalled or dropped it: a stage whose NEXT link is down drops frames for it). At most
 * STAGE_MAX_DESCRIBES are in flight; more are refused with STRATA_EBUSY. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/base/version.h"
#include "runtime/stage/stage_core_internal.h"

void stage_core_set_describe(struct stage_core *core, int tp, int kvp, int num_threads,
                             const char *weights_dtype) {
    core->describe.tp = tp;
    core->describe.kvp = kvp;
    core->describe.threads = num_threads;
    snprintf(core->describe.dtype, sizeof core->describe.dtype, "%s",
             weights_dtype ? weights_dtype : "");
}

void stage_core_set_next_link(struct stage_core *core, const char *address) {
    snprintf(core->describe.next, sizeof core->describe.next, "%s", address ? address : "");
}

/* The backend's device in words ("cpu, 4 threads"), kept from the first describe. */
static const char *device_words(struct stage_core *core) {
    if (!core->describe.device[0]) {
        struct stage_backend_info info;
        stage_backend_info(core->be, &info);
        stage_backend_device_words(&info, core->describe.device, sizeof core->describe.device);
    }
    return core->describe.device;
}

void stage_core_describe_self(struct stage_core *core, struct wire_stage_info *out) {
    static const char version[] = "strata " STRATA_VERSION;
    const struct stage_role *role = &core->be->role;
    struct stage_core_stats st;
    struct stage_kv_usage kv;
    int queued = 0;
    stage_core_get_stats(core, &st);
    stage_backend_kv_usage(core->be, &kv);
    for (const struct stage_item *it = core->work.head; it; it = it->next)
        queued++;
    *out = (struct wire_stage_info){
        .stage_index = core->opt.stage_index,
        .num_stages = core->opt.num_stages,
        .layer_start = role->layer_start,
        .layer_end = role->layer_end,
        .embed = role->with_embed,
        .head = role->with_head,
        .vision = role->with_vision,
        .device = device_words(core),
        .tp = core->describe.tp > 1 ? core->describe.tp : 1,
        .kvp = core->describe.kvp > 1 ? core->describe.kvp : 1,
        .threads = core->describe.threads > 0 ? core->describe.threads : 0,
        .weights_dtype = core->describe.dtype[0] ? core->describe.dtype : "bf16",
        .version = version,
        .max_seq = core->max_seq,
        .max_batch = core->max_batch,
        .kv_slots_in_use = st.active_requests,
        .queue_depth = queued,
        .requests_waiting = st.queue_depth,
        .kv_blocks = kv.blocks,
        .kv_blocks_used = kv.blocks - kv.free - kv.cached,
        .kv_blocks_cached = kv.cached,
        .kv_blocks_reserved = kv.promised,
        .next = core->describe.next,
        .totals = {.requests_queued = st.queued,
                   .queue_admitted = st.queue_admitted,
                   .queue_refused_full = st.queue_full,
                   .queue_expired = st.queue_expired,
                   .queue_wait_ms = st.queue_waited_ms > 0 ? (uint64_t)st.queue_waited_ms : 0,
                   .prefix_lookups = st.prefix_lookups,
                   .prefix_hits = st.prefix_hits,
                   .prefix_cached_tokens = st.prefix_cached_tokens,
                   .prefix_prompt_tokens = st.prefix_prompt_tokens,
                   .prefix_fallbacks = st.prefix_fallbacks,
                   .spec_steps = st.spec_steps,
                   .spec_drafted = st.spec_drafted,
                   .spec_accepted = st.spec_accepted,
                   .spec_withheld = st.spec_withheld}};
}

/* Emits a Describe carrying `prefix` [n] (read entries or NULL) plus, when `add_self`, this
 * stage's entry. The entries' strings are copied into the frame by the builder. */
static void emit_describe(struct stage_core *core, enum stage_link link, uint32_t client_id,
                          uint64_t nonce, uint64_t seq, const struct wire_control *prefix,
                          int add_self) {
    size_t n = prefix ? prefix->num_stages : 0;
    struct wire_stage_info *all = malloc((n + 1) * sizeof *all); /* rare: not the token path */
    char what[64];
    snprintf(what, sizeof what, "a Describe (stage %d)", core->opt.stage_index);
    if (!all) {
        stage_note_lost(core, what, nonce);
        return;
    }
    for (size_t i = 0; i < n; i++)
        all[i] = wire_control_stage(prefix, i);
    if (add_self) stage_core_describe_self(core, &all[n++]);
    struct wire_control msg = {
        .kind = WIRE_CONTROL_DESCRIBE, .nonce = nonce, .seq = seq, .stages = all, .num_stages = n};
    if (wire_build_control(&core->arena, &msg) < 0 || stage_emit_arena(core, link, client_id) < 0)
        stage_note_lost(core, what, nonce);
    free(all);
}

static void fail_pending(struct stage_core *core, struct stage_describe_pending *p, int code,
                         const char *why) {
    stage_emit_error(core, STAGE_LINK_CLIENT, p->client_id, code, p->nonce, why);
    p->active = 0;
}

/* Stage 0: a client's describe. */
static int from_client(struct stage_core *core, uint32_t client_id,
                       const struct wire_control *msg) {
    char why[200];
    if (msg->nonce == 0)
        return strata_set_error(STRATA_EFORMAT, "stage 0: a Control Describe needs a nonce != 0 "
                                                "(0 is reserved)");
    if (core->opt.num_stages == 1) { /* the whole ring is this stage */
        emit_describe(core, STAGE_LINK_CLIENT, client_id, msg->nonce, 0, NULL, 1);
        return 0;
    }
    if (core->describe.prev_down || core->describe.next_down) {
        snprintf(why, sizeof why, "stage 0: cannot describe the pipeline: the %s is down",
                 core->describe.next_down ? "link to stage 1" : "ring link from the last stage");
        stage_emit_error(core, STAGE_LINK_CLIENT, client_id, STRATA_EPEER, msg->nonce, why);
        return 0;
    }
    struct stage_describe_pending *slot = NULL;
    for (int i = 0; i < STAGE_MAX_DESCRIBES && !slot; i++)
        if (!core->describe.pending[i].active) slot = &core->describe.pending[i];
    if (!slot) {
        snprintf(why, sizeof why, "stage 0: %d describes are in flight already; try again",
                 STAGE_MAX_DESCRIBES);
        stage_emit_error(core, STAGE_LINK_CLIENT, client_id, STRATA_EBUSY, msg->nonce, why);
        return 0;
    }
    *slot = (struct stage_describe_pending){1, ++core->describe.seq, msg->nonce, client_id,
                                            core->clock_ms};
    emit_describe(core, STAGE_LINK_NEXT, 0, msg->nonce, slot->ring_seq, NULL, 1);
    return 0;
}

/* Stage 0: a describe back from the last stage; checks it lists stages 0 .. S-1 in order. */
static void back_round(struct stage_core *core, const struct wire_control *msg) {
    struct stage_describe_pending *p = NULL;
    for (int i = 0; i < STAGE_MAX_DESCRIBES && !p; i++)
        if (core->describe.pending[i].active && core->describe.pending[i].ring_seq == msg->seq)
            p = &core->describe.pending[i];
    if (!p) return; /* failed or timed out already */
    int S = core->opt.num_stages, ok = (int)msg->num_stages == S;
    for (int i = 0; ok && i < S; i++) {
        struct wire_stage_info e = wire_control_stage(msg, (size_t)i);
        ok = e.stage_index == i && e.num_stages == S;
    }
    if (!ok) {
        char why[200];
        snprintf(why, sizeof why,
                 "stage 0: the ring describe came back with %zu entries that are not stages 0 .. "
                 "%d in order (a stage started with another --num-stages?)",
                 msg->num_stages, S - 1);
        fail_pending(core, p, STRATA_EPEER, why);
        return;
    }
    emit_describe(core, STAGE_LINK_CLIENT, p->client_id, p->nonce, 0, msg, 0);
    p->active = 0;
}

int stage_describe_on_control(struct stage_core *core, enum stage_link from, uint32_t client_id,
                              const struct wire_control *msg) {
    if (from == STAGE_LINK_CLIENT && core->is_first) return from_client(core, client_id, msg);
    if (from != STAGE_LINK_PREV) return 0; /* answers travel forward only */
    if (core->is_first) {
        back_round(core, msg);
        return 0;
    }
    if (msg->num_stages >= WIRE_MAX_DESCRIBE_STAGES) return 0; /* stage 0 times it out */
    emit_describe(core, STAGE_LINK_NEXT, 0, msg->nonce, msg->seq, msg, 1);
    return 0;
}

void stage_describe_on_link_down(struct stage_core *core, enum stage_link link, uint32_t client_id,
                                 const char *reason) {
    char why[300];
    if (!core->is_first) return;
    snprintf(why, sizeof why, "stage 0: the describe was lost: the %s went down: %s",
             link == STAGE_LINK_NEXT ? "link to stage 1" : "ring link from the last stage",
             reason ? reason : "closed");
    for (int i = 0; i < STAGE_MAX_DESCRIBES; i++) {
        struct stage_describe_pending *p = &core->describe.pending[i];
        if (!p->active) continue;
        if (link == STAGE_LINK_CLIENT)
            p->active = p->client_id != client_id; /* nobody to answer */
        else
            fail_pending(core, p, STRATA_EPEER, why);
    }
}

int stage_core_describe_tick(struct stage_core *core, int64_t now_ms, int prev_down, int next_down,
                             int timeout_ms) {
    int n = 0;
    char why[300];
    core->clock_ms = now_ms;
    core->describe.prev_down = prev_down;
    core->describe.next_down = next_down;
    for (int i = 0; i < STAGE_MAX_DESCRIBES; i++) {
        struct stage_describe_pending *p = &core->describe.pending[i];
        if (!p->active) continue;
        if (now_ms - p->born_ms > timeout_ms) {
            snprintf(why, sizeof why,
                     "stage 0: the describe did not come back round the ring within %d ms "
                     "(a stage further down is stalled, or its link onwards is down)",
                     timeout_ms);
            fail_pending(core, p, STRATA_ETIMEOUT, why);
        } else {
            n++;
        }
    }
    stage_admission_pump(core); /* the clock moved: deadlines */
    return n;
}
