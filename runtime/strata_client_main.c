/* strata-client: sends one or more prompts (token ids) to stage 0 of a pipeline at once,
 * streams the generated tokens and prints them per request with tokens/s.
 * Exit codes: 0 all requests finished, 1 a request failed or the pipeline went away,
 * 2 usage. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/base/status.h"
#include "runtime/stage/client.h"

#define MAX_REQUESTS 256
#define MAX_PROMPT 65536

struct job {
    int32_t *prompt;
    int prompt_len;
    uint64_t nonce;
    int32_t *tokens;
    int n_tokens;
    int done, failed, cancelled;
    enum wire_finish finish;
    char error[600];
    double t_first, t_done, t_last;
    double *gaps; /* [max_tokens] seconds between consecutive tokens */
};

static void usage(FILE *out) {
    fprintf(out, "usage: strata-client (--port P | --port-file F) --prompt IDS [--prompt IDS ...]\n"
                 "Sends every prompt to stage 0 of a pipeline concurrently and prints the tokens.\n"
                 "  --host H            stage 0 host (default 127.0.0.1)\n"
                 "  --port P            stage 0 port\n"
                 "  --port-file F       read stage 0's port from F\n"
                 "  --prompt IDS        comma-separated prompt token ids (one request each)\n"
                 "  --copies N          send each prompt N times (default 1)\n"
                 "  --max-tokens N      tokens to generate per request (default 16)\n"
                 "  --stop IDS          comma-separated stop token ids (default none)\n"
                 "  --temperature T     0 = greedy (default)\n"
                 "  --top-k K  --top-p P  --seed S   sampling\n"
                 "  --cancel-after N    cancel request 0 after N tokens (tests cancellation)\n"
                 "  --timeout-ms MS     fail when no event arrives for MS (default 30000)\n"
                 "  --auth-key-file F   pre-shared key (else $STRATA_AUTH_KEY)\n"
                 "  --quiet             print only the summary lines\n"
                 "  --latency           also print inter-token gap p50/p99 per request\n"
                 "  --help              this text\n"
                 "Exit codes: 0 every request finished, 1 a request or the connection failed,\n"
                 "2 bad command line.\n");
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Parses "1,2,3" into ids [cap]; returns the count or -1. */
static int parse_ids(int32_t *ids, int cap, const char *text) {
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long v;
        errno = 0;
        v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || n >= cap) return -1;
        ids[n++] = (int32_t)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return n;
}

static int read_port_file(const char *path) {
    FILE *f = fopen(path, "r");
    int port = -1;
    if (!f) return -1;
    if (fscanf(f, "%d", &port) != 1) port = -1;
    fclose(f);
    return port;
}

