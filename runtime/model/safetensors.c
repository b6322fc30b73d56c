/* mmap-backed safetensors reader with a fully bounds-checked header parser.
 *
 * File layout: an 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the data section; offsets are relative to the data section. Every claim in the
 * header is checked against the real file size before any pointer into the mapping is
 * formed (header fits, offsets inside data, end - begin == numel × dtype size, no overlap
 * between non-empty tensors, no duplicate names), so a corrupt or hostile file yields an
 * error message, never an out-of-bounds read. Tensors of all files live in one table
 * sorted by name (binary search); sharded checkpoints are opened through their index and
 * each shard file is mapped once. */
#include "runtime/model/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/base/dtype.h"
#include "runtime/base/status.h"

#define MAX_HEADER_BYTES (100u << 20)    /* same limit as the reference Python implementation */
#define MAX_EXACT_INT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact doubles */

struct st_entry {
    struct st_tensor tensor; /* first member: &entry->tensor is what callers see */
    int file;                /* index into safetensors.files */
    uint64_t begin, end;     /* data_offsets, relative to the file's data section */
};

struct st_file {
    char *path;
    uint8_t *map;
    size_t len;
};

struct safetensors {
    struct st_file *files;
    int num_files;
    struct st_entry *entries; /* sorted by name after loading */
    int count;
    int cap;
};

static const char *const dtype_names[] = {"BF16", "F16", "F32", "I64", "I32", "U8"};
static const size_t dtype_sizes[] = {2, 2, 4, 8, 4, 1};

size_t st_dtype_size(enum st_dtype dtype) {
    if ((unsigned)dtype >= sizeof dtype_sizes / sizeof dtype_sizes[0]) return 0;
    return dtype_sizes[dtype];
}

const char *st_dtype_name(enum st_dtype dtype) {
    if ((unsigned)dtype >= sizeof dtype_names / sizeof dtype_names[0]) return "?";
    return dtype_names[dtype];
}

static int dtype_from_name(enum st_dtype *out, const char *name) {
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; ++i) {
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (enum st_dtype)i;
            return 0;
        }
    }
    return -1;
}

static void free_entries(struct st_entry *entries, int count) {
    for (int i = 0; i < count; ++i)
        free((char *)entries[i].tensor.name);
    free(entries);
}

