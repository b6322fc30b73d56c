/* The stage backend: everything a stage computes, behind one table of functions plus a
 * context (after llama.cpp's ggml_backend_i). The stage core (stage_core.h) speaks only to
 * this interface; a backend owns the weights of its role, its device, its activation
 * scratch and its KV cache. `cpu` is the reference decoder (backend_cpu.c); a device
 * backend implements the same table and must give the same tokens (reference/model.h's
 * determinism contract is the CPU's; tests/backend_ops checks every backend against it).
 *
 * Data crosses the seam in host memory, f32: hidden rows [n, H] (what travels between
 * stages), logits [n, V], token ids, and packed KV in the handoff layout
 * (runtime/model/decoder_io.h). What a device keeps on the device stays there.
 *
 * The backend owns its role: the layer range [layer_start, layer_end) and whether it
 * holds the embedding (first stage) and the final norm + lm_head (last stage). The core,
 * the Hello a stage sends and the startup summary all read it from here, so a stage can
 * never announce one range and compute another.
 *
 * Threading: one thread at a time calls into a backend; separate backends are
 * independent. Every call returns 0 or a negative STRATA_E* status with the message set. */
#ifndef STRATA_RUNTIME_STAGE_BACKEND_H
#define STRATA_RUNTIME_STAGE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/base/op_contract.h"
#include "runtime/base/progress.h"
#include "runtime/model/decoder_io.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_tensors.h"
#include "runtime/model/tp_shard.h"

struct stage_backend;
struct coll; /* wire/collective.h */

/* Tensor and KV parallelism (runtime/stage/stage_tp.h): this rank's place in its stage's
 * group of tp x kvp ranks (grid order, TP fastest: group rank = kvp_rank * tp + tp_rank). */
struct stage_tp_config {
    int tp, tp_rank;      /* TP degree >= 1, 0 <= rank < tp */
    enum tp_moe_mode moe; /* how MoE experts are split */
    int kvp, kvp_rank;    /* KVP degree (0 or 1 = none), 0 <= rank < kvp */
    int kvp_tokens;       /* KV positions per KVP rank (tp_shard.h kvp_token_range) */
    struct coll *coll;    /* the stage's group (borrowed; outlives the backend) */
};

/* 1 when `c` splits the stage (TP or KVP degree above 1). */
static inline int stage_tp_is_split(const struct stage_tp_config *c) {
    return c && (c->tp > 1 || c->kvp > 1);
}

/* What a backend is and holds, as fields: the startup summary, a ring describe, tests and
 * benchmarks read these (stage_backend_describe formats them: one formatter for every
 * backend), never prose parsed back. */
struct stage_backend_info {
    const char *kind;      /* "cpu", "cuda" */
    int device_index;      /* the CUDA ordinal; -1 for the CPU */
    char device_name[200]; /* as the device's driver describes it (CUDA: name, compute
                            * capability, memory); "" for the CPU */
    int threads;           /* CPU worker threads; 0 on a device */
    const char *kernels;   /* CPU: the matmul path cpuid picked (ops_path_name); NULL else */
    int q8_on_vnni;        /* CPU: q8 matmuls through AVX-512 VNNI */
    int graphs;            /* CUDA: decode steps run as CUDA graphs */
    long graph_launches, graph_instantiations;
    int weight_tensors;
    size_t weight_bytes;  /* as stored in the checkpoint (this rank's slices) */
    size_t widened_bytes; /* CPU: f32 copies made at load */
    int q8;               /* CPU: 8-bit weights */
    size_t q8_bytes, q8_replaced_bytes;
    size_t moved_bytes, huge_page_bytes; /* CPU: matrices moved out of the file's mapping, and
                                          * how much of that is in transparent huge pages */
    size_t device_weight_bytes, device_kv_bytes; /* CUDA: held on the device */
    int tp, tp_rank, kvp, kvp_rank;              /* this rank's place (1, 0: not split) */
    int nccl;                                    /* collectives on NCCL */
};

/* A backend's KV pool now (reference/kv_blocks.h: blocks of KV_BLOCK positions). */
struct stage_kv_usage {
    enum ops_dtype dtype; /* what it stores */
    int blocks;           /* the pool */
    int free;             /* neither held by a request nor cached */
    int cached;           /* kept for prefix reuse, held by no request (taken when needed) */
    int promised;         /* of the free ones, reserved by running requests */
    int block_positions;  /* positions per block (KV_BLOCK) */
    size_t block_bytes;   /* K and V of one block, every layer and kv head held */
};

