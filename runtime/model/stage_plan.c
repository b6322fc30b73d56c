/* Shard planning: even split, explicit range checks, and the memory-proportional
 * planner (an exact O(S·L²) dynamic program over contiguous splits; L <= 1024 and
 * S <= 256 keep it well under a second). See stage_plan.h for the memory model. */
#include "runtime/model/stage_plan.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/model/stage_tensors.h"

int stage_plan_even(struct stage_range *out, int num_layers, int num_stages) {
    if (!out) return strata_set_error(STRATA_EINVAL, "stage_plan_even: null output");
    if (num_layers < 1)
        return strata_set_error(STRATA_EINVAL, "cannot split %d layers", num_layers);
    if (num_stages < 1 || num_stages > num_layers || num_stages > STAGE_PLAN_MAX_STAGES)
        return strata_set_error(STRATA_ERANGE,
                                "cannot split %d layers into %d stages (need 1 <= stages <= "
                                "min(layers, %d))",
                                num_layers, num_stages, STAGE_PLAN_MAX_STAGES);
    int base = num_layers / num_stages, rem = num_layers % num_stages, start = 0;
    for (int s = 0; s < num_stages; ++s) {
        int n = base + (s < rem ? 1 : 0);
        out[s].layer_start = start;
        out[s].layer_end = start + n;
        start += n;
    }
    return STRATA_OK;
}

int stage_plan_check_range(int layer_start, int layer_end, int num_layers) {
    if (layer_start >= layer_end)
        return strata_set_error(STRATA_ERANGE, "layer range [%d, %d) is empty", layer_start,
                                layer_end);
    if (layer_start < 0 || layer_end > num_layers)
        return strata_set_error(STRATA_ERANGE,
                                "layer range [%d, %d) is outside the model's layers [0, %d)",
                                layer_start, layer_end, num_layers);
    return STRATA_OK;
}

static int cmp_range(const void *a, const void *b) {
    const struct stage_range *x = a, *y = b;
    return (x->layer_start > y->layer_start) - (x->layer_start < y->layer_start);
}

int stage_plan_check_ranges(const struct stage_range *ranges, int n, int num_layers,
                            int require_cover) {
    if (!ranges || n < 1 || n > STAGE_PLAN_MAX_STAGES)
        return strata_set_error(STRATA_EINVAL, "need 1 to %d layer ranges, got %d",
                                STAGE_PLAN_MAX_STAGES, n);
    struct stage_range sorted[STAGE_PLAN_MAX_STAGES];
    for (int i = 0; i < n; ++i) {
        int rc = stage_plan_check_range(ranges[i].layer_start, ranges[i].layer_end, num_layers);
        if (rc) return rc;
        sorted[i] = ranges[i];
    }
    qsort(sorted, (size_t)n, sizeof sorted[0], cmp_range);
    for (int i = 1; i < n; ++i) {
        if (sorted[i].layer_start < sorted[i - 1].layer_end)
            return strata_set_error(STRATA_ERANGE, "layer ranges [%d, %d) and [%d, %d) overlap",
                                    sorted[i - 1].layer_start, sorted[i - 1].layer_end,
                                    sorted[i].layer_start, sorted[i].layer_end);
    }
    if (!require_cover) return STRATA_OK;
    if (sorted[0].layer_start != 0)
        return strata_set_error(STRATA_ERANGE, "no stage owns layers [0, %d)",
                                sorted[0].layer_start);
    for (int i = 1; i < n; ++i) {
        if (sorted[i].layer_start != sorted[i - 1].layer_end)
            return strata_set_error(STRATA_ERANGE, "no stage owns layers [%d, %d)",
                                    sorted[i - 1].layer_end, sorted[i].layer_start);
    }
    if (sorted[n - 1].layer_end != num_layers)
        return strata_set_error(STRATA_ERANGE, "no stage owns layers [%d, %d)",
                                sorted[n - 1].layer_end, num_layers);
    return STRATA_OK;
}

