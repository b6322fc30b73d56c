/* Hugging Face config.json -> struct model_config for the four Qwen3 model types.
 *
 * Design: the JSON is parsed once with cJSON and every field goes through one of a few small
 * readers (required int, optional int with default, ...) that know the field's dotted path
 * ("text_config.hidden_size") and the source file, so every error names both. The fields
 * that fix tensor shapes (vocab, hidden, layers, heads, MLP widths, expert counts) are
 * required: a silent default there would load the wrong weights. Fields whose Hugging Face
 * default is harmless (eps, theta, flags, token ids, most vision fields) fall back to the
 * defaults of shared spec qwen3-architecture.md §1. */
#include "runtime/model/model_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"

/* Where a field lives: `obj` is the JSON object, `prefix` its dotted path ("" or
 * "text_config."), `source` the file name for messages. */
struct field_scope {
    const cJSON *obj;
    const char *prefix;
    const char *source;
};

static const cJSON *scope_get(const struct field_scope *s, const char *name) {
    if (!s->obj) return NULL;
    return cJSON_GetObjectItemCaseSensitive(s->obj, name);
}

static int missing(const struct field_scope *s, const char *name) {
    return strata_set_error(STRATA_ENOTFOUND, "%s: missing required field \"%s%s\"", s->source,
                            s->prefix, name);
}

static int invalid(const struct field_scope *s, const char *name, const char *why) {
    return strata_set_error(STRATA_EINVAL, "%s: invalid field \"%s%s\": %s", s->source, s->prefix,
                            name, why);
}

/* Converts a JSON number to int when it is integral and within [lo, hi]. */
static int json_to_int(int *out, const cJSON *item, const struct field_scope *s, const char *name,
                       int lo, int hi) {
    if (!cJSON_IsNumber(item)) return invalid(s, name, "expected an integer");
    double v = item->valuedouble;
    if (v != floor(v) || v < (double)lo || v > (double)hi) {
        char why[96];
        snprintf(why, sizeof why, "expected an integer in [%d, %d], got %g", lo, hi, v);
        return invalid(s, name, why);
    }
    *out = (int)v;
    return STRATA_OK;
}

static int req_int(int *out, const struct field_scope *s, const char *name, int lo, int hi) {
    const cJSON *item = scope_get(s, name);
    if (!item || cJSON_IsNull(item)) return missing(s, name);
    return json_to_int(out, item, s, name, lo, hi);
}

/* Absent or null -> `def`. */
static int opt_int(int *out, const struct field_scope *s, const char *name, int lo, int hi,
                   int def) {
    const cJSON *item = scope_get(s, name);
    if (!item || cJSON_IsNull(item)) {
        *out = def;
        return STRATA_OK;
    }
    return json_to_int(out, item, s, name, lo, hi);
}

static int opt_double(double *out, const struct field_scope *s, const char *name, double def) {
    const cJSON *item = scope_get(s, name);
    if (!item || cJSON_IsNull(item)) {
        *out = def;
        return STRATA_OK;
    }
    if (!cJSON_IsNumber(item) || !(item->valuedouble > 0.0) || !isfinite(item->valuedouble))
        return invalid(s, name, "expected a positive number");
    *out = item->valuedouble;
    return STRATA_OK;
}

static int opt_bool(int *out, const struct field_scope *s, const char *name, int def) {
    const cJSON *item = scope_get(s, name);
    if (!item || cJSON_IsNull(item)) {
        *out = def;
        return STRATA_OK;
    }
    if (!cJSON_IsBool(item)) return invalid(s, name, "expected true or false");
    *out = cJSON_IsTrue(item) ? 1 : 0;
    return STRATA_OK;
}

static int opt_string(char *out, size_t cap, const struct field_scope *s, const char *name) {
    const cJSON *item = scope_get(s, name);
    if (!item || cJSON_IsNull(item)) return STRATA_OK;
    if (!cJSON_IsString(item)) return invalid(s, name, "expected a string");
    if (strlen(item->valuestring) >= cap) return invalid(s, name, "string too long");
    snprintf(out, cap, "%s", item->valuestring);
    return STRATA_OK;
}

