/* A VL golden's recorded vision inputs (tests/golden/qwen3_vl*: golden.json
 * vision.image_grid_thw, vision_embeds.f32, deepstack.f32) as a request's vision inputs, so
 * strata-sim sends the golden request with its image as a vision stage would. */
#ifndef STRATA_SIM_SIM_VISION_H
#define STRATA_SIM_SIM_VISION_H

#include "runtime/model/model_config.h"
#include "runtime/model/vl_prompt.h"
#include "runtime/stage/request.h"

struct sim_vision {
    int have; /* 0: no vision inputs in the directory (not an error) */
    struct vl_grid grids[VL_MAX_IMAGES];
    float *embeds;    /* [n_image_tokens, H] */
    float *deepstack; /* [K, n_image_tokens, H] */
    struct request_vision vision;
};

/* Loads DIR's vision inputs when golden.json has a "vision" object; sizes are checked
 * against the model (H, K, merge size). A malformed one is an error (STRATA_EFORMAT). */
int sim_vision_load(struct sim_vision *v, const char *dir, const struct model_config *cfg);
void sim_vision_free(struct sim_vision *v);

#endif
