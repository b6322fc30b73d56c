/* The simulator's coordinator (see pipeline_sim.h): builds S stage cores on their threads,
 * wires them with simulated links, and runs the discrete-event loop until every request
 * has finished or failed and no event is left.
 *
 * Node numbering: stages 0 .. S-1, the client is node S (so it sorts last on ties).
 * Link numbering: connection c (stage c to stage (c+1) mod S, S > 1) has forward link 2c
 * and backward link 2c+1; the client connection has links 2S (client -> stage 0) and
 * 2S+1 (stage 0 -> client).
 * This file is the run itself (the event loop and what each event does); checking the
 * options, building and tearing down the stages and summarising the report are
 * sim_setup.c, and the state both share is pipeline_sim_internal.h. */
#include "sim/pipeline_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/stage/request.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_open.h"
#include "sim/pipeline_sim_internal.h"
#include "sim/sim_grid.h"
#include "sim/stage_thread.h"
#include "sim/virtual_clock.h"
#include "wire/message.h"

enum sim_event_kind {
    EV_FRAME = 1,     /* arg = link the receiver sees it on; data = frame */
    EV_STEP_DONE = 2, /* a stage's compute step ends */
    EV_KILL = 3,      /* a stage dies */
    EV_LINK_DOWN = 4  /* arg = link; data = reason (NUL-terminated) */
};

#define SIM_MAX_EVENTS 50000000ull

void sim_record_protocol_error(struct sim *sim, const char *what) {
    if (sim->report->protocol_errors++ == 0)
        snprintf(sim->report->first_protocol_error, sizeof sim->report->first_protocol_error, "%s",
                 what);
}

/* ---- client ------------------------------------------------------------------------ */

static struct sim_request_outcome *outcome_for(struct sim *sim, uint64_t nonce) {
    if (nonce < 1 || nonce > (uint64_t)sim->opt->num_requests) return NULL;
    return &sim->report->requests[nonce - 1];
}

static int client_send(struct sim *sim, int index);

static void client_finish(struct sim *sim, int index, int status, const char *message) {
    struct client_request *c = &sim->client[index];
    struct sim_request_outcome *o = &sim->report->requests[index];
    if (c->done) return;
    c->done = 1;
    sim->requests_left--;
    o->done_ns = sim->clock.now_ns;
    o->status = status;
    if (message) snprintf(o->message, sizeof o->message, "%s", message);
    /* The requests that follow this one go now, or fail with it. */
    for (int j = index + 1; j < sim->opt->num_requests; j++) {
        if (sim->opt->requests[j].after != index + 1) continue;
        if (status != 0 || sim->client_link_down) {
            char why[600];
            snprintf(why, sizeof why, "request %d, which it follows, failed: %.500s", index + 1,
                     o->message);
            client_finish(sim, j, status ? status : STRATA_ECLOSED, why);
        } else if (!sim->client_error) {
            int rc = client_send(sim, j);
            if (rc < 0) sim->client_error = rc;
        }
    }
}

