/* The compiled hot path of TFRecord writing: CRC32C, record framing, a certifying check of
 * serialized tf.train.Example / SequenceExample messages, and finding line ends.
 *
 * crc32c       CRC32C continued from a previous value, as the crc32c package computes it. On
 *              x86-64 with SSE4.2 the crc32 instruction (three interleaved streams for large
 *              buffers); elsewhere a portable slicing-by-8 table.
 * frame_many   Records framed back to back, byte for byte what tfrecordd.framing produces.
 * check_messages
 *              Which payloads this walk of the wire format cannot certify as an Example (or
 *              SequenceExample) that protobuf parses with no unknown field at any depth. The
 *              check is one-sided: a certified payload is valid, a flagged one may be valid too
 *              (the caller hands it to protobuf, which decides).
 * line_end     Where a batch of whole lines ends: memchr from newline to newline.
 *
 * The GIL is released around the copying and checking of large batches; the pointers are taken
 * first, from objects this code holds references to (bytes are immutable; other buffers are held
 * through Py_buffer views, which keep them from being resized).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CFRAME_X86_64 1
#include <nmmintrin.h>
#endif

/* Batches and buffers at least this large are worked on with the GIL released. */
#define RELEASE_GIL_BYTES (64 * 1024)

/* ---------------------------------------------------------------------------------------------
 * CRC32C (Castagnoli): reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF.
 * crc32c_update(value, p, n) continues a finished CRC `value` over n more bytes, the convention
 * of the crc32c package: crc32c_update(crc32c_update(0, a), b) == CRC32C(a + b).
 */

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_table[8][256]; /* slicing-by-8 */

static void crc_tables_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

static inline uint32_t load_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint32_t crc32c_portable(uint32_t value, const uint8_t *p, size_t n) {
    uint32_t c = ~value;
    while (n >= 8) {
        uint32_t lo = c ^ load_le32(p);
        uint32_t hi = load_le32(p + 4);
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^
            crc_table[2][(hi >> 8) & 0xFF] ^ crc_table[1][(hi >> 16) & 0xFF] ^
            crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

#ifdef CFRAME_X86_64
/* Three streams of LONG (then SHORT) bytes each are run side by side, since the crc32
 * instruction has a latency of three cycles and a throughput of one; their CRCs are then combined
 * by "shifting" a CRC over LONG (SHORT) zero bytes, a linear map applied with four tables. */
#define CRC_LONG 8192
#define CRC_SHORT 256

static uint32_t crc_long_shift[4][256];
static uint32_t crc_short_shift[4][256];

static uint32_t gf2_matrix_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_matrix_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_matrix_times(mat, mat[n]);
}

/* The operator that runs a CRC register over `len` zero bytes (`len` a power of two). */
static void crc_zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32];
    odd[0] = CRC32C_POLY; /* one zero bit */
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    gf2_matrix_square(even, odd); /* two zero bits */
    gf2_matrix_square(odd, even); /* four */
    for (;;) {
        gf2_matrix_square(even, odd); /* one zero byte, then four, ... */
        len >>= 1;
        if (len == 0) return;
        gf2_matrix_square(odd, even); /* two zero bytes, then eight, ... */
        len >>= 1;
        if (len == 0) {
            memcpy(even, odd, sizeof odd);
            return;
        }
    }
}

static void crc_shift_init(uint32_t table[4][256], size_t len) {
    uint32_t op[32];
    crc_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        table[0][n] = gf2_matrix_times(op, n);
        table[1][n] = gf2_matrix_times(op, n << 8);
        table[2][n] = gf2_matrix_times(op, n << 16);
        table[3][n] = gf2_matrix_times(op, n << 24);
    }
}

static inline uint32_t crc_shift(uint32_t table[4][256], uint32_t c) {
    return table[0][c & 0xFF] ^ table[1][(c >> 8) & 0xFF] ^ table[2][(c >> 16) & 0xFF] ^
           table[3][c >> 24];
}

