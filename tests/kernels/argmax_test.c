/* cuda_argmax (kernels/argmax.h) against reference/sampler.h's argmax: the ids must be
 * equal, always (a comparison-only reduction; an NMSE bound means nothing for an index);
 * and cuda_argmax_part_rows against argmax_part on every part of rows split in 2 and 4 (the
 * vocab-parallel head's shards): the pairs bit for bit, and argmax_merge of them equal to
 * the whole row's argmax.
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
#include "tests/kernels/kernel_test.h"
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

/* 0 when cuda_argmax_part_rows gives argmax_part's pairs on each of `parts` column slices of
 * ROWS rows of length n (n % parts == 0), and their merge is the whole row's argmax. */
static int check_parts(int n, int parts, unsigned seed) {
    const int w = n / parts;
    float *x = malloc(sizeof(float) * ROWS * (size_t)n), *slice = malloc(sizeof(float) * ROWS * w);
    float got[ROWS * 2], *d_x = NULL, *d_pairs = NULL;
    struct argmax_candidate cand[ROWS][4];
    int rc = x && slice ? 0 : STRATA_ENOMEM, bad = 0;
    for (int r = 0; !rc && r < ROWS; ++r)
        fill_row(x + (size_t)r * n, n, r, &seed);
    if (!rc) rc = cuda_malloc((void **)&d_x, sizeof(float) * ROWS * (size_t)w);
    if (!rc) rc = cuda_malloc((void **)&d_pairs, sizeof got);
    for (int p = 0; !rc && p < parts; ++p) {
        for (int r = 0; r < ROWS; ++r)
            memcpy(slice + (size_t)r * w, x + (size_t)r * n + (size_t)p * w, sizeof(float) * w);
        rc = cuda_memcpy_to_device(d_x, slice, sizeof(float) * ROWS * (size_t)w);
        if (!rc) rc = cuda_argmax_part_rows(d_pairs, d_x, ROWS, w, p * w, NULL);
        if (!rc) rc = cuda_synchronize();
        if (!rc) rc = cuda_memcpy_to_host(got, d_pairs, sizeof got);
        for (int r = 0; !rc && r < ROWS; ++r) {
            struct argmax_candidate want = argmax_part(slice + (size_t)r * w, w, p * w);
            cand[r][p] = (struct argmax_candidate){got[2 * r], (int)got[2 * r + 1]};
            if (memcmp(&got[2 * r], &want.value, sizeof(float)) || cand[r][p].index != want.index) {
                printf("FAIL n %d / %d part %d row %d: reference (%g, %d), device (%g, %d)\n", n,
                       parts, p, r, want.value, want.index, got[2 * r], cand[r][p].index);
                bad++;
            }
        }
    }
    for (int r = 0; !rc && r < ROWS; ++r)
        if (argmax_merge(cand[r], parts) != argmax(x + (size_t)r * n, n)) {
            printf("FAIL n %d / %d row %d: merged %d, argmax %d\n", n, parts, r,
                   argmax_merge(cand[r], parts), argmax(x + (size_t)r * n, n));
            bad++;
        }
    if (rc)
        printf("FAIL n %d / %d: %s\n", n, parts, strata_last_error());
    else if (!bad)
        printf("ok   n %d in %d parts: pairs equal to argmax_part, merged ids to argmax\n", n,
               parts);
    cuda_free(d_x);
    cuda_free(d_pairs);
    free(x);
    free(slice);
    return rc || bad;
}

int main(void) {
    if (!kernel_test_device()) return 0;
    static const int lengths[] = {1, 2, 31, 1023, 1024, 1025, 4097, 16384, 16385, 151936};
    int failures = 0;
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; ++i)
        failures += check_length(lengths[i], 1234u + (unsigned)i);
    static const int split[] = {4, 8, 2048, 151936};
    for (size_t i = 0; i < sizeof split / sizeof split[0]; ++i)
        for (int parts = 2; parts <= 4; parts *= 2)
            failures += check_parts(split[i], parts, 77u + (unsigned)i);
    int32_t *d = NULL;
    if (!cuda_malloc((void **)&d, 16)) {
        int refused =
            cuda_argmax(d, (const float *)d, 0, NULL) == STRATA_EINVAL &&
            cuda_argmax_rows(d, NULL, 1, 4, NULL) == STRATA_EINVAL &&
            cuda_argmax_part_rows((float *)d, (const float *)d, 1, 4, -1, NULL) == STRATA_EINVAL;
        printf("%s bad arguments refused\n", refused ? "ok  " : "FAIL");
        failures += !refused;
        cuda_free(d);
    }
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
