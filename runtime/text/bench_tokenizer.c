/* strata-bench-tokenizer: encode throughput of the C tokenizer on a JSONL corpus, for
 * `./strata bench tokenizer` (tools/bench_tokenizer.sh runs HF tokenizers on the same corpus
 * in the same run and prints the ratio). Each corpus line is a JSON object with a "text"
 * string (the tokenizer golden's format) or a JSON string; every text is encoded on its own
 * (as a server encodes prompts), `--repeat` times, on one thread; only tokenizer_encode is
 * timed. It prints one key=value line, including an FNV-1a hash of all ids so the script can
 * check that both tokenizers produced the same ids. Exit: 0 ok, 1 failure, 2 usage. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "runtime/text/tokenizer.h"

#define PROG "strata-bench-tokenizer"

static void usage(FILE *out) {
    fprintf(out, "usage: " PROG " --model DIR --corpus FILE.jsonl [--repeat N] [--ids-out F]\n"
                 "Encodes every line's text with DIR/tokenizer.json (one thread, each text on\n"
                 "its own, N rounds, default 5) and prints bytes, ids, seconds, MB/s and an\n"
                 "FNV-1a hash of the ids of one round (--ids-out: those ids, a line per text).\nExit: 0 ok, 1 failure, 2 usage.\n");
}

struct corpus {
    char **text;
    size_t *len;
    size_t n, bytes;
};

static int corpus_load(struct corpus *c, const char *path) {
    char *buf;
    size_t size;
    int rc = cli_read_file(&buf, &size, path);
    if (rc) return rc;
    memset(c, 0, sizeof *c);
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        cJSON *j = cJSON_Parse(line);
        if (!j && *line) {
            free(buf);
            return strata_set_error(STRATA_EINVAL, "%s: a line is not JSON", path);
        }
        cJSON *s = cJSON_IsObject(j) ? cJSON_GetObjectItem(j, "text") : j;
        if (cJSON_IsString(s)) {
            char **t = realloc(c->text, (c->n + 1) * sizeof *t);
            size_t *l = realloc(c->len, (c->n + 1) * sizeof *l);
            if (t) c->text = t;
            if (l) c->len = l;
            if (!t || !l || !(c->text[c->n] = strdup(s->valuestring))) {
                cJSON_Delete(j);
                free(buf);
                return strata_set_error(STRATA_ENOMEM, "out of memory reading %s", path);
            }
            c->len[c->n] = strlen(s->valuestring);
            c->bytes += c->len[c->n++];
        }
        cJSON_Delete(j);
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    if (c->n == 0) return strata_set_error(STRATA_EINVAL, "%s: no text lines", path);
    return 0;
}

static void corpus_free(struct corpus *c) {
    for (size_t i = 0; i < c->n; i++) free(c->text[i]);
    free(c->text);
    free(c->len);
}

/* One line per text: its ids separated by spaces (the first round's), for the script's
 * text-by-text comparison with HF. */
static void write_ids(FILE *f, const struct tokenizer_ids *ids) {
    for (size_t k = 0; k < ids->n; k++) fprintf(f, k ? " %d" : "%d", ids->ids[k]);
    fputc('\n', f);
}

static int bench(const struct tokenizer *tok, const struct corpus *c, int repeat, FILE *ids_out) {
    struct tokenizer_ids ids = {0};
    uint64_t hash = 1469598103934665603ull, n_ids = 0;
    int64_t t0 = cli_now_ns();
    for (int r = 0; r < repeat; r++) {
        for (size_t i = 0; i < c->n; i++) {
            ids.n = 0;
            int rc = tokenizer_encode(tok, c->text[i], c->len[i], &ids);
            if (rc) {
                tokenizer_ids_free(&ids);
                return rc;
            }
            if (r > 0) continue;
            if (ids_out) write_ids(ids_out, &ids);
            n_ids += ids.n;
            for (size_t k = 0; k < ids.n; k++) {
                hash ^= (uint64_t)(uint32_t)ids.ids[k];
                hash *= 1099511628211ull;
            }
        }
    }
    double s = (double)(cli_now_ns() - t0) / 1e9;
    tokenizer_ids_free(&ids);
    printf("impl=strata texts=%zu bytes=%zu ids=%llu rounds=%d seconds=%.4f mb_per_s=%.3f "
           "ids_fnv=%016llx\n",
           c->n, c->bytes, (unsigned long long)n_ids, repeat, s,
           (double)c->bytes * repeat / s / 1e6, (unsigned long long)hash);
    return 0;
}

int main(int argc, char **argv) {
    static const struct option longopts[] = {{"model", required_argument, 0, 'm'},
                                             {"corpus", required_argument, 0, 'c'},
                                             {"repeat", required_argument, 0, 'r'},
                                             {"ids-out", required_argument, 0, 'o'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *model = NULL, *corpus_path = NULL, *ids_path = NULL;
    int repeat = 5, opt;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (opt == 'm') model = optarg;
        else if (opt == 'c') corpus_path = optarg;
        else if (opt == 'o') ids_path = optarg;
        else if (opt == 'r' && cli_parse_int(optarg, 1, 1000000, &repeat) == 0) continue;
        else if (opt == 'h') return usage(stdout), 0;
        else return usage(stderr), 2;
    }
    if (!model || !corpus_path || optind != argc) return usage(stderr), 2;
    struct tokenizer *tok = NULL;
    struct corpus c = {0};
    int rc = tokenizer_load(&tok, model);
    if (rc == 0) rc = corpus_load(&c, corpus_path);
    FILE *ids_out = NULL;
    if (rc == 0 && ids_path && !(ids_out = fopen(ids_path, "w")))
        rc = strata_set_error(STRATA_EIO, "cannot write %s", ids_path);
    if (rc == 0) rc = bench(tok, &c, repeat, ids_out);
    if (ids_out && fclose(ids_out) != 0 && rc == 0)
        rc = strata_set_error(STRATA_EIO, "cannot write %s", ids_path);
    corpus_free(&c);
    tokenizer_free(tok);
    if (rc) fprintf(stderr, PROG ": %s\n", strata_last_error());
    return rc ? 1 : 0;
}
