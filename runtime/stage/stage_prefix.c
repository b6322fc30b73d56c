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

/* The digests of vl's images [vl->n_images] (see stage_prefix_internal.h): SipHash of the
 * grid and of the hashes of its embedding rows and of each of its DeepStack layers' rows. */
static int image_digests(const struct stage_core *core, const struct stage_vl *vl, uint64_t **out) {
    const int H = core->hidden_size, K = vl->num_deepstack;
    const int merge2 =
        core->be->cfg->vision.spatial_merge_size * core->be->cfg->vision.spatial_merge_size;
    uint64_t *d = malloc(sizeof *d * (size_t)vl->n_images);
    if (!d) return strata_set_error(STRATA_ENOMEM, "no memory for %d image digests", vl->n_images);
    size_t row = 0;
    for (int i = 0; i < vl->n_images; ++i) {
        const struct vl_grid *g = &vl->grids[i];
        const size_t rows = (size_t)g->t * (size_t)g->h * (size_t)g->w / (size_t)merge2;
        uint64_t parts[3 + 1 + MODEL_CONFIG_MAX_DEEPSTACK];
        int n = 0;
        parts[n++] = (uint64_t)(uint32_t)g->t;
        parts[n++] = (uint64_t)(uint32_t)g->h << 32 | (uint32_t)g->w;
        parts[n++] = rows;
        parts[n++] = strata_siphash(core->prefix.key, vl->embeds + row * H,
                                    rows * (size_t)H * sizeof(float));
        for (int k = 0; k < K; ++k)
            parts[n++] = strata_siphash(core->prefix.key,
                                        vl->deepstack + ((size_t)k * vl->n_image_tokens + row) * H,
                                        rows * (size_t)H * sizeof(float));
        d[i] = strata_siphash(core->prefix.key, parts, sizeof(uint64_t) * (size_t)n);
        row += rows;
    }
    *out = d;
    return 0;
}

/* key_b = SipHash(key_{b-1} || the block's 16 ids || the digests [digest_bytes] of the images
 * whose rows it holds, in row order): a block's key names its whole prefix, pictures
 * included. Never 0, which means "no key" in the pool. */
static uint64_t chain_key(const struct stage_core *core, uint64_t prev, const int32_t *ids,
                          const uint64_t *digests, size_t digest_bytes) {
    unsigned char buf[sizeof(uint64_t) * (1 + KV_BLOCK) + KV_BLOCK * sizeof(int32_t)];
    size_t len = 0;
    memcpy(buf, &prev, sizeof prev);
    len += sizeof prev;
    memcpy(buf + len, ids, KV_BLOCK * sizeof(int32_t));
    len += KV_BLOCK * sizeof(int32_t);
    if (digest_bytes) memcpy(buf + len, digests, digest_bytes);
    len += digest_bytes;
    const uint64_t key = strata_siphash(core->prefix.key, buf, len);
    return key ? key : 1;
}

/* k[b] for blocks b = from .. n - 1 of ids (a prompt, then what followed it), continuing the
 * chain from k[from - 1] (from 0: the start), the digests of vl's pictures (NULL: a text
 * request) chained into the blocks that hold their rows. The visual ids before block `from`
 * only advance the picture being read; the pictures are hashed once a block needs them, so
 * extending a chain past them costs nothing. 0 or STRATA_ENOMEM. */
