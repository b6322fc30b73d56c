/* Request bodies of the OpenAI-compatible front: defaults, every field, both spellings of
 * max_tokens, stop as a string or a list, and each malformed body refused with its status,
 * param and code. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "runtime/serve/serve_request.h"

static const struct serve_limits LIMITS = {"qwen3", 512};

static int parse(struct serve_params *p, enum serve_kind kind, const char *body,
                 struct serve_error *err) {
    return serve_params_parse(p, kind, body, strlen(body), &LIMITS, err);
}

static void chat_defaults(void **state) {
    struct serve_params p;
    struct serve_error err;
    (void)state;
    assert_int_equal(
        parse(&p, SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &err), 0);
    assert_string_equal(p.messages_json, "[{\"role\":\"user\",\"content\":\"hi\"}]");
    assert_int_equal(p.max_tokens, 0);
    assert_true(p.temperature == 1.0f && p.top_p == 1.0f);
    assert_int_equal(p.n_stops, 0);
    assert_int_equal(p.stream, 0);
    assert_int_equal(p.enable_thinking, 0);
    serve_params_free(&p);
}

static void chat_every_field(void **state) {
    struct serve_params p;
    struct serve_error err;
    (void)state;
    const char *body =
        "{\"model\":\"qwen3\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
        "\"text\":\"hi\"}]}],\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
        "\"seed\":42,\"stop\":[\"a\",\"bc\"],\"stream\":true,\"stream_options\":"
        "{\"include_usage\":true},\"chat_template_kwargs\":{\"enable_thinking\":true}}";
    assert_int_equal(parse(&p, SERVE_CHAT, body, &err), 0);
    assert_int_equal(p.max_tokens, 7);
    assert_true(p.temperature == 0.5f && p.top_p == 0.9f);
    assert_int_equal(p.seed, 42);
    assert_int_equal(p.n_stops, 2);
    assert_string_equal(p.stops[1], "bc");
    assert_true(p.stream && p.include_usage && p.enable_thinking);
    serve_params_free(&p);
}

static void completion_prompt_and_stop_string(void **state) {
    struct serve_params p;
    struct serve_error err;
    (void)state;
    assert_int_equal(parse(&p, SERVE_COMPLETION,
                           "{\"prompt\":\"Once\",\"max_tokens\":3,\"stop\":\"\\n\"}", &err),
                     0);
    assert_string_equal(p.prompt, "Once");
    assert_int_equal(p.max_tokens, 3);
    assert_int_equal(p.n_stops, 1);
    assert_string_equal(p.stops[0], "\n");
    serve_params_free(&p);
}

struct bad_case {
    enum serve_kind kind;
    const char *body;
    int status;
    const char *param, *code;
};

static void malformed_bodies_are_refused(void **state) {
    static const struct bad_case cases[] = {
        {SERVE_CHAT, "{\"messages\":[", 400, "", "invalid_json"},
        {SERVE_CHAT, "[1,2]", 400, "", "invalid_json"},
        {SERVE_CHAT, "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "model", "model_not_found"},
        {SERVE_CHAT, "{\"messages\":[]}", 400, "messages", "invalid_value"},
        {SERVE_CHAT, "{}", 400, "messages", "missing"},
        {SERVE_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
         "\"image_url\":{\"url\":\"x\"}}]}]}",
         400, "messages", "unsupported_content"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":2.5}",
         400, "temperature", "invalid_value"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":-1}",
         400, "temperature", "invalid_value"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":0}", 400,
         "top_p", "invalid_value"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":1.01}", 400,
         "top_p", "invalid_value"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400,
         "max_tokens", "invalid_value"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":513}",
         400, "max_tokens", "invalid_value"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}",
         400, "max_tokens", "invalid_type"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":1}", 400,
         "stream", "invalid_type"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", 400,
         "stop", "invalid_type"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", 400, "n",
         "invalid_value"},
        {SERVE_COMPLETION, "{\"prompt\":7}", 400, "prompt", "invalid_value"},
        {SERVE_COMPLETION, "{\"prompt\":\"\"}", 400, "prompt", "invalid_value"},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct serve_params p;
        struct serve_error err;
        assert_int_equal(parse(&p, cases[i].kind, cases[i].body, &err), -1);
        assert_int_equal(err.http_status, cases[i].status);
        assert_string_equal(err.param, cases[i].param);
        assert_string_equal(err.code, cases[i].code);
        assert_string_equal(err.type, "invalid_request_error");
        assert_true(strlen(err.message) > 0);
        serve_params_free(&p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chat_defaults),
        cmocka_unit_test(chat_every_field),
        cmocka_unit_test(completion_prompt_and_stop_string),
        cmocka_unit_test(malformed_bodies_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
