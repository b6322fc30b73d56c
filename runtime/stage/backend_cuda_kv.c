/* The CUDA backend's KV cache (backend_cuda.c has the design): a pool of blocks on the
 * device in reference/kv_cache.h's layout, the bookkeeping on the host in
 * reference/kv_blocks.h (the CPU backend's, so both count, reserve and free blocks alike),
 * and the block tables mirrored on the device for the kernels.
 *
 * A block is [layers][kv_heads][KV_BLOCK][head_dim] elements of K and as many of V, stored as
 * --kv-dtype says (f32, or bf16 / f16 bit patterns that cuda_kv_store rounds and the
 * attention kernels widen, as the reference ops do), so all of one block's positions, every
 * layer, are one contiguous copy: pack and restore move a slot block by block through a host
 * buffer and walk the table in runs of up to KV_BLOCK positions on the host, widening a
 * 16-bit block into the f32 handoff and narrowing it back exactly as reference/kv_cache.c
 * does (a handoff names the dtype it was stored as and restores only into the same). The copies are
 * synchronous on the legacy stream, which does not wait for the backend's non-blocking stream: a
 * call that succeeded left that stream idle, and one that failed may not have, so the stream is
 * synchronised first.
 *
 * The device tables: slot s's row of [num_slots][slot_blocks] never moves, so a decode
 * graph's attention reads the current table of each slot through the same pointer; entries
 * are appended (a slot only grows) and uploaded before the forward that first reads them,
 * from pinned staging on the backend's stream, outside any capture. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "reference/kv_cache.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/backend_cuda_internal.h"

/* Blocks allocated: the pool, and under KVP one spare that takes the rows of positions
 * another rank holds (so the KV append of a microbatch stays one launch of all its rows). */
static size_t pool_blocks(const struct cuda_context *c) {
    return (size_t)c->kv.num_blocks + (c->kvp > 1 ? 1 : 0);
}

int backend_cuda_kv_open(struct cuda_context *c, const struct stage_backend_options *opt) {
    const int D = c->cfg->head_dim;
    if (opt->kv_dtype != OPS_F32 && opt->kv_dtype != OPS_BF16 && opt->kv_dtype != OPS_F16)
        return strata_set_error(STRATA_EINVAL, "cuda backend: KV dtype %d is not f32, bf16 or f16",
                                (int)opt->kv_dtype);
    c->kv_dtype = opt->kv_dtype;
    c->block_elems = (size_t)c->n_layers * (size_t)c->nkv * KV_BLOCK * (size_t)D;
    const size_t block_bytes = 2 * c->block_elems * ops_kv_elem_bytes(c->kv_dtype);
    size_t free_bytes = 0;
    int blocks = 0, rc;
    /* A stage without layers holds no KV: its slots need no budget. */
    if (block_bytes && opt->kv_memory_fraction > 0 && (rc = cuda_mem_info(&free_bytes, NULL)))
        return rc;
    if (block_bytes &&
        (rc = stage_backend_kv_blocks(opt, free_bytes, block_bytes, c->kvp_held, &blocks)))
        return rc;
    if ((rc = kv_blocks_init(&c->kv, c->kvp_held, opt->num_slots, blocks))) return rc;
    const size_t table = (size_t)c->kv.num_slots * (size_t)c->kv.slot_blocks * sizeof(int32_t);
    const size_t bytes = c->block_elems * pool_blocks(c) * ops_kv_elem_bytes(c->kv_dtype);
    if (!(c->tables_sent = calloc((size_t)opt->num_slots, sizeof *c->tables_sent)))
        return strata_set_error(STRATA_ENOMEM, "cuda backend: out of host memory");
    /* Zeroed like the reference's calloc'd pool (never read past a slot's length), the
     * tables too (an entry is uploaded before it is read). */
    if ((rc = cuda_malloc((void **)&c->k_cache, bytes)) ||
        (rc = cuda_malloc((void **)&c->v_cache, bytes)) ||
        (rc = cuda_malloc((void **)&c->tables, table)) ||
        (rc = cuda_host_alloc((void **)&c->h_tables, table)) ||
        (rc = cuda_memset(c->k_cache, 0, bytes)) || (rc = cuda_memset(c->v_cache, 0, bytes)) ||
        (rc = cuda_memset(c->tables, 0, table)))
        return rc;
    return 0;
}

