/* cmocka tests for runtime/model/tp_shard (the PP × KVP × TP grid arithmetic) on every
 * golden checkpoint (tests/golden/<case>/config.json + model.safetensors): for every TP degree
 * 1..8 and both MoE modes, either the degree is refused with the right reason, or the ranks'
 * shards partition every split axis exactly once (KV heads exactly kv_replicas times,
 * replicated tensors T times), each rank's query heads sit in the GQA groups of the KV heads
 * it holds, and the per-rank prices add up to the stage's. KVP token ranges partition
 * [0, max_seq); grid ranks and coordinates are a bijection. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_plan.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/model/tp_shard.h"
#include "tests/test_util.h"

/* Counts, over every rank, how often each index of [0, n) is covered by a range, and checks
 * each is covered `times` times. */
static void check_partition(const struct tp_range *ranges, int T, int n, int times) {
    int *count = calloc((size_t)n + 1, sizeof *count);
    assert_non_null(count);
    for (int t = 0; t < T; ++t) {
        assert_true(ranges[t].start >= 0 && ranges[t].end <= n && ranges[t].start <= ranges[t].end);
        for (int i = ranges[t].start; i < ranges[t].end; ++i)
            ++count[i];
    }
    for (int i = 0; i < n; ++i)
        assert_int_equal(count[i], times);
    free(count);
}

/* The degree's expected verdict, from the rules of tp_shard.h written out again. */
static const char *expected_refusal(const struct model_config *c, int T, enum tp_moe_mode moe,
                                    int has_dense, int has_moe) {
    if ((T & (T - 1)) || GRID_SPLIT_LEAVES % T) return "not a power of two dividing 8";
    if (c->num_heads % T) return "attention heads";
    if (c->num_kv_heads >= T ? c->num_kv_heads % T : T % c->num_kv_heads) return "KV heads";
    if (has_dense && c->intermediate_size % T) return "MLP intermediate size";
    if (has_moe && moe == TP_MOE_EXPERT_PARALLEL && c->num_experts % T) return "experts";
    if (has_moe && moe == TP_MOE_SPLIT && c->moe_intermediate_size % T)
        return "expert intermediate size";
    if (c->vocab_size % T) return "vocabulary";
    return NULL;
}

/* Every tensor of the model: the ranks' slices cover its split axis the right number of
 * times, and the slice bytes add up accordingly. */
static void check_tensor_slices(const struct model_config *cfg, const struct safetensors *st,
                                const struct tp_shard *shards, int T) {
    struct stage_tensor_list list;
    struct stage_role all = {0, cfg->num_layers, 1, 1, cfg->has_vision};
    assert_int_equal(stage_tensor_list_build(&list, cfg, &all, st), 0);
    for (int i = 0; i < list.count; ++i) {
        const struct stage_tensor *t = &list.items[i];
        const struct st_tensor *stored = safetensors_find(st, t->name);
        assert_non_null(stored);
        enum stage_tensor_layout layout = stage_tensor_stored_layout(t, stored);
        int64_t extent = 0;
        int *cover = NULL, holders = 0, split_dim = -1;
        uint64_t bytes = 0;
        for (int r = 0; r < T; ++r) {
            struct tp_slice s;
            assert_int_equal(tp_tensor_slice(&s, &shards[r], t, layout), 0);
            bytes += tp_slice_bytes(&s, stored->nbytes);
            if (s.kind == TP_SLICE_ABSENT) continue;
            ++holders;
            if (s.kind == TP_SLICE_REPLICATED) continue;
            /* the split axis is a real axis of the stored tensor */
            assert_true(s.dim >= 0 && s.dim < stored->ndim);
            assert_true(s.extent == stored->shape[s.dim]);
            if (!cover) {
                extent = s.extent;
                split_dim = s.dim;
                cover = calloc((size_t)extent, sizeof *cover);
            }
            assert_int_equal(s.dim, split_dim);
            for (int p = 0; p < s.parts; ++p)
                for (int64_t k = 0; k < s.count; ++k) {
                    int64_t idx = s.start + p * s.part_stride + k;
                    assert_true(idx >= 0 && idx < extent);
                    ++cover[idx];
                }
        }
        int kv = t->slot == STAGE_SLOT_K || t->slot == STAGE_SLOT_V ||
                 t->slot == STAGE_SLOT_K_BIAS || t->slot == STAGE_SLOT_V_BIAS;
        int times = kv ? shards[0].kv_replicas : 1;
        if (cover) {
            for (int64_t k = 0; k < extent; ++k)
                if (cover[k] != times)
                    fail_msg("%s: index %lld of dim %d held %d times, want %d (T=%d)", t->name,
                             (long long)k, split_dim, cover[k], times, T);
            assert_true(bytes == stored->nbytes * (uint64_t)times);
            free(cover);
        } else if (holders == T) { /* replicated everywhere */
            assert_true(bytes == stored->nbytes * (uint64_t)T);
        } else { /* a whole expert under expert parallelism: exactly one holder */
            assert_int_equal(holders, 1);
            assert_true(bytes == stored->nbytes);
        }
    }
    stage_tensor_list_free(&list);
}

