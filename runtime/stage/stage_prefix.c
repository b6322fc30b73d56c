/* Prefix reuse in the stage core; see stage_prefix_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "reference/kv_blocks.h"
#include "runtime/base/siphash.h"
#include "runtime/base/status.h"
#include "runtime/stage/stage_core_internal.h"

void stage_prefix_init(struct stage_core *core) {
    uint64_t key[2];
    if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) {
        /* No entropy source: a key from the clock and the address still differs per
         * process; it only has to be unknown to clients, and stays within this process. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        key[0] = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)core;
        key[1] = (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&key;
    }
    memcpy(core->prefix.key, key, sizeof key);
}

int stage_prefix_plan(struct stage_core *core, const int32_t *prompt, int prompt_len, int64_t need,
                      uint64_t **keys, int *n_keys, int *cached, int64_t *cost) {
    const int n = prompt_len / KV_BLOCK;
    *keys = NULL;
    *n_keys = *cached = 0;
    *cost = need;
    if (n == 0 || core->prefix.off) return 0;
    uint64_t *k = malloc((size_t)n * sizeof *k);
    if (!k) return strata_set_error(STRATA_ENOMEM, "no memory for %d block keys", n);
    /* key_b = SipHash(key_{b-1} || the block's 16 ids): a block's key names its whole prefix. */
    unsigned char chunk[sizeof(uint64_t) + KV_BLOCK * sizeof(int32_t)];
    uint64_t prev = 0;
    for (int b = 0; b < n; ++b) {
        memcpy(chunk, &prev, sizeof prev);
        memcpy(chunk + sizeof prev, prompt + (size_t)b * KV_BLOCK, KV_BLOCK * sizeof(int32_t));
        prev = strata_siphash(core->prefix.key, chunk, sizeof chunk);
        if (prev == 0) prev = 1; /* 0 means "no key" in the pool */
        k[b] = prev;
    }
    int limit = (prompt_len - 1) / KV_BLOCK, idle = 0;
    if (limit > n) limit = n;
    const int found = stage_backend_kv_lookup(core->be, k, limit, &idle);
    *keys = k;
    *n_keys = n;
    *cached = found;
    *cost = need - (int64_t)(found - idle) * KV_BLOCK;
    return 0;
}

int stage_prefix_attach(struct stage_core *core, struct stage_req *req, uint64_t *keys, int n_keys,
                        int cached, char *why, size_t why_cap) {
    req->keys = keys;
    req->n_keys = n_keys;
    req->cached_blocks = 0;
    if (core->is_first) {
        core->prefix.lookups++;
        core->prefix.prompt_tokens += (uint64_t)req->params.prompt_len;
    }
    if (cached <= 0) return 0;
    const int got = stage_backend_kv_attach(core->be, req->slot, keys, cached);
    if (got < 0) {
        snprintf(why, why_cap, "stage %d: attaching cached KV blocks: %s", core->opt.stage_index,
                 strata_last_error());
        return got;
    }
    if (got != cached * KV_BLOCK) {
        struct stage_kv_usage u;
        stage_backend_kv_usage(core->be, &u);
        snprintf(why, why_cap,
                 "stage %d: stage 0 reuses %d cached KV blocks of this prompt but this stage "
                 "holds only the first %d (its pool: %d blocks); stage 0 sends it again cold",
                 core->opt.stage_index, cached, got / KV_BLOCK, u.blocks);
        return STRATA_ENOTFOUND;
    }
    req->cached_blocks = cached;
    req->recv_pos = cached * KV_BLOCK;
    if (core->is_first) {
        core->prefix.hits++;
        core->prefix.cached_tokens += (uint64_t)cached * KV_BLOCK;
    }
    return 0;
}

int stage_prefix_build_request(struct stage_core *core, const struct stage_req *req,
                               const struct wire_request *msg) {
    struct wire_request m = *msg;
    m.block_keys = req->keys;
    m.num_block_keys = (size_t)req->n_keys;
    m.cached_blocks = req->cached_blocks;
    return wire_build_request(&core->arena, &m);
}

void stage_prefix_keep(struct stage_core *core, struct stage_req *req) {
    if (req->prefix_wait) return; /* its blocks were never all checked */
    if (req->n_keys > 0) stage_backend_kv_register(core->be, req->slot, req->keys, req->n_keys);
}

void stage_prefix_note_miss(struct stage_core *core, uint64_t nonce) {
    const int n = (int)(sizeof core->prefix.missed / sizeof *core->prefix.missed);
    core->prefix.missed[core->prefix.missed_next] = nonce;
    core->prefix.missed_next = (core->prefix.missed_next + 1) % n;
}

static int take_miss(struct stage_core *core, uint64_t nonce) {
    for (size_t i = 0; i < sizeof core->prefix.missed / sizeof *core->prefix.missed; ++i)
        if (core->prefix.missed[i] == nonce) {
            core->prefix.missed[i] = 0;
            return 1;
        }
    return 0;
}

void stage_prefix_start(struct stage_core *core, struct stage_req *req) {
    if (req->cached_blocks > 0 && core->opt.num_stages > 1) {
        req->prefix_wait = 1;
        stage_emit_control(core, STAGE_LINK_NEXT, 0, WIRE_CONTROL_PREFIX_CHECK, req->nonce, 0);
        return;
    }
    stage_recovery_queue_prefill_from(core, req, req->cached_blocks * KV_BLOCK);
}

/* Stage 0: the check came back marked: the request goes again from position 0. */
static void fall_back(struct stage_core *core, struct stage_req *req) {
    core->prefix.fallbacks++;
    core->prefix.hits--;
    core->prefix.cached_tokens -= (uint64_t)req->cached_blocks * KV_BLOCK;
    /* The stages that attached drop it (the one that missed never admitted it); links are
     * FIFO, so they see the cancel before the Request that follows. */
    stage_emit_control(core, STAGE_LINK_NEXT, 0, WIRE_CONTROL_CANCEL, req->nonce, 0);
    /* Forget every key first, the attached blocks' too: released, they are free, not cached. */
    stage_backend_kv_forget(core->be);
    req->cached_blocks = 0;
    req = stage_recovery_fresh_slot(core, req);
    if (stage_recovery_send_request(core, req, "sending without its cached prefix") < 0) return;
    stage_recovery_queue_prefill_from(core, req, 0);
}

void stage_prefix_on_check(struct stage_core *core, uint64_t nonce, uint64_t seq) {
    if (!core->is_first) {
        if (take_miss(core, nonce)) seq = 1;
        stage_emit_control(core, STAGE_LINK_NEXT, 0, WIRE_CONTROL_PREFIX_CHECK, nonce, seq);
        return;
    }
    struct stage_req *req = stage_find(core, nonce);
    if (!req || !req->prefix_wait || req->held) return; /* gone, or replayed cold */
    req->prefix_wait = 0;
    if (seq == 0)
        stage_recovery_queue_prefill_from(core, req, req->cached_blocks * KV_BLOCK);
    else
        fall_back(core, req);
}
