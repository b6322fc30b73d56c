/* The one rule for a role's layer range and its place in a ring; see stage_tensors.h. */
#include <stdio.h>

#include "runtime/base/status.h"
#include "runtime/model/stage_tensors.h"

int stage_role_check(const struct stage_role *r, int L, int stage_index, int num_stages) {
    if (num_stages > 0 && (stage_index < 0 || stage_index >= num_stages))
        return strata_set_error(STRATA_ERANGE, "stage index %d is outside [0, %d)", stage_index,
                                num_stages);
    if (r->layer_start < 0 || r->layer_end > L || r->layer_start >= r->layer_end) {
        char where[48] = "";
        if (num_stages > 0)
            snprintf(where, sizeof where, "stage %d of %d: ", stage_index, num_stages);
        return strata_set_error(STRATA_ERANGE,
                                "%slayers [%d, %d) are empty or out of range of a %d-layer model",
                                where, r->layer_start, r->layer_end, L);
    }
    if (num_stages <= 0) return 0;
    int first = stage_index == 0, last = stage_index == num_stages - 1;
    if ((first && r->layer_start != 0) || (last && r->layer_end != L))
        return strata_set_error(STRATA_ERANGE,
                                "stage %d of %d gets layers [%d, %d) of a %d-layer model (stage 0 "
                                "must start at 0, the last must end at %d)",
                                stage_index, num_stages, r->layer_start, r->layer_end, L, L);
    if (!r->with_embed != !first || !r->with_head != !last)
        return strata_set_error(STRATA_EINVAL,
                                "stage %d of %d needs a backend %s the embedding and %s the head, "
                                "but it has%s embedding and%s head",
                                stage_index, num_stages, first ? "with" : "without",
                                last ? "with" : "without", r->with_embed ? " the" : " no",
                                r->with_head ? " the" : " no");
    return 0;
}
