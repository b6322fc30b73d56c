/* tokenizer.json (+ tokenizer_config.json, generation_config.json) -> struct tokenizer.
 *
 * Accepted shape (what Qwen2/Qwen3/Qwen3-VL ship; anything else is refused by name rather
 * than tokenized differently from HF): model BPE without dropout/unk/prefix/suffix/byte
 * fallback, normalizer null or NFC, pre_tokenizer a Split(Regex, Isolated) and/or a
 * ByteLevel without prefix space or regex, decoder ByteLevel (or null). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/text/tokenizer_internal.h"

static const char *type_of(const cJSON *obj) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static int is_true(const cJSON *obj, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(obj, key));
}

/* Sets id's token text (copied into tok->strings). */
static int set_token(struct tokenizer *tok, int32_t id, const char *s, size_t n) {
    tok->tok_off[id] = (uint32_t)tok->strings.len;
    tok->tok_len[id] = (int32_t)n;
    return tok_buf_append(&tok->strings, s, n);
}

static int json_id(const cJSON *v, const char *what, int32_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= TOK_MAX_ID ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return strata_set_error(STRATA_EFORMAT, "tokenizer.json: %s needs an id in [0, %d)", what,
                                TOK_MAX_ID);
    *out = (int32_t)v->valuedouble;
    return 0;
}

static int alloc_ids(struct tokenizer *tok, int32_t n_ids) {
    tok->n_ids = n_ids;
    tok->tok_off = calloc((size_t)n_ids, sizeof *tok->tok_off);
    tok->tok_len = malloc((size_t)n_ids * sizeof *tok->tok_len);
    tok->dec_off = calloc((size_t)n_ids, sizeof *tok->dec_off);
    tok->dec_len = calloc((size_t)n_ids, sizeof *tok->dec_len);
    tok->special = calloc((size_t)n_ids, 1);
    if (!tok->tok_off || !tok->tok_len || !tok->dec_off || !tok->dec_len || !tok->special)
        return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory (%d ids)", n_ids);
    for (int32_t i = 0; i < n_ids; ++i)
        tok->tok_len[i] = -1;
    return 0;
}

/* Largest id over model.vocab and added_tokens, checking every id on the way. */
static int max_id(const cJSON *vocab, const cJSON *added, int32_t *out) {
    int32_t mx = -1, id;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (json_id(e, "model.vocab entry", &id) != 0) return STRATA_EFORMAT;
        if (id > mx) mx = id;
    }
    cJSON_ArrayForEach(e, added) {
        if (json_id(cJSON_GetObjectItemCaseSensitive(e, "id"), "added_tokens[].id", &id) != 0)
            return STRATA_EFORMAT;
        if (id > mx) mx = id;
    }
    if (mx < 0) return strata_set_error(STRATA_EFORMAT, "tokenizer.json: model.vocab is empty");
    *out = mx;
    return 0;
}

static int load_vocab(struct tokenizer *tok, const cJSON *vocab) {
    if (tok_str_map_init(&tok->vocab, (size_t)cJSON_GetArraySize(vocab)) != 0) return STRATA_ENOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = (int32_t)e->valuedouble, old;
        size_t n = strlen(e->string);
        if (tok->tok_len[id] >= 0)
            return strata_set_error(STRATA_EFORMAT, "tokenizer.json: model.vocab gives id %d twice",
                                    id);
        if (set_token(tok, id, e->string, n) != 0) return STRATA_ENOMEM;
        if (tok_str_map_put(&tok->vocab, &tok->strings, tok->tok_off[id], (uint32_t)n, id, &old))
            return STRATA_EINVAL;
    }
    return 0;
}

/* One merge, either ["a", "b"] (tokenizers >= 0.20) or "a b" (older files). */
static int merge_parts(const cJSON *m, const char **a, size_t *na, const char **b, size_t *nb) {
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *b = m->child->next->valuestring;
        *na = strlen(*a);
        *nb = strlen(*b);
        return 0;
    }
    const char *sp = cJSON_IsString(m) ? strchr(m->valuestring, ' ') : NULL;
    if (!sp) return -1;
    *a = m->valuestring;
    *na = (size_t)(sp - *a);
    *b = sp + 1;
    *nb = strlen(*b);
    return 0;
}

