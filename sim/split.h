/* Layer splits of a pipeline: which contiguous layer range each stage owns.
 *
 * A split of L layers into S stages is the list of S+1 boundaries 0 = b0 < b1 < ... < bS = L;
 * stage s owns [b_s, b_{s+1}). Written as "0-2|2-4" (the simulator's table) and parsed from
 * that form or from the inner cut points alone ("2" for the same split, "" or "-" for S = 1).
 * Random explicit splits come from a seeded PRNG so a test run can be repeated. */
#ifndef STRATA_SIM_SPLIT_H
#define STRATA_SIM_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#define SIM_MAX_STAGES 64

struct sim_split {
    int num_layers;                 /* L */
    int num_stages;                 /* S, 1 <= S <= min(L, SIM_MAX_STAGES) */
    int bounds[SIM_MAX_STAGES + 1]; /* [S + 1]: 0 = bounds[0] < ... < bounds[S] = L */
};

/* Checks that the boundaries are strictly increasing from 0 to L. */
int sim_split_check(const struct sim_split *split);

/* Even split from the shard planner (runtime/model/stage_plan.h): the first L % S stages get one
 * layer more. */
int sim_split_even(struct sim_split *split, int num_layers, int num_stages);

/* A uniformly random split of L layers into S non-empty stages: S-1 distinct cut points
 * drawn from 1 .. L-1 with the splitmix64 stream in *rng_state. */
int sim_split_random(struct sim_split *split, int num_layers, int num_stages, uint64_t *rng_state);

/* Parses "0-2|2-4" or the cut points "2" / "2,3" (comma or '|' separated). */
int sim_split_parse(struct sim_split *split, const char *text, int num_layers);

/* Writes "0-2|2-4" into buf[cap] (truncated if too small). */
void sim_split_format(const struct sim_split *split, char *buf, size_t cap);

/* 1 if both splits have the same boundaries. */
int sim_split_equal(const struct sim_split *a, const struct sim_split *b);

#endif