/* Reads a JSON number that must be a non-negative integer below 2^53. */
static int json_u64(uint64_t *out, const cJSON *item) {
    if (!cJSON_IsNumber(item)) return -1;
    double v = item->valuedouble;
    if (!(v >= 0.0) || v >= MAX_EXACT_INT || v != floor(v)) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int grow(struct safetensors *st) {
    if (st->count < st->cap) return 0;
    int cap = st->cap ? st->cap * 2 : 64;
    struct st_entry *e = realloc(st->entries, (size_t)cap * sizeof *e);
    if (!e) return -1;
    st->entries = e;
    st->cap = cap;
    return 0;
}

/* Parses one header entry into a new table entry (file index `file`, data at `data`). */
static int parse_entry(struct safetensors *st, const cJSON *item, const uint8_t *data,
                       uint64_t data_len, int file, const char *source) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return strata_set_error(STRATA_EFORMAT, "%s: tensor \"%s\": entry is not an object", source,
                                name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets))
        return strata_set_error(STRATA_EFORMAT,
                                "%s: tensor \"%s\": needs string \"dtype\", list \"shape\" and "
                                "list \"data_offsets\"",
                                source, name);
    struct st_tensor t = {0};
    if (dtype_from_name(&t.dtype, dtype->valuestring) != 0)
        return strata_set_error(STRATA_EFORMAT,
                                "%s: tensor \"%s\": unsupported dtype \"%.32s\" (supported: BF16, "
                                "F16, F32, I64, I32, U8)",
                                source, name, dtype->valuestring);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > SAFETENSORS_MAX_DIMS)
        return strata_set_error(STRATA_EFORMAT, "%s: tensor \"%s\": %d dims, at most %d supported",
                                source, name, ndim, SAFETENSORS_MAX_DIMS);
    uint64_t numel = 1;
    const cJSON *dim;
    t.ndim = 0;
    cJSON_ArrayForEach(dim, shape) {
        uint64_t d;
        if (json_u64(&d, dim) != 0)
            return strata_set_error(
                STRATA_EFORMAT, "%s: tensor \"%s\": shape entries must be non-negative integers",
                source, name);
        if (__builtin_mul_overflow(numel, d, &numel) || numel >= (uint64_t)MAX_EXACT_INT)
            return strata_set_error(STRATA_EFORMAT, "%s: tensor \"%s\": element count overflows",
                                    source, name);
        t.shape[t.ndim++] = (int64_t)d;
    }
    uint64_t begin, end;
    if (cJSON_GetArraySize(offsets) != 2 || json_u64(&begin, cJSON_GetArrayItem(offsets, 0)) != 0 ||
        json_u64(&end, cJSON_GetArrayItem(offsets, 1)) != 0)
        return strata_set_error(STRATA_EFORMAT,
                                "%s: tensor \"%s\": data_offsets must be two non-negative integers",
                                source, name);
    if (begin > end || end > data_len)
        return strata_set_error(STRATA_EFORMAT,
                                "%s: tensor \"%s\": data_offsets [%llu, %llu] outside the data "
                                "section of %llu bytes",
                                source, name, (unsigned long long)begin, (unsigned long long)end,
                                (unsigned long long)data_len);
    uint64_t want = numel * st_dtype_size(t.dtype); /* numel < 2^53, size <= 8: no overflow */
    if (end - begin != want)
        return strata_set_error(STRATA_EFORMAT,
                                "%s: tensor \"%s\": data_offsets span %llu bytes but %s shape "
                                "needs %llu",
                                source, name, (unsigned long long)(end - begin),
                                dtype_names[t.dtype], (unsigned long long)want);
    if (grow(st) != 0) return strata_set_error(STRATA_ENOMEM, "%s: out of memory", source);
    t.name = strdup(name);
    if (!t.name) return strata_set_error(STRATA_ENOMEM, "%s: out of memory", source);
    t.numel = (int64_t)numel;
    t.data = data + begin;
    t.nbytes = (size_t)want;
    struct st_entry *e = &st->entries[st->count++];
    e->tensor = t;
    e->file = file;
    e->begin = begin;
    e->end = end;
    return STRATA_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
    const struct st_entry *x = *(const struct st_entry *const *)a;
    const struct st_entry *y = *(const struct st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : (x->end > y->end);
}

/* Checks that no two non-empty tensors of file `file` (entries from `first` on) share bytes. */
static int check_overlap(const struct safetensors *st, int first, const char *source) {
    int n = st->count - first;
    if (n < 2) return STRATA_OK;
    const struct st_entry **order = malloc((size_t)n * sizeof *order);
    if (!order) return strata_set_error(STRATA_ENOMEM, "%s: out of memory", source);
    int m = 0;
    for (int i = first; i < st->count; ++i)
        if (st->entries[i].end > st->entries[i].begin) order[m++] = &st->entries[i];
    qsort(order, (size_t)m, sizeof *order, cmp_by_offset);
    int rc = STRATA_OK;
    for (int i = 1; i < m; ++i) {
        if (order[i]->begin < order[i - 1]->end) {
            rc = strata_set_error(
                STRATA_EFORMAT, "%s: tensors \"%s\" [%llu, %llu] and \"%s\" [%llu, %llu] overlap",
                source, order[i - 1]->tensor.name, (unsigned long long)order[i - 1]->begin,
                (unsigned long long)order[i - 1]->end, order[i]->tensor.name,
                (unsigned long long)order[i]->begin, (unsigned long long)order[i]->end);
            break;
        }
    }
    free(order);
    return rc;
}

