/* Placement over unequal boxes (see perf_place.h). */
#include "runtime/model/perf_place.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/cpu_pin.h"
#include "runtime/base/status.h"

static int bad(const char *path, const char *what) {
    return strata_set_error(STRATA_EFORMAT, "%s: %s", path, what);
}

/* A profile path relative to the hosts file's directory (absolute ones as they are). */
static void resolve(char *out, size_t cap, const char *hosts_path, const char *profile) {
    const char *slash = strrchr(hosts_path, '/');
    if (profile[0] == '/' || !slash)
        snprintf(out, cap, "%s", profile);
    else
        snprintf(out, cap, "%.*s/%s", (int)(slash - hosts_path), hosts_path, profile);
}

/* perf_link_from_json's object into *l, or {"probe": "FILE"}: FILE (relative to the hosts
 * file) holds that object, as strata-stage --probe-links and strata-stage-bench probe-link
 * write it; -1 when it is not that. */
static int parse_link(struct perf_link *l, const cJSON *o, const char *hosts_path) {
    const cJSON *probe = cJSON_GetObjectItemCaseSensitive(o, "probe");
    if (cJSON_IsString(probe) && hosts_path) {
        char file[4096], *text = NULL;
        size_t len = 0;
        resolve(file, sizeof file, hosts_path, probe->valuestring);
        if (cli_read_file_max(&text, &len, file, 1 << 20) < 0) return -1;
        cJSON *measured = cJSON_ParseWithLength(text, len);
        free(text);
        int rc = measured ? parse_link(l, measured, NULL) : -1;
        cJSON_Delete(measured);
        return rc;
    }
    return perf_link_from_json(l, o);
}

static int load_host(struct perf_host *host, const cJSON *it, const char *path, int i) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
    const cJSON *prof = cJSON_GetObjectItemCaseSensitive(it, "profile");
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(it, "mem");
    const cJSON *thr = cJSON_GetObjectItemCaseSensitive(it, "threads");
    const cJSON *devs = cJSON_GetObjectItemCaseSensitive(it, "devices");
    const cJSON *dlink = cJSON_GetObjectItemCaseSensitive(it, "device_link");
    const cJSON *cpus = cJSON_GetObjectItemCaseSensitive(it, "cpus");
    char msg[160], file[4096];
    if (!cJSON_IsObject(it) || !cJSON_IsString(name) || !cJSON_IsString(prof)) {
        snprintf(msg, sizeof msg, "hosts[%d] needs \"name\" and \"profile\" strings", i);
        return bad(path, msg);
    }
    snprintf(host->name, sizeof host->name, "%s", name->valuestring);
    resolve(file, sizeof file, path, prof->valuestring);
    int rc = perf_device_load(&host->dev, file);
    if (rc) return rc;
    host->mem_bytes = host->dev.mem_bytes;
    if (mem &&
        (!cJSON_IsString(mem) || stage_plan_parse_size(&host->mem_bytes, mem->valuestring))) {
        snprintf(msg, sizeof msg, "hosts[%d].mem: a size such as \"80G\"", i);
        return bad(path, msg);
    }
    if (thr) {
        if (!cJSON_IsNumber(thr) || thr->valuedouble < 1 || thr->valuedouble > 4096) {
            snprintf(msg, sizeof msg, "hosts[%d].threads: 1 to 4096", i);
            return bad(path, msg);
        }
        double f = thr->valuedouble / (host->dev.threads > 0 ? host->dev.threads : 1);
        struct perf_device *d = &host->dev;
        d->gemm_gflops *= f;
        d->attn_gflops *= f;
        for (int k = 0; k < d->gemm_by_k.n; k++)
            d->gemm_by_k.value[k] *= f;
        for (int k = 0; k < d->gemm_split_by_k.n; k++)
            d->gemm_split_by_k.value[k] *= f;
        for (int k = 0; k < d->attn_by_ctx.n; k++)
            d->attn_by_ctx.value[k] *= f;
        d->gemv_gbps = fmin(d->gemv_gbps * f, d->read_gbps);
        for (int b = 0; b < d->gemv_by_bytes.n; b++)
            d->gemv_by_bytes.value[b] *= f; /* caches are not read_gbps-bound */
        if (d->attn_gbps > 0) d->attn_gbps = fmin(d->attn_gbps * f, d->read_gbps);
        d->threads = (int)thr->valuedouble;
    }
    if (cpus) {
        struct cpu_pin set;
        const int threads = host->dev.threads > 0 ? host->dev.threads : 1;
        if (!cJSON_IsString(cpus) || strlen(cpus->valuestring) >= sizeof host->cpus ||
            cpu_pin_parse(cpus->valuestring, &set) < 0) {
            snprintf(msg, sizeof msg, "hosts[%d].cpus: a CPU list such as \"0-31\"", i);
            return bad(path, msg);
        }
        if (set.count < threads) {
            snprintf(msg, sizeof msg, "hosts[%d].cpus: %d CPU(s) for %d threads", i, set.count,
                     threads);
            return bad(path, msg);
        }
        snprintf(host->cpus, sizeof host->cpus, "%s", cpus->valuestring);
    }
    if (devs && (!cJSON_IsNumber(devs) || (devs->valuedouble != 1 && devs->valuedouble != 2 &&
                                           devs->valuedouble != 4 && devs->valuedouble != 8))) {
        snprintf(msg, sizeof msg, "hosts[%d].devices: 1, 2, 4 or 8 (one TP group per host)", i);
        return bad(path, msg);
    }
    if (devs && devs->valuedouble > 1) {
        struct perf_link l = {.latency_us = 0};
        if (dlink && parse_link(&l, dlink, path) < 0) {
            snprintf(msg, sizeof msg,
                     "hosts[%d].device_link needs \"latency_us\" >= 0 and \"gbps\" > 0", i);
            return bad(path, msg);
        }
        perf_device_set_tp(&host->dev, (int)devs->valuedouble, dlink ? &l : NULL);
    }
    if (host->mem_bytes == 0) {
        snprintf(msg, sizeof msg, "hosts[%d] (%s) has no memory size (\"mem\" or the profile's)", i,
                 host->name);
        return bad(path, msg);
    }
    return 0;
}