/* Query heads of each rank sit inside the GQA groups of its KV heads; partitions hold. */
static void check_shards(const struct model_config *cfg, const struct tp_shard *sh, int T,
                         enum tp_moe_mode moe, int has_dense, int has_moe) {
    struct tp_range q[16], kv[16], ffn[16], ex[16], exf[16], voc[16];
    const int group = cfg->num_heads / cfg->num_kv_heads;
    for (int t = 0; t < T; ++t) {
        q[t] = sh[t].q_heads;
        kv[t] = sh[t].kv_heads;
        ffn[t] = sh[t].ffn;
        ex[t] = sh[t].experts;
        exf[t] = sh[t].expert_ffn;
        voc[t] = sh[t].vocab;
        for (int h = q[t].start; h < q[t].end; ++h)
            assert_true(h / group >= kv[t].start && h / group < kv[t].end);
        assert_int_equal(sh[t].kv_replicas, cfg->num_kv_heads >= T ? 1 : T / cfg->num_kv_heads);
    }
    check_partition(q, T, cfg->num_heads, 1);
    check_partition(kv, T, cfg->num_kv_heads, sh[0].kv_replicas);
    check_partition(voc, T, cfg->vocab_size, 1);
    if (has_dense) check_partition(ffn, T, cfg->intermediate_size, 1);
    if (has_moe && moe == TP_MOE_EXPERT_PARALLEL) check_partition(ex, T, cfg->num_experts, 1);
    if (has_moe && moe == TP_MOE_SPLIT) check_partition(exf, T, cfg->moe_intermediate_size, 1);
}

/* Per-rank prices of a PP 2 × KVP 2 × TP T grid add up to the one-rank stage prices. */
static void check_prices(const struct model_config *cfg, const struct safetensors *st, int T,
                         enum tp_moe_mode moe) {
    const int max_seq = 100; /* KVP 2: 50 tokens rounded up to 16 x 2^2 */
    struct grid_config g = {2, T, 2, 0, 0, moe};
    assert_int_equal(grid_config_check(&g, cfg, max_seq), 0);
    assert_int_equal(g.world, 4 * T);
    assert_int_equal(g.kvp_tokens, 64);
    struct stage_memory_options opt = {4, max_seq, 1, 16, 1};
    struct stage_memory_model mm;
    assert_int_equal(stage_memory_model_build(&mm, cfg, st, &opt), 0);
    struct stage_range ranges[2];
    assert_int_equal(stage_plan_even(ranges, cfg->num_layers, 2), 0);
    struct stage_plan plan;
    assert_int_equal(stage_plan_price(&plan, &mm, ranges, 2), 0);
    for (int s = 0; s < 2; ++s) {
        uint64_t kv = 0;
        for (int k = 0; k < 2; ++k)
            for (int t = 0; t < T; ++t) {
                struct grid_coords c = {s, k, t};
                struct grid_plan_entry e;
                assert_int_equal(
                    grid_plan_price_rank(&e, cfg, st, &g, ranges, &opt, grid_rank(&g, &c)), 0);
                assert_int_equal(e.kv_tokens.start, 64 * k);
                assert_int_equal(e.kv_tokens.end, k ? max_seq : 64);
                kv += e.kv_bytes;
                if (T == 1) assert_true(e.weight_bytes == plan.stages[s].weight_bytes);
                assert_true(e.weight_bytes <= plan.stages[s].weight_bytes);
            }
        /* each KV head is held kv_replicas times over the TP ranks */
        const int rep = cfg->num_kv_heads >= T ? 1 : T / cfg->num_kv_heads;
        assert_true(kv == plan.stages[s].kv_bytes * (uint64_t)rep);
    }
}

/* ---- numerics: sharded projections add up to the full ones ---- */

