/* Backend selection by device and the role-checked calls; see backend.h. */
#include "runtime/stage/backend.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kv_blocks.h"
#include "reference/sampler.h"
#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/model/stage_plan.h"

static int check_role(const struct stage_backend_options *opt) {
    int rc = stage_role_check(&opt->role, opt->cfg->num_layers, 0, 0);
    if (rc < 0) return rc;
    if (opt->max_seq < 1 || opt->num_slots < 1 || opt->num_threads < 1)
        return strata_set_error(STRATA_EINVAL,
                                "max_seq (%d), KV slots (%d) and threads (%d) must be >= 1",
                                opt->max_seq, opt->num_slots, opt->num_threads);
    return 0;
}

enum { MAX_KINDS = 8 };
static const struct stage_backend_kind *kinds[MAX_KINDS];
static int n_kinds;

/* Called from constructors, before main: no threads yet. */
void stage_backend_register(const struct stage_backend_kind *kind) {
    for (int i = 0; i < n_kinds; ++i)
        if (strcmp(kinds[i]->name, kind->name) == 0) {
            kinds[i] = kind;
            return;
        }
    if (n_kinds < MAX_KINDS) kinds[n_kinds++] = kind;
}

static const struct stage_backend_kind *stage_backend_find(const char *name) {
    for (int i = 0; i < n_kinds; ++i)
        if (strcmp(kinds[i]->name, name) == 0) return kinds[i];
    return NULL;
}

int stage_backend_open(struct stage_backend **out, const struct stage_backend_options *opt) {
    const char *device = opt->device ? opt->device : "cpu";
    *out = NULL;
    const struct stage_backend_kind *timing = stage_backend_find(device);
    if (timing && !(timing->caps & STAGE_BACKEND_TIMING)) timing = NULL;
    if (!opt->cfg || (!opt->weights && !timing))
        return strata_set_error(STRATA_EINVAL, "stage backend needs a config and weights");
    struct cli_device dev;
    int rc = timing ? 0 : cli_parse_device(device, &dev);
    if (rc == 0) rc = check_role(opt);
    if (rc < 0) return rc;
    const char *wd = opt->weights_dtype ? opt->weights_dtype : "bf16";
    if (strcmp(wd, "bf16") != 0 && strcmp(wd, "q8") != 0)
        return strata_set_error(STRATA_EINVAL, "unknown weights dtype '%s' (bf16 or q8)", wd);
    /* The kind is the device string up to its ':' (cli_parse_device accepted it). */
    char name[16];
    const size_t len = strcspn(device, ":");
    snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), device);
    const struct stage_backend_kind *kind = stage_backend_find(name);
    if (!kind)
        return strata_set_error(STRATA_EDEVICE,
                                "device '%s' is not available: this build has no %s backend "
                                "(built without its toolkit)",
                                device, name);
    if (strcmp(wd, "q8") == 0 && !(kind->caps & STAGE_BACKEND_Q8))
        return strata_set_error(STRATA_EINVAL,
                                "weights dtype q8 runs on the cpu device only, not '%s'", device);
    /* Never a silent fallback to another device: a kind that cannot open says why. */
    return kind->open(out, opt);
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

int stage_backend_kv_reserve(struct stage_backend *be, int slot, int positions) {
    return be->iface->kv_reserve(be, slot, positions);
}

void stage_backend_kv_release(struct stage_backend *be, int slot) {
    be->iface->kv_release(be, slot);
}

void stage_backend_kv_usage(const struct stage_backend *be, struct stage_kv_usage *out) {
    memset(out, 0, sizeof *out);
    be->iface->kv_usage(be, out);
}

int stage_backend_kv_lookup(const struct stage_backend *be, const uint64_t *keys, int n,
                            int *cached) {
    *cached = 0;
    return n > 0 ? be->iface->kv_lookup(be, keys, n, cached) : 0;
}

int stage_backend_kv_attach(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    return n > 0 ? be->iface->kv_attach(be, slot, keys, n) : 0;
}

void stage_backend_kv_register(struct stage_backend *be, int slot, const uint64_t *keys, int n) {
    if (n > 0) be->iface->kv_register(be, slot, keys, n);
}

int stage_backend_kv_truncate(struct stage_backend *be, int slot, int positions) {
    return be->iface->kv_truncate(be, slot, positions);
}

void stage_backend_kv_forget(struct stage_backend *be) {
    be->iface->kv_forget(be);
}

void stage_backend_idle(struct stage_backend *be) {
    if (be->iface->idle) be->iface->idle(be);
}

