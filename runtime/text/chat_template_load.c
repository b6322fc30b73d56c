/* Which chat template a model directory has (identified by its exact text), and conversations
 * from JSON in the shape transformers' apply_chat_template takes. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/text/chat_template.h"

/* FNV-1a 64 and byte length of the known templates' text without its trailing newline (Jinja
 * drops one final newline, so both spellings render the same):
 * - Qwen3: the chat_template of Qwen/Qwen3-* tokenizer_config.json (4116 bytes, as in
 *   tests/runtime/text/testdata/qwen3-tokenizer/tokenizer_config.json; spec §9.1);
 * - Qwen3-VL Instruct: chat_template.json of Qwen/Qwen3-VL-*-Instruct (5292 bytes with the
 *   newline, SHA-256 3636d0f0...89e4; tests/runtime/text/testdata/qwen3-vl-chat-template).
 * Not adversarial input: a collision could only make us render one of these two templates. */
static const struct {
    uint64_t fnv;
    size_t len;
    enum chat_template_kind kind;
} known[] = {
    {0x2bfdb7aa9754484eULL, 4116, CHAT_TEMPLATE_QWEN3},
    {0x99ac253185d6f7c1ULL, 5291, CHAT_TEMPLATE_QWEN3_VL},
};

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

int chat_template_identify(enum chat_template_kind *kind, const char *text, const char *source) {
    size_t n = strlen(text);
    if (n && text[n - 1] == '\n') n--;
    uint64_t h = fnv1a(text, n);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (known[i].len == n && known[i].fnv == h) {
            *kind = known[i].kind;
            return 0;
        }
    return strata_set_error(STRATA_EFORMAT,
                            "%s: unknown chat template (%zu bytes); only the Qwen3 and "
                            "Qwen3-VL Instruct templates are rendered, refusing to render "
                            "something different",
                            source, n);
}