static inline uint64_t load_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t value, const uint8_t *p,
                                                                size_t n) {
    uint64_t c0 = (uint32_t)~value;
    if (n >= 3 * CRC_SHORT) {
        while (n >= 3 * CRC_LONG) {
            uint64_t c1 = 0, c2 = 0;
            const uint8_t *end = p + CRC_LONG;
            do {
                c0 = _mm_crc32_u64(c0, load_u64(p));
                c1 = _mm_crc32_u64(c1, load_u64(p + CRC_LONG));
                c2 = _mm_crc32_u64(c2, load_u64(p + 2 * CRC_LONG));
                p += 8;
            } while (p < end);
            c0 = crc_shift(crc_long_shift, (uint32_t)c0) ^ c1;
            c0 = crc_shift(crc_long_shift, (uint32_t)c0) ^ c2;
            p += 2 * CRC_LONG;
            n -= 3 * CRC_LONG;
        }
        while (n >= 3 * CRC_SHORT) {
            uint64_t c1 = 0, c2 = 0;
            const uint8_t *end = p + CRC_SHORT;
            do {
                c0 = _mm_crc32_u64(c0, load_u64(p));
                c1 = _mm_crc32_u64(c1, load_u64(p + CRC_SHORT));
                c2 = _mm_crc32_u64(c2, load_u64(p + 2 * CRC_SHORT));
                p += 8;
            } while (p < end);
            c0 = crc_shift(crc_short_shift, (uint32_t)c0) ^ c1;
            c0 = crc_shift(crc_short_shift, (uint32_t)c0) ^ c2;
            p += 2 * CRC_SHORT;
            n -= 3 * CRC_SHORT;
        }
    }
    while (n >= 8) {
        c0 = _mm_crc32_u64(c0, load_u64(p));
        p += 8;
        n -= 8;
    }
    uint32_t c = (uint32_t)c0;
    if (n >= 4) {
        uint32_t w;
        memcpy(&w, p, 4);
        c = _mm_crc32_u32(c, w);
        p += 4;
        n -= 4;
    }
    while (n--) c = _mm_crc32_u8(c, *p++);
    return ~c;
}
#endif /* CFRAME_X86_64 */

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
static crc_fn crc32c_update = crc32c_portable;

static void crc_init(void) {
    crc_tables_init();
#ifdef CFRAME_X86_64
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_shift_init(crc_long_shift, CRC_LONG);
        crc_shift_init(crc_short_shift, CRC_SHORT);
        crc32c_update = crc32c_sse42;
    }
#endif
}

static inline uint32_t mask_crc(uint32_t c) {
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

static inline void store_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline void store_le64(uint8_t *p, uint64_t v) {
    store_le32(p, (uint32_t)v);
    store_le32(p + 4, (uint32_t)(v >> 32));
}

/* ---------------------------------------------------------------------------------------------
 * Buffers of a batch: pointers and lengths taken while holding the GIL, from a tuple that keeps
 * every item alive. Exact bytes objects are read in place; anything else goes through a buffer
 * view (released by batch_release) or, where `strict_bytes` is set, is marked with len -1.
 */

typedef struct {
    const uint8_t *ptr;
    Py_ssize_t len;
} span;

typedef struct {
    PyObject *items; /* a tuple */
    Py_ssize_t n;
    span *spans;
    Py_buffer *views; /* one per item, allocated only when some item is not bytes */
    Py_ssize_t total; /* sum of the lengths (0 for items marked -1) */
} batch;

static void batch_release(batch *b) {
    if (b->views) {
        for (Py_ssize_t i = 0; i < b->n; i++)
            if (b->views[i].obj) PyBuffer_Release(&b->views[i]);
        PyMem_Free(b->views);
    }
    PyMem_Free(b->spans);
    Py_XDECREF(b->items);
    memset(b, 0, sizeof *b);
}

static int batch_collect(batch *b, PyObject *iterable, bool strict_bytes) {
    memset(b, 0, sizeof *b);
    b->items = PySequence_Tuple(iterable);
    if (!b->items) return -1;
    b->n = PyTuple_GET_SIZE(b->items);
    b->spans = PyMem_Malloc((size_t)(b->n ? b->n : 1) * sizeof(span));
    if (!b->spans) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *item = PyTuple_GET_ITEM(b->items, i);
        if (PyBytes_CheckExact(item)) {
            b->spans[i].ptr = (const uint8_t *)PyBytes_AS_STRING(item);
            b->spans[i].len = PyBytes_GET_SIZE(item);
        } else if (strict_bytes) {
            b->spans[i].ptr = NULL;
            b->spans[i].len = -1;
            continue;
        } else {
            if (!b->views) {
                b->views = PyMem_Calloc((size_t)b->n, sizeof(Py_buffer));
                if (!b->views) {
                    PyErr_NoMemory();
                    goto fail;
                }
            }
            if (PyObject_GetBuffer(item, &b->views[i], PyBUF_SIMPLE) < 0) {
                b->views[i].obj = NULL;
                if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    PyErr_Format(PyExc_TypeError,
                                 "sequence item %zd: a bytes-like object is required, not '%.80s'",
                                 i, Py_TYPE(item)->tp_name);
                }
                goto fail;
            }
            b->spans[i].ptr = b->views[i].buf;
            b->spans[i].len = b->views[i].len;
        }
        if (b->spans[i].len > PY_SSIZE_T_MAX - b->total) {
            PyErr_SetString(PyExc_OverflowError, "the records are too large to join");
            goto fail;
        }
        b->total += b->spans[i].len;
    }
    return 0;