struct mat {
    float *v; /* [rows, cols] row-major */
    int64_t rows, cols;
};

static struct mat load_full(const struct safetensors *st, const struct stage_tensor *t) {
    const struct st_tensor *s = safetensors_find(st, t->name);
    assert_non_null(s);
    assert_int_equal(s->ndim, 2);
    struct mat m = {malloc((size_t)(s->shape[0] * s->shape[1]) * sizeof(float)), s->shape[0],
                    s->shape[1]};
    assert_non_null(m.v);
    assert_int_equal(st_tensor_to_f32(m.v, s), 0);
    return m;
}

/* The rank's part of a 2-D tensor as its own matrix (what a loader will hold). */
static struct mat take_slice(const struct mat *full, const struct tp_slice *sl) {
    int64_t r0 = 0, nr = full->rows, c0 = 0, nc = full->cols;
    if (sl->kind == TP_SLICE_SPLIT) {
        assert_int_equal(sl->parts, 1);
        if (sl->dim == 0)
            r0 = sl->start, nr = sl->count;
        else
            c0 = sl->start, nc = sl->count;
    }
    struct mat m = {malloc((size_t)(nr * nc) * sizeof(float) + 1), nr, nc};
    for (int64_t i = 0; i < nr; ++i)
        memcpy(m.v + i * nc, full->v + (r0 + i) * full->cols + c0, (size_t)nc * sizeof(float));
    return m;
}

static void matvec(float *y, const struct mat *w, const float *x) {
    for (int64_t i = 0; i < w->rows; ++i) {
        double acc = 0;
        for (int64_t k = 0; k < w->cols; ++k)
            acc += (double)w->v[i * w->cols + k] * x[k];
        y[i] = (float)acc;
    }
}

static const struct stage_tensor *find_slot(const struct stage_tensor_list *l, int layer,
                                            enum stage_tensor_slot slot, int expert) {
    for (int i = 0; i < l->count; ++i)
        if (l->items[i].layer == layer && l->items[i].slot == slot && l->items[i].expert == expert)
            return &l->items[i];
    return NULL;
}

static void assert_close(const float *got, const float *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; ++i)
        if (fabsf(got[i] - want[i]) > 1e-4f * (1.0f + fabsf(want[i])))
            fail_msg("%s: [%lld] %g vs %g", what, (long long)i, got[i], want[i]);
}

/* y = down · (silu(gate · x) ⊙ up · x), whole and as the sum of the TP ranks' partials. */
static void check_mlp(const struct safetensors *st, const struct tp_shard *sh, int T,
                      const struct stage_tensor *g, const struct stage_tensor *u,
                      const struct stage_tensor *d, const char *what) {
    struct mat G = load_full(st, g), U = load_full(st, u), Dn = load_full(st, d);
    const int64_t H = G.cols, F = G.rows;
    float *x = malloc((size_t)H * sizeof *x), *a = malloc((size_t)F * 2 * sizeof *a);
    float *want = calloc((size_t)H, sizeof *want), *sum = calloc((size_t)H, sizeof *sum);
    float *part = malloc((size_t)H * sizeof *part);
    for (int64_t i = 0; i < H; ++i)
        x[i] = sinf(0.37f * (float)i + 0.1f);
    matvec(a, &G, x);
    matvec(a + F, &U, x);
    for (int64_t i = 0; i < F; ++i)
        a[i] = a[i] / (1.0f + expf(-a[i])) * a[F + i];
    matvec(want, &Dn, a);
    for (int r = 0; r < T; ++r) {
        struct tp_slice sg, su, sd;
        assert_int_equal(tp_tensor_slice(&sg, &sh[r], g, g->layout), 0);
        assert_int_equal(tp_tensor_slice(&su, &sh[r], u, u->layout), 0);
        assert_int_equal(tp_tensor_slice(&sd, &sh[r], d, d->layout), 0);
        if (sg.kind == TP_SLICE_ABSENT) continue; /* another rank's expert */
        struct mat g_r = take_slice(&G, &sg), u_r = take_slice(&U, &su), d_r = take_slice(&Dn, &sd);
        assert_true(g_r.rows == d_r.cols && u_r.rows == g_r.rows);
        matvec(a, &g_r, x);
        matvec(a + g_r.rows, &u_r, x);
        for (int64_t i = 0; i < g_r.rows; ++i)
            a[i] = a[i] / (1.0f + expf(-a[i])) * a[g_r.rows + i];
        matvec(part, &d_r, a);
        for (int64_t i = 0; i < H; ++i)
            sum[i] += part[i]; /* the all-reduce, in rank order */
        free(g_r.v), free(u_r.v), free(d_r.v);
    }
    assert_close(sum, want, H, what);
    free(G.v), free(U.v), free(Dn.v), free(x), free(a), free(want), free(sum), free(part);
}

