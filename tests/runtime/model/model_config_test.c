/* cmocka tests for runtime/model_config: the four model types from committed config.json
 * fixtures (real released configs and small ones), both rope forms, the MoE layer rule,
 * and errors that name the field and the file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "tests/test_util.h"

static struct model_config cfg;

static int load_fixture(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/runtime/testdata/config/%s", name);
    return model_config_load(&cfg, test_path(rel));
}

static int parse_text(const char *json) {
    return model_config_parse(&cfg, json, strlen(json), "inline.json");
}

static void assert_error_mentions(const char *a, const char *b) {
    const char *msg = strata_last_error();
    if (!strstr(msg, a) || (b && !strstr(msg, b)))
        fail_msg("error \"%s\" does not mention \"%s\" and \"%s\"", msg, a, b ? b : "");
}

static void test_qwen3_v4_form(void **state) {
    (void)state;
    assert_int_equal(load_fixture("qwen3_0p6b.json"), 0);
    assert_int_equal(cfg.type, MODEL_QWEN3);
    assert_string_equal(cfg.model_type_name, "qwen3");
    assert_string_equal(cfg.tensor_prefix, "model.");
    assert_string_equal(cfg.torch_dtype, "bfloat16");
    assert_int_equal(cfg.vocab_size, 151936);
    assert_int_equal(cfg.hidden_size, 1024);
    assert_int_equal(cfg.intermediate_size, 3072);
    assert_int_equal(cfg.num_layers, 28);
    assert_int_equal(cfg.num_heads, 16);
    assert_int_equal(cfg.num_kv_heads, 8);
    assert_int_equal(cfg.head_dim, 128); /* explicit, not H/nh = 64 */
    assert_true(cfg.rms_norm_eps == 1e-6f);
    assert_true(cfg.rope_theta == 1000000.0);
    assert_int_equal(cfg.tie_word_embeddings, 1);
    assert_int_equal(cfg.attention_bias, 0);
    assert_int_equal(cfg.max_position_embeddings, 40960);
    assert_int_equal(cfg.num_experts, 0);
    assert_int_equal(cfg.has_mrope, 0);
    assert_int_equal(cfg.has_vision, 0);
    assert_int_equal(cfg.num_eos_token_ids, 1);
    assert_int_equal(cfg.eos_token_ids[0], 151645);
    for (int l = 0; l < cfg.num_layers; ++l)
        assert_int_equal(model_config_layer_is_moe(&cfg, l), 0);
}

static void test_qwen3_v5_rope_parameters(void **state) {
    (void)state;
    assert_int_equal(load_fixture("qwen3_v5_rope_parameters.json"), 0);
    assert_true(cfg.rope_theta == 500000.0);
    assert_int_equal(cfg.num_kv_heads, 4); /* null -> nh */
    assert_int_equal(cfg.head_dim, 16);    /* absent -> H / nh */
    assert_string_equal(cfg.torch_dtype, "float32");
    assert_int_equal(cfg.attention_bias, 1);
    assert_int_equal(cfg.tie_word_embeddings, 0);
    assert_true(cfg.rms_norm_eps == 1e-5f);
    assert_int_equal(cfg.num_eos_token_ids, 2);
    assert_int_equal(cfg.eos_token_ids[1], 151643);
}

static void test_qwen3_default_theta(void **state) {
    (void)state;
    assert_int_equal(parse_text("{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8,"
                                "\"intermediate_size\":8,\"num_hidden_layers\":1,"
                                "\"num_attention_heads\":2}"),
                     0);
    assert_true(cfg.rope_theta == 10000.0);
    assert_true(cfg.rms_norm_eps == 1e-6f);
}

static void test_qwen3_moe(void **state) {
    (void)state;
    assert_int_equal(load_fixture("qwen3_moe_30b.json"), 0);
    assert_int_equal(cfg.type, MODEL_QWEN3_MOE);
    assert_string_equal(cfg.tensor_prefix, "model.");
    assert_int_equal(cfg.num_experts, 128);
    assert_int_equal(cfg.num_experts_per_tok, 8);
    assert_int_equal(cfg.moe_intermediate_size, 768);
    assert_int_equal(cfg.norm_topk_prob, 1);
    assert_int_equal(cfg.decoder_sparse_step, 1);
    assert_int_equal(cfg.num_mlp_only_layers, 0);
    assert_int_equal(cfg.head_dim, 128); /* H / nh would be 64 */
    for (int l = 0; l < cfg.num_layers; ++l)
        assert_int_equal(model_config_layer_is_moe(&cfg, l), 1);
    assert_int_equal(model_config_layer_is_moe(&cfg, cfg.num_layers), 0);
    char buf[256];
    model_config_describe(&cfg, buf, sizeof buf);
    assert_non_null(strstr(buf, "qwen3_moe"));
    assert_non_null(strstr(buf, "E=128"));
}

