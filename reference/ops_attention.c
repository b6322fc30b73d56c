/* The reference's attention (ops.h): causal GQA attention over the paged KV cache in the
 * split-invariant order (every score's dot in ascending d, the softmax's sums per aligned block
 * of OPS_ATTN_BLOCK positions combined by the aligned binary tree), and KV parallelism's
 * steps (a rank's partial max and sums over the keys it holds, the group's max, the merge of
 * the ranks' parts by the top of the same tree). The tree's accumulator (struct tree_acc) is
 * what these share and what no other op uses. */
#include "reference/ops.h"
#include "reference/ops_attention_simd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct attention_job {
    float *out;
    const float *q;
    const struct ops_kv *kv;
    float *scratch;
    int pos, n, nh, nkv, head_dim;
};

/* scores [ctx_len] = (q · k_j) * scale, each dot a chain of fmaf in ascending d.
 * Four keys run side by side only so their independent add chains overlap (a single chain
 * is add-latency bound); every score still sees exactly the same operations in the same
 * order, so the bits do not change. */
static void scores_narrow(float *scores, const float *q, const float *keys, int ctx_len, int d_len,
                          float scale) {
    size_t ld = (size_t)d_len;
    int j = 0;
    if (attn_simd_enabled()) { /* the same bits, 8 keys per vector (ops_attention_simd.c) */
        j = ctx_len & ~7;
        attn_scores_avx2(scores, q, keys, ld, j, d_len, scale);
    }
    for (; j + 4 <= ctx_len; j += 4) {
        const float *k0 = keys + (size_t)j * ld, *k1 = k0 + ld, *k2 = k1 + ld, *k3 = k2 + ld;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int d = 0; d < d_len; ++d) {
            s0 = fmaf(q[d], k0[d], s0);
            s1 = fmaf(q[d], k1[d], s1);
            s2 = fmaf(q[d], k2[d], s2);
            s3 = fmaf(q[d], k3[d], s3);
        }
        scores[j] = s0 * scale;
        scores[j + 1] = s1 * scale;
        scores[j + 2] = s2 * scale;
        scores[j + 3] = s3 * scale;
    }
    for (; j < ctx_len; ++j) {
        const float *kj = keys + (size_t)j * ld;
        float dot = 0.0f;
        for (int d = 0; d < d_len; ++d)
            dot = fmaf(q[d], kj[d], dot);
        scores[j] = dot * scale;
    }
}

/* Query vectors one grouped attention task serves: its query heads of one KV head, for as
 * many query tokens as fill this (a prefill's tokens share every key block, so one transpose
 * and one widening of a block serve them all; decode has one token). */
#define ATTN_TILE_QUERIES 16

/* The scores of `heads` query vectors q[r] (into s[r]) over the same keys: on the AVX-512
 * path, 16 keys per vector with one transpose for all of them; the keys left (and every key
 * on other paths) through scores_narrow. The same bits either way. */
static void attention_scores_heads(float *const *s, const float *const *q, int heads,
                                   const float *keys, int count, int d_len, float scale) {
    int j = 0;
    if (attn_avx512_enabled() && count >= 16) {
        j = count & ~15;
        attn_scores_avx512(s, q, heads, keys, (size_t)d_len, j, d_len, scale);
    }
    if (j < count)
        for (int r = 0; r < heads; ++r)
            scores_narrow(s[r] + j, q[r], keys + (size_t)j * (size_t)d_len, count - j, d_len,
                          scale);
}

/* scores s[r] [count] of `heads` query vectors q[r] (as attention_scores_heads) over
 * positions [0, count) of kv head g, block by block: each score is the same dot wherever its
 * key is. heads <= ATTN_TILE_QUERIES * OPS_ATTN_MAX_GROUP. */
