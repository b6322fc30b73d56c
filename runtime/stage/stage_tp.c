/* The TP leader wrapper, the follower loop and the group's address book (stage_tp.h).
 *
 * A command is one broadcast of a header of TP_HDR int32 words, then, per command, a
 * broadcast of int32 words and one of floats (either may be empty). Int32 words travel as
 * the bit patterns of floats: the collective copies bytes (codec none) and never computes
 * on a broadcast, so they arrive unchanged. */
#include "runtime/stage/stage_tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reference/kv_blocks.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"

enum tp_op {
    TP_OP_EMBED = 1,
    TP_OP_FORWARD,
    TP_OP_LOGITS,
    TP_OP_ACQUIRE,
    TP_OP_RELEASE,
    TP_OP_STOP,
    TP_OP_ARGMAX,   /* greedy ids without assembled logits (backend.h argmax) */
    TP_OP_RESERVE,  /* a: slot, b: positions */
    TP_OP_ATTACH,   /* a: slot, b: keys (ints: each key as two words, low first) */
    TP_OP_REGISTER, /* the same */
    TP_OP_LOOKUP,   /* a: keys (as ATTACH); every rank answers in an allgather */
    TP_OP_TRUNCATE  /* a: slot, b: positions kept */
};

#define TP_HDR 6            /* op, a, b, n_ints, n_floats, magic */
#define TP_MAX_GROUP 256    /* ranks of one stage's group (TP x KVP) */
#define TP_MAGIC 0x54503136 /* "TP16" */
#define TP_ITEM_INTS 7      /* slot, pos, n_tokens, has_mrope, has_mask, num_deepstack, has_ds */
#define TP_IDLE_WAIT_MS 0x7fffffff

/* Growable int32 / float buffers of one command. */
struct tp_buf {
    int32_t *ints;
    float *floats;
    size_t n_ints, n_floats, cap_ints, cap_floats;
};

static int buf_reserve(struct tp_buf *b, size_t ints, size_t floats) {
    if (ints > b->cap_ints) {
        int32_t *p = realloc(b->ints, ints * sizeof *p);
        if (!p) return strata_set_error(STRATA_ENOMEM, "TP: out of memory for a command");
        b->ints = p;
        b->cap_ints = ints;
    }
    if (floats > b->cap_floats) {
        float *p = realloc(b->floats, floats * sizeof *p);
        if (!p) return strata_set_error(STRATA_ENOMEM, "TP: out of memory for a command");
        b->floats = p;
        b->cap_floats = floats;
    }
    return STRATA_OK;
}

static void buf_free(struct tp_buf *b) {
    free(b->ints);
    free(b->floats);
    memset(b, 0, sizeof *b);
}

/* Broadcasts int32 words from rank 0 (as float bit patterns: see the top of the file). */
static int bcast_ints(struct coll *c, int32_t *words, size_t n) {
    return coll_broadcast(c, (float *)(void *)words, n, 0);
}

/* ---- leader ------------------------------------------------------------------------ */

struct tp_leader {
    struct stage_backend *inner; /* this rank's shard */
    struct coll *coll;
    int kvp; /* KVP degree: the ranks' pools hold different blocks */
    struct tp_buf buf;
};

static struct tp_leader *leader(const struct stage_backend *be) {
    return be->context;
}

/* A failure of the group is this stage's own, not a lost pipeline link: STRATA_EPEER ("a
 * rank gave up on the group") would read as one and make stage 0 hold the request and
 * replay it (stage_recovery.c) into a group that stays broken; it is reported as EIO. */
static int group_status(int rc) {
    return rc == STRATA_EPEER ? STRATA_EIO : rc;
}

/* Sends header + the buffer's ints and floats. */
static int send_cmd(struct tp_leader *l, int op, int a, int b) {
    int32_t hdr[TP_HDR] = {op, a, b, (int32_t)l->buf.n_ints, (int32_t)l->buf.n_floats, TP_MAGIC};
    int rc = bcast_ints(l->coll, hdr, TP_HDR);
    if (!rc && l->buf.n_ints) rc = bcast_ints(l->coll, l->buf.ints, l->buf.n_ints);
    if (!rc && l->buf.n_floats) rc = coll_broadcast(l->coll, l->buf.floats, l->buf.n_floats, 0);
    if (rc) { /* copied first: formatting the error buffer into itself would garble it */
        char why[600];
        snprintf(why, sizeof why, "%s", strata_last_error());
        return strata_set_error(group_status(rc), "tensor-parallel %s", why);
    }
    return STRATA_OK;
}

