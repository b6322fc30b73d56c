/* test-backend-ops for Strata: runs every case of bo_cases (op_cases.c) on each backend.
 *
 *   cpu   the reference itself. Each case runs twice, once on a 1-thread pool with the
 *         CPU-detected dot product and outputs pre-filled with zeros, once on a 3-thread
 *         pool with the portable dot product and outputs pre-filled with NaN; the outputs
 *         must be bitwise equal (ops.h promises thread-count and code-path independence,
 *         and a NaN leaking through means an op read an output it had not written).
 *   cuda  each op in the CUDA backend's table (backend_cuda.c) against the reference op,
 *         judged by NMSE = sum (a-b)^2 / sum b^2 < the op's bound. Ops the table lacks are
 *         reported "not implemented on cuda" and are not passes. Without a device or the
 *         toolkit it prints "skipped: cuda: <reason>".
 *   selftest  the harness itself (backend_selftest.c): the reference through the backend
 *         path must pass and deliberately broken ops must fail.
 *
 * Whole stage backends (runtime/stage/backend.h) are checked by golden_backends_test.c
 * next to this file: every golden case through each device's backend, one target each.
 *
 * usage: backend_ops_test [--backend=LIST] [--op=NAME], LIST a comma-separated subset of
 * cpu,selftest,cuda or "all" (the default); exit 1 on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/ops.h"
#include "reference/thread_pool.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status.h"
#include "tests/backend_ops/backend_ops.h"

/* The buffers of one call, in host memory. */
struct host_bufs {
    int count;
    struct bo_buf desc[BO_MAX_BUFS];
    void *data[BO_MAX_BUFS];
};

static uint64_t rng_state;