fail:
    batch_release(b);
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * crc32c(data, value=0)
 */

static PyObject *py_crc32c_impl(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                                const char *name, crc_fn fn) {
    static const char *const names[] = {"data", "value"};
    PyObject *argv[2] = {NULL, NULL};
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most 2 arguments (%zd given)", name, nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) argv[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int slot = -1;
        for (int j = 0; j < 2; j++)
            if (PyUnicode_CompareWithASCIIString(key, names[j]) == 0) slot = j;
        if (slot < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", name,
                         key);
            return NULL;
        }
        if (argv[slot]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", name,
                         names[slot]);
            return NULL;
        }
        argv[slot] = args[nargs + k];
    }
    if (!argv[0]) {
        PyErr_Format(PyExc_TypeError, "%s() missing required argument 'data'", name);
        return NULL;
    }
    uint32_t value = 0;
    if (argv[1]) {
        if (!PyLong_Check(argv[1])) {
            PyErr_Format(PyExc_TypeError, "%s() value must be an int, not '%.80s'", name,
                         Py_TYPE(argv[1])->tp_name);
            return NULL;
        }
        unsigned long long v = PyLong_AsUnsignedLongLong(argv[1]);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            v = UINT64_MAX; /* negative or huge: reported below */
        }
        if (v > 0xFFFFFFFFull) {
            PyErr_Format(PyExc_OverflowError, "%s() value must be in 0..2**32-1", name);
            return NULL;
        }
        value = (uint32_t)v;
    }
    const uint8_t *p;
    Py_ssize_t n;
    Py_buffer view = {0};
    if (PyBytes_CheckExact(argv[0])) {
        p = (const uint8_t *)PyBytes_AS_STRING(argv[0]);
        n = PyBytes_GET_SIZE(argv[0]);
    } else {
        if (PyObject_GetBuffer(argv[0], &view, PyBUF_SIMPLE) < 0) return NULL;
        p = view.buf;
        n = view.len;
    }
    uint32_t c;
    if (n >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS c = fn(value, p, (size_t)n);
        Py_END_ALLOW_THREADS
    } else {
        c = fn(value, p, (size_t)n);
    }
    if (view.obj) PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_crc32c(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
    return py_crc32c_impl(args, nargs, kwnames, "crc32c", crc32c_update);
}

static PyObject *py_crc32c_portable(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames) {
    return py_crc32c_impl(args, nargs, kwnames, "_crc32c_portable", crc32c_portable);
}

/* ---------------------------------------------------------------------------------------------
 * frame_many(records)
 */

static void frame_into(uint8_t *out, const span *spans, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t len = (size_t)spans[i].len;
        store_le64(out, (uint64_t)len);
        store_le32(out + 8, mask_crc(crc32c_update(0, out, 8)));
        out += 12;
        if (len) memcpy(out, spans[i].ptr, len);
        store_le32(out + len, mask_crc(crc32c_update(0, spans[i].ptr, len)));
        out += len + 4;
    }
}

