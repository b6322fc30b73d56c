/* strata-stage --calibrate: measures this box once for the performance model and writes a
 * device profile (runtime/model/perf_model.h; reference/calibrate.h says what is measured).
 * No model is needed. `strata-plan --predict --profile FILE` reads the file.
 * Exit codes: 0 ok, 1 runtime failure, 2 usage. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/calibrate.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/perf_model.h"
#include "runtime/strata_stage_args.h"
#include "runtime/stage/calibrate_cuda.h"

int strata_calibrate_main(int argc, char **argv);

static void usage(FILE *out) {
    fprintf(out,
            "usage: strata-stage --calibrate [--device cpu] [--threads N] [--cpus LIST] [--out "
            "FILE]\n"
            "Measures this box for strata-plan --predict and prints (or writes) a device\n"
            "profile: host read bandwidth, the bytes per second a bf16 matmul of one row\n"
            "streams (decode) and the GFLOP/s of 64 rows (prefill), with the CPU backend's own\n"
            "ops at N threads (a few seconds; run it on a quiet box).\n"
            "  --device D       what to measure: cpu (default) or cuda[:N], the GPU with the\n"
            "                   CUDA backend's own kernels (device copy bandwidth, a bf16\n"
            "                   matmul's streaming rate at 1 row, GFLOP/s at 64 rows)\n"
            "  --threads N      threads, as strata-stage --threads will run (default 1; cpu)\n"
            "  --cpus LIST      on these CPUs only, as strata-stage --cpus will run (0-3,8)\n"
            "  --out FILE       write the profile here (default: stdout)\n"
            "  --help           this text\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 usage.\n");
}

int strata_calibrate_main(int argc, char **argv) {
    static const struct option opts[] = {{"calibrate", 0, 0, 'c'},
                                         {"device", 1, 0, 'd'},
                                         {"threads", 1, 0, 't'},
                                         {"out", 1, 0, 'o'},
                                         {"cpus", 1, 0, 'p'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    int threads = 1, c, cuda = 0, pin = 0;
    struct cpu_pin cpus;
    struct cli_device dev = {0};
    const char *out = NULL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': break;
        case 'd':
            if (cli_parse_device(optarg, &dev) < 0) {
                fprintf(stderr, "strata-stage: --calibrate --device: %s\n", strata_last_error());
                return STRATA_EXIT_USAGE;
            }
            cuda = cli_device_is_cuda(optarg);
            break;
        case 't':
            if (cli_parse_int(optarg, 1, 1024, &threads) < 0) {
                fprintf(stderr, "strata-stage: --threads wants 1..1024\n");
                return STRATA_EXIT_USAGE;
            }
            break;
        case 'o': out = optarg; break;
        case 'p':
            if (strata_stage_flag_cpus(optarg, &cpus) < 0) return STRATA_EXIT_USAGE;
            pin = 1;
            break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "strata-stage: --calibrate: unexpected argument '%s'\n", argv[optind]);
        return STRATA_EXIT_USAGE;
    }
    if (strata_stage_pin_cpus(pin ? &cpus : NULL, cuda ? 1 : threads) < 0) return STRATA_EXIT_USAGE;
    struct perf_device d;
    char *json = NULL;
    int rc;
    if (cuda) {
        fprintf(stderr, "calibrating cuda:%d ...\n", dev.index);
        rc = stage_calibrate_cuda(&d, dev.index, NULL);
    } else {
        fprintf(stderr, "calibrating at %d thread(s) ...\n", threads);
        rc = reference_calibrate(&d, threads);
    }
    if (rc == 0) rc = perf_device_format(&d, &json);
    if (rc == 0 && out) rc = cli_write_file_atomic(out, json, strlen(json));
    if (rc) {
        fprintf(stderr, "strata-stage: --calibrate: %s\n", strata_last_error());
        free(json);
        return STRATA_EXIT_FAILURE;
    }
    if (out)
        fprintf(stderr,
                "wrote %s: %s %.1f GB/s, bf16 matmul %.1f GB/s at 1 row, %.1f GFLOP/s at 64\n", out,
                cuda ? "device copy" : "read", d.read_gbps, d.gemv_gbps, d.gemm_gflops);
    else
        fputs(json, stdout);
    free(json);
    return STRATA_EXIT_OK;
}
