/* strata-client's command line; see strata_client_args.h. */
#include "runtime/strata_client_args.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/base/cli.h"
#include "runtime/base/status.h"
#include "wire/message.h"

void client_usage(FILE *out) {
    fprintf(out,
            "usage: strata-client (--port P | --port-file F) --prompt IDS [--prompt IDS ...]\n"
            "       strata-client (--port P | --port-file F) --model DIR (--text T | --chat T)\n"
            "       strata-client (--port P | --port-file F) --describe\n"
            "Sends every prompt to stage 0 of a pipeline concurrently and prints the tokens.\n"
            "Text mode (--model with --text or --chat): one request; the answer streams to\n"
            "stdout as text, stops at the tokenizer's eos ids (or --max-tokens), and the\n"
            "usage (prompt tokens, generated tokens, tokens/s) goes to stderr.\n"
            "  --model DIR         tokenizer.json (+ configs, chat template) for text mode\n"
            "  --text T            raw prompt text, tokenized without a template\n"
            "  --chat T            one user message rendered with DIR's chat template\n"
            "                      (generation prompt on, thinking off unless --think)\n"
            "  --system T          a system message before --chat's user message\n"
            "  --think             let a Qwen3 model think (no empty <think></think> block)\n"
            "  --print-ids         text mode: prompt and generated ids on stderr too\n"
            "  --describe          print the pipeline's stages (layers, roles, grid, threads,\n"
            "                      weights, KV slots, build, device) as every stage reports\n"
            "                      itself round the ring, instead of sending a prompt;\n"
            "                      stage 0's queue and prefix-cache counters on stderr\n"
            "Images (Qwen3-VL; every request carries them; the prompt holds one image-pad id\n"
            "per image, which stage 0 expands, or each image's expanded run):\n"
            "  --grid T,H,W        an image's grid in vision patches (repeat per image, in\n"
            "                      prompt order; it takes T*H*W/merge^2 prompt rows)\n"
            "  --vision-embeds F   f32 little-endian [image tokens, H]: the merged vision\n"
            "                      embeddings of all images (H from the file size)\n"
            "  --deepstack F       f32 little-endian [K, image tokens, H]: DeepStack features\n"
            "  --merge N           spatial merge size (default 2, Qwen3-VL's)\n"
            "  --image FILE        a PNG or JPEG file sent as bytes (repeat per image, in\n"
            "                      prompt order) to a vision stage (strata-stage --role\n"
            "                      vision), which encodes it; the prompt holds one image-pad\n"
            "                      id per image (--chat: one image part per file before the\n"
            "                      text). Not with --grid / --vision-embeds\n"
            "  --video FILE        an MP4 or WebM file sent as bytes, likewise (files keep\n"
            "                      their command-line order among --image / --video); the\n"
            "                      prompt holds one video-pad id per video, which the vision\n"
            "                      stage expands with its timestamps (--chat: a video part)\n"
            "  --host H            stage 0 host (default 127.0.0.1)\n"
            "  --port P            stage 0 port\n"
            "  --port-file F       read stage 0's port from F\n"
            "  --prompt IDS        comma-separated prompt token ids (one request each)\n"
            "  --copies N          send each prompt N times (default 1)\n"
            "  --max-tokens N      tokens to generate per request (default 16)\n"
            "  --stop IDS          comma-separated stop token ids (default none)\n"
            "  --temperature T     0 = greedy (default)\n"
            "  --top-k K  --top-p P  --seed S   sampling\n"
            "  --speculate off|ngram|draft  speculative decoding for these requests (default:\n"
            "                      stage 0's --speculate): ngram drafts tokens that continue an\n"
            "                      earlier occurrence of the last ones, draft stage 0's draft\n"
            "                      model's (--draft-model); the same tokens either way\n"
            "  --speculate-k K     drafts per decode step, 1..16 (default: stage 0's)\n"
            "  --cancel-after N    cancel request 0 after N tokens (tests cancellation)\n"
            "  --timeout-ms MS     fail when no event arrives for MS (default 30000)\n"
            "  --reconnect-timeout-ms MS  when stage 0 dies mid-request, reconnect (re-reading\n"
            "                      --port-file) for up to MS and resubmit each unfinished\n"
            "                      request with the tokens received so far: it resumes with\n"
            "                      the same tokens (default 0: fail at once)\n"
            "  --auth-key-file F   pre-shared key (else $STRATA_AUTH_KEY): TLS 1.3 with it\n"
            "                      as external PSK (plaintext HMAC Hello with --insecure)\n"
            "  --tls-cert F --tls-key F --tls-ca F   TLS 1.3 with this certificate and key,\n"
            "                      trusting stage 0's certificate only from this CA\n"
            "  --insecure          plaintext link (warned); one of a key, certificates or\n"
            "                      --insecure is required (exit 2 without)\n"
            "  --quiet             print only the summary lines\n"
            "  --latency           also print inter-token gap p50/p99 per request\n"
            "  --help              this text\n"
            "Exit codes: 0 every request finished, 1 a request or the connection failed,\n"
            "2 bad command line.\n");
}

