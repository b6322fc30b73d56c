/* Stage 0's admission queue; see stage_admission_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/stage/stage_core_internal.h"

int stage_core_set_admission(struct stage_core *core, int max_queue, int timeout_ms) {
    struct stage_admission *a = &core->admission;
    if (max_queue < 0 || timeout_ms < 0)
        return strata_set_error(STRATA_EINVAL, "admission queue: %d requests, %d ms", max_queue,
                                timeout_ms);
    if (a->count)
        return strata_set_error(STRATA_EINVAL, "admission queue: %d requests are waiting",
                                a->count);
    struct stage_waiting *w = NULL;
    if (max_queue > 0 && !(w = calloc((size_t)max_queue, sizeof *w)))
        return strata_set_error(STRATA_ENOMEM, "admission queue: no memory for %d requests",
                                max_queue);
    free(a->waiting);
    a->waiting = w;
    a->max_queue = max_queue;
    a->timeout_ms = timeout_ms;
    a->head = 0;
    return 0;
}

void stage_admission_free(struct stage_core *core) {
    struct stage_admission *a = &core->admission;
    for (int i = 0; i < a->count; ++i)
        free(a->waiting[(a->head + i) % a->max_queue].frame);
    free(a->waiting);
    memset(a, 0, sizeof *a);
}

int stage_admission_waiting(const struct stage_core *core) {
    return core->admission.count;
}

int stage_admission_push(struct stage_core *core, uint32_t client_id, uint64_t nonce,
                         const uint8_t *frame, size_t len, int need) {
    struct stage_admission *a = &core->admission;
    if (a->max_queue == 0)
        return strata_set_error(STRATA_EBUSY,
                                "request refused: the KV cache is full (%d slots, --max-batch %d, "
                                "or the blocks of --kv-memory) and there is no admission queue "
                                "(--max-queue 0); try again later",
                                core->max_batch, core->max_batch);
    if (a->count == a->max_queue) {
        a->refused_full++;
        return strata_set_error(
            STRATA_EBUSY,
            "request refused: the KV cache is full (%d slots or the blocks of "
            "--kv-memory) and %d requests are waiting already (--max-queue %d); "
            "try again later",
            core->max_batch, a->count, a->max_queue);
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return strata_set_error(STRATA_ENOMEM, "admission queue: no memory for a %zu-byte request",
                                len);
    memcpy(copy, frame, len);
    a->waiting[(a->head + a->count) % a->max_queue] =
        (struct stage_waiting){client_id, nonce, copy, len, core->clock_ms, need};
    a->count++;
    a->queued++;
    return 0;
}

/* The head of the queue, taken out (the caller frees its frame). */
static struct stage_waiting pop(struct stage_admission *a) {
    struct stage_waiting w = a->waiting[a->head];
    a->head = (a->head + 1) % a->max_queue;
    a->count--;
    return w;
}

static void refuse(struct stage_core *core, const struct stage_waiting *w, int code,
                   const char *why) {
    stage_emit_error(core, STAGE_LINK_CLIENT, w->client_id, code, w->nonce, why);
    stage_push_refusal(core, w->nonce, code, why);
}

void stage_admission_pump(struct stage_core *core) {
    struct stage_admission *a = &core->admission;
    /* Arrival order is deadline order: only the head can be the oldest. */
    while (a->count && a->timeout_ms > 0 &&
           core->clock_ms - a->waiting[a->head].arrived_ms > a->timeout_ms) {
        struct stage_waiting w = pop(a);
        char why[256];
        snprintf(why, sizeof why,
                 "stage 0: request refused: it waited %lld ms for KV (a slot and its blocks) in "
                 "the admission queue (--queue-timeout-ms %d); try again later",
                 (long long)(core->clock_ms - w.arrived_ms), a->timeout_ms);
        a->expired++;
        core->stats.refused++;
        refuse(core, &w, STRATA_EBUSY, why);
        free(w.frame);
    }
    while (a->count && stage_can_start(core, a->waiting[a->head].need)) {
        struct stage_waiting w = pop(a);
        a->admitted++;
        a->waited_ms += core->clock_ms - w.arrived_ms;
        stage_admit_waiting(core, w.client_id, w.frame, w.len);
        free(w.frame);
    }
}

int stage_admission_leave(struct stage_core *core, uint32_t client_id, uint64_t nonce,
                          int tell_client, const char *why) {
    struct stage_admission *a = &core->admission;
    int kept = 0, left = 0;
    for (int i = 0; i < a->count; ++i) {
        struct stage_waiting *w = &a->waiting[(a->head + i) % a->max_queue];
        const int match = (client_id == STAGE_ANY_CLIENT || w->client_id == client_id) &&
                          (nonce == 0 || w->nonce == nonce);
        if (!match) {
            a->waiting[(a->head + kept++) % a->max_queue] = *w;
            continue;
        }
        if (tell_client) refuse(core, w, STRATA_ECANCELED, why);
        free(w->frame);
        left++;
    }
    a->count = kept;
    a->left += (uint64_t)left;
    return left;
}