/* Parses and validates one whole file image, appending its tensors to st (file index
 * `file`). On failure the entries appended so far stay in st; callers discard st. */
static int parse_file(struct safetensors *st, const uint8_t *file, size_t len, int file_index,
                      const char *source) {
    if (len < 8)
        return strata_set_error(
            STRATA_EFORMAT, "%s: %zu bytes is too short for the 8-byte header length", source, len);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i)
        header_len = header_len << 8 | file[i];
    if (header_len > len - 8)
        return strata_set_error(STRATA_EFORMAT,
                                "%s: header length %llu exceeds the %zu bytes after the length "
                                "field (truncated or not a safetensors file)",
                                source, (unsigned long long)header_len, len - 8);
    if (header_len < 2 || header_len > MAX_HEADER_BYTES)
        return strata_set_error(STRATA_EFORMAT, "%s: implausible header length %llu", source,
                                (unsigned long long)header_len);
    const char *header = (const char *)file + 8;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(header, (size_t)header_len, &end, 0);
    if (!root) {
        /* `end` is the error position (cJSON_GetErrorPtr is a process-wide global). */
        long pos = end && end >= header && end <= header + header_len ? (long)(end - header) : -1;
        return strata_set_error(STRATA_EFORMAT,
                                "%s: header is not well-formed JSON (error near header byte %ld)",
                                source, pos);
    }
    int rc = STRATA_OK;
    for (const char *p = end; p && p < header + header_len; ++p) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            rc = strata_set_error(STRATA_EFORMAT, "%s: trailing bytes after the JSON header",
                                  source);
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = strata_set_error(STRATA_EFORMAT, "%s: header is not a JSON object", source);
        goto done;
    }
    const uint8_t *data = file + 8 + header_len;
    uint64_t data_len = (uint64_t)len - 8 - header_len;
    int first = st->count;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(item)) {
                rc = strata_set_error(STRATA_EFORMAT, "%s: \"__metadata__\" is not an object",
                                      source);
                goto done;
            }
            continue;
        }
        if ((rc = parse_entry(st, item, data, data_len, file_index, source))) goto done;
    }
    rc = check_overlap(st, first, source);
done:
    cJSON_Delete(root);
    return rc;
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const struct st_entry *)a)->tensor.name,
                  ((const struct st_entry *)b)->tensor.name);
}

/* Sorts the table by name and rejects duplicate names (within or across files). */
static int sort_and_check_unique(struct safetensors *st, const char *source) {
    if (st->count > 1) qsort(st->entries, (size_t)st->count, sizeof *st->entries, cmp_by_name);
    for (int i = 1; i < st->count; ++i) {
        if (strcmp(st->entries[i].tensor.name, st->entries[i - 1].tensor.name) == 0)
            return strata_set_error(STRATA_EFORMAT, "%s: tensor \"%s\" is defined twice", source,
                                    st->entries[i].tensor.name);
    }
    return STRATA_OK;
}

int safetensors_validate(const uint8_t *file, size_t len, const char *source_name) {
    const char *source = source_name ? source_name : "safetensors";
    if (!file && len) return strata_set_error(STRATA_EINVAL, "%s: null buffer", source);
    struct safetensors tmp = {0};
    int rc = parse_file(&tmp, file, len, 0, source);
    if (rc == STRATA_OK) rc = sort_and_check_unique(&tmp, source);
    free_entries(tmp.entries, tmp.count);
    return rc;
}

