/* logits_diff OUT.safetensors REFERENCE.f32 [TOLERANCE]: max |delta logit| between the
 * "logits" tensor of a strata-stage --out file (F32 [n, V]) and a little-endian f32 file of
 * the same values (a golden's logits.f32). Prints "max |dlogit| X over N values"; exit 0
 * when X <= TOLERANCE (default 1e-2), 1 above it or on a size mismatch, 2 usage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/safetensors.h"

int main(int argc, char **argv) {
    struct safetensors *st = NULL;
    char *ref = NULL;
    size_t ref_len = 0;
    if (argc < 3 || argc > 4 || !strcmp(argv[1], "--help")) {
        fprintf(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr,
                "usage: logits_diff OUT.safetensors REFERENCE.f32 [TOLERANCE]\n");
        return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
    }
    double tol = argc == 4 ? atof(argv[3]) : 1e-2;
    if (safetensors_open(&st, argv[1]) < 0 || cli_read_file(&ref, &ref_len, argv[2]) < 0) {
        fprintf(stderr, "logits_diff: %s\n", strata_last_error());
        return 1;
    }
    const struct st_tensor *t = safetensors_find(st, "logits");
    size_t n = t ? (size_t)t->numel : 0;
    float *got = n ? malloc(n * sizeof(float)) : NULL;
    if (!t || !got || st_tensor_to_f32(got, t) < 0 || ref_len != n * sizeof(float)) {
        fprintf(stderr, "logits_diff: %s has %zu logits, %s has %zu bytes\n", argv[1], n, argv[2],
                ref_len);
        return 1;
    }
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        float r;
        memcpy(&r, ref + 4 * i, 4);
        double d = fabs((double)got[i] - (double)r);
        if (!(d <= worst)) worst = d; /* NaN counts as the worst */
    }
    printf("max |dlogit| %.3g over %zu values\n", worst, n);
    free(got);
    free(ref);
    safetensors_close(st);
    return worst <= tol ? 0 : 1;
}
