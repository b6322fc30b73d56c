/* Chat templates of Qwen3 (text) and Qwen3-VL Instruct, rendered in C without a Jinja engine,
 * byte-identical to transformers' apply_chat_template(messages, tokenize=False, ...) (4.57.1:
 * Jinja with trim_blocks and lstrip_blocks, src/transformers/utils/chat_template_utils.py).
 * The template sources and their rules: /work/shared/spec/qwen3-vl-preprocessing.md §9.1 (Qwen3,
 * tokenizer_config.json of Qwen/Qwen3-*) and §9.2 (Qwen3-VL-*-Instruct chat_template.json).
 *
 * Only these two templates are rendered. A model directory's template is identified by its exact
 * text (chat_template_load); any other template is refused with an error naming the file rather
 * than rendered differently. Tools / function calling are out of scope: there is no `tools`
 * argument, and chat_conversation_from_json refuses `tool_calls` and `tool` messages.
 *
 * Image parts render as `<|vision_start|><|image_pad|><|vision_end|>` with ONE pad per image
 * (video: one `<|video_pad|>`), as the template does; the vision path replaces each pad by the
 * image's grid_t*grid_h*grid_w/4 pads later (spec §8.2). Errors follow runtime/base/status.h. */
#ifndef STRATA_RUNTIME_TEXT_CHAT_TEMPLATE_H
#define STRATA_RUNTIME_TEXT_CHAT_TEMPLATE_H

#include <stddef.h>

enum chat_template_kind {
    CHAT_TEMPLATE_QWEN3 = 1,    /* Qwen/Qwen3-* tokenizer_config.json (thinking models) */
    CHAT_TEMPLATE_QWEN3_VL = 2, /* Qwen/Qwen3-VL-*-Instruct chat_template.json */
};

/* "qwen3" / "qwen3_vl" (the golden file's names), or "unknown". */
const char *chat_template_name(enum chat_template_kind kind);

/* Identifies a template by its text (a trailing newline is ignored: Jinja drops it). `source`
 * names where the text came from, for the error. STRATA_EFORMAT for any other template. */
int chat_template_identify(enum chat_template_kind *kind, const char *text, const char *source);

/* Finds the chat template of a model directory where transformers does: chat_template.jinja,
 * else chat_template.json's "chat_template" (processors, Qwen3-VL), else tokenizer_config.json's
 * "chat_template" (tokenizers, Qwen3), and identifies it. STRATA_ENOTFOUND when there is none,
 * STRATA_EFORMAT for a malformed file or an unknown template (the message names the file). */
int chat_template_load(enum chat_template_kind *kind, const char *dir);

enum chat_role { CHAT_ROLE_SYSTEM, CHAT_ROLE_USER, CHAT_ROLE_ASSISTANT };

enum chat_part_kind { CHAT_PART_TEXT, CHAT_PART_IMAGE, CHAT_PART_VIDEO };

struct chat_part {
    enum chat_part_kind kind;
    const char *text; /* CHAT_PART_TEXT only: NUL-terminated UTF-8 */
};

/* One message. Content is either a string (`content`, parts NULL) or a list of parts (the
 * Qwen3-VL form; `content` NULL). reasoning_content NULL means "not given" (Qwen3 then takes the
 * reasoning from <think>...</think> inside content); "" is given-but-empty, as in the template. */
struct chat_message {
    enum chat_role role;
    const char *content;
    const struct chat_part *parts;
    size_t n_parts;
    const char *reasoning_content;
};

/* enable_thinking: Qwen3 appends the empty think block "<think>\n\n</think>\n\n" to the
 * generation prompt only when it is given and false (CHAT_THINKING_OFF); true and not given
 * render the same. Qwen3-VL Instruct ignores it. add_vision_id (Qwen3-VL): "Picture k: " before
 * the k-th image of the conversation, "Video k: " before videos. */
enum { CHAT_THINKING_UNSET = -1, CHAT_THINKING_OFF = 0, CHAT_THINKING_ON = 1 };
struct chat_options {
    int add_generation_prompt;
    int enable_thinking;
    int add_vision_id;
};

/* Renders messages[0..n) into a malloc'ed NUL-terminated string (*len bytes without the NUL).
 * STRATA_EINVAL for what the template cannot render or what is out of scope: no messages, list
 * content with the Qwen3 text template, a part without text. */
int chat_template_render(enum chat_template_kind kind, const struct chat_message *messages,
                         size_t n, const struct chat_options *options, char **out, size_t *len);

/* Messages from JSON in the shape transformers takes: [{"role": "user", "content": "..." |
 * [{"type": "image"} | {"type": "text", "text": "..."} | ...], "reasoning_content": "..."}].
 * A part is an image when its type is "image" or it has an "image" or "image_url" key, a video
 * when its type is "video" or it has a "video" key, else text when it has a "text" key, else it
 * renders nothing and is dropped (the Qwen3-VL template's order of tests). Roles other than
 * system/user/assistant, "tool_calls" and "tools" are refused (STRATA_EINVAL); malformed JSON
 * is STRATA_EFORMAT. The conversation owns everything; free it with chat_conversation_free. */
struct chat_conversation {
    struct chat_message *messages;
    size_t n;
    void *priv;
};
int chat_conversation_from_json(struct chat_conversation *conv, const char *json);
void chat_conversation_free(struct chat_conversation *conv);

#endif