static int lead_embed(struct stage_backend *be, float *hidden, const int32_t *tokens, int n) {
    struct tp_leader *l = leader(be);
    int rc = buf_reserve(&l->buf, (size_t)n, 0);
    if (rc) return rc;
    memcpy(l->buf.ints, tokens, (size_t)n * sizeof *tokens);
    l->buf.n_ints = (size_t)n;
    l->buf.n_floats = 0;
    if ((rc = send_cmd(l, TP_OP_EMBED, n, 0))) return rc;
    return group_status(l->inner->iface->embed(l->inner, hidden, tokens, n));
}

/* Items -> ints (TP_ITEM_INTS each, then each item's M-RoPE rows and visual mask) and
 * floats (the hidden rows, then each item's DeepStack features). */
static int pack_forward(struct tp_buf *b, const float *hidden, const struct forward_item *items,
                        int n_items, int H) {
    size_t ints = (size_t)n_items * TP_ITEM_INTS, floats = 0;
    for (int i = 0; i < n_items; ++i) {
        const struct forward_item *it = &items[i];
        const size_t n = (size_t)(it->n_tokens > 0 ? it->n_tokens : 0);
        floats += n * (size_t)H;
        if (it->mrope_positions) ints += 3 * n;
        if (it->visual_mask) ints += n;
        if (it->deepstack) floats += (size_t)it->num_deepstack * n * (size_t)H;
    }
    int rc = buf_reserve(b, ints, floats);
    if (rc) return rc;
    int32_t *w = b->ints, *extra = b->ints + (size_t)n_items * TP_ITEM_INTS;
    float *f = b->floats;
    size_t rows = 0;
    for (int i = 0; i < n_items; ++i)
        rows += (size_t)(items[i].n_tokens > 0 ? items[i].n_tokens : 0);
    memcpy(f, hidden, rows * (size_t)H * sizeof(float));
    f += rows * (size_t)H;
    for (int i = 0; i < n_items; ++i) {
        const struct forward_item *it = &items[i];
        const size_t n = (size_t)(it->n_tokens > 0 ? it->n_tokens : 0);
        int32_t head[TP_ITEM_INTS] = {it->slot,
                                      it->pos,
                                      it->n_tokens,
                                      it->mrope_positions != NULL,
                                      it->visual_mask != NULL,
                                      it->num_deepstack,
                                      it->deepstack != NULL};
        memcpy(w + (size_t)i * TP_ITEM_INTS, head, sizeof head);
        if (it->mrope_positions) {
            memcpy(extra, it->mrope_positions, 3 * n * sizeof(int32_t));
            extra += 3 * n;
        }
        if (it->visual_mask)
            for (size_t k = 0; k < n; ++k)
                *extra++ = it->visual_mask[k];
        if (it->deepstack) {
            const size_t count = (size_t)it->num_deepstack * n * (size_t)H;
            memcpy(f, it->deepstack, count * sizeof(float));
            f += count;
        }
    }
    b->n_ints = ints;
    b->n_floats = floats;
    return STRATA_OK;
}

static int lead_forward(struct stage_backend *be, float *hidden, const struct forward_item *items,
                        int n_items) {
    struct tp_leader *l = leader(be);
    int rc = pack_forward(&l->buf, hidden, items, n_items, be->cfg->hidden_size);
    if (!rc) rc = send_cmd(l, TP_OP_FORWARD, n_items, 0);
    if (rc) return rc;
    return group_status(l->inner->iface->forward(l->inner, hidden, items, n_items));
}

/* Sends the followers command `op` on n hidden rows [n, H] (the LM head's input). */
static int send_rows(struct stage_backend *be, struct tp_leader *l, int op, const float *hidden,
                     int n) {
    const size_t count = (size_t)n * (size_t)be->cfg->hidden_size;
    int rc = buf_reserve(&l->buf, 0, count);
    if (rc) return rc;
    memcpy(l->buf.floats, hidden, count * sizeof(float));
    l->buf.n_ints = 0;
    l->buf.n_floats = count;
    return send_cmd(l, op, n, 0);
}

static int lead_logits(struct stage_backend *be, float *logits, const float *hidden, int n) {
    struct tp_leader *l = leader(be);
    int rc = send_rows(be, l, TP_OP_LOGITS, hidden, n);
    if (rc) return rc;
    return group_status(l->inner->iface->logits(l->inner, logits, hidden, n));
}

