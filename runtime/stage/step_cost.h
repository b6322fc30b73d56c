/* What a decode microbatch of r rows costs on this stage, measured as it runs, and the most
 * rows a step may carry before it costs clearly more than a few rows do: the budget stage 0
 * gives speculative drafts under load.
 *
 * A decode step reads every weight once whatever its rows, so on a CPU or a GPU its time is
 * flat up to a knee and grows with the rows after it (measured on the 0.6B shape, 2 cores:
 * 4 rows cost what 1 row does; with 4 requests batched, 4 wrong drafts each made a step of 20
 * rows and cut tokens/s 3x). A draft row is worth its place only below the knee, and where the
 * knee lies depends on the box, the model and the other load: so it is measured, not set. */
#ifndef STRATA_RUNTIME_STAGE_STEP_COST_H
#define STRATA_RUNTIME_STAGE_STEP_COST_H

#include <stdint.h>

#define STEP_COST_ROWS 64       /* rows measured; a larger step counts as this many */
#define STEP_COST_SLACK 1.25    /* a step within 25% of the cheapest measured one is "flat" */
#define STEP_COST_MAX_AGE 2048u /* measurements older than this many steps are forgotten */

struct step_cost {
    double sec[STEP_COST_ROWS + 1];  /* EWMA of a step's seconds by its rows (0: none yet) */
    uint64_t at[STEP_COST_ROWS + 1]; /* the step count when each was last measured */
    uint64_t steps;                  /* decode steps measured */
};

/* Records one decode step of `rows` rows that took `sec` seconds. */
void step_cost_add(struct step_cost *c, int rows, double sec);

/* The most rows a step may have and stay flat: one below the fewest rows measured recently
 * to cost more than STEP_COST_SLACK x the cheapest recent step, or STEP_COST_ROWS when no
 * recent step did (optimistic: a step with more rows is how the knee is found). At least the
 * cheapest step's rows. */
int step_cost_budget(const struct step_cost *c);

/* A step of `rows` rows, seconds: measured recently at that many rows, else interpolated
 * linearly between the nearest recent row counts below and above, else the nearest one's
 * (0: nothing recent). */
double step_cost_sec(const struct step_cost *c, int rows);

/* 1 when a step of at most `rows` rows was measured recently: the baseline a budget compares
 * with (without one, a stage whose every step carries drafts would never learn that they
 * cost; its caller then holds the drafts back for a step). */
int step_cost_has_baseline(const struct step_cost *c, int rows);

#endif