static int host_index(const struct perf_hosts *h, const cJSON *name) {
    for (int x = 0; cJSON_IsString(name) && x < h->n; x++)
        if (!strcmp(h->host[x].name, name->valuestring)) return x;
    return -1;
}

/* "links": [{"between": ["a", "b"], "latency_us": .., "gbps": ..}, ...] */
static int load_pairs(struct perf_hosts *h, const cJSON *pairs, const char *path) {
    const cJSON *it;
    char msg[160];
    int i = 0;
    cJSON_ArrayForEach(it, pairs) {
        const cJSON *between = cJSON_GetObjectItemCaseSensitive(it, "between");
        struct perf_pair *p = &h->pair[h->n_pairs];
        p->a = p->b = -1;
        if (cJSON_IsArray(between) && cJSON_GetArraySize(between) == 2) {
            p->a = host_index(h, cJSON_GetArrayItem(between, 0));
            p->b = host_index(h, cJSON_GetArrayItem(between, 1));
        }
        if (p->a < 0 || p->b < 0 || p->a == p->b) {
            snprintf(msg, sizeof msg,
                     "links[%d].between needs two different host names of \"hosts\"", i);
            return bad(path, msg);
        }
        if (parse_link(&p->link, it, path) < 0) {
            snprintf(msg, sizeof msg,
                     "links[%d] needs \"latency_us\" >= 0 and \"gbps\" > 0, or \"probe\": a "
                     "file that has them",
                     i);
            return bad(path, msg);
        }
        for (int j = 0; j < h->n_pairs; j++)
            if ((h->pair[j].a == p->a && h->pair[j].b == p->b) ||
                (h->pair[j].a == p->b && h->pair[j].b == p->a)) {
                snprintf(msg, sizeof msg, "links[%d]: %s and %s are linked twice", i,
                         h->host[p->a].name, h->host[p->b].name);
                return bad(path, msg);
            }
        h->n_pairs++;
        i++;
    }
    return 0;
}

