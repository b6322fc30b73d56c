/* Request bodies of the OpenAI-compatible front: defaults, every field, both spellings of
 * max_tokens, stop as a string or a list, image_url data URIs decoded in order (each part
 * rewritten to an image part), and each malformed body refused with its status, param and
 * code. */
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
    assert_int_equal(p.speculate, SERVE_SPECULATE_DEFAULT);
    assert_int_equal(p.speculate_k, 0);
    assert_int_equal(p.ignore_eos, 0);
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
        "{\"include_usage\":true},\"chat_template_kwargs\":{\"enable_thinking\":true},"
        "\"speculate\":\"ngram\",\"speculate_k\":6,\"ignore_eos\":true}";
    assert_int_equal(parse(&p, SERVE_CHAT, body, &err), 0);
    assert_int_equal(p.ignore_eos, 1);
    assert_int_equal(p.max_tokens, 7);
    assert_true(p.temperature == 0.5f && p.top_p == 0.9f);
    assert_int_equal(p.seed, 42);
    assert_int_equal(p.n_stops, 2);
    assert_string_equal(p.stops[1], "bc");
    assert_true(p.stream && p.include_usage && p.enable_thinking);
    assert_int_equal(p.speculate, SERVE_SPECULATE_NGRAM);
    assert_int_equal(p.speculate_k, 6);
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

#define IMG(url)                                                                                   \
    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","                      \
    "\"image_url\":{\"url\":\"" url "\"}}]}]}"

/* Two images (PNG then JPEG, the JPEG as a bare image_url string) around a text part: the
 * bytes decoded in order, the format from the first bytes, the parts rewritten. */
static void image_parts_are_decoded(void **state) {
    struct serve_params p;
    struct serve_error err;
    (void)state;
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
        "\"image_url\":{\"url\":\"data:image/png;base64,iVBORw0KGgphYmM=\"}},"
        "{\"type\":\"text\",\"text\":\"and\"},"
        "{\"type\":\"image_url\",\"image_url\":\"data:image/jpeg;base64,/9j/4Hh5\"}]}]}";
    assert_int_equal(parse(&p, SERVE_CHAT, body, &err), 0);
    assert_int_equal(p.n_images, 2);
    assert_int_equal(p.image_sizes[0], 11);
    assert_int_equal(p.image_sizes[1], 6);
    assert_int_equal(p.image_formats[0], SERVE_IMAGE_PNG);
    assert_int_equal(p.image_formats[1], SERVE_IMAGE_JPEG);
    assert_memory_equal(p.image_bytes, "\x89PNG\r\n\x1a\nabc\xff\xd8\xff\xe0xy", 17);
    assert_string_equal(p.messages_json,
                        "[{\"role\":\"user\",\"content\":[{\"type\":\"image\"},"
                        "{\"type\":\"text\",\"text\":\"and\"},{\"type\":\"image\"}]}]");
    serve_params_free(&p);
}

/* Past the image limits: 413, and the parse leaves nothing behind. */
static void image_limits_are_413(void **state) {
    struct serve_params p;
    struct serve_error err;
    const struct serve_image_limits small = {10, 1, 0, 0};
    const char *one = IMG("data:image/png;base64,iVBORw0KGgphYmM=");
    const char *two = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"image_url\":{\"url\":"
                      "\"data:image/jpeg;base64,/9j/4Hh5\"}},{\"image_url\":{\"url\":"
                      "\"data:image/jpeg;base64,/9j/4Hh5\"}}]}]}";
    (void)state;
    assert_int_equal(
        serve_params_parse_with(&p, SERVE_CHAT, one, strlen(one), &LIMITS, &small, &err), -1);
    assert_int_equal(err.http_status, 413);
    assert_string_equal(err.code, "image_too_large");
    serve_params_free(&p);
    assert_int_equal(
        serve_params_parse_with(&p, SERVE_CHAT, two, strlen(two), &LIMITS, &small, &err), -1);
    assert_int_equal(err.http_status, 413);
    assert_string_equal(err.code, "too_many_images");
    serve_params_free(&p);
    assert_null(p.image_bytes);
}

/* video_url parts (vLLM's, for Qwen3-VL): MP4 and WebM by their first bytes, in prompt order
 * with the images, rewritten to {"type":"video"}; a wrong media type, non-video bytes, an
 * http URL, a video over the limits are refused with OpenAI errors. */
#define VID(url)                                                                                   \
    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video_url\","                      \
    "\"video_url\":{\"url\":\"" url "\"}}]}]}"
