/* Tensor and KV parallelism inside a stage (Megatron-LM, Medha): the ranks of one
 * pipeline stage, each its own process, joined by one collective group (wire/collective.h)
 * of tp x kvp ranks in grid order (group rank = kvp_rank * tp + tp_rank). A TP rank holds
 * its slice of the stage's layers (runtime/model/tp_shard.h); a KVP rank holds its token
 * range of every request's KV cache (attention partials merged by the top of attention's
 * block tree). The CPU backend runs the TP all-reduces / all-gathers and the KVP all-gathers
 * on sub-groups of the group (backend_cpu.c). Numerics: every split sum is a fixed tree whose
 * subtrees are the ranks' parts (reference/ops.h), so any grid gives one rank's logits to the
 * bit (tests/runtime/stage:stage_tp_test compares them, VL included).
 *
 * Leader and followers. Group rank 0 (the leader) is the stage as the pipeline knows it:
 * it listens for the previous stage, connects to the next, runs the stage core and its
 * scheduler. Its backend is wrapped: every backend call (embed, forward, logits, KV slot
 * acquire / release) is first broadcast to the group as a command (a header, then the
 * call's inputs: token ids, forward items, hidden rows), and then run on the leader's own
 * part. The other ranks (followers) talk only to the group: they wait for the next
 * command, run the same call on their part, and so take part in the same collectives (the
 * o_proj / down all-reduces, the embedding all-reduce, the all-gathered logits, the KVP
 * attention partials) in the same order. Nothing a follower does depends on timing, so
 * every rank sees the same sequence of calls, and the fixed-order reductions make every
 * rank's hidden rows (and logits) bit-identical, and equal to one rank's.
 *
 *      stage s-1 leader                 stage s                      stage s+1 leader
 *            |            +----------------------------------+             ^
 *            | Activation |  rank 0 (leader): stage core     | Activation  |
 *            +----------->|   backend call --bcast cmd--+    |-------------+
 *                         |        |                    v    |
 *                         |   own part   <--all-reduce-->  ranks 1..W-1 (followers)
 *                         |        |     <--all-gather-->  same call, own part
 *                         +----------------------------------+
 *
 * Failure: a follower that dies or is stopped breaks the group; the leader's next call
 * fails (STRATA_ECLOSED / STRATA_EIO / STRATA_ETIMEOUT naming the rank) and the stage core
 * fails the request to the client with that message. A leader that exits normally sends
 * STOP (followers exit 0); one that dies closes the group and the followers exit 1.
 * KV handoff (--send-kv, --kv-restore) is refused (each rank holds only its part). KVP
 * allocation is all-or-nothing: positions are global and a request that would pass
 * kvp x kvp_tokens positions is refused by the same check on every rank before any KV is
 * written. */
#ifndef STRATA_RUNTIME_STAGE_STAGE_TP_H
#define STRATA_RUNTIME_STAGE_STAGE_TP_H

#include <stdint.h>

#include "runtime/model/tp_shard.h"
#include "runtime/stage/backend.h"
#include "wire/collective.h"

/* Opens this rank's backend: its part of bo->role (bo->tp names the degrees, ranks, MoE
 * mode, KV tokens per KVP rank and the group). For rank 0 the returned backend is the leader
 * wrapper described above (it owns the shard's backend; freeing it sends STOP); for the others it
 * is the bare shard backend, to be driven by stage_tp_follow. bo->tp must be set with tp >= 2. */
int stage_tp_open(struct stage_backend **out, const struct stage_backend_options *bo);

/* A follower's loop: runs the leader's commands on `be` (a follower's backend from
 * stage_tp_open) until STOP (returns 0) or the group fails (the negative status, with the
 * message naming the rank). `calls` (optional) counts the commands run. Waiting for the
 * next command has no time limit (an idle stage is normal); the data that follows a
 * command is bounded by the group's timeout. */
int stage_tp_follow(struct stage_backend *be, struct coll *coll, uint64_t *calls);

/* How the ranks of a stage's group find each other: `peers` lists every rank's address in
 * group-rank order, "HOST:PORT" or "HOST:@FILE" (the rank listens on a free port of HOST and writes
 * it to FILE; the others read it from there, waiting for it, like --port-file /
 * --next-port-file between stages). Opens the group (TCP ring; shared memory when every rank
 * is on this host and `tcp_only` is 0). `group` names it at Hello, so ranks of another
 * stage, layer range or TP degree are refused; `fingerprint` refuses another model. */
struct stage_tp_net {
    const char *peers;
    int size, rank; /* the stage's group: tp x kvp ranks, rank = kvp_rank * tp + tp_rank */
    const char *group;
    int tcp_only;
    int timeout_ms; /* opening and every data transfer (0 = COLL_DEFAULT_TIMEOUT_MS) */
    struct wire_tls *tls;
    const struct wire_auth_key *key;
    const uint8_t *fingerprint;
};
int stage_tp_connect(struct coll **out, const struct stage_tp_net *net);

#endif
