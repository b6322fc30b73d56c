/* Layer splits for the simulator (see split.h): checking, even and random splits, and the
 * "0-2|2-4" text form used on the command line and in the result table. */
#include "sim/split.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/model/stage_plan.h"

static uint64_t split_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int check_counts(int num_layers, int num_stages) {
    if (num_layers < 1)
        return strata_set_error(STRATA_EINVAL, "split: model has no layers (L = %d)", num_layers);
    if (num_stages < 1 || num_stages > num_layers || num_stages > SIM_MAX_STAGES)
        return strata_set_error(STRATA_ERANGE,
                                "split: %d stages for %d layers (need 1 <= S <= min(L, %d))",
                                num_stages, num_layers, SIM_MAX_STAGES);
    return 0;
}

int sim_split_check(const struct sim_split *split) {
    int rc = check_counts(split->num_layers, split->num_stages);
    if (rc < 0) return rc;
    if (split->bounds[0] != 0 || split->bounds[split->num_stages] != split->num_layers)
        return strata_set_error(STRATA_ERANGE, "split: must start at layer 0 and end at %d",
                                split->num_layers);
    for (int s = 0; s < split->num_stages; s++)
        if (split->bounds[s] >= split->bounds[s + 1])
            return strata_set_error(STRATA_ERANGE,
                                    "split: stage %d has an empty or reversed range %d-%d", s,
                                    split->bounds[s], split->bounds[s + 1]);
    return 0;
}

int sim_split_even(struct sim_split *split, int num_layers, int num_stages) {
    memset(split, 0, sizeof *split);
    int rc = check_counts(num_layers, num_stages);
    if (rc < 0) return rc;
    split->num_layers = num_layers;
    split->num_stages = num_stages;
    /* The shard planner's even split, so the simulator's automatic split is the one a
     * deployment without --mem gets. */
    struct stage_range ranges[SIM_MAX_STAGES];
    rc = stage_plan_even(ranges, num_layers, num_stages);
    if (rc < 0) return rc;
    for (int s = 0; s < num_stages; s++)
        split->bounds[s + 1] = ranges[s].layer_end;
    return sim_split_check(split);
}

int sim_split_random(struct sim_split *split, int num_layers, int num_stages, uint64_t *rng_state) {
    memset(split, 0, sizeof *split);
    int rc = check_counts(num_layers, num_stages);
    if (rc < 0) return rc;
    split->num_layers = num_layers;
    split->num_stages = num_stages;
    /* Selection sampling (Knuth's algorithm S): walk the candidate cuts 1 .. L-1 in order
     * and take each with probability needed / remaining; the result comes out sorted. */
    int needed = num_stages - 1, taken = 0;
    for (int cut = 1; cut < num_layers && taken < needed; cut++) {
        uint64_t remaining = (uint64_t)(num_layers - cut);
        if (split_rng_next(rng_state) % remaining < (uint64_t)(needed - taken))
            split->bounds[++taken] = cut;
    }
    split->bounds[num_stages] = num_layers;
    return sim_split_check(split);
}

/* Reads a non-negative decimal integer at *p and advances *p past it. */
static int read_int(const char **p, int *value) {
    char *end;
    errno = 0;
    long v = strtol(*p, &end, 10);
    if (end == *p || errno || v < 0 || v > 1000000) return -1;
    *value = (int)v;
    *p = end;
    return 0;
}

int sim_split_parse(struct sim_split *split, const char *text, int num_layers) {
    memset(split, 0, sizeof *split);
    split->num_layers = num_layers;
    if (strcmp(text, "") == 0 || strcmp(text, "-") == 0) {
        split->num_stages = 1;
        split->bounds[1] = num_layers;
        return sim_split_check(split);
    }
    int ranges = strchr(text, '-') != NULL;
    const char *p = text;
    int s = 0;
    while (*p) {
        if (s >= SIM_MAX_STAGES)
            return strata_set_error(STRATA_EINVAL, "split '%s': more than %d stages", text,
                                    SIM_MAX_STAGES);
        int a, b;
        if (ranges) {
            if (read_int(&p, &a) < 0 || *p++ != '-' || read_int(&p, &b) < 0)
                return strata_set_error(STRATA_EINVAL, "split '%s': expected ranges like 0-2|2-4",
                                        text);
            if (a != split->bounds[s])
                return strata_set_error(STRATA_EINVAL,
                                        "split '%s': range %d-%d does not start where the "
                                        "previous one ends (%d)",
                                        text, a, b, split->bounds[s]);
            split->bounds[++s] = b;
        } else {
            if (read_int(&p, &b) < 0)
                return strata_set_error(STRATA_EINVAL, "split '%s': expected cut points like 2,4",
                                        text);
            split->bounds[++s] = b;
        }
        if (*p == '|' || *p == ',')
            p++;
        else if (*p)
            return strata_set_error(STRATA_EINVAL, "split '%s': unexpected '%c'", text, *p);
    }
    if (!ranges) {
        if (s + 1 > SIM_MAX_STAGES)
            return strata_set_error(STRATA_EINVAL, "split '%s': more than %d stages", text,
                                    SIM_MAX_STAGES);
        split->bounds[++s] = num_layers;
    }
    split->num_stages = s;
    return sim_split_check(split);
}

void sim_split_format(const struct sim_split *split, char *buf, size_t cap) {
    size_t used = 0;
    if (cap == 0) return;
    buf[0] = '\0';
    for (int s = 0; s < split->num_stages && used < cap; s++) {
        int n = snprintf(buf + used, cap - used, "%s%d-%d", s ? "|" : "", split->bounds[s],
                         split->bounds[s + 1]);
        if (n < 0) return;
        used += (size_t)n;
    }
}

int sim_split_equal(const struct sim_split *a, const struct sim_split *b) {
    if (a->num_layers != b->num_layers || a->num_stages != b->num_stages) return 0;
    for (int s = 0; s <= a->num_stages; s++)
        if (a->bounds[s] != b->bounds[s]) return 0;
    return 1;
}
