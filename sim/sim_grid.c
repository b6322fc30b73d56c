/* One simulated stage's TP x KVP group: follower threads and the leader's group (see
 * sim_grid.h). Ranks find each other through port files in a private temporary directory
 * ("127.0.0.1:@FILE" peers), as strata-stage's processes do. */
#include "sim/sim_grid.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/status.h"
#include "runtime/stage/stage_tp.h"
#include "wire/collective.h"

#define SIM_GRID_TIMEOUT_MS 60000

struct sim_rank {
    struct sim_grid *grid;
    int rank; /* group rank = kvp_rank * tp + tp_rank */
    struct coll *coll;
    struct stage_tp_config tp;
    struct stage_backend *be;
    pthread_t thread;
    int started, rc;
    char error[512];
};

struct sim_grid {
    struct sim_grid_options opt;
    struct stage_role role;
    char dir[64];
    int have_dir;
    char peers[4096];
    char group[64];
    int size;
    struct sim_rank *ranks; /* [size]; ranks[0] is the leader's group */
};

static int connect_rank(struct sim_rank *r) {
    const struct sim_grid *g = r->grid;
    struct stage_tp_net net = {.peers = g->peers,
                               .size = g->size,
                               .rank = r->rank,
                               .group = g->group,
                               /* TCP: a leader that closes its group without STOP (it
                                * failed to open) ends the followers' wait at once */
                               .tcp_only = 1,
                               .timeout_ms = SIM_GRID_TIMEOUT_MS};
    int rc = stage_tp_connect(&r->coll, &net);
    if (rc) return rc;
    const int T = g->opt.tp;
    r->tp = (struct stage_tp_config){.tp = T,
                                     .tp_rank = r->rank % T,
                                     .moe = g->opt.moe,
                                     .kvp = g->opt.kvp,
                                     .kvp_rank = r->rank / T,
                                     .kvp_tokens = g->opt.kvp_tokens,
                                     .coll = r->coll};
    return STRATA_OK;
}

static void *follower_main(void *arg) {
    struct sim_rank *r = arg;
    const struct sim_grid_options *o = &r->grid->opt;
    r->rc = connect_rank(r);
    if (!r->rc)
        r->rc = stage_tp_open(&r->be, &(struct stage_backend_options){.cfg = o->cfg,
                                                                      .weights = o->weights,
                                                                      .role = r->grid->role,
                                                                      .num_threads = o->num_threads,
                                                                      .max_seq = o->max_seq,
                                                                      .num_slots = o->num_slots,
                                                                      .kv_dtype = o->kv_dtype,
                                                                      .tp = &r->tp});
    if (!r->rc) r->rc = stage_tp_follow(r->be, r->coll, NULL);
    if (r->rc)
        snprintf(r->error, sizeof r->error, "stage %d group rank %d: %s", o->stage_index, r->rank,
                 strata_last_error());
    stage_backend_free(r->be);
    r->be = NULL;
    coll_close(r->coll); /* a failed follower breaks the group: the leader's calls fail */
    r->coll = NULL;
    return NULL;
}

int sim_grid_start(struct sim_grid **out, const struct stage_tp_config **leader,
                   const struct sim_grid_options *opt, const struct stage_open_options *open) {
    *out = NULL;
    *leader = NULL;
    struct sim_grid *g = calloc(1, sizeof *g);
    if (!g) return strata_set_error(STRATA_ENOMEM, "simulator: out of memory for a TP group");
    g->opt = *opt;
    g->role = (struct stage_role){.layer_start = open->layer_start,
                                  .layer_end = open->layer_end,
                                  .with_embed = open->stage_index == 0,
                                  .with_head = open->stage_index == open->num_stages - 1};
    g->size = opt->tp * opt->kvp;
    snprintf(g->dir, sizeof g->dir, "/tmp/strata-sim-grid.XXXXXX");
    snprintf(g->group, sizeof g->group, "sim.s%d.tp%d.kvp%d", opt->stage_index, opt->tp, opt->kvp);
    g->ranks = calloc((size_t)g->size, sizeof *g->ranks);
    int rc = g->ranks && g->size <= COLL_MAX_RANKS
                 ? STRATA_OK
                 : strata_set_error(STRATA_EINVAL, "simulator: a group of %d ranks", g->size);
    if (!rc && !(g->have_dir = mkdtemp(g->dir) != NULL))
        rc = strata_set_error(STRATA_EIO, "simulator: cannot make a directory for port files");
    for (int q = 0, used = 0; !rc && q < g->size; ++q)
        used += snprintf(g->peers + used, sizeof g->peers - (size_t)used, "%s127.0.0.1:@%s/%d",
                         q ? "," : "", g->dir, q);
    for (int q = 1; !rc && q < g->size; ++q) {
        g->ranks[q] = (struct sim_rank){.grid = g, .rank = q};
        if (pthread_create(&g->ranks[q].thread, NULL, follower_main, &g->ranks[q]))
            rc = strata_set_error(STRATA_ENOMEM, "simulator: cannot start a follower thread");
        else
            g->ranks[q].started = 1;
    }
    if (!rc) {
        g->ranks[0] = (struct sim_rank){.grid = g, .rank = 0};
        rc = connect_rank(&g->ranks[0]);
    }
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", strata_last_error());
        sim_grid_stop(g);
        return strata_set_error(rc, "%s", why);
    }
    *out = g;
    *leader = &g->ranks[0].tp;
    return STRATA_OK;
}

int sim_grid_stop(struct sim_grid *g) {
    if (!g) return STRATA_OK;
    int rc = STRATA_OK;
    char why[512] = "";
    /* Without a leader's STOP (it never opened), closing the group ends the followers. */
    coll_close(g->ranks ? g->ranks[0].coll : NULL);
    for (int q = 1; g->ranks && q < g->size; ++q) {
        if (!g->ranks[q].started) continue;
        pthread_join(g->ranks[q].thread, NULL);
        if (g->ranks[q].rc && !rc) {
            rc = g->ranks[q].rc;
            snprintf(why, sizeof why, "%s", g->ranks[q].error);
        }
    }
    for (int q = 0; g->have_dir && q < g->size; ++q) {
        char path[128];
        snprintf(path, sizeof path, "%s/%d", g->dir, q);
        unlink(path);
    }
    if (g->have_dir) rmdir(g->dir);
    free(g->ranks);
    free(g);
    return rc ? strata_set_error(rc, "%s", why) : STRATA_OK;
}