static PyObject *py_frame_many(PyObject *self, PyObject *records) {
    batch b;
    if (batch_collect(&b, records, false) < 0) return NULL;
    if (b.n > (PY_SSIZE_T_MAX - b.total) / 16) {
        batch_release(&b);
        return PyErr_Format(PyExc_OverflowError, "the records are too large to join");
    }
    Py_ssize_t size = b.total + 16 * b.n;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out) {
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
        if (size >= RELEASE_GIL_BYTES) {
            Py_BEGIN_ALLOW_THREADS frame_into(dst, b.spans, b.n);
            Py_END_ALLOW_THREADS
        } else {
            frame_into(dst, b.spans, b.n);
        }
    }
    batch_release(&b);
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * frame_groups(records, groups)
 *
 * Each group of records (a sequence of indexes into records) framed as frame_many frames them,
 * with their lengths: a partitioned dataset's batch becomes its folders' parts in one call, the
 * copying and the CRCs done with the GIL released.
 */

static PyObject *py_frame_groups(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "frame_groups(records, groups) takes 2 arguments");
        return NULL;
    }
    batch b;
    if (batch_collect(&b, args[0], true) < 0) return NULL;
    PyObject *groups = PySequence_Tuple(args[1]), *result = NULL;
    Py_ssize_t g_count = groups ? PyTuple_GET_SIZE(groups) : 0, picked = 0;
    span *spans = NULL;
    Py_ssize_t *bounds = NULL;
    uint8_t **outs = NULL;
    if (groups == NULL) goto done;
    /* Every group's indexes, then its spans in one array: [bounds[g], bounds[g + 1]). */
    bounds = PyMem_Calloc((size_t)g_count + 1, sizeof *bounds);
    outs = PyMem_Calloc((size_t)g_count ? (size_t)g_count : 1, sizeof *outs);
    if (bounds == NULL || outs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t g = 0; g < g_count; g++) {
        Py_ssize_t n = PySequence_Length(PyTuple_GET_ITEM(groups, g));
        if (n < 0) goto done;
        bounds[g + 1] = bounds[g] + n;
    }
    spans = PyMem_Malloc(((size_t)bounds[g_count] ? (size_t)bounds[g_count] : 1) * sizeof *spans);
    if ((result = PyList_New(g_count)) == NULL || spans == NULL) {
        if (spans == NULL) PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t g = 0; g < g_count; g++) {
        PyObject *indexes = PySequence_Tuple(PyTuple_GET_ITEM(groups, g));
        if (indexes == NULL) goto fail;
        Py_ssize_t n = PyTuple_GET_SIZE(indexes), size = 0;
        if (n != bounds[g + 1] - bounds[g]) {
            Py_DECREF(indexes);
            PyErr_SetString(PyExc_RuntimeError, "a group changed size");
            goto fail;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t i = PyNumber_AsSsize_t(PyTuple_GET_ITEM(indexes, k), PyExc_IndexError);
            if (i == -1 && PyErr_Occurred()) {
                Py_DECREF(indexes);
                goto fail;
            }
            if (i < 0 || i >= b.n) {
                Py_DECREF(indexes);
                PyErr_SetString(PyExc_IndexError, "record index out of range");
                goto fail;
            }
            if (b.spans[i].len < 0) {
                Py_DECREF(indexes);
                PyErr_Format(PyExc_TypeError, "record %zd is not bytes", i);
                goto fail;
            }
            spans[bounds[g] + k] = b.spans[i];
            if (b.spans[i].len > PY_SSIZE_T_MAX / 2 - size - 16) {
                Py_DECREF(indexes);
                PyErr_SetString(PyExc_OverflowError, "the records are too large to join");
                goto fail;
            }
            size += b.spans[i].len + 16;
        }
        Py_DECREF(indexes);
        PyObject *data = PyBytes_FromStringAndSize(NULL, size);
        PyObject *lengths = PyBytes_FromStringAndSize(NULL, n * 8);
        PyObject *pair = data && lengths ? PyTuple_Pack(2, data, lengths) : NULL;
        Py_XDECREF(data);
        Py_XDECREF(lengths);
        if (pair == NULL) goto fail;
        PyList_SET_ITEM(result, g, pair);
        uint8_t *lens = (uint8_t *)PyBytes_AS_STRING(lengths);
        for (Py_ssize_t k = 0; k < n; k++) {
            uint64_t len = (uint64_t)spans[bounds[g] + k].len;
            memcpy(lens + 8 * k, &len, sizeof len); /* native order, as array('Q') holds it */
        }
        outs[g] = (uint8_t *)PyBytes_AS_STRING(data);
        picked += size;
    }
    if (picked >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t g = 0; g < g_count; g++)
            frame_into(outs[g], spans + bounds[g], bounds[g + 1] - bounds[g]);
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t g = 0; g < g_count; g++)
            frame_into(outs[g], spans + bounds[g], bounds[g + 1] - bounds[g]);
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    PyMem_Free(spans);
    PyMem_Free(bounds);
    PyMem_Free(outs);
    Py_XDECREF(groups);
    batch_release(&b);
    return result;
}