static void scores_blocks(float *const *s, const float *const *q, int heads,
                          const struct ops_kv *kv, int g, int count, int d_len, float scale) {
    float tmp[OPS_ATTN_BLOCK * OPS_ATTN_MAX_HEAD_DIM];
    float *at[ATTN_TILE_QUERIES * OPS_ATTN_MAX_GROUP];
    for (int j0 = 0, b = 0; j0 < count; j0 += OPS_ATTN_BLOCK, ++b) {
        const int m = count - j0 < OPS_ATTN_BLOCK ? count - j0 : OPS_ATTN_BLOCK;
        for (int r = 0; r < heads; ++r)
            at[r] = s[r] + j0;
        attention_scores_heads(at, q, heads, attn_kv_rows(kv, 0, g, b, m, d_len, tmp), m, d_len,
                               scale);
    }
}

/* 2: AVX-512 loops, 1: AVX2, 0: portable. */
static int attn_simd_level(void) {
    return attn_avx512_enabled() ? 2 : attn_simd_enabled();
}

/* The aligned binary tree over a run of units (blocks of OPS_ATTN_BLOCK positions, or KVP
 * ranks each holding one subtree), kept as a binary counter: units are pushed in ascending
 * order, each written into the next free entry; an entry completing two equal-sized
 * neighbours merges into the left one (left + right); tree_finish then folds what is left
 * right to left (a complete left subtree + the partial rest). That is the recursive tree
 * over the present prefix with empty nodes skipped: a run covering one aligned subtree
 * gives that subtree's value, whoever computes it. Entries hold w = D + 1 floats (o, l). */
#define TREE_DEPTH 32 /* 2^32 units */

struct tree_acc {
    int top, w;
    int64_t size[TREE_DEPTH]; /* units in each entry */
    float *vec;               /* [TREE_DEPTH][w] */
};

static float *tree_slot(struct tree_acc *a) {
    return a->vec + (size_t)a->top * (size_t)a->w;
}

static void tree_push(struct tree_acc *a) {
    a->size[a->top++] = 1;
    while (a->top >= 2 && a->size[a->top - 2] == a->size[a->top - 1]) {
        float *left = a->vec + (size_t)(a->top - 2) * (size_t)a->w, *right = left + a->w;
        attn_add(left, right, a->w);
        a->size[a->top - 2] *= 2;
        a->top--;
    }
}

/* The tree's value in vec[0..w) (top >= 1). */
static void tree_finish(struct tree_acc *a) {
    for (int i = a->top - 1; i >= 1; --i) {
        float *left = a->vec + (size_t)(i - 1) * (size_t)a->w, *right = left + a->w;
        attn_add(left, right, a->w);
    }
    a->top = a->top ? 1 : 0;
}

/* Pushes block [b0, b1) of keys (b0 block-aligned; vb its values, row j - b0 each):
 * l = Σ e_j into o[D] and o[d] = Σ e_j v_j[d], ascending j, with e_j = exp(scores[j] - max). */
static void tree_block(struct tree_acc *a, const float *scores, float max, const float *vb, int b0,
                       int b1, int d_len, int simd) {
    float *o = tree_slot(a), p[OPS_ATTN_BLOCK], l = 0.0f;
    if (b1 - b0 == OPS_ATTN_BLOCK) { /* a whole block: the vector exponential where there is one */
        float x[OPS_ATTN_BLOCK];
        for (int j = 0; j < OPS_ATTN_BLOCK; ++j)
            x[j] = scores[b0 + j] - max;
        ops_expf16(p, x);
    } else {
        for (int j = b0; j < b1; ++j)
            p[j - b0] = ops_expf(scores[j] - max);
    }
    for (int j = b0; j < b1; ++j)
        l += p[j - b0];
    o[d_len] = l;
    if (simd == 2) { /* the same sums, d's side by side (ops_attention_simd.c) */
        attn_weighted_sum_avx512(o, p, vb, b1 - b0, d_len);
    } else if (simd) {
        attn_weighted_sum_avx2(o, p, vb, b1 - b0, d_len);
    } else {
        for (int d = 0; d < d_len; ++d)
            o[d] = 0.0f;
        for (int j = 0; j < b1 - b0; ++j)
            for (int d = 0; d < d_len; ++d)
                o[d] = fmaf(p[j], vb[(size_t)j * (size_t)d_len + (size_t)d], o[d]);
    }
    tree_push(a);
}

