/* runtime/stage/calibrate_cuda.h on a GPU ("skipped:" without one): the profile a device run
 * writes is whole and sane — a copy bandwidth and a streaming rate (the latter at least at two
 * working sets, the largest past the L2 no faster than the copy), GFLOP/s by K for plain and
 * split matmuls, the card's name and memory — and survives the profile format's round trip
 * (what strata-plan --profile reads). Small: 128 MiB of weights, 2 rounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/model/perf_model.h"
#include "runtime/stage/calibrate_cuda.h"
#include "tests/kernels/kernel_test.h"

int main(void) {
    if (!kernel_test_device()) return 0;
    struct perf_device d, back;
    const struct stage_calibrate_cuda_options opt = {.weight_bytes = (size_t)128 << 20,
                                                     .rounds = 2};
    int rc = stage_calibrate_cuda(&d, 0, &opt), bad = 0;
    if (rc) {
        printf("FAIL calibrate: %s\n", strata_last_error());
        return 1;
    }
    bad |= kernel_test_check(d.read_gbps > 50 && d.read_gbps < 1e5,
                             "copy bandwidth in (50, 1e5) GB/s");
    bad |= kernel_test_check(d.gemv_by_bytes.n >= 2, "streaming rate at 2 or more working sets");
    bad |= kernel_test_check(d.gemv_gbps > 5 && d.gemv_gbps <= 1.5 * d.read_gbps,
                             "streaming rate past the L2 above 5 GB/s, not above the copy's 1.5x");
    bad |= kernel_test_check(d.gemm_by_k.n == 4 && d.gemm_split_by_k.n == 4 && d.gemm_gflops > 10,
                             "GFLOP/s at K 1024..8192, plain and split");
    bad |= kernel_test_check(d.name[0] && d.mem_bytes > ((uint64_t)1 << 30) &&
                                 !strcmp(d.device, "cuda") && !strcmp(d.source, "measured"),
                             "name, memory, device and source");
    char *json = NULL;
    rc = perf_device_format(&d, &json);
    if (rc == 0) rc = perf_device_parse(&back, json, strlen(json));
    bad |= kernel_test_check(rc == 0 && back.gemv_by_bytes.n == d.gemv_by_bytes.n &&
                                 back.gemm_split_by_k.n == 4,
                             "the profile's round trip");
    if (json) printf("profile: %s\n", json);
    free(json);
    return bad;
}