/* The greedy shortcut: the followers take part in the vocab-parallel argmax (its pairs'
 * all-gather) exactly as in lead_logits. */
static int lead_argmax(struct stage_backend *be, int32_t *ids, const float *hidden, int n) {
    struct tp_leader *l = leader(be);
    int rc = send_rows(be, l, TP_OP_ARGMAX, hidden, n);
    if (rc) return rc;
    return group_status(l->inner->iface->argmax(l->inner, ids, hidden, n));
}

static int lead_kv_acquire(struct stage_backend *be, int *slot) {
    struct tp_leader *l = leader(be);
    int rc = l->inner->iface->kv_acquire(l->inner, slot);
    if (rc) return rc;
    l->buf.n_ints = l->buf.n_floats = 0;
    if ((rc = send_cmd(l, TP_OP_ACQUIRE, *slot, 0))) l->inner->iface->kv_release(l->inner, *slot);
    return rc;
}

/* The leader reserves first: a pool that cannot is the group's answer (every rank's pool
 * has the same blocks: the same budget over the same layers and a share of the heads or
 * positions that is the same size on every rank); the followers then make the same
 * promise. */
static int lead_kv_reserve(struct stage_backend *be, int slot, int positions) {
    struct tp_leader *l = leader(be);
    int rc = l->inner->iface->kv_reserve(l->inner, slot, positions);
    if (rc || slot < 0) return rc; /* slot -1 asks the leader's pool only: a question */
    l->buf.n_ints = l->buf.n_floats = 0;
    return send_cmd(l, TP_OP_RESERVE, slot, positions);
}

static void lead_kv_usage(const struct stage_backend *be, struct stage_kv_usage *out) {
    const struct tp_leader *l = leader(be);
    l->inner->iface->kv_usage(l->inner, out);
}

static int pack_keys(struct tp_leader *l, const uint64_t *keys, int n);

/* Every rank's answer for keys [n] (its own lookup: under KVP, what its token range allows),
 * gathered; returns the least. Counts travel as floats, exact below 2^24. */
static int group_lookup_min(struct coll *coll, int mine) {
    float all[TP_MAX_GROUP], me = (float)mine;
    const int size = coll_size(coll);
    if (size > TP_MAX_GROUP)
        return strata_set_error(STRATA_EINVAL, "TP: a group of %d ranks (at most %d)", size,
                                TP_MAX_GROUP);
    int rc = coll_allgather(coll, all, &me, 1);
    if (rc) return group_status(rc);
    for (int r = 0; r < size; ++r)
        if ((int)all[r] < mine) mine = (int)all[r];
    return mine;
}

/* Without KVP every rank's pool mirrors the leader's: its answer is the group's. Under KVP
 * each rank holds other blocks, so the ranks answer together (TP_OP_LOOKUP) and the group
 * reuses the leading blocks every rank holds; *cached is the leader's own count below that
 * (its pool is the one admission asks). */
static int lead_kv_lookup(const struct stage_backend *be, const uint64_t *keys, int n,
                          int *cached) {
    struct tp_leader *l = leader(be);
    int mine = l->inner->iface->kv_lookup(l->inner, keys, n, cached), rc;
    if (mine < 0 || l->kvp <= 1) return mine;
    if ((rc = pack_keys(l, keys, n)) || (rc = send_cmd(l, TP_OP_LOOKUP, n, 0))) return rc;
    const int group = group_lookup_min(l->coll, mine);
    if (group < 0 || group == mine) return group;
    l->inner->iface->kv_lookup(l->inner, keys, group, cached); /* its idle ones below it */
    return group;
}

/* Puts keys [n] into the command's ints, two words each. */
static int pack_keys(struct tp_leader *l, const uint64_t *keys, int n) {
    int rc = buf_reserve(&l->buf, 2 * (size_t)n, 0);
    if (rc) return rc;
    for (int i = 0; i < n; ++i) {
        l->buf.ints[2 * i] = (int32_t)(uint32_t)keys[i];
        l->buf.ints[2 * i + 1] = (int32_t)(uint32_t)(keys[i] >> 32);
    }
    l->buf.n_ints = 2 * (size_t)n;
    l->buf.n_floats = 0;
    return 0;
}

/* Every rank attaches the blocks of its own pool, which mirrors the leader's (the same
 * commands in the same order); one that finds fewer fails the group's next call. */