int client_text_mode(const struct client_args *a) {
    return a->text || a->chat;
}

/* Reads the options into *a. Returns -1 to go on, else the exit code. */
static int parse_options(struct client_args *a, int argc, char **argv) {
    static const struct option options[] = {
        {"host", 1, 0, 'H'},          {"port", 1, 0, 'p'},
        {"port-file", 1, 0, 'P'},     {"prompt", 1, 0, 'i'},
        {"copies", 1, 0, 'c'},        {"max-tokens", 1, 0, 'n'},
        {"stop", 1, 0, 's'},          {"temperature", 1, 0, 't'},
        {"top-k", 1, 0, 'k'},         {"top-p", 1, 0, 'q'},
        {"seed", 1, 0, 'S'},          {"cancel-after", 1, 0, 'C'},
        {"timeout-ms", 1, 0, 'T'},    {"auth-key-file", 1, 0, 'a'},
        {"quiet", 0, 0, 'Q'},         {"latency", 0, 0, 'L'},
        {"help", 0, 0, 'h'},          {"model", 1, 0, 'm'},
        {"text", 1, 0, 'x'},          {"chat", 1, 0, 'y'},
        {"system", 1, 0, 'Y'},        {"think", 0, 0, 'Z'},
        {"print-ids", 0, 0, 'D'},     {"tls-cert", 1, 0, 'E'},
        {"tls-key", 1, 0, 'K'},       {"tls-ca", 1, 0, 'A'},
        {"insecure", 0, 0, 'I'},      {"grid", 1, 0, 'G'},
        {"vision-embeds", 1, 0, 'V'}, {"deepstack", 1, 0, 'W'},
        {"merge", 1, 0, 'M'},         {"image", 1, 0, 'g'},
        {"video", 1, 0, 'F'},         {"reconnect-timeout-ms", 1, 0, 'R'},
        {"describe", 0, 0, 'X'},      {"speculate", 1, 0, 'j'},
        {"speculate-k", 1, 0, 'J'},   {0, 0, 0, 0}};
    struct stage_request *base = &a->base;
    int c;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'H': a->host = optarg; break;
        case 'p': a->port = atoi(optarg); break;
        case 'P': a->port_file = optarg; break;
        case 'i':
            if (a->num_prompts >= CLIENT_MAX_REQUESTS) {
                fprintf(stderr, "strata-client: at most %d prompts\n", CLIENT_MAX_REQUESTS);
                return STRATA_EXIT_USAGE;
            }
            a->prompts[a->num_prompts++] = optarg;
            break;
        case 'c': a->copies = atoi(optarg); break;
        case 'n': a->max_tokens = atoi(optarg); break;
        case 's':
            base->num_stop_ids =
                cli_parse_ids(base->stop_ids, REQUEST_MAX_STOP_IDS, optarg, 0, INT32_MAX);
            if (base->num_stop_ids < 0) {
                fprintf(stderr, "strata-client: bad --stop list '%s'\n", optarg);
                return STRATA_EXIT_USAGE;
            }
            break;
        case 't': base->sampling.temperature = strtof(optarg, NULL); break;
        case 'k': base->sampling.top_k = atoi(optarg); break;
        case 'q': base->sampling.top_p = strtof(optarg, NULL); break;
        case 'S': base->sampling.seed = strtoull(optarg, NULL, 10); break;
        case 'C': a->cancel_after = atoi(optarg); break;
        case 'j':
            if (strcmp(optarg, "off") && strcmp(optarg, "ngram") && strcmp(optarg, "draft")) {
                fprintf(stderr, "strata-client: --speculate is off, ngram or draft, not '%s'\n",
                        optarg);
                return STRATA_EXIT_USAGE;
            }
            base->speculate = !strcmp(optarg, "ngram")   ? WIRE_SPECULATE_NGRAM
                              : !strcmp(optarg, "draft") ? WIRE_SPECULATE_DRAFT
                                                         : WIRE_SPECULATE_OFF;
            break;
        case 'J':
            if (cli_parse_int(optarg, 1, WIRE_SPECULATE_MAX_K, &base->speculate_k) < 0) {
                fprintf(stderr, "strata-client: --speculate-k is 1..%d, not '%s'\n",
                        WIRE_SPECULATE_MAX_K, optarg);
                return STRATA_EXIT_USAGE;
            }
            break;
        case 'T': a->timeout_ms = atoi(optarg); break;
        case 'R': a->reconnect_timeout_ms = atoi(optarg); break;
        case 'a': a->key_file = optarg; break;
        case 'E': a->tls_cert = optarg; break;
        case 'K': a->tls_key = optarg; break;
        case 'A': a->tls_ca = optarg; break;
        case 'I': a->insecure = 1; break;
        case 'Q': a->quiet = 1; break;
        case 'L': a->latency = 1; break;
        case 'm': a->model = optarg; break;
        case 'x': a->text = optarg; break;
        case 'y': a->chat = optarg; break;
        case 'Y': a->system = optarg; break;
        case 'Z': a->think = 1; break;
        case 'D': a->print_ids = 1; break;
        case 'X': a->describe = 1; break;
        case 'G': {
            int32_t thw[4];
            if (a->num_images >= VL_MAX_IMAGES ||
                cli_parse_ids(thw, 4, optarg, 0, INT32_MAX) != 3) {
                fprintf(stderr, "strata-client: bad --grid '%s' (T,H,W; at most %d)\n", optarg,
                        VL_MAX_IMAGES);
                return STRATA_EXIT_USAGE;
            }
            a->grids[a->num_images++] = (struct vl_grid){thw[0], thw[1], thw[2]};
            break;
        }
        case 'V': a->embeds_file = optarg; break;
        case 'W': a->deepstack_file = optarg; break;
        case 'M': a->merge = atoi(optarg); break;
        case 'g':
        case 'F':
            if (a->num_image_files >= VL_MAX_IMAGES) {
                fprintf(stderr, "strata-client: at most %d --image / --video files\n",
                        VL_MAX_IMAGES);
                return STRATA_EXIT_USAGE;
            }
            a->image_is_video[a->num_image_files] = c == 'F';
            a->image_paths[a->num_image_files++] = optarg;
            break;
        case 'h': client_usage(stdout); return STRATA_EXIT_OK;
        default: client_usage(stderr); return STRATA_EXIT_USAGE;
        }
    }
    return -1;
}