static int chain_keys(const struct stage_core *core, const int32_t *ids, int from, int n,
                      const struct stage_vl *vl, uint64_t *k) {
    uint64_t *digest = NULL;
    uint64_t chunk[KV_BLOCK]; /* the digests of the images a block holds rows of */
    /* a video's frame blocks are grids like images: their rows chain their digests too */
    const struct vl_tokens visual = {vl ? core->be->cfg->image_token_id : -1,
                                     vl ? core->be->cfg->video_token_id : -1, 0};
    const int merge2 =
        core->be->cfg->vision.spatial_merge_size * core->be->cfg->vision.spatial_merge_size;
    const int n_images = vl ? vl->n_images : 0;
    uint64_t prev = from > 0 ? k[from - 1] : 0;
    /* the image whose rows the next image token holds, and its rows left */
    int image = 0,
        image_left = n_images ? vl->grids[0].t * vl->grids[0].h * vl->grids[0].w / merge2 : 0;
    for (int b = 0; b < n; ++b) {
        const int32_t *block = ids + (size_t)b * KV_BLOCK;
        int nd = 0, last = -1; /* the image whose digest this block chained last */
        for (int j = 0; j < KV_BLOCK; ++j) {
            if (!vl_is_visual(&visual, block[j]) || image >= n_images) continue;
            if (b >= from && image != last) {
                int rc;
                if (!digest && (rc = image_digests(core, vl, &digest)) < 0) return rc;
                chunk[nd++] = digest[image];
                last = image;
            }
            if (--image_left == 0 && ++image < n_images)
                image_left = vl->grids[image].t * vl->grids[image].h * vl->grids[image].w / merge2;
        }
        if (b >= from)
            k[b] = prev = chain_key(core, prev, block, chunk, sizeof(uint64_t) * (size_t)nd);
    }
    free(digest);
    return 0;
}

int stage_prefix_plan(struct stage_core *core, const int32_t *prompt, int prompt_len,
                      const struct stage_vl *vl, int64_t need, uint64_t **keys, int *n_keys,
                      int *cached, int64_t *cost) {
    const int n = prompt_len / KV_BLOCK;
    *keys = NULL;
    *n_keys = *cached = 0;
    *cost = need;
    if (n == 0 || core->prefix.off) return 0;
    uint64_t *k = malloc((size_t)n * sizeof *k);
    if (!k) return strata_set_error(STRATA_ENOMEM, "no memory for %d block keys", n);
    int rc = chain_keys(core, prompt, 0, n, vl, k);
    if (rc < 0) {
        free(k);
        return rc;
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

void stage_prefix_forward_fields(const struct stage_req *req, struct wire_request *fwd) {
    fwd->block_keys = req->keys;
    fwd->num_block_keys = (size_t)req->n_keys;
    fwd->cached_blocks = req->cached_blocks;
}

void stage_prefix_answer(struct stage_core *core, struct stage_req *req) {
    const int P = req->params.prompt_len, n = P / KV_BLOCK;
    /* every generated token but the last went through every stage */
    const int total = (P + req->n_generated - 1) / KV_BLOCK;
    req->n_answer_keys = 0;
    if (core->prefix.off || req->prefix_wait || req->n_keys != n || total <= n) return;
    /* The prompt's chain continued over the answer, as the next turn's plan will make it (a
     * picture's rows in the prompt's last blocks chain its digest). Nothing is kept when
     * memory is short: a later turn only computes more. */
    int32_t *ids = malloc(sizeof *ids * (size_t)total * KV_BLOCK);
    uint64_t *k = ids ? realloc(req->keys, sizeof *k * (size_t)total) : NULL;
    if (k) {
        req->keys = k;
        for (int p = 0; p < total * KV_BLOCK; ++p)
            ids[p] = p < P ? req->prompt[p] : req->tokens[p - P];
        if (chain_keys(core, ids, n, total, req->vl, k) == 0) req->n_answer_keys = total - n;
    }
    free(ids);
}

void stage_prefix_take_answer(struct stage_req *req, const uint64_t *keys, size_t n,
                              uint64_t step) {
    const int P = req->params.prompt_len;
    req->n_answer_keys = 0;
    /* only whole blocks of positions this stage wrote: the prompt and the tokens before the
     * last (step is the last's) */
    if (n == 0 || req->n_keys != P / KV_BLOCK || step >= (uint64_t)req->params.max_tokens ||
        n > (size_t)((P + (int)step) / KV_BLOCK - req->n_keys) ||
        req->recv_pos < (req->n_keys + (int)n) * KV_BLOCK)
        return;
    uint64_t *k = realloc(req->keys, sizeof *k * ((size_t)req->n_keys + n));
    if (!k) return;
    memcpy(k + req->n_keys, keys, sizeof *k * n);
    req->keys = k;
    req->n_answer_keys = (int)n;
}

void stage_prefix_keep(struct stage_core *core, struct stage_req *req) {
    if (req->prefix_wait) return; /* its blocks were never all checked */
    const int n = req->n_keys + req->n_answer_keys;
    if (n > 0) stage_backend_kv_register(core->be, req->slot, req->keys, n);
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