/* Pushes the blocks of keys [0, seen) of kv head g (block-aligned at 0). */
static void tree_blocks(struct tree_acc *a, const float *scores, float max, const struct ops_kv *kv,
                        int g, int seen, int d_len) {
    const int simd = attn_simd_level();
    float tmp[OPS_ATTN_BLOCK * OPS_ATTN_MAX_HEAD_DIM];
    for (int b0 = 0, b = 0; b0 < seen; b0 += OPS_ATTN_BLOCK, ++b) {
        const int b1 = b0 + OPS_ATTN_BLOCK < seen ? b0 + OPS_ATTN_BLOCK : seen;
        tree_block(a, scores, max, attn_kv_rows(kv, 1, g, b, b1 - b0, d_len, tmp), b0, b1, d_len,
                   simd);
    }
}

static float max_of(const float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; ++i)
        if (x[i] > m) m = x[i];
    return m;
}

/* Task = one (query token, query head) pair. */
static void attention_task(void *ctx, int begin, int end, int worker) {
    const struct attention_job *job = ctx;
    int d_len = job->head_dim, group = job->nh / job->nkv;
    float scale = 1.0f / sqrtf((float)d_len);
    float *scores = job->scratch + (size_t)worker * (size_t)(job->pos + job->n);
    float stack[TREE_DEPTH * (OPS_ATTN_MAX_HEAD_DIM + 1)];
    struct tree_acc acc = {.w = d_len + 1, .vec = stack};
    for (int task = begin; task < end; ++task) {
        int i = task / job->nh, h = task % job->nh;
        int ctx_len = job->pos + i + 1;
        const float *q = job->q + ((size_t)i * (size_t)job->nh + (size_t)h) * (size_t)d_len;
        scores_blocks(&scores, &q, 1, job->kv, h / group, ctx_len, d_len, scale);
        acc.top = 0;
        tree_blocks(&acc, scores, max_of(scores, ctx_len), job->kv, h / group, ctx_len, d_len);
        tree_finish(&acc);
        float *o = job->out + ((size_t)i * (size_t)job->nh + (size_t)h) * (size_t)d_len;
        const float inv = 1.0f / stack[d_len];
        for (int d = 0; d < d_len; ++d)
            o[d] = stack[d] * inv;
    }
}

/* GQA: task = one KV head and a tile of up to `tile` query tokens, their `group` query heads
 * each, interleaved block by block (each block's keys, then each block's values), so that a
 * long context's keys and values stream from memory (and a 16-bit cache's are widened, and
 * on AVX-512 transposed) once per tile and KV head, not once per query head and token: the
 * others find the block in L1. The tile's scores run to its last token's causal end (a
 * score does not depend on which query asks: an earlier token's extra ones go unused); each
 * token's max, block sums and tree use its own positions. Every head's scores, block sums
 * and tree are attention_task's, operation for operation. Scratch per worker (the caller's,
 * sized by attention_scratch_floats): [tile * group][pos + n] scores, then [tile * group]
 * tree stacks (too big for a worker's stack). */

/* 1 when attention() runs the grouped tasks (else one task per query head: the same bits). */
static int grouped(int nh, int nkv) {
    return nkv > 0 && nh % nkv == 0 && nh / nkv <= OPS_ATTN_MAX_GROUP;
}

/* Query tokens per grouped task. */
static int tile_tokens(int group) {
    return group < ATTN_TILE_QUERIES ? ATTN_TILE_QUERIES / group : 1;
}