int stage_backend_kv_blocks(const struct stage_backend_options *opt, size_t free_bytes,
                            size_t block_bytes, int max_seq, int *blocks) {
    const long long per_slot = kv_blocks_for(max_seq);
    const size_t budget = opt->kv_memory_fraction > 0
                              ? (size_t)((double)free_bytes * opt->kv_memory_fraction)
                              : opt->kv_memory;
    *blocks = 0; /* kv_blocks_init's own default */
    if (budget == 0 && opt->kv_memory_fraction <= 0) return 0;
    const unsigned long long n = block_bytes ? budget / block_bytes : (unsigned long long)per_slot;
    if (n < (unsigned long long)per_slot)
        return strata_set_error(STRATA_ERANGE,
                                "a KV budget of %zu bytes holds %llu blocks of %zu bytes (%d "
                                "positions each); one request of --max-seq %d needs %lld",
                                budget, n, block_bytes, KV_BLOCK, max_seq, per_slot);
    *blocks = n > INT32_MAX ? INT32_MAX : (int)n;
    return 0;
}

int stage_backend_parse_kv_memory(const char *text, size_t *bytes, double *fraction) {
    *bytes = 0;
    *fraction = 0;
    const size_t n = text ? strlen(text) : 0;
    if (n > 1 && text[n - 1] == '%') {
        char *end;
        const double pct = strtod(text, &end);
        if (end == text + n - 1 && pct > 0 && pct <= 100) {
            *fraction = pct / 100;
            return 0;
        }
    } else {
        uint64_t size;
        if (n && stage_plan_parse_size(&size, text) == 0 && size > 0 && size <= SIZE_MAX) {
            *bytes = (size_t)size;
            return 0;
        }
    }
    return strata_set_error(STRATA_EINVAL,
                            "--kv-memory '%s': expected a size such as 64M or 12G, or a "
                            "percentage of free memory such as 50%%",
                            text ? text : "");
}

size_t stage_host_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    return (size_t)kib * 1024;
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

void stage_backend_info(const struct stage_backend *be, struct stage_backend_info *out) {
    memset(out, 0, sizeof *out);
    out->device_index = -1;
    out->tp = out->kvp = 1;
    be->iface->describe(be, out);
}

/* snprintf at *used into buf, keeping *used within cap. */
static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...) {
    va_list ap;
    if (*used >= cap) return;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, cap - *used, fmt, ap);
    va_end(ap);
    if (n > 0) *used = *used + (size_t)n < cap ? *used + (size_t)n : cap - 1;
}

void stage_backend_device_words(const struct stage_backend_info *i, char *buf, size_t cap) {
    size_t used = 0;
    if (cap) buf[0] = 0;
    if (i->device_index < 0) { /* the host */
        append(buf, cap, &used, "%s, %d thread%s", i->kind, i->threads, i->threads == 1 ? "" : "s");
        return;
    }
    append(buf, cap, &used, "%s:%d, %s, ", i->kind, i->device_index,
           i->device_name[0] ? i->device_name : "?");
    if (i->graphs)
        append(buf, cap, &used, "decode graphs on (%ld launched, %ld instantiated)",
               i->graph_launches, i->graph_instantiations);
    else
        append(buf, cap, &used, "decode graphs off");
}

void stage_backend_describe(const struct stage_backend *be, char *buf, size_t cap) {
    struct stage_backend_info i;
    char words[512];
    size_t used = 0;
    stage_backend_info(be, &i);
    stage_backend_device_words(&i, words, sizeof words);
    if (cap) buf[0] = 0;
    append(buf, cap, &used, "device: %s\n", words);
    if (i.kernels)
        append(buf, cap, &used, "kernels: %s%s (every path gives the same bits)\n", i.kernels,
               i.q8_on_vnni ? " (q8 on VNNI)" : "");
    if (i.device_index < 0)
        append(buf, cap, &used, "weights: %d tensors, %zu bytes (+%zu bytes widened)",
               i.weight_tensors, i.weight_bytes, i.widened_bytes);
    else
        append(buf, cap, &used,
               "weights: %d tensors, %zu bytes (%zu bytes on the device), KV %zu bytes on the "
               "device",
               i.weight_tensors, i.weight_bytes, i.device_weight_bytes, i.device_kv_bytes);
    if (i.tp > 1 || i.kvp > 1)
        append(buf, cap, &used, ", TP shard %d of %d, KVP rank %d of %d%s", i.tp_rank, i.tp,
               i.kvp_rank, i.kvp, i.nccl ? " (NCCL)" : "");
    if (i.q8)
        append(buf, cap, &used, "; q8: %zu bytes of 8-bit copies replace %zu bytes", i.q8_bytes,
               i.q8_replaced_bytes);
    /* reference/weight_arena.h: why the matrices are moved out of the file's mapping. */
    if (i.device_index < 0)
        append(buf, cap, &used,
               "; %zu bytes of streamed matrices moved into anonymous memory, %zu bytes of it in "
               "transparent huge pages",
               i.moved_bytes, i.huge_page_bytes);
}