static void client_on_frame(struct sim *sim, const uint8_t *frame, size_t len) {
    struct request_event ev;
    if (request_event_decode(&ev, frame, len) < 0) {
        sim_record_protocol_error(sim, strata_last_error());
        return;
    }
    if (ev.kind == REQUEST_EVENT_CONNECTION_ERROR) { /* nonce 0: about the connection */
        char what[512];
        snprintf(what, sizeof what, "stage 0 reported a connection error: %.400s", ev.message);
        sim_record_protocol_error(sim, what);
        return;
    }
    struct sim_request_outcome *o = outcome_for(sim, ev.nonce);
    if (!o) {
        sim_record_protocol_error(sim, "client received an event for an unknown request nonce");
        return;
    }
    int index = (int)(ev.nonce - 1);
    if (sim->client[index].done) return;
    if (ev.kind == REQUEST_EVENT_ERROR) {
        client_finish(sim, index, ev.code < 0 ? ev.code : STRATA_EPEER, ev.message);
        return;
    }
    if (ev.step != (uint64_t)o->n_tokens) {
        char what[160];
        snprintf(what, sizeof what, "request %llu: token for step %llu arrived, expected %d",
                 (unsigned long long)ev.nonce, (unsigned long long)ev.step, o->n_tokens);
        sim_record_protocol_error(sim, what);
        client_finish(sim, index, STRATA_EFORMAT, what);
        return;
    }
    int cap = sim->opt->requests[index].max_tokens;
    if (o->n_tokens >= cap) {
        sim_record_protocol_error(sim, "client received more tokens than max_tokens");
        client_finish(sim, index, STRATA_EFORMAT, "more tokens than max_tokens");
        return;
    }
    o->tokens[o->n_tokens++] = ev.token;
    if (!sim->client[index].got_first) {
        sim->client[index].got_first = 1;
        o->cached_tokens = ev.cached_tokens;
        o->ttft_ns = sim->clock.now_ns - o->sent_ns;
    }
    if (ev.finish != WIRE_FINISH_NONE) {
        o->finish = (int)ev.finish;
        if (ev.finish == WIRE_FINISH_STOP || ev.finish == WIRE_FINISH_LENGTH)
            client_finish(sim, index, 0, NULL);
        else
            client_finish(sim, index, STRATA_EPEER, "request ended with finish cancelled/error");
    }
}

static void client_on_link_down(struct sim *sim, const char *reason) {
    sim->client_link_down = 1;
    for (int i = 0; i < sim->opt->num_requests; i++) {
        char message[512];
        snprintf(message, sizeof message, "connection to stage 0 lost: %s", reason);
        client_finish(sim, i, STRATA_ECLOSED, message);
    }
}

/* ---- links ------------------------------------------------------------------------- */

/* Queues "stage `node` (or the client when node == S) learns its `link` is dead". */
static int schedule_link_down(struct sim *sim, int node, enum stage_link link, int64_t at_ns,
                              const char *reason) {
    if (node < sim->num_stages) {
        struct sim_stage *st = &sim->stages[node];
        if (st->dead || st->link_down[link] || st->link_down_pending[link]) return 0;
        st->link_down_pending[link] = 1;
    }
    size_t len = strlen(reason) + 1;
    char *copy = malloc(len);
    if (!copy) return strata_set_error(STRATA_ENOMEM, "simulator: out of memory");
    memcpy(copy, reason, len);
    if (at_ns < sim->clock.now_ns) at_ns = sim->clock.now_ns;
    int rc = vclock_schedule(&sim->clock, at_ns, node, EV_LINK_DOWN, link, copy, len, NULL);
    if (rc < 0) free(copy);
    return rc;
}

/* Sends a frame from stage r on `link` at virtual time now; takes ownership of data. */
static int stage_send(struct sim *sim, int r, enum stage_link link, uint8_t *data, size_t len) {
    int S = sim->num_stages;
    struct sim_stage *st = &sim->stages[r];
    struct sim_link *wire_link;
    int dest;
    enum stage_link dest_link;
    if (link == STAGE_LINK_LOCAL) { /* KvBlocks for a driver's --kv-out: not simulated */
        free(data);
        return 0;
    }
    if (link != STAGE_LINK_CLIENT && S == 1) {
        free(data);
        sim_record_protocol_error(sim, "a single-stage core sent a frame to another stage");
        return 0;
    }
    if (link == STAGE_LINK_CLIENT && r != 0) {
        free(data);
        sim_record_protocol_error(sim, "a stage other than 0 sent a frame to the client");
        return 0;
    }
    if (st->link_down[link]) {
        free(data);
        return 0;
    }
    switch (link) {
    case STAGE_LINK_NEXT:
        wire_link = &sim->links[2 * r];
        dest = (r + 1) % S;
        dest_link = STAGE_LINK_PREV;
        break;
    case STAGE_LINK_PREV:
        dest = (r + S - 1) % S;
        wire_link = &sim->links[2 * dest + 1];
        dest_link = STAGE_LINK_NEXT;
        break;
    default:
        wire_link = &sim->links[2 * S + 1];
        dest = S;
        dest_link = STAGE_LINK_CLIENT;
        break;
    }
    int64_t arrival;
    int rc = sim_link_send(wire_link, &arrival, sim->clock.now_ns, len);
    if (rc < 0) {
        free(data);
        char reason[400];
        snprintf(reason, sizeof reason, "stage %d: %s", r, strata_last_error());
        return schedule_link_down(sim, r, link, arrival, reason);
    }
    sim->report->stages[r].frames_out++;
    sim->report->stages[r].bytes_out += len;
    rc = vclock_schedule(&sim->clock, arrival, dest, EV_FRAME, dest_link, data, len, NULL);
    if (rc < 0) free(data);
    return rc;
}