uint64_t stage_plan_workspace_bytes(const struct model_config *cfg,
                                    const struct stage_memory_options *opt,
                                    uint64_t *logits_bytes) {
    const uint64_t T = (uint64_t)(opt->chunk_tokens > 0 ? opt->chunk_tokens : 1);
    const uint64_t H = (uint64_t)cfg->hidden_size, D = (uint64_t)cfg->head_dim;
    const uint64_t nh = (uint64_t)cfg->num_heads, nkv = (uint64_t)cfg->num_kv_heads;
    const uint64_t seq = (uint64_t)(opt->max_seq > 0 ? opt->max_seq : 1);
    uint64_t mlp = (uint64_t)cfg->intermediate_size;
    uint64_t moe = (uint64_t)cfg->num_experts_per_tok * (uint64_t)cfg->moe_intermediate_size;
    if (cfg->num_experts > 0 && moe > mlp) mlp = moe;
    uint64_t floats = 3 * T * H + T * (nh + 2 * nkv) * D + T * nh * D + nh * T * seq + 2 * T * mlp;
    if (logits_bytes) *logits_bytes = T * (uint64_t)cfg->vocab_size * 4;
    return floats * 4;
}

size_t stage_plan_dtype_bytes(const char *name) {
    if (strcmp(name, "float32") == 0) return 4;
    if (strcmp(name, "float64") == 0) return 8;
    return 2;
}

int stage_memory_model_build(struct stage_memory_model *mm, const struct model_config *cfg,
                             const struct safetensors *st, const struct stage_memory_options *opt) {
    if (!mm || !cfg || !opt)
        return strata_set_error(STRATA_EINVAL, "stage_memory_model_build: null argument");
    if (opt->kv_dtype_bytes == 0 || opt->max_seq < 1 || opt->batch < 1)
        return strata_set_error(STRATA_EINVAL,
                                "memory model needs kv dtype bytes, max_seq and batch >= 1");
    memset(mm, 0, sizeof *mm);
    mm->num_layers = cfg->num_layers;
    struct stage_tensor_list list = {0};
    struct stage_role role = {0, cfg->num_layers, 1, 1, opt->with_vision && cfg->has_vision};
    int rc = stage_tensor_list_build(&list, cfg, &role, st);
    if (rc) return rc;
    const size_t elem = stage_plan_dtype_bytes(cfg->torch_dtype);
    for (int i = 0; i < list.count; ++i) {
        const struct stage_tensor *t = &list.items[i];
        uint64_t bytes;
        const struct st_tensor *stored = st ? safetensors_find(st, t->name) : NULL;
        if (stored) {
            bytes = stored->nbytes;
        } else {
            bytes = elem;
            for (int d = 0; d < t->ndim; ++d)
                bytes *= (uint64_t)t->shape[d];
        }
        switch (t->kind) {
        case STAGE_TENSOR_LAYER: mm->layer_weight_bytes[t->layer] += bytes; break;
        case STAGE_TENSOR_EMBED: mm->embed_bytes = bytes; break;
        case STAGE_TENSOR_VISION: mm->vision_bytes += bytes; break;
        case STAGE_TENSOR_NORM: mm->norm_bytes = bytes; break;
        case STAGE_TENSOR_LM_HEAD: mm->head_bytes = bytes; break;
        }
    }
    mm->head_is_embed = list.head_is_embed;
    if (mm->head_is_embed) mm->head_bytes = mm->embed_bytes;
    stage_tensor_list_free(&list);
    mm->kv_bytes_per_layer = 2ull * (uint64_t)cfg->num_kv_heads * (uint64_t)cfg->head_dim *
                             (uint64_t)opt->kv_dtype_bytes * (uint64_t)opt->max_seq *
                             (uint64_t)opt->batch;
    mm->workspace_bytes = stage_plan_workspace_bytes(cfg, opt, &mm->logits_bytes);
    return STRATA_OK;
}

/* Prices stage `s` of `num_stages` owning [start, end); `prefix` holds prefix sums of the
 * layer weights ([L + 1]). */
void stage_plan_price_stage(struct stage_plan_entry *e, const struct stage_memory_model *mm,
                            const uint64_t *prefix, int s, int num_stages, int start, int end) {
    e->range.layer_start = start;
    e->range.layer_end = end;
    e->weight_bytes = prefix[end] - prefix[start];
    e->kv_bytes = mm->kv_bytes_per_layer * (uint64_t)(end - start);
    e->workspace_bytes = mm->workspace_bytes;
    if (s == 0) e->weight_bytes += mm->embed_bytes + mm->vision_bytes;
    if (s == num_stages - 1) {
        e->weight_bytes += mm->norm_bytes;
        if (!(num_stages == 1 && mm->head_is_embed)) e->weight_bytes += mm->head_bytes;
        e->workspace_bytes += mm->logits_bytes;
    }
    e->total_bytes = e->weight_bytes + e->kv_bytes + e->workspace_bytes;
}

