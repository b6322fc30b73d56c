/* cmocka tests for runtime/stage_tensors: per-stage tensor lists for dense, MoE
 * (per-expert and fused), VL and tied models; the checker reporting every missing or
 * mis-shaped tensor in one error; exact byte sums against real files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_tensors.h"
#include "tests/runtime/model/st_writer.h"
#include "tests/runtime/model/tiny_checkpoint.h"
#include "tests/test_util.h"

static char tmp_root[1024];

static const char *tmp_path(const char *name) {
    static char buf[2048];
    snprintf(buf, sizeof buf, "%s/%s", tmp_root, name);
    return buf;
}

#define DENSE_CONFIG(tie, bias)                                                                    \
    "{\"model_type\":\"qwen3\",\"vocab_size\":64,\"hidden_size\":16,\"intermediate_size\":24,"     \
    "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"                 \
    "\"head_dim\":8,\"tie_word_embeddings\":" tie ",\"attention_bias\":" bias ","                  \
    "\"torch_dtype\":\"bfloat16\"}"

static const char *moe_config =
    "{\"model_type\":\"qwen3_moe\",\"vocab_size\":64,\"hidden_size\":16,"
    "\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_hidden_layers\":4,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8,\"num_experts\":4,"
    "\"num_experts_per_tok\":2,\"decoder_sparse_step\":2,\"mlp_only_layers\":[3]}";

static const char *vl_moe_config =
    "{\"model_type\":\"qwen3_vl_moe\",\"text_config\":{\"vocab_size\":64,\"hidden_size\":16,"
    "\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8,\"num_experts\":4,"
    "\"num_experts_per_tok\":2,\"rope_parameters\":{\"mrope_section\":[2,1,1]}},"
    "\"vision_config\":{\"depth\":2,\"hidden_size\":8,\"intermediate_size\":12,\"num_heads\":2,"
    "\"out_hidden_size\":16,\"patch_size\":2,\"num_position_embeddings\":16,"
    "\"deepstack_visual_indexes\":[0,1]}}";

static void parse(struct model_config *cfg, const char *json) {
    if (model_config_parse(cfg, json, strlen(json), "test.json") != 0)
        fail_msg("config: %s", strata_last_error());
}

static int has_name(const struct stage_tensor_list *list, const char *name) {
    return stage_tensor_list_find(list, name) >= 0;
}

static void test_dense_stages(void **state) {
    (void)state;
    struct model_config cfg;
    parse(&cfg, DENSE_CONFIG("false", "false"));
    struct stage_tensor_list first, last;
    struct stage_role r0 = {0, 2, 1, 0, 0}, r1 = {2, 4, 0, 1, 0};
    assert_int_equal(stage_tensor_list_build(&first, &cfg, &r0, NULL), 0);
    assert_int_equal(stage_tensor_list_build(&last, &cfg, &r1, NULL), 0);
    /* 11 tensors per dense layer without biases. */
    assert_int_equal(first.count, 1 + 2 * 11);
    assert_int_equal(last.count, 2 * 11 + 2);
    assert_true(has_name(&first, "model.embed_tokens.weight"));
    assert_true(has_name(&first, "model.layers.1.self_attn.k_norm.weight"));
    assert_false(has_name(&first, "model.layers.2.input_layernorm.weight"));
    assert_false(has_name(&first, "model.norm.weight"));
    assert_true(has_name(&last, "model.norm.weight"));
    assert_true(has_name(&last, "lm_head.weight"));
    assert_false(has_name(&last, "model.embed_tokens.weight"));
    assert_int_equal(last.head_is_embed, 0);
    const struct stage_tensor *q =
        &first.items[stage_tensor_list_find(&first, "model.layers.0.self_attn.q_proj.weight")];
    assert_int_equal(q->kind, STAGE_TENSOR_LAYER);
    assert_int_equal(q->layer, 0);
    assert_int_equal(q->shape[0], 32); /* nh × D */
    assert_int_equal(q->shape[1], 16);
    const struct stage_tensor *k =
        &first.items[stage_tensor_list_find(&first, "model.layers.1.self_attn.k_proj.weight")];
    assert_int_equal(k->shape[0], 16); /* nkv × D */
    assert_int_equal(
        first.items[stage_tensor_list_find(&first, "model.layers.0.mlp.down_proj.weight")].shape[1],
        24);
    stage_tensor_list_free(&first);
    stage_tensor_list_free(&last);

    parse(&cfg, DENSE_CONFIG("false", "true"));
    struct stage_role mid = {1, 2, 0, 0, 0};
    assert_int_equal(stage_tensor_list_build(&first, &cfg, &mid, NULL), 0);
    assert_int_equal(first.count, 15);
    assert_true(has_name(&first, "model.layers.1.self_attn.o_proj.bias"));
    stage_tensor_list_free(&first);

    struct stage_role bad = {3, 5, 0, 1, 0};
    assert_int_equal(stage_tensor_list_build(&first, &cfg, &bad, NULL), STRATA_ERANGE);
    assert_int_equal(first.count, 0);
}

