/* Grid checks and the TP / KVP shard arithmetic (see tp_shard.h for the layout rules). */
#include "runtime/model/tp_shard.h"

#include <string.h>

#include "runtime/base/status.h"

/* Rank t's equal part of n items over T ranks (T divides n). */
static struct tp_range part(int n, int T, int t) {
    struct tp_range r = {t * (n / T), (t + 1) * (n / T)};
    return r;
}

static int any_dense_layer(const struct model_config *cfg) {
    for (int l = 0; l < cfg->num_layers; ++l)
        if (!model_config_layer_is_moe(cfg, l)) return 1;
    return 0;
}

static int any_moe_layer(const struct model_config *cfg) {
    for (int l = 0; l < cfg->num_layers; ++l)
        if (model_config_layer_is_moe(cfg, l)) return 1;
    return 0;
}

int tp_check(const struct model_config *cfg, int tp, enum tp_moe_mode moe) {
    if (!cfg) return strata_set_error(STRATA_EINVAL, "tp_check: null config");
    if (tp < 1 || tp > GRID_MAX_DEGREE)
        return strata_set_error(STRATA_ERANGE, "TP degree %d is outside [1, %d]", tp,
                                GRID_MAX_DEGREE);
    const int nh = cfg->num_heads, nkv = cfg->num_kv_heads;
    if ((tp & (tp - 1)) != 0 || GRID_SPLIT_LEAVES % tp != 0)
        return strata_set_error(STRATA_ERANGE,
                                "TP %d is not a power of two dividing %d: o_proj / down dot "
                                "products are a fixed tree of %d leaves, and each rank's columns "
                                "must be one subtree of it for TP to change no bit",
                                tp, GRID_SPLIT_LEAVES, GRID_SPLIT_LEAVES);
    if (nh % tp != 0)
        return strata_set_error(STRATA_ERANGE,
                                "TP %d does not divide the %d attention heads (each rank owns "
                                "whole query heads)",
                                tp, nh);
    if (nkv >= tp ? nkv % tp != 0 : tp % nkv != 0)
        return strata_set_error(STRATA_ERANGE,
                                "TP %d does not fit the %d KV heads: KV heads are split when "
                                "TP divides them and replicated when they divide TP",
                                tp, nkv);
    if (any_dense_layer(cfg) && cfg->intermediate_size % tp != 0)
        return strata_set_error(STRATA_ERANGE, "TP %d does not divide the MLP intermediate size %d",
                                tp, cfg->intermediate_size);
    if (any_moe_layer(cfg)) {
        if (moe == TP_MOE_EXPERT_PARALLEL && cfg->num_experts % tp != 0)
            return strata_set_error(STRATA_ERANGE,
                                    "TP %d does not divide the %d experts (expert parallel; "
                                    "--moe split divides each expert instead)",
                                    tp, cfg->num_experts);
        if (moe == TP_MOE_SPLIT && cfg->moe_intermediate_size % tp != 0)
            return strata_set_error(STRATA_ERANGE,
                                    "TP %d does not divide the expert intermediate size %d "
                                    "(--moe split; --moe expert partitions the experts instead)",
                                    tp, cfg->moe_intermediate_size);
    }
    if (cfg->vocab_size % tp != 0)
        return strata_set_error(STRATA_ERANGE,
                                "TP %d does not divide the vocabulary of %d tokens "
                                "(vocab-parallel embedding and LM head)",
                                tp, cfg->vocab_size);
    return STRATA_OK;
}

int tp_shard_init(struct tp_shard *shard, const struct model_config *cfg, int tp, int tp_rank,
                  enum tp_moe_mode moe) {
    if (!shard) return strata_set_error(STRATA_EINVAL, "tp_shard_init: null shard");
    int rc = tp_check(cfg, tp, moe);
    if (rc) return rc;
    if (tp_rank < 0 || tp_rank >= tp)
        return strata_set_error(STRATA_ERANGE, "TP rank %d is outside [0, %d)", tp_rank, tp);
    memset(shard, 0, sizeof *shard);
    shard->tp = tp;
    shard->tp_rank = tp_rank;
    shard->q_heads = part(cfg->num_heads, tp, tp_rank);
    const int nkv = cfg->num_kv_heads;
    if (nkv >= tp) {
        shard->kv_heads = part(nkv, tp, tp_rank);
        shard->kv_replicas = 1;
    } else {
        shard->kv_replicas = tp / nkv;
        int h = tp_rank / shard->kv_replicas;
        shard->kv_heads = (struct tp_range){h, h + 1};
    }
    if (any_dense_layer(cfg)) shard->ffn = part(cfg->intermediate_size, tp, tp_rank);
    if (any_moe_layer(cfg)) {
        const int E = cfg->num_experts, I = cfg->moe_intermediate_size;
        shard->experts =
            moe == TP_MOE_EXPERT_PARALLEL ? part(E, tp, tp_rank) : (struct tp_range){0, E};
        shard->expert_ffn = moe == TP_MOE_SPLIT ? part(I, tp, tp_rank) : (struct tp_range){0, I};
    }
    shard->vocab = part(cfg->vocab_size, tp, tp_rank);
    return STRATA_OK;
}

