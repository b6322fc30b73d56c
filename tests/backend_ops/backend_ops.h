/* The backend-ops harness (modelled on llama.cpp's test-backend-ops): every op of every
 * backend is run on random inputs and compared with the CPU reference op of
 * reference/ops.h.
 *
 * Three tables, so that adding an op or a backend is one row each:
 *   - bo_ops (op_cases.c): each reference op once: its buffers for a shape, how to call the
 *     reference on them, and the NMSE bound a backend must meet;
 *   - bo_cases (op_cases.c): the shapes each op is tested on;
 *   - a backend's op table (e.g. backend_cuda.c): which ops it implements and the adapter
 *     that calls its twin (kernels/README.md) on buffers in the backend's memory.
 * The "cpu" backend is the reference itself; it is checked for determinism instead. */
#ifndef STRATA_TESTS_BACKEND_OPS_BACKEND_OPS_H
#define STRATA_TESTS_BACKEND_OPS_BACKEND_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "reference/ops.h"
#include "reference/thread_pool.h"

enum { BO_MAX_BUFS = 6 };

enum bo_role { BO_IN, BO_OUT, BO_INOUT };
/* BO_I32: outputs compared exactly; as an input, only a block table (BO_GEN_KV_TABLE).
 * BO_BF16 / BO_F16: inputs only, drawn in f32 and rounded (runtime/base/dtype.h). */
enum bo_elem { BO_F32, BO_BF16, BO_I32, BO_F16 };

/* How an input buffer is filled (uniform u in [-1, 1), seeded per case). */
enum bo_gen {
    BO_GEN_ACT,      /* scale * u: activations, logits */
    BO_GEN_WEIGHT,   /* 1 + 0.5 u: norm weights (positive, near 1, as in real checkpoints) */
    BO_GEN_UNIT,     /* u: matmul weights, rope cos/sin tables */
    BO_GEN_KV_TABLE, /* an attention case's block table (bo_kv_table), no random draw */
};

/* The shape of one case. Each op reads the fields it needs (see its layout in op_cases.c);
 * unused fields stay 0. */
struct bo_shape {
    int n;                /* rows / tokens / elements */
    int dim;              /* row length: rmsnorm dim, matmul cols (K), head_dim */
    int rows;             /* matmul: weight rows (output features) */
    int heads;            /* rope/attention/qk_norm_rope: query heads */
    int kv_heads;         /* attention/qk_norm_rope: kv heads */
    int pos;              /* attention: cache position of the first query */
    enum ops_dtype wtype; /* matmul weight dtype; attention(_kvp): the KV cache's */
    float eps;
    float scale; /* input magnitude for BO_GEN_ACT (0 means 1) */
};

struct bo_buf {
    const char *name;
    enum bo_role role;
    enum bo_elem elem;
    size_t count; /* elements */
    enum bo_gen gen;
};

/* One op call: the buffers (in the memory of whoever runs it) and the shape. */
struct bo_call {
    void *buf[BO_MAX_BUFS];
    const struct bo_shape *s;
};

struct bo_op {
    const char *name;
    double max_nmse; /* sum (a-b)^2 / sum b^2 bound for a backend against the reference */
    /* Describes the buffers of a call for shape s; returns how many (<= BO_MAX_BUFS). */
    int (*layout)(const struct bo_shape *s, struct bo_buf *bufs);
    /* Calls the reference op; 0 or a negative STRATA_E* (e.g. scratch allocation). */
    int (*reference)(const struct bo_call *call, struct thread_pool *pool);
};

struct bo_case {
    const char *op;
    struct bo_shape shape;
};

/* attention_kvp cases: KV positions per rank (16 x 2^p, `rows` ranks covering pos + n). */
int bo_kvp_tokens(const struct bo_shape *s);

/* attention cases keep their keys and values paged (struct ops_kv, runtime/base/
 * op_contract.h): k_cache and v_cache are pools of bo_kv_pool_blocks(s) blocks
 * [block][kv_heads][OPS_ATTN_BLOCK][dim] (reference/kv_cache.h's layout of one layer), of
 * which the request holds the bo_kv_held_blocks(s) that cover pos + n positions, in the
 * shuffled order bo_kv_table gives (not ascending, not contiguous): where the blocks lie must
 * not change a bit. */
int bo_kv_held_blocks(const struct bo_shape *s);
int bo_kv_pool_blocks(const struct bo_shape *s);
void bo_kv_table(const struct bo_shape *s, int32_t *table); /* [bo_kv_held_blocks(s)] */
/* The view of the case's cache in whoever's memory k, v and table are. */
struct ops_kv bo_kv_view(const struct bo_shape *s, void *k, void *v, const void *table);

extern const struct bo_op bo_ops[];
extern const size_t bo_n_ops;
extern const struct bo_case bo_cases[];
extern const size_t bo_n_cases;

/* One op a backend implements: the adapter calls the backend's twin on call->buf. */
struct bo_backend_op {
    const char *op;
    int (*run)(const struct bo_call *call, void *stream);
};

/* A backend other than the reference: device probe, memory, and its op table. Ops it does
 * not list are reported "not implemented on <name>". */
struct bo_backend {
    const char *name;
    int (*available)(char *reason, size_t cap);
    int (*alloc)(void **ptr, size_t bytes);
    void (*free)(void *ptr);
    int (*upload)(void *dst, const void *src, size_t bytes);
    int (*download)(void *dst, const void *src, size_t bytes);
    int (*synchronize)(void);
    const struct bo_backend_op *ops;
    size_t n_ops;
};

extern const struct bo_backend bo_backend_cuda;
/* Harness self-test (backend_selftest.c): reference ops through the backend path, and
 * deliberately wrong ops that must fail. */
extern const struct bo_backend bo_backend_host;
extern const struct bo_backend bo_backend_broken;

#endif
