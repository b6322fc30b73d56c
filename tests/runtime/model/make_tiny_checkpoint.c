/* Regenerates the committed demo checkpoint tests/runtime/testdata/tiny_qwen3 (a 4-layer
 * qwen3 with H=16, bf16, untied LM head; about 30 KB) so `strata-plan` has a real model
 * to plan without downloads. Run:
 *   bazel run //tests/runtime:make_tiny_checkpoint -- $PWD/tests/runtime/testdata/tiny_qwen3
 * The output is deterministic (fixed seed). */
#include <stdio.h>
#include <string.h>

#include "runtime/base/status.h"
#include "tests/runtime/model/tiny_checkpoint.h"

static const char *const tiny_qwen3_config = "{\n"
                                             "  \"architectures\": [\"Qwen3ForCausalLM\"],\n"
                                             "  \"model_type\": \"qwen3\",\n"
                                             "  \"vocab_size\": 128,\n"
                                             "  \"hidden_size\": 16,\n"
                                             "  \"intermediate_size\": 32,\n"
                                             "  \"num_hidden_layers\": 4,\n"
                                             "  \"num_attention_heads\": 2,\n"
                                             "  \"num_key_value_heads\": 1,\n"
                                             "  \"head_dim\": 8,\n"
                                             "  \"hidden_act\": \"silu\",\n"
                                             "  \"rms_norm_eps\": 1e-06,\n"
                                             "  \"rope_theta\": 1000000.0,\n"
                                             "  \"rope_scaling\": null,\n"
                                             "  \"attention_bias\": false,\n"
                                             "  \"tie_word_embeddings\": false,\n"
                                             "  \"max_position_embeddings\": 512,\n"
                                             "  \"eos_token_id\": 1,\n"
                                             "  \"torch_dtype\": \"bfloat16\"\n"
                                             "}\n";

int main(int argc, char **argv) {
    if (argc != 2 || strcmp(argv[1], "--help") == 0) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: make_tiny_checkpoint OUT_DIR\n"
                "Writes OUT_DIR/config.json and OUT_DIR/model.safetensors (tiny qwen3).\n");
        return argc == 2 ? STRATA_EXIT_OK : STRATA_EXIT_USAGE;
    }
    struct tiny_checkpoint_options opt = {ST_BF16, 20261122, 0, 0, NULL};
    if (tiny_checkpoint_write(argv[1], tiny_qwen3_config, &opt) != 0) {
        fprintf(stderr, "make_tiny_checkpoint: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    printf("wrote %s/config.json and %s/model.safetensors\n", argv[1], argv[1]);
    return STRATA_EXIT_OK;
}
