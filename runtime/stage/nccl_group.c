/* NCCL sub-groups of a stage's group (nccl_group.h). The id exchange sends, per rank, one
 * status word and the id's bytes as float bit patterns (the collective copies bytes and never
 * computes on an all-gather, as stage_tp.c's commands rely on too). */
#include "runtime/stage/nccl_group.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/nccl.h"
#include "runtime/base/status.h"

#define ID_WORDS (CUDA_NCCL_ID_BYTES / 4)
#define XCHG_WORDS (1 + ID_WORDS) /* status (1: id drawn), then the id */

struct nccl_group {
    struct cuda_nccl_comm *comm; /* NULL when count == 1 or after an abort */
    int rank, count, failed;
    void *stream;
    int timeout_ms;
    char label[64];
};

static int check_options(const struct nccl_group_options *o, int *member) {
    if (!o || !o->coll) return strata_set_error(STRATA_EINVAL, "nccl_group_open: no wire group");
    const int me = coll_rank(o->coll), size = coll_size(o->coll);
    if (o->count < 1 || o->stride < 1 || o->first < 0 ||
        o->first + (o->count - 1) * o->stride >= size)
        return strata_set_error(STRATA_EINVAL,
                                "nccl_group_open: members %d + k*%d, k < %d, do not fit a group "
                                "of %d",
                                o->first, o->stride, o->count, size);
    if (me < o->first || (me - o->first) % o->stride || (me - o->first) / o->stride >= o->count)
        return strata_set_error(STRATA_EINVAL,
                                "nccl_group_open: rank %d is not a member of %d + k*%d, k < %d", me,
                                o->first, o->stride, o->count);
    *member = (me - o->first) / o->stride;
    return STRATA_OK;
}

/* Every rank of the wire group: the sub-group leaders draw ids, one all-gather carries them,
 * each rank copies its leader's. */
static int exchange_id(struct coll *coll, int leader, int is_leader, int need, uint8_t id[],
                       const char *label) {
    const int size = coll_size(coll);
    float *all = calloc((size_t)size * XCHG_WORDS, sizeof *all);
    float mine[XCHG_WORDS];
    int32_t status = 0;
    memset(mine, 0, sizeof mine);
    if (!all) return strata_set_error(STRATA_ENOMEM, "NCCL group '%s': out of memory", label);
    char why[512] = "";
    if (is_leader) {
        if (cuda_nccl_unique_id(id) == STRATA_OK) {
            status = 1;
            memcpy(mine + 1, id, CUDA_NCCL_ID_BYTES);
        } else {
            snprintf(why, sizeof why, "%s", strata_last_error());
        }
    }
    memcpy(mine, &status, sizeof status);
    /* Every rank takes part even when its own draw failed, so the wire group stays in step. */
    int rc = coll_allgather(coll, all, mine, XCHG_WORDS);
    if (rc) {
        char wire[600];
        snprintf(wire, sizeof wire, "%s", strata_last_error());
        free(all);
        return strata_set_error(rc, "NCCL group '%s': id exchange: %s", label, wire);
    }
    memcpy(&status, all + (size_t)leader * XCHG_WORDS, sizeof status);
    if (status == 1) memcpy(id, all + (size_t)leader * XCHG_WORDS + 1, CUDA_NCCL_ID_BYTES);
    free(all);
    if (need && status != 1)
        return strata_set_error(STRATA_EDEVICE,
                                "NCCL group '%s': its rank 0 (group rank %d) "
                                "could not draw an NCCL id%s%s",
                                label, leader, *why ? ": " : "", why);
    return STRATA_OK;
}

int nccl_group_open(struct nccl_group **out, const struct nccl_group_options *o) {
    *out = NULL;
    int member = 0;
    int rc = check_options(o, &member);
    if (rc) return rc;
    struct nccl_group *g = calloc(1, sizeof *g);
    if (!g) return strata_set_error(STRATA_ENOMEM, "nccl_group_open: out of memory");
    g->rank = member;
    g->count = o->count;
    g->stream = o->stream;
    g->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : coll_timeout(o->coll);
    snprintf(g->label, sizeof g->label, "%s", o->label ? o->label : "tp");
    uint8_t id[CUDA_NCCL_ID_BYTES];
    memset(id, 0, sizeof id);
    /* Every rank of the wire group exchanges, even a sub-group of one (others may need it). */
    rc = exchange_id(o->coll, o->first, member == 0 && o->count > 1, o->count > 1, id, g->label);
    if (!rc && o->count > 1)
        rc = cuda_nccl_comm_init(&g->comm, id, o->count, member, g->timeout_ms, g->label);
    if (rc) {
        free(g);
        return rc;
    }
    *out = g;
    return STRATA_OK;
}

void nccl_group_close(struct nccl_group *g) {
    if (!g) return;
    cuda_nccl_comm_destroy(g->comm);
    free(g);
}

void nccl_group_abort(struct nccl_group *g) {
    if (!g) return;
    cuda_nccl_comm_abort(g->comm);
    g->comm = NULL;
    g->failed = 1;
}

int nccl_group_rank(const struct nccl_group *g) {
    return g ? g->rank : -1;
}

int nccl_group_size(const struct nccl_group *g) {
    return g ? g->count : 0;
}

static int usable(const struct nccl_group *g, const char *fn) {
    if (!g) return strata_set_error(STRATA_EINVAL, "%s: no group", fn);
    if (g->failed)
        return strata_set_error(STRATA_ECLOSED, "NCCL group '%s' rank %d of %d: failed earlier",
                                g->label, g->rank, g->count);
    return STRATA_OK;
}

/* A failed NCCL call (other than a refused argument) has aborted its communicator
 * (kernels/nccl.h): so is the group. */
static int mark(struct nccl_group *g, int rc) {
    if (rc && rc != STRATA_EINVAL) {
        cuda_nccl_comm_abort(g->comm);
        g->comm = NULL;
        g->failed = 1;
    }
    return rc;
}

int nccl_group_allgather(struct nccl_group *g, float *out, const float *in, size_t n) {
    int rc = usable(g, __func__);
    if (rc || n == 0) return rc;
    if (g->count == 1) {
        if (out == in) return STRATA_OK;
        return strata_set_error(STRATA_EINVAL, "nccl_group_allgather: a group of one gathers in "
                                               "place only");
    }
    return mark(g, cuda_nccl_allgather(g->comm, out, in, n, g->stream));
}

int nccl_group_reduce(struct nccl_group *g, float *data, float *parts, size_t n) {
    int rc = usable(g, __func__);
    if (rc || n == 0 || g->count == 1) return rc;
    if (g->count == 2) return mark(g, cuda_nccl_allreduce_sum2(g->comm, data, n, g->stream));
    if (!parts)
        return strata_set_error(STRATA_EINVAL, "nccl_group_reduce: %d members need scratch",
                                g->count);
    rc = mark(g, cuda_nccl_allgather(g->comm, parts, data, n, g->stream));
    if (!rc) rc = cuda_ops_tree_sum(data, parts, g->count, n, g->stream);
    return rc;
}

int nccl_group_wait(struct nccl_group *g) {
    int rc = usable(g, __func__);
    if (rc) return rc;
    if (g->count == 1) return STRATA_OK; /* nothing of the group's is queued */
    return mark(g, cuda_nccl_stream_wait(g->comm, g->stream, g->timeout_ms));
}