static float uniform(void) { /* splitmix64 -> [-1, 1) */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)(z >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static size_t buf_bytes(const struct bo_buf *b) {
    return b->count * (b->elem == BO_BF16 || b->elem == BO_F16 ? sizeof(uint16_t)
                                                               : sizeof(float)); /* I32: 4 */
}

static int is_output(const struct bo_buf *b) {
    return b->role != BO_IN;
}

static void free_bufs(struct host_bufs *h) {
    for (int i = 0; i < h->count; ++i)
        free(h->data[i]);
    h->count = 0;
}

/* Fills every input with the case's random values (seeded by the case index, so each case
 * is reproducible on its own) and every pure output with `fill` bit patterns. */
static int make_bufs(struct host_bufs *h, const struct bo_op *op, const struct bo_case *c,
                     uint64_t seed, uint32_t fill) {
    memset(h, 0, sizeof *h);
    h->count = op->layout(&c->shape, h->desc);
    rng_state = seed * 0x2545f4914f6cdd1dULL + 1;
    float scale = c->shape.scale != 0.0f ? c->shape.scale : 1.0f;
    for (int i = 0; i < h->count; ++i) {
        const struct bo_buf *b = &h->desc[i];
        if (!(h->data[i] = malloc(buf_bytes(b) ? buf_bytes(b) : 1))) {
            h->count = i;
            free_bufs(h);
            return strata_set_error(STRATA_ENOMEM, "buffer %s", b->name);
        }
        if (b->gen == BO_GEN_KV_TABLE) { /* not random: every backend gets the same table */
            bo_kv_table(&c->shape, h->data[i]);
            continue;
        }
        for (size_t k = 0; k < b->count; ++k) {
            float v = b->gen == BO_GEN_ACT      ? scale * uniform()
                      : b->gen == BO_GEN_WEIGHT ? 1.0f + 0.5f * uniform()
                                                : uniform();
            if (b->role == BO_OUT) memcpy(&v, &fill, sizeof v);
            if (b->elem == BO_I32)
                memcpy((int32_t *)h->data[i] + k, &v, sizeof v); /* output fill bits */
            else if (b->elem == BO_BF16)
                ((uint16_t *)h->data[i])[k] = f32_to_bf16(v);
            else if (b->elem == BO_F16)
                ((uint16_t *)h->data[i])[k] = f32_to_f16(v);
            else
                ((float *)h->data[i])[k] = v;
        }
    }
    return 0;
}

static void case_label(char *out, size_t cap, const struct bo_case *c) {
    const struct bo_shape *s = &c->shape;
    const struct {
        const char *name;
        int v;
    } f[] = {{"n", s->n},         {"dim", s->dim},           {"rows", s->rows},
             {"heads", s->heads}, {"kv_heads", s->kv_heads}, {"pos", s->pos}};
    int len = snprintf(out, cap, "%s(", c->op);
    const char *sep = "";
    for (size_t i = 0; i < sizeof f / sizeof f[0]; ++i)
        if (f[i].v || (i == 5 && !strcmp(c->op, "attention"))) {
            len += snprintf(out + len, cap - (size_t)len, "%s%s=%d", sep, f[i].name, f[i].v);
            sep = ",";
        }
    if (!strcmp(c->op, "matmul") || !strcmp(c->op, "matmul_split") ||
        !strcmp(c->op, "ops_weight_row"))
        len +=
            snprintf(out + len, cap - (size_t)len, ",w=%s", s->wtype == OPS_BF16 ? "bf16" : "f32");
    if (!strncmp(c->op, "attention", 9) && s->wtype != OPS_F32)
        len +=
            snprintf(out + len, cap - (size_t)len, ",kv=%s", s->wtype == OPS_BF16 ? "bf16" : "f16");
    if (s->scale != 0.0f && s->scale != 1.0f)
        len += snprintf(out + len, cap - (size_t)len, ",scale=%g", (double)s->scale);
    snprintf(out + len, cap - (size_t)len, ")");
}

static const struct bo_op *find_op(const char *name) {
    for (size_t i = 0; i < bo_n_ops; ++i)
        if (!strcmp(bo_ops[i].name, name)) return &bo_ops[i];
    return NULL;
}

static int call_reference(const struct bo_op *op, const struct bo_case *c, struct host_bufs *h,
                          struct thread_pool *pool) {
    struct bo_call call = {.s = &c->shape};
    for (int i = 0; i < h->count; ++i)
        call.buf[i] = h->data[i];
    return op->reference(&call, pool);
}

/* ---------------------------------------------------------------- cpu: determinism */

struct pools {
    struct thread_pool *one, *three;
};

#define NAN_BITS 0x7fc00000u

/* 1 when both runs give bitwise-equal outputs. */
static int cpu_case(const struct bo_op *op, const struct bo_case *c, uint64_t seed,
                    const struct pools *p) {
    char label[160];
    case_label(label, sizeof label, c);
    struct host_bufs a, b;
    if (make_bufs(&a, op, c, seed, 0u)) goto oom;
    if (make_bufs(&b, op, c, seed, NAN_BITS)) {
        free_bufs(&a);
        goto oom;
    }
    ops_force_portable(0);
    int rc = call_reference(op, c, &a, p->one);
    ops_force_portable(1);
    if (!rc) rc = call_reference(op, c, &b, p->three);
    ops_force_portable(0);
    int ok = !rc;
    const char *bad = "";
    for (int i = 0; ok && i < a.count; ++i)
        if (is_output(&a.desc[i]) && memcmp(a.data[i], b.data[i], buf_bytes(&a.desc[i]))) {
            ok = 0;
            bad = a.desc[i].name;
        }
    if (rc)
        printf("  %-50s FAIL: %s\n", label, strata_last_error());
    else if (ok)
        printf("  %-50s OK (bitwise)\n", label);
    else
        printf("  %-50s FAIL: output %s differs between the runs\n", label, bad);
    free_bufs(&a);
    free_bufs(&b);
    return ok;
oom:
    printf("  %-50s FAIL: %s\n", label, strata_last_error());
    return 0;
}

/* ---------------------------------------------------------------- other backends: NMSE */

static double nmse(const float *a, const float *b, size_t n) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = (double)a[i] - (double)b[i];
        err += d * d;
        ref += (double)b[i] * (double)b[i];
    }
    return ref > 0 ? err / ref : err;
}

/* Copies h into fresh backend buffers, runs the backend's op, and copies the outputs back
 * into got (a copy of h). */