void stage_plan_layer_prefix(uint64_t *prefix, const struct stage_memory_model *mm) {
    prefix[0] = 0;
    for (int l = 0; l < mm->num_layers; ++l)
        prefix[l + 1] = prefix[l] + mm->layer_weight_bytes[l];
}

int stage_plan_price(struct stage_plan *plan, const struct stage_memory_model *mm,
                     const struct stage_range *ranges, int num_stages) {
    if (!plan || !mm || !ranges) return strata_set_error(STRATA_EINVAL, "stage_plan_price: null");
    int rc = stage_plan_check_ranges(ranges, num_stages, mm->num_layers, 0);
    if (rc) return rc;
    uint64_t prefix[MODEL_CONFIG_MAX_LAYERS + 1];
    stage_plan_layer_prefix(prefix, mm);
    memset(plan, 0, sizeof *plan);
    plan->num_layers = mm->num_layers;
    plan->num_stages = num_stages;
    for (int s = 0; s < num_stages; ++s)
        stage_plan_price_stage(&plan->stages[s], mm, prefix, s, num_stages, ranges[s].layer_start,
                               ranges[s].layer_end);
    return STRATA_OK;
}

/* The exact dynamic program over contiguous splits of L layers into S stages that
 * minimises the largest cost(s, [i, j)) over the stages; starts[S] receives each stage's
 * first layer (stage s ends where s + 1 starts, the last at L). Ties keep the first optimum
 * found (the shortest earlier stages), so a plan is deterministic. Returns the minimum. */
typedef double (*range_cost_fn)(const void *ctx, int s, int start, int end);

static int plan_min_max(int *starts, double *worst, int L, int S, range_cost_fn cost,
                        const void *ctx) {
    /* best[s][j]: smallest achievable max when stages 0..s own [0, j);
     * from[s][j]: where stage s starts in that optimum. */
    double *best = malloc((size_t)S * (size_t)(L + 1) * sizeof *best);
    int *from = malloc((size_t)S * (size_t)(L + 1) * sizeof *from);
    if (!best || !from) {
        free(best);
        free(from);
        return strata_set_error(STRATA_ENOMEM, "planner: out of memory");
    }
#define BEST(s, j) best[(size_t)(s) * (size_t)(L + 1) + (size_t)(j)]
#define FROM(s, j) from[(size_t)(s) * (size_t)(L + 1) + (size_t)(j)]
    for (int s = 0; s < S; ++s) {
        for (int j = 0; j <= L; ++j)
            BEST(s, j) = INFINITY;
        /* Stage s ends at j: stages before it need >= s layers, after it >= S-1-s. */
        for (int j = s + 1; j <= L - (S - 1 - s); ++j) {
            int i_lo = s == 0 ? 0 : s, i_hi = s == 0 ? 0 : j - 1;
            for (int i = i_lo; i <= i_hi; ++i) {
                double before = s == 0 ? 0.0 : BEST(s - 1, i);
                if (before >= BEST(s, j)) continue;
                double here = cost(ctx, s, i, j);
                double val = before > here ? before : here;
                if (val < BEST(s, j)) {
                    BEST(s, j) = val;
                    FROM(s, j) = i;
                }
            }
        }
    }
    int end = L;
    for (int s = S - 1; s >= 0; --s)
        end = starts[s] = FROM(s, end);
    *worst = BEST(S - 1, L);
#undef BEST
#undef FROM
    free(best);
    free(from);
    return STRATA_OK;
}

struct memory_cost {
    const struct stage_memory_model *mm;
    const uint64_t *prefix, *free_bytes;
    int num_stages;
};

/* A stage's total bytes as a fraction of its node's free memory. */
static double memory_fraction(const void *ctx, int s, int start, int end) {
    const struct memory_cost *c = ctx;
    struct stage_plan_entry e;
    stage_plan_price_stage(&e, c->mm, c->prefix, s, c->num_stages, start, end);
    return (double)e.total_bytes / (double)c->free_bytes[s];
}

