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