/* Parses the command line and checks it. Returns -1 to go on, else the exit code. */
int client_parse_args(struct client_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->copies = 1;
    a->max_tokens = 16;
    a->cancel_after = -1;
    a->timeout_ms = 30000;
    a->base.sampling.top_p = 1.0f;
    a->merge = 2;
    int rc = parse_options(a, argc, argv);
    if (rc >= 0) return rc;
    /* An unreadable port file leaves the port invalid, which the check below reports. */
    if (a->port_file && cli_read_port_file(a->port_file, &a->port) < 0) a->port = -1;
    if (a->describe && (client_text_mode(a) || a->num_prompts)) {
        fprintf(stderr,
                "strata-client: --describe sends no prompt (no --prompt, --text, --chat)\n");
        return STRATA_EXIT_USAGE;
    }
    if (a->describe) a->num_prompts = 1; /* for the checks below; no job is sent */
    if (client_text_mode(a)) {
        if (!a->model || (a->text && a->chat) || a->num_prompts || a->copies != 1 ||
            (a->system && !a->chat)) {
            fprintf(stderr, "strata-client: text mode needs --model and one of --text / --chat "
                            "(no --prompt, --copies 1; --system only with --chat)\n");
            return STRATA_EXIT_USAGE;
        }
        a->num_prompts = 1; /* the one job; its ids come from build_text_prompt */
    }
    if (optind < argc || a->num_prompts == 0 || a->port <= 0 || a->port > 65535 || a->copies < 1 ||
        a->max_tokens < 1 || a->timeout_ms < 1 || a->reconnect_timeout_ms < 0 ||
        a->num_prompts * a->copies > CLIENT_MAX_REQUESTS) {
        fprintf(stderr,
                "strata-client: need a valid --port (or --port-file), at least one "
                "--prompt, --copies/--max-tokens >= 1 and at most %d requests\n",
                CLIENT_MAX_REQUESTS);
        client_usage(stderr);
        return STRATA_EXIT_USAGE;
    }
    return -1;
}