/* ---------------------------------------------------------------------------------------------
 * check_messages(payloads, sequence)
 *
 * A walk of the wire format of tensorflow/core/example/{example,feature}.proto (proto3):
 *
 *   Example         { Features features = 1; }
 *   SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
 *   Features        { map<string, Feature> feature = 1; }
 *   FeatureLists    { map<string, FeatureList> feature_list = 1; }
 *   FeatureList     { repeated Feature feature = 1; }
 *   Feature         { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
 *                                  Int64List int64_list = 3; } }
 *   BytesList       { repeated bytes value = 1; }
 *   FloatList       { repeated float value = 1 [packed = true]; }
 *   Int64List       { repeated int64 value = 1 [packed = true]; }
 *   map entry       { string key = 1; V value = 2; }
 *
 * Every check returns false ("flag") unless it is sure. A field is accepted only with the tag
 * byte of its number and wire type (a known number with another wire type is an unknown field to
 * protobuf), so multi-byte tags, field number 0, groups and wire types 6/7 are all flagged.
 * Lengths must fit the enclosing message; varints are at most 10 bytes, the 10th at most 1;
 * packed floats a multiple of 4 bytes; packed varints must end exactly at the end of their field;
 * map keys must be strictly valid UTF-8 (proto3 strings: protobuf refuses anything else).
 *
 * A certified payload must also be one TensorFlow's parser (example_proto_fast_parsing.cc) reads
 * as protobuf does (daemon/tfrecordd/tfreading.py). That parser needs a map entry to be
 * exactly one key and one value, reads only the first kind of a Feature and only the first packed
 * field of a value list, and keeps the first of a repeated key where protobuf keeps the last. So
 * a map entry missing its key or value or holding either twice, a Feature with more than one
 * field, a value list with a packed field beside any other field, and a key repeated within one
 * message are all flagged (protobuf accepts every one of them). Repeated Features / context
 * fields are merged by both alike and are certified.
 */

typedef const uint8_t *cur;

/* The payload of a length-delimited field whose length varint starts at *pp, within `end`:
 * on success *pp is the payload's start and *sub its end. */
static inline bool read_len(cur *pp, cur end, cur *sub) {
    cur p = *pp;
    uint64_t len;
    if (p < end && *p < 0x80) { /* the usual one-byte length */
        len = *p++;
    } else {
        len = 0;
        for (int i = 0;; i++) {
            if (p >= end || i == 5) return false;
            uint8_t b = *p++;
            len |= (uint64_t)(b & 0x7F) << (7 * i);
            if (!(b & 0x80)) break;
        }
    }
    if (len > (uint64_t)(end - p)) return false;
    *pp = p;
    *sub = p + len;
    return true;
}

/* Past one varint in [p, end), or NULL. */
static inline cur skip_varint(cur p, cur end) {
    for (int i = 0; i < 10; i++) {
        if (p + i >= end) return NULL;
        uint8_t b = p[i];
        if (!(b & 0x80)) return (i == 9 && b > 1) ? NULL : p + i + 1;
    }
    return NULL;
}

/* Whether [p, end) is a run of whole varints (a packed varint field's payload). */
static bool packed_varints_ok(cur p, cur end) {
    unsigned run = 0; /* continuation bytes so far in the current varint */
    bool bad = false;
    for (; p < end; p++) {
        uint8_t b = *p;
        bad |= run == 9 && b > 1; /* a 10th byte that continues, or sets bits above 64 */
        run = (run + 1) & (0u - (unsigned)(b >> 7));
    }
    return !bad && run == 0;
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
static bool utf8_ok(cur p, cur end) {
    if (end - p < 16) { /* short, and most often ASCII: one pass to tell */
        uint8_t any = 0;
        for (cur q = p; q < end; q++) any |= *q;
        if (!(any & 0x80)) return true;
    }
    while (p < end) {
        if (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (!(w & 0x8080808080808080ull)) {
                p += 8;
                continue;
            }
        }
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        Py_ssize_t left = end - p;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        int need;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;      /* overlong */
            else if (c == 0xED) hi = 0x9F; /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;      /* overlong */
            else if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
        } else {
            return false;
        }
        if (left <= need) return false;
        if (p[1] < lo || p[1] > hi) return false;
        for (int k = 2; k <= need; k++)
            if ((p[k] & 0xC0) != 0x80) return false;
        p += need + 1;
    }
    return true;
}