static int load_merges(struct tokenizer *tok, const cJSON *merges) {
    if (tok_merge_map_init(&tok->merges, (size_t)cJSON_GetArraySize(merges)) != 0)
        return STRATA_ENOMEM;
    struct tok_buf joined = {0};
    int rank = 0, st = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t na, nb;
        if (merge_parts(m, &a, &na, &b, &nb) != 0) {
            st = strata_set_error(STRATA_EFORMAT,
                                  "tokenizer.json: model.merges[%d] is not a pair of tokens", rank);
            break;
        }
        joined.len = 0;
        if ((st = tok_buf_append(&joined, a, na)) || (st = tok_buf_append(&joined, b, nb))) break;
        int32_t ia = tok_str_map_get(&tok->vocab, &tok->strings, a, na);
        int32_t ib = tok_str_map_get(&tok->vocab, &tok->strings, b, nb);
        int32_t im = tok_str_map_get(&tok->vocab, &tok->strings, joined.data, joined.len);
        if (ia < 0 || ib < 0 || im < 0) { /* HF: Error::MergeTokenOutOfVocabulary */
            st = strata_set_error(STRATA_EFORMAT,
                                  "tokenizer.json: model.merges[%d] (\"%s\") uses a token that is "
                                  "not in model.vocab",
                                  rank, joined.data);
            break;
        }
        tok_merge_map_put(&tok->merges, ia, ib, rank++, im);
    }
    free(joined.data);
    return st;
}

static int cmp_added(const void *a, const void *b) {
    const struct tok_added *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int load_added(struct tokenizer *tok, const cJSON *added) {
    int n = cJSON_GetArraySize(added);
    tok->added = calloc((size_t)(n ? n : 1), sizeof *tok->added);
    if (!tok->added) return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        if (!cJSON_IsString(c) || !c->valuestring[0])
            return strata_set_error(STRATA_EFORMAT,
                                    "tokenizer.json: added token %d has no content string", id);
        /* HF strips whitespace around lstrip/rstrip tokens and checks word boundaries for
         * single_word ones; no Qwen token uses them, so refuse rather than differ. */
        if (is_true(e, "lstrip") || is_true(e, "rstrip") || is_true(e, "single_word"))
            return strata_set_error(STRATA_EFORMAT,
                                    "tokenizer.json: added token \"%s\": lstrip/rstrip/single_word "
                                    "are not supported",
                                    c->valuestring);
        struct tok_added *a = &tok->added[tok->n_added++];
        a->id = id;
        a->special = (uint8_t)is_true(e, "special");
        a->normalized = (uint8_t)is_true(e, "normalized");
        if (set_token(tok, id, c->valuestring, strlen(c->valuestring)) != 0) return STRATA_ENOMEM;
        a->off = tok->tok_off[id];
        a->len = (uint32_t)tok->tok_len[id];
        tok->special[id] = a->special;
        tok->added_first[a->normalized][(uint8_t)c->valuestring[0]] = 1;
    }
    qsort(tok->added, (size_t)tok->n_added, sizeof *tok->added, cmp_added);
    return 0;
}

/* Each byte's byte-level character must be a vocabulary token, or BPE could not start. */
static int load_byte_ids(struct tokenizer *tok) {
    for (int b = 0; b < 256; ++b) {
        char s[4];
        int n = tok_utf8_put(s, tok_byte_to_cp((uint8_t)b));
        tok->byte_id[b] = tok_str_map_get(&tok->vocab, &tok->strings, s, (size_t)n);
        if (tok->byte_id[b] < 0)
            return strata_set_error(STRATA_EFORMAT,
                                    "tokenizer.json: model.vocab lacks the byte-level token of "
                                    "byte 0x%02X",
                                    b);
    }
    return 0;
}

/* tokenizers/src/decoders/byte_level.rs: a token whose every character is in the byte-level
 * alphabet becomes those bytes, any other token its own UTF-8 text. */