static int lead_kv_attach(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    struct tp_leader *l = leader(be);
    int got = l->inner->iface->kv_attach(l->inner, slot, keys, n), rc;
    if (got < n * KV_BLOCK) return got; /* a miss here: the caller refuses, nothing to send */
    if ((rc = pack_keys(l, keys, n)) || (rc = send_cmd(l, TP_OP_ATTACH, slot, n))) return rc;
    return got;
}

/* The leader alone: the followers' pools keep more keys than it then, which is harmless (they
 * attach only what it sends them) and needs no command. */
static void lead_kv_forget(struct stage_backend *be) {
    struct tp_leader *l = leader(be);
    l->inner->iface->kv_forget(l->inner);
}

static void lead_kv_register(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    struct tp_leader *l = leader(be);
    l->inner->iface->kv_register(l->inner, slot, keys, n);
    char kept[1024]; /* a void call: keep the caller's message, as send_quiet does */
    snprintf(kept, sizeof kept, "%s", strata_last_error());
    if (pack_keys(l, keys, n) || send_cmd(l, TP_OP_REGISTER, slot, n))
        strata_set_error(0, "%s", kept);
}

/* Sends a command whose failure the caller cannot see (a void call): the thread's error
 * message is kept, since the caller may be reporting another failure with it; a broken
 * group fails the next call instead. */
static void send_quiet(struct tp_leader *l, int op, int a) {
    char kept[1024];
    snprintf(kept, sizeof kept, "%s", strata_last_error());
    l->buf.n_ints = l->buf.n_floats = 0;
    if (send_cmd(l, op, a, 0)) strata_set_error(0, "%s", kept);
}

static void lead_kv_release(struct stage_backend *be, int slot) {
    struct tp_leader *l = leader(be);
    l->inner->iface->kv_release(l->inner, slot);
    send_quiet(l, TP_OP_RELEASE, slot);
}

static int lead_kv_truncate(struct stage_backend *be, int slot, int positions) {
    struct tp_leader *l = leader(be);
    int rc = l->inner->iface->kv_truncate(l->inner, slot, positions);
    if (rc) return rc;
    l->buf.n_ints = l->buf.n_floats = 0;
    return send_cmd(l, TP_OP_TRUNCATE, slot, positions);
}

static size_t lead_kv_bytes(const struct stage_backend *be) {
    const struct tp_leader *l = leader(be);
    return l->inner->iface->kv_bytes(l->inner);
}

static int lead_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots, int n) {
    (void)be, (void)out, (void)slots, (void)n;
    return strata_set_error(STRATA_EINVAL, "KV handoff (--send-kv) is not supported with tensor "
                                           "parallelism: each TP rank holds only its KV heads");
}

static int lead_kv_restore(struct stage_backend *be, const int *slots, int n,
                           const struct kv_handoff *in) {
    (void)be, (void)slots, (void)n, (void)in;
    return strata_set_error(STRATA_EINVAL, "KV restore is not supported with tensor parallelism: "
                                           "each TP rank holds only its KV heads");
}

static void lead_describe(const struct stage_backend *be, struct stage_backend_info *out) {
    const struct tp_leader *l = leader(be);
    l->inner->iface->describe(l->inner, out);
}

static void lead_free(struct stage_backend *be) {
    struct tp_leader *l = leader(be);
    if (!l) return;
    send_quiet(l, TP_OP_STOP, 0); /* followers exit 0; a broken group: they already did */
    stage_backend_free(l->inner);
    buf_free(&l->buf);
    free(l);
    be->context = NULL;
}

static const struct stage_backend_i leader_iface = {
    .embed = lead_embed,
    .forward = lead_forward,
    .logits = lead_logits,
    .argmax = lead_argmax,
    .kv_acquire = lead_kv_acquire,
    .kv_reserve = lead_kv_reserve,
    .kv_release = lead_kv_release,
    .kv_truncate = lead_kv_truncate,
    .kv_bytes = lead_kv_bytes,
    .kv_usage = lead_kv_usage,
    .kv_lookup = lead_kv_lookup,
    .kv_attach = lead_kv_attach,
    .kv_register = lead_kv_register,
    .kv_forget = lead_kv_forget,
    .kv_pack = lead_kv_pack,
    .kv_restore = lead_kv_restore,
    .describe = lead_describe,
    .free = lead_free,
};

