/* Writes every sample frame to DIR/<name>.stra; used once to (re)generate the committed fuzz
 * seed corpus and the flatc golden JSON (see tests/wire/README.md). */
#include <stdio.h>
#include <string.h>

#include "runtime/base/status.h"
#include "tests/wire/samples.h"

int main(int argc, char **argv) {
    if (argc != 2 || strcmp(argv[1], "--help") == 0) {
        fprintf(stderr, "usage: write_samples DIR\nWrites each sample wire frame to "
                        "DIR/<kind>.stra (and control_describe.stra).\n");
        return argc == 2 ? STRATA_EXIT_OK : STRATA_EXIT_USAGE;
    }
    struct wire_arena arena;
    if (wire_arena_init(&arena, 0)) return STRATA_EXIT_FAILURE;
    int rc = STRATA_EXIT_OK;
    for (int kind = WIRE_KIND_HELLO; kind <= WIRE_KIND_LAST; ++kind) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.stra", argv[1], sample_name((enum wire_kind)kind));
        FILE *f = NULL;
        if (sample_build(&arena, (enum wire_kind)kind) || !(f = fopen(path, "wb")) ||
            fwrite(wire_arena_frame(&arena), 1, wire_arena_frame_len(&arena), f) !=
                wire_arena_frame_len(&arena)) {
            fprintf(stderr, "write_samples: %s: %s\n", path, strata_last_error());
            rc = STRATA_EXIT_FAILURE;
        }
        if (f) fclose(f);
    }
    char path[4096];
    FILE *f = NULL;
    snprintf(path, sizeof path, "%s/control_describe.stra", argv[1]);
    if (sample_build_describe(&arena) || !(f = fopen(path, "wb")) ||
        fwrite(wire_arena_frame(&arena), 1, wire_arena_frame_len(&arena), f) !=
            wire_arena_frame_len(&arena)) {
        fprintf(stderr, "write_samples: %s: %s\n", path, strata_last_error());
        rc = STRATA_EXIT_FAILURE;
    }
    if (f) fclose(f);
    wire_arena_free(&arena);
    return rc;
}
