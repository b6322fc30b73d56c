/* Our FlatBuffers builder and verifier (schema-independent part), written from the binary
 * format spec; see flatbuf.h for the design. The arena functions of message.h live here
 * because the builder is their only user. */
#include "wire/flatbuf.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/base/status.h"

#define ARENA_DEFAULT_CAPACITY 4096
#define MAX_FIELDS_PER_TABLE WIRE_MAX_TABLE_FIELDS /* the arena's record of a table's fields */

/* ---- arena ---- */

static size_t round_up(size_t value, size_t align) {
    return (value + align - 1) / align * align;
}

int wire_arena_init(struct wire_arena *arena, size_t initial_capacity) {
    memset(arena, 0, sizeof *arena);
    size_t cap = round_up(initial_capacity ? initial_capacity : ARENA_DEFAULT_CAPACITY, 64);
    arena->buf = aligned_alloc(64, cap);
    if (!arena->buf)
        return strata_set_error(STRATA_ENOMEM, "wire arena: cannot allocate %zu bytes", cap);
    arena->cap = cap;
    arena->owns = 1;
    arena->minalign = 1;
    return 0;
}

int wire_arena_init_fixed(struct wire_arena *arena, void *buffer, size_t capacity) {
    memset(arena, 0, sizeof *arena);
    if (!buffer && capacity)
        return strata_set_error(STRATA_EINVAL, "wire arena: NULL buffer of %zu bytes", capacity);
    arena->buf = buffer;
    arena->cap = capacity;
    arena->minalign = 1;
    return 0;
}

void wire_arena_free(struct wire_arena *arena) {
    if (!arena) return;
    if (arena->owns) free(arena->buf);
    free(arena->vtables);
    memset(arena, 0, sizeof *arena);
}

const uint8_t *wire_arena_frame(const struct wire_arena *arena) {
    return arena->buf + (arena->cap - arena->size);
}

size_t wire_arena_frame_len(const struct wire_arena *arena) {
    return arena->size;
}

static void arena_fail(struct wire_arena *arena, int code) {
    if (!arena->error) arena->error = code;
}

/* Makes room for `n` more bytes at the front, moving the content to the end of a larger
 * buffer (offsets from the end stay valid). */
static int arena_reserve(struct wire_arena *arena, size_t n) {
    if (arena->error) return -1;
    if (arena->cap - arena->size >= n) return 0;
    if (!arena->owns || arena->size + n > ((size_t)1 << 31)) {
        arena_fail(arena, strata_set_error(STRATA_ENOMEM,
                                           "wire arena: frame needs %zu bytes, capacity %zu%s",
                                           arena->size + n, arena->cap,
                                           arena->owns ? " (limit 2 GiB)" : " (fixed buffer)"));
        return -1;
    }
    size_t cap = arena->cap * 2;
    if (cap < arena->size + n) cap = arena->size + n;
    cap = round_up(cap, 64);
    uint8_t *grown = aligned_alloc(64, cap);
    if (!grown) {
        arena_fail(arena,
                   strata_set_error(STRATA_ENOMEM, "wire arena: cannot grow to %zu bytes", cap));
        return -1;
    }
    if (arena->size)
        memcpy(grown + cap - arena->size, arena->buf + arena->cap - arena->size, arena->size);
    free(arena->buf);
    arena->buf = grown;
    arena->cap = cap;
    return 0;
}

/* Pointer to the first of `n` bytes just claimed at the front, or NULL on failure. */
static uint8_t *arena_claim(struct wire_arena *arena, size_t n) {
    if (arena_reserve(arena, n)) return NULL;
    arena->size += n;
    return arena->buf + (arena->cap - arena->size);
}

static void arena_pad(struct wire_arena *arena, size_t n) {
    uint8_t *p = arena_claim(arena, n);
    if (p) memset(p, 0, n);
}

/* Pads so that after `additional` more bytes the size is a multiple of `align`. */
static void arena_prep(struct wire_arena *arena, size_t align, size_t additional) {
    if (align > arena->minalign) arena->minalign = align;
    size_t pad = (~(arena->size + additional) + 1) & (align - 1);
    arena_pad(arena, pad);
}

