/* In-process ring of stage cores for the stage core's unit tests (see the header). */
#include "tests/runtime/stage/stage_test_pipeline.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "tests/test_util.h"

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    long n;
    char *buf;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = 0;
    fclose(f);
    return buf;
}

static int json_ints(int32_t *out, int cap, const cJSON *array) {
    int n = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, array) {
        if (n < cap) out[n] = (int32_t)item->valuedouble;
        n++;
    }
    return n > cap ? -1 : n;
}

int tp_golden_load(struct tp_golden *g, const char *name) {
    char dir[4096], path[4200];
    char *text;
    cJSON *json;
    int rc;
    memset(g, 0, sizeof *g);
    snprintf(dir, sizeof dir, "%s", test_path("tests/golden"));
    snprintf(path, sizeof path, "%s/%s", dir, name);
    rc = model_config_load(&g->cfg, path);
    if (rc == 0) rc = safetensors_open(&g->st, path);
    if (rc < 0) return rc;
    snprintf(path, sizeof path, "%s/%s/golden.json", dir, name);
    text = read_text(path);
    json = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!json) return strata_set_error(STRATA_EFORMAT, "cannot read %s", path);
    g->prompt_len = json_ints(g->prompt, 4096, cJSON_GetObjectItem(json, "prompt_ids"));
    g->n_steps = json_ints(g->generated, 4096, cJSON_GetObjectItem(json, "generated_ids"));
    cJSON_Delete(json);
    if (g->prompt_len < 1 || g->n_steps < 1)
        return strata_set_error(STRATA_EFORMAT, "%s has no prompt or generated ids", path);
    return 0;
}

void tp_golden_free(struct tp_golden *g) {
    safetensors_close(g->st);
    g->st = NULL;
}

int tp_pipeline_init(struct tp_pipeline *p, struct tp_golden *g, int num_stages, const int *bounds,
                     int max_seq, int max_batch, int chunk_size) {
    return tp_pipeline_init_kv(p, g, num_stages, bounds, max_seq, max_batch, chunk_size, 0);
}

int tp_pipeline_init_kv(struct tp_pipeline *p, struct tp_golden *g, int num_stages,
                        const int *bounds, int max_seq, int max_batch, int chunk_size,
                        int send_kv) {
    return tp_pipeline_init_pool(p, g, num_stages, bounds, max_seq, max_batch, chunk_size, send_kv,
                                 0);
}

int tp_pipeline_init_pool(struct tp_pipeline *p, struct tp_golden *g, int num_stages,
                          const int *bounds, int max_seq, int max_batch, int chunk_size,
                          int send_kv, size_t kv_memory) {
    int L = g->cfg.num_layers, rc = 0;
    memset(p, 0, sizeof *p);
    p->num_stages = num_stages;
    for (int r = 0; r < num_stages && rc == 0; r++) {
        int base = L / num_stages, rem = L % num_stages;
        int start = bounds ? bounds[r] : r * base + (r < rem ? r : rem);
        int end = bounds ? bounds[r + 1] : start + base + (r < rem ? 1 : 0);
        struct stage_open_options so = {.cfg = &g->cfg,
                                        .weights = g->st,
                                        .stage_index = r,
                                        .num_stages = num_stages,
                                        .layer_start = start,
                                        .layer_end = end,
                                        .num_threads = 1,
                                        .max_seq = max_seq,
                                        .max_batch = max_batch,
                                        .kv_memory = kv_memory,
                                        .chunk_size = chunk_size,
                                        .keep_logits = 1,
                                        .send_kv = send_kv};
        rc = stage_open(&p->stages[r], &so, NULL);
        p->cores[r] = p->stages[r].core;
    }
    return rc;
}

void tp_pipeline_free(struct tp_pipeline *p) {
    for (int r = 0; r < p->num_stages; r++) {
        for (int i = 0; i < p->num_results[r]; i++)
            stage_result_free(&p->results[r][i]);
        stage_close(&p->stages[r]);
    }
    memset(p, 0, sizeof *p);
}