int stage_plan_balanced(struct stage_plan *plan, const struct stage_memory_model *mm,
                        const uint64_t *free_bytes, int num_stages) {
    if (!plan || !mm || !free_bytes)
        return strata_set_error(STRATA_EINVAL, "stage_plan_balanced: null argument");
    const int L = mm->num_layers, S = num_stages;
    if (S < 1 || S > L || S > STAGE_PLAN_MAX_STAGES)
        return strata_set_error(STRATA_ERANGE, "cannot split %d layers into %d stages", L, S);
    for (int s = 0; s < S; ++s)
        if (free_bytes[s] == 0)
            return strata_set_error(STRATA_EINVAL, "node %d has no free memory", s);
    uint64_t prefix[MODEL_CONFIG_MAX_LAYERS + 1];
    stage_plan_layer_prefix(prefix, mm);
    int starts[STAGE_PLAN_MAX_STAGES];
    double worst;
    const struct memory_cost cost = {mm, prefix, free_bytes, S};
    int rc = plan_min_max(starts, &worst, L, S, memory_fraction, &cost);
    if (rc) return rc;
    memset(plan, 0, sizeof *plan);
    plan->num_layers = L;
    plan->num_stages = S;
    for (int s = 0; s < S; ++s) {
        stage_plan_price_stage(&plan->stages[s], mm, prefix, s, S, starts[s],
                               s + 1 < S ? starts[s + 1] : L);
        plan->stages[s].memory_bytes = free_bytes[s];
    }
    if (worst <= 1.0) return STRATA_OK;
    int tight = 0;
    uint64_t need = 0, have = 0;
    for (int s = 0; s < S; ++s) {
        const struct stage_plan_entry *p = &plan->stages[s];
        if ((double)p->total_bytes / (double)p->memory_bytes >
            (double)plan->stages[tight].total_bytes / (double)plan->stages[tight].memory_bytes)
            tight = s;
        need += p->total_bytes;
        have += p->memory_bytes;
    }
    char need_s[32], have_s[32], all_need[32], all_have[32];
    stage_plan_format_size(need_s, sizeof need_s, plan->stages[tight].total_bytes);
    stage_plan_format_size(have_s, sizeof have_s, plan->stages[tight].memory_bytes);
    stage_plan_format_size(all_need, sizeof all_need, need);
    stage_plan_format_size(all_have, sizeof all_have, have);
    return strata_set_error(STRATA_ERANGE,
                            "model does not fit: the best split still needs %s on node %d "
                            "(layers [%d, %d)) which has %s free (%.0f%%); all stages need %s, "
                            "the nodes have %s. Add nodes or memory, or lower --max-seq",
                            need_s, tight, plan->stages[tight].range.layer_start,
                            plan->stages[tight].range.layer_end, have_s, worst * 100.0, all_need,
                            all_have);
}

uint64_t stage_plan_streamed_bytes(const struct stage_memory_model *mm, int s, int num_stages,
                                   int layer_start, int layer_end) {
    uint64_t bytes = 0;
    for (int l = layer_start; l < layer_end; ++l)
        bytes += mm->layer_weight_bytes[l];
    /* The embedding is gathered (a row per token), the head is streamed whole. */
    if (s == num_stages - 1) bytes += mm->norm_bytes + mm->head_bytes;
    return bytes;
}

static double streamed_cost(const void *ctx, int s, int start, int end) {
    const struct memory_cost *c = ctx;
    return (double)stage_plan_streamed_bytes(c->mm, s, c->num_stages, start, end);
}

int stage_plan_decode(struct stage_range *out, const struct stage_memory_model *mm,
                      int num_stages) {
    if (!out || !mm) return strata_set_error(STRATA_EINVAL, "stage_plan_decode: null argument");
    const int L = mm->num_layers, S = num_stages;
    if (S < 1 || S > L || S > STAGE_PLAN_MAX_STAGES)
        return strata_set_error(STRATA_ERANGE, "cannot split %d layers into %d stages", L, S);
    int starts[STAGE_PLAN_MAX_STAGES];
    double worst;
    const struct memory_cost cost = {mm, NULL, NULL, S};
    int rc = plan_min_max(starts, &worst, L, S, streamed_cost, &cost);
    for (int s = 0; s < S && !rc; ++s)
        out[s] = (struct stage_range){starts[s], s + 1 < S ? starts[s + 1] : L};
    return rc;
}

