/* Backend selection by device and the role-checked calls; see backend.h. */
#include "runtime/stage/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/sampler.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"

static int check_role(const struct stage_backend_options *opt) {
    int rc = stage_role_check(&opt->role, opt->cfg->num_layers, 0, 0);
    if (rc < 0) return rc;
    if (opt->max_seq < 1 || opt->num_slots < 1 || opt->num_threads < 1)
        return strata_set_error(STRATA_EINVAL,
                                "max_seq (%d), KV slots (%d) and threads (%d) must be >= 1",
                                opt->max_seq, opt->num_slots, opt->num_threads);
    return 0;
}

int stage_backend_open(struct stage_backend **out, const struct stage_backend_options *opt) {
    const char *device = opt->device ? opt->device : "cpu";
    *out = NULL;
    if (!opt->cfg || !opt->weights)
        return strata_set_error(STRATA_EINVAL, "stage backend needs a config and weights");
    struct cli_device dev;
    int rc = cli_parse_device(device, &dev);
    if (rc == 0) rc = check_role(opt);
    if (rc < 0) return rc;
    const char *wd = opt->weights_dtype ? opt->weights_dtype : "bf16";
    if (strcmp(wd, "bf16") != 0 && strcmp(wd, "q8") != 0)
        return strata_set_error(STRATA_EINVAL, "unknown weights dtype '%s' (bf16 or q8)", wd);
    if (strcmp(wd, "q8") == 0 && dev.kind != CLI_DEVICE_CPU)
        return strata_set_error(STRATA_EINVAL,
                                "weights dtype q8 runs on the cpu device only, not '%s'", device);
    if (dev.kind == CLI_DEVICE_CPU) return backend_cpu_open(out, opt);
    /* CUDA (backend_cuda.c): STRATA_EDEVICE "device '...' is not available: <reason>" in a
     * build without the toolkit or on a machine without that device, never a silent
     * fallback to the CPU. Under TP / KVP its collectives run on NCCL (backend_cuda_tp.c;
     * MoE layers by whole experts only: --moe split is refused at open with the reason). */
    return backend_cuda_open(out, opt);
}

void stage_backend_free(struct stage_backend *be) {
    if (!be) return;
    be->iface->free(be);
    free(be);
}

int stage_backend_embed(struct stage_backend *be, float *hidden, const int32_t *tokens, int n) {
    if (!be->role.with_embed)
        return strata_set_error(STRATA_EINVAL, "this stage does not hold the embedding");
    return be->iface->embed(be, hidden, tokens, n);
}

int stage_backend_forward(struct stage_backend *be, float *hidden, const struct forward_item *items,
                          int n_items) {
    return be->iface->forward(be, hidden, items, n_items);
}

int stage_backend_logits(struct stage_backend *be, float *logits, const float *hidden, int n) {
    if (!be->role.with_head)
        return strata_set_error(STRATA_EINVAL, "this stage does not hold the lm_head");
    return be->iface->logits(be, logits, hidden, n);
}

int stage_backend_argmax(struct stage_backend *be, int32_t *ids, const float *hidden, int n,
                         float *logits) {
    if (!be->role.with_head)
        return strata_set_error(STRATA_EINVAL, "this stage does not hold the lm_head");
    if (be->iface->argmax) return be->iface->argmax(be, ids, hidden, n);
    int V = be->cfg->vocab_size, rc = be->iface->logits(be, logits, hidden, n);
    for (int i = 0; i < n && rc == 0; ++i)
        ids[i] = argmax(logits + (size_t)i * (size_t)V, V);
    return rc;
}

int stage_backend_kv_acquire(struct stage_backend *be, int *slot) {
    return be->iface->kv_acquire(be, slot);
}

void stage_backend_kv_release(struct stage_backend *be, int slot) {
    be->iface->kv_release(be, slot);
}

size_t stage_backend_kv_bytes(const struct stage_backend *be) {
    return be->iface->kv_bytes(be);
}

int stage_backend_kv_pack(struct stage_backend *be, struct kv_handoff *out, const int *slots,
                          int n) {
    return be->iface->kv_pack(be, out, slots, n);
}

int stage_backend_kv_restore(struct stage_backend *be, const int *slots, int n,
                             const struct kv_handoff *in) {
    return be->iface->kv_restore(be, slots, n, in);
}

void stage_backend_describe(const struct stage_backend *be, char *buf, size_t cap) {
    be->iface->describe(be, buf, cap);
}