static int backend_call(const struct bo_backend *be, const struct bo_backend_op *bop,
                        const struct bo_case *c, const struct host_bufs *h, struct host_bufs *got) {
    struct bo_call call = {.s = &c->shape};
    int rc = 0, i;
    for (i = 0; i < h->count && !rc; ++i)
        if (!(rc = be->alloc(&call.buf[i], buf_bytes(&h->desc[i]))))
            rc = be->upload(call.buf[i], h->data[i], buf_bytes(&h->desc[i]));
    if (!rc) rc = bop->run(&call, NULL);
    if (!rc) rc = be->synchronize();
    for (i = 0; i < h->count && !rc; ++i)
        if (is_output(&h->desc[i]))
            rc = be->download(got->data[i], call.buf[i], buf_bytes(&h->desc[i]));
    for (i = 0; i < h->count; ++i)
        be->free(call.buf[i]);
    return rc;
}

/* 1 when every output is within the op's NMSE bound of the reference's. */
static int backend_case(const struct bo_backend *be, const struct bo_backend_op *bop,
                        const struct bo_op *op, const struct bo_case *c, uint64_t seed,
                        const struct pools *p) {
    char label[160];
    case_label(label, sizeof label, c);
    struct host_bufs want, got;
    /* Outputs start as NaN on the device too, so an element the kernel skips fails. */
    if (make_bufs(&want, op, c, seed, NAN_BITS)) goto fail;
    if (make_bufs(&got, op, c, seed, NAN_BITS)) {
        free_bufs(&want);
        goto fail;
    }
    int rc = backend_call(be, bop, c, &got, &got);
    if (!rc) rc = call_reference(op, c, &want, p->three);
    double worst = 0;
    for (int i = 0; !rc && i < want.count; ++i)
        if (is_output(&want.desc[i])) {
            /* Integer outputs (expert ids) must be equal: any difference is an infinite error. */
            double e =
                want.desc[i].elem == BO_I32
                    ? (memcmp(got.data[i], want.data[i], buf_bytes(&want.desc[i])) ? INFINITY : 0.0)
                    : nmse(got.data[i], want.data[i], want.desc[i].count);
            worst = isnan(e) || e > worst ? e : worst;
        }
    free_bufs(&want);
    free_bufs(&got);
    if (rc) goto fail;
    int ok = worst < op->max_nmse; /* false for NaN */
    printf("  %-50s nmse=%.3e %s %.0e %s\n", label, worst, ok ? "<" : ">=", op->max_nmse,
           ok ? "OK" : "FAIL");
    return ok;
fail:
    printf("  %-50s FAIL: %s\n", label, strata_last_error());
    return 0;
}

/* ---------------------------------------------------------------- passes */

struct tally {
    int passed, failed, not_implemented;
};

static int selected(const char *only_op, const char *op) {
    return !only_op || !strcmp(only_op, op);
}

static void run_cpu(const char *only_op, const struct pools *p, struct tally *t) {
    printf("backend cpu: the reference; each case twice (1 thread + detected dot product, "
           "3 threads + portable dot product), bitwise equal\n");
    for (size_t i = 0; i < bo_n_cases; ++i) {
        if (!selected(only_op, bo_cases[i].op)) continue;
        int ok = cpu_case(find_op(bo_cases[i].op), &bo_cases[i], i, p);
        ok ? ++t->passed : ++t->failed;
    }
}

static const struct bo_backend_op *backend_op(const struct bo_backend *be, const char *name) {
    for (size_t i = 0; i < be->n_ops; ++i)
        if (!strcmp(be->ops[i].op, name)) return &be->ops[i];
    return NULL;
}

