/* The performance model (see perf_model.h). */
#include "runtime/model/perf_model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/stage_tensors.h"

static int bad(const char *field, const char *what) {
    return strata_set_error(STRATA_EFORMAT, "device profile: \"%s\" %s", field, what);
}

static int get_number(double *out, const cJSON *root, const char *name, double lo, double hi,
                      int required) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!it) return required ? bad(name, "is missing") : 0;
    if (!cJSON_IsNumber(it) || !(it->valuedouble >= lo) || !(it->valuedouble <= hi))
        return bad(name, "must be a number in range");
    *out = it->valuedouble;
    return 0;
}

static void get_string(char *out, size_t cap, const cJSON *root, const char *name,
                       const char *dflt) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);
    snprintf(out, cap, "%s", cJSON_IsString(it) ? it->valuestring : dflt);
}

/* An optional {"key": value, ...} object of up to PERF_MAX_K_POINTS points, keys ascending. */
static int points_parse(struct perf_points *p, const cJSON *root, const char *name) {
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(root, name), *it;
    if (obj && !cJSON_IsObject(obj)) return bad(name, "must be an object");
    cJSON_ArrayForEach(it, obj) {
        char *end;
        const double key = strtod(it->string, &end);
        if (*end || !(key >= 1 && key <= 1e15) || !cJSON_IsNumber(it) || !(it->valuedouble > 0) ||
            p->n == PERF_MAX_K_POINTS || (p->n && key <= p->key[p->n - 1]))
            return bad(name, "wants up to 8 \"key\": value pairs, keys ascending");
        p->key[p->n] = key;
        p->value[p->n++] = it->valuedouble;
    }
    return 0;
}

int perf_device_parse(struct perf_device *d, const char *json, size_t len) {
    memset(d, 0, sizeof *d);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return strata_set_error(STRATA_EFORMAT, "device profile: not a JSON object");
    }
    double threads = 1, mem = 0;
    get_string(d->name, sizeof d->name, root, "name", "unnamed");
    get_string(d->source, sizeof d->source, root, "source", "spec");
    get_string(d->device, sizeof d->device, root, "device", "cpu");
    int rc = get_number(&threads, root, "threads", 1, 4096, 0);
    if (!rc) rc = get_number(&mem, root, "mem_bytes", 0, 1e18, 0);
    if (!rc) rc = get_number(&d->read_gbps, root, "read_gbps", 1e-3, 1e6, 1);
    if (!rc) rc = get_number(&d->gemv_gbps, root, "gemv_gbps", 1e-3, 1e6, 1);
    if (!rc) rc = get_number(&d->gemm_gflops, root, "gemm_gflops", 1e-3, 1e9, 1);
    if (!rc) rc = get_number(&d->attn_gflops, root, "attn_gflops", 1e-3, 1e9, 0);
    if (!rc) rc = get_number(&d->attn_gbps, root, "attn_gbps", 1e-3, 1e6, 0);
    if (!rc) rc = get_number(&d->elementwise_gelems, root, "elementwise_gelems", 1e-6, 1e6, 0);
    if (!rc) rc = get_number(&d->row_ops_gelems, root, "row_ops_gelems", 1e-6, 1e6, 0);
    if (!rc && strcmp(d->source, "measured") && strcmp(d->source, "spec"))
        rc = bad("source", "must be \"measured\" or \"spec\"");
    if (!rc) rc = points_parse(&d->gemv_by_bytes, root, "gemv_gbps_by_bytes");
    if (!rc) rc = points_parse(&d->gemm_by_k, root, "gemm_gflops_by_k");
    if (!rc) rc = points_parse(&d->gemm_split_by_k, root, "gemm_split_gflops_by_k");
    if (!rc) rc = points_parse(&d->attn_by_ctx, root, "attn_gflops_by_ctx");
    if (!rc) rc = points_parse(&d->gemm_by_rows, root, "gemm_gflops_by_rows");
    cJSON_Delete(root);
    d->threads = (int)threads;
    d->mem_bytes = (uint64_t)mem;
    return rc;
}