int perf_hosts_load(struct perf_hosts *h, const char *path) {
    char *text = NULL;
    size_t len = 0;
    memset(h, 0, sizeof *h);
    h->link = (struct perf_link){.latency_us = 50, .gbps = 1.25};
    int rc = cli_read_file(&text, &len, path);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *hosts = root ? cJSON_GetObjectItemCaseSensitive(root, "hosts") : NULL, *it;
    if (!cJSON_IsArray(hosts) || cJSON_GetArraySize(hosts) < 1 ||
        cJSON_GetArraySize(hosts) > PERF_MAX_HOSTS)
        rc = bad(path, "needs \"hosts\": a list of 1 to 64 hosts");
    const cJSON *list = rc ? NULL : hosts;
    cJSON_ArrayForEach(it, list) {
        if ((rc = load_host(&h->host[h->n], it, path, h->n))) break;
        h->n++;
    }
    const cJSON *link = rc ? NULL : cJSON_GetObjectItemCaseSensitive(root, "link");
    if (link && parse_link(&h->link, link, path) < 0)
        rc = bad(path, "\"link\" needs \"latency_us\" >= 0 and \"gbps\" > 0, or \"probe\": "
                       "a file that has them");
    const cJSON *pairs = rc ? NULL : cJSON_GetObjectItemCaseSensitive(root, "links");
    if (pairs && (!cJSON_IsArray(pairs) || cJSON_GetArraySize(pairs) > PERF_MAX_PAIRS))
        rc = bad(path, "\"links\" is a list of at most 256 links");
    if (rc == 0 && pairs) rc = load_pairs(h, pairs, path);
    cJSON_Delete(root);
    return rc;
}

const struct perf_link *perf_hosts_link(const struct perf_hosts *h, int a, int b) {
    for (int i = 0; i < h->n_pairs; i++)
        if ((h->pair[i].a == a && h->pair[i].b == b) || (h->pair[i].a == b && h->pair[i].b == a))
            return &h->pair[i].link;
    return &h->link;
}

void perf_hosts_ring(struct perf_link *hops, const struct perf_hosts *h, const int *order, int S) {
    for (int s = 0; s < S; s++)
        hops[s] = *perf_hosts_link(h, order[s], order[(s + 1) % S]);
}

uint64_t perf_place_rank_bytes(const struct stage_plan_entry *e, const struct perf_device *d,
                               int kv_heads) {
    const int t = d->tp > 1 ? d->tp : 1;
    const int kv_t = t < kv_heads ? t : kv_heads; /* KV heads split while there are enough */
    const double kv = (double)e->kv_bytes / (kv_t > 0 ? kv_t : 1) * (d->kvp > 1 ? d->kvp_kv : 1);
    return e->weight_bytes / (uint64_t)t + (uint64_t)ceil(kv) + e->workspace_bytes;
}

void perf_place_memory(uint64_t *bytes, const struct stage_memory_model *mm,
                       const struct perf_device *devs, const struct stage_range *ranges, int S,
                       int kv_heads) {
    uint64_t prefix[MODEL_CONFIG_MAX_LAYERS + 1];
    stage_plan_layer_prefix(prefix, mm);
    for (int s = 0; s < S; s++) {
        struct stage_plan_entry e;
        stage_plan_price_stage(&e, mm, prefix, s, S, ranges[s].layer_start, ranges[s].layer_end);
        bytes[s] = devs ? perf_place_rank_bytes(&e, &devs[s], kv_heads) : e.total_bytes;
    }
}

/* Prefix sums over layers of what a stage's step adds up on one host: matmul seconds, and per
 * layer the KV seconds and the head's matmul seconds, at 1 row (per host, once) and at the
 * g = ⌈B / S⌉ rows of the pipeline being tried (per stage of the order, per try). */
struct host_sums {
    double c[MODEL_CONFIG_MAX_LAYERS + 1];
    double kv, head;
};

struct search {
    const struct perf_layers *pl;
    const struct stage_memory_model *mm;
    const struct perf_hosts *h;
    enum perf_goal goal;
    int batch, g; /* B, and the rows per step of the pipeline being tried */
    double ctx, kv_bytes;
    double b1[MODEL_CONFIG_MAX_LAYERS + 1], bg[MODEL_CONFIG_MAX_LAYERS + 1];
    uint64_t wpre[MODEL_CONFIG_MAX_LAYERS + 1];
    struct host_sums *sums;                        /* [h->n], 1 row */
    struct host_sums gsums[STAGE_PLAN_MAX_STAGES]; /* stage s of the order tried, g rows */
};

