/* Model configuration parsed from a Hugging Face config.json.
 *
 * Covers model_type qwen3, qwen3_moe, qwen3_vl and qwen3_vl_moe (the VL types nest the
 * text fields under "text_config" and the vision tower under "vision_config"). Both the
 * transformers v5 "rope_parameters" form and the older "rope_theta"/"rope_scaling" form are
 * read. Field meanings and defaults: shared spec qwen3-architecture.md §1.
 *
 * A missing or invalid required field is an error whose message names the field and the
 * file (strata_last_error()). */
#ifndef STRATA_RUNTIME_MODEL_MODEL_CONFIG_H
#define STRATA_RUNTIME_MODEL_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define MODEL_CONFIG_MAX_LAYERS 1024
#define MODEL_CONFIG_MAX_DEEPSTACK 8
#define MODEL_CONFIG_MAX_EOS 8

enum model_type {
    MODEL_QWEN3 = 0,
    MODEL_QWEN3_MOE = 1,
    MODEL_QWEN3_VL = 2,
    MODEL_QWEN3_VL_MOE = 3
};

/* Vision tower (qwen3_vl / qwen3_vl_moe only), spec §1.3 and §6. */
struct vision_config {
    int depth;
    int hidden_size;
    int intermediate_size;
    int num_heads;
    int in_channels;
    int patch_size;
    int spatial_merge_size;
    int temporal_patch_size;
    int out_hidden_size;
    int num_position_embeddings;
    int num_deepstack; /* len(deepstack_visual_indexes) */
    int deepstack_visual_indexes[MODEL_CONFIG_MAX_DEEPSTACK];
};

struct model_config {
    enum model_type type;
    char model_type_name[32]; /* as written in config.json, e.g. "qwen3_moe" */
    char tensor_prefix[32];   /* "model." or "model.language_model." (spec §2) */
    char torch_dtype[16];     /* "bfloat16", "float32", ... ("" if absent) */

    /* Text decoder (spec §1.1). */
    int vocab_size;        /* V */
    int hidden_size;       /* H */
    int intermediate_size; /* dense SwiGLU width */
    int num_layers;        /* L */
    int num_heads;         /* nh */
    int num_kv_heads;      /* nkv (defaults to nh when null) */
    int head_dim;          /* D: explicit field, else H / nh */
    float rms_norm_eps;
    double rope_theta;
    int attention_bias;      /* q/k/v/o biases present */
    int tie_word_embeddings; /* lm_head shares embed_tokens (spec §1.3 tying rule) */
    int max_position_embeddings;

    /* MoE (spec §1.2); num_experts == 0 for dense models. */
    int num_experts;           /* E */
    int num_experts_per_tok;   /* top-k */
    int moe_intermediate_size; /* I */
    int norm_topk_prob;        /* renormalise top-k (always 1 for qwen3_vl_moe) */
    int decoder_sparse_step;
    int num_mlp_only_layers;
    int mlp_only_layers[MODEL_CONFIG_MAX_LAYERS];

    /* Interleaved M-RoPE (spec §5.1); has_mrope == 0 for plain qwen3 / qwen3_moe. */
    int has_mrope;
    int mrope_section[3];
    int mrope_interleaved;

    /* Vision (spec §1.3); has_vision == 0 for text-only models. */
    int has_vision;
    struct vision_config vision;
    int image_token_id;
    int video_token_id;
    int vision_start_token_id;
    int vision_end_token_id;

    /* From config.json "eos_token_id" (int or list); generation_config.json is not read. */
    int num_eos_token_ids;
    int eos_token_ids[MODEL_CONFIG_MAX_EOS];
};

/* Parses `json` (len bytes, not necessarily NUL-terminated). `source_name` is used in
 * error messages (normally the file path). */
int model_config_parse(struct model_config *cfg, const char *json, size_t len,
                       const char *source_name);

/* Largest config.json read: real ones are a few KiB; a bound keeps a huge or sparse file
 * from being read into memory whole. */
#define MODEL_CONFIG_MAX_BYTES (64 << 20)

/* Reads the config.json file `path` into a new NUL-terminated buffer (*json, *len bytes;
 * free it). Refuses anything but a regular file of at most MODEL_CONFIG_MAX_BYTES (a
 * directory or FIFO is refused, not read or waited on). */
int model_config_read(char **json, size_t *len, const char *path);

/* Reads and parses a config.json file, or DIR/config.json when `path` is a directory. */
int model_config_load(struct model_config *cfg, const char *path);

/* 1 if decoder layer `layer` uses the sparse MoE block, else 0 (spec §1.2 rule:
 * layer not in mlp_only_layers AND num_experts > 0 AND (layer+1) % decoder_sparse_step == 0). */
int model_config_layer_is_moe(const struct model_config *cfg, int layer);

/* Writes a one-line human summary ("qwen3_moe: H=64 L=4 nh=4 nkv=2 D=32 V=1000 E=8 k=2 ...")
 * into buf. */
void model_config_describe(const struct model_config *cfg, char *buf, size_t cap);

#endif