int tp_submit(struct tp_pipeline *p, uint32_t client_id, const struct stage_request *req) {
    struct wire_arena arena;
    int rc = wire_arena_init(&arena, 0);
    if (rc == 0) rc = request_build(&arena, req);
    if (rc == 0)
        rc = stage_core_on_frame(p->cores[0], STAGE_LINK_CLIENT, client_id,
                                 wire_arena_frame(&arena), wire_arena_frame_len(&arena));
    wire_arena_free(&arena);
    return rc;
}

int tp_route(struct tp_pipeline *p) {
    int moved = 0, S = p->num_stages;
    for (int r = 0; r < S; r++) {
        struct stage_frame f;
        struct stage_result res;
        while (stage_core_pop_frame(p->cores[r], &f)) {
            moved = 1;
            p->frames_routed++;
            if (p->inspect) p->inspect(p->inspect_ctx, r, &f);
            if (f.link == STAGE_LINK_CLIENT && p->num_events < TP_MAX_EVENTS) {
                if (request_event_decode(&p->events[p->num_events], f.data, f.len) == 0)
                    p->event_client[p->num_events++] = f.client_id;
            } else if (f.link == STAGE_LINK_NEXT && S > 1) {
                stage_core_on_frame(p->cores[(r + 1) % S], STAGE_LINK_PREV, 0, f.data, f.len);
            } else if (f.link == STAGE_LINK_PREV && S > 1) {
                stage_core_on_frame(p->cores[(r - 1 + S) % S], STAGE_LINK_NEXT, 0, f.data, f.len);
            } /* f.data belongs to core r (valid until its next call): delivered, not kept */
        }
        while (stage_core_pop_result(p->cores[r], &res)) {
            if (p->num_results[r] < TP_MAX_RESULTS)
                p->results[r][p->num_results[r]++] = res;
            else
                stage_result_free(&res);
        }
    }
    return moved;
}

int tp_round(struct tp_pipeline *p) {
    int moved = tp_route(p);
    for (int r = 0; r < p->num_stages; r++) {
        if (stage_core_has_work(p->cores[r])) {
            stage_core_step(p->cores[r]);
            moved = 1;
        }
    }
    return tp_route(p) || moved;
}

int tp_run(struct tp_pipeline *p, int max_rounds) {
    int rounds = 0;
    while (rounds < max_rounds && tp_round(p))
        rounds++;
    return rounds;
}

int tp_client_tokens(const struct tp_pipeline *p, uint64_t nonce, int32_t *tokens, int cap,
                     int *ended, int *code, char *message, size_t message_cap) {
    int n = 0;
    *ended = 0;
    *code = 0;
    if (message_cap) message[0] = 0;
    for (int i = 0; i < p->num_events; i++) {
        const struct request_event *ev = &p->events[i];
        if (ev->nonce != nonce) continue;
        if (ev->kind == REQUEST_EVENT_TOKEN) {
            if (n < cap) tokens[n] = ev->token;
            n++;
            if (ev->finish != WIRE_FINISH_NONE) *ended = 1;
        } else {
            *ended = 1;
            *code = ev->code;
            if (message_cap) snprintf(message, message_cap, "%s", ev->message);
        }
    }
    return n;
}

const struct stage_result *tp_last_result(const struct tp_pipeline *p, uint64_t nonce) {
    int last = p->num_stages - 1;
    for (int i = 0; i < p->num_results[last]; i++)
        if (p->results[last][i].nonce == nonce) return &p->results[last][i];
    return NULL;
}

void tp_request(struct stage_request *req, uint64_t nonce, const int32_t *prompt, int prompt_len,
                int max_tokens) {
    memset(req, 0, sizeof *req);
    req->nonce = nonce;
    req->prompt = prompt;
    req->prompt_len = prompt_len;
    req->max_tokens = max_tokens;
    req->sampling.top_p = 1.0f;
}