/* The operations a backend provides. All are required but `argmax`. */
struct stage_backend_i {
    /* hidden [n, H] = embedding rows of tokens [n]; STRATA_ERANGE for an id outside
     * [0, V). Only called on a backend with the embedding. */
    int (*embed)(struct stage_backend *be, float *hidden, const int32_t *tokens, int n);
    /* Runs the owned layers in place over hidden [sum n_tokens, H] (rows in item order),
     * with each item's M-RoPE positions, DeepStack features and visual mask, appending
     * each item's keys and values to its KV slot. STRATA_ERANGE when an item does not
     * continue its slot exactly or would overflow it. */
    int (*forward)(struct stage_backend *be, float *hidden, const struct forward_item *items,
                   int n_items);
    /* logits [n, V] = lm_head(final_norm(hidden [n, H])); only with the head. */
    int (*logits)(struct stage_backend *be, float *logits, const float *hidden, int n);
    /* Optional (NULL: stage_backend_argmax takes the logits and reference/sampler.h's argmax
     * on the host). ids [n] = argmax (reference/sampler.h: the first maximal index) of each
     * row of logits(hidden [n, H]), equal to argmax of what `logits` returns; a device
     * computes it where the logits are and sends back n ids instead of n x V floats; a
     * vocab-parallel head (TP) picks them without assembling the logits. */
    int (*argmax)(struct stage_backend *be, int32_t *ids, const float *hidden, int n);
    /* Claims a free KV slot (0 positions, no blocks); STRATA_EBUSY when all are in use. */
    int (*kv_acquire)(struct stage_backend *be, int *slot);
    /* Promises slot the blocks its first `positions` positions (global: a KVP rank counts
     * its share of them) need beyond those it holds, so that its forwards never find the
     * pool full; STRATA_EBUSY naming the counts when the pool cannot (kv_blocks_reserve).
     * Slot -1 only asks whether a new request's reservation would succeed now. */
    int (*kv_reserve)(struct stage_backend *be, int slot, int positions);
    /* Frees a slot: its blocks return to the pool at once, its reservation lapses. */
    void (*kv_release)(struct stage_backend *be, int slot);
    /* Keeps slot's first `positions` positions (global under KVP; at most what it holds,
     * STRATA_ERANGE else) and drops the rest: the rows of draft tokens a speculative
     * verification rejected. The slot keeps its blocks; the next forward continues there. */
    int (*kv_truncate)(struct stage_backend *be, int slot, int positions);
    /* Bytes of KV storage held (the whole pool). */
    size_t (*kv_bytes)(const struct stage_backend *be);
    /* The pool's blocks now. */
    void (*kv_usage)(const struct stage_backend *be, struct stage_kv_usage *out);
    /* Prefix reuse (reference/kv_blocks.h): keys [n] are a sequence's full blocks' keys in
     * block order (global: a KVP rank uses those of its range). lookup: how many lead with
     * blocks this backend could attach (0 where it cannot tell, e.g. a KVP group's leader,
     * whose ranks hold other blocks), *cached those of them not held (attaching takes them
     * from what is available). attach: gives a fresh slot those blocks; returns the
     * positions the slot then holds (n x KV_BLOCK when every one was there), or a negative
     * status. register: before a release, keeps slot's blocks of keys [n] (all written). */
    int (*kv_lookup)(const struct stage_backend *be, const uint64_t *keys, int n, int *cached);
    int (*kv_attach)(struct stage_backend *be, int slot, const uint64_t *keys, int n);
    void (*kv_register)(struct stage_backend *be, int slot, const uint64_t *keys, int n);
    /* Forgets every key: no block is attached again until registered anew (stage 0 after a
     * later stage missed one); cached blocks become free. */
    void (*kv_forget)(struct stage_backend *be);
    /* Packs in-use slots [n] into `out` (owned by `out` afterwards: kv_handoff_free). */
    int (*kv_pack)(struct stage_backend *be, struct kv_handoff *out, const int *slots, int n);
    /* Replaces in-use slots [n] with rows of `in` bit for bit; refuses another layer range
     * (STRATA_ERANGE), another KV shape (STRATA_EFORMAT) or too many positions. */
    int (*kv_restore)(struct stage_backend *be, const int *slots, int n,
                      const struct kv_handoff *in);
    /* Fills *out (zeroed by the caller). */
    void (*describe)(const struct stage_backend *be, struct stage_backend_info *out);
    /* The stage has no work queued and waits for a frame (may be NULL): in a pipeline that
     * wait is other stages' whole steps, so threads that spin for the next job would only
     * take the cores from the stage that computes now (the CPU backend parks its pool). */
    void (*idle)(struct stage_backend *be);
    /* Frees the context (weights, scratch, KV); the stage_backend itself is freed by
     * stage_backend_free. */
    void (*free)(struct stage_backend *be);
};

