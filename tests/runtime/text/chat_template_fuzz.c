/* libFuzzer target for JSON conversations and both chat templates: any bytes must parse or
 * fail with a message, and a parsed conversation must render (or be refused) under every
 * option, never crash, leak or read out of bounds. The first byte picks the options. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/text/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *json = malloc(size);
    if (!json) return 0;
    memcpy(json, data + 1, size - 1);
    json[size - 1] = '\0';
    struct chat_conversation conv;
    if (chat_conversation_from_json(&conv, json) == 0) {
        struct chat_options o = {data[0] & 1, (int)((data[0] >> 1) % 3) - 1, (data[0] >> 3) & 1};
        for (int kind = CHAT_TEMPLATE_QWEN3; kind <= CHAT_TEMPLATE_QWEN3_VL; kind++) {
            char *out;
            size_t len;
            if (chat_template_render((enum chat_template_kind)kind, conv.messages, conv.n, &o, &out,
                                     &len) == 0)
                free(out);
        }
        chat_conversation_free(&conv);
    }
    free(json);
    return 0;
}
