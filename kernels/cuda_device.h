/* Whether a usable CUDA device is present, asked once before any GPU work. Tests use it
 * to print "skipped: <reason>" instead of failing on machines without a GPU. */
#ifndef STRATA_KERNELS_CUDA_DEVICE_H
#define STRATA_KERNELS_CUDA_DEVICE_H

#include <stddef.h>

/* 1 when at least one CUDA device can be used; else 0 with the reason in reason[cap]
 * ("no CUDA device (...)" or, in builds without the toolkit, "CUDA toolkit not installed
 * (nvcc not found)"). On success reason holds the device name. */
int cuda_device_available(char *reason, size_t cap);

#endif