size_t attention_scratch_floats(int ctx, int nh, int nkv, int head_dim) {
    const size_t c = ctx > 0 ? (size_t)ctx : 0;
    if (!grouped(nh, nkv)) return c; /* attention_task: one head's scores */
    const size_t group = (size_t)(nh / nkv), d = head_dim > 0 ? (size_t)head_dim : 0;
    const size_t queries = group * (size_t)tile_tokens(nh / nkv);
    const size_t keys_as_lanes = attn_lanes_scratch_floats(ctx, head_dim);
    const size_t per_query = queries * (c + (size_t)TREE_DEPTH * (d + 1));
    return per_query > keys_as_lanes ? per_query : keys_as_lanes;
}

/* Queries per call when a tile runs with its queries as lanes (ops_attention_lanes.c): the
 * vector's lanes on the AVX-512 and AVX2 paths, for tiles that fill at least half of them (a
 * decode step's few queries keep the key-lane loops, which use every lane); else 0. The same
 * bits either way. */
static int lanes(int nq) {
    const int width = attn_avx512_enabled() ? 16 : attn_simd_enabled() ? 8 : 0;
    return width && nq >= width / 2 ? width : 0;
}

static void attention_group_task(void *ctx, int begin, int end, int worker) {
    const struct attention_job *job = ctx;
    const int d_len = job->head_dim, group = job->nh / job->nkv, simd = attn_simd_level();
    const int tile = tile_tokens(group);
    const size_t cap = (size_t)(job->pos + job->n);
    const float scale = 1.0f / sqrtf((float)d_len);
    const size_t per_worker = attention_scratch_floats(job->pos + job->n, job->nh, job->nkv, d_len);
    float *sc = job->scratch + (size_t)worker * per_worker;
    float *stacks = sc + (size_t)(tile * group) * cap;
    float maxes[ATTN_TILE_QUERIES * OPS_ATTN_MAX_GROUP];
    float *rows[ATTN_TILE_QUERIES * OPS_ATTN_MAX_GROUP];
    const float *qs[ATTN_TILE_QUERIES * OPS_ATTN_MAX_GROUP];
    float vtmp[OPS_ATTN_BLOCK * OPS_ATTN_MAX_HEAD_DIM]; /* a 16-bit cache's values, widened */
    struct tree_acc acc[ATTN_TILE_QUERIES * OPS_ATTN_MAX_GROUP];
    for (int task = begin; task < end; ++task) {
        /* Tiles of one KV head are neighbours: a worker's run of tasks finds the head's keys
         * and values in its cache. */
        const int tiles = (job->n + tile - 1) / tile;
        const int i0 = task % tiles * tile, g = task / tiles;
        const int i1 = i0 + tile < job->n ? i0 + tile : job->n, nq = (i1 - i0) * group;
        const int last_len = job->pos + i1; /* the tile's last token's causal end */
        for (int i = i0; i < i1; ++i)
            for (int r = 0; r < group; ++r) {
                const int x = (i - i0) * group + r;
                rows[x] = sc + (size_t)x * cap;
                qs[x] = job->q +
                        ((size_t)i * (size_t)job->nh + (size_t)(g * group + r)) * (size_t)d_len;
            }
        const int width = lanes(nq);
        if (width) {
            int ends[ATTN_TILE_QUERIES];
            for (int x = 0; x < nq; ++x) {
                ends[x] = job->pos + i0 + x / group + 1;
                rows[x] = job->out + ((size_t)(i0 + x / group) * (size_t)job->nh +
                                      (size_t)(g * group + x % group)) *
                                         (size_t)d_len;
            }
            for (int x = 0; x < nq; x += width) {
                const int c = nq - x < width ? nq - x : width;
                (width == 16 ? attn_lanes_avx512 : attn_lanes_avx2)(rows + x, qs + x, ends + x, c,
                                                                    job->kv, g, d_len, scale, sc);
            }
            continue;
        }
        scores_blocks(rows, qs, nq, job->kv, g, last_len, d_len, scale);
        for (int x = 0; x < nq; ++x) {
            maxes[x] = max_of(rows[x], job->pos + i0 + x / group + 1);
            acc[x] = (struct tree_acc){
                .w = d_len + 1, .vec = stacks + (size_t)x * TREE_DEPTH * (size_t)(d_len + 1)};
        }
        for (int b0 = 0, b = 0; b0 < last_len; b0 += OPS_ATTN_BLOCK, ++b) {
            const int bn = b0 + OPS_ATTN_BLOCK < last_len ? b0 + OPS_ATTN_BLOCK : last_len;
            const float *vb = attn_kv_rows(job->kv, 1, g, b, bn - b0, d_len, vtmp);
            for (int x = 0; x < nq; ++x) {
                const int ctx_len = job->pos + i0 + x / group + 1;
                if (b0 >= ctx_len) continue; /* past this token's end */
                const int b1 = bn < ctx_len ? bn : ctx_len;
                tree_block(&acc[x], rows[x], maxes[x], vb, b0, b1, d_len, simd);
            }
        }
        for (int x = 0; x < nq; ++x) {
            tree_finish(&acc[x]);
            const int i = i0 + x / group, r = x % group;
            float *o =
                job->out + ((size_t)i * (size_t)job->nh + (size_t)(g * group + r)) * (size_t)d_len;
            const float inv = 1.0f / acc[x].vec[d_len];
            for (int d = 0; d < d_len; ++d)
                o[d] = acc[x].vec[d] * inv;
        }
    }
}

