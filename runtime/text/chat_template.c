/* Qwen3 and Qwen3-VL Instruct chat templates, hand-translated from their Jinja sources (spec
 * qwen3-vl-preprocessing.md §9; the sources are in tokenizer_config.json of Qwen/Qwen3-* and in
 * tests/runtime/text/testdata/qwen3-vl-chat-template/chat_template.json). Every `{{- ... }}` of
 * the templates strips the whitespace before it and trim_blocks/lstrip_blocks remove the rest,
 * so the output is exactly the concatenation of the quoted strings and message fields below.
 * Python string methods used by the Qwen3 template (split, strip('\n')) are reproduced on
 * (pointer, length) spans. Truth: tests/runtime/text/testdata/chat_template_golden.jsonl. */
#include "runtime/text/chat_template.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"
#include "runtime/base/strbuf.h"

/* A piece of a string, for Python's str methods without copies. */
struct span {
    const char *p;
    size_t n;
};

static struct span span_of(const char *s) {
    struct span sp = {s, strlen(s)};
    return sp;
}

/* Offset of the first / last occurrence of `pat` in sp, or -1. */
static long span_find(struct span sp, const char *pat, int last) {
    size_t m = strlen(pat);
    long found = -1;
    for (size_t i = 0; i + m <= sp.n; i++)
        if (memcmp(sp.p + i, pat, m) == 0) {
            found = (long)i;
            if (!last) break;
        }
    return found;
}

static struct span lstrip_nl(struct span sp) {
    while (sp.n && sp.p[0] == '\n') {
        sp.p++;
        sp.n--;
    }
    return sp;
}

static struct span rstrip_nl(struct span sp) {
    while (sp.n && sp.p[sp.n - 1] == '\n')
        sp.n--;
    return sp;
}

static int starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

static const char *role_name(enum chat_role role) {
    return role == CHAT_ROLE_SYSTEM ? "system" : role == CHAT_ROLE_USER ? "user" : "assistant";
}

/* Qwen3: ns.last_query_index, the last user message that is not a tool response (a user
 * message wrapped in <tool_response>...</tool_response>); n-1 when there is none. */
static size_t qwen3_last_query(const struct chat_message *m, size_t n) {
    for (size_t k = n; k-- > 0;)
        if (m[k].role == CHAT_ROLE_USER && !(starts_with(m[k].content, "<tool_response>") &&
                                             ends_with(m[k].content, "</tool_response>")))
            return k;
    return n - 1;
}

/* Qwen3 assistant turn i. Without reasoning_content the reasoning is taken from the content:
 * content = content.split('</think>')[-1].lstrip('\n'), reasoning =
 * content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'). After the last
 * user query the <think> block is written back (always for the last message, else only when
 * the reasoning is non-empty); before it, only the content stays (history is stripped). */
static void qwen3_assistant(struct strbuf *b, const struct chat_message *m, int after_query,
                            int is_last) {
    struct span content = span_of(m->content), reasoning = {"", 0};
    if (m->reasoning_content) {
        reasoning = span_of(m->reasoning_content);
    } else if (span_find(content, "</think>", 0) >= 0) {
        long first = span_find(content, "</think>", 0), last = span_find(content, "</think>", 1);
        struct span before = {content.p, (size_t)first};
        before = rstrip_nl(before);
        long open = span_find(before, "<think>", 1);
        if (open >= 0) {
            before.p += open + 7;
            before.n -= (size_t)open + 7;
        }
        reasoning = lstrip_nl(before);
        content.p += last + 8;
        content.n -= (size_t)last + 8;
        content = lstrip_nl(content);
    }
    strbuf_puts(b, "<|im_start|>assistant\n");
    if (after_query && (is_last || reasoning.n > 0)) {
        struct span r = lstrip_nl(rstrip_nl(reasoning));
        strbuf_puts(b, "<think>\n");
        strbuf_put(b, r.p, r.n);
        strbuf_puts(b, "\n</think>\n\n");
        content = lstrip_nl(content);
    }
    strbuf_put(b, content.p, content.n);
    strbuf_puts(b, "<|im_end|>\n");
}

static int qwen3_render(struct strbuf *b, const struct chat_message *m, size_t n,
                        const struct chat_options *o) {
    for (size_t i = 0; i < n; i++)
        if (!m[i].content)
            return strata_set_error(STRATA_EINVAL,
                                    "message %zu: the Qwen3 text template takes string content "
                                    "only (image parts need a Qwen3-VL model)",
                                    i);
    if (m[0].role == CHAT_ROLE_SYSTEM) {
        strbuf_puts(b, "<|im_start|>system\n");
        strbuf_puts(b, m[0].content);
        strbuf_puts(b, "<|im_end|>\n");
    }
    size_t last_query = qwen3_last_query(m, n);
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == CHAT_ROLE_USER || (m[i].role == CHAT_ROLE_SYSTEM && i > 0)) {
            strbuf_puts(b, "<|im_start|>");
            strbuf_puts(b, role_name(m[i].role));
            strbuf_puts(b, "\n");
            strbuf_puts(b, m[i].content);
            strbuf_puts(b, "<|im_end|>\n");
        } else if (m[i].role == CHAT_ROLE_ASSISTANT) {
            qwen3_assistant(b, &m[i], i > last_query, i == n - 1);
        }
    }
    if (o->add_generation_prompt) {
        strbuf_puts(b, "<|im_start|>assistant\n");
        /* `enable_thinking is defined and enable_thinking is false` */
        if (o->enable_thinking == CHAT_THINKING_OFF) strbuf_puts(b, "<think>\n\n</think>\n\n");
    }
    return 0;
}

