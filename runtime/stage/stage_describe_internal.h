/* The ring describe's state inside the stage core (stage_describe.c): this stage's entry
 * beyond the core's info, the describes stage 0 has in flight, and what the driver's last
 * tick said. Private to the stage core: use stage_core.h. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_DESCRIBE_INTERNAL_H
#define STRATA_RUNTIME_STAGE_STAGE_DESCRIBE_INTERNAL_H

#include <stdint.h>

#include "runtime/stage/stage_core.h"

#define STAGE_MAX_DESCRIBES 16 /* stage 0: ring describes in flight at once */

struct wire_control;

/* Stage 0: a client's Control Describe on its way round the ring. */
struct stage_describe_pending {
    int active;
    uint64_t ring_seq; /* the Describe's seq on the ring: stage 0's own number for it */
    uint64_t nonce;    /* the client's */
    uint32_t client_id;
    int64_t born_ms; /* the core's clock when it arrived */
};

struct stage_describe {
    int tp, kvp, threads;
    char dtype[16];
    char device[256]; /* the backend's device in words, filled on first use */
    char next[64];    /* the link onwards, "host:port" ("" = down) */
    struct stage_describe_pending pending[STAGE_MAX_DESCRIBES];
    uint64_t seq;
    int prev_down, next_down; /* stage 0's ring links as of the last tick (0 = up or unknown) */
};

/* A Control Describe (or its answer) from `from`. */
int stage_describe_on_control(struct stage_core *core, enum stage_link from, uint32_t client_id,
                              const struct wire_control *msg);
/* A link went down: the describes waiting on it are answered with the reason. */
void stage_describe_on_link_down(struct stage_core *core, enum stage_link link, uint32_t client_id,
                                 const char *reason);

#endif
