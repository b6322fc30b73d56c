/* Internal: the communicator shared by collective.c (TCP ring, dispatch) and
 * collective_shm.c (shared memory). */
#ifndef STRATA_WIRE_COLLECTIVE_INTERNAL_H
#define STRATA_WIRE_COLLECTIVE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "wire/collective.h"
#include "wire/message.h"

/* Operation codes (the high half of a frame's nonce). */
enum coll_op { COLL_OP_PARTIAL = 1, COLL_OP_RESULT = 2, COLL_OP_GATHER = 3, COLL_OP_BCAST = 4 };

/* One built frame waiting for the sender thread. */
struct coll_item {
    struct wire_arena arena;
    struct coll_item *next;
};

struct coll_shm; /* collective_shm.c */

struct coll {
    enum coll_transport transport;
    int rank, size, timeout_ms;
    char group[49];
    uint64_t seq;    /* operations done (each rank calls the same ones in order) */
    int broken;      /* an operation failed: only the error is reported again */
    char error[512]; /* that error */
    int error_code;
    struct coll_stats stats; /* coll_stats_get */

    /* TCP ring */
    struct wire_listener listener;
    struct wire_conn next, prev; /* next: sender thread only; prev: caller's thread only */
    pthread_t sender;
    int sender_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct coll_item *head, *tail; /* queue for the sender (under mu) */
    int queued;                    /* items queued or being sent (under mu) */
    int stopping;                  /* close asked the sender to exit (under mu) */
    int send_error;                /* the sender's failure status (under mu) */
    char send_msg[512];            /* and its message (under mu) */

    /* shared memory */
    struct coll_shm *shm;
};

/* Records a failure of operation `what`: marks the communicator broken, keeps the message,
 * returns the code. */
int coll_fail(struct coll *c, int code, const char *what);

int coll_shm_open(struct coll *c, const struct coll_options *o);
void coll_shm_close(struct coll *c);
int coll_shm_allreduce(struct coll *c, float *data, size_t n);
int coll_shm_allgather(struct coll *c, float *out, const float *in, size_t n);
int coll_shm_broadcast(struct coll *c, float *data, size_t n, int root);

/* Monotonic milliseconds, and nanoseconds (the operations' counters). */
int64_t coll_now_ms(void);
uint64_t coll_now_ns(void);

#endif
