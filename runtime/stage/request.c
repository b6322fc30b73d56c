/* Request frames: runtime checks of a wire Request, the client's request and cancel frames,
 * and decoding of the events a client receives (see request.h). */
#include "runtime/stage/request.h"

#include <stdio.h>
#include <string.h>

#include "runtime/base/status.h"

int request_params_from_wire(struct request_params *p, const struct wire_request *msg) {
    memset(p, 0, sizeof *p);
    if (msg->nonce == 0) return strata_set_error(STRATA_EINVAL, "request nonce 0 is reserved");
    if (msg->prompt_len < 1 || msg->prompt_len > INT32_MAX || !msg->prompt)
        return strata_set_error(STRATA_EINVAL, "request prompt length %zu is invalid",
                                msg->prompt_len);
    if (msg->max_tokens < 1)
        return strata_set_error(STRATA_EINVAL, "request max_tokens %d is invalid (need >= 1)",
                                (int)msg->max_tokens);
    if (msg->num_stop_ids > REQUEST_MAX_STOP_IDS)
        return strata_set_error(STRATA_EINVAL, "request has %zu stop ids (at most %d)",
                                msg->num_stop_ids, REQUEST_MAX_STOP_IDS);
    for (size_t i = 0; i < msg->num_stop_ids; i++) {
        if (msg->stop_ids[i] < 0)
            return strata_set_error(STRATA_EINVAL, "request stop id %d is invalid",
                                    (int)msg->stop_ids[i]);
        p->stop_ids[i] = msg->stop_ids[i];
    }
    if (msg->temperature != msg->temperature || msg->top_p != msg->top_p)
        return strata_set_error(STRATA_EINVAL, "request temperature or top_p is NaN");
    p->prompt_len = (int)msg->prompt_len;
    p->max_tokens = msg->max_tokens;
    p->num_stop_ids = (int)msg->num_stop_ids;
    p->sampling.temperature = msg->temperature;
    p->sampling.top_k = msg->top_k;
    p->sampling.top_p = msg->top_p;
    p->sampling.seed = msg->seed;
    if (msg->num_resume_tokens >= (size_t)msg->max_tokens)
        return strata_set_error(STRATA_EINVAL, "request resumes after %zu of its %d tokens",
                                msg->num_resume_tokens, (int)msg->max_tokens);
    for (size_t i = 0; i < msg->num_resume_tokens; i++) {
        int32_t t = msg->resume_tokens[i];
        for (int k = 0; k < p->num_stop_ids; k++)
            if (t < 0 || t == p->stop_ids[k])
                return strata_set_error(STRATA_EINVAL,
                                        "request resume token %d at step %zu is negative or a "
                                        "stop id (the request would have ended)",
                                        (int)t, i);
        if (t < 0)
            return strata_set_error(STRATA_EINVAL, "request resume token %d is invalid", (int)t);
    }
    p->resume_len = (int)msg->num_resume_tokens;
    return 0;
}