static int load_decoded(struct tokenizer *tok) {
    for (int32_t id = 0; id < tok->n_ids; ++id) {
        if (tok->tok_len[id] < 0) continue;
        const uint8_t *s = (const uint8_t *)tok->strings.data + tok->tok_off[id];
        size_t n = (size_t)tok->tok_len[id], start = tok->decoded.len;
        int all = 1;
        for (size_t i = 0; i < n && all;) {
            uint32_t cp = s[i];
            int k = cp < 0x80 ? 1 : cp < 0xE0 ? 2 : cp < 0xF0 ? 3 : 4;
            if (i + (size_t)k > n) {
                all = 0;
                break;
            }
            if (k == 2) cp = (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F);
            int byte = k <= 2 ? tok_cp_to_byte(cp) : -1;
            if (byte < 0)
                all = 0;
            else if (tok_buf_append(&tok->decoded, &(uint8_t){(uint8_t)byte}, 1))
                return STRATA_ENOMEM;
            i += (size_t)k;
        }
        if (!all) {
            tok->decoded.len = start;
            if (tok_buf_append(&tok->decoded, s, n) != 0) return STRATA_ENOMEM;
        }
        tok->dec_off[id] = (uint32_t)start;
        tok->dec_len[id] = (uint32_t)(tok->decoded.len - start);
    }
    return 0;
}

static int unsupported(const char *what, const char *type) {
    return strata_set_error(STRATA_EFORMAT, "tokenizer.json: %s \"%s\" is not supported", what,
                            type ? type : "(no type)");
}

/* ByteLevel as Qwen configures it: no prefix space, no built-in GPT-2 regex. */
static int check_byte_level(const cJSON *bl, const char *what) {
    if (is_true(bl, "add_prefix_space") || is_true(bl, "use_regex"))
        return strata_set_error(STRATA_EFORMAT,
                                "tokenizer.json: %s ByteLevel with add_prefix_space or use_regex "
                                "is not supported",
                                what);
    return 0;
}

static int load_split(struct tokenizer *tok, const cJSON *split) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(split, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(split, "behavior");
    if (!cJSON_IsString(re) || !cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0 ||
        is_true(split, "invert") || tok->split_re)
        return strata_set_error(STRATA_EFORMAT,
                                "tokenizer.json: only one Split pre-tokenizer with "
                                "a Regex pattern and behavior Isolated is supported");
    char *pcre;
    if (tok_regex_translate(re->valuestring, strlen(re->valuestring), &pcre) != 0)
        return STRATA_ENOMEM;
    int err;
    PCRE2_SIZE at;
    tok->split_re = pcre2_compile((PCRE2_SPTR)pcre, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                  &err, &at, NULL);
    free(pcre);
    if (!tok->split_re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return strata_set_error(STRATA_EFORMAT, "tokenizer.json: Split regex: %s at offset %zu",
                                (const char *)msg, (size_t)at);
    }
    pcre2_jit_compile(tok->split_re,
                      PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    return 0;
}

static int load_pre_tokenizer(struct tokenizer *tok, const cJSON *pre) {
    const char *type = type_of(pre);
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers")) {
            int st = load_pre_tokenizer(tok, e);
            if (st != 0) return st;
        }
        return 0;
    }
    if (type && strcmp(type, "Split") == 0) return load_split(tok, pre);
    if (type && strcmp(type, "ByteLevel") == 0) return check_byte_level(pre, "pre_tokenizer");
    return unsupported("pre_tokenizer", type);
}

static int load_pipeline(struct tokenizer *tok, const cJSON *root) {
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (norm && !cJSON_IsNull(norm)) {
        if (!type_of(norm) || strcmp(type_of(norm), "NFC") != 0)
            return unsupported("normalizer", type_of(norm));
        tok->nfc = 1;
    }
    if (!pre || cJSON_IsNull(pre))
        return strata_set_error(STRATA_EFORMAT, "tokenizer.json: pre_tokenizer is missing");
    int st = load_pre_tokenizer(tok, pre);
    if (st != 0) return st;
    if (dec && !cJSON_IsNull(dec)) {
        if (!type_of(dec) || strcmp(type_of(dec), "ByteLevel") != 0)
            return unsupported("decoder", type_of(dec));
    }
    return 0;
}

