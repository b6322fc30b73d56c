/* The CUDA runtime as the kernels/ sources see it, on the host: a test tool, never a backend.
 *
 * The kernels/ .cu files compile here as host C++ (kernels/cuda_cpu/to_host.pl first turns each
 * `kernel<<<grid, block, shm, stream>>>(args);` into a cucpu_launch call) and link with
 * cucpu.cc, which runs every CUDA thread of a block as a fiber: `threadIdx` and friends are
 * the running fiber's, `__shared__` arrays are statics shared by the block (blocks run one at
 * a time), `__syncthreads` waits for every live thread of the block and the warp shuffles for
 * every live lane of the warp, exactly as the hardware's lock step would give. So the very
 * source that nvcc compiles for the GPU (indexing, shuffle trees, shared-memory protocols,
 * summation orders) runs against the reference ops on a machine without a device. What this
 * cannot show: timing, the memory model of truly concurrent warps, and CUDA's libm (expf and
 * friends are the host's here; the device's differ by ulps, as kernels/README.md says).
 * Floating point: the __f*_rn intrinsics are single correctly rounded operations on the host
 * too, and the host build is compiled without contraction (-ffp-contract=off), as nvcc's
 * --fmad=false. */
#ifndef STRATA_KERNELS_CUDA_CPU_CUDA_RUNTIME_H
#define STRATA_KERNELS_CUDA_CPU_CUDA_RUNTIME_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
/* Cache-hinted loads: a plain load on the host (the hint is timing only). */
template <typename T> inline T __ldcs(const T *p) {
    return *p;
}
inline float4 make_float4(float x, float y, float z, float w) {
    return float4{x, y, z, w};
}
inline float2 make_float2(float x, float y) {
    return float2{x, y};
}

/* The running fiber's indices (set by the scheduler whenever a fiber resumes). */
extern uint3 cucpu_thread_idx, cucpu_block_idx;
extern dim3 cucpu_block_dim, cucpu_grid_dim;
#define threadIdx cucpu_thread_idx
#define blockIdx cucpu_block_idx
#define blockDim cucpu_block_dim
#define gridDim cucpu_grid_dim
static const int warpSize = 32;

typedef void *cudaStream_t;
enum cudaError {
    cudaSuccess = 0,
    cudaErrorLaunchFailure = 4,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorStreamCaptureIsolation = 905,
    /* not CUDA's: a launch on the legacy default stream while a backend stream exists (the
     * backend's rule: every call on its own stream; cuda_cpu checks it, a device would not) */
    cudaErrorCucpuDefaultStream = 10001,
};
typedef enum cudaError cudaError_t;
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t err);

/* ---------------------------------------------------------------- launches */
struct cucpu_config {
    dim3 grid, block;
    size_t shared_bytes; /* dynamic shared memory (extern __shared__) */
    cudaStream_t stream; /* work runs in call order whatever the stream; graphs record by it */
};
inline cucpu_config CUCPU_CFG(dim3 grid, dim3 block, size_t shared_bytes = 0,
                              cudaStream_t stream = nullptr) {
    return cucpu_config{grid, block, shared_bytes, stream};
}
/* Graph capture (device_cpu.cc): while this thread captures, work queued on the capturing
 * stream is appended to the recording instead of running (1: recorded); work on another
 * stream spoils the capture, as on a device (-1: the caller reports the error). `site`
 * names the node (a launch's lambda type: one per launch site, or a copy's kind); a graph's
 * topology is its sequence of sites. */
int cucpu_capture_record(cudaStream_t stream, const char *site, const std::function<void()> &op);
/* 1 when `stream` is the legacy default (NULL) while some stream exists (device_cpu.cc). */
int cucpu_default_stream_misused(cudaStream_t stream);
/* Runs a launch now (a graph's replay). */
void cucpu_run_launch(cucpu_config cfg, const std::function<void()> &body);
/* The running block's dynamic shared memory (to_host.pl's rewrite of extern __shared__). */
void *cucpu_dynamic_shared(void);
/* Runs body once per thread of every block (blocks in order, threads as fibers); a bad
 * geometry or a deadlocked barrier becomes cudaGetLastError's error. */
void cucpu_launch(cucpu_config cfg, const std::function<void()> &body);

/* ---------------------------------------------------------------- synchronisation */
void __syncthreads(void);
/* Stores v as this lane's shuffle value, waits for the warp, reads lane src (-1: own). */
uint64_t cucpu_warp_exchange(uint64_t v, int src);
int cucpu_lane(void);
/* A barrier of the warp's live lanes (the kernels call it with every lane of the warp, so
 * the mask is not needed here); orders the lanes' shared-memory writes before their reads. */
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)mask;
    (void)cucpu_warp_exchange(0, -1);
}

template <typename T> inline T cucpu_shfl(T v, int src) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    bits = cucpu_warp_exchange(bits, src);
    T out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
}
/* CUDA's rule: the source lane is taken inside the caller's width-sized segment; a
 * shfl_down past the segment's end returns the caller's own value. */
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    (void)mask;
    const int lane = cucpu_lane(), seg = lane & ~(width - 1);
    const int src = (lane - seg) + (int)delta < width ? lane + (int)delta : -1;
    (void)seg;
    return cucpu_shfl(v, src);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
    (void)mask;
    const int lane = cucpu_lane(), seg = lane & ~(width - 1);
    const int src = seg + (((lane - seg) ^ lane_mask) & (width - 1));
    return cucpu_shfl(v, src);
}
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) {
    (void)mask;
    const int lane = cucpu_lane(), seg = lane & ~(width - 1);
    return cucpu_shfl(v, seg + (src_lane & (width - 1)));
}

/* ---------------------------------------------------------------- arithmetic */
/* x86-64 SSE arithmetic is IEEE single / double with no excess precision, and the build
 * turns contraction off: each is one correctly rounded operation, as on the device. */
inline float __fadd_rn(float a, float b) {
    return a + b;
}
inline float __fsub_rn(float a, float b) {
    return a - b;
}
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fdiv_rn(float a, float b) {
    return a / b;
}
inline float __fmaf_rn(float a, float b, float c) {
    return std::fma(a, b, c);
}
inline double __dadd_rn(double a, double b) {
    return a + b;
}
inline double __dmul_rn(double a, double b) {
    return a * b;
}
inline float __expf(float x) {
    return std::exp(x);
}
inline float __uint_as_float(unsigned v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned v;
    std::memcpy(&v, &f, 4);
    return v;
}
inline float __int_as_float(int v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
inline int __float_as_int(float f) {
    int v;
    std::memcpy(&v, &f, 4);
    return v;
}
inline float rsqrtf(float x) {
    return 1.0f / std::sqrt(x);
}

inline int min(int a, int b) {
    return a < b ? a : b;
}
inline int max(int a, int b) {
    return a > b ? a : b;
}
inline unsigned min(unsigned a, unsigned b) {
    return a < b ? a : b;
}
inline unsigned max(unsigned a, unsigned b) {
    return a > b ? a : b;
}
inline long long min(long long a, long long b) {
    return a < b ? a : b;
}
inline long long max(long long a, long long b) {
    return a > b ? a : b;
}
inline size_t min(size_t a, size_t b) {
    return a < b ? a : b;
}
inline size_t max(size_t a, size_t b) {
    return a > b ? a : b;
}
inline float min(float a, float b) {
    return std::fmin(a, b);
}
inline float max(float a, float b) {
    return std::fmax(a, b);
}

#endif
