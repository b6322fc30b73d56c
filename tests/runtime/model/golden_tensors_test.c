/* Cross-check of runtime/stage_tensors against the checkpoints Hugging Face transformers
 * wrote for the golden fixtures (tests/golden/<case>): every tensor the spec-derived list
 * names exists with the expected shape, the checkpoint holds nothing else, and the
 * stages of every even split together price exactly the file's bytes (the tied
 * embedding counted once more on the last stage). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/stage_plan.h"
#include "runtime/model/stage_tensors.h"
#include "tests/test_util.h"

static void check_case(const char *dir) {
    struct model_config cfg;
    struct safetensors *st = NULL;
    if (model_config_load(&cfg, dir) != 0) fail_msg("%s", strata_last_error());
    if (safetensors_open(&st, dir) != 0) fail_msg("%s", strata_last_error());
    struct stage_tensor_list list;
    /* The vision tower (VL goldens) belongs to the first stage. */
    struct stage_role all = {0, cfg.num_layers, 1, 1, cfg.has_vision};
    assert_int_equal(stage_tensor_list_build(&list, &cfg, &all, st), 0);
    if (stage_tensor_list_check(&list, st, dir) != 0) fail_msg("%s", strata_last_error());
    assert_int_equal(list.count, safetensors_count(st));
    uint64_t file_bytes = 0;
    for (int i = 0; i < safetensors_count(st); ++i)
        file_bytes += safetensors_at(st, i)->nbytes;
    assert_true(stage_tensor_list_bytes(&list, st) == file_bytes);
    char embed_name[128];
    snprintf(embed_name, sizeof embed_name, "%sembed_tokens.weight", cfg.tensor_prefix);
    uint64_t embed = list.head_is_embed ? safetensors_find(st, embed_name)->nbytes : 0;
    stage_tensor_list_free(&list);

    for (int S = 2; S <= cfg.num_layers; ++S) {
        struct stage_range r[STAGE_PLAN_MAX_STAGES];
        assert_int_equal(stage_plan_even(r, cfg.num_layers, S), 0);
        uint64_t sum = 0;
        for (int s = 0; s < S; ++s) {
            struct stage_role role = {r[s].layer_start, r[s].layer_end, s == 0, s == S - 1,
                                      s == 0 && cfg.has_vision};
            assert_int_equal(stage_tensor_list_build(&list, &cfg, &role, st), 0);
            if (stage_tensor_list_check(&list, st, dir) != 0) fail_msg("%s", strata_last_error());
            sum += stage_tensor_list_bytes(&list, st);
            stage_tensor_list_free(&list);
        }
        assert_true(sum == file_bytes + embed);
    }
    safetensors_close(st);
}

static void test_golden_checkpoints(void **state) {
    (void)state;
    char root[4096];
    snprintf(root, sizeof root, "%s", test_path("tests/golden"));
    DIR *d = opendir(root);
    assert_non_null(d);
    int cases = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char dir[4096 + 256], config[4096 + 300];
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        snprintf(config, sizeof config, "%s/config.json", dir);
        FILE *f = e->d_name[0] == '.' ? NULL : fopen(config, "r");
        if (!f) continue;
        fclose(f);
        printf("checking %s\n", e->d_name);
        check_case(dir);
        ++cases;
    }
    closedir(d);
    assert_true(cases >= 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_golden_checkpoints)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