static bool bytes_list_ok(cur p, cur end) {
    while (p < end) {
        cur sub;
        if (*p++ != 0x0A || !read_len(&p, end, &sub)) return false;
        p = sub;
    }
    return true;
}

/* A value list is one packed field, or unpacked values only: TensorFlow reads no further than a
 * packed field, so one beside other fields would be read differently. */
static bool float_list_ok(cur p, cur end) {
    if (p < end && *p == 0x0A) { /* packed */
        cur sub;
        p++;
        return read_len(&p, end, &sub) && !((sub - p) & 3) && sub == end;
    }
    while (p < end) {
        uint8_t tag = *p++;
        if (tag == 0x0D) { /* one fixed32 */
            if (end - p < 4) return false;
            p += 4;
        } else {
            return false;
        }
    }
    return true;
}

static bool int64_list_ok(cur p, cur end) {
    if (p < end && *p == 0x0A) { /* packed */
        cur sub;
        p++;
        return read_len(&p, end, &sub) && packed_varints_ok(p, sub) && sub == end;
    }
    while (p < end) {
        uint8_t tag = *p++;
        if (tag == 0x08) { /* one varint */
            p = skip_varint(p, end);
            if (!p) return false;
        } else {
            return false;
        }
    }
    return true;
}

/* No kind, or exactly one. */
static bool feature_ok(cur p, cur end) {
    if (p == end) return true;
    uint8_t tag = *p++;
    cur sub;
    if ((tag != 0x0A && tag != 0x12 && tag != 0x1A) || !read_len(&p, end, &sub) || sub != end)
        return false;
    return tag == 0x0A ? bytes_list_ok(p, sub) : tag == 0x12 ? float_list_ok(p, sub)
                                                             : int64_list_ok(p, sub);
}

static bool feature_list_ok(cur p, cur end) {
    while (p < end) {
        cur sub;
        if (*p++ != 0x0A || !read_len(&p, end, &sub) || !feature_ok(p, sub)) return false;
        p = sub;
    }
    return true;
}

/* The keys of one map seen so far. Keys in ascending byte order (as tfrecordd and protobuf's
 * deterministic serialization write them) are told apart by comparing each with the one before;
 * otherwise each is compared with all before it, up to KEYS_MAX keys (more are flagged). */
#define KEYS_MAX 64

typedef struct {
    cur ptr[KEYS_MAX];
    Py_ssize_t len[KEYS_MAX];
    int n;
    bool ascending;
} keyset;

static inline int key_cmp(cur a, Py_ssize_t alen, cur b, Py_ssize_t blen) {
    int c = memcmp(a, b, (size_t)(alen < blen ? alen : blen));
    return c ? c : (alen > blen) - (alen < blen);
}

/* False if the key was seen before, or cannot be told apart from the earlier ones. */
static bool key_new(keyset *ks, cur p, cur end) {
    Py_ssize_t len = end - p;
    if (ks->n && ks->ascending) {
        int last = (ks->n - 1) % KEYS_MAX;
        if (key_cmp(ks->ptr[last], ks->len[last], p, len) >= 0) {
            ks->ascending = false;
            if (ks->n > KEYS_MAX) return false;
        }
    }
    if (!ks->ascending) {
        if (ks->n >= KEYS_MAX) return false;
        for (int i = 0; i < ks->n; i++)
            if (ks->len[i] == len && !memcmp(ks->ptr[i], p, (size_t)len)) return false;
    }
    ks->ptr[ks->n % KEYS_MAX] = p;
    ks->len[ks->n % KEYS_MAX] = len;
    ks->n++;
    return true;
}

/* A map entry {string key = 1; V value = 2;}, exactly one of each in either order, with V
 * checked by value_ok. */
