/* Client connection to stage 0 (see client.h): handshake, request frames, event decoding. */
#include "runtime/stage/client.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"

int client_connect(struct strata_client *client, const char *host, int port,
                   const struct wire_auth_key *key, int timeout_ms) {
    return client_connect_tls(client, host, port, NULL, key, timeout_ms);
}

int client_connect_tls(struct strata_client *client, const char *host, int port,
                       struct wire_tls *tls, const struct wire_auth_key *key, int timeout_ms) {
    struct wire_hello self, peer;
    int rc;
    memset(client, 0, sizeof *client);
    client->conn.fd = -1;
    rc = wire_arena_init(&client->arena, 0);
    if (rc < 0) return rc;
    rc = wire_connect(&client->conn, host, port, 0, timeout_ms);
    if (rc < 0) return rc;
    if (tls) {
        rc = wire_tls_connect(&client->conn, tls, timeout_ms);
        if (rc < 0) return rc;
    }
    memset(&self, 0, sizeof self);
    self.version_major = WIRE_VERSION_MAJOR;
    self.version_minor = WIRE_VERSION_MINOR;
    self.stage_index = -1;
    self.role = WIRE_ROLE_CLIENT;
    snprintf(self.name, sizeof self.name, "strata-client");
    rc = wire_handshake_client(&peer, &client->conn, &self, key, timeout_ms);
    if (rc < 0) return rc;
    if (peer.stage_index != 0) {
        return strata_set_error(STRATA_EINVAL, "%s is stage %d, but clients talk to stage 0",
                                client->conn.peer, peer.stage_index);
    }
    return 0;
}

void client_close(struct strata_client *client) {
    if (!client) return;
    wire_close(&client->conn);
    wire_arena_free(&client->arena);
}

static int send_arena(struct strata_client *client) {
    return wire_send_frame(&client->conn, wire_arena_frame(&client->arena),
                           wire_arena_frame_len(&client->arena), 5000);
}

int client_submit(struct strata_client *client, const struct stage_request *request) {
    int rc = request_build(&client->arena, request);
    return rc < 0 ? rc : send_arena(client);
}

int client_cancel(struct strata_client *client, uint64_t nonce) {
    int rc = request_build_cancel(&client->arena, nonce);
    return rc < 0 ? rc : send_arena(client);
}

int client_next_event(struct strata_client *client, struct request_event *event, int timeout_ms) {
    const uint8_t *frame;
    size_t len;
    int rc = wire_recv_frame(&client->conn, &frame, &len, timeout_ms);
    if (rc < 0) return rc;
    return request_event_decode(event, frame, len);
}

int client_reconnect(struct strata_client *client, const char *host, int port,
                     const char *port_file, struct wire_tls *tls, const struct wire_auth_key *key,
                     int timeout_ms) {
    int64_t deadline = cli_now_ns() + (int64_t)timeout_ms * 1000000;
    char last[256] = "no attempt";
    for (;;) {
        int p = port, rc;
        client_close(client);
        if (port_file && cli_read_port_file(port_file, &p) < 0) p = -1;
        if (p > 0) {
            rc = client_connect_tls(client, host, p, tls, key, 1000);
            if (rc == 0) return 0;
            snprintf(last, sizeof last, "%s", strata_last_error());
        } else {
            snprintf(last, sizeof last, "stage 0's port is not known yet");
        }
        if (cli_now_ns() >= deadline) break;
        usleep(100 * 1000);
    }
    client_close(client);
    return strata_set_error(STRATA_ETIMEOUT, "no stage 0 to reconnect to within %d ms: %s",
                            timeout_ms, last);
}

int client_resubmit(struct strata_client *client, const struct stage_request *request,
                    const int32_t *tokens, int n) {
    struct stage_request resumed = *request;
    resumed.resume_tokens = n > 0 ? tokens : NULL;
    resumed.num_resume_tokens = n;
    return client_submit(client, &resumed);
}

int client_describe_send(struct strata_client *client, uint64_t nonce) {
    struct wire_control msg = {.kind = WIRE_CONTROL_DESCRIBE, .nonce = nonce};
    if (nonce == 0) return strata_set_error(STRATA_EINVAL, "a Describe needs a nonce != 0");
    int rc = wire_build_control(&client->arena, &msg);
    return rc < 0 ? rc : send_arena(client);
}

int client_describe_read(struct client_describe *out, const uint8_t *frame, size_t len) {
    struct wire_control msg;
    int rc = wire_read_control(&msg, frame, len);
    memset(out, 0, sizeof *out);
    if (rc < 0) return rc;
    if (msg.kind != WIRE_CONTROL_DESCRIBE || msg.num_stages > CLIENT_MAX_STAGES)
        return strata_set_error(STRATA_EFORMAT,
                                "not a describe answer (Control kind %d, %zu stages; at most %d)",
                                (int)msg.kind, msg.num_stages, CLIENT_MAX_STAGES);
    for (size_t i = 0; i < msg.num_stages; i++) {
        struct wire_stage_info e = wire_control_stage(&msg, i);
        struct client_stage_info *s = &out->stages[i];
        *s = (struct client_stage_info){.stage_index = e.stage_index,
                                        .num_stages = e.num_stages,
                                        .layer_start = e.layer_start,
                                        .layer_end = e.layer_end,
                                        .embed = e.embed,
                                        .head = e.head,
                                        .vision = e.vision,
                                        .tp = e.tp,
                                        .kvp = e.kvp,
                                        .threads = e.threads,
                                        .max_seq = e.max_seq,
                                        .max_batch = e.max_batch,
                                        .kv_slots_in_use = e.kv_slots_in_use,
                                        .queue_depth = e.queue_depth,
                                        .requests_waiting = e.requests_waiting,
                                        .kv_blocks = e.kv_blocks,
                                        .kv_blocks_used = e.kv_blocks_used,
                                        .kv_blocks_reserved = e.kv_blocks_reserved,
                                        .kv_blocks_cached = e.kv_blocks_cached,
                                        .totals = e.totals,
                                        .front = e.front};
        snprintf(s->device, sizeof s->device, "%s", e.device);
        snprintf(s->weights_dtype, sizeof s->weights_dtype, "%s", e.weights_dtype);
        snprintf(s->version, sizeof s->version, "%s", e.version);
        snprintf(s->next, sizeof s->next, "%s", e.next);
    }
    out->num_stages = (int)msg.num_stages;
    return 0;
}