/* ---- stages ------------------------------------------------------------------------ */

/* Sends every frame the core has queued and collects its finished-request records. */
static int stage_flush(struct sim *sim, int r) {
    struct sim_stage *st = &sim->stages[r];
    struct stage_frame frame;
    while (stage_core_pop_frame(st->core, &frame) == 1) {
        /* The core's frame bytes are reused by its next call; the simulated link keeps a
         * copy until delivery. */
        uint8_t *copy = malloc(frame.len ? frame.len : 1);
        if (!copy) return strata_set_error(STRATA_ENOMEM, "simulator: out of memory");
        memcpy(copy, frame.data, frame.len);
        int rc = stage_send(sim, r, frame.link, copy, frame.len);
        if (rc < 0) return rc;
    }
    struct stage_result result;
    while (stage_core_pop_result(st->core, &result) == 1) {
        struct sim_request_outcome *o = outcome_for(sim, result.nonce);
        if (o && r == sim->num_stages - 1) {
            int index = (int)(result.nonce - 1);
            if (result.logits && !o->logits) {
                o->logits = result.logits;
                o->vocab = result.vocab;
                result.logits = NULL;
            }
            if (result.tokens && !sim->last_tokens[index]) {
                sim->last_tokens[index] = result.tokens;
                sim->last_n_tokens[index] = result.n_tokens;
                result.tokens = NULL;
            }
        }
        stage_result_free(&result);
    }
    return 0;
}

static int stage_step_call(void *arg) {
    struct sim_stage *st = arg;
    st->step_result = stage_core_step(st->core);
    return 0;
}

/* SIM_COMPUTE_MODEL's charge for a step of stage r (the core's counters before and after
 * it): its rows through the stage's layers, `head_rows` of them through the head (the rows the
 * last stage sampled: one TokenResult each), and the attention they ran, as strata-plan
 * --predict prices a step (perf_stage_step_sec). */
static int64_t model_step_ns(const struct sim *sim, const struct sim_stage *st,
                             const struct stage_core_stats *before,
                             const struct stage_core_stats *after, uint64_t head_rows) {
    const struct stage_range r = {st->open.layer_start, st->open.layer_end};
    const double sec = perf_stage_step_sec(
        sim->opt->perf, &r, &sim->device, (double)(after->rows - before->rows), (double)head_rows,
        (double)(after->attn_decode_positions - before->attn_decode_positions),
        (double)(after->attn_prefill_rows - before->attn_prefill_rows),
        (double)(after->attn_prefill_pairs - before->attn_prefill_pairs),
        (double)ops_kv_elem_bytes(sim->opt->kv_dtype));
    return (int64_t)(1e9 * sec);
}

