/* The CPU reference Qwen3-VL vision encoder (shared spec qwen3-architecture.md §6): the
 * numerical truth for the vision tower, as reference/model.h is for the decoder.
 *
 * Input: pixel_values [n_patches, C*Tp*p*p] exactly as the HF processor emits them
 * (runtime/vision/preprocess.h produces them) and one grid (t, h, w) per image or video, in
 * patch units, as HF's image_grid_thw. Output: the main merger's embeddings [n_tokens, O]
 * (what replaces the <|image_pad|> rows, spec §5.4) and the DeepStack features
 * [num_deepstack, n_tokens, O], with n_tokens = sum over grids of t*h*w / merge^2 and the
 * tokens in (image, t, bh, bw) order.
 *
 * Pipeline: patch embedding (Conv3d as a matmul, with bias) + interpolated learned position
 * embedding, then `depth` pre-norm blocks (LayerNorm with bias, attention with 2-D RoPE full
 * within each frame, gelu_tanh MLP), DeepStack mergers tapped after the listed blocks
 * (post-shuffle norm) and the main merger (pre-shuffle norm) after the last block.
 *
 * Math is fp32 on the stored bf16 / f32 weights (f16 and every bias / norm vector are widened
 * once at load). Determinism: every output element has a fixed reduction order, so 1 thread
 * equals N threads bit for bit, and images encoded together equal each encoded alone.
 *
 * Threads: an encoder owns its worker pool and activation scratch; one thread at a time calls
 * vision_encoder_forward on it. */
#ifndef STRATA_REFERENCE_VISION_ENCODER_H
#define STRATA_REFERENCE_VISION_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

struct vision_encoder; /* opaque */

/* Loads the vision tower (model.visual.*, spec §2.3) of a qwen3_vl / qwen3_vl_moe config from
 * `st`. The tensor list is the manifest's (runtime/model/stage_tensors.h); every missing or
 * mis-shaped tensor is named in one error (STRATA_ENOTFOUND / STRATA_EFORMAT). STRATA_EINVAL
 * for a model without a vision tower or a vision config the math cannot run (hidden size
 * not split into heads, head_dim not a multiple of 4, num_position_embeddings not a square). */
int vision_encoder_load(struct vision_encoder **out, const struct model_config *cfg,
                        const struct safetensors *st, int num_threads);
void vision_encoder_free(struct vision_encoder *enc); /* accepts NULL and a half-built one */

const struct vision_config *vision_encoder_config(const struct vision_encoder *enc);
int vision_encoder_patch_dim(const struct vision_encoder *enc);  /* C*Tp*p*p */
int vision_encoder_out_hidden(const struct vision_encoder *enc); /* O */
int vision_encoder_num_deepstack(const struct vision_encoder *enc);
int vision_encoder_num_threads(const struct vision_encoder *enc);
size_t vision_encoder_weight_bytes(const struct vision_encoder *enc); /* as stored */
size_t vision_encoder_extra_bytes(const struct vision_encoder *enc);  /* widened copies */
size_t vision_encoder_scratch_bytes(const struct vision_encoder *enc);

/* Checks grid_thw [n_grids, 3] (rows t, h, w, as image_grid_thw): n_grids >= 1, every value
 * >= 1, h and w multiples of spatial_merge_size, and at most INT_MAX / (widest activation row:
 * 3Hv, Iv, patch_dim or O) patches in all (about 500k for the released towers; encode more in
 * several calls). Gives the patch count (sum of t*h*w) and the merged token count
 * (patches / merge^2); either output may be NULL. STRATA_EINVAL names the bad grid. */
int vision_encoder_count(const struct vision_encoder *enc, const int64_t *grid_thw, int n_grids,
                         int64_t *n_patches, int64_t *n_tokens);

/* Encodes n_grids images / videos in one call.
 * embeds [n_tokens, O]; deepstack [num_deepstack, n_tokens, O] (may be NULL when
 * num_deepstack is 0); pixel_values [n_patches, patch_dim]; grid_thw [n_grids, 3].
 * STRATA_EINVAL (nothing written) when a grid is invalid (see vision_encoder_count) or
 * n_patches is not the grids' patch count; STRATA_ENOMEM when scratch cannot grow. */
int vision_encoder_forward(struct vision_encoder *enc, float *embeds, float *deepstack,
                           const float *pixel_values, int64_t n_patches, const int64_t *grid_thw,
                           int n_grids);

#endif