void attention(float *out, const float *q, const struct ops_kv *kv, float *scratch, int pos, int n,
               int nh, int nkv, int head_dim, struct thread_pool *pool) {
    struct attention_job job = {out, q, kv, scratch, pos, n, nh, nkv, head_dim};
    if (grouped(nh, nkv)) {
        const int tile = tile_tokens(nh / nkv);
        thread_pool_run(pool, attention_group_task, &job, (n + tile - 1) / tile * nkv);
        return;
    }
    thread_pool_run(pool, attention_task, &job, n * nh);
}

/* KV parallelism: one (query token, query head) pair over the keys this rank holds. */
struct partial_job {
    float *out;     /* step 1: max [n*nh]; step 2: part [n*nh][D+2] */
    float *scores;  /* [n*nh][held] */
    const float *q; /* step 1 */
    const float *m; /* step 2: the group's max [n*nh] */
    const struct ops_kv *kv;
    int pos, n, lo, held, nh, nkv, head_dim;
};

/* Both steps' tasks over the pool: one per (query token, KV head) where the query heads group
 * (each block of keys or values read once for the group), else one per (token, query head). */
static void partial_run(struct partial_job *job, thread_pool_fn group_task,
                        thread_pool_fn head_task, struct thread_pool *pool) {
    if (grouped(job->nh, job->nkv))
        thread_pool_run(pool, group_task, job, job->n * job->nkv);
    else
        thread_pool_run(pool, head_task, job, job->n * job->nh);
}

/* Keys [lo, pos + i] held here, as a count from local index 0. */
static int keys_seen(const struct partial_job *job, int i) {
    int seen = job->pos + i + 1 - job->lo;
    return seen > job->held ? job->held : seen;
}

static void partial_max_task(void *ctx, int begin, int end, int worker) {
    (void)worker;
    const struct partial_job *job = ctx;
    const int d_len = job->head_dim, group = job->nh / job->nkv;
    const float scale = 1.0f / sqrtf((float)d_len);
    for (int task = begin; task < end; ++task) {
        const int i = task / job->nh, h = task % job->nh, seen = keys_seen(job, i);
        float *scores = job->scores + (size_t)task * (size_t)job->held;
        if (seen <= 0) {
            job->out[task] = -INFINITY;
            continue;
        }
        const float *q = job->q + (size_t)task * (size_t)d_len;
        scores_blocks(&scores, &q, 1, job->kv, h / group, seen, d_len, scale);
        job->out[task] = max_of(scores, seen);
    }
}

/* GQA: task = one query token and one KV head, its `group` query heads together, so that the
 * rank's keys stream from memory once per KV head and token, not once per query head (on a
 * bandwidth-bound box KVP 2 ran no faster than one rank before: each rank read its half of the
 * keys and values `group` times). Each head's scores and max are partial_max_task's. */