/* Starts a compute step if the stage is idle and has work; its end is an EV_STEP_DONE. */
static int stage_maybe_step(struct sim *sim, int r) {
    struct sim_stage *st = &sim->stages[r];
    if (st->dead || st->busy || !stage_core_has_work(st->core)) return 0;
    struct stage_core_stats before, after;
    stage_core_get_stats(st->core, &before);
    int rc = stage_thread_call(&st->thread, stage_step_call, st);
    if (rc < 0) return rc;
    stage_core_get_stats(st->core, &after);
    if (st->step_result < 0) {
        char what[400];
        snprintf(what, sizeof what, "stage %d step failed: %s", r, strata_last_error());
        sim_record_protocol_error(sim, what);
    }
    struct sim_stage_stats *stats = &sim->report->stages[r];
    uint64_t rows = after.rows - before.rows;
    int64_t charged;
    switch (sim->opt->compute) {
    case SIM_COMPUTE_CPU: charged = st->thread.cpu_ns; break;
    case SIM_COMPUTE_FIXED:
        charged = (int64_t)rows * (st->open.layer_end - st->open.layer_start) *
                  sim->opt->row_layer_cost_ns;
        break;
    case SIM_COMPUTE_MODEL:
        charged = model_step_ns(sim, st, &before, &after,
                                st->open.layer_end == sim->opt->cfg->num_layers
                                    ? after.frames_out - before.frames_out
                                    : 0);
        break;
    default: charged = st->thread.wall_ns; break;
    }
    if (stats->steps == 0)
        stats->first_step_ns = sim->clock.now_ns;
    else
        stats->gap_ns += sim->clock.now_ns - stats->last_step_end_ns;
    stats->last_step_end_ns = sim->clock.now_ns + charged;
    stats->steps++;
    stats->rows += rows;
    stats->busy_ns += charged;
    stats->wall_ns += st->thread.wall_ns;
    stats->cpu_ns += st->thread.cpu_ns;
    st->busy = 1;
    return vclock_schedule(&sim->clock, sim->clock.now_ns + charged, r, EV_STEP_DONE, 0, NULL, 0,
                           NULL);
}

/* Hands one frame or link failure to an idle stage's core. Takes ownership of `data`. */
static int stage_deliver(struct sim *sim, int r, int is_link_down, enum stage_link link,
                         uint8_t *data, size_t len) {
    struct sim_stage *st = &sim->stages[r];
    if (is_link_down) {
        stage_core_on_link_down(st->core, link, 0, (const char *)data);
    } else if (!st->link_down[link]) {
        if (stage_core_on_frame(st->core, link, 0, data, len) < 0) {
            char what[400];
            snprintf(what, sizeof what, "stage %d refused a frame: %s", r, strata_last_error());
            sim_record_protocol_error(sim, what);
            st->link_down[link] = 1;
            stage_core_on_link_down(st->core, link, 0, what);
        }
    }
    free(data);
    return stage_flush(sim, r);
}

static int stage_enqueue(struct sim_stage *st, int is_link_down, enum stage_link link,
                         uint8_t *data, size_t len) {
    struct inbox_item *item = calloc(1, sizeof *item);
    if (!item) {
        free(data);
        return strata_set_error(STRATA_ENOMEM, "simulator: out of memory");
    }
    item->is_link_down = is_link_down;
    item->link = link;
    item->data = data;
    item->len = len;
    if (st->inbox_tail)
        st->inbox_tail->next = item;
    else
        st->inbox_head = item;
    st->inbox_tail = item;
    return 0;
}

void sim_stage_clear_inbox(struct sim_stage *st) {
    while (st->inbox_head) {
        struct inbox_item *item = st->inbox_head;
        st->inbox_head = item->next;
        free(item->data);
        free(item);
    }
    st->inbox_tail = NULL;
}

