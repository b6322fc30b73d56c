/* strata-client's command line (runtime/strata_client_main.c): its flags, their defaults and
 * the checks between them, apart from what the client does with them. */
#ifndef STRATA_RUNTIME_STRATA_CLIENT_ARGS_H
#define STRATA_RUNTIME_STRATA_CLIENT_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/model/vl_prompt.h"
#include "runtime/stage/client.h"

#define CLIENT_MAX_REQUESTS 256

struct client_args {
    const char *host, *port_file, *key_file, *prompts[CLIENT_MAX_REQUESTS];
    int num_prompts, port, copies, max_tokens, cancel_after, timeout_ms, quiet, latency, insecure;
    const char *tls_cert, *tls_key, *tls_ca;
    const char *model, *text, *chat, *system; /* text mode when text or chat is set */
    int think, print_ids, describe;
    struct stage_request base;
    /* Images for every request (--grid, --vision-embeds, --deepstack). */
    struct vl_grid grids[VL_MAX_IMAGES];
    int num_images, merge;
    const char *embeds_file, *deepstack_file;
    char *embeds, *deepstack; /* file bytes: f32 values */
    struct request_vision vision;
    /* --image: files sent as bytes to a vision stage (strata-stage --role vision). */
    const char *image_paths[VL_MAX_IMAGES];
    int num_image_files;
    uint8_t *image_bytes; /* all files, concatenated */
    uint32_t image_sizes[VL_MAX_IMAGES];
    uint8_t image_formats[VL_MAX_IMAGES];
    uint8_t image_is_video[VL_MAX_IMAGES]; /* --video (else --image), in command-line order */
    int reconnect_timeout_ms;              /* stage 0 lost: reconnect and resubmit for this long */
    struct wire_security *sec;             /* the link's security, for reconnecting */
};

/* Text mode: --text or --chat (one request, tokenized here). */
int client_text_mode(const struct client_args *a);

/* The --help text. */
void client_usage(FILE *out);

/* Fills `a` from argv (defaults first) and checks it: -1 to go on, else the exit code (0 for
 * --help, 2 with the reason printed for a bad command line). */
int client_parse_args(struct client_args *a, int argc, char **argv);

#endif