static void test_moe_layer_rule(void **state) {
    (void)state;
    assert_int_equal(load_fixture("qwen3_moe_sparse_step.json"), 0);
    assert_int_equal(cfg.norm_topk_prob, 0); /* HF default for qwen3_moe */
    /* step 2: layers 1,3,5,7 are candidates; 3 and 5 are mlp_only. */
    const int expect[8] = {0, 1, 0, 0, 0, 0, 0, 1};
    for (int l = 0; l < 8; ++l)
        assert_int_equal(model_config_layer_is_moe(&cfg, l), expect[l]);
}

static void test_qwen3_vl(void **state) {
    (void)state;
    assert_int_equal(load_fixture("qwen3_vl_4b.json"), 0);
    assert_int_equal(cfg.type, MODEL_QWEN3_VL);
    assert_string_equal(cfg.tensor_prefix, "model.language_model.");
    assert_string_equal(cfg.torch_dtype, "bfloat16"); /* from text_config "dtype" */
    assert_int_equal(cfg.hidden_size, 2560);
    assert_int_equal(cfg.num_layers, 36);
    assert_int_equal(cfg.max_position_embeddings, 262144);
    assert_true(cfg.rope_theta == 5000000.0);
    assert_int_equal(cfg.has_mrope, 1);
    assert_int_equal(cfg.mrope_section[0], 24);
    assert_int_equal(cfg.mrope_section[1], 20);
    assert_int_equal(cfg.mrope_section[2], 20);
    assert_int_equal(cfg.mrope_interleaved, 1);
    assert_int_equal(cfg.tie_word_embeddings, 1);
    assert_int_equal(cfg.has_vision, 1);
    assert_int_equal(cfg.vision.depth, 24);
    assert_int_equal(cfg.vision.hidden_size, 1024);
    assert_int_equal(cfg.vision.out_hidden_size, 2560);
    assert_int_equal(cfg.vision.num_deepstack, 3);
    assert_int_equal(cfg.vision.deepstack_visual_indexes[2], 17);
    assert_int_equal(cfg.image_token_id, 151655);
    assert_int_equal(cfg.vision_end_token_id, 151653);
    assert_int_equal(cfg.num_eos_token_ids, 1); /* from text_config */
    assert_int_equal(cfg.num_experts, 0);
}

static void test_qwen3_vl_moe_v5(void **state) {
    (void)state;
    assert_int_equal(load_fixture("qwen3_vl_moe_v5.json"), 0);
    assert_int_equal(cfg.type, MODEL_QWEN3_VL_MOE);
    assert_string_equal(cfg.tensor_prefix, "model.language_model.");
    assert_int_equal(cfg.norm_topk_prob, 1); /* forced for qwen3_vl_moe */
    assert_int_equal(cfg.num_experts, 8);
    assert_int_equal(cfg.mrope_section[0], 2);
    assert_int_equal(cfg.mrope_section[1], 3);
    assert_true(cfg.rope_theta == 5000000.0);
    assert_int_equal(cfg.tie_word_embeddings, 0);
    assert_int_equal(cfg.vision.num_position_embeddings, 16);
    assert_int_equal(cfg.vision.num_deepstack, 2);
    for (int l = 0; l < cfg.num_layers; ++l)
        assert_int_equal(model_config_layer_is_moe(&cfg, l), 1);
}

static void test_vl_defaults_and_tie_fallback(void **state) {
    (void)state;
    /* No rope block: mrope [24,20,20] (D=128), theta 5e6; tie comes from text_config. */
    assert_int_equal(parse_text("{\"model_type\":\"qwen3_vl\",\"text_config\":{\"vocab_size\":10,"
                                "\"hidden_size\":256,\"intermediate_size\":8,"
                                "\"num_hidden_layers\":2,\"num_attention_heads\":2,"
                                "\"tie_word_embeddings\":true},\"vision_config\":{\"depth\":30,"
                                "\"hidden_size\":16,\"num_heads\":2,\"out_hidden_size\":256,"
                                "\"deepstack_visual_indexes\":[1]}}"),
                     0);
    assert_int_equal(cfg.head_dim, 128);
    assert_int_equal(cfg.mrope_section[0], 24);
    assert_true(cfg.rope_theta == 5000000.0);
    assert_int_equal(cfg.tie_word_embeddings, 1);
    assert_int_equal(cfg.vision.patch_size, 16);
    assert_int_equal(cfg.vision.num_position_embeddings, 2304);
    /* When both scopes give a flag, text_config's wins (transformers 4.57 ties the VL
     * lm_head by the decoder's text config). */
    assert_int_equal(parse_text("{\"model_type\":\"qwen3_vl\",\"tie_word_embeddings\":true,"
                                "\"text_config\":{\"vocab_size\":10,"
                                "\"hidden_size\":256,\"intermediate_size\":8,"
                                "\"num_hidden_layers\":2,\"num_attention_heads\":2,"
                                "\"tie_word_embeddings\":false},\"vision_config\":{\"depth\":30,"
                                "\"hidden_size\":16,\"num_heads\":2,\"out_hidden_size\":256,"
                                "\"deepstack_visual_indexes\":[1]}}"),
                     0);
    assert_int_equal(cfg.tie_word_embeddings, 0);
}