/* Reads an int array of at most `cap` entries, each in [lo, hi]. Absent/null -> *count = 0
 * (callers apply their defaults). */
static int opt_int_array(int *out, int *count, int cap, const struct field_scope *s,
                         const char *name, int lo, int hi) {
    const cJSON *item = scope_get(s, name);
    *count = 0;
    if (!item || cJSON_IsNull(item)) return STRATA_OK;
    if (!cJSON_IsArray(item)) return invalid(s, name, "expected a list of integers");
    int n = cJSON_GetArraySize(item);
    if (n > cap) {
        char why[64];
        snprintf(why, sizeof why, "more than %d entries", cap);
        return invalid(s, name, why);
    }
    int i = 0;
    const cJSON *el;
    cJSON_ArrayForEach(el, item) {
        int rc = json_to_int(&out[i], el, s, name, lo, hi);
        if (rc) return rc;
        ++i;
    }
    *count = n;
    return STRATA_OK;
}

/* Rope parameters: v5 "rope_parameters" {rope_theta, mrope_section, mrope_interleaved} or
 * the v4 top-level "rope_theta" plus "rope_scaling" {mrope_section, mrope_interleaved}. */
static int parse_rope(struct model_config *cfg, const struct field_scope *text, double theta_def) {
    const cJSON *params = scope_get(text, "rope_parameters");
    const char *params_name = "rope_parameters";
    if (!params || cJSON_IsNull(params)) {
        params = scope_get(text, "rope_scaling");
        params_name = "rope_scaling";
    }
    if (params && cJSON_IsNull(params)) params = NULL;
    if (params && !cJSON_IsObject(params)) return invalid(text, params_name, "expected an object");

    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s%s.", text->prefix, params_name);
    struct field_scope rope = {params, prefix, text->source};

    char rope_type[32] = "default";
    int rc = opt_string(rope_type, sizeof rope_type, &rope, "rope_type");
    if (rc) return rc;
    if (rope_type[0] == '\0') snprintf(rope_type, sizeof rope_type, "default");
    /* Legacy spelling "type" is accepted too. */
    rc = opt_string(rope_type, sizeof rope_type, &rope, "type");
    if (rc) return rc;
    if (strcmp(rope_type, "default") != 0 && strcmp(rope_type, "mrope") != 0)
        return invalid(&rope, "rope_type", "only \"default\" rope is supported");

    /* theta: top-level (v4) first, then inside rope_parameters (v5), else the default. */
    rc = opt_double(&cfg->rope_theta, text, "rope_theta", theta_def);
    if (rc) return rc;
    rc = opt_double(&cfg->rope_theta, &rope, "rope_theta", cfg->rope_theta);
    if (rc) return rc;

    if (!cfg->has_mrope) return STRATA_OK;
    int n = 0;
    rc = opt_int_array(cfg->mrope_section, &n, 3, &rope, "mrope_section", 0, 1 << 20);
    if (rc) return rc;
    if (n == 0) {
        cfg->mrope_section[0] = 24;
        cfg->mrope_section[1] = 20;
        cfg->mrope_section[2] = 20;
    } else if (n != 3) {
        return invalid(&rope, "mrope_section", "expected 3 integers");
    }
    int sum = cfg->mrope_section[0] + cfg->mrope_section[1] + cfg->mrope_section[2];
    if (sum * 2 != cfg->head_dim) {
        char why[96];
        snprintf(why, sizeof why, "sections sum to %d but head_dim/2 is %d", sum,
                 cfg->head_dim / 2);
        return invalid(&rope, "mrope_section", why);
    }
    return opt_bool(&cfg->mrope_interleaved, &rope, "mrope_interleaved", 1);
}