int perf_device_load(struct perf_device *d, const char *path) {
    char *text = NULL;
    size_t len = 0;
    int rc = cli_read_file(&text, &len, path);
    if (rc) return rc;
    rc = perf_device_parse(d, text, len);
    free(text);
    return rc ? strata_wrap_error(rc, "%s", path) : 0;
}

/* `,\n "name": {"key": value, ...}` into buf at *n (nothing for no points). */
static void points_format(char *buf, size_t cap, int *n, const char *name,
                          const struct perf_points *p) {
    for (int i = 0; i<p->n && * n> 0 && (size_t)*n < cap; i++)
        *n += snprintf(buf + *n, cap - (size_t)*n, "%s%s%s\"%.0f\": %.3f", i ? ", " : ",\n \"",
                       i ? "" : name, i ? "" : "\": {", p->key[i], p->value[i]);
    if (p->n && *n > 0 && (size_t)*n < cap) *n += snprintf(buf + *n, cap - (size_t)*n, "}");
}

int perf_device_format(const struct perf_device *d, char **out) {
    char buf[2048];
    int n = snprintf(buf, sizeof buf,
                     "{\"name\": \"%s\", \"source\": \"%s\", \"device\": \"%s\", \"threads\": %d,\n"
                     " \"mem_bytes\": %llu, \"read_gbps\": %.3f, \"gemv_gbps\": %.3f,\n"
                     " \"gemm_gflops\": %.3f",
                     d->name, d->source, d->device, d->threads, (unsigned long long)d->mem_bytes,
                     d->read_gbps, d->gemv_gbps, d->gemm_gflops);
    if (d->elementwise_gelems > 0 && n > 0 && (size_t)n < sizeof buf)
        n += snprintf(buf + n, sizeof buf - (size_t)n, ",\n \"elementwise_gelems\": %.4f",
                      d->elementwise_gelems);
    if (d->row_ops_gelems > 0 && n > 0 && (size_t)n < sizeof buf)
        n += snprintf(buf + n, sizeof buf - (size_t)n, ", \"row_ops_gelems\": %.4f",
                      d->row_ops_gelems);
    if (d->attn_gflops > 0 && n > 0 && (size_t)n < sizeof buf)
        n += snprintf(buf + n, sizeof buf - (size_t)n,
                      ",\n \"attn_gflops\": %.3f, \"attn_gbps\": %.3f", d->attn_gflops,
                      d->attn_gbps);
    points_format(buf, sizeof buf, &n, "gemv_gbps_by_bytes", &d->gemv_by_bytes);
    points_format(buf, sizeof buf, &n, "gemm_gflops_by_k", &d->gemm_by_k);
    points_format(buf, sizeof buf, &n, "gemm_split_gflops_by_k", &d->gemm_split_by_k);
    points_format(buf, sizeof buf, &n, "attn_gflops_by_ctx", &d->attn_by_ctx);
    points_format(buf, sizeof buf, &n, "gemm_gflops_by_rows", &d->gemm_by_rows);
    if (n > 0 && (size_t)n < sizeof buf) n += snprintf(buf + n, sizeof buf - (size_t)n, "}\n");
    *out = n > 0 && (size_t)n < sizeof buf ? strdup(buf) : NULL;
    return *out ? 0 : strata_set_error(STRATA_ENOMEM, "out of memory");
}

double perf_points_at(const struct perf_points *p, double key, double dflt) {
    if (p->n == 0) return dflt;
    if (key <= p->key[0]) return p->value[0];
    for (int i = 1; i < p->n; i++)
        if (key <= p->key[i]) {
            double t = log(key / p->key[i - 1]) / log(p->key[i] / p->key[i - 1]);
            return p->value[i - 1] + t * (p->value[i] - p->value[i - 1]);
        }
    return p->value[p->n - 1];
}

double perf_device_gemv_gbps(const struct perf_device *d, double bytes) {
    return perf_points_at(&d->gemv_by_bytes, bytes, d->gemv_gbps);
}

double perf_device_gemm_gflops(const struct perf_device *d, double K) {
    return perf_points_at(&d->gemm_by_k, K, d->gemm_gflops);
}

double perf_device_gemm_split_gflops(const struct perf_device *d, double K) {
    return perf_points_at(&d->gemm_split_by_k, K, perf_device_gemm_gflops(d, K));
}

