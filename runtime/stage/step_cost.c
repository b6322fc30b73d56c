/* step_cost.h: a decode step's measured cost by rows, and the rows budget from it. */
#include "runtime/stage/step_cost.h"

#define STEP_COST_WEIGHT 0.25 /* of a new measurement in the moving average */

void step_cost_add(struct step_cost *c, int rows, double sec) {
    if (rows < 1 || !(sec > 0)) return;
    if (rows > STEP_COST_ROWS) rows = STEP_COST_ROWS;
    c->steps++;
    const int fresh = c->sec[rows] > 0 && c->steps - c->at[rows] <= STEP_COST_MAX_AGE;
    c->sec[rows] = fresh ? c->sec[rows] + STEP_COST_WEIGHT * (sec - c->sec[rows]) : sec;
    c->at[rows] = c->steps;
}

static int recent(const struct step_cost *c, int r) {
    return c->sec[r] > 0 && c->steps - c->at[r] <= STEP_COST_MAX_AGE;
}

double step_cost_sec(const struct step_cost *c, int rows) {
    if (rows < 1) rows = 1;
    if (rows > STEP_COST_ROWS) rows = STEP_COST_ROWS;
    int lo = rows, hi = rows;
    while (lo >= 1 && !recent(c, lo))
        lo--;
    while (hi <= STEP_COST_ROWS && !recent(c, hi))
        hi++;
    if (lo >= 1 && hi <= STEP_COST_ROWS && lo != hi)
        return c->sec[lo] + (c->sec[hi] - c->sec[lo]) * (rows - lo) / (hi - lo);
    return lo >= 1 ? c->sec[lo] : hi <= STEP_COST_ROWS ? c->sec[hi] : 0;
}

int step_cost_has_baseline(const struct step_cost *c, int rows) {
    if (rows > STEP_COST_ROWS) rows = STEP_COST_ROWS;
    for (int r = 1; r <= rows; r++)
        if (recent(c, r)) return 1;
    return 0;
}

int step_cost_budget(const struct step_cost *c) {
    double cheapest = 0;
    int cheapest_rows = 1;
    for (int r = 1; r <= STEP_COST_ROWS; r++)
        if (recent(c, r) && (cheapest == 0 || c->sec[r] < cheapest)) {
            cheapest = c->sec[r];
            cheapest_rows = r;
        }
    if (cheapest == 0) return STEP_COST_ROWS;
    for (int r = 1; r <= STEP_COST_ROWS; r++)
        if (recent(c, r) && c->sec[r] > STEP_COST_SLACK * cheapest)
            return r - 1 > cheapest_rows ? r - 1 : cheapest_rows;
    return STEP_COST_ROWS;
}