/* One token attends to itself only, so head h outputs v of its KV head h / group: the
 * rank's V rows, query heads and o_proj columns must line up with GQA for the partial
 * o_proj outputs to add up to the whole. */
static void check_attention_vo(const struct model_config *cfg, const struct safetensors *st,
                               const struct tp_shard *sh, int T, const struct stage_tensor *v,
                               const struct stage_tensor *o) {
    struct mat V = load_full(st, v), O = load_full(st, o);
    const int64_t H = V.cols, D = cfg->head_dim, nh = cfg->num_heads;
    const int group = cfg->num_heads / cfg->num_kv_heads;
    float *x = malloc((size_t)H * sizeof *x), *vv = malloc((size_t)V.rows * sizeof *vv);
    float *heads = malloc((size_t)(nh * D) * sizeof *heads);
    float *want = malloc((size_t)H * sizeof *want), *sum = calloc((size_t)H, sizeof *sum);
    float *part = malloc((size_t)H * sizeof *part);
    for (int64_t i = 0; i < H; ++i)
        x[i] = cosf(0.23f * (float)i);
    matvec(vv, &V, x);
    for (int64_t h = 0; h < nh; ++h)
        memcpy(heads + h * D, vv + (h / group) * D, (size_t)D * sizeof(float));
    matvec(want, &O, heads);
    for (int r = 0; r < T; ++r) {
        struct tp_slice sv, so;
        assert_int_equal(tp_tensor_slice(&sv, &sh[r], v, v->layout), 0);
        assert_int_equal(tp_tensor_slice(&so, &sh[r], o, o->layout), 0);
        struct mat v_r = take_slice(&V, &sv), o_r = take_slice(&O, &so);
        matvec(vv, &v_r, x); /* this rank's KV heads, from kv_heads.start */
        const int nq = sh[r].q_heads.end - sh[r].q_heads.start;
        for (int j = 0; j < nq; ++j) {
            const int kv = (sh[r].q_heads.start + j) / group - sh[r].kv_heads.start;
            assert_true(kv >= 0 && kv < sh[r].kv_heads.end - sh[r].kv_heads.start);
            memcpy(heads + j * D, vv + kv * D, (size_t)D * sizeof(float));
        }
        assert_true(o_r.cols == nq * D);
        matvec(part, &o_r, heads);
        for (int64_t i = 0; i < H; ++i)
            sum[i] += part[i];
        free(v_r.v), free(o_r.v);
    }
    assert_close(sum, want, H, o->name);
    free(V.v), free(O.v), free(x), free(vv), free(heads), free(want), free(sum), free(part);
}

/* Layer by layer: the attention V/O path, and the dense MLP or expert 0 of a MoE layer
 * (per-expert checkpoints; fused ones are covered by the index checks above). */
static void check_numerics(const struct model_config *cfg, const struct safetensors *st,
                           const struct tp_shard *sh, int T) {
    struct stage_tensor_list l;
    struct stage_role all = {0, cfg->num_layers, 0, 0, 0};
    assert_int_equal(stage_tensor_list_build(&l, cfg, &all, st), 0);
    for (int layer = 0; layer < cfg->num_layers; ++layer) {
        check_attention_vo(cfg, st, sh, T, find_slot(&l, layer, STAGE_SLOT_V, -1),
                           find_slot(&l, layer, STAGE_SLOT_O, -1));
        const struct stage_tensor *g = find_slot(&l, layer, STAGE_SLOT_GATE, -1);
        if (g) {
            check_mlp(st, sh, T, g, find_slot(&l, layer, STAGE_SLOT_UP, -1),
                      find_slot(&l, layer, STAGE_SLOT_DOWN, -1), g->name);
        } else if ((g = find_slot(&l, layer, STAGE_SLOT_EXPERT_GATE, 0))) {
            check_mlp(st, sh, T, g, find_slot(&l, layer, STAGE_SLOT_EXPERT_UP, 0),
                      find_slot(&l, layer, STAGE_SLOT_EXPERT_DOWN, 0), g->name);
        }
    }
    stage_tensor_list_free(&l);
}