struct stage_backend {
    const struct stage_backend_i *iface;
    void *context;
    const char *device_kind;        /* "cpu", "cuda" */
    const struct model_config *cfg; /* borrowed: outlives the backend */
    struct stage_role role;         /* owned layers and roles: the one owner of this fact */
    int max_seq;                    /* KV positions a slot may hold (a request's cap) */
    int num_slots;                  /* KV slots = concurrent requests */
};

/* What to open: a role of a model on a device. */
struct stage_backend_options {
    const struct model_config *cfg;    /* borrowed: must outlive the backend */
    const struct safetensors *weights; /* borrowed: only read while opening */
    struct stage_role role;
    const char *device; /* "cpu" (default when NULL), "cuda" or "cuda:N" */
    int num_threads;    /* CPU worker threads (>= 1) */
    int max_seq;        /* KV positions a slot may hold (>= 1) */
    int num_slots;      /* KV slots (>= 1) */
    /* The KV pool's budget (K and V of every layer and kv head this rank holds): as many
     * whole blocks as fit, at least one slot's max_seq. kv_memory bytes, or when
     * kv_memory_fraction > 0 that share of the memory free once the weights are loaded
     * (host or device). Both 0: enough for every slot to hold max_seq positions. */
    size_t kv_memory;
    double kv_memory_fraction;
    /* What the KV cache stores: OPS_F32 (0, the exact mode), OPS_BF16 or OPS_F16 (half the
     * bytes; reference/kv_cache.h). */
    enum ops_dtype kv_dtype;
    /* NULL or tp 1: the whole role. Else only this rank's shard of it is loaded and the
     * layers all-reduce over tp->coll (the CPU backend) or over NCCL sub-groups set up
     * through it (CUDA: one device per rank; --moe split refused with the reason). */
    const struct stage_tp_config *tp;
    /* Weights as computed: NULL or "bf16" (as stored), "q8" (8-bit blocks quantised at load,
     * reference/ops_q8.h; the cpu device only). Anything else is STRATA_EINVAL. */
    const char *weights_dtype;
    /* cpu: 1 keeps the bf16 / f32 matrices in the checkpoint's mapping (page cache, which the
     * kernel can reclaim under memory pressure) instead of moving them into huge-page memory
     * (reference_load_options.weights_in_file: ~25% slower decode here). cuda: ignored. */
    int weights_in_file;
    /* Load progress (runtime/base/progress.h; fn NULL: none), over the stored bytes of the
     * role's tensors (this rank's slices under TP). cpu: reference_load_options.progress's
     * phases; cuda: "uploading to the device", a report per tensor uploaded. */
    struct strata_progress progress;
};

/* Opens the backend the device names. The role must lie within the model
 * (STRATA_ERANGE otherwise); an unknown device is STRATA_EINVAL; a device this build or
 * machine cannot run is STRATA_EDEVICE with the reason (e.g. a build without the CUDA
 * backend). Weights missing from the checkpoint: STRATA_ENOTFOUND / STRATA_EFORMAT. */
int stage_backend_open(struct stage_backend **out, const struct stage_backend_options *opt);
void stage_backend_free(struct stage_backend *be); /* accepts NULL */

/* A kind of backend, registered by the name a device string starts with ("cpu", "cuda";
 * runtime/base/cli.h cli_parse_device) from the backend's own Bazel target when the build
 * links it (a constructor: the targets are alwayslink), so this module knows no device and
 * a build without the CUDA toolkit simply has no "cuda" kind. */
