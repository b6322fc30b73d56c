/* CPU twin of the CUDA RMSNorm kernel: the oracle the GPU result is compared against. */
#include <math.h>

#include "kernels/rmsnorm.h"

void rmsnorm_cpu(float *out, const float *x, const float *w, int rows, int dim, float eps) {
    for (int r = 0; r < rows; ++r) {
        const float *xr = x + (long)r * dim;
        float *outr = out + (long)r * dim;
        float sum = 0.0f;
        for (int i = 0; i < dim; ++i)
            sum += xr[i] * xr[i];
        float scale = 1.0f / sqrtf(sum / (float)dim + eps);
        for (int i = 0; i < dim; ++i)
            outr[i] = xr[i] * scale * w[i];
    }
}
