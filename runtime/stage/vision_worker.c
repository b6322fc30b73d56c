/* The vision stage's encoder thread; see vision_worker.h. */
#include "runtime/stage/vision_worker.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "wire/message.h"

struct vision_worker {
    struct vision_frontend *fe;
    void (*wake)(void *ctx);
    void *ctx;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work;
    int stop;
    struct vision_task *todo, *done; /* under lock */
    uint64_t next_seq;               /* the submitting thread's */
};

/* The Request stage 0 gets for an encoded image request: the client's, image files
 * replaced by the grids (the tensors travel as VisionBlocks), and with videos the prompt
 * that holds their timestamps and blocks. */
static int build_language_request(struct wire_arena *arena, struct vision_task *t,
                                  const struct wire_request *req) {
    struct wire_request fwd = *req;
    fwd.image_files = NULL;
    fwd.image_files_len = 0;
    fwd.image_file_sizes = NULL;
    fwd.image_formats = NULL;
    fwd.num_image_files = 0;
    fwd.image_grids = &t->out.grids[0].t;
    fwd.num_images = (size_t)t->out.num_images;
    if (t->out.prompt) {
        fwd.prompt = t->out.prompt;
        fwd.prompt_len = t->out.prompt_len;
    }
    int rc = wire_build_request(arena, &fwd);
    if (rc < 0) return rc;
    t->request_len = wire_arena_frame_len(arena);
    t->request = malloc(t->request_len);
    if (!t->request) return strata_set_error(STRATA_ENOMEM, "out of memory");
    memcpy(t->request, wire_arena_frame(arena), t->request_len);
    return 0;
}

void vision_task_free(struct vision_task *t) {
    if (!t) return;
    vision_output_free(&t->out);
    free(t->request);
    free(t->frame);
    free(t);
}

static void free_list(struct vision_task *t) {
    while (t) {
        struct vision_task *next = t->next;
        vision_task_free(t);
        t = next;
    }
}

/* decode -> preprocess -> encode -> the Request for stage 0, task after task. */
static void *worker_main(void *arg) {
    struct vision_worker *w = arg;
    struct wire_arena arena;
    if (wire_arena_init(&arena, 0) < 0) return NULL;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        struct vision_task *t = w->todo;
        if (!t) {
            pthread_cond_wait(&w->work, &w->lock);
            continue;
        }
        w->todo = t->next;
        pthread_mutex_unlock(&w->lock);
        struct wire_request req;
        t->rc = wire_read_request(&req, t->frame, t->len);
        if (t->rc == 0) t->rc = vision_frontend_encode(w->fe, &t->out, &req);
        if (t->rc == 0) t->rc = build_language_request(&arena, t, &req);
        if (t->rc < 0) snprintf(t->message, sizeof t->message, "%s", strata_last_error());
        pthread_mutex_lock(&w->lock);
        t->next = w->done;
        w->done = t;
        w->wake(w->ctx);
    }
    pthread_mutex_unlock(&w->lock);
    wire_arena_free(&arena);
    return NULL;
}

int vision_worker_start(struct vision_worker **out, struct vision_frontend *fe,
                        void (*wake)(void *ctx), void *ctx) {
    struct vision_worker *w = calloc(1, sizeof *w);
    *out = NULL;
    if (!w) return strata_set_error(STRATA_ENOMEM, "out of memory");
    *w = (struct vision_worker){.fe = fe, .wake = wake, .ctx = ctx};
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->work, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->work);
        free(w);
        return strata_set_error(STRATA_EIO, "cannot start the encoder thread");
    }
    *out = w;
    return 0;
}

void vision_worker_stop(struct vision_worker *w) {
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_broadcast(&w->work);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL); /* after the encode under way */
    free_list(w->todo);
    free_list(w->done);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->work);
    free(w);
}

int vision_worker_submit(struct vision_worker *w, uint32_t session_id, uint64_t nonce,
                         const uint8_t *frame, size_t len, uint64_t *seq) {
    struct vision_task *t = calloc(1, sizeof *t);
    if (!t || !(t->frame = malloc(len ? len : 1))) {
        free(t);
        return strata_set_error(STRATA_ENOMEM, "out of memory for a %zu-byte request", len);
    }
    memcpy(t->frame, frame, len);
    t->len = len;
    t->session_id = session_id;
    t->nonce = nonce;
    t->seq = *seq = ++w->next_seq;
    pthread_mutex_lock(&w->lock);
    struct vision_task **tail = &w->todo;
    while (*tail)
        tail = &(*tail)->next;
    *tail = t;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->lock);
    return 0;
}

struct vision_task *vision_worker_take_done(struct vision_worker *w) {
    pthread_mutex_lock(&w->lock);
    struct vision_task *t = w->done;
    w->done = NULL;
    pthread_mutex_unlock(&w->lock);
    return t;
}
