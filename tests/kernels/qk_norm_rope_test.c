/* cuda_qk_norm_rope's own contract, beyond the NMSE sweep against the reference that
 * tests/backend_ops runs: one launch gives, bit for bit, what the stage backend ran before
 * it as four (cuda_rmsnorm on q's heads and on k's, then cuda_rope_apply_rows on each), on
 * every path of the norm (widths of 4k with aligned and unaligned heads, other widths) and
 * with heads past one block's threads; bad arguments are refused before any launch and no
 * rows is a no-op. Without a usable device it prints "skipped: <reason>". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_device.h"
#include "kernels/qk_norm_rope.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope_apply.h"
#include "runtime/base/status.h"
#include "tests/kernels/kernel_test.h"
#include "tests/test_util.h"

static float value(unsigned i, float scale) {
    i = i * 2654435761u + 977u;
    return scale * ((float)((i >> 8) % 2001u) / 1000.0f - 1.0f);
}

/* 0 when the fused call equals the four calls bit for bit. `offset` floats shift q and k off
 * a 16-byte boundary (1: the unaligned path). */
static int check(int rows, int heads, int kv_heads, int dim, int offset) {
    const size_t nq = (size_t)rows * heads * dim, nk = (size_t)rows * kv_heads * dim;
    const size_t nt = (size_t)rows * (dim / 2), bytes = sizeof(float);
    float *host = malloc(bytes * (nq + nk + 2 * (size_t)dim + 2 * nt));
    float *fused_q = malloc(bytes * (nq + nk)), *four_q = malloc(bytes * (nq + nk));
    float *d = NULL;
    const size_t dev_floats = 2 * (nq + nk + (size_t)offset) + 2 * (size_t)dim + 2 * nt;
    int rc =
        host && fused_q && four_q ? cuda_malloc((void **)&d, bytes * dev_floats) : STRATA_ENOMEM;
    if (rc) goto done;
    for (size_t i = 0; i < nq + nk; ++i)
        host[i] = value((unsigned)i, 2.0f);
    for (int i = 0; i < 2 * dim; ++i)
        host[nq + nk + i] = 1.0f + 0.5f * value((unsigned)i + 5000u, 1.0f);
    for (size_t i = 0; i < 2 * nt; ++i)
        host[nq + nk + 2 * dim + i] = value((unsigned)i + 9000u, 1.0f);
    /* device: [fused q | k][four q | k], each from `offset`, then the norms and tables */
    float *fq = d + offset, *fk = fq + nq, *gq = fk + nk + offset, *gk = gq + nq;
    float *norms = gk + nk, *cos_t = norms + 2 * dim, *sin_t = cos_t + nt;
    if (!rc) rc = cuda_memcpy_to_device(fq, host, bytes * (nq + nk));
    if (!rc) rc = cuda_memcpy_to_device(gq, host, bytes * (nq + nk));
    if (!rc) rc = cuda_memcpy_to_device(norms, host + nq + nk, bytes * (2 * (size_t)dim + 2 * nt));
    if (!rc)
        rc = cuda_qk_norm_rope(fq, fk, norms, norms + dim, 1e-6f, cos_t, sin_t, rows, heads,
                               kv_heads, dim, NULL);
    if (!rc) rc = cuda_rmsnorm(gq, gq, norms, 1e-6f, rows * heads, dim, NULL);
    if (!rc) rc = cuda_rmsnorm(gk, gk, norms + dim, 1e-6f, rows * kv_heads, dim, NULL);
    if (!rc) rc = cuda_rope_apply_rows(gq, cos_t, sin_t, rows, heads * dim, heads, dim, NULL);
    if (!rc) rc = cuda_rope_apply_rows(gk, cos_t, sin_t, rows, kv_heads * dim, kv_heads, dim, NULL);
    if (!rc) rc = cuda_synchronize();
    if (!rc) rc = cuda_memcpy_to_host(fused_q, fq, bytes * (nq + nk));
    if (!rc) rc = cuda_memcpy_to_host(four_q, gq, bytes * (nq + nk));
done:;
    char what[160];
    snprintf(what, sizeof what, "rows %d, heads %d + %d, head_dim %d%s: the four launches' bits",
             rows, heads, kv_heads, dim, offset ? " (unaligned)" : "");
    const int ok = !rc && !memcmp(fused_q, four_q, bytes * (nq + nk));
    if (!rc && !ok) strata_set_error(STRATA_EINVAL, "the fused heads differ");
    cuda_free(d);
    free(host);
    free(fused_q);
    free(four_q);
    return kernel_test_check(ok, what);
}

int main(void) {
    if (!kernel_test_device()) return 0;
    int failed = 0;
    failed += check(1, 32, 8, 128, 0); /* a decode row of the 8B shape */
    failed += check(1, 32, 8, 128, 1); /* the same off a 16-byte boundary */
    failed += check(7, 16, 8, 128, 0); /* a prefill chunk */
    failed += check(3, 4, 2, 66, 0);   /* a width off the 4-float path */
    failed += check(2, 3, 1, 6, 1);    /* small and unaligned */
    failed += check(2, 2, 1, 4104, 0); /* a head wider than one block's 1024 threads x 4 */
    failed += check(4, 5, 0, 64, 0);   /* no k heads */
    float one = 0.0f;
    failed += kernel_test_check(cuda_qk_norm_rope(&one, &one, &one, &one, 1e-6f, &one, &one, 1, 1,
                                                  1, 3, NULL) == STRATA_EINVAL,
                                "an odd head_dim is refused");
    failed += kernel_test_check(cuda_qk_norm_rope(NULL, NULL, NULL, NULL, 1e-6f, NULL, NULL, 1, 2,
                                                  1, 64, NULL) == STRATA_EINVAL,
                                "missing buffers are refused");
    failed += kernel_test_check(cuda_qk_norm_rope(NULL, NULL, NULL, NULL, 1e-6f, NULL, NULL, 0, 2,
                                                  1, 64, NULL) == STRATA_OK,
                                "no rows: nothing to do");
    printf("%d failure(s)\n", failed);
    return failed ? 1 : 0;
}
