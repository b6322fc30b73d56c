/* Tensor and KV parallelism in the simulator: the follower ranks of one
 * simulated stage, each on its own thread, running the same leader / follower code as
 * strata-stage's processes (runtime/stage/stage_tp.h) over a real collective group (shared
 * memory, or the TCP ring, inside this process). The stage's own thread is the leader: its
 * core runs on a backend that broadcasts every call to these followers. */
#ifndef STRATA_SIM_SIM_GRID_H
#define STRATA_SIM_SIM_GRID_H

#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/model/tp_shard.h"
#include "runtime/stage/backend.h"
#include "runtime/stage/stage_open.h"

/* Why --tp / --kvp are refused with a CUDA device: the ranks here are threads of one
 * process given one --device (the followers would not even take it: they open the CPU
 * backend, so a CUDA leader's collectives would meet CPU peers), while the CUDA backend's TP
 * / KVP ranks take one GPU each (NCCL refuses two ranks of a communicator on one device). A
 * simulated stage would need a device per rank (rank r on cuda:N+r), which nothing has run
 * yet (the backend's grid is verified in emulation only: tests/backend_ops). strata-stage
 * processes, one per rank with its own --device, are the way. */
#define SIM_GRID_CUDA_REFUSED                                                                      \
    "--tp / --kvp with a CUDA device: the simulator runs a stage's ranks as threads "              \
    "of one process on one --device, and CUDA TP / KVP ranks need one GPU each (NCCL takes one "   \
    "rank per device); run one strata-stage process per rank with its own --device cuda:N, or "    \
    "simulate the grid with --device cpu"

struct sim_grid; /* one stage's group */

struct sim_grid_options {
    const struct model_config *cfg;
    const struct safetensors *weights;
    int stage_index;
    int tp, kvp, kvp_tokens; /* degrees (>= 1) and KV positions per KVP rank */
    enum tp_moe_mode moe;
    int max_seq, num_slots, num_threads;
    enum ops_dtype kv_dtype; /* the leader's too: a group's ranks agree */
};

/* Starts the tp x kvp - 1 followers of the stage `open` opens (its layer range and roles)
 * and joins the group as its leader (group rank 0): *leader is what the leader's
 * stage_open_options.tp points at (valid until sim_grid_stop). */
int sim_grid_start(struct sim_grid **out, const struct stage_tp_config **leader,
                   const struct sim_grid_options *opt, const struct stage_open_options *open);

/* After the leader's backend is freed (which sends STOP): joins the followers and closes
 * the group. Returns the first follower failure (0 when all stopped cleanly), with the
 * message set. Accepts NULL. */
int sim_grid_stop(struct sim_grid *g);

#endif