static void check_case(const char *dir, const char *name) {
    struct model_config cfg;
    struct safetensors *st = NULL;
    if (model_config_load(&cfg, dir) != 0) fail_msg("%s", strata_last_error());
    if (safetensors_open(&st, dir) != 0) fail_msg("%s", strata_last_error());
    int has_dense = 0, has_moe = 0;
    for (int l = 0; l < cfg.num_layers; ++l)
        model_config_layer_is_moe(&cfg, l) ? (has_moe = 1) : (has_dense = 1);
    int accepted = 0;
    for (int moe = 0; moe < 2; ++moe)
        for (int T = 1; T <= 8; ++T) {
            const char *why = expected_refusal(&cfg, T, (enum tp_moe_mode)moe, has_dense, has_moe);
            int rc = tp_check(&cfg, T, (enum tp_moe_mode)moe);
            if (why) {
                assert_int_equal(rc, STRATA_ERANGE);
                if (!strstr(strata_last_error(), why))
                    fail_msg("%s T=%d: \"%s\" does not name %s", name, T, strata_last_error(), why);
                continue;
            }
            if (rc) fail_msg("%s T=%d refused: %s", name, T, strata_last_error());
            ++accepted;
            struct tp_shard sh[16];
            for (int t = 0; t < T; ++t)
                assert_int_equal(tp_shard_init(&sh[t], &cfg, T, t, (enum tp_moe_mode)moe), 0);
            assert_int_equal(tp_shard_init(&sh[T], &cfg, T, T, (enum tp_moe_mode)moe),
                             STRATA_ERANGE);
            check_shards(&cfg, sh, T, (enum tp_moe_mode)moe, has_dense, has_moe);
            check_numerics(&cfg, st, sh, T);
            check_tensor_slices(&cfg, st, sh, T);
            check_prices(&cfg, st, T, (enum tp_moe_mode)moe);
        }
    printf("%-20s %d TP degrees x MoE modes accepted of 16\n", name, accepted);
    assert_true(accepted >= 4); /* T = 1 and 2 at least, both modes */
    safetensors_close(st);
}

static void test_golden_configs(void **state) {
    (void)state;
    char root[4096];
    snprintf(root, sizeof root, "%s", test_path("tests/golden"));
    DIR *d = opendir(root);
    assert_non_null(d);
    int cases = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char dir[4096 + 256], config[4096 + 300];
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        snprintf(config, sizeof config, "%s/config.json", dir);
        FILE *f = e->d_name[0] == '.' ? NULL : fopen(config, "r");
        if (!f) continue;
        fclose(f);
        check_case(dir, e->d_name);
        ++cases;
    }
    closedir(d);
    assert_int_equal(cases, 8);
}

static void load_golden(struct model_config *cfg, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/golden/%s", name);
    if (model_config_load(cfg, test_path(rel)) != 0) fail_msg("%s", strata_last_error());
}

