/* Chat templates against transformers (the truth): every conversation of
 * testdata/chat_template_golden.jsonl (tools/golden/chat_template_golden.py) must render
 * byte-identical to apply_chat_template(tokenize=False), and the rendered text, encoded with the
 * C tokenizer, must give apply_chat_template(tokenize=True)'s ids. Also: template detection from
 * model directories, refusal of unknown templates and of what is out of scope. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "runtime/base/status.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_util.h"

#define TOK_DIR "tests/runtime/text/testdata/qwen3-tokenizer"
#define VL_DIR "tests/runtime/text/testdata/qwen3-vl-chat-template"

static int flag(const cJSON *options, const char *name, int unset) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(options, name);
    return v ? cJSON_IsTrue(v) : unset;
}

static int same_ids(const struct tokenizer_ids *got, const cJSON *want) {
    if ((int)got->n != cJSON_GetArraySize(want)) return 0;
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want) if (got->ids[i++] != (int32_t)e->valuedouble) return 0;
    return 1;
}

/* One golden line; returns 1 when text and ids match. */
static int check_case(const struct tokenizer *tok, const cJSON *c, int *n_qwen3, int *n_vl) {
    const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
    const char *tmpl = cJSON_GetObjectItem(c, "template")->valuestring;
    const cJSON *opt = cJSON_GetObjectItem(c, "options");
    struct chat_options o = {flag(opt, "add_generation_prompt", 0),
                             flag(opt, "enable_thinking", CHAT_THINKING_UNSET),
                             flag(opt, "add_vision_id", 0)};
    enum chat_template_kind kind =
        strcmp(tmpl, "qwen3") ? CHAT_TEMPLATE_QWEN3_VL : CHAT_TEMPLATE_QWEN3;
    *(kind == CHAT_TEMPLATE_QWEN3 ? n_qwen3 : n_vl) += 1;
    char *messages = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "messages"));
    struct chat_conversation conv;
    char *text = NULL;
    size_t len = 0;
    struct tokenizer_ids ids = {0};
    int ok = chat_conversation_from_json(&conv, messages) == 0 &&
             chat_template_render(kind, conv.messages, conv.n, &o, &text, &len) == 0;
    if (!ok) {
        printf("%s: %s\n", name, strata_last_error());
    } else if (strcmp(text, cJSON_GetObjectItem(c, "text")->valuestring) != 0) {
        printf("%s: rendered\n%s\nwant\n%s\n", name, text,
               cJSON_GetObjectItem(c, "text")->valuestring);
        ok = 0;
    } else if (tokenizer_encode(tok, text, len, &ids) < 0 ||
               !same_ids(&ids, cJSON_GetObjectItem(c, "ids"))) {
        printf("%s: ids differ\n", name);
        ok = 0;
    }
    tokenizer_ids_free(&ids);
    free(text);
    free(messages);
    chat_conversation_free(&conv);
    return ok;
}

