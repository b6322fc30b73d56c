/* See mini_tokenizer.h. */
#include "tests/runtime/text/mini_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned mini_byte_cp(unsigned b) {
    unsigned n = 0;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    for (unsigned i = 0; i < b; ++i)
        n += !((i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE);
    return 256 + n;
}

char *mini_tokenizer_json(const char *extra) {
    size_t cap = 64 * 1024, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    n += (size_t)snprintf(s + n, cap - n, "{%s\"model\": {\"type\": \"BPE\", \"vocab\": {", extra);
    for (unsigned b = 0; b < 256; ++b)
        n += (size_t)snprintf(s + n, cap - n, "\"\\u%04x\": %u, ", mini_byte_cp(b), b);
    n += (size_t)snprintf(
        s + n, cap - n,
        "\"in\": 256, \"aa\": 257, \"\\u0120t\": 258, \"he\": 259, \"\\u0120the\": 260, "
        "\"aaaa\": 261}, \"merges\": [[\"i\", \"n\"], [\"a\", \"a\"], [\"\\u0120\", \"t\"], "
        "\"h e\", [\"\\u0120t\", \"he\"], [\"aa\", \"aa\"]]}, "
        "\"added_tokens\": ["
        "{\"id\": 300, \"content\": \"<|im_start|>\", \"special\": true, \"normalized\": false},"
        "{\"id\": 301, \"content\": \"<t>\", \"special\": false, \"normalized\": false},"
        "{\"id\": 302, \"content\": \"<t>x\", \"special\": false, \"normalized\": false},"
        "{\"id\": 303, \"content\": \"<\\u00e9>\", \"special\": false, \"normalized\": true}],"
        "\"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": {\"type\": \"Sequence\", "
        "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, "
        "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "
        "\"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]}, "
        "\"decoder\": {\"type\": \"ByteLevel\"}}");
    return s;
}