static void host_sums_fill(struct host_sums *hs, const struct search *z,
                           const struct perf_device *d, int rows) {
    for (int l = 0; l < z->pl->num_layers; l++)
        hs->c[l + 1] = hs->c[l] + perf_layer_matmul_sec(z->pl, l, d, rows);
    hs->kv = perf_layer_attn_sec(z->pl, d, z->ctx * rows, 0, 0, z->kv_bytes);
    hs->head = perf_head_matmul_sec(z->pl, d, rows);
}

/* perf_stage_step_sec from the prefix sums: layers [a, b) of `wbytes` and `compute` seconds,
 * the head after them on the last stage. */
static double step_sec(const struct search *z, const struct perf_device *d,
                       const struct host_sums *hs, double rows, double wbytes, int a, int b,
                       int last) {
    return perf_step_sec(z->pl, d, b - a, rows, wbytes, hs->c[b] - hs->c[a], (b - a) * hs->kv,
                         last ? z->pl->head_bytes : 0, last ? hs->head : 0);
}

/* What host x can run stage s with: its choices of TP x KVP, or its device as it is. */
static int choices_of(const struct perf_host *x, const struct perf_device **out) {
    if (x->n_choices <= 0) {
        out[0] = &x->dev;
        return 1;
    }
    for (int i = 0; i < x->n_choices; i++)
        out[i] = &x->choice[i];
    return x->n_choices;
}

/* Stage s on host x over [a, b): of the host's TP x KVP choices that fit its memory, the one
 * fastest for the goal (at 1 row for latency, at g rows for throughput, the other to break a
 * tie), with its times at 1 row (*t1) and g rows (*tg) in milliseconds; -1 when none fits. */
static int choose(const struct search *z, int s, int x, int a, int b, int S, int last, double *t1,
                  double *tg) {
    const struct perf_host *host = &z->h->host[x];
    const struct perf_device *c[PERF_MAX_CHOICES];
    const int n = choices_of(host, c);
    struct stage_plan_entry e;
    stage_plan_price_stage(&e, z->mm, z->wpre, s, S, a, b);
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (perf_place_rank_bytes(&e, c[i], z->pl->kv_heads) > host->mem_bytes) continue;
        const double u1 = 1e3 * step_sec(z, c[i], &z->sums[x], 1, z->b1[b] - z->b1[a], a, b, last);
        const double ug =
            1e3 * step_sec(z, c[i], &z->gsums[s], z->g, z->bg[b] - z->bg[a], a, b, last);
        const double p = z->goal == PERF_GOAL_THROUGHPUT ? ug : u1,
                     q = z->goal == PERF_GOAL_THROUGHPUT ? u1 : ug;
        const double bp = z->goal == PERF_GOAL_THROUGHPUT ? *tg : *t1,
                     bq = z->goal == PERF_GOAL_THROUGHPUT ? *t1 : *tg;
        if (best < 0 || p < bp - 1e-12 || (fabs(p - bp) <= 1e-12 && q < bq - 1e-12)) {
            best = i;
            *t1 = u1;
            *tg = ug;
        }
    }
    return best;
}

/* The objective of a finished plan: (primary, secondary) = latency goal: (ms per token, pace);
 * throughput goal: (pace, ms per token). */
struct score {
    double primary, secondary;
};

static int better(struct score a, struct score b) {
    return a.primary < b.primary - 1e-12 ||
           (fabs(a.primary - b.primary) <= 1e-12 && a.secondary < b.secondary - 1e-12);
}

