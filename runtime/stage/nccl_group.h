/* The CUDA backend's TP / KVP collectives on device buffers ("on the CUDA backend,
 * NCCL inside a host"): one NCCL communicator per sub-group of the stage's group
 * (wire/collective.h; stage_tp.h's grid order, group rank = kvp_rank * tp + tp_rank), set up
 * through that group, with the CPU backend's reduction order.
 *
 * Set-up: every rank of the stage's group calls nccl_group_open with its own sub-group
 * (members first + k·stride, k < count: its TP group or its KVP group). The ncclUniqueId of
 * each sub-group is drawn by the sub-group's rank 0 and reaches the members through one
 * all-gather over the wire group (ids of all sub-groups at once; a rank takes its sub-group
 * leader's), the bootstrap NCCL itself expects the application to provide.
 *
 * Order (bit-identical to the CPU backend and to one rank): nccl_group_reduce is
 * reference/model.c's tp_reduce: two members p0 + p1 (ncclAllReduce of two ranks: one fp32
 * addition per element, the same bits whatever NCCL's algorithm); more members an all-gather
 * and cuda_ops_tree_sum, the top of matmul_split's tree ((p0 + p1) + (p2 + p3)), never
 * NCCL's own multi-rank sum, whose order depends on its algorithm. nccl_group_allgather is
 * the KVP all-gathers (maxima, then partials) and the vocabulary-parallel head's.
 *
 * Asynchrony and failure: operations are queued on the backend's stream (no host
 * synchronisation), so a decode step's collectives can be captured into its CUDA graph;
 * nccl_group_wait replaces the stream synchronisation of a call that queued any, is bounded
 * by the group's timeout, and is never called inside a capture (it fails there). A rank that dies
 * leaves its peers' NCCL kernels waiting: the wait times out, aborts the communicator
 * (ncclCommAbort ends those kernels) and fails naming the group and rank; when the wire group fails
 * first, nccl_group_abort does the same. After a failure every call fails at once. */
#ifndef STRATA_RUNTIME_STAGE_NCCL_GROUP_H
#define STRATA_RUNTIME_STAGE_NCCL_GROUP_H

#include <stddef.h>

#include "wire/collective.h"

struct nccl_group_options {
    struct coll *coll;        /* the stage's group: every rank of it calls nccl_group_open */
    int first, stride, count; /* this rank's sub-group (count 1: no communication) */
    const char *label;        /* e.g. "s0.k1.tp", in messages; <= 48 chars */
    void *stream;             /* the backend's stream (a cudaStream_t) */
    int timeout_ms;           /* set-up and every wait; 0 = the wire group's timeout */
};

struct nccl_group;

int nccl_group_open(struct nccl_group **out, const struct nccl_group_options *options);
void nccl_group_close(struct nccl_group *g); /* accepts NULL */
/* Ends pending operations (peers' failure seen elsewhere); the group then only fails. */
void nccl_group_abort(struct nccl_group *g);

int nccl_group_rank(const struct nccl_group *g); /* this rank's place in its sub-group */
int nccl_group_size(const struct nccl_group *g);

/* Device buffers, queued on the stream. out[count * n] <- every member's in[n]; a group of
 * one only in place (in == out), where nothing is queued. */
int nccl_group_allgather(struct nccl_group *g, float *out, const float *in, size_t n);
/* data[n] <- the members' parts combined in the tree order above; `parts` is device scratch
 * of count·n floats (unused, may be NULL, when count <= 2). */
int nccl_group_reduce(struct nccl_group *g, float *data, float *parts, size_t n);
/* Waits for the stream (everything queued on it) within the group's timeout. A group of one
 * queued nothing and returns at once (its caller synchronises its stream as usual). */
int nccl_group_wait(struct nccl_group *g);

#endif
