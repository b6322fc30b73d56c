/* Bit-identity of two simulated runs: the check behind `strata-sim --all-splits`.
 *
 * A run is identical to the baseline when each of its requests (request i of the run is
 * request i of the baseline; the baseline may have more) succeeded in both, generated the same
 * tokens, and every logit of every step has the same 32-bit pattern (compared as bits,
 * not as floats, so -0.0 vs 0.0 or two NaN payloads count as differences). */
#ifndef STRATA_SIM_COMPARE_H
#define STRATA_SIM_COMPARE_H

#include <stddef.h>

#include "sim/pipeline_sim.h"

/* Returns 1 when `run` is bit-identical to `baseline`, else 0 and a one-line reason in
 * why[cap] naming the request, step and position of the first difference. */
int sim_reports_identical(const struct sim_report *baseline, const struct sim_report *run,
                          char *why, size_t cap);

/* Returns 1 when requests count .. 2 count - 1 of `run` (each the repeat of request i =
 * 0 .. count - 1, served from the KV blocks that one left cached) are bit-identical to
 * requests 0 .. count - 1, else 0 and a one-line reason. */
int sim_repeats_identical(const struct sim_report *run, int count, char *why, size_t cap);

/* Returns 1 when requests first_at .. first_at + count - 1 of `run` (each the next turn of
 * request i = 0 .. count - 1: its prompt and the first a tokens of its answer) continue their
 * first turns bit for bit: step s's logits are the first turn's step a + s's (every step when
 * greedy; only step 0 when sampled, whose later steps follow other draws), and each reused the
 * KV blocks its first turn left, the answer's included (cached tokens: every whole block of
 * the positions the first turn wrote, up to the last prompt row). Else 0 and a reason. */
int sim_next_turns_identical(const struct sim_report *run, int count, int first_at, int greedy,
                             char *why, size_t cap);

/* Largest |a - b| between a run's logits for request `request` and reference logits
 * [n_steps][vocab] (e.g. a golden file), over the steps both have; -1 if none compared. */
double sim_logits_max_abs_diff(const struct sim_report *run, int request, const float *reference,
                               int n_steps, int vocab);

#endif