double perf_device_gemm_rows_factor(const struct perf_device *d, double rows) {
    if (d->gemm_by_rows.n == 0 || rows >= PERF_GEMM_ROWS) return 1;
    const double full = perf_points_at(&d->gemm_by_rows, PERF_GEMM_ROWS, 0);
    const double f = full > 0 ? perf_points_at(&d->gemm_by_rows, rows, full) / full : 1;
    return f < 1 ? f : 1;
}

static double numel(const struct stage_tensor *t) {
    double n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (double)t->shape[d];
    return n;
}

/* The tensors come from the manifest the loaders use (stage_tensors.h), shapes from config.json:
 * each layer's matrices are grouped by their inner dimension, experts counted one expert at a
 * time, norms and biases only as bytes. */
int perf_layers_build(struct perf_layers *pl, const struct model_config *cfg) {
    memset(pl, 0, sizeof *pl);
    if (cfg->num_layers < 1 || cfg->num_layers > MODEL_CONFIG_MAX_LAYERS)
        return strata_set_error(STRATA_EINVAL, "perf model: %d layers", cfg->num_layers);
    struct stage_tensor_list list = {0};
    struct stage_role all = {0, cfg->num_layers, 1, 1, 0};
    int rc = stage_tensor_list_build(&list, cfg, &all, NULL);
    if (rc) return rc;
    const double b = (double)stage_plan_dtype_bytes(cfg->torch_dtype),
                 E = cfg->num_experts > 0 ? cfg->num_experts : 1;
    pl->num_layers = cfg->num_layers;
    pl->hidden = cfg->hidden_size;
    pl->heads = cfg->num_heads;
    pl->head_dim = cfg->head_dim;
    pl->kv_heads = cfg->num_kv_heads;
    pl->vocab = cfg->vocab_size;
    pl->dtype_bytes = b;
    pl->top_k = cfg->num_experts_per_tok;
    double other[MODEL_CONFIG_MAX_LAYERS] = {0}, embed = 0, head = 0, norm = 0;
    for (int i = 0; i < list.count; i++) {
        const struct stage_tensor *t = &list.items[i];
        const double n = numel(t);
        if (t->kind == STAGE_TENSOR_EMBED) embed = n;
        if (t->kind == STAGE_TENSOR_LM_HEAD) head = n;
        if (t->kind == STAGE_TENSOR_NORM) norm = n;
        if (t->kind != STAGE_TENSOR_LAYER) continue;
        struct perf_layer *y = &pl->layer[t->layer];
        switch (t->slot) {
        case STAGE_SLOT_ROUTER: y->experts = cfg->num_experts; /* fall through */
        case STAGE_SLOT_Q:
        case STAGE_SLOT_K:
        case STAGE_SLOT_V:
        case STAGE_SLOT_GATE:
        case STAGE_SLOT_UP: y->p_h += n; break;
        case STAGE_SLOT_O: y->p_o += n; break;
        case STAGE_SLOT_DOWN:
            y->p_i += n;
            y->k_i = (int)t->shape[1]; /* [H, F]: F is the inner dimension */
            break;
        case STAGE_SLOT_EXPERT_GATE:
        case STAGE_SLOT_EXPERT_UP:
        case STAGE_SLOT_EXPERTS_GATE_UP: y->e_h += n / E; break;
        case STAGE_SLOT_EXPERT_DOWN:
        case STAGE_SLOT_EXPERTS_DOWN:
            y->e_i += n / E;
            y->k_ei = cfg->moe_intermediate_size;
            break;
        default: other[t->layer] += n; break; /* norms, biases */
        }
    }
    stage_tensor_list_free(&list);
    for (int l = 0; l < cfg->num_layers; l++) {
        struct perf_layer *y = &pl->layer[l];
        y->dense_bytes = (y->p_h + y->p_o + y->p_i + other[l]) * b;
        y->expert_bytes = (y->e_h + y->e_i) * b;
    }
    pl->embed_bytes = embed * b;
    pl->head_bytes = ((head > 0 ? head : embed) + norm) * b; /* tied or not, it is read */
    return 0;
}