static void test_tied_head(void **state) {
    (void)state;
    struct model_config cfg;
    parse(&cfg, DENSE_CONFIG("true", "false"));
    struct stage_tensor_list list;
    struct stage_role last = {2, 4, 0, 1, 0}, single = {0, 4, 1, 1, 0};
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &last, NULL), 0);
    assert_int_equal(list.head_is_embed, 1);
    assert_true(has_name(&list, "model.embed_tokens.weight"));
    assert_false(has_name(&list, "lm_head.weight"));
    stage_tensor_list_free(&list);
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &single, NULL), 0);
    int embeds = 0;
    for (int i = 0; i < list.count; ++i)
        embeds += list.items[i].kind == STAGE_TENSOR_EMBED;
    assert_int_equal(embeds, 1);
    stage_tensor_list_free(&list);

    /* Untied config, but the checkpoint has no lm_head.weight: the embedding is the head. */
    parse(&cfg, DENSE_CONFIG("false", "false"));
    struct tiny_checkpoint_options opt = {ST_BF16, 1, 0, 1, NULL};
    assert_int_equal(
        tiny_checkpoint_write(tmp_path("no_head"), DENSE_CONFIG("false", "false"), &opt), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, tmp_path("no_head")), 0);
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &last, st), 0);
    assert_int_equal(list.head_is_embed, 1);
    assert_false(has_name(&list, "lm_head.weight"));
    assert_int_equal(stage_tensor_list_check(&list, st, "no_head"), 0);
    stage_tensor_list_free(&list);
    safetensors_close(st);
}

static void test_moe_per_expert_and_fused(void **state) {
    (void)state;
    struct model_config cfg;
    parse(&cfg, moe_config);
    struct stage_tensor_list list;
    struct stage_role all = {0, 4, 0, 0, 0};
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &all, NULL), 0);
    /* step 2 + mlp_only [3]: only layer 1 is MoE (router + 4 experts × 3). */
    assert_int_equal(list.count, 4 * 8 + 3 * 3 + (1 + 4 * 3));
    assert_true(has_name(&list, "model.layers.1.mlp.gate.weight"));
    assert_true(has_name(&list, "model.layers.1.mlp.experts.3.down_proj.weight"));
    assert_false(has_name(&list, "model.layers.3.mlp.gate.weight"));
    assert_true(has_name(&list, "model.layers.3.mlp.up_proj.weight"));
    int gate = stage_tensor_list_find(&list, "model.layers.1.mlp.gate.weight");
    assert_int_equal(list.items[gate].shape[0], 4);
    int down = stage_tensor_list_find(&list, "model.layers.1.mlp.experts.0.down_proj.weight");
    assert_int_equal(list.items[down].shape[0], 16);
    assert_int_equal(list.items[down].shape[1], 8);
    stage_tensor_list_free(&list);

    /* A qwen3_moe checkpoint with fused experts (either orientation accepted). */
    struct st_write_tensor fused[] = {
        {"model.layers.1.mlp.experts.gate_up_proj", ST_F32, 3, {4, 16, 16}, NULL},
        {"model.layers.1.mlp.experts.down_proj", ST_F32, 3, {4, 8, 16}, NULL},
    };
    assert_int_equal(st_write(tmp_path("fused.safetensors"), fused, 2), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, tmp_path("fused.safetensors")), 0);
    struct stage_role layer1 = {1, 2, 0, 0, 0};
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &layer1, st), 0);
    assert_true(has_name(&list, "model.layers.1.mlp.experts.gate_up_proj"));
    assert_false(has_name(&list, "model.layers.1.mlp.experts.0.gate_proj.weight"));
    assert_int_equal(list.count, 8 + 1 + 2);
    /* gate_up [4,16,16] reads as the expected [E,2I,H]; down [4,8,16] is input-major. */
    int gu = stage_tensor_list_find(&list, "model.layers.1.mlp.experts.gate_up_proj");
    int dp = stage_tensor_list_find(&list, "model.layers.1.mlp.experts.down_proj");
    assert_int_equal(list.items[gu].slot, STAGE_SLOT_EXPERTS_GATE_UP);
    assert_int_equal(
        stage_tensor_stored_layout(&list.items[gu], safetensors_find(st, fused[0].name)),
        STAGE_LAYOUT_OUT_MAJOR);
    assert_int_equal(
        stage_tensor_stored_layout(&list.items[dp], safetensors_find(st, fused[1].name)),
        STAGE_LAYOUT_IN_MAJOR);
    /* Only the fused pair is present: the checker lists the 9 attention/norm/router tensors. */
    assert_int_equal(stage_tensor_list_check(&list, st, "fused"), STRATA_ENOTFOUND);
    assert_non_null(strstr(strata_last_error(), "9 tensor(s) missing"));
    assert_null(strstr(strata_last_error(), "gate_up_proj"));
    stage_tensor_list_free(&list);
    safetensors_close(st);

    /* Fused experts are never widened: F16 is reported with the accepted dtypes. */
    fused[0].dtype = ST_F16;
    assert_int_equal(st_write(tmp_path("fused_f16.safetensors"), fused, 2), 0);
    assert_int_equal(safetensors_open(&st, tmp_path("fused_f16.safetensors")), 0);
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &layer1, st), 0);
    assert_int_equal(stage_tensor_list_check(&list, st, "fused"), STRATA_ENOTFOUND);
    assert_non_null(strstr(strata_last_error(), "1 with the wrong shape or dtype: "
                                                "model.layers.1.mlp.experts.gate_up_proj is F16, "
                                                "expected BF16 or F32"));
    stage_tensor_list_free(&list);
    safetensors_close(st);
}