void backend_cuda_kv_close(struct cuda_context *c) {
    cuda_free(c->k_cache);
    cuda_free(c->v_cache);
    cuda_free(c->tables);
    cuda_host_free(c->h_tables);
    free(c->tables_sent);
    kv_blocks_free(&c->kv);
    c->k_cache = c->v_cache = NULL;
    c->tables = c->h_tables = NULL;
    c->tables_sent = NULL;
}

int backend_cuda_kv_held(const struct cuda_context *c, int positions) {
    if (c->kvp <= 1) return positions;
    const int held = positions - c->kvp_lo;
    return held < 0 ? 0 : held > c->kvp_held ? c->kvp_held : held;
}

int backend_cuda_kv_prepare(struct cuda_context *c, const struct forward_item *items, int n_items) {
    if (c->n_layers == 0) return 0; /* no layer: nothing is cached */
    int rc = 0;
    for (int it = 0; it < n_items && !rc; ++it)
        rc = kv_blocks_grow(&c->kv, items[it].slot,
                            backend_cuda_kv_held(c, items[it].pos + items[it].n_tokens));
    /* Even after a failed growth: the slots grown before it keep their blocks. */
    for (int it = 0; it < n_items; ++it) {
        const int s = items[it].slot, from = c->tables_sent[s], to = c->kv.held[s];
        if (to <= from) continue;
        const size_t at = (size_t)s * (size_t)c->kv.slot_blocks + (size_t)from;
        memcpy(c->h_tables + at, kv_blocks_table(&c->kv, s) + from,
               (size_t)(to - from) * sizeof(int32_t));
        const int up = cuda_memcpy_async(c->tables + at, c->h_tables + at,
                                         (size_t)(to - from) * sizeof(int32_t), CUDA_COPY_TO_DEVICE,
                                         c->stream);
        if (up) return up;
        c->tables_sent[s] = to;
    }
    return rc;
}

int64_t backend_cuda_kv_row_offset(const struct cuda_context *c, int slot, int local) {
    if (local < 0 || local >= c->kvp_held) /* another KVP rank's position: the spare block */
        return (int64_t)((size_t)c->kv.num_blocks * c->block_elems);
    return (int64_t)((size_t)kv_blocks_table(&c->kv, slot)[local / KV_BLOCK] * c->block_elems +
                     (size_t)(local % KV_BLOCK) * (size_t)c->cfg->head_dim);
}

int backend_cuda_kv_acquire(struct stage_backend *be, int *slot) {
    int rc = kv_blocks_acquire(&ctx(be)->kv, slot);
    if (rc == STRATA_EBUSY)
        return strata_set_error(STRATA_EBUSY, "cuda kv: all %d slots are in use", be->num_slots);
    return rc;
}

/* Positions are global: a KVP rank reserves its share of them (slot -1 only asks). */
int backend_cuda_kv_reserve(struct stage_backend *be, int slot, int positions) {
    struct cuda_context *c = ctx(be);
    return kv_blocks_reserve(&c->kv, slot, backend_cuda_kv_held(c, positions));
}

void backend_cuda_kv_release(struct stage_backend *be, int slot) {
    struct cuda_context *c = ctx(be);
    if (slot < 0 || slot >= c->kv.num_slots) return;
    kv_blocks_release(&c->kv, slot);
    c->tables_sent[slot] = 0; /* its next blocks are other ones: uploaded afresh */
}

/* The table keeps its blocks (uploaded already): only the host length drops, and the next
 * forward's row offsets and lengths follow from it. */
int backend_cuda_kv_truncate(struct stage_backend *be, int slot, int positions) {
    return kv_blocks_truncate(&ctx(be)->kv, slot, positions);
}

size_t backend_cuda_kv_bytes(const struct stage_backend *be) {
    const struct cuda_context *c = ctx(be);
    return 2 * c->block_elems * pool_blocks(c) * ops_kv_elem_bytes(c->kv_dtype);
}

/* Prefix reuse: as the CPU backend (backend.h), through the same bookkeeping; attached
 * blocks are table entries like grown ones, uploaded by the next prepare. */