/* Expected distinct experts b routed rows touch: E (1 - (1 - k/E)^b). */
static double active_experts(int E, int k, int b) {
    if (E <= 0) return 0;
    double p = 1.0 - (double)k / E;
    return E * (1.0 - pow(p, b));
}

double perf_layer_bytes(const struct perf_layers *pl, int l, int rows) {
    const struct perf_layer *y = &pl->layer[l];
    return y->dense_bytes + active_experts(y->experts, pl->top_k, rows) * y->expert_bytes;
}

double perf_layer_matmul_sec(const struct perf_layers *pl, int l, const struct perf_device *d,
                             double rows) {
    const double H = pl->hidden, O = (double)pl->heads * pl->head_dim;
    const struct perf_layer *y = &pl->layer[l];
    /* o_proj and the down projections are row-parallel: matmul_split's rate */
    double s =
        y->p_h / perf_device_gemm_gflops(d, H) + y->p_o / perf_device_gemm_split_gflops(d, O);
    if (y->p_i > 0) s += y->p_i / perf_device_gemm_split_gflops(d, y->k_i);
    if (y->experts)
        s += pl->top_k * (y->e_h / perf_device_gemm_gflops(d, H) +
                          y->e_i / perf_device_gemm_split_gflops(d, y->k_ei));
    /* the MLP's SwiGLU: one expf per intermediate element of each row (k experts' for MoE) */
    const double act = (y->p_i > 0 ? y->k_i : 0) + (y->experts ? pl->top_k * y->k_ei : 0);
    double elementwise = d->elementwise_gelems > 0 ? act / (d->elementwise_gelems * 1e9) : 0;
    if (d->row_ops_gelems > 0)
        elementwise += PERF_ROW_OPS_ELEMS(H, pl->heads, pl->kv_heads, pl->head_dim) /
                       (d->row_ops_gelems * 1e9);
    return 2 * rows * s / perf_device_gemm_rows_factor(d, rows) / 1e9 + rows * elementwise;
}

double perf_head_matmul_sec(const struct perf_layers *pl, const struct perf_device *d,
                            double rows) {
    return 2 * rows * (pl->head_bytes / pl->dtype_bytes) / perf_device_gemm_gflops(d, pl->hidden) /
           perf_device_gemm_rows_factor(d, rows) / 1e9;
}

double perf_layer_kv_sec(const struct perf_layers *pl, const struct perf_device *d, double ctx,
                         double rows, double kv_bytes) {
    return 2.0 * pl->kv_heads * pl->head_dim * kv_bytes * ctx * rows /
           ((d->attn_gbps > 0 ? d->attn_gbps : d->read_gbps) * 1e9);
}

double perf_layer_attn_sec(const struct perf_layers *pl, const struct perf_device *d,
                           double decode_positions, double prefill_rows, double prefill_pairs,
                           double kv_bytes) {
    const double flops = 2.0 * 2.0 * prefill_pairs * pl->heads * pl->head_dim;
    double gflops = d->attn_gflops > 0 ? d->attn_gflops : perf_device_gemm_gflops(d, pl->head_dim);
    if (prefill_rows > 0)
        gflops = perf_points_at(&d->attn_by_ctx, prefill_pairs / prefill_rows, gflops);
    return perf_layer_kv_sec(pl, d, decode_positions, 1, kv_bytes) + flops / (gflops * 1e9);
}

/* The weight bytes of the stage's layers at `rows` rows: every dense tensor, of a MoE layer the
 * experts the rows route to in expectation (the embedding is a gather: no bytes of note). */
static double layers_bytes(const struct perf_layers *pl, const struct stage_range *r, int rows) {
    double bytes = 0;
    for (int l = r->layer_start; l < r->layer_end; l++)
        bytes += perf_layer_bytes(pl, l, rows);
    return bytes;
}

void perf_device_set_tp(struct perf_device *d, int tp, const struct perf_link *link) {
    d->tp = tp;
    if (link)
        d->tp_link = *link;
    else if (!strcmp(d->device, "cuda"))
        d->tp_link = (struct perf_link){.latency_us = 15, .gbps = 300};
    else
        d->tp_link = (struct perf_link){.latency_us = 5, .gbps = d->read_gbps / 4};
}