static void test_missing_field_names_field_and_file(void **state) {
    (void)state;
    assert_int_equal(load_fixture("missing_hidden_size.json"), STRATA_ENOTFOUND);
    assert_error_mentions("\"hidden_size\"", "missing_hidden_size.json");

    assert_int_equal(parse_text("{\"model_type\":\"qwen3_vl\",\"text_config\":{\"vocab_size\":10,"
                                "\"intermediate_size\":8,\"num_hidden_layers\":2,"
                                "\"num_attention_heads\":2},\"vision_config\":{}}"),
                     STRATA_ENOTFOUND);
    assert_error_mentions("text_config.hidden_size", "inline.json");

    assert_int_equal(parse_text("{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,"
                                "\"hidden_size\":8,\"intermediate_size\":8,"
                                "\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                                "\"num_experts\":4,\"moe_intermediate_size\":4}"),
                     STRATA_ENOTFOUND);
    assert_error_mentions("num_experts_per_tok", "inline.json");

    assert_int_equal(parse_text("{\"vocab_size\":10}"), STRATA_ENOTFOUND);
    assert_error_mentions("model_type", "inline.json");

    assert_int_equal(parse_text("{\"model_type\":\"qwen3_vl\"}"), STRATA_ENOTFOUND);
    assert_error_mentions("text_config", "inline.json");

    assert_int_equal(model_config_load(&cfg, "/nonexistent/strata/config.json"), STRATA_ENOTFOUND);
    assert_error_mentions("/nonexistent/strata/config.json", NULL);
}

static void test_invalid_fields(void **state) {
    (void)state;
    static const struct {
        const char *json;
        const char *field;
    } cases[] = {
        {"{\"model_type\":\"llama\"}", "model_type"},
        {"{\"model_type\":\"qwen3\",\"vocab_size\":\"many\",\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2}",
         "vocab_size"},
        {"{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8.5,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2}",
         "hidden_size"},
        {"{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":0,\"num_attention_heads\":2}",
         "num_hidden_layers"},
        {"{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":12,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":3,"
         "\"num_key_value_heads\":2}",
         "num_key_value_heads"},
        {"{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
         "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
         "rope_scaling.rope_type"},
        {"{\"model_type\":\"qwen3\",\"vocab_size\":10,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
         "\"tie_word_embeddings\":\"yes\"}",
         "tie_word_embeddings"},
        {"{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2,"
         "\"num_experts\":4,\"num_experts_per_tok\":5,\"moe_intermediate_size\":4}",
         "num_experts_per_tok"},
        {"{\"model_type\":\"qwen3_moe\",\"vocab_size\":10,\"hidden_size\":8,"
         "\"intermediate_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2,"
         "\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":4,"
         "\"mlp_only_layers\":[2]}",
         "mlp_only_layers"},
        {"{\"model_type\":\"qwen3_vl\",\"text_config\":{\"vocab_size\":10,\"hidden_size\":32,"
         "\"intermediate_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2,"
         "\"rope_parameters\":{\"mrope_section\":[4,4,4]}},\"vision_config\":{\"depth\":1,"
         "\"hidden_size\":8,\"num_heads\":2,\"out_hidden_size\":32}}",
         "text_config.rope_parameters.mrope_section"},
        {"{\"model_type\":\"qwen3_vl\",\"text_config\":{\"vocab_size\":10,\"hidden_size\":32,"
         "\"intermediate_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2,"
         "\"rope_parameters\":{\"mrope_section\":[2,3,3]}},\"vision_config\":{\"depth\":1,"
         "\"hidden_size\":8,\"num_heads\":2,\"out_hidden_size\":32,"
         "\"deepstack_visual_indexes\":[3]}}",
         "vision_config.deepstack_visual_indexes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        int rc = parse_text(cases[i].json);
        if (rc == 0) fail_msg("case %zu parsed but should fail on %s", i, cases[i].field);
        assert_error_mentions(cases[i].field, "inline.json");
    }
}

static void test_malformed_json(void **state) {
    (void)state;
    assert_int_equal(parse_text("{\"model_type\": \"qwen3\","), STRATA_EFORMAT);
    assert_error_mentions("inline.json", "JSON");
    assert_int_equal(parse_text("[1,2]"), STRATA_EFORMAT);
    assert_int_equal(parse_text("{\"model_type\":\"qwen3\"} trailing"), STRATA_EFORMAT);
    assert_error_mentions("inline.json", "after the JSON object");
    assert_int_equal(parse_text("{\"model_type\": 3,}"), STRATA_EFORMAT);
    assert_error_mentions("inline.json", "near byte 17");
    assert_int_equal(model_config_parse(&cfg, "", 0, "empty.json"), STRATA_EFORMAT);
    assert_error_mentions("empty.json", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_v4_form),
        cmocka_unit_test(test_qwen3_v5_rope_parameters),
        cmocka_unit_test(test_qwen3_default_theta),
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_moe_layer_rule),
        cmocka_unit_test(test_qwen3_vl),
        cmocka_unit_test(test_qwen3_vl_moe_v5),
        cmocka_unit_test(test_vl_defaults_and_tie_fallback),
        cmocka_unit_test(test_missing_field_names_field_and_file),
        cmocka_unit_test(test_invalid_fields),
        cmocka_unit_test(test_malformed_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