static int check_model(const cJSON *model) {
    if (!cJSON_IsObject(model))
        return strata_set_error(STRATA_EFORMAT, "tokenizer.json: \"model\" is missing");
    if (type_of(model) && strcmp(type_of(model), "BPE") != 0)
        return unsupported("model", type_of(model));
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(model, "vocab")))
        return strata_set_error(STRATA_EFORMAT, "tokenizer.json: model.vocab is missing or not an "
                                                "object");
    if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(model, "merges")))
        return strata_set_error(STRATA_EFORMAT, "tokenizer.json: model.merges is missing or not an "
                                                "array");
    static const char *const unsupported_fields[] = {
        "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < sizeof unsupported_fields / sizeof *unsupported_fields; ++i) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(model, unsupported_fields[i]);
        if (f && !cJSON_IsNull(f) && !(cJSON_IsString(f) && !f->valuestring[0]))
            return strata_set_error(STRATA_EFORMAT, "tokenizer.json: model.%s is not supported",
                                    unsupported_fields[i]);
    }
    if (is_true(model, "byte_fallback"))
        return strata_set_error(STRATA_EFORMAT, "tokenizer.json: model.byte_fallback is not "
                                                "supported");
    return 0;
}

static int load_tokenizer_json(struct tokenizer *tok, const cJSON *root) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    int st = check_model(model);
    if (st != 0) return st;
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return strata_set_error(STRATA_EFORMAT, "tokenizer.json: added_tokens is not an array");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    int32_t mx = 0;
    tok->ignore_merges = is_true(model, "ignore_merges");
    if ((st = max_id(vocab, cJSON_IsArray(added) ? added : NULL, &mx)) != 0) return st;
    if ((st = alloc_ids(tok, mx + 1)) != 0) return st;
    if ((st = load_vocab(tok, vocab)) != 0) return st;
    if ((st = load_merges(tok, cJSON_GetObjectItemCaseSensitive(model, "merges"))) != 0) return st;
    if ((st = load_added(tok, cJSON_IsArray(added) ? added : NULL)) != 0) return st;
    if ((st = load_byte_ids(tok)) != 0) return st;
    if ((st = load_decoded(tok)) != 0) return st;
    return load_pipeline(tok, root);
}

static int add_eos(struct tokenizer *tok, int32_t id) {
    for (int i = 0; i < tok->n_eos; ++i)
        if (tok->eos[i] == id) return 0;
    if (tok->n_eos == TOKENIZER_MAX_EOS)
        return strata_set_error(STRATA_EFORMAT, "more than %d eos ids", TOKENIZER_MAX_EOS);
    if (id < 0 || id >= tok->n_ids || tok->tok_len[id] < 0)
        return strata_set_error(STRATA_EFORMAT, "eos id %d is not a token", id);
    tok->eos[tok->n_eos++] = id;
    return 0;
}

/* tokenizer_config.json: eos_token is a string or {"content": ...} (AddedToken form). */
static int load_config(struct tokenizer *tok, const cJSON *cfg) {
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
    if (cJSON_IsObject(eos)) eos = cJSON_GetObjectItemCaseSensitive(eos, "content");
    if (!eos || cJSON_IsNull(eos)) return 0;
    if (!cJSON_IsString(eos))
        return strata_set_error(STRATA_EFORMAT, "tokenizer_config.json: eos_token is not a string");
    int32_t id = tokenizer_token_id(tok, eos->valuestring);
    if (id < 0)
        return strata_set_error(STRATA_EFORMAT,
                                "tokenizer_config.json: eos_token \"%s\" is not a "
                                "token",
                                eos->valuestring);
    return add_eos(tok, id);
}

