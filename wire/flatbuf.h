/* Internal: the schema-independent half of our FlatBuffers implementation.
 *
 * Builder: back-to-front writing into a wire_arena, following the binary format spec
 * (shared spec flatbuffers-binary.md §9): objects are named by their offset from the end
 * of the buffer, children are finished before their parent table, equal vtables are
 * shared. Failures are sticky in arena->error so a message builder can issue a whole
 * sequence of calls and check once at the end.
 *
 * Verifier: bounds, alignment and limit checks of §10 on a received buffer, driven by
 * small per-table descriptors (which field ids hold which kind of value). All position
 * arithmetic is in uint64_t and no pointer is formed outside the buffer. Once a buffer
 * has verified, the fb_get_* accessors read it without further checks.
 *
 * Hosts must be little-endian (checked at compile time): tensor payloads are handed out
 * zero copy, which only makes sense when wire order equals host order. */
#ifndef STRATA_WIRE_FLATBUF_H
#define STRATA_WIRE_FLATBUF_H

#include <stddef.h>
#include <stdint.h>

#include "wire/message.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "Strata's wire codec requires a little-endian host"
#endif

/* ---- builder ---- */

/* Starts a new buffer in `arena`, reserving `expected` bytes up front so a large payload
 * is copied once and never moved by growth. */
void fb_begin(struct wire_arena *arena, size_t expected);
/* Offset-from-end of a vector of `count` elements of `elem_size` bytes copied from
 * `elems` (already little-endian), its first element aligned to `align` (>= 4). */
uint32_t fb_vector(struct wire_arena *arena, const void *elems, size_t count, size_t elem_size,
                   size_t align);
/* A string of `len` bytes (a NUL is appended). */
uint32_t fb_string(struct wire_arena *arena, const char *str, size_t len);
/* A vector of `count` tables (or strings) finished earlier, `targets` their offsets-from-end:
 * each element is a uoffset from itself to its object (spec flatbuffers-binary.md §4). */
uint32_t fb_offset_vector(struct wire_arena *arena, const uint32_t *targets, size_t count);

void fb_table_start(struct wire_arena *arena);
/* Scalars are skipped when equal to the schema default, as flatc does. */
void fb_add_u8(struct wire_arena *arena, int id, uint8_t value, uint8_t def);
void fb_add_u16(struct wire_arena *arena, int id, uint16_t value, uint16_t def);
void fb_add_u32(struct wire_arena *arena, int id, uint32_t value, uint32_t def);
void fb_add_u64(struct wire_arena *arena, int id, uint64_t value, uint64_t def);
/* A uoffset field to an object finished earlier; offset 0 means absent and is skipped. */
void fb_add_offset(struct wire_arena *arena, int id, uint32_t target);
uint32_t fb_table_end(struct wire_arena *arena);
/* Writes identifier + root offset; the frame is then the last arena->size bytes. */
void fb_finish(struct wire_arena *arena, uint32_t root, const char *identifier);

/* ---- verifier ---- */

enum fb_field_kind {
    FB_ABSENT = 0, /* id not in this schema version (deprecated or unused) */
    FB_SCALAR,     /* size = 1, 2, 4, 8 */
    FB_STRING,
    FB_VECTOR,       /* size = element size, align = element alignment */
    FB_TABLE,        /* table = descriptor of the target */
    FB_TABLE_VECTOR, /* a vector of tables, each described by `table` */
    FB_UNION_TYPE,   /* u8; the next id holds the value */
    FB_UNION         /* members = descriptors indexed by type, num_members of them */
};

struct fb_table_desc;

struct fb_field_desc {
    enum fb_field_kind kind;
    uint8_t size;
    uint8_t align;
    const struct fb_table_desc *table;
    const struct fb_table_desc *const *members;
    int num_members;
};

struct fb_table_desc {
    const char *name;
    int num_fields;
    const struct fb_field_desc *fields; /* [num_fields], index = field id */
};

/* A verified table: its position and its vtable. */
struct fb_table {
    const uint8_t *buf;
    size_t pos;
    size_t vtable;
    uint16_t vtable_size;
    uint16_t table_size;
};

/* Verifies a whole buffer [len] whose root is described by `root` (identifier checked
 * when not NULL) and returns the root table. STRATA_EFORMAT with a message naming the
 * table, field and byte position at fault. */
int fb_verify_buffer(struct fb_table *root_out, const uint8_t *buf, size_t len,
                     const char *identifier, const struct fb_table_desc *root);

/* Accessors on verified tables. */
uint64_t fb_get_scalar(const struct fb_table *t, int id, size_t size, uint64_t def);
int fb_has_field(const struct fb_table *t, int id);
/* Position of the object an offset field points at, or 0 when absent. */
size_t fb_get_ref(const struct fb_table *t, int id);
int fb_get_table(struct fb_table *out, const struct fb_table *t, int id);
/* A vector field: count and pointer to its first element (NULL/0 when absent). */
const uint8_t *fb_get_vector(const struct fb_table *t, int id, size_t *count);
/* The verified table at byte `pos` of `buf` (to re-open a table found earlier). */
void fb_table_at(struct fb_table *out, const uint8_t *buf, size_t pos);
/* Element i of a verified vector of tables (field `id`, i < its count). */
void fb_get_vector_table(struct fb_table *out, const struct fb_table *t, int id, size_t i);

#endif