int client_describe(struct strata_client *client, struct client_describe *out, int timeout_ms) {
    const uint64_t nonce = 0x44455343u; /* "DESC": the only thing on this connection */
    int64_t deadline = cli_now_ns() + (int64_t)timeout_ms * 1000000;
    int rc = client_describe_send(client, nonce);
    while (rc == 0) {
        struct request_event ev;
        int64_t left = (deadline - cli_now_ns()) / 1000000;
        if (left <= 0)
            return strata_set_error(STRATA_ETIMEOUT, "no describe answer from stage 0 in %d ms",
                                    timeout_ms);
        rc = client_next_event(client, &ev, (int)left);
        if (rc == STRATA_ETIMEOUT) continue;
        if (rc < 0) break;
        if (ev.kind == REQUEST_EVENT_CONNECTION_ERROR ||
            (ev.kind == REQUEST_EVENT_ERROR && ev.nonce == nonce))
            return strata_set_error(ev.code < 0 ? ev.code : STRATA_EPEER, "%s", ev.message);
        if (ev.kind == REQUEST_EVENT_DESCRIBE && ev.nonce == nonce)
            return client_describe_read(out, ev.frame, ev.frame_len);
    }
    return rc;
}

void client_describe_table(char *buf, size_t cap, const struct client_describe *d) {
    size_t used = 0;
    /* requests: in flight / --max-batch, then "+N" waiting in stage 0's queue; kv blocks:
     * held / the pool (blocks of 16 positions); cached: kept for prefix reuse; max seq: one
     * request's cap. */
    int n = snprintf(buf, cap, "%-5s %-10s %-18s %-8s %-7s %-7s %-10s %-13s %-7s %-7s %-8s %s\n",
                     "stage", "layers", "roles", "tp x kvp", "threads", "weights", "requests",
                     "kv blocks", "cached", "max seq", "build", "device");
    for (int i = 0; n > 0 && (used += (size_t)n) < cap && i < d->num_stages; i++) {
        const struct client_stage_info *s = &d->stages[i];
        char layers[32], roles[32], grid[24], kv[32], reqs[40];
        snprintf(layers, sizeof layers, "[%d,%d)", s->layer_start, s->layer_end);
        snprintf(roles, sizeof roles, "%s%s%s%s", s->embed ? "embed," : "",
                 s->vision ? "vision," : "", s->head ? "head," : "",
                 s->embed || s->vision || s->head ? "" : "-");
        if (roles[strlen(roles) - 1] == ',') roles[strlen(roles) - 1] = 0;
        snprintf(grid, sizeof grid, "%dx%d", s->tp, s->kvp);
        snprintf(kv, sizeof kv, "%d/%d", s->kv_blocks_used, s->kv_blocks);
        snprintf(reqs, sizeof reqs, s->requests_waiting ? "%d/%d+%d" : "%d/%d", s->kv_slots_in_use,
                 s->max_batch, s->requests_waiting);
        const char *build = strncmp(s->version, "strata ", 7) ? s->version : s->version + 7;
        char stage[8];
        snprintf(stage, sizeof stage, s->front ? "v" : "%d", s->stage_index);
        n = snprintf(buf + used, cap - used,
                     "%-5s %-10s %-18s %-8s %-7d %-7s %-10s %-13s %-7d %-7d %-8s %s\n", stage,
                     layers, roles, grid, s->threads, s->weights_dtype, reqs, kv,
                     s->kv_blocks_cached, s->max_seq, build, s->device);
    }
}

void client_describe_totals(char *buf, size_t cap, const struct client_describe *d) {
    if (cap) buf[0] = '\0';
    for (int i = 0; i < d->num_stages; i++) {
        const struct wire_stage_totals *t = &d->stages[i].totals;
        if (d->stages[i].stage_index != 0 || d->stages[i].front) continue;
        snprintf(buf, cap,
                 "stage 0 since start: queue %llu waited (mean %.0f ms), %llu refused full, "
                 "%llu past their deadline; prefix cache %llu of %llu prompts, %llu of %llu "
                 "prompt tokens (%.1f%%), %llu fell back cold; speculation %llu of %llu draft "
                 "tokens accepted over %llu steps, %llu held back under load\n",
                 (unsigned long long)t->requests_queued,
                 t->queue_admitted ? (double)t->queue_wait_ms / (double)t->queue_admitted : 0.0,
                 (unsigned long long)t->queue_refused_full, (unsigned long long)t->queue_expired,
                 (unsigned long long)t->prefix_hits, (unsigned long long)t->prefix_lookups,
                 (unsigned long long)t->prefix_cached_tokens,
                 (unsigned long long)t->prefix_prompt_tokens,
                 t->prefix_prompt_tokens
                     ? 100.0 * (double)t->prefix_cached_tokens / (double)t->prefix_prompt_tokens
                     : 0.0,
                 (unsigned long long)t->prefix_fallbacks, (unsigned long long)t->spec_accepted,
                 (unsigned long long)t->spec_drafted, (unsigned long long)t->spec_steps,
                 (unsigned long long)t->spec_withheld);
    }
}
