/* Test harness for the stage core without sockets: S cores in one process, a router that
 * moves their frames around the ring (NEXT of r -> PREV of r+1, PREV of r -> NEXT of r-1,
 * CLIENT frames decoded into events), and golden-model helpers. Used by the cmocka tests
 * of the loop, the multiplexer, admission control and frame checks. */
#ifndef STRATA_TESTS_RUNTIME_STAGE_TEST_PIPELINE_H
#define STRATA_TESTS_RUNTIME_STAGE_TEST_PIPELINE_H

#include <stdint.h>

#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/stage/request.h"
#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_open.h"

#define TP_MAX_STAGES 8
#define TP_MAX_EVENTS 4096
#define TP_MAX_RESULTS 256

struct tp_golden {
    struct model_config cfg;
    struct safetensors *st;
    int32_t prompt[4096];
    int prompt_len;
    int32_t generated[4096];
    int n_steps;
};

/* Loads tests/golden/<name> (config, weights, prompt and generated ids). */
int tp_golden_load(struct tp_golden *g, const char *name);
void tp_golden_free(struct tp_golden *g);

struct tp_pipeline {
    int num_stages;
    struct stage stages[TP_MAX_STAGES];         /* backend + core (stage_open) */
    struct stage_core *cores[TP_MAX_STAGES];    /* stages[r].core */
    struct request_event events[TP_MAX_EVENTS]; /* what clients received, in order */
    uint32_t event_client[TP_MAX_EVENTS];
    int num_events;
    struct stage_result results[TP_MAX_STAGES][TP_MAX_RESULTS];
    int num_results[TP_MAX_STAGES];
    int frames_routed;
    /* Optional: sees every frame stage r emits before it is routed (set after init). */
    void (*inspect)(void *ctx, int stage, const struct stage_frame *frame);
    void *inspect_ctx;
};

/* Builds S stages with the even split (or `bounds` [S+1] when not NULL). */
int tp_pipeline_init(struct tp_pipeline *p, struct tp_golden *g, int num_stages, const int *bounds,
                     int max_seq, int max_batch, int chunk_size);
/* The same with every stage's send_kv set as given (KV handoff after each prefill). */
int tp_pipeline_init_kv(struct tp_pipeline *p, struct tp_golden *g, int num_stages,
                        const int *bounds, int max_seq, int max_batch, int chunk_size, int send_kv);
/* The same with every stage's KV pool holding kv_memory bytes (0: every slot at max_seq). */
int tp_pipeline_init_pool(struct tp_pipeline *p, struct tp_golden *g, int num_stages,
                          const int *bounds, int max_seq, int max_batch, int chunk_size,
                          int send_kv, size_t kv_memory);
void tp_pipeline_free(struct tp_pipeline *p);

/* Submits a request from client `client_id` to stage 0. */
int tp_submit(struct tp_pipeline *p, uint32_t client_id, const struct stage_request *req);
/* Moves queued frames (no compute); returns 1 if any moved. */
int tp_route(struct tp_pipeline *p);
/* Moves frames and runs one microbatch per stage with work; returns 1 if anything moved. */
int tp_round(struct tp_pipeline *p);
/* Rounds until quiet (or max_rounds); returns the number of rounds. */
int tp_run(struct tp_pipeline *p, int max_rounds);

/* The tokens a client saw for `nonce` (count returned), and whether it ended (finish or
 * error code via *code: 0 when finished normally). */
int tp_client_tokens(const struct tp_pipeline *p, uint64_t nonce, int32_t *tokens, int cap,
                     int *ended, int *code, char *message, size_t message_cap);
/* The last stage's result for `nonce`, or NULL. */
const struct stage_result *tp_last_result(const struct tp_pipeline *p, uint64_t nonce);

/* A greedy request for the golden prompt. */
void tp_request(struct stage_request *req, uint64_t nonce, const int32_t *prompt, int prompt_len,
                int max_tokens);

#endif