static const struct stage_backend_i leader_iface_no_argmax = {
    .embed = lead_embed,
    .forward = lead_forward,
    .logits = lead_logits,
    .kv_acquire = lead_kv_acquire,
    .kv_reserve = lead_kv_reserve,
    .kv_release = lead_kv_release,
    .kv_truncate = lead_kv_truncate,
    .kv_bytes = lead_kv_bytes,
    .kv_usage = lead_kv_usage,
    .kv_lookup = lead_kv_lookup,
    .kv_attach = lead_kv_attach,
    .kv_register = lead_kv_register,
    .kv_forget = lead_kv_forget,
    .kv_pack = lead_kv_pack,
    .kv_restore = lead_kv_restore,
    .describe = lead_describe,
    .free = lead_free,
};

int stage_tp_open(struct stage_backend **out, const struct stage_backend_options *bo) {
    *out = NULL;
    if (!stage_tp_is_split(bo->tp) || !bo->tp->coll)
        return strata_set_error(STRATA_EINVAL,
                                "stage_tp_open: needs a TP or KVP degree >= 2 and a group");
    struct stage_backend *inner;
    int rc = stage_backend_open(&inner, bo);
    if (rc) return rc;
    if (coll_rank(bo->tp->coll) != 0) { /* the CPU backend checked rank == grid place */
        *out = inner;
        return STRATA_OK;
    }
    struct stage_backend *be = calloc(1, sizeof *be);
    struct tp_leader *l = calloc(1, sizeof *l);
    if (!be || !l) {
        free(be);
        free(l);
        stage_backend_free(inner);
        return strata_set_error(STRATA_ENOMEM, "out of memory for the TP leader");
    }
    l->inner = inner;
    l->coll = bo->tp->coll;
    l->kvp = bo->tp->kvp;
    *be = *inner;
    /* A shard without its own argmax (none today) gets the generic one: logits, then argmax
     * on every rank alike (stage_backend_argmax); so does the leader. */
    be->iface = inner->iface->argmax ? &leader_iface : &leader_iface_no_argmax;
    be->context = l;
    *out = be;
    return STRATA_OK;
}

/* ---- follower ---------------------------------------------------------------------- */

/* Rebuilds the leader's forward items from the command's buffers; 0 or STRATA_EFORMAT. */
static int unpack_forward(struct forward_item *items, uint8_t *masks, const struct tp_buf *b,
                          int n_items, int H, size_t *rows_out) {
    const int32_t *w = b->ints, *extra = b->ints + (size_t)n_items * TP_ITEM_INTS;
    const int32_t *end = b->ints + b->n_ints;
    size_t rows = 0;
    if ((size_t)n_items * TP_ITEM_INTS > b->n_ints)
        return strata_set_error(STRATA_EFORMAT, "TP: short forward command");
    for (int i = 0; i < n_items; ++i)
        rows += (size_t)(w[(size_t)i * TP_ITEM_INTS + 2] > 0 ? w[(size_t)i * TP_ITEM_INTS + 2] : 0);
    const float *f = b->floats + rows * (size_t)H, *fend = b->floats + b->n_floats;
    if (rows * (size_t)H > b->n_floats)
        return strata_set_error(STRATA_EFORMAT, "TP: short forward command");
    for (int i = 0; i < n_items; ++i) {
        const int32_t *h = w + (size_t)i * TP_ITEM_INTS;
        const size_t n = (size_t)(h[2] > 0 ? h[2] : 0);
        items[i] = (struct forward_item){.slot = h[0], .pos = h[1], .n_tokens = h[2]};
        if (h[3]) {
            if (extra + 3 * n > end) return strata_set_error(STRATA_EFORMAT, "TP: short M-RoPE");
            items[i].mrope_positions = extra;
            extra += 3 * n;
        }
        if (h[4]) {
            if (extra + n > end) return strata_set_error(STRATA_EFORMAT, "TP: short visual mask");
            for (size_t k = 0; k < n; ++k)
                masks[k] = (uint8_t)extra[k];
            items[i].visual_mask = masks;
            masks += n;
            extra += n;
        }
        items[i].num_deepstack = h[5];
        if (h[6]) {
            const size_t count = (size_t)(h[5] > 0 ? h[5] : 0) * n * (size_t)H;
            if (f + count > fend) return strata_set_error(STRATA_EFORMAT, "TP: short DeepStack");
            items[i].deepstack = f;
            f += count;
        }
    }
    *rows_out = rows;
    return STRATA_OK;
}

/* Scratch a follower reuses between commands. */
struct tp_follow_scratch {
    float *out; /* hidden rows or logits */
    size_t cap_out;
    struct forward_item *items;
    int cap_items;
    uint8_t *masks;
    size_t cap_masks;
};