static void put_le(uint8_t *p, uint64_t value, size_t size) {
    for (size_t i = 0; i < size; ++i)
        p[i] = (uint8_t)(value >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, size_t size) {
    uint64_t value = 0;
    for (size_t i = 0; i < size; ++i)
        value |= (uint64_t)p[i] << (8 * i);
    return value;
}

static void arena_push_scalar(struct wire_arena *arena, uint64_t value, size_t size) {
    arena_prep(arena, size, size);
    uint8_t *p = arena_claim(arena, size);
    if (p) put_le(p, value, size);
}

/* ---- builder ---- */

void fb_begin(struct wire_arena *arena, size_t expected) {
    arena->size = 0;
    arena->minalign = 1;
    arena->in_table = 0;
    arena->num_fields = 0;
    arena->num_vtables = 0;
    arena->error = 0;
    if (arena->owns) arena_reserve(arena, expected);
}

uint32_t fb_vector(struct wire_arena *arena, const void *elems, size_t count, size_t elem_size,
                   size_t align) {
    if (arena->in_table) {
        arena_fail(arena, strata_set_error(STRATA_EINVAL, "wire builder: vector inside a table"));
        return 0;
    }
    if (count > UINT32_MAX / (elem_size ? elem_size : 1)) {
        arena_fail(arena,
                   strata_set_error(STRATA_EINVAL,
                                    "wire builder: vector of %zu elements is too long", count));
        return 0;
    }
    size_t bytes = count * elem_size;
    arena_prep(arena, 4, bytes);
    arena_prep(arena, align < 4 ? 4 : align, bytes);
    uint8_t *p = arena_claim(arena, bytes);
    if (p && bytes) memcpy(p, elems, bytes);
    arena_push_scalar(arena, (uint32_t)count, 4);
    return arena->error ? 0 : (uint32_t)arena->size;
}

uint32_t fb_string(struct wire_arena *arena, const char *str, size_t len) {
    if (arena->in_table) {
        arena_fail(arena, strata_set_error(STRATA_EINVAL, "wire builder: string inside a table"));
        return 0;
    }
    arena_prep(arena, 4, len + 1);
    uint8_t *p = arena_claim(arena, len + 1);
    if (p) {
        if (len) memcpy(p, str, len);
        p[len] = 0;
    }
    arena_push_scalar(arena, (uint32_t)len, 4);
    return arena->error ? 0 : (uint32_t)arena->size;
}

uint32_t fb_offset_vector(struct wire_arena *arena, const uint32_t *targets, size_t count) {
    if (arena->in_table || count > UINT32_MAX / 4) {
        arena_fail(arena, strata_set_error(STRATA_EINVAL, "wire builder: bad offset vector"));
        return 0;
    }
    arena_prep(arena, 4, 4 * count);
    for (size_t i = count; i-- > 0;) { /* back to front: element 0 ends up first */
        uint8_t *p = arena_claim(arena, 4);
        if (p) put_le(p, (uint32_t)(arena->size - targets[i]), 4);
    }
    arena_push_scalar(arena, (uint32_t)count, 4);
    return arena->error ? 0 : (uint32_t)arena->size;
}

void fb_table_start(struct wire_arena *arena) {
    if (arena->in_table)
        arena_fail(arena, strata_set_error(STRATA_EINVAL, "wire builder: nested table"));
    arena->in_table = 1;
    arena->num_fields = 0;
    arena->table_start = arena->size;
}

static void record_field(struct wire_arena *arena, int id) {
    if (!arena->in_table || arena->num_fields >= MAX_FIELDS_PER_TABLE || id < 0 ||
        id >= MAX_FIELDS_PER_TABLE) {
        arena_fail(arena, strata_set_error(STRATA_EINVAL, "wire builder: bad field %d", id));
        return;
    }
    arena->fields[arena->num_fields].id = id;
    arena->fields[arena->num_fields].off = arena->size;
    arena->num_fields++;
}

static void add_scalar(struct wire_arena *arena, int id, uint64_t value, size_t size) {
    arena_push_scalar(arena, value, size);
    record_field(arena, id);
}

void fb_add_u8(struct wire_arena *arena, int id, uint8_t value, uint8_t def) {
    if (value != def) add_scalar(arena, id, value, 1);
}

void fb_add_u16(struct wire_arena *arena, int id, uint16_t value, uint16_t def) {
    if (value != def) add_scalar(arena, id, value, 2);
}

void fb_add_u32(struct wire_arena *arena, int id, uint32_t value, uint32_t def) {
    if (value != def) add_scalar(arena, id, value, 4);
}

void fb_add_u64(struct wire_arena *arena, int id, uint64_t value, uint64_t def) {
    if (value != def) add_scalar(arena, id, value, 8);
}

void fb_add_offset(struct wire_arena *arena, int id, uint32_t target) {
    if (!target) return;
    arena_prep(arena, 4, 4);
    uint8_t *p = arena_claim(arena, 4);
    if (p) put_le(p, (uint32_t)(arena->size - target), 4);
    record_field(arena, id);
}

/* Index of an identical vtable written earlier in this buffer, or -1. */
static long find_vtable(const struct wire_arena *arena, const uint8_t *vtable, size_t vtable_size) {
    const uint8_t *end = arena->buf + arena->cap;
    for (size_t i = 0; i < arena->num_vtables; ++i) {
        const uint8_t *other = end - arena->vtables[i];
        if (get_le(other, 2) == vtable_size && memcmp(other, vtable, vtable_size) == 0)
            return (long)i;
    }
    return -1;
}

uint32_t fb_table_end(struct wire_arena *arena) {
    if (!arena->in_table) {
        arena_fail(arena, strata_set_error(STRATA_EINVAL, "wire builder: no open table"));
        return 0;
    }
    arena_push_scalar(arena, 0, 4); /* soffset placeholder */
    arena->in_table = 0;
    if (arena->error) return 0;
    size_t table_pos = arena->size;
    int num_entries = 0;
    for (int i = 0; i < arena->num_fields; ++i)
        if (arena->fields[i].id + 1 > num_entries) num_entries = arena->fields[i].id + 1;
    uint8_t vtable[4 + 2 * MAX_FIELDS_PER_TABLE];
    size_t vtable_size = 4 + 2 * (size_t)num_entries;
    memset(vtable, 0, sizeof vtable);
    put_le(vtable, vtable_size, 2);
    put_le(vtable + 2, table_pos - arena->table_start, 2);
    for (int i = 0; i < arena->num_fields; ++i)
        put_le(vtable + 4 + 2 * arena->fields[i].id, table_pos - arena->fields[i].off, 2);
    if (table_pos - arena->table_start > UINT16_MAX) {
        arena_fail(arena, strata_set_error(STRATA_EINVAL, "wire builder: table too large"));
        return 0;
    }

    long shared = find_vtable(arena, vtable, vtable_size);
    size_t vtable_off;
    if (shared >= 0) {
        vtable_off = arena->vtables[shared];
    } else {
        uint8_t *p = arena_claim(arena, vtable_size);
        if (!p) return 0;
        memcpy(p, vtable, vtable_size);
        vtable_off = arena->size;
        if (arena->num_vtables == arena->vtables_cap) {
            size_t cap = arena->vtables_cap ? arena->vtables_cap * 2 : 16;
            uint32_t *grown = realloc(arena->vtables, cap * sizeof *grown);
            if (!grown) {
                arena_fail(arena, strata_set_error(STRATA_ENOMEM, "wire builder: out of memory"));
                return 0;
            }
            arena->vtables = grown;
            arena->vtables_cap = cap;
        }
        arena->vtables[arena->num_vtables++] = (uint32_t)vtable_off;
    }
    /* soffset = table address - vtable address; addresses are end - offset. */
    int64_t soffset = (int64_t)vtable_off - (int64_t)table_pos;
    put_le(arena->buf + arena->cap - table_pos, (uint32_t)(int32_t)soffset, 4);
    return (uint32_t)table_pos;
}

void fb_finish(struct wire_arena *arena, uint32_t root, const char *identifier) {
    size_t ident_len = identifier ? 4 : 0;
    arena_prep(arena, arena->minalign > 4 ? arena->minalign : 4, 4 + ident_len);
    if (identifier) {
        uint8_t *p = arena_claim(arena, 4);
        if (p) memcpy(p, identifier, 4);
    }
    arena_prep(arena, 4, 4);
    uint8_t *p = arena_claim(arena, 4);
    if (p) put_le(p, (uint32_t)(arena->size - root), 4);
}

/* ---- verifier ---- */

struct verifier {
    const uint8_t *buf;
    uint64_t len;
    uint64_t tables;
};

static int verify_table(struct verifier *v, struct fb_table *out, uint64_t pos,
                        const struct fb_table_desc *desc, int depth);

static int bad(const struct fb_table_desc *desc, int id, uint64_t pos, const char *what) {
    return strata_set_error(STRATA_EFORMAT, "wire: malformed frame: %s%s%d at byte %llu: %s",
                            desc ? desc->name : "buffer", desc ? " field " : " ", id,
                            (unsigned long long)pos, what);
}

/* A uoffset at `pos`: in bounds, aligned, non-zero, forward, target inside. */
static int verify_offset(const struct verifier *v, uint64_t pos, uint64_t *target) {
    if (pos % 4 != 0 || pos + 4 > v->len) return -1;
    uint64_t value = get_le(v->buf + pos, 4);
    if (value == 0 || value > INT32_MAX || pos + value >= v->len) return -1;
    *target = pos + value;
    return 0;
}

static int verify_vector(const struct verifier *v, uint64_t pos, size_t elem_size, size_t align,
                         int is_string) {
    if (pos % 4 != 0 || pos + 4 > v->len) return -1;
    uint64_t count = get_le(v->buf + pos, 4);
    uint64_t room = v->len - pos - 4;
    if (is_string) {
        if (room == 0 || count > room - 1 || v->buf[pos + 4 + count] != 0) return -1;
        return 0;
    }
    if (elem_size && count > room / elem_size) return -1;
    if (align > 1 && (pos + 4) % align != 0 && count > 0) return -1;
    return 0;
}

static int verify_field(struct verifier *v, const struct fb_table *t,
                        const struct fb_table_desc *desc, int id, int depth) {
    const struct fb_field_desc *f = &desc->fields[id];
    uint64_t entry = fb_has_field(t, id) ? get_le(t->buf + t->vtable + 4 + 2 * id, 2) : 0;
    if (f->kind == FB_ABSENT || entry == 0) return 0;
    uint64_t pos = t->pos + entry;
    uint64_t size = (f->kind == FB_SCALAR) ? f->size : (f->kind == FB_UNION_TYPE) ? 1 : 4;
    if (entry + size > t->table_size) return bad(desc, id, pos, "field outside its table");
    if (pos % size != 0) return bad(desc, id, pos, "misaligned field");
    if (f->kind == FB_SCALAR || f->kind == FB_UNION_TYPE) return 0;
    uint64_t target;
    if (verify_offset(v, pos, &target)) return bad(desc, id, pos, "offset out of bounds");
    struct fb_table child;
    switch (f->kind) {
    case FB_STRING:
        if (verify_vector(v, target, 1, 1, 1)) return bad(desc, id, target, "bad string");
        return 0;
    case FB_VECTOR:
        if (verify_vector(v, target, f->size, f->align, 0))
            return bad(desc, id, target, "bad vector");
        return 0;
    case FB_TABLE: return verify_table(v, &child, target, f->table, depth + 1);
    case FB_TABLE_VECTOR: {
        if (verify_vector(v, target, 4, 4, 0)) return bad(desc, id, target, "bad vector");
        uint64_t count = get_le(v->buf + target, 4), elem;
        for (uint64_t i = 0; i < count; ++i) {
            if (verify_offset(v, target + 4 + 4 * i, &elem))
                return bad(desc, id, target + 4 + 4 * i, "vector element out of bounds");
            int rc = verify_table(v, &child, elem, f->table, depth + 1);
            if (rc) return rc;
        }
        return 0;
    }
    case FB_UNION: {
        uint64_t type = id > 0 ? fb_get_scalar(t, id - 1, 1, 0) : 0;
        if (type == 0 || type >= (uint64_t)f->num_members || !f->members[type])
            return 0; /* NONE or a member of a newer minor: left to the reader */
        return verify_table(v, &child, target, f->members[type], depth + 1);
    }
    default: return 0;
    }
}

static int verify_table(struct verifier *v, struct fb_table *out, uint64_t pos,
                        const struct fb_table_desc *desc, int depth) {
    if (depth > WIRE_MAX_DEPTH) return bad(desc, -1, pos, "nesting too deep");
    if (++v->tables > WIRE_MAX_TABLES) return bad(desc, -1, pos, "too many tables");
    if (pos % 4 != 0 || pos + 4 > v->len) return bad(desc, -1, pos, "table out of bounds");
    int64_t soffset = (int32_t)(uint32_t)get_le(v->buf + pos, 4);
    int64_t vtable = (int64_t)pos - soffset;
    if (vtable < 0 || vtable % 2 != 0 || (uint64_t)vtable + 4 > v->len)
        return bad(desc, -1, pos, "vtable out of bounds");
    uint64_t vtable_size = get_le(v->buf + vtable, 2);
    uint64_t table_size = get_le(v->buf + vtable + 2, 2);
    if (vtable_size < 4 || vtable_size % 2 != 0 || (uint64_t)vtable + vtable_size > v->len)
        return bad(desc, -1, pos, "bad vtable size");
    if (table_size < 4 || pos + table_size > v->len) return bad(desc, -1, pos, "bad table size");
    out->buf = v->buf;
    out->pos = (size_t)pos;
    out->vtable = (size_t)vtable;
    out->vtable_size = (uint16_t)vtable_size;
    out->table_size = (uint16_t)table_size;
    for (int id = 0; id < desc->num_fields; ++id) {
        int rc = verify_field(v, out, desc, id, depth);
        if (rc) return rc;
    }
    return 0;
}

int fb_verify_buffer(struct fb_table *root_out, const uint8_t *buf, size_t len,
                     const char *identifier, const struct fb_table_desc *root) {
    struct verifier v = {buf, len, 0};
    if (!buf) return strata_set_error(STRATA_EINVAL, "wire: NULL frame");
    if (len < (identifier ? 8u : 4u)) return bad(NULL, 0, len, "frame shorter than its header");
    if (len >= ((uint64_t)1 << 31)) return bad(NULL, 0, len, "frame of 2 GiB or more");
    if (identifier && memcmp(buf + 4, identifier, 4) != 0)
        return strata_set_error(STRATA_EFORMAT,
                                "wire: not a Strata frame (file identifier %02x%02x%02x%02x, "
                                "expected \"%.4s\")",
                                buf[4], buf[5], buf[6], buf[7], identifier);
    uint64_t root_pos;
    if (verify_offset(&v, 0, &root_pos)) return bad(NULL, 0, 0, "root offset out of bounds");
    return verify_table(&v, root_out, root_pos, root, 1);
}

/* ---- accessors (verified tables only) ---- */

int fb_has_field(const struct fb_table *t, int id) {
    if (4 + 2 * (size_t)id >= t->vtable_size) return 0;
    return get_le(t->buf + t->vtable + 4 + 2 * id, 2) != 0;
}

uint64_t fb_get_scalar(const struct fb_table *t, int id, size_t size, uint64_t def) {
    if (!fb_has_field(t, id)) return def;
    return get_le(t->buf + t->pos + get_le(t->buf + t->vtable + 4 + 2 * id, 2), size);
}

size_t fb_get_ref(const struct fb_table *t, int id) {
    if (!fb_has_field(t, id)) return 0;
    size_t pos = t->pos + get_le(t->buf + t->vtable + 4 + 2 * id, 2);
    return pos + get_le(t->buf + pos, 4);
}

void fb_table_at(struct fb_table *out, const uint8_t *buf, size_t pos) {
    int64_t soffset = (int32_t)(uint32_t)get_le(buf + pos, 4);
    out->buf = buf;
    out->pos = pos;
    out->vtable = (size_t)((int64_t)pos - soffset);
    out->vtable_size = (uint16_t)get_le(buf + out->vtable, 2);
    out->table_size = (uint16_t)get_le(buf + out->vtable + 2, 2);
}

void fb_get_vector_table(struct fb_table *out, const struct fb_table *t, int id, size_t i) {
    size_t elem = fb_get_ref(t, id) + 4 + 4 * i;
    fb_table_at(out, t->buf, elem + (size_t)get_le(t->buf + elem, 4));
}

int fb_get_table(struct fb_table *out, const struct fb_table *t, int id) {
    size_t pos = fb_get_ref(t, id);
    if (!pos) return 0;
    fb_table_at(out, t->buf, pos);
    return 1;
}

const uint8_t *fb_get_vector(const struct fb_table *t, int id, size_t *count) {
    size_t pos = fb_get_ref(t, id);
    *count = pos ? (size_t)get_le(t->buf + pos, 4) : 0;
    return pos ? t->buf + pos + 4 : NULL;
}