/* Refusals name the reason; the KVP checks. */
static void test_refusals(void **state) {
    (void)state;
    struct model_config cfg;
    load_golden(&cfg, "qwen3_long_prompt"); /* nh 6, nkv 2, F 128, V 1000 */
    assert_int_equal(tp_check(&cfg, 4, TP_MOE_EXPERT_PARALLEL), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "6 attention heads"));
    /* 3 and 6 divide the heads but not the row-parallel dot products' 8-leaf tree */
    assert_int_equal(tp_check(&cfg, 3, TP_MOE_EXPERT_PARALLEL), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "TP 3 is not a power of two dividing 8"));
    assert_int_equal(tp_check(&cfg, 6, TP_MOE_EXPERT_PARALLEL), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "subtree"));
    cfg.num_heads = 16;
    cfg.intermediate_size = 96;
    assert_int_equal(tp_check(&cfg, 16, TP_MOE_EXPERT_PARALLEL), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "TP 16 is not a power of two dividing 8"));
    load_golden(&cfg, "qwen3_long_prompt");
    cfg.num_heads = 8;
    cfg.num_kv_heads = 8;
    cfg.intermediate_size = 100;
    assert_int_equal(tp_check(&cfg, 8, TP_MOE_EXPERT_PARALLEL), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "intermediate size 100"));
    load_golden(&cfg, "qwen3_long_prompt");
    cfg.vocab_size = 1001;
    assert_int_equal(tp_check(&cfg, 2, TP_MOE_EXPERT_PARALLEL), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "vocabulary of 1001"));

    load_golden(&cfg, "qwen3_moe_nonorm"); /* E 6, I 32, nkv 1 */
    assert_int_equal(tp_check(&cfg, 4, TP_MOE_EXPERT_PARALLEL), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "6 experts"));
    assert_int_equal(tp_check(&cfg, 4, TP_MOE_SPLIT), 0);

    load_golden(&cfg, "qwen3_gqa_tied"); /* L 4 */
    struct grid_config g = {2, 2, 4, 64, 0, TP_MOE_EXPERT_PARALLEL};
    assert_int_equal(grid_config_check(&g, &cfg, 512), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "fewer than max-seq 512"));
    assert_non_null(strstr(strata_last_error(), "--kvp-tokens to 128"));
    g.kvp_tokens = 256; /* 2 groups already hold 512 */
    assert_int_equal(grid_config_check(&g, &cfg, 512), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "KVP rank 3 would hold no tokens"));
    g.kvp_tokens = 130; /* not an aligned subtree of attention's 16-token blocks */
    assert_int_equal(grid_config_check(&g, &cfg, 512), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "not 16 x a power of two"));
    g.kvp_tokens = 48;
    assert_int_equal(grid_config_check(&g, &cfg, 512), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "48 KV tokens"));
    assert_true(kvp_tokens_aligned(16) && kvp_tokens_aligned(512) && !kvp_tokens_aligned(8) &&
                !kvp_tokens_aligned(96) && !kvp_tokens_aligned(0));
    g.kvp_tokens = 0; /* default: 128 per group */
    assert_int_equal(grid_config_check(&g, &cfg, 500), 0);
    assert_int_equal(g.kvp_tokens, 128);
    g.kvp_tokens = 0; /* 10 rounds up to 16: group 3 would be empty */
    assert_int_equal(grid_config_check(&g, &cfg, 40), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "KVP rank 3 would hold no tokens"));
    g.kvp_tokens = 128;
    assert_int_equal(grid_config_check(&g, &cfg, 500), 0);
    assert_int_equal(g.world, 16);
    struct tp_range last = kvp_token_range(&g, 3, 500);
    assert_int_equal(last.start, 384);
    assert_int_equal(last.end, 500);
    g.pp = 5;
    assert_int_equal(grid_config_check(&g, &cfg, 512), STRATA_ERANGE);
    assert_non_null(strstr(strata_last_error(), "every stage needs a layer"));
    g.pp = 1;
    g.tp = 0;
    assert_int_equal(grid_config_check(&g, &cfg, 512), STRATA_ERANGE);
}

/* Ranks and coordinates are a bijection, TP fastest; KVP ranges partition [0, max_seq). */
static void test_grid_order(void **state) {
    (void)state;
    struct model_config cfg;
    load_golden(&cfg, "qwen3_deep8");
    int accepted = 0;
    for (int kvp = 1; kvp <= 5; ++kvp)
        for (int seq = kvp; seq <= 700; seq += 23) {
            struct grid_config g = {4, 2, kvp, 0, 0, TP_MOE_EXPERT_PARALLEL};
            /* the default: ceil(seq / kvp), rounded up to 16 x 2^p under KVP */
            int tokens = (seq + kvp - 1) / kvp;
            if (kvp > 1) {
                int aligned = GRID_KV_BLOCK;
                while (aligned < tokens)
                    aligned *= 2;
                tokens = aligned;
            }
            if (grid_config_check(&g, &cfg, seq) != 0) {
                /* e.g. 100 tokens over 5 groups: 32 each leaves the last empty */
                assert_non_null(strstr(strata_last_error(), "would hold no tokens"));
                assert_true((int64_t)tokens * (kvp - 1) >= seq);
                continue;
            }
            assert_int_equal(g.kvp_tokens, tokens);
            ++accepted;
            struct tp_range r[8];
            for (int k = 0; k < kvp; ++k) {
                r[k] = kvp_token_range(&g, k, seq);
                assert_true(r[k].end > r[k].start);
            }
            check_partition(r, kvp, seq, 1);
            for (int rank = 0; rank < g.world; ++rank) {
                struct grid_coords c;
                grid_coords_of(&c, &g, rank);
                assert_int_equal(grid_rank(&g, &c), rank);
                assert_int_equal(c.tp_rank, rank % 2);
                assert_true(c.stage < 4 && c.kvp_rank < kvp);
            }
        }
    assert_true(accepted >= 60);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_configs),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_grid_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