/* The DP for one host order `order` [S]: the best split, into ranges; INFINITY if none fits. */
static struct score best_split(struct search *z, const int *order, int S,
                               struct stage_range *ranges) {
    const int L = z->pl->num_layers, g = perf_rows_per_step(z->batch, S);
    z->g = g;
    for (int l = 0; l < L; l++) /* this pipeline's rows per step */
        z->bg[l + 1] = z->bg[l] + perf_layer_bytes(z->pl, l, g);
    for (int s = 0; s < S; s++)
        host_sums_fill(&z->gsums[s], z, &z->h->host[order[s]].dev, g);
    /* dp[s][j]: best (sum of t1, max of tg) for stages 0..s owning [0, j), by the goal */
    static double sum1[STAGE_PLAN_MAX_STAGES][MODEL_CONFIG_MAX_LAYERS + 1];
    static double maxg[STAGE_PLAN_MAX_STAGES][MODEL_CONFIG_MAX_LAYERS + 1];
    static int from[STAGE_PLAN_MAX_STAGES][MODEL_CONFIG_MAX_LAYERS + 1];
    struct score none = {INFINITY, INFINITY};
    for (int s = 0; s < S; s++)
        for (int j = 0; j <= L; j++)
            sum1[s][j] = maxg[s][j] = INFINITY;
    for (int s = 0; s < S; s++) {
        const int last = s == S - 1;
        for (int j = s + 1; j <= L - (S - 1 - s); j++) {
            if (last && j != L) continue;
            for (int i = s; i < j; i++) {
                if (s == 0 && i != 0) break;
                double p1 = s ? sum1[s - 1][i] : 0, pg = s ? maxg[s - 1][i] : 0;
                if (!isfinite(p1)) continue;
                double t1 = 0, tg = 0;
                if (choose(z, s, order[s], i, j, S, last, &t1, &tg) < 0) continue;
                struct score cand = {p1 + t1, fmax(pg, tg)}, cur = {sum1[s][j], maxg[s][j]};
                if (z->goal == PERF_GOAL_THROUGHPUT) {
                    cand = (struct score){fmax(pg, tg), p1 + t1};
                    cur = (struct score){maxg[s][j], sum1[s][j]};
                }
                if (better(cand, cur)) {
                    sum1[s][j] = p1 + t1;
                    maxg[s][j] = fmax(pg, tg);
                    from[s][j] = i;
                }
            }
        }
    }
    if (!isfinite(sum1[S - 1][L])) return none;
    for (int s = S - 1, j = L; s >= 0; s--) {
        ranges[s] = (struct stage_range){from[s][j], j};
        j = from[s][j];
    }
    double latency = sum1[S - 1][L]; /* plus every hop of the ring (the order's links) */
    for (int s = 0; S > 1 && s < S; s++)
        latency += perf_hop_ms(z->pl, perf_hosts_link(z->h, order[s], order[(s + 1) % S]),
                               s < S - 1); /* rows to the next stage, the token back */
    /* ms per B tokens: the pipeline's steady state, bounded above by S steps of the slowest
     * stage (a round of every request is at most that; perf_predict prices the round too) */
    double pace = maxg[S - 1][L] * S;
    return z->goal == PERF_GOAL_THROUGHPUT ? (struct score){pace, latency}
                                           : (struct score){latency, pace};
}

struct walk {
    struct search *z;
    struct perf_placement *best;
    struct score best_score;
    int order[PERF_PLACE_EXACT_HOSTS], used[PERF_MAX_HOSTS];
};

static void try_order(struct walk *w, int S) {
    struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
    struct score sc = best_split(w->z, w->order, S, ranges);
    w->best->orders_tried++;
    if (!isfinite(sc.primary) || !better(sc, w->best_score)) return;
    w->best_score = sc;
    w->best->num_stages = S;
    memcpy(w->best->host, w->order, sizeof(int) * (size_t)S);
    memcpy(w->best->ranges, ranges, sizeof(struct stage_range) * (size_t)S);
}

/* Every ordered subset of the hosts (depth-first), each tried as a pipeline. */
static void permute(struct walk *w, int depth, int max_depth) {
    if (depth > 0 && depth <= w->z->pl->num_layers) try_order(w, depth);
    if (depth == max_depth) return;
    for (int x = 0; x < w->z->h->n; x++) {
        if (w->used[x]) continue;
        w->used[x] = 1;
        w->order[depth] = x;
        permute(w, depth + 1, max_depth);
        w->used[x] = 0;
    }
}