/* Capabilities: Q8 runs --weights-dtype q8; TIMING computes nothing and needs no weights
 * (the simulator's timing-only stages, sim/backend_timing.c: its device string is the bare
 * name, which no binary's --device parser accepts). */
enum { STAGE_BACKEND_Q8 = 1, STAGE_BACKEND_TIMING = 2 };

struct stage_backend_kind {
    const char *name;
    unsigned caps;
    /* Opens the backend on opt->device (its kind's name, maybe with ":N"); the options are
     * checked here first. STRATA_EDEVICE "device '...' is not available: <why>" when this
     * machine lacks the device. */
    int (*open)(struct stage_backend **out, const struct stage_backend_options *opt);
};

/* Adds a kind (at most 8; a second kind of one name replaces the first). */
void stage_backend_register(const struct stage_backend_kind *kind);

/* The calls, checked against the role (embed needs the embedding, logits the head). */
int stage_backend_embed(struct stage_backend *be, float *hidden, const int32_t *tokens, int n);
int stage_backend_forward(struct stage_backend *be, float *hidden, const struct forward_item *items,
                          int n_items);
int stage_backend_logits(struct stage_backend *be, float *logits, const float *hidden, int n);
/* ids [n] = greedy tokens of hidden [n, H] (argmax of the logits rows); `logits` [n, V] is
 * host scratch for backends without a device argmax (its content is unspecified after). */
int stage_backend_argmax(struct stage_backend *be, int32_t *ids, const float *hidden, int n,
                         float *logits);
int stage_backend_kv_acquire(struct stage_backend *be, int *slot);
int stage_backend_kv_reserve(struct stage_backend *be, int slot, int positions);
void stage_backend_kv_release(struct stage_backend *be, int slot);
int stage_backend_kv_truncate(struct stage_backend *be, int slot, int positions);
size_t stage_backend_kv_bytes(const struct stage_backend *be);
void stage_backend_kv_usage(const struct stage_backend *be, struct stage_kv_usage *out);
int stage_backend_kv_lookup(const struct stage_backend *be, const uint64_t *keys, int n,
                            int *cached);
int stage_backend_kv_attach(struct stage_backend *be, int slot, const uint64_t *keys, int n);
void stage_backend_kv_register(struct stage_backend *be, int slot, const uint64_t *keys, int n);
void stage_backend_kv_forget(struct stage_backend *be);
void stage_backend_idle(struct stage_backend *be); /* the table's idle, when it has one */
/* *blocks = the whole blocks of block_bytes that the options' budget holds, free_bytes being
 * what a fraction is of (no budget: 0, kv_blocks_init's default of every slot at max_seq);
 * STRATA_ERANGE naming the sizes when that is less than one request of max_seq positions
 * needs. */
int stage_backend_kv_blocks(const struct stage_backend_options *opt, size_t free_bytes,
                            size_t block_bytes, int max_seq, int *blocks);

/* --kv-memory's value: a size ("64M", "12G": K/M/G/T powers of 1024, as strata-plan --mem)
 * into *bytes, or a percentage ("50%", of the memory free after loading) into *fraction;
 * STRATA_EINVAL naming the text. */
int stage_backend_parse_kv_memory(const char *text, size_t *bytes, double *fraction);

/* MemAvailable of /proc/meminfo in bytes (0 when unknown). */
size_t stage_host_available_bytes(void);
int stage_backend_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots,
                          int n);
int stage_backend_kv_restore(struct stage_backend *be, const int *slots, int n,
                             const struct kv_handoff *in);
void stage_backend_info(const struct stage_backend *be, struct stage_backend_info *out);
/* The startup summary's lines about the backend, from its info: "device: ..." (kind,
 * threads or device), for the CPU "kernels: ...", and "weights: ..." (tensors, bytes, the
 * rank's place), separated by newlines. */
void stage_backend_describe(const struct stage_backend *be, char *buf, size_t cap);
/* The "device: " line's words alone ("cpu, 4 threads", "cuda:0, <device>, decode graphs
 * on (...)"), what a ring describe lists per stage. */
void stage_backend_device_words(const struct stage_backend_info *info, char *buf, size_t cap);

#endif