static void partial_max_group_task(void *ctx, int begin, int end, int worker) {
    (void)worker;
    const struct partial_job *job = ctx;
    const int d_len = job->head_dim, group = job->nh / job->nkv;
    const float scale = 1.0f / sqrtf((float)d_len);
    float *rows[OPS_ATTN_MAX_GROUP];
    const float *qs[OPS_ATTN_MAX_GROUP];
    for (int task = begin; task < end; ++task) {
        const int i = task / job->nkv, g = task % job->nkv, seen = keys_seen(job, i);
        const size_t first = (size_t)i * (size_t)job->nh + (size_t)(g * group);
        for (int r = 0; r < group; ++r) {
            rows[r] = job->scores + (first + (size_t)r) * (size_t)job->held;
            qs[r] = job->q + (first + (size_t)r) * (size_t)d_len;
            if (seen <= 0) job->out[first + (size_t)r] = -INFINITY;
        }
        if (seen <= 0) continue;
        scores_blocks(rows, qs, group, job->kv, g, seen, d_len, scale);
        for (int r = 0; r < group; ++r)
            job->out[first + (size_t)r] = max_of(rows[r], seen);
    }
}

void attention_partial_max(float *max, float *scores, const float *q, const struct ops_kv *kv,
                           int pos, int n, int lo, int held, int nh, int nkv, int head_dim,
                           struct thread_pool *pool) {
    struct partial_job job = {max, scores, q, NULL, kv, pos, n, lo, held, nh, nkv, head_dim};
    partial_run(&job, partial_max_group_task, partial_max_task, pool);
}

static void partial_task(void *ctx, int begin, int end, int worker) {
    (void)worker;
    const struct partial_job *job = ctx;
    const int d_len = job->head_dim, group = job->nh / job->nkv;
    float stack[TREE_DEPTH * (OPS_ATTN_MAX_HEAD_DIM + 1)];
    struct tree_acc acc = {.w = d_len + 1, .vec = stack};
    for (int task = begin; task < end; ++task) {
        const int i = task / job->nh, h = task % job->nh, seen = keys_seen(job, i);
        float *o = job->out + (size_t)task * (size_t)(d_len + 2);
        for (int d = 0; d < d_len + 2; ++d)
            o[d] = 0.0f;
        if (seen <= 0) continue;
        acc.top = 0;
        tree_blocks(&acc, job->scores + (size_t)task * (size_t)job->held, job->m[task], job->kv,
                    h / group, seen, d_len);
        tree_finish(&acc);
        memcpy(o, stack, (size_t)(d_len + 1) * sizeof(float));
        o[d_len + 1] = 1.0f;
    }
}

/* GQA: task = one query token and one KV head, its `group` query heads' trees fed block by
 * block (each block's values once for all of them, as attention_group_task does); each head's
 * block sums and tree are partial_task's, operation for operation. The trees' stacks are one
 * allocation per run of tasks (too big for a worker's stack at a group of 16); without it the
 * run falls back to partial_task's order, the same bits. */