int backend_cuda_kv_lookup(const struct stage_backend *be, const uint64_t *keys, int n,
                           int *cached) {
    const struct cuda_context *c = ctx(be);
    if (c->kvp <= 1) return kv_blocks_lookup(&c->kv, keys, n, cached);
    int lo, hi; /* this rank's part of the group's answer (the TP leader gathers the least) */
    kv_blocks_rank_range(n, c->kvp_lo, c->kvp_held, &lo, &hi);
    return kv_blocks_lookup_range(&c->kv, keys, n, lo, hi, cached);
}

int backend_cuda_kv_attach(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    struct cuda_context *c = ctx(be);
    int lo = 0, hi = n;
    if (c->kvp > 1) kv_blocks_rank_range(n, c->kvp_lo, c->kvp_held, &lo, &hi);
    const int want = hi - lo;
    const int got = want ? kv_blocks_attach(&c->kv, slot, keys + lo, want, n * KV_BLOCK) : 0;
    if (got < 0) return got;
    if (got < want) return got * KV_BLOCK; /* a miss: the caller refuses */
    c->kv.len[slot] = n * KV_BLOCK;        /* lengths are global under KVP */
    return n * KV_BLOCK;
}

void backend_cuda_kv_register(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    struct cuda_context *c = ctx(be);
    int lo = 0, hi = n;
    if (c->kvp > 1) kv_blocks_rank_range(n, c->kvp_lo, c->kvp_held, &lo, &hi);
    if (hi > lo) kv_blocks_register(&c->kv, slot, keys + lo, hi - lo);
}

void backend_cuda_kv_forget(struct stage_backend *be) {
    kv_blocks_forget(&ctx(be)->kv);
}

void backend_cuda_kv_usage(const struct stage_backend *be, struct stage_kv_usage *out) {
    const struct cuda_context *c = ctx(be);
    *out =
        (struct stage_kv_usage){.dtype = c->kv_dtype,
                                .blocks = c->kv.num_blocks,
                                .free = c->kv.num_free,
                                .cached = c->kv.num_cached,
                                .promised = c->kv.promised,
                                .block_positions = KV_BLOCK,
                                .block_bytes = 2 * c->block_elems * ops_kv_elem_bytes(c->kv_dtype)};
}

/* A KVP rank holds some positions of each slot: its cache is not a handoff of the slot. */
static int check_kvp(const struct cuda_context *c, const char *what) {
    if (c->kvp <= 1) return 0;
    return strata_set_error(STRATA_EINVAL,
                            "%s: a KVP rank holds only positions [%d, %d) of each sequence (no KV "
                            "handoff under KVP)",
                            what, c->kvp_lo, c->kvp_lo + c->kvp_held);
}

/* The handoff layout (decoder_io.h): [layer][batch][head][seq][D]. */
static size_t handoff_offset(const struct kv_handoff *h, int l, int b, int head) {
    return (((size_t)l * (size_t)h->batch + (size_t)b) * (size_t)h->kv_heads + (size_t)head) *
           (size_t)h->seq * (size_t)h->head_dim;
}

/* n elements of a block stored as dtype <-> n f32 in the handoff (any alignment: a restore
 * may read a frame): f32 copied, 16-bit widened (to_block 0) or rounded (1) with
 * runtime/base/dtype.h, reference/kv_cache.c's copy_runs element for element. Narrowing a
 * value a 16-bit cache widened gives back its bits. */