static int parse_moe(struct model_config *cfg, const struct field_scope *text) {
    int rc;
    if ((rc = req_int(&cfg->num_experts, text, "num_experts", 1, 1 << 16))) return rc;
    if ((rc = req_int(&cfg->num_experts_per_tok, text, "num_experts_per_tok", 1, cfg->num_experts)))
        return rc;
    if ((rc = req_int(&cfg->moe_intermediate_size, text, "moe_intermediate_size", 1, 1 << 24)))
        return rc;
    if ((rc = opt_int(&cfg->decoder_sparse_step, text, "decoder_sparse_step", 1, 1 << 16, 1)))
        return rc;
    if (cfg->type == MODEL_QWEN3_VL_MOE) {
        cfg->norm_topk_prob = 1; /* spec §1.4: always renormalised, the field is ignored */
    } else if ((rc = opt_bool(&cfg->norm_topk_prob, text, "norm_topk_prob", 0))) {
        return rc;
    }
    return opt_int_array(cfg->mlp_only_layers, &cfg->num_mlp_only_layers, MODEL_CONFIG_MAX_LAYERS,
                         text, "mlp_only_layers", 0, cfg->num_layers - 1);
}

static int parse_vision(struct model_config *cfg, const struct field_scope *top) {
    const cJSON *obj = scope_get(top, "vision_config");
    if (!obj || !cJSON_IsObject(obj)) {
        if (obj) return invalid(top, "vision_config", "expected an object");
        return missing(top, "vision_config");
    }
    struct field_scope s = {obj, "vision_config.", top->source};
    struct vision_config *v = &cfg->vision;
    int rc;
    if ((rc = req_int(&v->depth, &s, "depth", 1, 4096))) return rc;
    if ((rc = req_int(&v->hidden_size, &s, "hidden_size", 1, 1 << 20))) return rc;
    if ((rc = req_int(&v->num_heads, &s, "num_heads", 1, 1 << 16))) return rc;
    if (v->hidden_size % v->num_heads != 0)
        return invalid(&s, "num_heads", "does not divide vision_config.hidden_size");
    if ((rc = opt_int(&v->intermediate_size, &s, "intermediate_size", 1, 1 << 24, 4304))) return rc;
    if ((rc = opt_int(&v->in_channels, &s, "in_channels", 1, 64, 3))) return rc;
    if ((rc = opt_int(&v->patch_size, &s, "patch_size", 1, 1024, 16))) return rc;
    if ((rc = opt_int(&v->spatial_merge_size, &s, "spatial_merge_size", 1, 64, 2))) return rc;
    if ((rc = opt_int(&v->temporal_patch_size, &s, "temporal_patch_size", 1, 64, 2))) return rc;
    if ((rc = opt_int(&v->out_hidden_size, &s, "out_hidden_size", 1, 1 << 20, cfg->hidden_size)))
        return rc;
    if ((rc =
             opt_int(&v->num_position_embeddings, &s, "num_position_embeddings", 1, 1 << 24, 2304)))
        return rc;
    int grid = (int)lround(sqrt((double)v->num_position_embeddings));
    if (grid * grid != v->num_position_embeddings)
        return invalid(&s, "num_position_embeddings", "must be a perfect square");
    const cJSON *ds = scope_get(&s, "deepstack_visual_indexes");
    if (!ds || cJSON_IsNull(ds)) {
        v->num_deepstack = 3;
        v->deepstack_visual_indexes[0] = 8;
        v->deepstack_visual_indexes[1] = 16;
        v->deepstack_visual_indexes[2] = 24;
    } else if ((rc = opt_int_array(v->deepstack_visual_indexes, &v->num_deepstack,
                                   MODEL_CONFIG_MAX_DEEPSTACK, &s, "deepstack_visual_indexes", 0,
                                   v->depth - 1))) {
        return rc;
    }
    if (v->num_deepstack > cfg->num_layers)
        return invalid(&s, "deepstack_visual_indexes", "more entries than text decoder layers");
    if (cfg->vision.out_hidden_size != cfg->hidden_size)
        return invalid(&s, "out_hidden_size", "must equal the text hidden_size");

    if ((rc = opt_int(&cfg->image_token_id, top, "image_token_id", 0, 1 << 30, 151655))) return rc;
    if ((rc = opt_int(&cfg->video_token_id, top, "video_token_id", 0, 1 << 30, 151656))) return rc;
    if ((rc = opt_int(&cfg->vision_start_token_id, top, "vision_start_token_id", 0, 1 << 30,
                      151652)))
        return rc;
    return opt_int(&cfg->vision_end_token_id, top, "vision_end_token_id", 0, 1 << 30, 151653);
}

