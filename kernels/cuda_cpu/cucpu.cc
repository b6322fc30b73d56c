/* The fiber scheduler behind cuda_runtime.h (see there): one block at a time, each of its
 * threads a fiber run until it waits at a barrier or returns. A barrier opens when
 * every live thread of its scope (the warp for a shuffle, the block for __syncthreads) waits
 * at one; a thread that returned no longer counts (CUDA's rule for exited threads). When no
 * fiber can run and no barrier can open, the block has deadlocked (a barrier under divergent
 * control flow): the launch stops and cudaGetLastError reports it.
 *
 * The switch between fibers: on x86-64 a few instructions that save the callee-saved
 * registers and the floating-point control words and swap stacks; ucontext's swapcontext
 * elsewhere (it also saves the signal mask: two system calls per switch, which made a
 * golden model's decode ten times slower). */
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "cuda_runtime.h"

#if defined(__x86_64__)
/* cucpu_switch(&from_sp, to_sp): pushes rbp rbx r12-r15 and MXCSR / the x87 control word,
 * stores rsp in *from_sp, loads to_sp, and pops the same frame from there. */
extern "C" void cucpu_switch(void **from_sp, void *to_sp);
__asm__(".text\n"
        ".globl cucpu_switch\n"
        ".type cucpu_switch,@function\n"
        "cucpu_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size cucpu_switch, .-cucpu_switch\n");

struct Context {
    void *sp = nullptr;
};

/* A new fiber's stack holds the frame cucpu_switch pops: the caller's control words, six
 * zeroed registers, and entry as the return address, placed so that entry starts with the
 * stack aligned as after a call. */
static void context_init(Context &c, char *stack, size_t bytes, void (*entry)()) {
    /* After ret pops entry, rsp = top: 8 mod 16, as right after a call. */
    uintptr_t top = ((uintptr_t)(stack + bytes) & ~(uintptr_t)15) - 24;
    void **sp = (void **)top;
    *--sp = (void *)entry;
    for (int i = 0; i < 6; ++i)
        *--sp = nullptr;
    uint32_t mxcsr;
    uint16_t fcw;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fcw));
    --sp;
    std::memcpy((char *)sp, &mxcsr, 4);
    std::memcpy((char *)sp + 4, &fcw, 2);
    c.sp = sp;
}

static inline void context_switch(Context &from, Context &to) {
    cucpu_switch(&from.sp, to.sp);
}
#else
#include <ucontext.h>

struct Context {
    ucontext_t uc;
};

static void context_init(Context &c, char *stack, size_t bytes, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = bytes;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}

static inline void context_switch(Context &from, Context &to) {
    swapcontext(&from.uc, &to.uc);
}
#endif

uint3 cucpu_thread_idx, cucpu_block_idx;
dim3 cucpu_block_dim, cucpu_grid_dim;

namespace {

enum { kStackBytes = 256 * 1024, kMaxThreads = 1024, kWarp = 32 };
enum Wait { kRunnable, kWarpBarrier, kBlockBarrier, kDone };

struct Fiber {
    Context ctx;
    std::vector<char> stack;
    uint3 tid;
    int linear = 0;
    Wait wait = kRunnable;
    uint64_t slot[2] = {0, 0}; /* this lane's shuffle values, alternate shuffles */
    int parity = 0;            /* which slot the next shuffle uses */
};

struct Block {
    std::vector<Fiber> fibers;
    Context scheduler;
    Fiber *current = nullptr;
    const std::function<void()> *body = nullptr;
    int n = 0;
    std::vector<double> dynamic_shared; /* doubles: aligned for any element type */
};

/* One block runs at a time in the whole process: the backend's TP ranks are host threads
 * that launch concurrently, and their launches take turns (g_run, held for a whole launch;
 * a kernel never waits for another thread). Plain globals, not thread_local: the scheduler
 * and threadIdx are read at every step, and TLS in a shared library costs a call per read.
 * The last error is per host thread, as CUDA's is. */
Block g_block;
std::mutex g_run;
thread_local cudaError_t g_error;

void fiber_entry() {
    (*g_block.body)();
    g_block.current->wait = kDone;
    context_switch(g_block.current->ctx, g_block.scheduler); /* never resumed */
    std::abort();
}

void wait_at(Wait w) {
    Fiber *f = g_block.current;
    f->wait = w;
    context_switch(f->ctx, g_block.scheduler);
    cucpu_thread_idx = f->tid; /* resumed: this fiber's indices again */
}

/* Opens every barrier whose scope's live threads all wait; returns how many threads it let go. */
int open_barriers() {
    Block &b = g_block;
    int released = 0, n = b.n;
    for (int w0 = 0; w0 < n; w0 += kWarp) {
        const int w1 = w0 + kWarp < n ? w0 + kWarp : n;
        int live = 0, waiting = 0;
        for (int i = w0; i < w1; ++i) {
            live += b.fibers[i].wait != kDone;
            waiting += b.fibers[i].wait == kWarpBarrier;
        }
        if (waiting && waiting == live)
            for (int i = w0; i < w1; ++i)
                if (b.fibers[i].wait == kWarpBarrier) b.fibers[i].wait = kRunnable, ++released;
    }
    int live = 0, waiting = 0;
    for (int i = 0; i < n; ++i) {
        live += b.fibers[i].wait != kDone;
        waiting += b.fibers[i].wait == kBlockBarrier;
    }
    if (waiting && waiting == live)
        for (int i = 0; i < n; ++i)
            if (b.fibers[i].wait == kBlockBarrier) b.fibers[i].wait = kRunnable, ++released;
    return released;
}

/* Runs one block to completion; false on a deadlock. */
bool run_block() {
    Block &b = g_block;
    uint3 &thread_idx = cucpu_thread_idx;
    for (;;) {
        int ran = 0, live = 0;
        for (int i = 0; i < b.n; ++i) {
            Fiber &f = b.fibers[i];
            if (f.wait == kDone) continue;
            ++live;
            if (f.wait != kRunnable) continue;
            b.current = &f;
            thread_idx = f.tid;
            context_switch(b.scheduler, f.ctx);
            ++ran;
        }
        if (!live) return true;
        if (!ran && !open_barriers()) return false;
        if (ran) open_barriers();
    }
}

} // namespace