void perf_device_set_kvp(struct perf_device *d, int kvp, int kvp_tokens, int max_seq,
                         double context) {
    d->kvp = kvp > 1 ? kvp : 1;
    d->kvp_kv = d->kvp > 1 && max_seq > 0 ? fmin(1.0, (double)kvp_tokens / max_seq) : 1;
    d->kvp_attn = d->kvp > 1 && context > 0 ? fmin(1.0, kvp_tokens / context) : 1;
}

/* An all-gather of `bytes` from each of kvp ranks: the link's fixed cost, then the other
 * ranks' bytes at its bandwidth. */
static double allgather_sec(const struct perf_device *d, double bytes) {
    return d->tp_link.latency_us * 1e-6 +
           (d->kvp - 1) * bytes / (d->tp_link.gbps > 0 ? d->tp_link.gbps * 1e9 : 1e30);
}

/* An all-reduce of `bytes` over tp ranks: the link's fixed cost of one (a small all-reduce's
 * latency: NCCL's and the shared-memory group's do not grow with the ranks as a ring's steps
 * would) and a ring's 2 (tp − 1) / tp of the bytes at its bandwidth. */
static double allreduce_sec(const struct perf_device *d, double bytes) {
    const int t = d->tp;
    return d->tp_link.latency_us * 1e-6 +
           2.0 * (t - 1) * bytes / t / (d->tp_link.gbps > 0 ? d->tp_link.gbps * 1e9 : 1e30);
}

double perf_step_sec(const struct perf_layers *pl, const struct perf_device *d, int layers,
                     double rows, double wbytes, double compute, double attn, double hbytes,
                     double hcompute) {
    if (rows <= 0) return 0;
    const int t = d->tp > 1 ? d->tp : 1;
    /* each rank's share; KV heads split while there are as many as ranks (else replicated) */
    const double kv_share = t > 1 ? fmax(1.0 / t, 1.0 / pl->kv_heads) : 1;
    wbytes /= t;
    hbytes /= t;
    /* one streaming rate for the step's whole working set: the head does not sit in a cache
     * that the layers' weights just went through */
    const double gbps = perf_device_gemv_gbps(d, wbytes + hbytes) * 1e9;
    const double kvp_share = d->kvp > 1 ? d->kvp_attn : 1;
    double sec = fmax(wbytes / gbps, compute / t) + attn * kv_share * kvp_share;
    if (hbytes > 0) sec += fmax(hbytes / gbps, hcompute / t);
    /* after attention and after the MLP: the rows' partial sums (f32) */
    if (t > 1) sec += layers * 2 * allreduce_sec(d, rows * pl->hidden * 4.0);
    /* KVP: per layer the rank's heads' maxima, then their partial sums (o, l, the flag) */
    if (d->kvp > 1) {
        const double heads = rows * (double)pl->heads / t;
        sec += layers *
               (allgather_sec(d, heads * 4.0) + allgather_sec(d, heads * (pl->head_dim + 2) * 4.0));
    }
    return sec;
}

double perf_stage_step_sec(const struct perf_layers *pl, const struct stage_range *r,
                           const struct perf_device *d, double rows, double head_rows,
                           double decode_positions, double prefill_rows, double prefill_pairs,
                           double kv_bytes) {
    const int layers = r->layer_end - r->layer_start;
    double compute = 0;
    for (int l = r->layer_start; l < r->layer_end; l++)
        compute += perf_layer_matmul_sec(pl, l, d, rows);
    return perf_step_sec(pl, d, layers, rows, layers_bytes(pl, r, (int)rows), compute,
                         layers * perf_layer_attn_sec(pl, d, decode_positions, prefill_rows,
                                                      prefill_pairs, kv_bytes),
                         head_rows > 0 ? pl->head_bytes : 0,
                         head_rows > 0 ? perf_head_matmul_sec(pl, d, head_rows) : 0);
}

static double decode_ms(const struct perf_layers *pl, const struct stage_range *r, int last,
                        const struct perf_device *d, int rows, double ctx, double kv_bytes,
                        double *bytes_out) {
    if (bytes_out) *bytes_out = layers_bytes(pl, r, rows) + (last ? pl->head_bytes : 0);
    return 1e3 * perf_stage_step_sec(pl, r, d, rows, last ? rows : 0, ctx * rows, 0, 0, kv_bytes);
}