int grid_plan_price_rank(struct grid_plan_entry *e, const struct model_config *cfg,
                         const struct safetensors *st, const struct grid_config *grid,
                         const struct stage_range *ranges, const struct stage_memory_options *opt,
                         int rank) {
    if (!e || !cfg || !grid || !ranges || !opt)
        return strata_set_error(STRATA_EINVAL, "grid_plan_price_rank: null argument");
    if (rank < 0 || rank >= grid->world)
        return strata_set_error(STRATA_ERANGE, "rank %d is outside the grid's %d ranks", rank,
                                grid->world);
    memset(e, 0, sizeof *e);
    e->rank = rank;
    grid_coords_of(&e->coords, grid, rank);
    const int s = e->coords.stage;
    e->range = ranges[s];
    int rc = tp_shard_init(&e->shard, cfg, grid->tp, e->coords.tp_rank, grid->moe);
    if (rc) return rc;
    e->kv_tokens = kvp_token_range(grid, e->coords.kvp_rank, opt->max_seq);
    struct stage_tensor_list list = {0};
    struct stage_role role = {e->range.layer_start, e->range.layer_end, s == 0, s == grid->pp - 1,
                              s == 0 && opt->with_vision && cfg->has_vision};
    if ((rc = stage_tensor_list_build(&list, cfg, &role, st))) return rc;
    const size_t elem = stage_plan_dtype_bytes(cfg->torch_dtype);
    for (int i = 0; i < list.count; ++i) {
        const struct stage_tensor *t = &list.items[i];
        const struct st_tensor *stored = st ? safetensors_find(st, t->name) : NULL;
        uint64_t bytes = stored ? stored->nbytes : elem;
        for (int d = 0; !stored && d < t->ndim; ++d)
            bytes *= (uint64_t)t->shape[d];
        enum stage_tensor_layout layout =
            stored ? stage_tensor_stored_layout(t, stored) : t->layout;
        struct tp_slice slice;
        if ((rc = tp_tensor_slice(&slice, &e->shard, t, layout))) break;
        e->weight_bytes += tp_slice_bytes(&slice, bytes);
    }
    stage_tensor_list_free(&list);
    if (rc) return rc;
    const uint64_t layers = (uint64_t)(e->range.layer_end - e->range.layer_start);
    const uint64_t kv_heads = (uint64_t)(e->shard.kv_heads.end - e->shard.kv_heads.start);
    const uint64_t tokens = (uint64_t)(e->kv_tokens.end - e->kv_tokens.start);
    e->kv_bytes = 2 * layers * kv_heads * (uint64_t)cfg->head_dim * opt->kv_dtype_bytes * tokens *
                  (uint64_t)opt->batch;
    uint64_t logits = 0;
    e->workspace_bytes = stage_plan_workspace_bytes(cfg, opt, &logits);
    if (s == grid->pp - 1) e->workspace_bytes += logits;
    e->total_bytes = e->weight_bytes + e->kv_bytes + e->workspace_bytes;
    return STRATA_OK;
}

int stage_plan_parse_size(uint64_t *out, const char *text) {
    if (!out || !text) return strata_set_error(STRATA_EINVAL, "size: null argument");
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || !(v >= 0.0) || !isfinite(v) || isspace((unsigned char)text[0]))
        return strata_set_error(STRATA_EINVAL, "bad size \"%s\" (expected e.g. 24G, 512M)", text);
    double mult = 1.0;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        mult = 1024.0;
        ++end;
        break;
    case 'M':
        mult = 1024.0 * 1024.0;
        ++end;
        break;
    case 'G':
        mult = 1024.0 * 1024.0 * 1024.0;
        ++end;
        break;
    case 'T':
        mult = 1024.0 * 1024.0 * 1024.0 * 1024.0;
        ++end;
        break;
    default: break;
    }
    if (mult > 1.0 && (*end == 'i' || *end == 'I')) ++end;
    if (*end == 'B' || *end == 'b') ++end;
    if (*end != '\0')
        return strata_set_error(STRATA_EINVAL, "bad size \"%s\" (expected e.g. 24G, 512M)", text);
    double bytes = v * mult;
    if (bytes >= 18446744073709551615.0)
        return strata_set_error(STRATA_ERANGE, "size \"%s\" is too large", text);
    *out = (uint64_t)bytes;
    return STRATA_OK;
}

void stage_plan_format_size(char *buf, size_t cap, uint64_t bytes) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes;
    int u = -1;
    while (v >= 1024.0 && u < 3) {
        v /= 1024.0;
        ++u;
    }
    snprintf(buf, cap, v < 10.0 ? "%.2f %s" : v < 100.0 ? "%.1f %s" : "%.0f %s", v, units[u]);
}