static void test_vl_moe_and_vision(void **state) {
    (void)state;
    struct model_config cfg;
    parse(&cfg, vl_moe_config);
    struct stage_tensor_list list;
    struct stage_role first = {0, 1, 1, 0, 1};
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &first, NULL), 0);
    int gu =
        stage_tensor_list_find(&list, "model.language_model.layers.0.mlp.experts.gate_up_proj");
    assert_true(gu >= 0);
    assert_int_equal(list.items[gu].shape[0], 4);
    assert_int_equal(list.items[gu].shape[1], 16); /* [E, H, 2I] input-major */
    assert_int_equal(list.items[gu].shape[2], 16);
    int dp = stage_tensor_list_find(&list, "model.language_model.layers.0.mlp.experts.down_proj");
    assert_int_equal(list.items[dp].shape[1], 8); /* [E, I, H] */
    assert_true(has_name(&list, "model.language_model.embed_tokens.weight"));
    int patch = stage_tensor_list_find(&list, "model.visual.patch_embed.proj.weight");
    assert_true(patch >= 0);
    assert_int_equal(list.items[patch].ndim, 5);
    assert_true(has_name(&list, "model.visual.blocks.1.mlp.linear_fc2.bias"));
    int ds = stage_tensor_list_find(&list, "model.visual.deepstack_merger_list.1.norm.weight");
    assert_int_equal(list.items[ds].shape[0], 8 * 4); /* Hm = Hv × m² */
    int mn = stage_tensor_list_find(&list, "model.visual.merger.norm.weight");
    assert_int_equal(list.items[mn].shape[0], 8); /* Hv */
    /* Vision entries carry their part and index, so a loader never parses names. */
    assert_int_equal(list.items[patch].vision, STAGE_VIS_PATCH_W);
    assert_int_equal(list.items[ds].vision, STAGE_VIS_MERGER_NORM_W);
    assert_int_equal(list.items[ds].vision_index, 1);
    assert_int_equal(list.items[mn].vision, STAGE_VIS_MERGER_NORM_W);
    assert_int_equal(list.items[mn].vision_index, -1);
    int fc2b = stage_tensor_list_find(&list, "model.visual.blocks.1.mlp.linear_fc2.bias");
    assert_int_equal(list.items[fc2b].vision, STAGE_VIS_FC2_B);
    assert_int_equal(list.items[fc2b].vision_index, 1);
    assert_int_equal(list.items[dp].vision, STAGE_VIS_NONE);
    int vision = 0;
    for (int i = 0; i < list.count; ++i)
        vision += list.items[i].kind == STAGE_TENSOR_VISION;
    assert_int_equal(vision, 3 + 2 * 12 + 6 * 3);
    stage_tensor_list_free(&list);

    /* A written VL-MoE checkpoint passes the check, a whole-model list included. */
    struct tiny_checkpoint_options opt = {ST_F32, 7, 1, 0, NULL};
    assert_int_equal(tiny_checkpoint_write(tmp_path("vl_moe"), vl_moe_config, &opt), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, tmp_path("vl_moe")), 0);
    struct stage_role all = {0, 2, 1, 1, 1};
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &all, st), 0);
    assert_int_equal(stage_tensor_list_check(&list, st, "vl_moe"), 0);
    assert_int_equal(list.count, safetensors_count(st));
    assert_true(stage_tensor_list_bytes(&list, st) == stage_tensor_list_bytes_estimate(&list, 4));
    stage_tensor_list_free(&list);
    safetensors_close(st);
}