/* Qwen3-VL system and assistant content: the string, or the text of every part that has
 * one ({%- if 'text' in content %}), images and videos ignored. */
static void vl_text_content(struct strbuf *b, const struct chat_message *m) {
    if (m->content) {
        strbuf_puts(b, m->content);
        return;
    }
    for (size_t k = 0; k < m->n_parts; k++)
        if (m->parts[k].text) strbuf_puts(b, m->parts[k].text);
}

/* Qwen3-VL user content: images and videos become one vision block each (with "Picture k: "
 * / "Video k: " under add_vision_id, counted over the conversation), text parts their text. */
static void vl_user_content(struct strbuf *b, const struct chat_message *m, int vision_id,
                            int *images, int *videos) {
    char label[48];
    if (m->content) {
        strbuf_puts(b, m->content);
        return;
    }
    for (size_t k = 0; k < m->n_parts; k++) {
        const struct chat_part *p = &m->parts[k];
        if (p->kind == CHAT_PART_IMAGE) {
            ++*images;
            snprintf(label, sizeof label, "Picture %d: ", *images);
            if (vision_id) strbuf_puts(b, label);
            strbuf_puts(b, "<|vision_start|><|image_pad|><|vision_end|>");
        } else if (p->kind == CHAT_PART_VIDEO) {
            ++*videos;
            snprintf(label, sizeof label, "Video %d: ", *videos);
            if (vision_id) strbuf_puts(b, label);
            strbuf_puts(b, "<|vision_start|><|video_pad|><|vision_end|>");
        } else if (p->text) {
            strbuf_puts(b, p->text);
        }
    }
}

/* Qwen3-VL Instruct: system only as messages[0] (a later one is dropped), no <think>
 * handling, enable_thinking ignored. */
static int vl_render(struct strbuf *b, const struct chat_message *m, size_t n,
                     const struct chat_options *o) {
    int images = 0, videos = 0;
    if (m[0].role == CHAT_ROLE_SYSTEM) {
        strbuf_puts(b, "<|im_start|>system\n");
        vl_text_content(b, &m[0]);
        strbuf_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == CHAT_ROLE_USER) {
            strbuf_puts(b, "<|im_start|>user\n");
            vl_user_content(b, &m[i], o->add_vision_id, &images, &videos);
            strbuf_puts(b, "<|im_end|>\n");
        } else if (m[i].role == CHAT_ROLE_ASSISTANT) {
            strbuf_puts(b, "<|im_start|>assistant\n");
            vl_text_content(b, &m[i]);
            strbuf_puts(b, "<|im_end|>\n");
        }
    }
    if (o->add_generation_prompt) strbuf_puts(b, "<|im_start|>assistant\n");
    return 0;
}

int chat_template_render(enum chat_template_kind kind, const struct chat_message *messages,
                         size_t n, const struct chat_options *options, char **out, size_t *len) {
    struct strbuf b = {0};
    int rc;
    *out = NULL;
    *len = 0;
    /* messages[0].role on an empty list is a Jinja error in transformers too. */
    if (n == 0) return strata_set_error(STRATA_EINVAL, "a chat needs at least one message");
    if (kind == CHAT_TEMPLATE_QWEN3)
        rc = qwen3_render(&b, messages, n, options);
    else if (kind == CHAT_TEMPLATE_QWEN3_VL)
        rc = vl_render(&b, messages, n, options);
    else
        rc = strata_set_error(STRATA_EINVAL, "unknown chat template kind %d", (int)kind);
    if (rc == 0 && !b.s) strbuf_put(&b, "", 0); /* an empty rendering is still a string */
    if (rc == 0 && b.failed) rc = strata_set_error(STRATA_ENOMEM, "no memory for the chat text");
    if (rc < 0) {
        strbuf_free(&b);
        return rc;
    }
    *out = b.s;
    *len = b.len;
    return 0;
}

const char *chat_template_name(enum chat_template_kind kind) {
    return kind == CHAT_TEMPLATE_QWEN3      ? "qwen3"
           : kind == CHAT_TEMPLATE_QWEN3_VL ? "qwen3_vl"
                                            : "unknown";
}