/* The "chat_template" string of a JSON file. 1 when the file does not exist, 0 found. */
static int template_from_json(char **out, const char *path) {
    char *text;
    size_t len;
    int rc = cli_read_file(&text, &len, path);
    if (rc == STRATA_ENOTFOUND) return 1;
    if (rc < 0) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return strata_set_error(STRATA_EFORMAT, "%s: not valid JSON", path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (!t) {
        cJSON_Delete(root);
        return 1;
    }
    /* A list of named templates (tool_use, rag, ...) is another template family. */
    if (!cJSON_IsString(t)) {
        cJSON_Delete(root);
        return strata_set_error(STRATA_EFORMAT,
                                "%s: chat_template is not a string (named template lists are "
                                "not supported)",
                                path);
    }
    *out = strdup(t->valuestring);
    cJSON_Delete(root);
    return *out ? 0 : strata_set_error(STRATA_ENOMEM, "no memory for %s", path);
}

int chat_template_load(enum chat_template_kind *kind, const char *dir) {
    static const char *const files[] = {"chat_template.jinja", "chat_template.json",
                                        "tokenizer_config.json"};
    char path[4096];
    for (int f = 0; f < 3; f++) {
        char *text = NULL;
        size_t len;
        int rc;
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        if (f == 0) {
            rc = cli_read_file(&text, &len, path);
            if (rc == STRATA_ENOTFOUND) continue;
        } else {
            rc = template_from_json(&text, path);
            if (rc == 1) continue;
        }
        if (rc < 0) return rc;
        rc = chat_template_identify(kind, text, path);
        free(text);
        return rc;
    }
    return strata_set_error(STRATA_ENOTFOUND,
                            "%s has no chat template (looked for chat_template.jinja, "
                            "chat_template.json and tokenizer_config.json's chat_template)",
                            dir);
}

/* What a JSON conversation owns: the cJSON tree (its strings are the messages' text), the
 * message array and one part array per list content. */
struct conv_priv {
    cJSON *root;
    struct chat_part **parts;
    size_t n_parts;
};

/* A list content's parts, classified in the order the Qwen3-VL template tests them. */
static int parse_parts(struct chat_message *m, const cJSON *list, size_t i, struct conv_priv *p) {
    size_t n = (size_t)cJSON_GetArraySize(list), k = 0;
    struct chat_part *parts = calloc(n ? n : 1, sizeof *parts);
    if (!parts) return strata_set_error(STRATA_ENOMEM, "no memory for message parts");
    p->parts[p->n_parts++] = parts;
    const cJSON *item;
    cJSON_ArrayForEach(item, list) {
        if (!cJSON_IsObject(item))
            return strata_set_error(STRATA_EINVAL, "message %zu: a content part is not an object",
                                    i);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(item, "text");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (text && !cJSON_IsString(text))
            return strata_set_error(STRATA_EINVAL, "message %zu: a part's text is not a string", i);
        parts[k].text = text ? text->valuestring : NULL;
        if (!strcmp(t, "image") || cJSON_HasObjectItem(item, "image") ||
            cJSON_HasObjectItem(item, "image_url"))
            parts[k].kind = CHAT_PART_IMAGE;
        else if (!strcmp(t, "video") || cJSON_HasObjectItem(item, "video"))
            parts[k].kind = CHAT_PART_VIDEO;
        else if (text)
            parts[k].kind = CHAT_PART_TEXT;
        else
            continue; /* renders nothing in the template */
        k++;
    }
    m->parts = parts;
    m->n_parts = k;
    return 0;
}

static int parse_message(struct chat_message *m, const cJSON *obj, size_t i, struct conv_priv *p) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(obj, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(obj, "content");
    const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(obj, "reasoning_content");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(obj, "tool_calls");
    if (!cJSON_IsObject(obj) || !cJSON_IsString(role))
        return strata_set_error(STRATA_EINVAL, "message %zu: not an object with a role", i);
    if (!strcmp(role->valuestring, "system"))
        m->role = CHAT_ROLE_SYSTEM;
    else if (!strcmp(role->valuestring, "user"))
        m->role = CHAT_ROLE_USER;
    else if (!strcmp(role->valuestring, "assistant"))
        m->role = CHAT_ROLE_ASSISTANT;
    else
        return strata_set_error(STRATA_EINVAL,
                                "message %zu: role '%s' is not supported (system, user, "
                                "assistant; tools and function calling are out of scope)",
                                i, role->valuestring);
    if (calls && !cJSON_IsNull(calls) && cJSON_GetArraySize(calls) > 0)
        return strata_set_error(STRATA_EINVAL,
                                "message %zu: tool_calls are not supported (function calling "
                                "is out of scope)",
                                i);
    if (reasoning && !cJSON_IsNull(reasoning)) {
        if (!cJSON_IsString(reasoning))
            return strata_set_error(STRATA_EINVAL,
                                    "message %zu: reasoning_content is not a "
                                    "string",
                                    i);
        m->reasoning_content = reasoning->valuestring;
    }
    if (cJSON_IsString(content)) {
        m->content = content->valuestring;
        return 0;
    }
    if (cJSON_IsArray(content)) return parse_parts(m, content, i, p);
    return strata_set_error(STRATA_EINVAL, "message %zu: content is neither a string nor a list",
                            i);
}

int chat_conversation_from_json(struct chat_conversation *conv, const char *json) {
    memset(conv, 0, sizeof *conv);
    struct conv_priv *p = calloc(1, sizeof *p);
    if (!p) return strata_set_error(STRATA_ENOMEM, "no memory for a conversation");
    conv->priv = p;
    p->root = cJSON_Parse(json);
    if (!p->root || !cJSON_IsArray(p->root)) {
        chat_conversation_free(conv);
        return strata_set_error(STRATA_EFORMAT, "messages are not a JSON array");
    }
    size_t n = (size_t)cJSON_GetArraySize(p->root);
    conv->messages = calloc(n ? n : 1, sizeof *conv->messages);
    p->parts = calloc(n ? n : 1, sizeof *p->parts);
    if (!conv->messages || !p->parts) {
        chat_conversation_free(conv);
        return strata_set_error(STRATA_ENOMEM, "no memory for %zu messages", n);
    }
    const cJSON *obj;
    cJSON_ArrayForEach(obj, p->root) {
        int rc = parse_message(&conv->messages[conv->n], obj, conv->n, p);
        if (rc < 0) {
            chat_conversation_free(conv);
            return rc;
        }
        conv->n++;
    }
    return 0;
}

void chat_conversation_free(struct chat_conversation *conv) {
    struct conv_priv *p = conv->priv;
    if (p) {
        for (size_t i = 0; i < p->n_parts; i++)
            free(p->parts[i]);
        free(p->parts);
        cJSON_Delete(p->root);
        free(p);
    }
    free(conv->messages);
    memset(conv, 0, sizeof *conv);
}
