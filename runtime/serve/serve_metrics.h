/* Prometheus counters of the fronts: HTTP requests by status, gRPC calls by status code,
 * tokens, time to first token and inter-token latency histograms, requests in flight (both
 * fronts). Thread-safe. */
#ifndef STRATA_RUNTIME_SERVE_SERVE_METRICS_H
#define STRATA_RUNTIME_SERVE_SERVE_METRICS_H

#include <pthread.h>

#include "runtime/serve/serve_json.h"

#define SERVE_METRICS_STATUSES 16
#define SERVE_HIST_BUCKETS 12
#define SERVE_GRPC_CODES 17 /* gRPC status codes 0 (OK) .. 16 (UNAUTHENTICATED) */

struct serve_hist {
    long counts[SERVE_HIST_BUCKETS + 1]; /* per bucket, the last one +Inf */
    double sum;
    long n;
};

struct serve_metrics {
    pthread_mutex_t mu;
    int status_codes[SERVE_METRICS_STATUSES];
    long status_counts[SERVE_METRICS_STATUSES];
    long grpc_counts[SERVE_GRPC_CODES];
    long prompt_tokens, cached_tokens, completion_tokens;
    long in_flight;
    struct serve_hist ttft, itl;
};

void serve_metrics_init(struct serve_metrics *m);
void serve_metrics_destroy(struct serve_metrics *m);
void serve_metrics_request(struct serve_metrics *m, int http_status);
/* A gRPC call ended with status `code` (0..16). */
void serve_metrics_grpc(struct serve_metrics *m, int code);
void serve_metrics_tokens(struct serve_metrics *m, int prompt, int cached, int completion);
void serve_metrics_in_flight(struct serve_metrics *m, int delta);
void serve_metrics_ttft(struct serve_metrics *m, double seconds);
void serve_metrics_itl(struct serve_metrics *m, double seconds);
long serve_metrics_get_in_flight(struct serve_metrics *m);
/* The exposition text (text/plain; version=0.0.4). */
int serve_metrics_render(struct serve_metrics *m, struct serve_buf *out);
/* The pipeline's per-stage gauges from a ring describe (runtime/stage/client.h), appended:
 * strata_stage_kv_slots / _kv_slots_in_use / _queue_depth / _requests_waiting / _kv_blocks /
 * _kv_blocks_used / _kv_blocks_reserved / _kv_blocks_cached {stage="r"}, and
 * strata_serve_stages_up (1, or 0 with no stage lines when d is NULL: the ring could not
 * answer), and stage 0's counters: strata_stage_queue_requests_total / _admitted_total /
 * _refused_total{reason="full"|"deadline"} / _wait_seconds_total and
 * strata_stage_prefix_lookups_total / _hits_total / _cached_tokens_total /
 * _prompt_tokens_total / _fallbacks_total. */
int serve_metrics_render_stages(const struct client_describe *d, struct serve_buf *out);

#endif
