/* oracle_draft; see oracle_draft.h. */
#include "runtime/stage/oracle_draft.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

struct oracle_line {
    int32_t *prompt, *tokens;
    int prompt_len, n_tokens;
};

struct oracle_draft {
    struct oracle_line *lines;
    int n_lines;
    uint64_t accept_below; /* a draft stays right when its hash is below this */
};

static uint64_t mix(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* "1,2,3" at *p (up to a space or the end) into a malloc'd array. */
static int parse_ids(const char **p, int32_t **out, int *n) {
    int cap = 64;
    *n = 0;
    *out = malloc(sizeof **out * (size_t)cap);
    if (!*out) return STRATA_ENOMEM;
    while (**p && **p != ' ' && **p != '\n') {
        char *end;
        errno = 0;
        long v = strtol(*p, &end, 10);
        if (end == *p || errno || v < 0 || v > INT32_MAX) return STRATA_EFORMAT;
        if (*n == cap) {
            int32_t *grown = realloc(*out, sizeof **out * (size_t)(cap *= 2));
            if (!grown) return STRATA_ENOMEM;
            *out = grown;
        }
        (*out)[(*n)++] = (int32_t)v;
        *p = end;
        if (**p == ',') (*p)++;
    }
    return *n > 0 ? 0 : STRATA_EFORMAT;
}

int oracle_draft_load(struct oracle_draft **out, const char *path, double accept) {
    *out = NULL;
    if (!(accept >= 0.0 && accept <= 1.0))
        return strata_set_error(STRATA_EINVAL, "oracle drafts: acceptance %g is not in [0, 1]",
                                accept);
    FILE *f = fopen(path, "r");
    if (!f)
        return strata_set_error(STRATA_ENOTFOUND, "oracle drafts: %s: %s", path, strerror(errno));
    struct oracle_draft *o = calloc(1, sizeof *o);
    char *line = NULL;
    size_t cap = 0;
    int rc = o ? 0 : STRATA_ENOMEM, number = 0;
    if (o)
        o->accept_below = accept * 18446744073709551616.0 >= 18446744073709551615.0
                              ? UINT64_MAX
                              : (uint64_t)(accept * 18446744073709551616.0);
    while (rc == 0 && getline(&line, &cap, f) > 0) {
        number++;
        if (line[0] == '\n' || line[0] == '#') continue;
        struct oracle_line *grown = realloc(o->lines, sizeof *grown * (size_t)(o->n_lines + 1));
        if (!grown) {
            rc = STRATA_ENOMEM;
            break;
        }
        o->lines = grown;
        struct oracle_line *l = &o->lines[o->n_lines++];
        memset(l, 0, sizeof *l);
        const char *p = line;
        rc = parse_ids(&p, &l->prompt, &l->prompt_len);
        if (rc == 0 && *p == ' ') p++;
        if (rc == 0) rc = parse_ids(&p, &l->tokens, &l->n_tokens);
        if (rc == STRATA_EFORMAT)
            strata_set_error(rc, "oracle drafts: %s line %d: not \"PROMPT_IDS GENERATED_IDS\"",
                             path, number);
    }
    free(line);
    fclose(f);
    if (rc == 0 && o->n_lines == 0)
        rc = strata_set_error(STRATA_EFORMAT, "oracle drafts: %s holds no request", path);
    if (rc == STRATA_ENOMEM) strata_set_error(rc, "oracle drafts: out of memory reading %s", path);
    if (rc < 0) {
        oracle_draft_free(o);
        return rc;
    }
    *out = o;
    return 0;
}

void oracle_draft_free(struct oracle_draft *o) {
    if (!o) return;
    for (int i = 0; i < o->n_lines; i++) {
        free(o->lines[i].prompt);
        free(o->lines[i].tokens);
    }
    free(o->lines);
    free(o);
}

int oracle_draft(const struct oracle_draft *o, const int32_t *prompt, int prompt_len, int generated,
                 int k, int vocab, int32_t *out) {
    for (int i = 0; o && i < o->n_lines; i++) {
        const struct oracle_line *l = &o->lines[i];
        if (l->prompt_len != prompt_len || memcmp(l->prompt, prompt, sizeof *prompt * prompt_len))
            continue;
        int n = l->n_tokens - generated < k ? l->n_tokens - generated : k;
        uint64_t seed = mix((uint64_t)prompt_len * 0x9e3779b97f4a7c15ull ^ (uint64_t)i);
        for (int j = 0; j < n; j++) {
            const int32_t right = l->tokens[generated + j];
            const uint64_t h = mix(seed ^ mix((uint64_t)(generated + j) + 1));
            out[j] = h < o->accept_below ? right : (int32_t)((right + 1) % vocab);
        }
        return n > 0 ? n : 0;
    }
    return 0;
}