static int grow(void **p, size_t *cap, size_t want, size_t size) {
    if (want <= *cap) return STRATA_OK;
    void *q = realloc(*p, want * size);
    if (!q) return strata_set_error(STRATA_ENOMEM, "TP follower: out of memory");
    *p = q;
    *cap = want;
    return STRATA_OK;
}

static int follow_forward(struct stage_backend *be, struct tp_follow_scratch *s,
                          const struct tp_buf *b, int n_items) {
    const int H = be->cfg->hidden_size;
    size_t cap_items = (size_t)s->cap_items, rows = 0;
    if (n_items < 0 || n_items > 1 << 20)
        return strata_set_error(STRATA_EFORMAT, "TP: %d forward items", n_items);
    int rc = grow((void **)&s->items, &cap_items, (size_t)n_items + 1, sizeof *s->items);
    s->cap_items = (int)cap_items;
    if (!rc) rc = grow((void **)&s->masks, &s->cap_masks, b->n_ints + 1, 1);
    if (!rc) rc = unpack_forward(s->items, s->masks, b, n_items, H, &rows);
    if (!rc) rc = grow((void **)&s->out, &s->cap_out, rows * (size_t)H + 1, sizeof(float));
    if (rc) return rc;
    memcpy(s->out, b->floats, rows * (size_t)H * sizeof(float));
    return be->iface->forward(be, s->out, s->items, n_items);
}

/* Runs one received command on the follower's backend. */
static int follow_one(struct stage_backend *be, struct coll *coll, struct tp_follow_scratch *s,
                      const int32_t *hdr, const struct tp_buf *b) {
    const int H = be->cfg->hidden_size, V = be->cfg->vocab_size;
    int slot, rc;
    switch (hdr[0]) {
    case TP_OP_EMBED:
        if (hdr[1] < 0 || (size_t)hdr[1] != b->n_ints)
            return strata_set_error(STRATA_EFORMAT, "TP: embed of %d tokens", hdr[1]);
        if ((rc = grow((void **)&s->out, &s->cap_out, (size_t)hdr[1] * (size_t)H + 1,
                       sizeof(float))))
            return rc;
        return be->iface->embed(be, s->out, b->ints, hdr[1]);
    case TP_OP_FORWARD: return follow_forward(be, s, b, hdr[1]);
    case TP_OP_LOGITS:
        if (hdr[1] < 0 || (size_t)hdr[1] * (size_t)H != b->n_floats)
            return strata_set_error(STRATA_EFORMAT, "TP: logits of %d rows", hdr[1]);
        if ((rc = grow((void **)&s->out, &s->cap_out, (size_t)hdr[1] * (size_t)V + 1,
                       sizeof(float))))
            return rc;
        return be->iface->logits(be, s->out, b->floats, hdr[1]);
    case TP_OP_ARGMAX:
        if (hdr[1] < 0 || (size_t)hdr[1] * (size_t)H != b->n_floats || !be->iface->argmax)
            return strata_set_error(STRATA_EFORMAT, "TP: argmax of %d rows", hdr[1]);
        if ((rc = grow((void **)&s->out, &s->cap_out, (size_t)hdr[1] + 1, sizeof(float))))
            return rc;
        return be->iface->argmax(be, (int32_t *)(void *)s->out, b->floats, hdr[1]);
    case TP_OP_ACQUIRE:
        if ((rc = be->iface->kv_acquire(be, &slot))) return rc;
        if (slot != hdr[1])
            return strata_set_error(STRATA_EFORMAT,
                                    "TP: the leader acquired KV slot %d, this rank slot %d "
                                    "(the ranks' calls diverged)",
                                    hdr[1], slot);
        return STRATA_OK;
    case TP_OP_RELEASE: be->iface->kv_release(be, hdr[1]); return STRATA_OK;
    case TP_OP_TRUNCATE: return be->iface->kv_truncate(be, hdr[1], hdr[2]);
    case TP_OP_ATTACH:
    case TP_OP_REGISTER:
    case TP_OP_LOOKUP: {
        const int n = hdr[0] == TP_OP_LOOKUP ? hdr[1] : hdr[2];
        if (n < 0 || (size_t)n * 2 != b->n_ints)
            return strata_set_error(STRATA_EFORMAT, "TP: %d block keys in %zu words", n, b->n_ints);
        if ((rc = grow((void **)&s->out, &s->cap_out, (size_t)n * 2 + 2, sizeof(float)))) return rc;
        uint64_t *keys = (uint64_t *)(void *)s->out; /* scratch, as argmax's ids */
        for (int i = 0; i < n; ++i)
            keys[i] = (uint64_t)(uint32_t)b->ints[2 * i] | (uint64_t)(uint32_t)b->ints[2 * i + 1]
                                                               << 32;
        if (hdr[0] == TP_OP_REGISTER) {
            be->iface->kv_register(be, hdr[1], keys, n);
            return STRATA_OK;
        }
        if (hdr[0] == TP_OP_LOOKUP) { /* joins the gather whatever it finds */
            rc = be->iface->kv_lookup(be, keys, n, NULL);
            rc = group_lookup_min(coll, rc < 0 ? 0 : rc);
            return rc < 0 ? rc : STRATA_OK;
        }
        rc = be->iface->kv_attach(be, hdr[1], keys, n);
        if (rc < 0) return rc;
        if (rc != n * KV_BLOCK)
            return strata_set_error(STRATA_EFORMAT,
                                    "TP: the leader attached %d cached KV blocks for slot %d, this "
                                    "rank found %d positions of them (the ranks' pools diverged)",
                                    n, hdr[1], rc);
        return STRATA_OK;
    }
    case TP_OP_RESERVE:
        if ((rc = be->iface->kv_reserve(be, hdr[1], hdr[2]))) {
            char why[600]; /* copied first: formatting the error buffer into itself garbles it */
            snprintf(why, sizeof why, "%s", strata_last_error());
            return strata_set_error(rc,
                                    "TP: the leader reserved KV for slot %d, this rank could "
                                    "not (the ranks' pools diverged): %s",
                                    hdr[1], why);
        }
        return STRATA_OK;
    default: return strata_set_error(STRATA_EFORMAT, "TP: unknown command %d", hdr[0]);
    }
}