static int load_generation(struct tokenizer *tok, const cJSON *gen) {
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id");
    if (!eos || cJSON_IsNull(eos)) return 0;
    const cJSON *one = eos, *e;
    int32_t id;
    if (!cJSON_IsArray(eos)) {
        if (json_id(one, "generation_config.json eos_token_id", &id) != 0) return STRATA_EFORMAT;
        return add_eos(tok, id);
    }
    cJSON_ArrayForEach(e, eos) {
        if (json_id(e, "generation_config.json eos_token_id[]", &id) != 0) return STRATA_EFORMAT;
        int st = add_eos(tok, id);
        if (st != 0) return st;
    }
    return 0;
}

static int parse_optional(const char *text, const char *name, cJSON **out) {
    *out = NULL;
    if (!text) return 0;
    *out = cJSON_Parse(text);
    if (!*out || !cJSON_IsObject(*out))
        return strata_set_error(STRATA_EFORMAT, "%s is not a JSON object", name);
    return 0;
}

int tokenizer_load_json(struct tokenizer **out, const char *tokenizer_json, size_t len,
                        const char *config_json, const char *generation_json) {
    *out = NULL;
    struct tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return strata_set_error(STRATA_ENOMEM, "tokenizer: out of memory");
    cJSON *root = cJSON_ParseWithLength(tokenizer_json, len), *cfg = NULL, *gen = NULL;
    int st = 0;
    if (!cJSON_IsObject(root))
        st = strata_set_error(STRATA_EFORMAT, "tokenizer.json is not a JSON object");
    if (st == 0) st = load_tokenizer_json(tok, root);
    if (st == 0) st = parse_optional(config_json, "tokenizer_config.json", &cfg);
    if (st == 0 && cfg) st = load_config(tok, cfg);
    if (st == 0) st = parse_optional(generation_json, "generation_config.json", &gen);
    if (st == 0 && gen) st = load_generation(tok, gen);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    if (st != 0) {
        tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return 0;
}

/* Reads dir/name (cli_read_file: NUL-terminated); *text = NULL when it is absent and
 * optional. */
static int read_file(const char *dir, const char *name, int optional, char **text, size_t *len) {
    char path[4096];
    *text = NULL;
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return strata_set_error(STRATA_EINVAL, "tokenizer: path too long: %s", dir);
    if (optional && access(path, F_OK) != 0) return 0;
    return cli_read_file(text, len, path);
}

int tokenizer_load(struct tokenizer **out, const char *dir) {
    char *tj = NULL, *cfg = NULL, *gen = NULL;
    size_t n = 0, unused;
    int st = read_file(dir, "tokenizer.json", 0, &tj, &n);
    if (st == 0) st = read_file(dir, "tokenizer_config.json", 1, &cfg, &unused);
    if (st == 0) st = read_file(dir, "generation_config.json", 1, &gen, &unused);
    if (st == 0) st = tokenizer_load_json(out, tj, n, cfg, gen);
    free(tj);
    free(cfg);
    free(gen);
    return st;
}

void tokenizer_free(struct tokenizer *tok) {
    if (!tok) return;
    free(tok->strings.data);
    free(tok->decoded.data);
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->dec_off);
    free(tok->dec_len);
    free(tok->special);
    free(tok->added);
    tok_str_map_free(&tok->vocab);
    tok_merge_map_free(&tok->merges);
    pcre2_code_free(tok->split_re);
    free(tok);
}

int32_t tokenizer_n_ids(const struct tokenizer *tok) {
    return tok->n_ids;
}

int32_t tokenizer_token_id(const struct tokenizer *tok, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < tok->n_added; ++i)
        if (tok->added[i].len == n && memcmp(tok->strings.data + tok->added[i].off, token, n) == 0)
            return tok->added[i].id;
    return tok_str_map_get(&tok->vocab, &tok->strings, token, n);
}

int tokenizer_is_added(const struct tokenizer *tok, int32_t id) {
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].id == id) return 1;
    return 0;
}

int tokenizer_is_special(const struct tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && tok->special[id];
}

int tokenizer_eos_ids(const struct tokenizer *tok, int32_t out[TOKENIZER_MAX_EOS]) {
    memcpy(out, tok->eos, (size_t)tok->n_eos * sizeof *out);
    return tok->n_eos;
}