static void test_golden(void **state) {
    (void)state;
    struct tokenizer *tok;
    assert_int_equal(tokenizer_load(&tok, test_path(TOK_DIR)), 0);
    FILE *f = fopen(test_path("tests/runtime/text/testdata/chat_template_golden.jsonl"), "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, total = 0, passed = 0, n_qwen3 = 0, n_vl = 0, want = -1;
    while (getline(&line, &cap, f) > 0) {
        cJSON *c = cJSON_Parse(line);
        assert_non_null(c);
        if (lineno++ == 0) {
            want = cJSON_GetObjectItem(c, "count")->valueint;
        } else {
            total++;
            passed += check_case(tok, c, &n_qwen3, &n_vl);
        }
        cJSON_Delete(c);
    }
    free(line);
    fclose(f);
    tokenizer_free(tok);
    printf("chat template golden: %d/%d identical (text and ids; %d Qwen3, %d Qwen3-VL)\n", passed,
           total, n_qwen3, n_vl);
    assert_int_equal(total, want);
    assert_true(total >= 40 && n_vl >= 10);
    assert_int_equal(passed, total);
}

/* The spec's worked example (§9.1): user "Hello" + generation prompt. */
static void test_spec_ids(void **state) {
    (void)state;
    static const int32_t want[] = {151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198};
    struct tokenizer *tok;
    struct chat_message m = {CHAT_ROLE_USER, "Hello", NULL, 0, NULL};
    struct chat_options o = {1, CHAT_THINKING_UNSET, 0};
    struct tokenizer_ids ids = {0};
    char *text;
    size_t len;
    assert_int_equal(tokenizer_load(&tok, test_path(TOK_DIR)), 0);
    assert_int_equal(chat_template_render(CHAT_TEMPLATE_QWEN3, &m, 1, &o, &text, &len), 0);
    assert_int_equal(tokenizer_encode(tok, text, len, &ids), 0);
    assert_int_equal(ids.n, 9);
    assert_memory_equal(ids.ids, want, sizeof want);
    tokenizer_ids_free(&ids);
    free(text);
    tokenizer_free(tok);
}

static void test_load_detects(void **state) {
    (void)state;
    enum chat_template_kind kind = 0;
    assert_int_equal(chat_template_load(&kind, test_path(TOK_DIR)), 0);
    assert_int_equal(kind, CHAT_TEMPLATE_QWEN3);
    assert_int_equal(chat_template_load(&kind, test_path(VL_DIR)), 0);
    assert_int_equal(kind, CHAT_TEMPLATE_QWEN3_VL);
    assert_string_equal(chat_template_name(kind), "qwen3_vl");
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* An unknown template is refused naming its file; a .jinja file wins over the JSON files;
 * a directory without any template is STRATA_ENOTFOUND. */
static void test_load_refuses(void **state) {
    (void)state;
    char dir[] = "/tmp/chat_template_test.XXXXXX";
    const char *tmp = getenv("TEST_TMPDIR");
    char path[4096];
    enum chat_template_kind kind;
    snprintf(path, sizeof path, "%s/chat.XXXXXX", tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(tmp ? path : dir));
    const char *d = tmp ? path : dir;
    assert_int_equal(chat_template_load(&kind, d), STRATA_ENOTFOUND);
    write_file(d, "tokenizer_config.json", "{\"chat_template\": \"{{ messages }}\"}");
    assert_int_equal(chat_template_load(&kind, d), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "tokenizer_config.json: unknown chat template"));
    write_file(d, "chat_template.json", "{\"chat_template\": [{\"name\": \"default\"}]}");
    assert_int_equal(chat_template_load(&kind, d), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "chat_template.json"));
    write_file(d, "chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
    assert_int_equal(chat_template_load(&kind, d), STRATA_EFORMAT);
    assert_non_null(strstr(strata_last_error(), "chat_template.jinja"));
}

/* What the template cannot render or is out of scope fails clearly. */
static void test_refusals(void **state) {
    (void)state;
    static const char *const bad[] = {
        "[{\"role\": \"tool\", \"content\": \"42\"}]",
        "[{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {}}]}]",
        "[{\"role\": \"user\"}]",
        "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 3}]}]",
        "[{\"content\": \"x\"}]",
    };
    struct chat_conversation conv;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(chat_conversation_from_json(&conv, bad[i]), STRATA_EINVAL);
    assert_int_equal(chat_conversation_from_json(&conv, "{"), STRATA_EFORMAT);
    char *text;
    size_t len;
    struct chat_options o = {1, CHAT_THINKING_OFF, 0};
    assert_int_equal(chat_template_render(CHAT_TEMPLATE_QWEN3, NULL, 0, &o, &text, &len),
                     STRATA_EINVAL);
    assert_int_equal(chat_conversation_from_json(
                         &conv, "[{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]"),
                     0);
    assert_int_equal(
        chat_template_render(CHAT_TEMPLATE_QWEN3, conv.messages, conv.n, &o, &text, &len),
        STRATA_EINVAL);
    assert_non_null(strstr(strata_last_error(), "Qwen3-VL"));
    assert_int_equal(
        chat_template_render(CHAT_TEMPLATE_QWEN3_VL, conv.messages, conv.n, &o, &text, &len), 0);
    assert_string_equal(text, "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                              "<|im_end|>\n<|im_start|>assistant\n");
    free(text);
    chat_conversation_free(&conv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),       cmocka_unit_test(test_spec_ids),
        cmocka_unit_test(test_load_detects), cmocka_unit_test(test_load_refuses),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