/* Receives the next command's header (no time limit) and its buffers (the group's). */
static int recv_cmd(struct coll *coll, int32_t *hdr, struct tp_buf *b) {
    const int timeout = coll_timeout(coll);
    int rc = coll_set_timeout(coll, TP_IDLE_WAIT_MS);
    if (!rc) rc = bcast_ints(coll, hdr, TP_HDR);
    coll_set_timeout(coll, timeout);
    if (rc) return rc;
    if (hdr[5] != TP_MAGIC || hdr[3] < 0 || hdr[4] < 0)
        return strata_set_error(STRATA_EFORMAT, "TP: malformed command header");
    b->n_ints = (size_t)hdr[3];
    b->n_floats = (size_t)hdr[4];
    if ((rc = buf_reserve(b, b->n_ints, b->n_floats))) return rc;
    if (b->n_ints && (rc = bcast_ints(coll, b->ints, b->n_ints))) return rc;
    if (b->n_floats) rc = coll_broadcast(coll, b->floats, b->n_floats, 0);
    return rc;
}

/* A zero-length operation only reports whether the group has failed (collective.h). */
static int group_failed(struct coll *coll) {
    return coll_broadcast(coll, NULL, 0, 0) != 0;
}

int stage_tp_follow(struct stage_backend *be, struct coll *coll, uint64_t *calls) {
    struct tp_buf b;
    struct tp_follow_scratch s;
    int32_t hdr[TP_HDR];
    int rc = STRATA_OK;
    memset(&b, 0, sizeof b);
    memset(&s, 0, sizeof s);
    for (;;) {
        if ((rc = recv_cmd(coll, hdr, &b))) break;
        if (hdr[0] == TP_OP_STOP) break;
        rc = follow_one(be, coll, &s, hdr, &b);
        if (calls) ++*calls;
        /* A refusal of the inputs happens on every rank alike (the leader reports it);
         * a failed group or a diverged slot ends the follower. */
        if (rc && (group_failed(coll) || rc == STRATA_EFORMAT || rc == STRATA_ENOMEM)) break;
        rc = STRATA_OK;
    }
    buf_free(&b);
    free(s.out);
    free(s.items);
    free(s.masks);
    return rc;
}

/* ---- the group's addresses --------------------------------------------------------- */

/* Waits up to timeout_ms for a port file another rank writes. */
static int wait_port_file(const char *path, int timeout_ms, int *port) {
    for (int waited = 0;; waited += 20) {
        if (cli_read_port_file(path, port) == 0) return STRATA_OK;
        if (waited >= timeout_ms)
            return strata_set_error(STRATA_ETIMEOUT, "no port in %s after %d ms", path, timeout_ms);
        struct timespec pause = {0, 20 * 1000000};
        nanosleep(&pause, NULL);
    }
}

