/* Request frames: the parameters tensor layout, the client's request and cancel frames,
 * and decoding of the events a client receives (see request.h for why a request rides in
 * an Activation). */
#include "runtime/request.h"

#include <stdio.h>
#include <string.h>

#include "runtime/status.h"

/* Parameters tensor: I64 [REQUEST_PARAMS_WORDS]
 *   [0] magic, [1] prompt_len, [2] max_tokens, [3] temperature (f32 bits),
 *   [4] top_k, [5] top_p (f32 bits), [6] seed, [7] num_stop_ids, [8 ..] stop ids. */
#define REQUEST_PARAMS_MAGIC 0x5354525152455131LL /* "STRQREQ1" */

static int64_t float_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return (int64_t)bits;
}

static float bits_float(int64_t word) {
    uint32_t bits = (uint32_t)word;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

void request_params_pack(struct wire_tensor *t, int64_t *words, const struct request_params *p) {
    memset(words, 0, sizeof(int64_t) * REQUEST_PARAMS_WORDS);
    words[0] = REQUEST_PARAMS_MAGIC;
    words[1] = p->prompt_len;
    words[2] = p->max_tokens;
    words[3] = float_bits(p->sampling.temperature);
    words[4] = p->sampling.top_k;
    words[5] = float_bits(p->sampling.top_p);
    words[6] = (int64_t)p->sampling.seed;
    words[7] = p->num_stop_ids;
    for (int i = 0; i < p->num_stop_ids && i < REQUEST_MAX_STOP_IDS; i++)
        words[8 + i] = p->stop_ids[i];
    memset(t, 0, sizeof *t);
    t->defined = 1;
    t->dtype = WIRE_DTYPE_I64;
    t->ndim = 1;
    t->shape[0] = REQUEST_PARAMS_WORDS;
    t->codec = WIRE_CODEC_NONE;
    t->data = words;
    t->nbytes = sizeof(int64_t) * REQUEST_PARAMS_WORDS;
}

int request_params_unpack(struct request_params *p, const struct wire_tensor *t) {
    int64_t words[REQUEST_PARAMS_WORDS];
    memset(p, 0, sizeof *p);
    if (!t->defined) return strata_set_error(STRATA_EFORMAT, "request parameters are missing");
    if (t->dtype != WIRE_DTYPE_I64 || t->codec != WIRE_CODEC_NONE || t->ndim != 1 ||
        t->shape[0] < REQUEST_PARAMS_WORDS || t->nbytes < sizeof words)
        return strata_set_error(STRATA_EFORMAT,
                                "request parameters tensor is malformed (want I64 [%d])",
                                REQUEST_PARAMS_WORDS);
    memcpy(words, t->data, sizeof words);
    if (words[0] != REQUEST_PARAMS_MAGIC)
        return strata_set_error(STRATA_EFORMAT, "request parameters have a bad magic number");
    if (words[1] < 1 || words[1] > INT32_MAX)
        return strata_set_error(STRATA_EINVAL, "request prompt_len %lld is invalid",
                                (long long)words[1]);
    if (words[2] < 1 || words[2] > INT32_MAX)
        return strata_set_error(STRATA_EINVAL, "request max_tokens %lld is invalid (need >= 1)",
                                (long long)words[2]);
    if (words[7] < 0 || words[7] > REQUEST_MAX_STOP_IDS)
        return strata_set_error(STRATA_EINVAL, "request has %lld stop ids (at most %d)",
                                (long long)words[7], REQUEST_MAX_STOP_IDS);
    if (words[4] < INT32_MIN || words[4] > INT32_MAX)
        return strata_set_error(STRATA_EINVAL, "request top_k %lld is invalid",
                                (long long)words[4]);
    p->prompt_len = (int)words[1];
    p->max_tokens = (int)words[2];
    p->sampling.temperature = bits_float(words[3]);
    p->sampling.top_k = (int)words[4];
    p->sampling.top_p = bits_float(words[5]);
    p->sampling.seed = (uint64_t)words[6];
    p->num_stop_ids = (int)words[7];
    for (int i = 0; i < p->num_stop_ids; i++) {
        if (words[8 + i] < 0 || words[8 + i] > INT32_MAX)
            return strata_set_error(STRATA_EINVAL, "request stop id %lld is invalid",
                                    (long long)words[8 + i]);
        p->stop_ids[i] = (int32_t)words[8 + i];
    }
    if (p->sampling.temperature != p->sampling.temperature ||
        p->sampling.top_p != p->sampling.top_p)
        return strata_set_error(STRATA_EINVAL, "request temperature or top_p is NaN");
    return 0;
}

int request_build(struct wire_arena *arena, const struct stage_request *req) {
    struct request_params params;
    int64_t words[REQUEST_PARAMS_WORDS];
    struct wire_activation msg;
    if (req->prompt_len < 1 || !req->prompt)
        return strata_set_error(STRATA_EINVAL, "a request needs at least one prompt token");
    if (req->num_stop_ids < 0 || req->num_stop_ids > REQUEST_MAX_STOP_IDS)
        return strata_set_error(STRATA_EINVAL, "a request has at most %d stop ids",
                                REQUEST_MAX_STOP_IDS);
    memset(&params, 0, sizeof params);
    params.prompt_len = req->prompt_len;
    params.max_tokens = req->max_tokens;
    params.num_stop_ids = req->num_stop_ids;
    memcpy(params.stop_ids, req->stop_ids, sizeof params.stop_ids);
    params.sampling = req->sampling;

    memset(&msg, 0, sizeof msg);
    msg.stage_from = -1;
    msg.stage_to = 0;
    msg.step = 0;
    msg.pos = 0;
    msg.nonce = req->nonce;
    msg.hidden.defined = 1;
    msg.hidden.dtype = WIRE_DTYPE_I32;
    msg.hidden.ndim = 1;
    msg.hidden.shape[0] = req->prompt_len;
    msg.hidden.codec = WIRE_CODEC_NONE;
    msg.hidden.data = req->prompt;
    msg.hidden.nbytes = sizeof(int32_t) * (size_t)req->prompt_len;
    request_params_pack(&msg.attention_mask, words, &params);
    return wire_build_activation(arena, &msg);
}

int request_build_cancel(struct wire_arena *arena, uint64_t nonce) {
    struct wire_control msg;
    memset(&msg, 0, sizeof msg);
    msg.kind = WIRE_CONTROL_CANCEL;
    msg.nonce = nonce;
    return wire_build_control(arena, &msg);
}

int request_event_decode(struct request_event *ev, const uint8_t *frame, size_t len) {
    enum wire_kind kind;
    int rc;
    memset(ev, 0, sizeof *ev);
    rc = wire_verify(&kind, NULL, frame, len);
    if (rc < 0) return rc;
    if (kind == WIRE_KIND_TOKEN_RESULT) {
        struct wire_token_result msg;
        rc = wire_read_token_result(&msg, frame, len);
        if (rc < 0) return rc;
        if (msg.num_tokens != 1)
            return strata_set_error(STRATA_EFORMAT,
                                    "token result for nonce %llu has %zu tokens, "
                                    "expected 1",
                                    (unsigned long long)msg.nonce, msg.num_tokens);
        ev->kind = REQUEST_EVENT_TOKEN;
        ev->nonce = msg.nonce;
        ev->step = msg.step;
        ev->token = msg.tokens[0];
        ev->finish = msg.finish;
        return 0;
    }
    if (kind == WIRE_KIND_ERROR) {
        struct wire_error msg;
        rc = wire_read_error(&msg, frame, len);
        if (rc < 0) return rc;
        ev->kind = REQUEST_EVENT_ERROR;
        ev->nonce = msg.nonce;
        ev->code = msg.code;
        snprintf(ev->message, sizeof ev->message, "%s", msg.message ? msg.message : "");
        return 0;
    }
    return strata_set_error(STRATA_EFORMAT, "a client received an unexpected %s frame",
                            wire_kind_name(kind));
}
