/* Private to the simulator's coordinator: the run's state, shared by pipeline_sim.c (the
 * discrete-event loop: client, links, stages, faults) and sim_setup.c (options, building
 * and tearing down the stages, the report's summary). Not for other modules: use
 * pipeline_sim.h. */
#ifndef STRATA_SIM_PIPELINE_SIM_INTERNAL_H
#define STRATA_SIM_PIPELINE_SIM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/stage/stage_core.h"
#include "runtime/stage/stage_open.h"
#include "sim/pipeline_sim.h"
#include "sim/sim_grid.h"
#include "sim/stage_thread.h"
#include "sim/virtual_clock.h"

struct inbox_item {
    int is_link_down;
    enum stage_link link;
    uint8_t *data; /* frame, or the reason text */
    size_t len;
    struct inbox_item *next;
};

struct sim_stage {
    struct stage_thread thread;
    struct stage stage;      /* backend + core (runtime/stage/stage_open.h) */
    struct stage_core *core; /* stage.core */
    struct stage_open_options open;
    struct sim_grid_options grid_opt; /* tp x kvp > 1: the stage's group (sim_grid.h) */
    struct sim_grid *grid;
    int dead;
    int busy;
    int link_down[3];         /* per stage_link (PREV, NEXT, CLIENT): connection gone */
    int link_down_pending[3]; /* an EV_LINK_DOWN is queued */
    struct inbox_item *inbox_head, *inbox_tail;
    int step_result; /* stage_core_step() of the last step */
    int64_t step_wall_ns, step_cpu_ns;
};

struct client_request {
    int done;
    int got_first;
};

struct sim {
    const struct sim_options *opt;
    struct sim_report *report;
    int num_stages;
    struct virtual_clock clock;
    struct sim_stage *stages;      /* [S] */
    struct sim_link *links;        /* [2S + 2] */
    struct client_request *client; /* [R] */
    int client_link_down;
    int client_error; /* a follow-up request could not be sent (out of memory): stops the run */
    int requests_left;
    int32_t **last_tokens; /* [R] tokens the last stage reported, for a cross-check */
    int *last_n_tokens;    /* [R], -1 when none */
    /* SIM_COMPUTE_MODEL: what runs each stage, the profile's device as a TP x KVP group of
     * the run's degrees (perf_device_set_tp, perf_device_set_kvp: a KVP rank's positions, the
     * longest request, and the requests' mean context while they decode) */
    struct perf_device device;
    int kvp_tokens, max_seq;
    double decode_context;
};

/* pipeline_sim.c */
/* Counts a protocol error in the report, keeping the first one's text. */
void sim_record_protocol_error(struct sim *sim, const char *what);
/* Frees the frames and link failures waiting for a stage. */
void sim_stage_clear_inbox(struct sim_stage *st);

/* sim_setup.c */
/* Checks the options before anything is built. */
int sim_check_options(const struct sim_options *opt);
/* Allocates the run's state and the report, makes the links and loads every stage. On
 * failure the caller still runs sim_teardown (it accepts a half-built run). */
int sim_setup(struct sim *sim, struct sim_report *report, const struct sim_options *opt);
void sim_teardown(struct sim *sim);
/* Fills the report's summary numbers and cross-checks the client against the last stage. */
void sim_summarise(struct sim *sim);

#endif