/* Splits "HOST:PORT" / "HOST:@FILE" (entry `e` of `list`) into host and port or file. */
static int parse_peer(const char *entry, size_t len, char *host, size_t host_cap, char *file,
                      size_t file_cap, int *port) {
    const char *colon = memchr(entry, ':', len);
    if (!colon || colon == entry || (size_t)(colon - entry) >= host_cap || colon + 1 == entry + len)
        return strata_set_error(STRATA_EINVAL,
                                "--tp-peers entry '%.*s' is not HOST:PORT or "
                                "HOST:@FILE",
                                (int)len, entry);
    snprintf(host, host_cap, "%.*s", (int)(colon - entry), entry);
    const char *rest = colon + 1;
    const size_t rest_len = len - (size_t)(rest - entry);
    file[0] = '\0';
    *port = 0;
    if (rest[0] == '@') {
        if (rest_len - 1 >= file_cap)
            return strata_set_error(STRATA_EINVAL, "--tp-peers: path too long");
        snprintf(file, file_cap, "%.*s", (int)(rest_len - 1), rest + 1);
        return STRATA_OK;
    }
    char num[16];
    snprintf(num, sizeof num, "%.*s", (int)(rest_len < 15 ? rest_len : 15), rest);
    return cli_parse_int(num, 1, 65535, port) == 0
               ? STRATA_OK
               : strata_wrap_error(STRATA_EINVAL, "--tp-peers entry '%.*s': port", (int)len, entry);
}

#define TP_HOST_CAP 256
#define TP_FILE_CAP 1024

struct tp_peer {
    char host[TP_HOST_CAP];
    char file[TP_FILE_CAP];
    int port;
};

static int parse_peers(struct tp_peer *peers, const struct stage_tp_net *net) {
    const char *p = net->peers;
    int n = 0;
    while (p && *p) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (n == net->size)
            return strata_set_error(
                STRATA_EINVAL, "--tp-peers lists more than the %d ranks of the group", net->size);
        int rc = parse_peer(p, len, peers[n].host, TP_HOST_CAP, peers[n].file, TP_FILE_CAP,
                            &peers[n].port);
        if (rc) return rc;
        ++n;
        p = comma ? comma + 1 : NULL;
    }
    if (n != net->size)
        return strata_set_error(STRATA_EINVAL,
                                "--tp-peers lists %d ranks, the group has %d (--tp x --kvp)", n,
                                net->size);
    return STRATA_OK;
}

int stage_tp_connect(struct coll **out, const struct stage_tp_net *net) {
    *out = NULL;
    if (net->size < 2 || net->size > COLL_MAX_RANKS || net->rank < 0 || net->rank >= net->size)
        return strata_set_error(STRATA_EINVAL, "group rank %d of %d (need 2 <= size <= %d)",
                                net->rank, net->size, COLL_MAX_RANKS);
    struct tp_peer *peers = calloc((size_t)net->size, sizeof *peers);
    const char *hosts[COLL_MAX_RANKS];
    int ports[COLL_MAX_RANKS] = {0};
    struct wire_listener listener = {.fd = -1};
    const int timeout = net->timeout_ms > 0 ? net->timeout_ms : COLL_DEFAULT_TIMEOUT_MS;
    const int me = net->rank, next = (me + 1) % net->size;
    int rc = peers ? parse_peers(peers, net)
                   : strata_set_error(STRATA_ENOMEM, "out of memory for the TP peers");
    for (int r = 0; !rc && r < net->size; ++r) {
        hosts[r] = peers[r].host;
        ports[r] = peers[r].port;
    }
    /* This rank: listen now (a free port when it has a file), so the others can connect. */
    if (!rc) rc = wire_listen(&listener, peers[me].host, peers[me].port);
    if (!rc && peers[me].file[0]) rc = cli_write_port_file(peers[me].file, listener.port);
    if (!rc) ports[me] = listener.port;
    if (!rc && peers[next].file[0]) rc = wait_port_file(peers[next].file, timeout, &ports[next]);
    if (!rc) {
        struct coll_options o = {.rank = me,
                                 .size = net->size,
                                 .group = net->group,
                                 .timeout_ms = timeout,
                                 .hosts = hosts,
                                 .ports = ports,
                                 .listener = &listener,
                                 .tls = net->tls,
                                 .key = net->key,
                                 .fingerprint = net->fingerprint,
                                 .tcp_only = net->tcp_only};
        rc = coll_open(out, &o);
    }
    wire_listener_close(&listener); /* closed unless coll_open took it over */
    free(peers);
    return rc;
}
