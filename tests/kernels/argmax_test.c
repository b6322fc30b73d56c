/* cuda_argmax (kernels/argmax.h) against reference/sampler.h's argmax: the ids must be
 * equal, always (a comparison-only reduction; an NMSE bound means nothing for an index).
 * Rows of the vocabulary's length and of awkward small lengths, random values, exact ties
 * at random places (the first index must win), NaN at index 0 (the reference answers 0)
 * and elsewhere (passed over), -0 before +0, all -inf, +inf; and each row's id alone
 * equals its id in a batch. Prints "skipped: <reason>" without a device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/argmax.h"
#include "kernels/cuda_device.h"
#include "reference/sampler.h"
#include "runtime/base/status.h"
#include "tests/test_util.h"

enum { ROWS = 12 };

static unsigned next(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Row r of kind r % 12 (the cases above), length n. */
static void fill_row(float *x, int n, int r, unsigned *s) {
    for (int i = 0; i < n; ++i)
        x[i] = (float)(next(s) % 20001u) / 1000.0f - 10.0f;
    int a = (int)(next(s) % (unsigned)n), b = (int)(next(s) % (unsigned)n);
    switch (r % 12) {
    case 1: x[a] = x[b] = 11.0f; break;       /* a tie: the lower index */
    case 2: x[0] = NAN; break;                /* the reference answers 0 */
    case 3: x[a] = NAN, x[b] = 12.0f; break;  /* NaN passed over */
    case 4: x[a] = -0.0f, x[b] = 0.0f; break; /* noise around zero */
    case 5:
        for (int i = 0; i < n; ++i)
            x[i] = -INFINITY;
        break;
    case 6: x[a] = INFINITY; break;
    case 7:
        for (int i = 0; i < n; ++i)
            x[i] = (i % 7 == 3) ? 5.0f : -5.0f; /* many ties */
        break;
    case 8:
        for (int i = 0; i < n; ++i)
            x[i] = i % 2 ? 0.0f : -0.0f; /* -0 first: equal, index 0 wins */
        break;
    case 9: x[n - 1] = 100.0f; break;
    case 10: x[a] = NAN, x[0] = 50.0f; break;
    default: break;
    }
}

/* 0 when the device ids of ROWS rows of length n equal the reference's, batched and alone. */
static int check_length(int n, unsigned seed) {
    float *x = malloc(sizeof(float) * ROWS * (size_t)n), *d_x = NULL;
    int32_t got[ROWS], alone[ROWS], *d_ids = NULL;
    int rc = x ? 0 : STRATA_ENOMEM, bad = 0;
    for (int r = 0; !rc && r < ROWS; ++r)
        fill_row(x + (size_t)r * n, n, r, &seed);
    if (!rc) rc = cuda_malloc((void **)&d_x, sizeof(float) * ROWS * (size_t)n);
    if (!rc) rc = cuda_malloc((void **)&d_ids, sizeof got);
    if (!rc) rc = cuda_memcpy_to_device(d_x, x, sizeof(float) * ROWS * (size_t)n);
    if (!rc) rc = cuda_argmax_rows(d_ids, d_x, ROWS, n, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(got, d_ids, sizeof got);
    for (int r = 0; !rc && r < ROWS; ++r) {
        rc = cuda_argmax(d_ids, d_x + (size_t)r * n, n, NULL);
        if (!rc) rc = cuda_synchronize();
        if (!rc) rc = cuda_memcpy_to_host(&alone[r], d_ids, sizeof alone[r]);
    }
    for (int r = 0; !rc && r < ROWS; ++r) {
        int want = argmax(x + (size_t)r * n, n);
        if (got[r] != want || alone[r] != want) {
            printf("FAIL n %d row %d (kind %d): reference %d, batched %d, alone %d\n", n, r, r % 12,
                   want, (int)got[r], (int)alone[r]);
            bad++;
        }
    }
    if (rc)
        printf("FAIL n %d: %s\n", n, strata_last_error());
    else if (!bad)
        printf("ok   n %d: %d rows, ids equal to the reference, batched and alone\n", n, ROWS);
    cuda_free(d_x);
    cuda_free(d_ids);
    free(x);
    return rc || bad;
}

int main(void) {
    char reason[256];
    if (!cuda_device_available(reason, sizeof reason)) {
        test_skip_all(reason);
        return 0;
    }
    printf("device: %s\n", reason);
    static const int lengths[] = {1, 2, 31, 1023, 1024, 1025, 4097, 151936};
    int failures = 0;
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; ++i)
        failures += check_length(lengths[i], 1234u + (unsigned)i);
    int32_t *d = NULL;
    if (!cuda_malloc((void **)&d, 16)) {
        int refused = cuda_argmax(d, (const float *)d, 0, NULL) == STRATA_EINVAL &&
                      cuda_argmax_rows(d, NULL, 1, 4, NULL) == STRATA_EINVAL;
        printf("%s bad arguments refused\n", refused ? "ok  " : "FAIL");
        failures += !refused;
        cuda_free(d);
    }
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