static int on_step_done(struct sim *sim, int r) {
    struct sim_stage *st = &sim->stages[r];
    st->busy = 0;
    int rc = stage_flush(sim, r);
    while (rc == 0 && st->inbox_head) {
        struct inbox_item *item = st->inbox_head;
        st->inbox_head = item->next;
        if (!st->inbox_head) st->inbox_tail = NULL;
        rc = stage_deliver(sim, r, item->is_link_down, item->link, item->data, item->len);
        free(item);
    }
    if (rc < 0) return rc;
    return stage_maybe_step(sim, r);
}

static int on_kill(struct sim *sim, int r) {
    int S = sim->num_stages;
    struct sim_stage *st = &sim->stages[r];
    int64_t now = sim->clock.now_ns;
    int64_t notice = now + sim->opt->link.latency_ns;
    char reason[160];
    snprintf(reason, sizeof reason, "stage %d was killed at %.3f ms (connection reset)", r,
             (double)now / 1e6);
    st->dead = 1;
    st->busy = 0;
    sim_stage_clear_inbox(st);
    vclock_cancel(&sim->clock, r, -1);
    int rc = 0;
    if (S > 1) {
        int next = (r + 1) % S, prev = (r + S - 1) % S;
        sim_link_close(&sim->links[2 * r], now);
        sim_link_close(&sim->links[2 * r + 1], now);
        sim_link_close(&sim->links[2 * prev], now);
        sim_link_close(&sim->links[2 * prev + 1], now);
        rc = schedule_link_down(sim, next, STAGE_LINK_PREV, notice, reason);
        if (rc == 0) rc = schedule_link_down(sim, prev, STAGE_LINK_NEXT, notice, reason);
    }
    if (rc == 0 && r == 0) {
        sim_link_close(&sim->links[2 * S], now);
        sim_link_close(&sim->links[2 * S + 1], now);
        rc = schedule_link_down(sim, S, STAGE_LINK_CLIENT, notice, reason);
    }
    return rc;
}

/* A partition of stage r at time t: every link touching r loses everything from t, and
 * both ends of each of its connections notice the silent peer after peer_timeout_ns. */
static int setup_partition(struct sim *sim, int r, int64_t at_ns) {
    int S = sim->num_stages;
    int64_t notice = at_ns + sim->opt->peer_timeout_ns;
    char reason[200];
    snprintf(reason, sizeof reason,
             "peer unreachable: stage %d partitioned at %.3f ms, no keepalive answer for %.0f ms",
             r, (double)at_ns / 1e6, (double)sim->opt->peer_timeout_ns / 1e6);
    int rc = 0;
    if (S > 1) {
        int next = (r + 1) % S, prev = (r + S - 1) % S;
        int conns[2] = {r, prev};
        for (int i = 0; i < 2; i++) {
            sim_link_partition(&sim->links[2 * conns[i]], at_ns, INT64_MAX);
            sim_link_partition(&sim->links[2 * conns[i] + 1], at_ns, INT64_MAX);
        }
        if (rc == 0) rc = schedule_link_down(sim, r, STAGE_LINK_NEXT, notice, reason);
        if (rc == 0) rc = schedule_link_down(sim, r, STAGE_LINK_PREV, notice, reason);
        if (rc == 0) rc = schedule_link_down(sim, next, STAGE_LINK_PREV, notice, reason);
        if (rc == 0) rc = schedule_link_down(sim, prev, STAGE_LINK_NEXT, notice, reason);
    }
    if (rc == 0 && r == 0) {
        sim_link_partition(&sim->links[2 * S], at_ns, INT64_MAX);
        sim_link_partition(&sim->links[2 * S + 1], at_ns, INT64_MAX);
        rc = schedule_link_down(sim, 0, STAGE_LINK_CLIENT, notice, reason);
        if (rc == 0) rc = schedule_link_down(sim, S, STAGE_LINK_CLIENT, notice, reason);
    }
    return rc;
}

/* ---- event loop -------------------------------------------------------------------- */