/* Maps `path` read-only as file number st->num_files and parses its header. */
static int map_file(struct safetensors *st, const char *path) {
    struct st_file *files = realloc(st->files, (size_t)(st->num_files + 1) * sizeof *files);
    if (!files) return strata_set_error(STRATA_ENOMEM, "%s: out of memory", path);
    st->files = files;
    struct st_file *f = &st->files[st->num_files];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return strata_set_error(STRATA_ENOMEM, "%s: out of memory", path);
    st->num_files++;
    /* O_NONBLOCK: a FIFO in place of the file would otherwise block the open until a
     * writer appears; fstat below refuses it. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return strata_set_error(STRATA_ENOTFOUND, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return strata_set_error(STRATA_EIO, "%s: not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return strata_set_error(STRATA_EFORMAT,
                                "%s: %lld bytes is too short for the 8-byte header length", path,
                                (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return strata_set_error(STRATA_EIO, "%s: mmap: %s", path, strerror(errno));
    f->map = map;
    f->len = (size_t)sb.st_size;
    return parse_file(st, f->map, f->len, st->num_files - 1, path);
}

static int read_small_file(char **out, size_t *len, const char *path) {
    *out = NULL;
    /* Opened as in map_file (a FIFO must not block), then read through stdio. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return strata_set_error(STRATA_ENOTFOUND, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return strata_set_error(STRATA_EIO, "%s: not a regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return strata_set_error(STRATA_EIO, "%s: %s", path, strerror(errno));
    }
    int rc = STRATA_OK;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || n > (256L << 20)) {
        rc = strata_set_error(STRATA_EIO, "%s: unreadable or larger than 256 MiB", path);
        goto done;
    }
    rewind(f);
    *out = malloc((size_t)n + 1);
    if (!*out) {
        rc = strata_set_error(STRATA_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    if (fread(*out, 1, (size_t)n, f) != (size_t)n) {
        free(*out);
        *out = NULL;
        rc = strata_set_error(STRATA_EIO, "%s: short read", path);
        goto done;
    }
    (*out)[n] = '\0';
    *len = (size_t)n;
done:
    fclose(f);
    return rc;
}

static const struct st_entry *find_entry(const struct safetensors *st, const char *name) {
    if (!st || !name || st->count == 0) return NULL;
    struct st_entry key;
    key.tensor.name = name;
    return bsearch(&key, st->entries, (size_t)st->count, sizeof *st->entries, cmp_by_name);
}

/* Opens every shard named in the index's weight_map once, then checks that each listed
 * tensor really is in the shard the index names. */
static int open_sharded(struct safetensors *st, const char *index_path, const char *dir) {
    char *json = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    char path[4096];
    int rc = read_small_file(&json, &len, index_path);
    if (rc) return rc;
    root = cJSON_ParseWithLengthOpts(json, len, NULL, 0);
    if (!root || !cJSON_IsObject(root)) {
        rc = strata_set_error(STRATA_EFORMAT, "%s: not a well-formed JSON object", index_path);
        goto done;
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        rc = strata_set_error(STRATA_EFORMAT, "%s: missing object \"weight_map\"", index_path);
        goto done;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, map) {
        if (!cJSON_IsString(item) || item->valuestring[0] == '\0' ||
            strchr(item->valuestring, '/') || strcmp(item->valuestring, "..") == 0) {
            rc = strata_set_error(STRATA_EFORMAT,
                                  "%s: weight_map entry \"%s\" must name a shard file in the same "
                                  "directory",
                                  index_path, item->string);
            goto done;
        }
        int seen = 0;
        for (int i = 0; i < st->num_files && !seen; ++i) {
            const char *base = strrchr(st->files[i].path, '/');
            seen = strcmp(base ? base + 1 : st->files[i].path, item->valuestring) == 0;
        }
        if (seen) continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, item->valuestring) >= sizeof path) {
            rc = strata_set_error(STRATA_EINVAL, "%s: shard path too long", index_path);
            goto done;
        }
        if ((rc = map_file(st, path))) goto done;
    }
    if (st->num_files == 0) {
        rc = strata_set_error(STRATA_EFORMAT, "%s: weight_map is empty", index_path);
        goto done;
    }
    if ((rc = sort_and_check_unique(st, index_path))) goto done;
    int missing = 0;
    char first_missing[256] = "";
    cJSON_ArrayForEach(item, map) {
        const struct st_entry *e = find_entry(st, item->string);
        const char *base = e ? strrchr(st->files[e->file].path, '/') + 1 : NULL;
        if (!e || strcmp(base, item->valuestring) != 0) {
            if (missing++ == 0)
                snprintf(first_missing, sizeof first_missing, "%s (in %s)", item->string,
                         item->valuestring);
        }
    }
    if (missing)
        rc = strata_set_error(STRATA_ENOTFOUND,
                              "%s: %d tensor(s) listed in weight_map are not in the named shard, "
                              "first: %s",
                              index_path, missing, first_missing);