static int parse_eos(struct model_config *cfg, const struct field_scope *top,
                     const struct field_scope *text) {
    const struct field_scope *s = top;
    const cJSON *item = scope_get(top, "eos_token_id");
    if ((!item || cJSON_IsNull(item)) && text->obj != top->obj) {
        s = text;
        item = scope_get(text, "eos_token_id");
    }
    cfg->num_eos_token_ids = 0;
    if (!item || cJSON_IsNull(item)) return STRATA_OK;
    if (cJSON_IsNumber(item)) {
        cfg->num_eos_token_ids = 1;
        return json_to_int(&cfg->eos_token_ids[0], item, s, "eos_token_id", 0, 1 << 30);
    }
    return opt_int_array(cfg->eos_token_ids, &cfg->num_eos_token_ids, MODEL_CONFIG_MAX_EOS, s,
                         "eos_token_id", 0, 1 << 30);
}

static int parse_text(struct model_config *cfg, const struct field_scope *text) {
    int rc;
    if ((rc = req_int(&cfg->vocab_size, text, "vocab_size", 1, 1 << 30))) return rc;
    if ((rc = req_int(&cfg->hidden_size, text, "hidden_size", 1, 1 << 20))) return rc;
    if ((rc = req_int(&cfg->intermediate_size, text, "intermediate_size", 1, 1 << 24))) return rc;
    if ((rc = req_int(&cfg->num_layers, text, "num_hidden_layers", 1, MODEL_CONFIG_MAX_LAYERS)))
        return rc;
    if ((rc = req_int(&cfg->num_heads, text, "num_attention_heads", 1, 1 << 16))) return rc;
    if ((rc = opt_int(&cfg->num_kv_heads, text, "num_key_value_heads", 1, cfg->num_heads,
                      cfg->num_heads)))
        return rc;
    if (cfg->num_heads % cfg->num_kv_heads != 0)
        return invalid(text, "num_key_value_heads", "does not divide num_attention_heads");
    int head_def = cfg->hidden_size / cfg->num_heads;
    if ((rc = opt_int(&cfg->head_dim, text, "head_dim", 2, 1 << 16, head_def))) return rc;
    if (cfg->head_dim < 2 || cfg->head_dim % 2 != 0)
        return invalid(text, "head_dim", "must be even and at least 2 (RoPE pairs)");
    double eps;
    if ((rc = opt_double(&eps, text, "rms_norm_eps", 1e-6))) return rc;
    cfg->rms_norm_eps = (float)eps;
    if ((rc = opt_bool(&cfg->attention_bias, text, "attention_bias", 0))) return rc;
    int max_pos_def = cfg->has_mrope ? 128000 : 32768;
    if ((rc = opt_int(&cfg->max_position_embeddings, text, "max_position_embeddings", 1, 1 << 30,
                      max_pos_def)))
        return rc;
    const cJSON *sliding = scope_get(text, "use_sliding_window");
    if (cJSON_IsTrue(sliding))
        return invalid(text, "use_sliding_window", "sliding-window attention is not supported");
    const cJSON *act = scope_get(text, "hidden_act");
    if (act && cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0)
        return invalid(text, "hidden_act", "only \"silu\" is supported");
    return parse_rope(cfg, text, cfg->has_mrope ? 5000000.0 : 10000.0);
}