static void test_check_reports_all_missing(void **state) {
    (void)state;
    struct model_config cfg;
    parse(&cfg, DENSE_CONFIG("false", "false"));
    struct tiny_checkpoint_options opt = {ST_BF16, 3, 0, 0, "self_attn.q_norm.weight"};
    assert_int_equal(
        tiny_checkpoint_write(tmp_path("no_qnorm"), DENSE_CONFIG("false", "false"), &opt), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, tmp_path("no_qnorm")), 0);
    struct stage_tensor_list list;
    struct stage_role all = {0, 4, 1, 1, 0};
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &all, st), 0);
    assert_int_equal(stage_tensor_list_check(&list, st, "no_qnorm"), STRATA_ENOTFOUND);
    const char *msg = strata_last_error();
    assert_non_null(strstr(msg, "no_qnorm: 4 tensor(s) missing"));
    for (int l = 0; l < 4; ++l) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_norm.weight", l);
        if (!strstr(msg, name)) fail_msg("missing %s in \"%s\"", name, msg);
    }
    FILE *report = tmpfile();
    assert_non_null(report);
    assert_int_equal(stage_tensor_list_report(report, &list, st), 4);
    rewind(report);
    char line[256];
    assert_non_null(fgets(line, sizeof line, report));
    assert_string_equal(line, "missing model.layers.0.self_attn.q_norm.weight\n");
    fclose(report);
    stage_tensor_list_free(&list);
    /* A head-only stage needs none of the missing tensors. */
    struct stage_role head_only = {0, 0, 0, 1, 0};
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &head_only, st), 0);
    assert_int_equal(stage_tensor_list_check(&list, st, "no_qnorm"), 0);
    stage_tensor_list_free(&list);
    safetensors_close(st);

    /* Wrong shapes: a checkpoint written for intermediate 24 checked as intermediate 32. */
    struct model_config wider;
    const char *json = "{\"model_type\":\"qwen3\",\"vocab_size\":64,\"hidden_size\":16,"
                       "\"intermediate_size\":32,\"num_hidden_layers\":4,"
                       "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":8}";
    parse(&wider, json);
    struct tiny_checkpoint_options full = {ST_BF16, 3, 0, 0, NULL};
    assert_int_equal(
        tiny_checkpoint_write(tmp_path("dense"), DENSE_CONFIG("false", "false"), &full), 0);
    assert_int_equal(safetensors_open(&st, tmp_path("dense")), 0);
    assert_int_equal(stage_tensor_list_build(&list, &wider, &all, st), 0);
    assert_int_equal(stage_tensor_list_check(&list, st, "dense"), STRATA_EFORMAT);
    msg = strata_last_error();
    assert_non_null(strstr(msg, "12 tensor(s) with the wrong shape"));
    assert_non_null(
        strstr(msg, "model.layers.0.mlp.gate_proj.weight is [24,16], expected [32,16]"));
    stage_tensor_list_free(&list);

    /* Exact bytes: two stages together hold every byte of the checkpoint. */
    struct stage_tensor_list a, b;
    struct stage_role r0 = {0, 1, 1, 0, 0}, r1 = {1, 4, 0, 1, 0};
    assert_int_equal(stage_tensor_list_build(&a, &cfg, &r0, st), 0);
    assert_int_equal(stage_tensor_list_build(&b, &cfg, &r1, st), 0);
    uint64_t total = 0;
    for (int i = 0; i < safetensors_count(st); ++i)
        total += safetensors_at(st, i)->nbytes;
    assert_true(stage_tensor_list_bytes(&a, st) + stage_tensor_list_bytes(&b, st) == total);
    assert_true(stage_tensor_list_bytes(&a, st) ==
                2 * (64 * 16 +
                     (uint64_t)(16 + 32 * 16 + 2 * 16 * 16 + 16 * 32 + 8 + 8 + 16 + 3 * 24 * 16)));
    stage_tensor_list_free(&a);
    stage_tensor_list_free(&b);
    safetensors_close(st);
}

int main(void) {
    const char *base = getenv("TEST_TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/stage_tensors_test", base ? base : "/tmp");
    mkdir(tmp_root, 0755);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_stages),
        cmocka_unit_test(test_tied_head),
        cmocka_unit_test(test_moe_per_expert_and_fused),
        cmocka_unit_test(test_vl_moe_and_vision),
        cmocka_unit_test(test_check_reports_all_missing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