int perf_place(struct perf_placement *out, const struct perf_layers *pl,
               const struct stage_memory_model *mm, const struct perf_hosts *h,
               const struct perf_options *opt, enum perf_goal goal) {
    memset(out, 0, sizeof *out);
    if (h->n < 1) return strata_set_error(STRATA_EINVAL, "placement: no hosts");
    struct search *z = calloc(1, sizeof *z);
    struct walk *w = calloc(1, sizeof *w);
    if (z) z->sums = calloc((size_t)h->n, sizeof *z->sums);
    if (!z || !w || !z->sums) {
        if (z) free(z->sums);
        free(z);
        free(w);
        return strata_set_error(STRATA_ENOMEM, "placement: out of memory");
    }
    const int L = pl->num_layers, B = opt->batch > 0 ? opt->batch : 1;
    const double ctx = perf_options_context(opt), kvb = perf_options_kv_bytes(opt);
    struct host_sums *sums = z->sums;
    memset(z, 0, sizeof *z);
    z->pl = pl;
    z->mm = mm;
    z->h = h;
    z->goal = goal;
    z->batch = B;
    z->ctx = ctx;
    z->kv_bytes = kvb;
    z->sums = sums;
    for (int l = 0; l < L; l++)
        z->b1[l + 1] = z->b1[l] + perf_layer_bytes(pl, l, 1);
    stage_plan_layer_prefix(z->wpre, mm);
    for (int x = 0; x < h->n; x++)
        host_sums_fill(&z->sums[x], z, &h->host[x].dev, 1);
    w->z = z;
    w->best = out;
    w->best_score = (struct score){INFINITY, INFINITY};
    if (h->n <= PERF_PLACE_EXACT_HOSTS) {
        permute(w, 0, h->n);
    } else { /* the given order, every prefix */
        for (int S = 1; S <= h->n && S <= L && S <= STAGE_PLAN_MAX_STAGES; S++) {
            int order[STAGE_PLAN_MAX_STAGES];
            for (int s = 0; s < S; s++)
                order[s] = s;
            struct stage_range ranges[STAGE_PLAN_MAX_STAGES];
            struct score sc = best_split(z, order, S, ranges);
            out->orders_tried++;
            if (isfinite(sc.primary) && better(sc, w->best_score)) {
                w->best_score = sc;
                out->num_stages = S;
                memcpy(out->host, order, sizeof(int) * (size_t)S);
                memcpy(out->ranges, ranges, sizeof(struct stage_range) * (size_t)S);
            }
        }
    }
    int rc = 0;
    if (out->num_stages == 0) {
        uint64_t total = 0, have = 0;
        struct stage_range all = {0, L};
        perf_place_memory(&total, mm, NULL, &all, 1, pl->kv_heads);
        for (int x = 0; x < h->n; x++)
            have += h->host[x].mem_bytes *
                    (uint64_t)(h->host[x].dev.tp > 1 ? h->host[x].dev.tp : 1) *
                    (uint64_t)(h->host[x].dev.kvp > 1 ? h->host[x].dev.kvp : 1);
        char need[32], got[32];
        stage_plan_format_size(need, sizeof need, total);
        stage_plan_format_size(got, sizeof got, have);
        rc = strata_set_error(STRATA_ERANGE,
                              "no placement fits: the model needs about %s (weights, KV at "
                              "--max-seq x --batch, workspace), the %d host(s) have %s in all",
                              need, h->n, got);
    } else { /* each stage's choice again (the DP kept only the ranges), then the prediction */
        const int S = out->num_stages;
        z->g = perf_rows_per_step(B, S);
        for (int l = 0; l < L; l++)
            z->bg[l + 1] = z->bg[l] + perf_layer_bytes(pl, l, z->g);
        for (int s = 0; s < S; s++) {
            const struct perf_device *c[PERF_MAX_CHOICES];
            choices_of(&h->host[out->host[s]], c);
            host_sums_fill(&z->gsums[s], z, &h->host[out->host[s]].dev, z->g);
            double t1 = 0, tg = 0;
            const int i = choose(z, s, out->host[s], out->ranges[s].layer_start,
                                 out->ranges[s].layer_end, S, s == S - 1, &t1, &tg);
            out->dev[s] = *c[i >= 0 ? i : 0];
        }
        perf_place_memory(out->stage_bytes, mm, out->dev, out->ranges, S, pl->kv_heads);
        struct perf_link hops[STAGE_PLAN_MAX_STAGES];
        perf_hosts_ring(hops, h, out->host, S);
        rc = perf_predict_hops(&out->pred, pl, out->ranges, S, out->dev, hops, opt);
    }
    free(z->sums);
    free(z);
    free(w);
    return rc;
}