int grid_config_check(struct grid_config *grid, const struct model_config *cfg, int max_seq) {
    if (!grid || !cfg) return strata_set_error(STRATA_EINVAL, "grid_config_check: null argument");
    const int d[3] = {grid->pp, grid->tp, grid->kvp};
    static const char *const names[3] = {"pipeline (PP)", "tensor (TP)", "KV (KVP)"};
    for (int i = 0; i < 3; ++i)
        if (d[i] < 1 || d[i] > GRID_MAX_DEGREE)
            return strata_set_error(STRATA_ERANGE, "%s degree %d is outside [1, %d]", names[i],
                                    d[i], GRID_MAX_DEGREE);
    if (grid->pp > cfg->num_layers)
        return strata_set_error(STRATA_ERANGE,
                                "%d pipeline stages for %d layers: every stage needs a layer",
                                grid->pp, cfg->num_layers);
    int rc = tp_check(cfg, grid->tp, grid->moe);
    if (rc) return rc;
    if (max_seq < 1) return strata_set_error(STRATA_EINVAL, "max_seq %d < 1", max_seq);
    if (grid->kvp_tokens < 0)
        return strata_set_error(STRATA_ERANGE, "KV tokens per KVP group %d < 0", grid->kvp_tokens);
    if (grid->kvp_tokens == 0) {
        grid->kvp_tokens = (max_seq + grid->kvp - 1) / grid->kvp;
        if (grid->kvp > 1) {
            int aligned = GRID_KV_BLOCK;
            while (aligned < grid->kvp_tokens)
                aligned *= 2;
            grid->kvp_tokens = aligned;
        }
    } else if (grid->kvp > 1 && !kvp_tokens_aligned(grid->kvp_tokens)) {
        return strata_set_error(STRATA_ERANGE,
                                "%d KV tokens per KVP group is not %d x a power of two (16, 32, "
                                "64, ...): each group's tokens must be one aligned subtree of "
                                "attention's %d-token blocks for KVP to change no bit",
                                grid->kvp_tokens, GRID_KV_BLOCK, GRID_KV_BLOCK);
    }
    const int64_t held = (int64_t)grid->kvp_tokens * grid->kvp;
    if (held < max_seq)
        return strata_set_error(STRATA_ERANGE,
                                "KVP %d groups of %d tokens hold %lld tokens, fewer than "
                                "max-seq %d: raise --kvp-tokens to %d or --kvp to %d",
                                grid->kvp, grid->kvp_tokens, (long long)held, max_seq,
                                (max_seq + grid->kvp - 1) / grid->kvp,
                                (max_seq + grid->kvp_tokens - 1) / grid->kvp_tokens);
    if ((int64_t)grid->kvp_tokens * (grid->kvp - 1) >= max_seq)
        return strata_set_error(STRATA_ERANGE,
                                "KVP rank %d would hold no tokens (%d groups of %d tokens for "
                                "max-seq %d): lower --kvp or --kvp-tokens",
                                grid->kvp - 1, grid->kvp, grid->kvp_tokens, max_seq);
    grid->world = grid->pp * grid->tp * grid->kvp;
    return STRATA_OK;
}

int kvp_tokens_aligned(int tokens) {
    if (tokens < GRID_KV_BLOCK || tokens % GRID_KV_BLOCK) return 0;
    const int blocks = tokens / GRID_KV_BLOCK;
    return (blocks & (blocks - 1)) == 0;
}

int grid_rank(const struct grid_config *grid, const struct grid_coords *c) {
    return (c->stage * grid->kvp + c->kvp_rank) * grid->tp + c->tp_rank;
}

void grid_coords_of(struct grid_coords *c, const struct grid_config *grid, int rank) {
    c->tp_rank = rank % grid->tp;
    c->kvp_rank = (rank / grid->tp) % grid->kvp;
    c->stage = rank / (grid->tp * grid->kvp);
}

struct tp_range kvp_token_range(const struct grid_config *grid, int kvp_rank, int max_seq) {
    int64_t start = (int64_t)kvp_rank * grid->kvp_tokens;
    int64_t end = start + grid->kvp_tokens;
    if (end > max_seq) end = max_seq;
    if (start > end) start = end;
    return (struct tp_range){(int)start, (int)end};
}

static void set_split(struct tp_slice *s, int dim, int64_t extent, int64_t start, int64_t count) {
    s->kind = TP_SLICE_SPLIT;
    s->dim = dim;
    s->extent = extent;
    s->start = start;
    s->count = count;
    s->parts = 1;
    s->part_stride = 0;
}