static int on_event(struct sim *sim, struct sim_event *ev) {
    int S = sim->num_stages;
    uint8_t *data = ev->data;
    if (ev->stage == S) { /* the client */
        if (ev->kind == EV_FRAME && !sim->client_link_down)
            client_on_frame(sim, data, ev->len);
        else if (ev->kind == EV_LINK_DOWN && !sim->client_link_down)
            client_on_link_down(sim, (const char *)data);
        free(data);
        return 0;
    }
    struct sim_stage *st = &sim->stages[ev->stage];
    if (st->dead) {
        free(data);
        return 0;
    }
    switch (ev->kind) {
    case EV_FRAME:
        if (st->link_down[ev->arg]) {
            free(data);
            return 0;
        }
        if (st->busy) return stage_enqueue(st, 0, (enum stage_link)ev->arg, data, ev->len);
        {
            int rc = stage_deliver(sim, ev->stage, 0, (enum stage_link)ev->arg, data, ev->len);
            return rc < 0 ? rc : stage_maybe_step(sim, ev->stage);
        }
    case EV_LINK_DOWN:
        st->link_down_pending[ev->arg] = 0;
        if (st->link_down[ev->arg]) {
            free(data);
            return 0;
        }
        st->link_down[ev->arg] = 1;
        if (st->busy) return stage_enqueue(st, 1, (enum stage_link)ev->arg, data, ev->len);
        {
            int rc = stage_deliver(sim, ev->stage, 1, (enum stage_link)ev->arg, data, ev->len);
            return rc < 0 ? rc : stage_maybe_step(sim, ev->stage);
        }
    case EV_STEP_DONE: free(data); return on_step_done(sim, ev->stage);
    case EV_KILL: free(data); return on_kill(sim, ev->stage);
    default:
        free(data);
        return strata_set_error(STRATA_EINVAL, "simulator: unknown event kind %d", ev->kind);
    }
}

/* The client sends request `index` now. */
static int client_send(struct sim *sim, int index) {
    const struct sim_request_spec *spec = &sim->opt->requests[index];
    struct stage_request req;
    struct wire_arena arena;
    int rc = wire_arena_init(&arena, 0);
    if (rc < 0) return rc;
    sim->report->requests[index].sent_ns = sim->clock.now_ns;
    memset(&req, 0, sizeof req);
    req.nonce = (uint64_t)index + 1;
    req.prompt = spec->prompt;
    req.prompt_len = spec->prompt_len;
    int32_t *turn = NULL; /* a next turn's prompt: its first's and that one's answer */
    if (spec->answer_tokens > 0) {
        const struct sim_request_spec *first = &sim->opt->requests[spec->after - 1];
        const struct sim_request_outcome *fo = &sim->report->requests[spec->after - 1];
        const int a = spec->answer_tokens < fo->n_tokens ? spec->answer_tokens : fo->n_tokens;
        if (!(turn = malloc(sizeof *turn * (size_t)(first->prompt_len + a)))) {
            wire_arena_free(&arena);
            return strata_set_error(STRATA_ENOMEM, "simulator: out of memory");
        }
        memcpy(turn, first->prompt, sizeof *turn * (size_t)first->prompt_len);
        memcpy(turn + first->prompt_len, fo->tokens, sizeof *turn * (size_t)a);
        req.prompt = turn;
        req.prompt_len = first->prompt_len + a;
    }
    sim->report->requests[index].prompt_len = req.prompt_len;
    req.max_tokens = spec->max_tokens;
    req.num_stop_ids = spec->num_stop_ids;
    for (int k = 0; k < spec->num_stop_ids && k < REQUEST_MAX_STOP_IDS; k++)
        req.stop_ids[k] = spec->stop_ids[k];
    req.sampling = spec->sampling;
    req.vision = spec->vision;
    rc = request_build(&arena, &req);
    free(turn);
    size_t len = rc == 0 ? wire_arena_frame_len(&arena) : 0;
    uint8_t *copy = rc == 0 ? malloc(len) : NULL;
    if (rc == 0 && !copy) rc = strata_set_error(STRATA_ENOMEM, "simulator: out of memory");
    if (rc == 0) memcpy(copy, wire_arena_frame(&arena), len);
    wire_arena_free(&arena);
    if (rc < 0) return rc;
    int64_t arrival;
    if (sim_link_send(&sim->links[2 * sim->num_stages], &arrival, sim->clock.now_ns, len) < 0) {
        /* The client learns that stage 0 is unreachable when its sends give up. */
        free(copy);
        char reason[400];
        snprintf(reason, sizeof reason, "request %d not delivered: %s", index + 1,
                 strata_last_error());
        return schedule_link_down(sim, sim->num_stages, STAGE_LINK_CLIENT, arrival, reason);
    }
    rc = vclock_schedule(&sim->clock, arrival, 0, EV_FRAME, STAGE_LINK_CLIENT, copy, len, NULL);
    if (rc < 0) free(copy);
    return rc;
}

