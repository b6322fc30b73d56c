/* cuda_device_available() for builds with the CUDA toolkit: asks the runtime for a device
 * count and the first device's name. */
#include <cuda_runtime.h>
#include <stdio.h>

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