static inline bool map_entry_ok(cur p, cur end, bool (*value_ok)(cur, cur), keyset *ks) {
    bool key = false, value = false;
    while (p < end) {
        uint8_t tag = *p++;
        cur sub;
        if ((tag != 0x0A && tag != 0x12) || !read_len(&p, end, &sub)) return false;
        if (tag == 0x0A) {
            if (key || !utf8_ok(p, sub) || !key_new(ks, p, sub)) return false;
            key = true;
        } else {
            if (value || !value_ok(p, sub)) return false;
            value = true;
        }
        p = sub;
    }
    return key && value;
}

static bool features_ok(cur p, cur end, keyset *ks) {
    while (p < end) {
        cur sub;
        if (*p++ != 0x0A || !read_len(&p, end, &sub) || !map_entry_ok(p, sub, feature_ok, ks))
            return false;
        p = sub;
    }
    return true;
}

static bool feature_lists_ok(cur p, cur end, keyset *ks) {
    while (p < end) {
        cur sub;
        if (*p++ != 0x0A || !read_len(&p, end, &sub) ||
            !map_entry_ok(p, sub, feature_list_ok, ks))
            return false;
        p = sub;
    }
    return true;
}

static bool example_ok(cur p, cur end) {
    keyset ks;
    ks.n = 0;
    ks.ascending = true;
    while (p < end) {
        cur sub;
        if (*p++ != 0x0A || !read_len(&p, end, &sub) || !features_ok(p, sub, &ks)) return false;
        p = sub;
    }
    return true;
}

static bool sequence_example_ok(cur p, cur end) {
    keyset context, lists;
    context.n = lists.n = 0;
    context.ascending = lists.ascending = true;
    while (p < end) {
        uint8_t tag = *p++;
        cur sub;
        if ((tag != 0x0A && tag != 0x12) || !read_len(&p, end, &sub)) return false;
        if (!(tag == 0x0A ? features_ok(p, sub, &context) : feature_lists_ok(p, sub, &lists)))
            return false;
        p = sub;
    }
    return true;
}

/* Payloads above this size are left to protobuf (whose limit is 2 GiB). */
#define CHECK_MAX_BYTES ((Py_ssize_t)1 << 30)

static void check_all(const span *spans, Py_ssize_t n, bool sequence, uint8_t *flagged) {
    bool (*ok)(cur, cur) = sequence ? sequence_example_ok : example_ok;
    for (Py_ssize_t i = 0; i < n; i++) {
        const span *s = &spans[i];
        flagged[i] = s->len < 0 || s->len > CHECK_MAX_BYTES || !ok(s->ptr, s->ptr + s->len);
    }
}

static PyObject *py_check_messages(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"payloads", "sequence", NULL};
    PyObject *payloads;
    int sequence;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Op:check_messages", kwlist, &payloads,
                                     &sequence))
        return NULL;
    batch b;
    if (batch_collect(&b, payloads, true) < 0) return NULL;
    uint8_t *flagged = PyMem_Malloc((size_t)(b.n ? b.n : 1));
    if (!flagged) {
        batch_release(&b);
        return PyErr_NoMemory();
    }
    if (b.total >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS check_all(b.spans, b.n, sequence != 0, flagged);
        Py_END_ALLOW_THREADS
    } else {
        check_all(b.spans, b.n, sequence != 0, flagged);
    }
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < b.n; i++) {
        if (!flagged[i]) continue;
        PyObject *index = PyLong_FromSsize_t(i);
        if (!index || PyList_Append(out, index) < 0) Py_CLEAR(out);
        Py_XDECREF(index);
    }
    PyMem_Free(flagged);
    batch_release(&b);
    return out;
}

/* --------------------------------------------------------------------------------------------- */

/* line_end(data, start, stop, lines): where a batch of whole lines starting at start ends, by
 * memchr from newline to newline (bytes.count walks every byte in Python's own loop). */
static PyObject *py_line_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "line_end() takes 4 arguments");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t stop = PyLong_AsSsize_t(args[2]);
    Py_ssize_t want = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (start < 0 || stop < start || stop > view.len || want < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "line_end(): need 0 <= start <= stop <= len(data)");
        return NULL;
    }
    const char *base = view.buf;
    const char *at = base + start;
    const char *end = base + stop;
    Py_ssize_t found = 0;
    while (found < want && at < end) {
        const char *nl = memchr(at, '\n', (size_t)(end - at));
        if (!nl) break;
        at = nl + 1;
        found++;
    }
    Py_ssize_t pos = found == want ? (Py_ssize_t)(at - base) : stop;
    PyBuffer_Release(&view);
    return Py_BuildValue("nn", pos, found);
}