int model_config_parse(struct model_config *cfg, const char *json, size_t len,
                       const char *source_name) {
    const char *source = source_name ? source_name : "config.json";
    if (!cfg || (!json && len)) return strata_set_error(STRATA_EINVAL, "%s: null argument", source);
    memset(cfg, 0, sizeof *cfg);
    /* The parse end (not cJSON_GetErrorPtr, a process-wide global) locates errors. */
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    int rc = STRATA_OK;
    if (!root) {
        return strata_set_error(STRATA_EFORMAT, "%s: not well-formed JSON (near byte %ld)", source,
                                end ? (long)(end - json) : 0L);
    }
    for (const char *p = end; p && p < json + len; ++p) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            rc = strata_set_error(STRATA_EFORMAT, "%s: unexpected text after the JSON object",
                                  source);
            goto fail;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = strata_set_error(STRATA_EFORMAT, "%s: top level is not a JSON object", source);
        goto fail;
    }
    struct field_scope top = {root, "", source};
    const cJSON *type = scope_get(&top, "model_type");
    if (!type) {
        rc = missing(&top, "model_type");
        goto fail;
    }
    if (!cJSON_IsString(type)) {
        rc = invalid(&top, "model_type", "expected a string");
        goto fail;
    }
    static const struct {
        const char *name;
        enum model_type type;
    } types[] = {{"qwen3", MODEL_QWEN3},
                 {"qwen3_moe", MODEL_QWEN3_MOE},
                 {"qwen3_vl", MODEL_QWEN3_VL},
                 {"qwen3_vl_moe", MODEL_QWEN3_VL_MOE}};
    int found = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; ++i) {
        if (strcmp(type->valuestring, types[i].name) == 0) {
            cfg->type = types[i].type;
            found = 1;
        }
    }
    if (!found) {
        char why[96];
        snprintf(why, sizeof why, "unsupported model type \"%.40s\"", type->valuestring);
        rc = invalid(&top, "model_type", why);
        goto fail;
    }
    snprintf(cfg->model_type_name, sizeof cfg->model_type_name, "%s", type->valuestring);
    int is_vl = cfg->type == MODEL_QWEN3_VL || cfg->type == MODEL_QWEN3_VL_MOE;
    int is_moe = cfg->type == MODEL_QWEN3_MOE || cfg->type == MODEL_QWEN3_VL_MOE;
    snprintf(cfg->tensor_prefix, sizeof cfg->tensor_prefix, "%s",
             is_vl ? "model.language_model." : "model.");
    cfg->has_mrope = is_vl;
    cfg->has_vision = is_vl;

    struct field_scope text = top;
    if (is_vl) {
        const cJSON *obj = scope_get(&top, "text_config");
        if (!obj) {
            rc = missing(&top, "text_config");
            goto fail;
        }
        if (!cJSON_IsObject(obj)) {
            rc = invalid(&top, "text_config", "expected an object");
            goto fail;
        }
        text.obj = obj;
        text.prefix = "text_config.";
    }

    /* dtype: "torch_dtype" (v4) or "dtype" (v5), top level first, then text_config. */
    const char *dtype_keys[] = {"torch_dtype", "dtype"};
    for (int i = 0; i < 2 && !cfg->torch_dtype[0]; ++i) {
        if ((rc = opt_string(cfg->torch_dtype, sizeof cfg->torch_dtype, &top, dtype_keys[i])))
            goto fail;
        if (!cfg->torch_dtype[0] && is_vl &&
            (rc = opt_string(cfg->torch_dtype, sizeof cfg->torch_dtype, &text, dtype_keys[i])))
            goto fail;
    }

    if ((rc = parse_text(cfg, &text))) goto fail;
    if (is_moe && (rc = parse_moe(cfg, &text))) goto fail;

    /* Tying (spec §1.3): transformers 4.57 ties a VL model's lm_head by the text config's
     * flag (get_text_config(decoder=True)), so text_config's flag wins when it is given and
     * the top-level flag is the fallback. For text-only models both scopes are the top. */
    const cJSON *text_tie = is_vl ? scope_get(&text, "tie_word_embeddings") : NULL;
    if (text_tie && !cJSON_IsNull(text_tie)) {
        rc = opt_bool(&cfg->tie_word_embeddings, &text, "tie_word_embeddings", 0);
    } else {
        rc = opt_bool(&cfg->tie_word_embeddings, &top, "tie_word_embeddings", 0);
    }
    if (rc) goto fail;

    if (is_vl && (rc = parse_vision(cfg, &top))) goto fail;
    if ((rc = parse_eos(cfg, &top, &text))) goto fail;

    cJSON_Delete(root);
    return STRATA_OK;