/* Ops in bo_ops order; the cases of each op in table order. */
static void run_backend(const struct bo_backend *be, const char *only_op, const struct pools *p,
                        struct tally *t) {
    char reason[256];
    if (!be->available(reason, sizeof reason)) {
        printf("skipped: %s: %s\n", be->name, reason);
        return;
    }
    printf("backend %s: %s; NMSE against the reference op\n", be->name, reason);
    for (size_t o = 0; o < bo_n_ops; ++o) {
        const struct bo_op *op = &bo_ops[o];
        if (!selected(only_op, op->name)) continue;
        const struct bo_backend_op *bop = backend_op(be, op->name);
        if (!bop) {
            printf("  %-50s not implemented on %s\n", op->name, be->name);
            ++t->not_implemented;
            continue;
        }
        for (size_t i = 0; i < bo_n_cases; ++i) {
            if (strcmp(bo_cases[i].op, op->name)) continue;
            int ok = backend_case(be, bop, op, &bo_cases[i], i, p);
            ok ? ++t->passed : ++t->failed;
        }
    }
}

/* The harness checks itself: the reference through the backend path must pass, the broken
 * backend must fail every case it implements (backend_selftest.c). */
static void run_selftest(const char *only_op, const struct pools *p, struct tally *t) {
    struct tally host = {0, 0, 0}, broken = {0, 0, 0};
    run_backend(&bo_backend_host, only_op, p, &host);
    run_backend(&bo_backend_broken, only_op, p, &broken);
    printf("selftest: host %d/%d passed, broken %d/%d failed as they must\n", host.passed,
           host.passed + host.failed, broken.failed, broken.passed + broken.failed);
    t->passed += host.passed + broken.failed;
    t->failed += host.failed + broken.passed;
}

/* --backend takes a comma-separated list; "all" names every backend. */
static int wants(const char *list, const char *name) {
    size_t len = strlen(name);
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if ((n == 3 && !strncmp(p, "all", 3)) || (n == len && !strncmp(p, name, len))) return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* A case or backend row naming an op that bo_ops lacks is a typo in a table. */
static int check_tables(const struct bo_backend *const *backends, size_t n_backends) {
    int bad = 0;
    for (size_t i = 0; i < bo_n_cases; ++i)
        if (!find_op(bo_cases[i].op)) bad = printf("FAIL: case of unknown op %s\n", bo_cases[i].op);
    for (size_t b = 0; b < n_backends; ++b)
        for (size_t i = 0; i < backends[b]->n_ops; ++i)
            if (!find_op(backends[b]->ops[i].op))
                bad = printf("FAIL: %s lists unknown op %s\n", backends[b]->name,
                             backends[b]->ops[i].op);
    return bad ? 0 : 1;
}

int main(int argc, char **argv) {
    static const struct bo_backend *const backends[] = {&bo_backend_cuda, &bo_backend_host,
                                                        &bo_backend_broken};
    const size_t n_backends = sizeof backends / sizeof backends[0];
    const char *only_backend = "all", *only_op = NULL;
    for (int i = 1; i < argc; ++i) {
        if (!strncmp(argv[i], "--backend=", 10))
            only_backend = argv[i] + 10;
        else if (!strncmp(argv[i], "--op=", 5))
            only_op = argv[i] + 5;
        else {
            fprintf(stderr, "usage: %s [--backend=cpu,selftest,cuda|all] [--op=NAME]\n", argv[0]);
            return 2;
        }
    }
    if (!check_tables(backends, n_backends)) return 1;
    struct pools p;
    if (thread_pool_init(&p.one, 1) || thread_pool_init(&p.three, 3)) {
        fprintf(stderr, "thread pool: %s\n", strata_last_error());
        return 1;
    }
    struct tally t = {0, 0, 0};
    int ran = 0;
    if (wants(only_backend, "cpu")) run_cpu(only_op, &p, &t), ran = 1;
    if (wants(only_backend, "selftest")) run_selftest(only_op, &p, &t), ran = 1;
    if (wants(only_backend, "cuda")) run_backend(&bo_backend_cuda, only_op, &p, &t), ran = 1;
    thread_pool_free(p.one);
    thread_pool_free(p.three);
    if (!ran) {
        fprintf(stderr, "no known backend in %s\n", only_backend);
        return 2;
    }
    printf("%d passed, %d failed, %d op(s) not implemented\n", t.passed, t.failed,
           t.not_implemented);
    return t.failed ? 1 : 0;
}