/* A chunk of `tokens` rows after ctx_before positions, the head not included (only the prompt's
 * last row runs it: time to first token adds it once). */
static double prefill_ms(const struct perf_layers *pl, const struct stage_range *r,
                         const struct perf_device *d, int tokens, double ctx_before) {
    return 1e3 * perf_stage_step_sec(pl, r, d, tokens, 0, 0, tokens,
                                     tokens * (ctx_before + (tokens + 1) / 2.0), 0);
}

double perf_link_one_way_us(const struct perf_link *l, double bytes) {
    const struct perf_points *p = &l->mean_us;
    const double us_per_byte = l->gbps > 0 ? 1e-3 / l->gbps : 0;
    if (p->n == 0) return l->latency_us + bytes * us_per_byte;
    if (bytes <= p->key[0]) return p->value[0];
    for (int i = 1; i < p->n; i++)
        if (bytes <= p->key[i])
            return p->value[i - 1] + (p->value[i] - p->value[i - 1]) * (bytes - p->key[i - 1]) /
                                         (p->key[i] - p->key[i - 1]);
    return p->value[p->n - 1] + (bytes - p->key[p->n - 1]) * us_per_byte;
}

int perf_link_from_json(struct perf_link *l, const cJSON *o) {
    const cJSON *lat = cJSON_GetObjectItemCaseSensitive(o, "latency_us");
    const cJSON *bw = cJSON_GetObjectItemCaseSensitive(o, "gbps");
    const cJSON *pts = cJSON_GetObjectItemCaseSensitive(o, "points"), *it;
    if (!cJSON_IsNumber(lat) || !cJSON_IsNumber(bw) || !(lat->valuedouble >= 0) ||
        !(bw->valuedouble > 0) || !isfinite(lat->valuedouble) || !isfinite(bw->valuedouble) ||
        (pts && !cJSON_IsArray(pts)))
        return -1;
    struct perf_link out = {.latency_us = lat->valuedouble, .gbps = bw->valuedouble};
    cJSON_ArrayForEach(it, pts) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(it, "bytes");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "mean_us");
        struct perf_points *p = &out.mean_us;
        if (!cJSON_IsNumber(b) || !cJSON_IsNumber(t) || !(b->valuedouble > 0) ||
            !(t->valuedouble >= 0) || !isfinite(b->valuedouble) || !isfinite(t->valuedouble) ||
            p->n == PERF_MAX_K_POINTS || (p->n && b->valuedouble <= p->key[p->n - 1]))
            return -1;
        p->key[p->n] = b->valuedouble;
        p->value[p->n++] = t->valuedouble;
    }
    *l = out;
    return 0;
}

int perf_link_load(struct perf_link *l, const char *path) {
    char *text = NULL;
    size_t len = 0;
    int rc = cli_read_file_max(&text, &len, path, 1 << 20);
    if (rc) return rc;
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    rc = o && perf_link_from_json(l, o) == 0
             ? 0
             : strata_set_error(STRATA_EFORMAT,
                                "%s: not a link ({\"latency_us\": >= 0, \"gbps\": > 0} and "
                                "optional \"points\": [{\"bytes\", \"mean_us\"}, ...] of up "
                                "to %d sizes ascending)",
                                path, PERF_MAX_K_POINTS);
    cJSON_Delete(o);
    return rc;
}

double perf_hop_ms(const struct perf_layers *pl, const struct perf_link *link, int rows) {
    const double bytes = (double)rows * pl->hidden * 4.0 + PERF_FRAME_HEADER_BYTES;
    return perf_link_one_way_us(link, bytes) / 1e3;
}

int perf_predict(struct perf_prediction *out, const struct perf_layers *pl,
                 const struct stage_range *ranges, int S, const struct perf_device *devices,
                 const struct perf_link *link, const struct perf_options *opt) {
    struct perf_link hops[STAGE_PLAN_MAX_STAGES];
    if (S < 1 || S > STAGE_PLAN_MAX_STAGES) {
        memset(out, 0, sizeof *out);
        return strata_set_error(STRATA_EINVAL, "perf model: %d stages", S);
    }
    for (int s = 0; s < S; s++)
        hops[s] = *link;
    return perf_predict_hops(out, pl, ranges, S, devices, hops, opt);
}

