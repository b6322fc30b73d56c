/* strata-stage-bench's subcommands kept apart from its main (runtime/stage_bench.c): the link
 * measurements (runtime/stage_bench_link.c). Each takes the arguments after its name and
 * returns the process exit code (0 ok, 1 failure, 2 usage). */
#ifndef STRATA_RUNTIME_STAGE_BENCH_H
#define STRATA_RUNTIME_STAGE_BENCH_H

int stage_bench_hop(int argc, char **argv);
int stage_bench_probe_link(int argc, char **argv);

#endif
