/* weight_arena.h: an anonymous, huge-page-advised mapping handed out front to back. */
#include "reference/weight_arena.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime/base/status.h"

#define ARENA_ALIGN 64u
#define HUGE_PAGE ((size_t)2 << 20)

size_t weight_arena_round(size_t bytes) {
    return (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

int weight_arena_init(struct weight_arena *a, size_t bytes) {
    memset(a, 0, sizeof *a);
    if (bytes == 0) return STRATA_OK;
    const size_t size = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    void *map =
        mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return strata_set_error(STRATA_ENOMEM, "weights: cannot map %zu bytes for the copies",
                                size + HUGE_PAGE);
    a->map = map;
    a->map_size = size + HUGE_PAGE;
    a->base = (char *)(((uintptr_t)map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    a->size = size;
#ifdef MADV_HUGEPAGE
    /* Advisory: with transparent huge pages "never" (or no THP) the copy is still
     * anonymous memory, which streams faster than the file's page cache. */
    madvise(a->base, a->size, MADV_HUGEPAGE);
#endif
    return STRATA_OK;
}

void *weight_arena_alloc(struct weight_arena *a, size_t bytes) {
    const size_t need = weight_arena_round(bytes);
    if (!a->base || need > a->size - a->used) return NULL;
    void *p = a->base + a->used;
    a->used += need;
    return p;
}

/* Sums AnonHugePages over the /proc/self/smaps entries that overlap the arena. */
size_t weight_arena_huge_bytes(const struct weight_arena *a) {
    if (!a->map) return 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    char line[256];
    int inside = 0;
    size_t total = 0;
    const uintptr_t lo = (uintptr_t)a->map, hi = lo + a->map_size;
    while (fgets(line, sizeof line, f)) {
        uintmax_t begin, end, kb;
        if (sscanf(line, "%jx-%jx ", &begin, &end) == 2)
            inside = begin < hi && end > lo;
        else if (inside && sscanf(line, "AnonHugePages: %ju kB", &kb) == 1)
            total += (size_t)kb * 1024u;
    }
    fclose(f);
    return total;
}

void weight_arena_free(struct weight_arena *a) {
    if (a->map) munmap(a->map, a->map_size);
    memset(a, 0, sizeof *a);
}

void weight_arena_drop_mapped(const void *p, size_t bytes) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return;
    uintptr_t begin = (uintptr_t)p, end = begin + bytes;
    uintptr_t first = (begin + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t last = end & ~((uintptr_t)page - 1);
    if (last > first) madvise((void *)first, last - first, MADV_DONTNEED); /* advisory */
}
