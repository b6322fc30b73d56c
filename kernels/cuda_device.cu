/* cuda_device.h for builds with the CUDA toolkit: thin wrappers over the CUDA runtime that
 * turn its errors into Strata statuses. */
#include <stdio.h>

#include "kernels/cuda_common.cuh"

extern "C" {
#include "kernels/cuda_device.h"
}

extern "C" int cuda_device_available(char *reason, size_t cap) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        if (reason && cap)
            snprintf(reason, cap, "no CUDA device (%s)",
                     err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
        return 0;
    }
    cudaDeviceProp prop;
    if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
        if (reason && cap) snprintf(reason, cap, "no CUDA device (%s)", cudaGetErrorString(err));
        return 0;
    }
    if (reason && cap) snprintf(reason, cap, "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
    return 1;
}

extern "C" int cuda_malloc(void **ptr, size_t bytes) {
    if (!ptr) return strata_set_error(STRATA_EINVAL, "cuda_malloc: ptr is NULL");
    *ptr = NULL;
    /* cudaMalloc(0) may hand back NULL; callers treat NULL as "allocation failed". */
    CUDA_CHECK_RETURN(cudaMalloc(ptr, bytes ? bytes : 1));
    return STRATA_OK;
}

extern "C" void cuda_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}

extern "C" int cuda_memcpy_to_device(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return STRATA_OK;
}

extern "C" int cuda_memcpy_to_host(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return STRATA_OK;
}

extern "C" int cuda_synchronize(void) {
    CUDA_CHECK_RETURN(cudaDeviceSynchronize());
    return STRATA_OK;
}