static void video_parts_are_decoded(void **state) {
    struct serve_params p;
    struct serve_error err;
    (void)state;
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video_url\","
        "\"video_url\":{\"url\":\"data:video/mp4;base64,AAAAGGZ0eXBpc29tYWJjZA==\"}},"
        "{\"type\":\"image_url\",\"image_url\":\"data:image/jpeg;base64,/9j/4Hh5\"},"
        "{\"type\":\"video_url\",\"video_url\":\"data:video/webm;base64,GkXfo3dlYm0=\"},"
        "{\"type\":\"text\",\"text\":\"and\"}]}]}";
    assert_int_equal(parse(&p, SERVE_CHAT, body, &err), 0);
    assert_int_equal(p.n_images, 3);
    assert_int_equal(p.n_videos, 2);
    assert_int_equal(p.image_formats[0], SERVE_VIDEO_MP4);
    assert_int_equal(p.image_formats[1], SERVE_IMAGE_JPEG);
    assert_int_equal(p.image_formats[2], SERVE_VIDEO_WEBM);
    assert_int_equal(p.image_sizes[0], 16);
    assert_int_equal(p.image_sizes[2], 8);
    assert_string_equal(
        p.messages_json,
        "[{\"role\":\"user\",\"content\":[{\"type\":\"video\"},{\"type\":\"image\"},"
        "{\"type\":\"video\"},{\"type\":\"text\",\"text\":\"and\"}]}]");
    serve_params_free(&p);

    const struct serve_image_limits small = {0, 0, 10, 1};
    struct {
        const char *body;
        int status;
        const char *code;
        const struct serve_image_limits *limits;
    } bad[] = {
        {VID("data:video/avi;base64,AAAAGGZ0eXBpc29tYWJjZA=="), 400, "unsupported_video_format",
         NULL},
        {VID("data:image/png;base64,iVBORw0KGgphYmM="), 400, "invalid_video_url", NULL},
        {VID("data:video/mp4;base64,iVBORw0KGgphYmM="), 400, "unsupported_video_format", NULL},
        {VID("https://example.com/a.mp4"), 400, "unsupported_url", NULL},
        {VID("data:video/mp4;base64,AAAAGGZ0eXBpc29tYWJjZA=="), 413, "video_too_large", &small},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"video_url\":\"data:video/webm;base64,"
         "GkXfo3dlYm0=\"},{\"video_url\":\"data:video/webm;base64,GkXfo3dlYm0=\"}]}]}",
         413, "too_many_videos", &(struct serve_image_limits){0, 0, 0, 1}},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video_url\"}]}]}", 400,
         "invalid_video_url", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct serve_limits lim = {"m", 100};
        int rc = serve_params_parse_with(&p, SERVE_CHAT, bad[i].body, strlen(bad[i].body), &lim,
                                         bad[i].limits, &err);
        if (rc != -1 || err.http_status != bad[i].status || strcmp(err.code, bad[i].code))
            fail_msg("video case %zu: rc %d status %d code %s (%s)", i, rc, err.http_status,
                     err.code, err.message);
        serve_params_free(&p);
    }
}

static void malformed_bodies_are_refused(void **state) {
    static const struct bad_case cases[] = {
        {SERVE_CHAT, "{\"messages\":[", 400, "", "invalid_json"},
        {SERVE_CHAT, "[1,2]", 400, "", "invalid_json"},
        {SERVE_CHAT, "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         400, "model", "model_not_found"},
        {SERVE_CHAT, "{\"messages\":[]}", 400, "messages", "invalid_value"},
        {SERVE_CHAT, "{}", 400, "messages", "missing"},
        {SERVE_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"speculate\":\"eagle\"}", 400,
         "speculate", "invalid_value"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"speculate_k\":17}",
         400, "speculate_k", "invalid_value"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"speculate_k\":2.5}",
         400, "speculate_k", "invalid_type"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"ignore_eos\":1}", 400,
         "ignore_eos", "invalid_type"},
        {SERVE_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
         "\"image_url\":{\"url\":\"x\"}}]}]}",
         400, "messages", "unsupported_url"},
        {SERVE_CHAT, IMG("http://example.com/cat.png"), 400, "messages", "unsupported_url"},
        {SERVE_CHAT, IMG("data:image/png,iVBORw0KGgphYmM="), 400, "messages", "invalid_image_url"},
        {SERVE_CHAT, IMG("data:image/gif;base64,R0lGODlh"), 400, "messages",
         "unsupported_image_format"},
        {SERVE_CHAT, IMG("data:image/png;base64,R0lGODlh"), 400, "messages",
         "unsupported_image_format"},
        {SERVE_CHAT, IMG("data:image/png;base64,iVBORw0KGgphYmM"), 400, "messages",
         "invalid_base64"},
        {SERVE_CHAT, IMG("data:image/png;base64,iVBO*w0KGgphYmM="), 400, "messages",
         "invalid_base64"},
        {SERVE_CHAT, IMG("data:image/png;base64,iV=Orw0KGgphYmM="), 400, "messages",
         "invalid_base64"},
        {SERVE_CHAT, IMG("data:image/png;base64,"), 400, "messages", "invalid_base64"},
        {SERVE_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
         "\"image_url\":{\"url\":7}}]}]}",
         400, "messages", "invalid_image_url"},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\"}]}]}", 400,
         "messages", "unsupported_content"},
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
        cmocka_unit_test(image_parts_are_decoded),
        cmocka_unit_test(image_limits_are_413),
        cmocka_unit_test(video_parts_are_decoded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
