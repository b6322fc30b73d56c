/* One anonymous mapping that holds the matrices a decode streams through, advised for
 * transparent huge pages.
 *
 * Why: batch-1 decode reads every weight once per token, so it runs at the memory's read
 * bandwidth, and that depends on where the weights live. On the 2-core Zen 3 test host one
 * thread streams 13.8-15.8 GB/s from a read-only mmap of the checkpoint (4 KiB page-cache
 * pages), 17.3-18.4 GB/s from anonymous memory and 19.0 GB/s from anonymous memory in 2 MiB
 * pages (fewer TLB misses, longer runs for the prefetchers): reference/README.md, "Weights
 * in memory". The arena is sized once (callers count first), 2 MiB aligned, and handed out
 * in 64-byte-aligned pieces in the order the forward pass reads them. */
#ifndef STRATA_REFERENCE_WEIGHT_ARENA_H
#define STRATA_REFERENCE_WEIGHT_ARENA_H

#include <stddef.h>

struct weight_arena {
    char *map;       /* the mapping (NULL when empty) */
    size_t map_size; /* bytes mapped, including alignment slack */
    char *base;      /* 2 MiB aligned start inside map */
    size_t size, used;
};

/* Rounds a piece's size up to the arena's alignment (64 bytes). */
size_t weight_arena_round(size_t bytes);

/* Maps `bytes` (a sum of weight_arena_round sizes; 0 maps nothing) and advises huge pages.
 * STRATA_ENOMEM (with the error set) when the mapping fails. */
int weight_arena_init(struct weight_arena *a, size_t bytes);

/* The next `bytes` of the arena (64-byte aligned), or NULL when it would not fit. */
void *weight_arena_alloc(struct weight_arena *a, size_t bytes);

/* Bytes of the arena the kernel backs with transparent huge pages right now (from
 * /proc/self/smaps); 0 where that cannot be read. For the startup summary. */
size_t weight_arena_huge_bytes(const struct weight_arena *a);

void weight_arena_free(struct weight_arena *a);

/* Drops the whole pages of [p, p + bytes) of a read-only file mapping from this process
 * (MADV_DONTNEED: a later read faults them back in from the file, whose contents the
 * process never changes), so a copy replaces them in the resident set. Advisory. */
void weight_arena_drop_mapped(const void *p, size_t bytes);

#endif