int request_build(struct wire_arena *arena, const struct stage_request *req) {
    struct wire_request msg;
    if (req->nonce == 0)
        return strata_set_error(STRATA_EINVAL,
                                "request nonce 0 is reserved (it marks connection errors)");
    if (req->prompt_len < 1 || !req->prompt)
        return strata_set_error(STRATA_EINVAL, "a request needs at least one prompt token");
    if (req->num_stop_ids < 0 || req->num_stop_ids > REQUEST_MAX_STOP_IDS)
        return strata_set_error(STRATA_EINVAL, "a request has at most %d stop ids",
                                REQUEST_MAX_STOP_IDS);
    memset(&msg, 0, sizeof msg);
    msg.nonce = req->nonce;
    msg.prompt = req->prompt;
    msg.prompt_len = (size_t)req->prompt_len;
    msg.max_tokens = req->max_tokens;
    msg.temperature = req->sampling.temperature;
    msg.top_k = req->sampling.top_k;
    msg.top_p = req->sampling.top_p;
    msg.seed = req->sampling.seed;
    msg.stop_ids = req->stop_ids;
    msg.num_stop_ids = (size_t)req->num_stop_ids;
    if (req->num_image_files > 0) {
        msg.image_files = req->image_files;
        msg.image_file_sizes = req->image_file_sizes;
        msg.image_formats = req->image_formats;
        msg.num_image_files = (size_t)req->num_image_files;
        for (int i = 0; req->image_file_sizes && i < req->num_image_files; i++)
            msg.image_files_len += req->image_file_sizes[i];
    }
    if (req->num_resume_tokens < 0 || (req->num_resume_tokens && !req->resume_tokens))
        return strata_set_error(STRATA_EINVAL, "request resume tokens: %d but no array",
                                req->num_resume_tokens);
    msg.resume_tokens = req->resume_tokens;
    msg.num_resume_tokens = (size_t)req->num_resume_tokens;
    msg.speculate = (uint8_t)req->speculate;
    msg.speculate_k = req->speculate_k;
    if (req->vision) {
        const struct request_vision *v = req->vision;
        int K = v->num_deepstack;
        _Static_assert(sizeof(struct vl_grid) == 3 * sizeof(int32_t), "grid triples");
        if (v->num_images < 1 || !v->grids || v->n_image_tokens < 0 || v->hidden_size < 1 ||
            (v->n_image_tokens && !v->embeds) || K < 0 || (K && !v->deepstack))
            return strata_set_error(STRATA_EINVAL,
                                    "request vision inputs need >= 1 grid, embeddings and "
                                    "DeepStack features (%d images, %d rows, K %d)",
                                    v->num_images, v->n_image_tokens, K);
        msg.image_grids = &v->grids[0].t;
        msg.num_images = (size_t)v->num_images;
        msg.vision_embeds = (struct wire_tensor){
            .defined = 1,
            .dtype = WIRE_DTYPE_F32,
            .ndim = 2,
            .shape = {v->n_image_tokens, v->hidden_size},
            .data = v->embeds,
            .nbytes = sizeof(float) * (size_t)v->n_image_tokens * (size_t)v->hidden_size};
        if (K)
            msg.deepstack =
                (struct wire_tensor){.defined = 1,
                                     .dtype = WIRE_DTYPE_F32,
                                     .ndim = 3,
                                     .shape = {K, v->n_image_tokens, v->hidden_size},
                                     .data = v->deepstack,
                                     .nbytes = sizeof(float) * (size_t)K *
                                               (size_t)v->n_image_tokens * (size_t)v->hidden_size};
    }
    return wire_build_request(arena, &msg);
}

int request_build_cancel(struct wire_arena *arena, uint64_t nonce) {
    struct wire_control msg;
    if (nonce == 0) return strata_set_error(STRATA_EINVAL, "cannot cancel the reserved nonce 0");
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
        if (msg.nonce == 0)
            return strata_set_error(STRATA_EFORMAT, "token result with the reserved nonce 0");
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
        ev->cached_tokens = msg.cached_tokens;
        ev->accepted_tokens = msg.accepted_tokens;
        ev->rejected_tokens = msg.rejected_tokens;
        ev->prompt_tokens = msg.prompt_tokens;
        return 0;
    }
    if (kind == WIRE_KIND_ERROR) {
        struct wire_error msg;
        rc = wire_read_error(&msg, frame, len);
        if (rc < 0) return rc;
        ev->kind = msg.nonce == 0 ? REQUEST_EVENT_CONNECTION_ERROR : REQUEST_EVENT_ERROR;
        ev->nonce = msg.nonce;
        ev->code = msg.code;
        snprintf(ev->message, sizeof ev->message, "%s", msg.message ? msg.message : "");
        return 0;
    }
    if (kind == WIRE_KIND_CONTROL) {
        struct wire_control msg;
        rc = wire_read_control(&msg, frame, len);
        if (rc < 0) return rc;
        if (msg.kind != WIRE_CONTROL_DESCRIBE || msg.nonce == 0)
            return strata_set_error(STRATA_EFORMAT,
                                    "a client received an unexpected Control frame (kind %d, "
                                    "nonce %llu)",
                                    (int)msg.kind, (unsigned long long)msg.nonce);
        ev->kind = REQUEST_EVENT_DESCRIBE;
        ev->nonce = msg.nonce;
        ev->frame = frame;
        ev->frame_len = len;
        return 0;
    }
    return strata_set_error(STRATA_EFORMAT, "a client received an unexpected %s frame",
                            wire_kind_name(kind));
}