static void convert_run(unsigned char *block, unsigned char *rows, size_t n, enum ops_dtype dtype,
                        int to_block) {
    if (dtype == OPS_F32) {
        if (to_block)
            memcpy(block, rows, n * sizeof(float));
        else
            memcpy(rows, block, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        float f;
        if (to_block) {
            memcpy(&f, rows + i * sizeof f, sizeof f);
            bits = dtype == OPS_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
            memcpy(block + i * sizeof bits, &bits, sizeof bits);
        } else {
            memcpy(&bits, block + i * sizeof bits, sizeof bits);
            f = dtype == OPS_BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
            memcpy(rows + i * sizeof f, &f, sizeof f);
        }
    }
}

/* The block of batch row b that holds its positions [j0, j0 + run) (j0 block-aligned),
 * between its host copy kb / vb [layers][kv_heads][KV_BLOCK][D] (c->kv_dtype elements) and
 * the handoff's f32 rows: to_block 0 copies the block out into the handoff, 1 the handoff
 * into the block. */
static void copy_block_runs(const struct cuda_context *c, const struct kv_handoff *h, int b, int j0,
                            int run, unsigned char *kb, unsigned char *vb, int to_block) {
    const size_t D = (size_t)c->cfg->head_dim, n = (size_t)run * D;
    const size_t es = ops_kv_elem_bytes(c->kv_dtype);
    unsigned char *hk = (unsigned char *)(uintptr_t)h->k, *hv = (unsigned char *)(uintptr_t)h->v;
    for (int l = 0; l < c->n_layers; ++l)
        for (int g = 0; g < c->nkv; ++g) {
            const size_t in_block = ((size_t)l * (size_t)c->nkv + (size_t)g) * KV_BLOCK * D * es;
            const size_t in_handoff = (handoff_offset(h, l, b, g) + (size_t)j0 * D) * sizeof(float);
            convert_run(kb + in_block, hk + in_handoff, n, c->kv_dtype, to_block);
            convert_run(vb + in_block, hv + in_handoff, n, c->kv_dtype, to_block);
        }
}

/* Host room for one block of K and one of V, as the cache stores them. */
static unsigned char *block_buffer(const struct cuda_context *c, const char *what) {
    unsigned char *buf =
        calloc(2 * (c->block_elems ? c->block_elems : 1), ops_kv_elem_bytes(c->kv_dtype));
    if (!buf) strata_set_error(STRATA_ENOMEM, "%s: no memory for a block", what);
    return buf;
}

int backend_cuda_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots,
                         int n) {
    struct cuda_context *c = ctx(be);
    int seq = 0, rc;
    memset(out, 0, sizeof *out);
    if ((rc = check_kvp(c, "cuda kv pack")) ||
        (rc = kv_blocks_check_slots(&c->kv, slots, n, "cuda kv pack")) ||
        (rc = cuda_set_device(c->device)) || (rc = backend_cuda_sync(c)))
        return rc;
    for (int b = 0; b < n; ++b)
        if (c->kv.len[slots[b]] > seq) seq = c->kv.len[slots[b]];
    *out = (struct kv_handoff){.layer_start = c->role.layer_start,
                               .layer_end = c->role.layer_end,
                               .batch = n,
                               .kv_heads = c->nkv,
                               .seq = seq,
                               .head_dim = c->cfg->head_dim,
                               .stored_dtype = (int)c->kv_dtype};
    size_t numel = kv_handoff_numel(out);
    /* One allocation: k, v, then the lengths (f32 then i32: alignment holds). */
    float *k = calloc(2 * numel * sizeof(float) + (size_t)n * sizeof(int32_t), 1);
    unsigned char *blk = k ? block_buffer(c, "cuda kv pack") : NULL;
    if (!k || !blk) {
        free(k);
        memset(out, 0, sizeof *out);
        return k ? STRATA_ENOMEM
                 : strata_set_error(STRATA_ENOMEM, "cuda kv pack: cannot allocate %zu floats",
                                    2 * numel);
    }
    out->k = k;
    out->v = k + numel;
    const size_t bytes = c->block_elems * ops_kv_elem_bytes(c->kv_dtype);
    for (int b = 0; b < n && !rc && c->n_layers > 0; ++b) {
        const int32_t *table = kv_blocks_table(&c->kv, slots[b]);
        const int len = c->kv.len[slots[b]];
        for (int j0 = 0; j0 < len && !rc; j0 += KV_BLOCK) {
            const size_t at = (size_t)table[j0 / KV_BLOCK] * bytes;
            const int run = len - j0 < KV_BLOCK ? len - j0 : KV_BLOCK;
            if (!(rc = cuda_memcpy_to_host(blk, (char *)c->k_cache + at, bytes)) &&
                !(rc = cuda_memcpy_to_host(blk + bytes, (char *)c->v_cache + at, bytes)))
                copy_block_runs(c, out, b, j0, run, blk, blk + bytes, 0);
        }
    }
    free(blk);
    if (rc) {
        free(k);
        memset(out, 0, sizeof *out);
        return rc;
    }
    int32_t *lengths = (int32_t *)(k + 2 * numel);
    for (int b = 0; b < n; ++b)
        lengths[b] = c->kv.len[slots[b]];
    out->lengths = lengths;
    out->owned = k;
    return 0;
}