static void partial_group_task(void *ctx, int begin, int end, int worker) {
    const struct partial_job *job = ctx;
    const int d_len = job->head_dim, group = job->nh / job->nkv, simd = attn_simd_level();
    const size_t w = (size_t)d_len + 1;
    /* A counter over u units holds at most floor(log2 u) + 1 entries, and tree_block writes
     * one more before it pushes: sized by the rank's blocks, not TREE_DEPTH, this stays a
     * small heap chunk (~12 entries at 16k keys) instead of an mmap per call at a group of 16. */
    int depth = 2;
    while (depth < TREE_DEPTH &&
           (1LL << (depth - 2)) < (job->held + OPS_ATTN_BLOCK - 1) / OPS_ATTN_BLOCK)
        ++depth;
    float *stacks = malloc((size_t)group * (size_t)depth * w * sizeof(float));
    if (!stacks) {
        for (int task = begin; task < end; ++task)
            partial_task(ctx, (task / job->nkv) * job->nh + task % job->nkv * group,
                         (task / job->nkv) * job->nh + (task % job->nkv + 1) * group, worker);
        return;
    }
    float vtmp[OPS_ATTN_BLOCK * OPS_ATTN_MAX_HEAD_DIM]; /* a 16-bit cache's values, widened */
    struct tree_acc acc[OPS_ATTN_MAX_GROUP];
    for (int task = begin; task < end; ++task) {
        const int i = task / job->nkv, g = task % job->nkv, seen = keys_seen(job, i);
        const size_t first = (size_t)i * (size_t)job->nh + (size_t)(g * group);
        for (int r = 0; r < group; ++r) {
            float *o = job->out + (first + (size_t)r) * (w + 1);
            for (size_t d = 0; d < w + 1; ++d)
                o[d] = 0.0f;
            acc[r] =
                (struct tree_acc){.w = d_len + 1, .vec = stacks + (size_t)r * (size_t)depth * w};
        }
        if (seen <= 0) continue;
        for (int b0 = 0, b = 0; b0 < seen; b0 += OPS_ATTN_BLOCK, ++b) {
            const int b1 = b0 + OPS_ATTN_BLOCK < seen ? b0 + OPS_ATTN_BLOCK : seen;
            const float *vb = attn_kv_rows(job->kv, 1, g, b, b1 - b0, d_len, vtmp);
            for (int r = 0; r < group; ++r)
                tree_block(&acc[r], job->scores + (first + (size_t)r) * (size_t)job->held,
                           job->m[first + (size_t)r], vb, b0, b1, d_len, simd);
        }
        for (int r = 0; r < group; ++r) {
            float *o = job->out + (first + (size_t)r) * (w + 1);
            tree_finish(&acc[r]);
            memcpy(o, acc[r].vec, w * sizeof(float));
            o[w] = 1.0f;
        }
    }
    free(stacks);
}

void attention_partial(float *part, const float *scores, const float *m, const struct ops_kv *kv,
                       int pos, int n, int lo, int held, int nh, int nkv, int head_dim,
                       struct thread_pool *pool) {
    struct partial_job job = {part, (float *)scores, NULL, m, kv, pos, n, lo, held, nh,
                              nkv,  head_dim};
    partial_run(&job, partial_group_task, partial_task, pool);
}

void attention_merge(float *out, const float *parts, int ranks, int n, int nh, int head_dim) {
    const size_t w = (size_t)head_dim + 2, per_rank = (size_t)n * (size_t)nh * w;
    float stack[TREE_DEPTH * (OPS_ATTN_MAX_HEAD_DIM + 1)];
    struct tree_acc acc = {.w = head_dim + 1, .vec = stack};
    for (size_t t = 0; t < (size_t)n * (size_t)nh; ++t) {
        acc.top = 0;
        for (int k = 0; k < ranks; ++k) {
            const float *p = parts + (size_t)k * per_rank + t * w;
            if (p[head_dim + 1] == 0.0f) continue; /* the query sees no key on rank k */
            memcpy(tree_slot(&acc), p, (size_t)(head_dim + 1) * sizeof(float));
            tree_push(&acc);
        }
        float *o = out + t * (size_t)head_dim;
        if (!acc.top) { /* no key at all: cannot happen for a causal query (it sees itself) */
            memset(o, 0, (size_t)head_dim * sizeof(float));
            continue;
        }
        tree_finish(&acc);
        const float inv = 1.0f / stack[head_dim];
        for (int d = 0; d < head_dim; ++d)
            o[d] = stack[d] * inv;
    }
}

void attention_group_max(float *max, const float *all, int ranks, size_t n) {
    for (size_t t = 0; t < n; ++t)
        for (size_t k = 0; k < (size_t)ranks; ++k)
            if (all[k * n + t] > max[t]) max[t] = all[k * n + t];
}
