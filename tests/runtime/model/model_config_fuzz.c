/* libFuzzer target for the config.json parser: any bytes must parse or fail with a
 * message, never crash, leak or read out of bounds. When a config parses, the layer rule
 * and the summary are exercised on it too. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/model/model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct model_config *cfg = malloc(sizeof *cfg);
    if (!cfg) return 0;
    if (model_config_parse(cfg, (const char *)data, size, "fuzz.json") == 0) {
        char buf[256];
        model_config_describe(cfg, buf, sizeof buf);
        for (int l = -1; l <= cfg->num_layers; ++l)
            (void)model_config_layer_is_moe(cfg, l);
    }
    free(cfg);
    return 0;
}