/* Per-expert and fused expert tensors (the MoE half of tp_tensor_slice). */
static void expert_slice(struct tp_slice *out, const struct tp_shard *sh,
                         const struct stage_tensor *t, enum stage_tensor_layout layout) {
    const int64_t n = sh->expert_ffn.end - sh->expert_ffn.start;
    const int out_major = layout != STAGE_LAYOUT_IN_MAJOR;
    switch (t->slot) {
    case STAGE_SLOT_EXPERT_GATE:
    case STAGE_SLOT_EXPERT_UP:
    case STAGE_SLOT_EXPERT_DOWN: {
        if (t->expert < sh->experts.start || t->expert >= sh->experts.end) {
            out->kind = TP_SLICE_ABSENT;
            return;
        }
        const int dim = t->slot == STAGE_SLOT_EXPERT_DOWN ? 1 : 0;
        set_split(out, dim, t->shape[dim], sh->expert_ffn.start, n);
        return;
    }
    case STAGE_SLOT_EXPERTS_GATE_UP:
    case STAGE_SLOT_EXPERTS_DOWN: {
        const int64_t E = t->shape[0];
        const int64_t held = sh->experts.end - sh->experts.start;
        if (held < E) { /* expert parallel: whole experts along dim 0 */
            set_split(out, 0, E, sh->experts.start, held);
            return;
        }
        /* Split: the I axis, dim 1 or 2 depending on the layout (t->shape is in t->layout,
         * the slice in the stored `layout`). */
        const int gate_up = t->slot == STAGE_SLOT_EXPERTS_GATE_UP;
        const int listed_out_major = t->layout != STAGE_LAYOUT_IN_MAJOR;
        const int64_t I =
            gate_up ? t->shape[listed_out_major ? 1 : 2] / 2 : t->shape[listed_out_major ? 2 : 1];
        const int dim = gate_up == out_major ? 1 : 2;
        set_split(out, dim, gate_up ? 2 * I : I, sh->expert_ffn.start, n);
        if (gate_up) {
            out->parts = 2; /* the gate rows, then the up rows */
            out->part_stride = I;
        }
        return;
    }
    default: return;
    }
}

int tp_tensor_slice(struct tp_slice *out, const struct tp_shard *sh, const struct stage_tensor *t,
                    enum stage_tensor_layout layout) {
    if (!out || !sh || !t) return strata_set_error(STRATA_EINVAL, "tp_tensor_slice: null argument");
    memset(out, 0, sizeof *out);
    out->kind = TP_SLICE_REPLICATED;
    if (sh->tp == 1) return STRATA_OK;
    const int64_t nq = sh->q_heads.end - sh->q_heads.start;
    const int64_t nkv = sh->kv_heads.end - sh->kv_heads.start;
    switch (t->slot) {
    case STAGE_SLOT_Q:
    case STAGE_SLOT_Q_BIAS:
    case STAGE_SLOT_O: {
        /* head_dim = rows / heads; the head count is tp × nq. */
        const int dim = t->slot == STAGE_SLOT_O ? 1 : 0;
        const int64_t hd = t->shape[dim] / (nq * sh->tp);
        set_split(out, dim, t->shape[dim], sh->q_heads.start * hd, nq * hd);
        break;
    }
    case STAGE_SLOT_K:
    case STAGE_SLOT_V:
    case STAGE_SLOT_K_BIAS:
    case STAGE_SLOT_V_BIAS: {
        const int64_t heads = nkv * sh->tp / sh->kv_replicas;
        const int64_t hd = t->shape[0] / heads;
        set_split(out, 0, t->shape[0], sh->kv_heads.start * hd, nkv * hd);
        break;
    }
    case STAGE_SLOT_GATE:
    case STAGE_SLOT_UP:
        set_split(out, 0, t->shape[0], sh->ffn.start, sh->ffn.end - sh->ffn.start);
        break;
    case STAGE_SLOT_DOWN:
        set_split(out, 1, t->shape[1], sh->ffn.start, sh->ffn.end - sh->ffn.start);
        break;
    case STAGE_SLOT_EMBED:
    case STAGE_SLOT_LM_HEAD:
        set_split(out, 0, t->shape[0], sh->vocab.start, sh->vocab.end - sh->vocab.start);
        break;
    case STAGE_SLOT_EXPERT_GATE:
    case STAGE_SLOT_EXPERT_UP:
    case STAGE_SLOT_EXPERT_DOWN:
    case STAGE_SLOT_EXPERTS_GATE_UP:
    case STAGE_SLOT_EXPERTS_DOWN: expert_slice(out, sh, t, layout); break;
    default: break; /* norms, o bias, router, vision tower: replicated */
    }
    if (out->kind == TP_SLICE_SPLIT && out->count * out->parts == out->extent)
        out->kind = TP_SLICE_REPLICATED; /* e.g. a whole expert under expert parallelism */
    return STRATA_OK;
}

uint64_t tp_slice_bytes(const struct tp_slice *slice, uint64_t full_bytes) {
    switch (slice->kind) {
    case TP_SLICE_ABSENT: return 0;
    case TP_SLICE_SPLIT:
        return full_bytes / (uint64_t)slice->extent * (uint64_t)slice->count *
               (uint64_t)slice->parts;
    default: return full_bytes;
    }
}