int perf_predict_hops(struct perf_prediction *out, const struct perf_layers *pl,
                      const struct stage_range *ranges, int S, const struct perf_device *devices,
                      const struct perf_link *hops_link, const struct perf_options *opt) {
    memset(out, 0, sizeof *out);
    if (S < 1 || S > STAGE_PLAN_MAX_STAGES)
        return strata_set_error(STRATA_EINVAL, "perf model: %d stages", S);
    int rc = stage_plan_check_ranges(ranges, S, pl->num_layers, 1);
    if (rc) return rc;
    const int B = opt->batch > 0 ? opt->batch : 1,
              P = opt->prompt_tokens > 0 ? opt->prompt_tokens : 1;
    const int c = stage_plan_prefill_chunk(P, S, opt->chunk_tokens);
    const int g = perf_rows_per_step(B, S), chunks = (P + c - 1) / c;
    const double ctx = perf_options_context(opt), kvb = perf_options_kv_bytes(opt);
    double sum1 = 0, sumg = 0, maxg = 0, max1 = 0, sum_pre = 0, max_pre = 0;
    out->num_stages = S;
    out->chunk_rows = c;
    out->bottleneck_stage = 0;
    for (int s = 0; s < S; s++) {
        struct perf_stage *st = &out->stages[s];
        const int last = s == S - 1;
        st->range = ranges[s];
        st->decode_ms_1 =
            decode_ms(pl, &ranges[s], last, &devices[s], 1, ctx, kvb, &st->bytes_per_token);
        st->decode_ms_b = decode_ms(pl, &ranges[s], last, &devices[s], g, ctx, kvb, NULL);
        /* a chunk's cost grows with what precedes it: price the middle one */
        st->prefill_ms_chunk = prefill_ms(pl, &ranges[s], &devices[s], c, (P - c) / 2.0);
        sum1 += st->decode_ms_1;
        sumg += st->decode_ms_b;
        sum_pre += st->prefill_ms_chunk;
        if (st->decode_ms_1 > max1) {
            max1 = st->decode_ms_1;
            out->bottleneck_stage = s;
        }
        if (st->decode_ms_b > maxg) maxg = st->decode_ms_b;
        if (st->prefill_ms_chunk > max_pre) max_pre = st->prefill_ms_chunk;
    }
    /* every hop of the ring once per token (one stage: none): rows to the next stage, from the
     * last the token back */
    double hops1 = 0, hopsg = 0, hopsc = 0;
    for (int s = 0; S > 1 && s < S; s++) {
        const int token = s == S - 1;
        hops1 += perf_hop_ms(pl, &hops_link[s], token ? 0 : 1);
        hopsg += perf_hop_ms(pl, &hops_link[s], token ? 0 : g);
        hopsc += perf_hop_ms(pl, &hops_link[s], token ? 0 : c);
    }
    out->hop_ms_1 = S > 1 ? hops1 / S : perf_hop_ms(pl, &hops_link[0], 1);
    out->hop_ms_chunk = S > 1 ? hopsc / S : perf_hop_ms(pl, &hops_link[0], c);
    out->tokens_per_s_1 = 1e3 / (sum1 + hops1);
    double round = sumg + hopsg, pace = perf_groups_in_flight(B, S) * maxg;
    out->tokens_per_s_b = 1e3 * B / (round > pace ? round : pace);
    /* the head for the prompt's last row, after the last stage's last chunk */
    const struct stage_range *lr = &ranges[S - 1];
    const double head_ms = 1e3 * (perf_stage_step_sec(pl, lr, &devices[S - 1], 1, 1, 0, 0, 0, kvb) -
                                  perf_stage_step_sec(pl, lr, &devices[S - 1], 1, 0, 0, 0, 0, kvb));
    out->ttft_ms = sum_pre + (chunks - 1) * max_pre + head_ms + hopsc;
    if (hops1 > max1) out->bottleneck_stage = -1;
    return 0;
}