int main(int argc, char **argv) {
    static const struct option options[] = {
        {"host", 1, 0, 'H'},       {"port", 1, 0, 'p'},          {"port-file", 1, 0, 'P'},
        {"prompt", 1, 0, 'i'},     {"copies", 1, 0, 'c'},        {"max-tokens", 1, 0, 'n'},
        {"stop", 1, 0, 's'},       {"temperature", 1, 0, 't'},   {"top-k", 1, 0, 'k'},
        {"top-p", 1, 0, 'q'},      {"seed", 1, 0, 'S'},          {"cancel-after", 1, 0, 'C'},
        {"timeout-ms", 1, 0, 'T'}, {"auth-key-file", 1, 0, 'a'}, {"quiet", 0, 0, 'Q'},
        {"latency", 0, 0, 'L'},    {"help", 0, 0, 'h'},          {0, 0, 0, 0}};
    const char *host = NULL, *port_file = NULL, *key_file = NULL, *prompts[MAX_REQUESTS];
    int num_prompts = 0, port = 0, copies = 1, max_tokens = 16, cancel_after = -1;
    int timeout_ms = 30000, quiet = 0, latency = 0, c, num_jobs = 0, remaining,
        code = STRATA_EXIT_OK, rc;
    struct stage_request base;
    struct strata_client client;
    struct wire_auth_key key;
    struct job *jobs = NULL;
    uint64_t nonce_base;
    double t0, total_time;
    long total_tokens = 0;
    memset(&base, 0, sizeof base);
    memset(&client, 0, sizeof client);
    memset(&key, 0, sizeof key);
    client.conn.fd = -1;
    base.sampling.top_p = 1.0f;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'H': host = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'P': port_file = optarg; break;
        case 'i':
            if (num_prompts >= MAX_REQUESTS) {
                fprintf(stderr, "strata-client: at most %d prompts\n", MAX_REQUESTS);
                return STRATA_EXIT_USAGE;
            }
            prompts[num_prompts++] = optarg;
            break;
        case 'c': copies = atoi(optarg); break;
        case 'n': max_tokens = atoi(optarg); break;
        case 's':
            base.num_stop_ids = parse_ids(base.stop_ids, REQUEST_MAX_STOP_IDS, optarg);
            if (base.num_stop_ids < 0) {
                fprintf(stderr, "strata-client: bad --stop list '%s'\n", optarg);
                return STRATA_EXIT_USAGE;
            }
            break;
        case 't': base.sampling.temperature = strtof(optarg, NULL); break;
        case 'k': base.sampling.top_k = atoi(optarg); break;
        case 'q': base.sampling.top_p = strtof(optarg, NULL); break;
        case 'S': base.sampling.seed = strtoull(optarg, NULL, 10); break;
        case 'C': cancel_after = atoi(optarg); break;
        case 'T': timeout_ms = atoi(optarg); break;
        case 'a': key_file = optarg; break;
        case 'Q': quiet = 1; break;
        case 'L': latency = 1; break;
        case 'h': usage(stdout); return STRATA_EXIT_OK;
        default: usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
    if (port_file) port = read_port_file(port_file);
    if (optind < argc || num_prompts == 0 || port <= 0 || port > 65535 || copies < 1 ||
        max_tokens < 1 || timeout_ms < 1 || num_prompts * copies > MAX_REQUESTS) {
        fprintf(stderr,
                "strata-client: need a valid --port (or --port-file), at least one "
                "--prompt, --copies/--max-tokens >= 1 and at most %d requests\n",
                MAX_REQUESTS);
        usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    jobs = calloc((size_t)(num_prompts * copies), sizeof *jobs);
    if (!jobs) return STRATA_EXIT_FAILURE;
    /* Top bit clear, so nonce_base + i + 1 never wraps to the reserved nonce 0. */
    nonce_base = (((uint64_t)time(NULL) << 20) ^ ((uint64_t)getpid() << 8)) & (UINT64_MAX >> 1);
    for (int i = 0; i < num_prompts * copies; i++) {
        struct job *j = &jobs[num_jobs++];
        j->prompt = malloc(sizeof(int32_t) * MAX_PROMPT);
        j->tokens = calloc((size_t)max_tokens, sizeof(int32_t));
        j->gaps = calloc((size_t)max_tokens, sizeof(double));
        if (!j->prompt || !j->tokens || !j->gaps) {
            code = STRATA_EXIT_FAILURE;
            goto done;
        }
        j->prompt_len = parse_ids(j->prompt, MAX_PROMPT, prompts[i % num_prompts]);
        if (j->prompt_len < 1) {
            fprintf(stderr, "strata-client: bad --prompt '%s'\n", prompts[i % num_prompts]);
            code = STRATA_EXIT_USAGE;
            goto done;
        }
        j->nonce = nonce_base + (uint64_t)i + 1;
    }
    signal(SIGPIPE, SIG_IGN);
    if (wire_auth_key_load(&key, key_file, NULL) < 0 ||
        client_connect(&client, host, port, &key, 5000) < 0) {
        fprintf(stderr, "strata-client: %s\n", strata_last_error());
        code = STRATA_EXIT_FAILURE;
        goto done;
    }
    t0 = now_s();
    for (int i = 0; i < num_jobs; i++) {
        struct stage_request req = base;
        req.nonce = jobs[i].nonce;
        req.prompt = jobs[i].prompt;
        req.prompt_len = jobs[i].prompt_len;
        req.max_tokens = max_tokens;
        if (client_submit(&client, &req) < 0) {
            fprintf(stderr, "strata-client: submit: %s\n", strata_last_error());
            code = STRATA_EXIT_FAILURE;
            goto done;
        }
    }
    remaining = num_jobs;
    while (remaining > 0) {
        struct request_event ev;
        struct job *j = NULL;
        rc = client_next_event(&client, &ev, timeout_ms);
        if (rc < 0) {
            fprintf(stderr, "strata-client: %s\n",
                    rc == STRATA_ETIMEOUT ? "no answer from the pipeline in time"
                                          : strata_last_error());
            code = STRATA_EXIT_FAILURE;
            break;
        }
        if (ev.kind == REQUEST_EVENT_CONNECTION_ERROR) {
            /* Nonce 0: stage 0 is closing this connection; every request on it is lost. */
            fprintf(stderr, "strata-client: stage 0 ended the connection: %s: %s\n",
                    strata_status_name(ev.code), ev.message);
            for (int i = 0; i < num_jobs; i++)
                if (!jobs[i].done) {
                    snprintf(jobs[i].error, sizeof jobs[i].error, "connection error: %s: %s",
                             strata_status_name(ev.code), ev.message);
                    jobs[i].failed = jobs[i].done = 1;
                    remaining--;
                }
            code = STRATA_EXIT_FAILURE;
            break;
        }
        for (int i = 0; i < num_jobs; i++)
            if (jobs[i].nonce == ev.nonce && !jobs[i].done) j = &jobs[i];
        if (!j) continue;
        if (ev.kind == REQUEST_EVENT_ERROR && ev.code == STRATA_ECANCELED && j == &jobs[0] &&
            cancel_after >= 0) {
            j->cancelled = j->done = 1;
            remaining--;
            continue;
        }
        if (ev.kind == REQUEST_EVENT_ERROR) {
            snprintf(j->error, sizeof j->error, "%s: %s", strata_status_name(ev.code), ev.message);
            j->failed = j->done = 1;
            j->t_done = now_s();
            remaining--;
            continue;
        }
        if (ev.step != (uint64_t)j->n_tokens || j->n_tokens >= max_tokens) {
            snprintf(j->error, sizeof j->error, "token for step %llu out of order",
                     (unsigned long long)ev.step);
            j->failed = j->done = 1;
            remaining--;
            continue;
        }
        {
            double t = now_s();
            if (j->n_tokens == 0)
                j->t_first = t;
            else
                j->gaps[j->n_tokens - 1] = t - j->t_last;
            j->t_last = t;
        }
        j->tokens[j->n_tokens++] = ev.token;
        if (ev.finish != WIRE_FINISH_NONE) {
            j->finish = ev.finish;
            j->done = 1;
            j->t_done = now_s();
            remaining--;
        } else if (j == &jobs[0] && cancel_after >= 0 && j->n_tokens == cancel_after) {
            if (client_cancel(&client, j->nonce) < 0)
                fprintf(stderr, "strata-client: cancel: %s\n", strata_last_error());
        }
    }
    total_time = now_s() - t0;
    for (int i = 0; i < num_jobs; i++) {
        struct job *j = &jobs[i];
        total_tokens += j->n_tokens;
        if (!j->done) {
            printf("request %d: error: no result\n", i);
            code = STRATA_EXIT_FAILURE;
            continue;
        }
        if (j->cancelled) {
            printf("request %d: cancelled after %d tokens\n", i, j->n_tokens);
            continue;
        }
        if (j->failed) {
            printf("request %d: error %s\n", i, j->error);
            code = STRATA_EXIT_FAILURE;
            continue;
        }
        if (!quiet) {
            printf("request %d: tokens", i);
            for (int k = 0; k < j->n_tokens; k++)
                printf(" %d", j->tokens[k]);
            printf("\n");
        }
        printf("request %d: %d tokens (%s), first token %.1f ms, %.1f tokens/s\n", i, j->n_tokens,
               j->finish == WIRE_FINISH_STOP ? "stop" : "length", (j->t_first - t0) * 1e3,
               j->t_done > j->t_first && j->n_tokens > 1
                   ? (j->n_tokens - 1) / (j->t_done - j->t_first)
                   : 0.0);
        if (latency && j->n_tokens > 2) {
            int n = j->n_tokens - 1;
            qsort(j->gaps, (size_t)n, sizeof(double), compare_double);
            printf("request %d: inter-token gap p50 %.1f us, p99 %.1f us\n", i,
                   j->gaps[n / 2] * 1e6, j->gaps[(int)(n * 0.99)] * 1e6);
        }
    }
    printf("total: %d requests, %ld tokens in %.3f s = %.1f tokens/s\n", num_jobs, total_tokens,
           total_time, total_time > 0 ? total_tokens / total_time : 0.0);
done:
    client_close(&client);
    wire_auth_key_clear(&key);
    for (int i = 0; i < num_jobs; i++) {
        free(jobs[i].prompt);
        free(jobs[i].tokens);
        free(jobs[i].gaps);
    }
    free(jobs);
    return code;
}