static int check_handoff(const struct cuda_context *c, int n, const struct kv_handoff *in) {
    const int D = c->cfg->head_dim;
    if (in->stored_dtype != (int)c->kv_dtype)
        return strata_set_error(STRATA_EFORMAT,
                                "kv restore: the block was stored as %s, this cache stores %s "
                                "(--kv-dtype must be the same)",
                                kv_dtype_name((enum ops_dtype)in->stored_dtype),
                                kv_dtype_name(c->kv_dtype));
    if (in->layer_start != c->role.layer_start || in->layer_end != c->role.layer_end)
        return strata_set_error(
            STRATA_ERANGE, "kv restore: block holds layers [%d, %d) but the cache holds [%d, %d)",
            in->layer_start, in->layer_end, c->role.layer_start, c->role.layer_end);
    if (in->kv_heads != c->nkv || in->head_dim != D || in->seq < 0)
        return strata_set_error(STRATA_EFORMAT,
                                "kv restore: block shape [%d, %d, %d, %d, %d] does not fit a cache "
                                "of %d layers, %d kv heads, head_dim %d",
                                in->layer_end - in->layer_start, in->batch, in->kv_heads, in->seq,
                                in->head_dim, c->n_layers, c->nkv, D);
    if (in->batch != n)
        return strata_set_error(
            STRATA_EINVAL, "kv restore: block has %d batch rows, %d slots given", in->batch, n);
    for (int b = 0; b < n; ++b)
        if (in->lengths[b] < 0 || in->lengths[b] > in->seq || in->lengths[b] > c->kv.max_seq)
            return strata_set_error(STRATA_ERANGE,
                                    "kv restore: row %d holds %d positions, cache capacity %d", b,
                                    (int)in->lengths[b], c->kv.max_seq);
    return 0;
}

int backend_cuda_kv_restore(struct stage_backend *be, const int *slots, int n,
                            const struct kv_handoff *in) {
    struct cuda_context *c = ctx(be);
    int rc;
    if ((rc = check_kvp(c, "kv restore")) || (rc = check_handoff(c, n, in)) ||
        (rc = kv_blocks_check_slots(&c->kv, slots, n, "kv restore")) ||
        (rc = cuda_set_device(c->device)) || (rc = backend_cuda_sync(c)))
        return rc;
    /* The blocks first, as kv_cache_restore takes them (a pool without them: nothing
     * written). The device tables follow at the next forward (kv_prepare). */
    for (int b = 0; b < n && !rc && c->n_layers > 0; ++b)
        rc = kv_blocks_grow(&c->kv, slots[b], in->lengths[b]);
    unsigned char *blk = rc ? NULL : block_buffer(c, "cuda kv restore");
    if (!rc && !blk) rc = STRATA_ENOMEM;
    const size_t bytes = c->block_elems * ops_kv_elem_bytes(c->kv_dtype);
    for (int b = 0; b < n && !rc && c->n_layers > 0; ++b) {
        const int32_t *table = kv_blocks_table(&c->kv, slots[b]);
        for (int j0 = 0; j0 < in->lengths[b] && !rc; j0 += KV_BLOCK) {
            const size_t at = (size_t)table[j0 / KV_BLOCK] * bytes;
            const int run = in->lengths[b] - j0 < KV_BLOCK ? in->lengths[b] - j0 : KV_BLOCK;
            /* A block cut short by the length keeps zeros past it (never read). */
            if (run < KV_BLOCK) memset(blk, 0, 2 * bytes);
            copy_block_runs(c, in, b, j0, run, blk, blk + bytes, 1);
            if (!(rc = cuda_memcpy_to_device((char *)c->k_cache + at, blk, bytes)))
                rc = cuda_memcpy_to_device((char *)c->v_cache + at, blk + bytes, bytes);
        }
    }
    free(blk);
    if (rc) return rc;
    for (int b = 0; b < n; ++b)
        c->kv.len[slots[b]] = in->lengths[b];
    return 0;
}
