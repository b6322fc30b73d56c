/* strata-sim's command line: what one invocation asks for (the model, which splits, the
 * simulated links, faults and compute, the requests) and its parser. Owned by the command
 * line alone; sim/main.c opens the model and runs what it says. */
#ifndef STRATA_SIM_SIM_CLI_H
#define STRATA_SIM_SIM_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "sim/pipeline_sim.h"

/* The longest prompt a run takes (--prompt, --prompt-tokens, golden.json). */
#define SIM_MAX_PROMPT 32768

struct sim_cli {
    const char *model_dir;
    int all_splits, stages, random_splits;
    const char *split_text;
    uint64_t seed;
    struct sim_options sim; /* link, faults, timeouts, compute, threads */
    struct sim_link_params conn_link[SIM_MAX_STAGES];
    int conn_link_set[SIM_MAX_STAGES];
    int requests, requests_per_stage, max_tokens, stop_at_eos, stage_stats, warm;
    int prompt_tokens; /* --prompt-tokens N (0: none) */
    const char *prompt_text;
    const char *draft_model; /* --draft-model DIR */
    const char *profile;     /* --profile FILE (--compute model) */
    struct sampler_params sampling;
};

/* Fills `cli` from argv: -1 to print the usage and exit 0, 0 ok, or an exit code (usage
 * errors are printed). */
int sim_cli_parse(struct sim_cli *cli, int argc, char **argv);
void sim_cli_usage(FILE *out);

#endif