fail:
    cJSON_Delete(root);
    return rc;
}

/* `path` itself, or DIR/config.json when it is a directory. */
static int config_file(char *file, size_t cap, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0)
        return strata_set_error(STRATA_ENOTFOUND, "%s: %s", path, strerror(errno));
    const char *fmt = S_ISDIR(st.st_mode) ? "%s/config.json" : "%s";
    if ((size_t)snprintf(file, cap, fmt, path) >= cap)
        return strata_set_error(STRATA_EINVAL, "%s: path too long", path);
    return STRATA_OK;
}

int model_config_read(char **json, size_t *len, const char *path) {
    if (!json || !len || !path)
        return strata_set_error(STRATA_EINVAL, "model_config_read: null argument");
    return cli_read_file_max(json, len, path, MODEL_CONFIG_MAX_BYTES);
}

int model_config_load(struct model_config *cfg, const char *path) {
    char file[4096], *json;
    size_t len;
    if (!cfg || !path) return strata_set_error(STRATA_EINVAL, "model_config_load: null argument");
    int rc = config_file(file, sizeof file, path);
    if (rc || (rc = model_config_read(&json, &len, file))) return rc;
    rc = model_config_parse(cfg, json, len, file);
    free(json);
    return rc;
}

int model_config_layer_is_moe(const struct model_config *cfg, int layer) {
    if (!cfg || cfg->num_experts <= 0 || layer < 0 || layer >= cfg->num_layers) return 0;
    for (int i = 0; i < cfg->num_mlp_only_layers; ++i)
        if (cfg->mlp_only_layers[i] == layer) return 0;
    int step = cfg->decoder_sparse_step > 0 ? cfg->decoder_sparse_step : 1;
    return (layer + 1) % step == 0;
}

void model_config_describe(const struct model_config *cfg, char *buf, size_t cap) {
    if (!buf || cap == 0) return;
    int n = snprintf(buf, cap, "%s: H=%d L=%d nh=%d nkv=%d D=%d V=%d inter=%d",
                     cfg->model_type_name, cfg->hidden_size, cfg->num_layers, cfg->num_heads,
                     cfg->num_kv_heads, cfg->head_dim, cfg->vocab_size, cfg->intermediate_size);
    if (n < 0 || (size_t)n >= cap) return;
    if (cfg->num_experts > 0) {
        n += snprintf(buf + n, cap - (size_t)n, " E=%d k=%d I=%d norm_topk=%d step=%d",
                      cfg->num_experts, cfg->num_experts_per_tok, cfg->moe_intermediate_size,
                      cfg->norm_topk_prob, cfg->decoder_sparse_step);
        if (n < 0 || (size_t)n >= cap) return;
    }
    n += snprintf(buf + n, cap - (size_t)n, " theta=%g tied=%d bias=%d", cfg->rope_theta,
                  cfg->tie_word_embeddings, cfg->attention_bias);
    if (n < 0 || (size_t)n >= cap) return;
    if (cfg->has_mrope) {
        n += snprintf(buf + n, cap - (size_t)n, " mrope=[%d,%d,%d]", cfg->mrope_section[0],
                      cfg->mrope_section[1], cfg->mrope_section[2]);
        if (n < 0 || (size_t)n >= cap) return;
    }
    if (cfg->has_vision)
        snprintf(buf + n, cap - (size_t)n, " vision(depth=%d Hv=%d deepstack=%d)",
                 cfg->vision.depth, cfg->vision.hidden_size, cfg->vision.num_deepstack);
}
