/* strata-tokenize: text <-> ids with a model's Hugging Face tokenizer.json, like llama.cpp's
 * llama-tokenize. With --jsonl every stdin line is one JSON value and every stdout line the
 * answer: a JSON string -> the JSON array of its ids, or with --decode a JSON array of ids ->
 * the JSON string. Without --jsonl all of stdin is one raw text (or, with --decode, one JSON
 * array) and the answer is one line of ids (or the raw decoded text).
 * Exit codes: 0 ok, 1 bad input line (its number is in the message), 2 usage, 3 bad
 * tokenizer files. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/text/tokenizer.h"

#define PROG "strata-tokenize"

static void usage(FILE *out) {
    fprintf(out,
            "usage: " PROG " --model DIR [--jsonl] [--decode] [options]\n"
            "\n"
            "Encodes text to token ids (or decodes ids) with DIR/tokenizer.json (+\n"
            "tokenizer_config.json), exactly as Hugging Face tokenizers'\n"
            "encode(text, add_special_tokens=False) and decode(ids).\n"
            "\n"
            "  --model DIR          directory holding tokenizer.json\n"
            "  --jsonl              one JSON value per stdin line, one answer per stdout\n"
            "                       line: a JSON string -> [ids], with --decode [ids] ->\n"
            "                       a JSON string; without it all of stdin is one input\n"
            "  --decode             ids -> text instead of text -> ids\n"
            "  --skip-special       decode without special tokens (<|im_end|>, ...)\n"
            "  --max-line-bytes N   longest accepted input line (default 1048576)\n"
            "  --help               this text\n"
            "\n"
            "Example: echo '\"<|im_start|>user\\nhi<|im_end|>\"' | " PROG " --model DIR --jsonl\n"
            "Exit codes: 0 ok, 1 bad input line, 2 usage, 3 bad tokenizer files.\n");
}

struct tok_args {
    const char *model;
    int jsonl, decode, skip_special, max_line;
};

/* Returns -1 to go on, else the exit code. */
static int parse_args(struct tok_args *a, int argc, char **argv) {
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"jsonl", no_argument, 0, 'j'},
        {"decode", no_argument, 0, 'd'},
        {"skip-special", no_argument, 0, 's'},
        {"max-line-bytes", required_argument, 0, 'L'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    a->max_line = 1 << 20;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'j': a->jsonl = 1; break;
        case 'd': a->decode = 1; break;
        case 's': a->skip_special = 1; break;
        case 'L':
            if (cli_parse_int(optarg, 1, 1 << 30, &a->max_line) != 0) {
                fprintf(stderr, PROG ": --max-line-bytes %s\n", strata_last_error());
                return STRATA_EXIT_USAGE;
            }
            break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument \"%s\"\n", argv[optind]);
        return STRATA_EXIT_USAGE;
    }
    if (!a->model) {
        fprintf(stderr, PROG ": --model is required\n");
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}

/* Writes s as a JSON string: ", \ and control characters escaped, other UTF-8 as is. */
static void put_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; ++i) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", stdout);
        else if (ch == '\t')
            fputs("\\t", stdout);
        else if (ch == '\r')
            fputs("\\r", stdout);
        else if (ch < 0x20 || ch == 0x7F)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static void put_ids(const struct tokenizer_ids *ids) {
    putchar('[');
    for (size_t i = 0; i < ids->n; ++i)
        printf(i ? ",%d" : "%d", ids->ids[i]);
    putchar(']');
}

/* cJSON ends its strings at NUL, so "\u0000" would silently cut the text; refuse it. */
static int has_escaped_nul(const char *line) {
    for (const char *p = line; *p; ++p) {
        if (*p != '\\') continue;
        if (p[1] == 'u' && strncmp(p + 2, "0000", 4) == 0) return 1;
        if (p[1]) ++p;
    }
    return 0;
}

static int encode_text(const struct tokenizer *tok, const char *text, size_t n) {
    struct tokenizer_ids ids = {0};
    int st = tokenizer_encode(tok, text, n, &ids);
    if (st == 0) put_ids(&ids);
    tokenizer_ids_free(&ids);
    return st;
}

