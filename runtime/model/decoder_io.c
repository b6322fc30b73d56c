/* forward_items_check; see decoder_io.h. */
#include "runtime/model/decoder_io.h"

#include "runtime/base/status.h"

/* One item against the cache; the rest of the checks are in forward_items_check. */
static int check_item(const char *who, const struct forward_item *items, int it, const int *len,
                      const unsigned char *in_use, int num_slots, int max_seq, int num_layers) {
    const struct forward_item *item = &items[it];
    if (item->n_tokens < 1)
        return strata_set_error(STRATA_EINVAL, "%s: item %d has %d tokens (need >= 1)", who, it,
                                item->n_tokens);
    if (item->slot < 0 || item->slot >= num_slots || !in_use[item->slot])
        return strata_set_error(STRATA_EINVAL,
                                "%s: item %d uses slot %d, which is not an acquired KV slot", who,
                                it, item->slot);
    for (int j = 0; j < it; ++j)
        if (items[j].slot == item->slot)
            return strata_set_error(STRATA_EINVAL, "%s: items %d and %d share KV slot %d", who, j,
                                    it, item->slot);
    if (item->pos != len[item->slot])
        return strata_set_error(STRATA_ERANGE,
                                "%s: item %d starts at position %d but slot %d holds %d positions",
                                who, it, item->pos, item->slot, len[item->slot]);
    if ((long)item->pos + item->n_tokens > max_seq)
        return strata_set_error(STRATA_ERANGE,
                                "%s: item %d needs %ld positions, beyond the KV capacity of %d",
                                who, it, (long)item->pos + item->n_tokens, max_seq);
    if (item->deepstack && (item->num_deepstack < 0 || item->num_deepstack > num_layers))
        return strata_set_error(STRATA_EINVAL, "%s: item %d has %d deepstack features", who, it,
                                item->num_deepstack);
    return 0;
}

int forward_items_check(const char *who, const struct forward_item *items, int n_items,
                        const int *len, const unsigned char *in_use, int num_slots, int max_seq,
                        int num_layers, int *rows, int *ctx) {
    *rows = 0;
    *ctx = 1;
    if (n_items < 0 || (n_items > 0 && !items))
        return strata_set_error(STRATA_EINVAL, "%s: bad item list (%d items)", who, n_items);
    for (int it = 0; it < n_items; ++it) {
        int rc = check_item(who, items, it, len, in_use, num_slots, max_seq, num_layers);
        if (rc < 0) return rc;
        *rows += items[it].n_tokens;
        if (items[it].pos + items[it].n_tokens > *ctx) *ctx = items[it].pos + items[it].n_tokens;
    }
    return 0;
}