/* The client sends every request that follows none at virtual time 0, in nonce order. */
static int client_send_requests(struct sim *sim) {
    int rc = 0;
    for (int i = 0; i < sim->opt->num_requests && rc == 0; i++)
        if (sim->opt->requests[i].after == 0) rc = client_send(sim, i);
    return rc;
}

int sim_run(struct sim_report *report, const struct sim_options *opt) {
    struct sim sim;
    memset(report, 0, sizeof *report);
    int rc = sim_check_options(opt);
    if (rc < 0) return rc;
    rc = sim_setup(&sim, report, opt);
    if (rc == 0 && opt->profile) {
        sim.device = *opt->profile;
        if (opt->tp > 1 || opt->kvp > 1) /* the group's link, for KVP alone too */
            perf_device_set_tp(&sim.device, opt->tp > 1 ? opt->tp : 1, NULL);
        if (opt->kvp > 1)
            perf_device_set_kvp(&sim.device, opt->kvp, sim.kvp_tokens, sim.max_seq,
                                sim.decode_context);
    }
    if (rc == 0 && opt->kill_stage >= 0)
        rc = vclock_schedule(&sim.clock, opt->kill_at_ns, opt->kill_stage, EV_KILL, 0, NULL, 0,
                             NULL);
    if (rc == 0 && opt->partition_stage >= 0)
        rc = setup_partition(&sim, opt->partition_stage, opt->partition_at_ns);
    if (rc == 0) rc = client_send_requests(&sim);
    struct sim_event ev;
    while (rc == 0) {
        const struct sim_event *next = vclock_peek(&sim.clock);
        if (sim.requests_left > 0 && (!next || next->time_ns > opt->request_timeout_ns)) {
            /* Deadline (or nothing left that could answer): the client gives up. */
            if (next) sim.clock.now_ns = opt->request_timeout_ns;
            char message[200];
            snprintf(message, sizeof message,
                     next ? "no answer within the %.6g ms request timeout"
                          : "pipeline stalled: no stage will ever answer (after %.6g ms)",
                     next ? (double)opt->request_timeout_ns / 1e6 : (double)sim.clock.now_ns / 1e6);
            for (int i = 0; i < opt->num_requests; i++)
                client_finish(&sim, i, STRATA_ETIMEOUT, message);
            if (next) break;
        }
        if (!vclock_pop(&sim.clock, &ev)) break;
        if (++report->events > SIM_MAX_EVENTS) {
            free(ev.data);
            rc = strata_set_error(STRATA_ERANGE, "simulator: more than %llu events, giving up",
                                  (unsigned long long)SIM_MAX_EVENTS);
            break;
        }
        rc = on_event(&sim, &ev);
        if (rc == 0) rc = sim.client_error;
    }
    if (rc == 0) sim_summarise(&sim);
    sim_teardown(&sim);
    if (rc < 0) sim_report_free(report);
    return rc;
}