/* A JSON array of ids -> decoded text, written as a JSON string (jsonl) or raw. */
static int decode_json(const struct tokenizer *tok, const cJSON *arr, int skip, int jsonl) {
    if (!cJSON_IsArray(arr)) return strata_set_error(STRATA_EINVAL, "expected a JSON array of ids");
    int n = cJSON_GetArraySize(arr), i = 0;
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids) return strata_set_error(STRATA_ENOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int32_t)e->valuedouble) {
            free(ids);
            return strata_set_error(STRATA_EINVAL, "element %d is not an integer id", i);
        }
        ids[i++] = (int32_t)e->valuedouble;
    }
    char *text;
    size_t len;
    int st = tokenizer_decode(tok, ids, (size_t)n, skip, &text, &len);
    free(ids);
    if (st != 0) return st;
    if (jsonl)
        put_json_string(text, len);
    else
        fwrite(text, 1, len, stdout);
    free(text);
    return 0;
}

/* One --jsonl line (without its newline). Returns a status; the caller names the line. */
static int run_line(const struct tokenizer *tok, const struct tok_args *a, const char *line) {
    if (!a->decode && has_escaped_nul(line))
        return strata_set_error(STRATA_EINVAL, "\\u0000 is not supported");
    cJSON *v = cJSON_Parse(line);
    if (!v) return strata_set_error(STRATA_EINVAL, "not valid JSON");
    int st;
    if (a->decode)
        st = decode_json(tok, v, a->skip_special, 1);
    else if (!cJSON_IsString(v))
        st = strata_set_error(STRATA_EINVAL, "expected a JSON string");
    else
        st = encode_text(tok, v->valuestring, strlen(v->valuestring));
    cJSON_Delete(v);
    if (st == 0) putchar('\n');
    return st;
}

static int run_jsonl(const struct tokenizer *tok, const struct tok_args *a) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = STRATA_EXIT_OK;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        ++lineno;
        if (n > 0 && line[n - 1] == '\n') line[--n] = 0;
        if (n > 0 && line[n - 1] == '\r') line[--n] = 0;
        int st = (size_t)n != strlen(line) ? strata_set_error(STRATA_EINVAL, "contains a NUL byte")
                 : n > a->max_line
                     ? strata_set_error(STRATA_EINVAL, "longer than %d bytes (--max-line-bytes)",
                                        a->max_line)
                     : run_line(tok, a, line);
        if (st != 0) {
            fflush(stdout);
            fprintf(stderr, PROG ": stdin line %ld: %s\n", lineno, strata_last_error());
            rc = STRATA_EXIT_FAILURE;
            break;
        }
    }
    free(line);
    return rc;
}

/* All of stdin (a pipe cannot be sized, so it grows), NUL-terminated. */
static int read_stdin(char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, stdin)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *p = realloc(buf, cap *= 2);
            if (!p) free(buf);
            buf = p;
        }
    }
    if (!buf) return strata_set_error(STRATA_ENOMEM, "out of memory");
    if (ferror(stdin)) {
        free(buf);
        return strata_set_error(STRATA_EIO, "read error");
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

/* Without --jsonl: all of stdin is one input. */
static int run_whole(const struct tokenizer *tok, const struct tok_args *a) {
    char *text = NULL;
    size_t len = 0;
    int st = read_stdin(&text, &len);
    if (st == 0) {
        if (!a->decode) {
            st = encode_text(tok, text, len);
            if (st == 0) putchar('\n');
        } else {
            cJSON *v = cJSON_ParseWithLength(text, len);
            st = v ? decode_json(tok, v, a->skip_special, 0)
                   : strata_set_error(STRATA_EINVAL, "not valid JSON");
            cJSON_Delete(v);
        }
        free(text);
    }
    if (st != 0) {
        fprintf(stderr, PROG ": stdin: %s\n", strata_last_error());
        return STRATA_EXIT_FAILURE;
    }
    return STRATA_EXIT_OK;
}

int main(int argc, char **argv) {
    struct tok_args a = {0};
    int rc = parse_args(&a, argc, argv);
    if (rc >= 0) return rc;
    struct tokenizer *tok;
    if (tokenizer_load(&tok, a.model) != 0) {
        fprintf(stderr, PROG ": %s\n", strata_last_error());
        return STRATA_EXIT_INPUT;
    }
    rc = a.jsonl ? run_jsonl(tok, &a) : run_whole(tok, &a);
    tokenizer_free(tok);
    if (fflush(stdout) != 0) {
        fprintf(stderr, PROG ": cannot write stdout\n");
        return STRATA_EXIT_FAILURE;
    }
    return rc;
}
