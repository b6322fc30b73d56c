/* Prometheus metrics of the HTTP front (see serve_metrics.h). */
#include "runtime/serve/serve_metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Seconds; time to first token includes the prompt's prefill, hence the longer tail. */
static const double TTFT_BOUNDS[SERVE_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                       0.5,   1,    2.5,   5,    10,  30};
static const double ITL_BOUNDS[SERVE_HIST_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                      0.05,   0.1,   0.25,   0.5,   1,    2.5};

void serve_metrics_init(struct serve_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void serve_metrics_destroy(struct serve_metrics *m) {
    pthread_mutex_destroy(&m->mu);
}

void serve_metrics_request(struct serve_metrics *m, int http_status) {
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < SERVE_METRICS_STATUSES; i++) {
        if (m->status_codes[i] == 0) m->status_codes[i] = http_status;
        if (m->status_codes[i] == http_status) {
            m->status_counts[i]++;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_tokens(struct serve_metrics *m, int prompt, int cached, int completion) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += prompt;
    m->cached_tokens += cached;
    m->completion_tokens += completion;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_in_flight(struct serve_metrics *m, int delta) {
    pthread_mutex_lock(&m->mu);
    m->in_flight += delta;
    pthread_mutex_unlock(&m->mu);
}

long serve_metrics_get_in_flight(struct serve_metrics *m) {
    pthread_mutex_lock(&m->mu);
    long n = m->in_flight;
    pthread_mutex_unlock(&m->mu);
    return n;
}

static void observe(struct serve_metrics *m, struct serve_hist *h, const double *bounds, double v) {
    int b = 0;
    while (b < SERVE_HIST_BUCKETS && v > bounds[b])
        b++;
    pthread_mutex_lock(&m->mu);
    h->counts[b]++;
    h->sum += v;
    h->n++;
    pthread_mutex_unlock(&m->mu);
}

void serve_metrics_ttft(struct serve_metrics *m, double seconds) {
    observe(m, &m->ttft, TTFT_BOUNDS, seconds);
}

void serve_metrics_itl(struct serve_metrics *m, double seconds) {
    observe(m, &m->itl, ITL_BOUNDS, seconds);
}

static int appendf(struct serve_buf *out, const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    return serve_buf_append(out, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
}

static int render_hist(struct serve_buf *out, const char *name, const char *help,
                       const struct serve_hist *h, const double *bounds) {
    long cum = 0;
    int rc = appendf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int b = 0; b < SERVE_HIST_BUCKETS && rc == 0; b++) {
        cum += h->counts[b];
        rc = appendf(out, "%s_bucket{le=\"%g\"} %ld\n", name, bounds[b], cum);
    }
    if (rc == 0) rc = appendf(out, "%s_bucket{le=\"+Inf\"} %ld\n", name, h->n);
    if (rc == 0) rc = appendf(out, "%s_sum %.6f\n%s_count %ld\n", name, h->sum, name, h->n);
    return rc;
}

void serve_metrics_grpc(struct serve_metrics *m, int code) {
    if (code < 0 || code >= SERVE_GRPC_CODES) return;
    pthread_mutex_lock(&m->mu);
    m->grpc_counts[code]++;
    pthread_mutex_unlock(&m->mu);
}

/* gRPC's names of its status codes (doc/statuscodes.md), the label values its own metrics use. */
static const char *const GRPC_CODE_NAMES[SERVE_GRPC_CODES] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

static int render_grpc(struct serve_metrics *m, struct serve_buf *out) {
    int rc = appendf(out, "# HELP strata_serve_grpc_requests_total gRPC calls ended, by status "
                          "code.\n# TYPE strata_serve_grpc_requests_total counter\n");
    for (int i = 0; i < SERVE_GRPC_CODES && rc == 0; i++)
        if (m->grpc_counts[i])
            rc = appendf(out, "strata_serve_grpc_requests_total{code=\"%s\"} %ld\n",
                         GRPC_CODE_NAMES[i], m->grpc_counts[i]);
    return rc;
}

int serve_metrics_render(struct serve_metrics *m, struct serve_buf *out) {
    pthread_mutex_lock(&m->mu);
    int rc = appendf(out, "# HELP strata_serve_requests_total HTTP requests answered, by "
                          "status.\n# TYPE strata_serve_requests_total counter\n");
    for (int i = 0; i < SERVE_METRICS_STATUSES && m->status_codes[i] && rc == 0; i++)
        rc = appendf(out, "strata_serve_requests_total{status=\"%d\"} %ld\n", m->status_codes[i],
                     m->status_counts[i]);
    if (rc == 0) rc = render_grpc(m, out);
    if (rc == 0)
        rc = appendf(out,
                     "# TYPE strata_serve_prompt_tokens_total counter\n"
                     "strata_serve_prompt_tokens_total %ld\n",
                     m->prompt_tokens);
    if (rc == 0) /* cached / prompt is the prefix cache's hit rate in tokens */
        rc = appendf(out,
                     "# HELP strata_serve_prompt_tokens_cached_total Prompt tokens whose KV came "
                     "from the prefix cache.\n"
                     "# TYPE strata_serve_prompt_tokens_cached_total counter\n"
                     "strata_serve_prompt_tokens_cached_total %ld\n",
                     m->cached_tokens);
    if (rc == 0)
        rc = appendf(out,
                     "# TYPE strata_serve_completion_tokens_total counter\n"
                     "strata_serve_completion_tokens_total %ld\n",
                     m->completion_tokens);
    if (rc == 0)
        rc = appendf(out,
                     "# TYPE strata_serve_requests_in_flight gauge\n"
                     "strata_serve_requests_in_flight %ld\n",
                     m->in_flight);
    if (rc == 0)
        rc = render_hist(out, "strata_serve_time_to_first_token_seconds",
                         "Submit to first generated token.", &m->ttft, TTFT_BOUNDS);
    if (rc == 0)
        rc = render_hist(out, "strata_serve_inter_token_latency_seconds",
                         "Gap between consecutive generated tokens.", &m->itl, ITL_BOUNDS);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int serve_metrics_render_stages(const struct client_describe *d, struct serve_buf *out) {
    static const struct {
        const char *name, *help;
    } gauges[8] = {
        {"strata_stage_kv_slots", "KV slots of each stage (--max-batch)."},
        {"strata_stage_kv_slots_in_use", "Requests holding a KV slot, per stage."},
        {"strata_stage_queue_depth",
         "Work items (prompt chunks, decode rows) queued at each stage."},
        {"strata_stage_requests_waiting", "Requests waiting for KV in stage 0's admission queue."},
        {"strata_stage_kv_blocks", "Blocks of 16 positions in each stage's KV pool (--kv-memory)."},
        {"strata_stage_kv_blocks_used", "KV blocks held by requests, per stage."},
        {"strata_stage_kv_blocks_reserved",
         "Free KV blocks promised to running requests, per stage."},
        {"strata_stage_kv_blocks_cached",
         "KV blocks kept for prefix reuse and held by no request, per stage."}};
    int rc = appendf(out,
                     "# HELP strata_serve_stages_up Whether the ring answered the describe behind "
                     "the strata_stage_* gauges.\n# TYPE strata_serve_stages_up gauge\n"
                     "strata_serve_stages_up %d\n",
                     d != NULL);
    for (int g = 0; d && g < 8 && rc == 0; g++) {
        rc = appendf(out, "# HELP %s %s\n# TYPE %s gauge\n", gauges[g].name, gauges[g].help,
                     gauges[g].name);
        for (int i = 0; i < d->num_stages && rc == 0; i++) {
            const struct client_stage_info *s = &d->stages[i];
            if (s->front) continue; /* the vision stage holds no KV and queues no rows */
            const int v[8] = {s->max_batch,          s->kv_slots_in_use, s->queue_depth,
                              s->requests_waiting,   s->kv_blocks,       s->kv_blocks_used,
                              s->kv_blocks_reserved, s->kv_blocks_cached};
            rc = appendf(out, "%s{stage=\"%d\"} %d\n", gauges[g].name, s->stage_index, v[g]);
        }
    }
    /* Stage 0's counters: its admission queue and its prefix cache (hit rate: hits over
     * lookups, or cached over prompt tokens). */
    const struct client_stage_info *s0 = NULL;
    for (int i = 0; d && i < d->num_stages; i++)
        if (d->stages[i].stage_index == 0 && !d->stages[i].front) s0 = &d->stages[i];
    if (!s0) return rc;
    const struct wire_stage_totals *t = &s0->totals;
    const struct {
        const char *name, *labels, *help;
        uint64_t v;
    } counters[] = {
        {"strata_stage_queue_requests_total", "",
         "Requests that waited in stage 0's admission queue.", t->requests_queued},
        {"strata_stage_queue_admitted_total", "", "Requests admitted from stage 0's queue.",
         t->queue_admitted},
        {"strata_stage_queue_refused_total", ",reason=\"full\"",
         "Requests refused by stage 0's queue: full (--max-queue) or past their deadline "
         "(--queue-timeout-ms).",
         t->queue_refused_full},
        {"strata_stage_queue_refused_total", ",reason=\"deadline\"", NULL, t->queue_expired},
        {"strata_stage_prefix_lookups_total", "", "Prompts looked up in the prefix cache.",
         t->prefix_lookups},
        {"strata_stage_prefix_hits_total", "", "Prompts that reused cached KV blocks.",
         t->prefix_hits},
        {"strata_stage_prefix_cached_tokens_total", "",
         "Prompt tokens whose KV came from the prefix cache.", t->prefix_cached_tokens},
        {"strata_stage_prefix_prompt_tokens_total", "",
         "Prompt tokens of the prompts looked up in the prefix cache.", t->prefix_prompt_tokens},
        {"strata_stage_prefix_fallbacks_total", "",
         "Reuses sent again cold because a later stage lacked a cached block.",
         t->prefix_fallbacks},
        {"strata_stage_spec_decode_steps_total", "",
         "Decode steps stage 0 sent with draft tokens (speculative decoding).", t->spec_steps},
        {"strata_stage_spec_decode_draft_tokens_total", "", "Draft tokens those steps carried.",
         t->spec_drafted},
        {"strata_stage_spec_decode_accepted_tokens_total", "",
         "Draft tokens the last stage accepted: tokens that took no step of their own.",
         t->spec_accepted},
        {"strata_stage_spec_decode_withheld_tokens_total", "",
         "Draft tokens stage 0 held back: under the load of the moment a step with them "
         "would have cost more than they were likely to save.",
         t->spec_withheld}};
    for (size_t i = 0; rc == 0 && i < sizeof counters / sizeof *counters; i++) {
        if (counters[i].help)
            rc = appendf(out, "# HELP %s %s\n# TYPE %s counter\n", counters[i].name,
                         counters[i].help, counters[i].name);
        if (rc == 0)
            rc = appendf(out, "%s{stage=\"0\"%s} %llu\n", counters[i].name, counters[i].labels,
                         (unsigned long long)counters[i].v);
    }
    if (rc == 0)
        rc = appendf(out,
                     "# HELP strata_stage_queue_wait_seconds_total Time the requests admitted "
                     "from stage 0's queue waited there, summed.\n"
                     "# TYPE strata_stage_queue_wait_seconds_total counter\n"
                     "strata_stage_queue_wait_seconds_total{stage=\"0\"} %.3f\n",
                     (double)t->queue_wait_ms / 1e3);
    return rc;
}