/* --------------------------------------------------------------------------------------------- */

/* record_starts(lengths, start, /): where each record starts in a framed stream, as the bytes of
 * an array('Q'), given the records' lengths (a buffer of native uint64) and the first's start. */
static PyObject *py_record_starts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "record_starts() takes 2 arguments");
        return NULL;
    }
    unsigned long long at = PyLong_AsUnsignedLongLong(args[1]);
    if (at == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    const char *fmt = view.format ? view.format : "B";
    if (fmt[0] == '@' || fmt[0] == '=') fmt++;
    if (view.itemsize != 8 || (strcmp(fmt, "Q") != 0 && strcmp(fmt, "L") != 0)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "record_starts(): lengths must be unsigned 64-bit");
        return NULL;
    }
    Py_ssize_t n = view.len / 8;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!out) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint64_t *len = view.buf;
    uint64_t *start = (uint64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        start[i] = at;
        at += len[i] + 16; /* uint64 length, uint32 CRC of it, the data, uint32 CRC of the data */
    }
    PyBuffer_Release(&view);
    return out;
}

/* --------------------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"crc32c", (PyCFunction)(void (*)(void))py_crc32c, METH_FASTCALL | METH_KEYWORDS,
     "crc32c(data, value=0)\n--\n\n"
     "CRC32C of data, continued from value (the CRC of the bytes before it), like the crc32c\n"
     "package's crc32c.crc32c. value must be in 0..2**32-1."},
    {"_crc32c_portable", (PyCFunction)(void (*)(void))py_crc32c_portable,
     METH_FASTCALL | METH_KEYWORDS,
     "_crc32c_portable(data, value=0)\n--\n\n"
     "crc32c computed with the table-driven code used where the CPU has no CRC32C instruction."},
    {"record_starts", (PyCFunction)(void (*)(void))py_record_starts, METH_FASTCALL,
     "record_starts(lengths, start, /)\n--\n\n"
     "Where each record starts in a framed stream, as the bytes of an array('Q'): the first at\n"
     "start, each next one after the previous one's length and 16 bytes of framing. lengths is\n"
     "a buffer of unsigned 64-bit integers (an array('Q'))."},
    {"frame_many", py_frame_many, METH_O,
     "frame_many(records, /)\n--\n\n"
     "The records framed as TFRecord back to back: for each, uint64 length, uint32 masked CRC\n"
     "of the length, the data, uint32 masked CRC of the data (little-endian)."},
    {"frame_groups", (PyCFunction)(void (*)(void))py_frame_groups, METH_FASTCALL,
     "frame_groups(records, groups, /)\n--\n\n"
     "For each group of record indexes (a sequence of ints into records, exact bytes), the\n"
     "group's records framed back to back as frame_many frames them, and their lengths as the\n"
     "bytes of an array('Q')."},
    {"check_messages", (PyCFunction)(void (*)(void))py_check_messages,
     METH_VARARGS | METH_KEYWORDS,
     "check_messages(payloads, sequence)\n--\n\n"
     "Indices, ascending, of the payloads this check cannot certify as a serialized\n"
     "tf.train.Example (sequence false) or SequenceExample (sequence true) that protobuf parses\n"
     "with no unknown field at any depth. Every other payload is certified; a flagged one may\n"
     "still be valid (protobuf decides). Items that are not bytes are always flagged."},
    {"line_end", (PyCFunction)(void (*)(void))py_line_end, METH_FASTCALL,
     "line_end(data, start, stop, lines, /)\n--\n\n"
     "(end, found): with found newlines in data[start:stop], up to lines; end is just past the\n"
     "last of them when found == lines, else stop."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_cframe",
    "TFRecord framing, CRC32C and a certifying check of serialized Examples, in C.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__cframe(void) {
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
#ifdef CFRAME_X86_64
    const char *impl = crc32c_update == crc32c_sse42 ? "sse4.2" : "portable";
#else
    const char *impl = "portable";
#endif
    if (PyModule_AddStringConstant(m, "CRC32C_IMPLEMENTATION", impl) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
