/* vision_cuda.h in a build without the CUDA toolkit (--define=strata_cuda=0): the vision
 * stage's --device cuda[:N] is refused with the reason, as the "cuda" backend kind's is
 * (backend_cuda_absent.c). No kernel is linked. */
#include "runtime/base/status.h"
#include "runtime/stage/vision_cuda.h"

int vision_cuda_open(struct vision_cuda **out, const struct vision_encoder *enc, int device) {
    (void)enc;
    *out = NULL;
    return strata_set_error(STRATA_EDEVICE,
                            "device 'cuda:%d' is not available: this build has no CUDA vision "
                            "tower (the CUDA toolkit was not installed when it was built: nvcc "
                            "not found)",
                            device);
}

void vision_cuda_free(struct vision_cuda *g) {
    (void)g;
}

size_t vision_cuda_weight_bytes(const struct vision_cuda *g) {
    (void)g;
    return 0;
}

int vision_cuda_forward(struct vision_cuda *g, float *embeds, float *deepstack,
                        const float *pixel_values, int64_t n_patches, const int64_t *grid_thw,
                        int n_grids) {
    (void)g, (void)embeds, (void)deepstack, (void)pixel_values, (void)n_patches, (void)grid_thw,
        (void)n_grids;
    return strata_set_error(STRATA_EDEVICE, "this build has no CUDA vision tower");
}