void cucpu_launch(cucpu_config cfg, const std::function<void()> &body) {
    if (cucpu_default_stream_misused(cfg.stream)) {
        g_error = cudaErrorCucpuDefaultStream;
        return;
    }
    const int recorded = cucpu_capture_record(cfg.stream, body.target_type().name(),
                                              [cfg, body]() { cucpu_run_launch(cfg, body); });
    if (recorded < 0) g_error = cudaErrorStreamCaptureIsolation;
    if (recorded) return;
    cucpu_run_launch(cfg, body);
}

void cucpu_run_launch(cucpu_config cfg, const std::function<void()> &body) {
    std::lock_guard<std::mutex> hold(g_run);
    const unsigned long threads = (unsigned long)cfg.block.x * cfg.block.y * cfg.block.z;
    if (!threads || threads > kMaxThreads || !cfg.grid.x || !cfg.grid.y || !cfg.grid.z ||
        cfg.grid.y > 65535 || cfg.grid.z > 65535 || cfg.block.z > 64) {
        g_error = cudaErrorInvalidConfiguration;
        return;
    }
    cucpu_block_dim = cfg.block;
    cucpu_grid_dim = cfg.grid;
    g_block.n = (int)threads;
    g_block.body = &body;
    if (cfg.shared_bytes > 48 * 1024) { /* the default limit without an opt-in attribute */
        g_error = cudaErrorInvalidConfiguration;
        return;
    }
    g_block.dynamic_shared.assign((cfg.shared_bytes + sizeof(double) - 1) / sizeof(double), 0.0);
    if (g_block.fibers.size() < threads) g_block.fibers.resize(threads);
    for (unsigned bz = 0; bz < cfg.grid.z; ++bz)
        for (unsigned by = 0; by < cfg.grid.y; ++by)
            for (unsigned bx = 0; bx < cfg.grid.x; ++bx) {
                cucpu_block_idx = uint3(bx, by, bz);
                for (int i = 0; i < (int)threads; ++i) {
                    Fiber &f = g_block.fibers[i];
                    if (f.stack.empty()) f.stack.resize(kStackBytes);
                    f.linear = i;
                    f.tid = uint3(i % cfg.block.x, i / cfg.block.x % cfg.block.y,
                                  i / (cfg.block.x * cfg.block.y));
                    f.wait = kRunnable;
                    f.parity = 0;
                    context_init(f.ctx, f.stack.data(), f.stack.size(), fiber_entry);
                }
                if (!run_block()) {
                    g_error = cudaErrorLaunchFailure;
                    return; /* the deadlocked fibers' stacks are reused by the next launch */
                }
            }
}

void *cucpu_dynamic_shared(void) {
    return g_block.dynamic_shared.data();
}

void __syncthreads(void) {
    wait_at(kBlockBarrier);
}

int cucpu_lane(void) {
    return g_block.current->linear % kWarp;
}

/* One barrier per shuffle: shuffles alternate between two slots, and a lane can only
 * store into a slot again after the next shuffle's barrier, which every lane reaches only
 * once it has read this one. */
uint64_t cucpu_warp_exchange(uint64_t v, int src) {
    Fiber *f = g_block.current;
    const int p = f->parity;
    f->parity ^= 1;
    f->slot[p] = v;
    wait_at(kWarpBarrier); /* every lane has stored */
    const int base = f->linear - f->linear % kWarp;
    return src < 0 || base + src >= g_block.n ? v : g_block.fibers[base + src].slot[p];
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_error;
    g_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid launch configuration (cuda_cpu)";
    case cudaErrorLaunchFailure:
        return "a barrier deadlocked under divergent control flow (cuda_cpu)";
    case cudaErrorStreamCaptureIsolation:
        return "a launch on another stream while capturing a graph (cuda_cpu)";
    case cudaErrorCucpuDefaultStream:
        return "a launch on the legacy default stream while a backend stream exists (cuda_cpu)";
    }
    return "unknown error (cuda_cpu)";
}