done:
    cJSON_Delete(root);
    free(json);
    return rc;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int safetensors_open(struct safetensors **out, const char *path) {
    char buf[4096];
    struct stat sb;
    int rc;
    if (!out) return strata_set_error(STRATA_EINVAL, "safetensors_open: null output");
    *out = NULL;
    if (!path) return strata_set_error(STRATA_EINVAL, "safetensors_open: null path");
    struct safetensors *st = calloc(1, sizeof *st);
    if (!st) return strata_set_error(STRATA_ENOMEM, "%s: out of memory", path);
    if (stat(path, &sb) != 0) {
        rc = strata_set_error(STRATA_ENOTFOUND, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(sb.st_mode)) {
        if ((size_t)snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path) >=
            sizeof buf) {
            rc = strata_set_error(STRATA_EINVAL, "%s: path too long", path);
            goto fail;
        }
        if (access(buf, F_OK) == 0) {
            rc = open_sharded(st, buf, path);
        } else {
            snprintf(buf, sizeof buf, "%s/model.safetensors", path);
            if (access(buf, F_OK) != 0) {
                rc = strata_set_error(STRATA_ENOTFOUND,
                                      "%s: no model.safetensors or model.safetensors.index.json",
                                      path);
                goto fail;
            }
            rc = map_file(st, buf);
            if (rc == STRATA_OK) rc = sort_and_check_unique(st, buf);
        }
    } else if (ends_with(path, ".index.json")) {
        snprintf(buf, sizeof buf, "%s", path);
        char *slash = strrchr(buf, '/');
        if (slash) {
            *slash = '\0';
        } else {
            snprintf(buf, sizeof buf, ".");
        }
        rc = open_sharded(st, path, buf);
    } else {
        rc = map_file(st, path);
        if (rc == STRATA_OK) rc = sort_and_check_unique(st, path);
    }
    if (rc) goto fail;
    *out = st;
    return STRATA_OK;
fail:
    safetensors_close(st);
    return rc;
}

void safetensors_close(struct safetensors *st) {
    if (!st) return;
    free_entries(st->entries, st->count);
    for (int i = 0; i < st->num_files; ++i) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].len);
        free(st->files[i].path);
    }
    free(st->files);
    free(st);
}

const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name) {
    const struct st_entry *e = find_entry(st, name);
    return e ? &e->tensor : NULL;
}

int safetensors_count(const struct safetensors *st) {
    return st ? st->count : 0;
}

const struct st_tensor *safetensors_at(const struct safetensors *st, int index) {
    if (!st || index < 0 || index >= st->count) return NULL;
    return &st->entries[index].tensor;
}

int st_tensor_to_f32(float *out, const struct st_tensor *t) {
    if (!out || !t) return strata_set_error(STRATA_EINVAL, "st_tensor_to_f32: null argument");
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32: memcpy(out, p, (size_t)t->numel * sizeof(float)); return STRATA_OK;
    case ST_BF16:
        for (int64_t i = 0; i < t->numel; ++i) {
            uint32_t bits = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(&out[i], &bits, sizeof bits);
        }
        return STRATA_OK;
    case ST_F16:
        for (int64_t i = 0; i < t->numel; ++i)
            out[i] = f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return STRATA_OK;
    default:
        return strata_set_error(STRATA_EINVAL, "tensor \"%s\": cannot widen %s to F32", t->name,
                                st_dtype_name(t->dtype));
    }
}
