/* JSON bytes straight to serialized tf.train.Example bytes, for the plain features.
 *
 * An ExamplePlan is built once from a schema whose every feature is a top-level key of type
 * int64, float or bytes with no conversion of its own but a timestamp's unit (tfrecordd.schema
 * decides that). Its
 * encode_batch parses each payload itself and writes the Example wire format without creating a
 * Python object per value. It answers None for a payload whenever it is not certain to produce
 * exactly what the pure-Python path (orjson.loads + ExampleSchema.encode) produces, and that path
 * then encodes the event or reports its failure: malformed JSON of any kind, a value that Python
 * would convert or refuse, a duplicated feature key, anything unusual.
 *
 * An int64 is read from the token's digits, never through a double: 3.0 and 1e3 are written
 * (as the Python path writes them, reading the number's text), while anything that is not an
 * integer as written, or does not fit, is left to Python to refuse with its reason. An int64 with
 * a time_unit (kind "int64/ms" and the like) takes only whole seconds written as an integer,
 * multiplied by the unit's count per second; RFC 3339 text, fractions and products that do not
 * fit are left to Python, which converts them exactly or names the fault.
 *
 * The wire format is the one tfrecordd.wire.ExampleWriter writes: map entries in the order of
 * their keys' UTF-8 bytes, int64 as packed varints, float as packed little-endian float32, bytes
 * as one field per value; an empty list writes the feature with an empty value list; a missing
 * value (absent key or null) writes the feature's default entry, or leaves the feature out.
 *
 * The batch is parsed with the GIL released. Decimal numbers that the exact fast path (Clinger's:
 * at most 2**53 for the digits, a power of ten up to 1e22) cannot convert are converted with
 * PyOS_string_to_double, which needs the GIL: such a payload is set aside and encoded again once
 * the GIL is held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
#define FAST_DECIMAL 1
#else
#define FAST_DECIMAL 0
#endif

#define MAX_DEPTH 64
#define MAX_SLOW_TOKEN 4096

enum { KIND_INT64 = 0, KIND_FLOAT = 1, KIND_BYTES = 2 };

/* The outcome of one payload. */
enum { ENC_OK = 0, ENC_FALLBACK = 1, ENC_RETRY = 2, ENC_NOMEM = 3 };

/* What a feature holds after parsing one payload. */
enum { SLOT_ABSENT = 0, SLOT_NULL = 1, SLOT_VALUE = 2 };

typedef struct {
    unsigned char *key; /* the feature's name: the map key written */
    Py_ssize_t key_len;
    unsigned char *json_key; /* the top-level key of the JSON object that holds the value */
    Py_ssize_t json_key_len;
    int kind;
    int64_t per_second; /* a timestamp's units per second (an int64 with time_unit), else 0 */
    int required;
    unsigned char *default_entry; /* the whole map field (tag, length, entry), or NULL */
    Py_ssize_t default_len;
    unsigned char head[16]; /* 0x0a varint(key_len): the entry's key field minus the key */
    Py_ssize_t head_len;
} Feature;

typedef struct {
    PyObject_HEAD
    Py_ssize_t count;
    Feature *features; /* sorted by key bytes */
    int32_t *table;    /* open addressing: index + 1 into features, 0 for empty */
    uint32_t mask;
    PyObject *spec; /* the constructor's argument, for pickling */
} PlanObject;

/* ---- growable buffers (no GIL needed) ------------------------------------------------------ */

typedef struct {
    unsigned char *data;
    size_t len;
    size_t cap;
} Buf;

static int buf_grow(Buf *b, size_t extra) {
    size_t need = b->len + extra;
    if (need < b->len) return -1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    unsigned char *data = PyMem_RawRealloc(b->data, cap);
    if (data == NULL) return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int buf_reserve(Buf *b, size_t extra) {
    return (b->cap - b->len >= extra) ? 0 : buf_grow(b, extra);
}

static inline size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v > 0x7F) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline unsigned char *put_varint(unsigned char *out, uint64_t v) {
    while (v > 0x7F) {
        *out++ = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *out++ = (unsigned char)v;
    return out;
}

/* ---- the parser ---------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    int allow_slow; /* the GIL is held: PyOS_string_to_double may be called */
    Buf payload;    /* the payloads of this record's features, one after the other */
    Buf text;       /* a decoded key or string with escapes */
    unsigned char *slot; /* per feature: SLOT_* */
    size_t *off;         /* per feature: the payload's offset in `payload` */
    size_t *len;         /* per feature: the payload's length */
} Parser;

static inline void skip_ws(Parser *ps) {
    const unsigned char *p = ps->p, *end = ps->end;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    ps->p = p;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(const unsigned char *p, const unsigned char *end, uint32_t *out) {
    if (end - p < 4) return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        v = (v << 4) | (uint32_t)h;
    }
    *out = v;
    return 0;
}

/* The length of the valid UTF-8 sequence of a non-ASCII lead byte at p, or 0 (Unicode table
 * 3-7: no overlong forms, no surrogates, nothing above U+10FFFF). */
static inline int utf8_seq(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    Py_ssize_t avail = end - p;
    if (c >= 0xC2 && c <= 0xDF) {
        return (avail >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (avail < 3) return 0;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        else if (c == 0xED) hi = 0x9F;
        if (p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80) return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (avail < 4) return 0;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F;
        if (p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        return 4;
    }
    return 0;
}

static inline unsigned char *put_utf8(unsigned char *out, uint32_t cp) {
    if (cp < 0x80) {
        *out++ = (unsigned char)cp;
    } else if (cp < 0x800) {
        *out++ = (unsigned char)(0xC0 | (cp >> 6));
        *out++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *out++ = (unsigned char)(0xE0 | (cp >> 12));
        *out++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *out++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else {
        *out++ = (unsigned char)(0xF0 | (cp >> 18));
        *out++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        *out++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *out++ = (unsigned char)(0x80 | (cp & 0x3F));
    }
    return out;
}

/* Scan a string whose opening quote is at ps->p. On success ps->p is past the closing quote,
 * [*start, *stop) is the raw content and *escaped tells whether it holds escapes. Everything is
 * validated: UTF-8, control characters, escapes, surrogate pairs. */
static int scan_string(Parser *ps, const unsigned char **start, const unsigned char **stop,
                       int *escaped) {
    const unsigned char *p = ps->p + 1, *end = ps->end;
    int esc = 0;
    *start = p;
    for (;;) {
        /* The common case: printable ASCII. */
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
        if (p >= end) return ENC_FALLBACK;
        unsigned char c = *p;
        if (c == '"') break;
        if (c == '\\') {
            esc = 1;
            if (end - p < 2) return ENC_FALLBACK;
            unsigned char e = p[1];
            if (e == 'u') {
                uint32_t u;
                if (read_hex4(p + 2, end, &u) < 0) return ENC_FALLBACK;
                p += 6;
                if (u >= 0xDC00 && u <= 0xDFFF) return ENC_FALLBACK;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    uint32_t lo;
                    if (end - p < 2 || p[0] != '\\' || p[1] != 'u') return ENC_FALLBACK;
                    if (read_hex4(p + 2, end, &lo) < 0) return ENC_FALLBACK;
                    if (lo < 0xDC00 || lo > 0xDFFF) return ENC_FALLBACK;
                    p += 6;
                }
                continue;
            }
            if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                e == 'r' || e == 't') {
                p += 2;
                continue;
            }
            return ENC_FALLBACK;
        }
        if (c < 0x20) return ENC_FALLBACK;
        int n = utf8_seq(p, end);
        if (n == 0) return ENC_FALLBACK;
        p += n;
    }
    *stop = p;
    *escaped = esc;
    ps->p = p + 1;
    return ENC_OK;
}

/* Append the decoded content of an already validated string to `out`. */
static int decode_escaped(const unsigned char *p, const unsigned char *end, Buf *out) {
    if (buf_reserve(out, (size_t)(end - p)) < 0) return ENC_NOMEM;
    /* A decoded string is never longer than its escaped form. */
    unsigned char *o = out->data + out->len;
    while (p < end) {
        unsigned char c = *p;
        if (c != '\\') {
            *o++ = c;
            p++;
            continue;
        }
        unsigned char e = p[1];
        p += 2;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        default: { /* 'u', validated by scan_string */
            uint32_t u = 0, lo = 0; /* read_hex4 always sets them: the escape was validated */
            read_hex4(p, end, &u);
            p += 4;
            if (u >= 0xD800 && u <= 0xDBFF) {
                read_hex4(p + 2, end, &lo);
                p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            o = put_utf8(o, u);
        }
        }
    }
    out->len = (size_t)(o - out->data);
    return ENC_OK;
}

typedef struct {
    const unsigned char *start, *end; /* the whole token */
    const unsigned char *int_start, *int_end;
    const unsigned char *frac_start, *frac_end; /* empty when there is no fraction */
    int negative;
    int is_int; /* no fraction, no exponent */
    long exponent; /* saturated at +-1e9 */
} Number;

/* Scan a JSON number at ps->p (RFC 8259 grammar) and refuse any whose value could be infinite as
 * a double: orjson refuses those, wherever they are. */
static int scan_number(Parser *ps, Number *num) {
    const unsigned char *p = ps->p, *end = ps->end;
    num->start = p;
    num->negative = 0;
    if (p < end && *p == '-') {
        num->negative = 1;
        p++;
    }
    if (p >= end) return ENC_FALLBACK;
    num->int_start = p;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return ENC_FALLBACK;
    }
    num->int_end = p;
    num->frac_start = num->frac_end = p;
    num->is_int = 1;
    num->exponent = 0;
    if (p < end && *p == '.') {
        p++;
        num->frac_start = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == num->frac_start) return ENC_FALLBACK;
        num->frac_end = p;
        num->is_int = 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        const unsigned char *d = p;
        long e = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (e < 1000000000L) e = e * 10 + (*p - '0');
            p++;
        }
        if (p == d) return ENC_FALLBACK;
        num->exponent = eneg ? -e : e;
        num->is_int = 0;
    }
    num->end = p;
    ps->p = p;

    /* The value is below 10**order; anything below 1e308 is a finite double. */
    long long order;
    if (!(num->int_end - num->int_start == 1 && *num->int_start == '0')) {
        order = (long long)(num->int_end - num->int_start) + num->exponent;
    } else {
        const unsigned char *q = num->frac_start;
        while (q < num->frac_end && *q == '0') q++;
        if (q == num->frac_end) return ENC_OK; /* zero */
        order = -(long long)(q - num->frac_start) + num->exponent;
    }
    return order > 308 ? ENC_FALLBACK : ENC_OK;
}

/* An integer token as an int64, or ENC_FALLBACK when it is not one or does not fit. */
static int signed_int64(uint64_t v, int negative, int64_t *out) {
    if (negative) {
        if (v > (uint64_t)INT64_MAX + 1) return ENC_FALLBACK;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    } else {
        if (v > (uint64_t)INT64_MAX) return ENC_FALLBACK;
        *out = (int64_t)v;
    }
    return ENC_OK;
}

static int number_to_int64(const Number *num, int64_t *out) {
    if (!num->is_int) return ENC_FALLBACK;
    uint64_t v = 0;
    for (const unsigned char *q = num->int_start; q < num->int_end; q++) {
        unsigned d = (unsigned)(*q - '0');
        if (v > (UINT64_MAX - d) / 10) return ENC_FALLBACK;
        v = v * 10 + d;
    }
    return signed_int64(v, num->negative, out);
}

/* A token with a fraction or an exponent whose value, read from its digits, is an integer that
 * fits an int64 (3.0, 1e3, 2.50e1, 9007199254740993.0), as the Python path reads it from the
 * text; ENC_FALLBACK for any other (not an integer, out of range: Python refuses it and says
 * why). Never through a double, which would round 1.0000000000000001 to 1. */
static int number_to_int64_exact(const Number *num, int64_t *out) {
    long long int_len = num->int_end - num->int_start;
    long long count = int_len + (num->frac_end - num->frac_start);
#define DIGIT_AT(i) ((i) < int_len ? num->int_start[i] : num->frac_start[(i) - int_len])
    long long lead = 0, trail = count - 1;
    while (lead < count && DIGIT_AT(lead) == '0') lead++;
    if (lead == count) {
        *out = 0;
        return ENC_OK;
    }
    while (DIGIT_AT(trail) == '0') trail--;
    long long significant = trail - lead + 1;
    /* The value is digits[lead..trail] * 10**scale. */
    long long scale = (long long)num->exponent - (count - int_len) + (count - 1 - trail);
    if (scale < 0 || significant > 19 || significant + scale > 19) return ENC_FALLBACK;
    uint64_t v = 0;
    for (long long i = lead; i <= trail; i++) v = v * 10 + (uint64_t)(DIGIT_AT(i) - '0');
#undef DIGIT_AT
    for (long long i = 0; i < scale; i++) {
        if (v > UINT64_MAX / 10) return ENC_FALLBACK;
        v *= 10;
    }
    return signed_int64(v, num->negative, out);
}

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The double of a token with a fraction or an exponent, as float() makes it. */
static int number_to_double(Parser *ps, const Number *num, double *out) {
#if FAST_DECIMAL
    /* Clinger's fast path: digits and power of ten both exact, so one rounding, correct. */
    uint64_t m = 0;
    int exact = 1;
    for (const unsigned char *q = num->int_start; q < num->int_end && exact; q++) {
        m = m * 10 + (uint64_t)(*q - '0');
        if (m > (1ULL << 53)) exact = 0;
    }
    for (const unsigned char *q = num->frac_start; q < num->frac_end && exact; q++) {
        m = m * 10 + (uint64_t)(*q - '0');
        if (m > (1ULL << 53)) exact = 0;
    }
    if (exact) {
        long e = num->exponent - (long)(num->frac_end - num->frac_start);
        if (e >= -22 && e <= 22) {
            double d = (double)m;
            d = e >= 0 ? d * POW10[e] : d / POW10[-e];
            *out = num->negative ? -d : d;
            return ENC_OK;
        }
        if (m == 0) {
            *out = num->negative ? -0.0 : 0.0;
            return ENC_OK;
        }
    }
#endif
    if (!ps->allow_slow) return ENC_RETRY;
    Py_ssize_t n = num->end - num->start;
    if (n > MAX_SLOW_TOKEN) return ENC_FALLBACK;
    char buf[MAX_SLOW_TOKEN + 1];
    memcpy(buf, num->start, (size_t)n);
    buf[n] = '\0';
    char *stop = NULL;
    double d = PyOS_string_to_double(buf, &stop, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return ENC_FALLBACK;
    }
    if (stop != buf + n) return ENC_FALLBACK;
    *out = d;
    return ENC_OK;
}

/* After an item of an array or object: consume the ',' that announces another item (ITEM_MORE)
 * or the `close` that ends the container (ITEM_DONE); anything else is not JSON. */
enum { ITEM_MORE = -1, ITEM_DONE = -2 };

static int after_item(Parser *ps, unsigned char close) {
    skip_ws(ps);
    if (ps->p >= ps->end) return ENC_FALLBACK;
    if (*ps->p == ',') {
        ps->p++;
        skip_ws(ps);
        return ITEM_MORE;
    }
    if (*ps->p == close) {
        ps->p++;
        return ITEM_DONE;
    }
    return ENC_FALLBACK;
}

static int skip_value(Parser *ps, int depth);

static int skip_container(Parser *ps, int depth) {
    if (depth >= MAX_DEPTH) return ENC_FALLBACK;
    int object = *ps->p == '{';
    unsigned char close = object ? '}' : ']';
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return ENC_OK;
    }
    for (;;) {
        int r;
        if (object) {
            const unsigned char *s, *e;
            int esc;
            if (ps->p >= ps->end || *ps->p != '"') return ENC_FALLBACK;
            if ((r = scan_string(ps, &s, &e, &esc)) != ENC_OK) return r;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return ENC_FALLBACK;
            ps->p++;
            skip_ws(ps);
        }
        if ((r = skip_value(ps, depth + 1)) != ENC_OK) return r;
        if ((r = after_item(ps, close)) == ITEM_MORE) continue;
        return r == ITEM_DONE ? ENC_OK : r;
    }
}

static int skip_literal(Parser *ps, const char *word, size_t n) {
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return ENC_FALLBACK;
    ps->p += n;
    return ENC_OK;
}

/* Validate and skip any JSON value at ps->p (whitespace already skipped). */
static int skip_value(Parser *ps, int depth) {
    if (ps->p >= ps->end) return ENC_FALLBACK;
    switch (*ps->p) {
    case '"': {
        const unsigned char *s, *e;
        int esc;
        return scan_string(ps, &s, &e, &esc);
    }
    case '{':
    case '[': return skip_container(ps, depth);
    case 't': return skip_literal(ps, "true", 4);
    case 'f': return skip_literal(ps, "false", 5);
    case 'n': return skip_literal(ps, "null", 4);
    default: {
        Number num;
        return scan_number(ps, &num);
    }
    }
}

/* Append one element of a feature's value list to the payload buffer. */
static int encode_element(Parser *ps, const Feature *feature) {
    int kind = feature->kind;
    const unsigned char *p = ps->p;
    if (p >= ps->end) return ENC_FALLBACK;
    unsigned char c = *p;
    int r;
    if (kind == KIND_BYTES) {
        if (c != '"') return ENC_FALLBACK;
        const unsigned char *s, *e;
        int esc;
        if ((r = scan_string(ps, &s, &e, &esc)) != ENC_OK) return r;
        if (!esc) {
            size_t n = (size_t)(e - s);
            if (buf_reserve(&ps->payload, n + 11) < 0) return ENC_NOMEM;
            unsigned char *o = ps->payload.data + ps->payload.len;
            *o++ = 0x0a;
            o = put_varint(o, n);
            memcpy(o, s, n);
            ps->payload.len = (size_t)(o - ps->payload.data) + n;
            return ENC_OK;
        }
        ps->text.len = 0;
        if ((r = decode_escaped(s, e, &ps->text)) != ENC_OK) return r;
        size_t n = ps->text.len;
        if (buf_reserve(&ps->payload, n + 11) < 0) return ENC_NOMEM;
        unsigned char *o = ps->payload.data + ps->payload.len;
        *o++ = 0x0a;
        o = put_varint(o, n);
        memcpy(o, ps->text.data, n);
        ps->payload.len = (size_t)(o - ps->payload.data) + n;
        return ENC_OK;
    }
    if (c != '-' && (c < '0' || c > '9')) return ENC_FALLBACK;
    Number num;
    if ((r = scan_number(ps, &num)) != ENC_OK) return r;
    if (kind == KIND_INT64) {
        int64_t v;
        if (feature->per_second) {
            /* A timestamp: whole seconds only. A fraction, an exponent or a product past the
             * int64 range is Python's (it floors exactly, or names the range). */
            if (!num.is_int) return ENC_FALLBACK;
            if ((r = number_to_int64(&num, &v)) != ENC_OK) return r;
            if (__builtin_mul_overflow(v, feature->per_second, &v)) return ENC_FALLBACK;
        } else {
            r = num.is_int ? number_to_int64(&num, &v) : number_to_int64_exact(&num, &v);
            if (r != ENC_OK) return r;
        }
        if (buf_reserve(&ps->payload, 10) < 0) return ENC_NOMEM;
        unsigned char *o = put_varint(ps->payload.data + ps->payload.len, (uint64_t)v);
        ps->payload.len = (size_t)(o - ps->payload.data);
        return ENC_OK;
    }
    /* KIND_FLOAT: Python packs float(x) with struct.pack("<f"): (float) of the double, and a
     * finite double that becomes infinite is refused. */
    double d;
    if (num.is_int) {
        int64_t v;
        if ((r = number_to_int64(&num, &v)) != ENC_OK) return r;
        d = (double)v;
    } else if ((r = number_to_double(ps, &num, &d)) != ENC_OK) {
        return r;
    }
    if (!isfinite(d)) return ENC_FALLBACK;
    float f = (float)d;
    if (isinf(f)) return ENC_FALLBACK;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (buf_reserve(&ps->payload, 4) < 0) return ENC_NOMEM;
    unsigned char *o = ps->payload.data + ps->payload.len;
    o[0] = (unsigned char)bits;
    o[1] = (unsigned char)(bits >> 8);
    o[2] = (unsigned char)(bits >> 16);
    o[3] = (unsigned char)(bits >> 24);
    ps->payload.len += 4;
    return ENC_OK;
}

/* Parse the value of feature i at ps->p into its slot. */
static int encode_feature(Parser *ps, const Feature *f, Py_ssize_t i) {
    const unsigned char *p = ps->p;
    if (p >= ps->end) return ENC_FALLBACK;
    int r;
    if (*p == 'n') {
        if ((r = skip_literal(ps, "null", 4)) != ENC_OK) return r;
        ps->slot[i] = SLOT_NULL;
        return ENC_OK;
    }
    size_t start = ps->payload.len;
    if (*p == '[') {
        ps->p++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ']') {
            ps->p++;
        } else {
            for (;;) {
                if ((r = encode_element(ps, f)) != ENC_OK) return r;
                if ((r = after_item(ps, ']')) == ITEM_MORE) continue;
                if (r == ITEM_DONE) break;
                return r;
            }
        }
    } else if ((r = encode_element(ps, f)) != ENC_OK) {
        return r;
    }
    ps->slot[i] = SLOT_VALUE;
    ps->off[i] = start;
    ps->len[i] = ps->payload.len - start;
    return ENC_OK;
}

static inline uint32_t hash_key(const unsigned char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

static Py_ssize_t lookup(const PlanObject *plan, const unsigned char *key, size_t n) {
    uint32_t h = hash_key(key, n) & plan->mask;
    for (;;) {
        int32_t slot = plan->table[h];
        if (slot == 0) return -1;
        const Feature *f = &plan->features[slot - 1];
        if ((size_t)f->json_key_len == n && memcmp(f->json_key, key, n) == 0) return slot - 1;
        h = (h + 1) & plan->mask;
    }
}

/* The sizes of feature f's map entry around a payload of n bytes. */
static inline size_t entry_inner_size(const Feature *f, size_t n, size_t *feature_len,
                                      size_t *value_len) {
    int packed = f->kind != KIND_BYTES;
    size_t vl = (packed && n) ? 1 + varint_size(n) + n : n; /* value head + payload */
    size_t fl = 1 + varint_size(vl) + vl;                   /* the Feature message */
    *feature_len = fl;
    *value_len = vl;
    return (size_t)f->head_len + (size_t)f->key_len + 1 + varint_size(fl) + fl;
}

/* What encode_record notes of one top-level key besides encoding (a route's field): whether
 * the payload holds it, and its value where that is a plain string (no escapes). */
enum { CAP_MISSING = 0, CAP_STRING = 1, CAP_OTHER = 2 };

typedef struct {
    const unsigned char *key;
    size_t key_len;
    int state;
    const unsigned char *start, *stop;
} Capture;

static void capture_value(Parser *ps, Capture *cap) {
    if (cap->state != CAP_MISSING || ps->p >= ps->end || *ps->p != '"') {
        cap->state = CAP_OTHER; /* repeated, or no string: Python reads it */
        return;
    }
    const unsigned char *at = ps->p, *s, *e;
    int esc;
    if (scan_string(ps, &s, &e, &esc) == ENC_OK && !esc) {
        cap->state = CAP_STRING;
        cap->start = s;
        cap->stop = e;
    } else {
        cap->state = CAP_OTHER;
    }
    ps->p = at;
}

/* Parse one payload; on success append the serialized Example to `out`. With `cap`, note its
 * key's value as well. */
static int encode_record(const PlanObject *plan, Parser *ps, const unsigned char *data,
                         Py_ssize_t size, Buf *out, size_t *rec_off, size_t *rec_len,
                         Capture *cap) {
    Py_ssize_t count = plan->count;
    int r;
    if (cap != NULL) cap->state = CAP_MISSING;
    ps->p = data;
    ps->end = data + size;
    ps->payload.len = 0;
    memset(ps->slot, SLOT_ABSENT, (size_t)count);

    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '{') return ENC_FALLBACK;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
    } else {
        for (;;) {
            if (ps->p >= ps->end || *ps->p != '"') return ENC_FALLBACK;
            const unsigned char *s, *e;
            int esc;
            if ((r = scan_string(ps, &s, &e, &esc)) != ENC_OK) return r;
            Py_ssize_t i;
            const unsigned char *k = s;
            size_t k_len = (size_t)(e - s);
            if (esc) {
                ps->text.len = 0;
                if ((r = decode_escaped(s, e, &ps->text)) != ENC_OK) return r;
                k = ps->text.data;
                k_len = ps->text.len;
            }
            i = lookup(plan, k, k_len);
            int captured = cap != NULL && k_len == cap->key_len && memcmp(k, cap->key, k_len) == 0;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return ENC_FALLBACK;
            ps->p++;
            skip_ws(ps);
            if (captured) capture_value(ps, cap);
            if (i >= 0) {
                if (ps->slot[i] != SLOT_ABSENT) return ENC_FALLBACK; /* a duplicate key */
                r = encode_feature(ps, &plan->features[i], i);
            } else {
                r = skip_value(ps, 1);
            }
            if (r != ENC_OK) return r;
            if ((r = after_item(ps, '}')) == ITEM_MORE) continue;
            if (r == ITEM_DONE) break;
            return r;
        }
    }
    skip_ws(ps);
    if (ps->p != ps->end) return ENC_FALLBACK;

    /* Sizes first: every length precedes what it measures. */
    size_t body = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const Feature *f = &plan->features[i];
        if (ps->slot[i] == SLOT_VALUE) {
            size_t fl, vl;
            size_t inner = entry_inner_size(f, ps->len[i], &fl, &vl);
            body += 1 + varint_size(inner) + inner;
        } else if (f->required) {
            return ENC_FALLBACK;
        } else if (f->default_entry != NULL) {
            body += (size_t)f->default_len;
        }
    }
    if (buf_reserve(out, 1 + 10 + body) < 0) return ENC_NOMEM;
    unsigned char *o = out->data + out->len;
    unsigned char *first = o;
    *o++ = 0x0a;
    o = put_varint(o, body);
    for (Py_ssize_t i = 0; i < count; i++) {
        const Feature *f = &plan->features[i];
        if (ps->slot[i] != SLOT_VALUE) {
            if (f->default_entry != NULL) {
                memcpy(o, f->default_entry, (size_t)f->default_len);
                o += f->default_len;
            }
            continue;
        }
        size_t n = ps->len[i], fl, vl;
        size_t inner = entry_inner_size(f, n, &fl, &vl);
        *o++ = 0x0a;
        o = put_varint(o, inner);
        memcpy(o, f->head, (size_t)f->head_len);
        o += f->head_len;
        memcpy(o, f->key, (size_t)f->key_len);
        o += f->key_len;
        *o++ = 0x12;
        o = put_varint(o, fl);
        *o++ = f->kind == KIND_BYTES ? 0x0a : f->kind == KIND_FLOAT ? 0x12 : 0x1a;
        o = put_varint(o, vl);
        if (f->kind != KIND_BYTES && n) {
            *o++ = 0x0a;
            o = put_varint(o, n);
        }
        memcpy(o, ps->payload.data + ps->off[i], n);
        o += n;
    }
    *rec_off = out->len;
    *rec_len = (size_t)(o - first);
    out->len += *rec_len;
    return ENC_OK;
}

/* ---- the ExamplePlan type ------------------------------------------------------------------ */

static void plan_free_features(PlanObject *self) {
    if (self->features != NULL) {
        for (Py_ssize_t i = 0; i < self->count; i++) {
            PyMem_Free(self->features[i].key);
            PyMem_Free(self->features[i].json_key);
            PyMem_Free(self->features[i].default_entry);
        }
        PyMem_Free(self->features);
        self->features = NULL;
    }
    PyMem_Free(self->table);
    self->table = NULL;
    self->count = 0;
}

static void plan_dealloc(PlanObject *self) {
    plan_free_features(self);
    Py_XDECREF(self->spec);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int compare_features(const void *a, const void *b) {
    const Feature *x = a, *y = b;
    Py_ssize_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, (size_t)n);
    if (c != 0) return c;
    return (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

static unsigned char *copy_bytes(PyObject *b, Py_ssize_t *len) {
    *len = PyBytes_GET_SIZE(b);
    unsigned char *out = PyMem_Malloc((size_t)*len + 1);
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, PyBytes_AS_STRING(b), (size_t)*len);
    return out;
}

static int plan_init(PlanObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"features", NULL};
    PyObject *features;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:ExamplePlan", kwlist, &features)) return -1;
    if (self->spec != NULL) {
        /* Another thread may be encoding with this plan, the GIL released. */
        PyErr_SetString(PyExc_TypeError, "an ExamplePlan is initialized once");
        return -1;
    }
    PyObject *seq = PySequence_Tuple(features);
    if (seq == NULL) return -1;
    Py_XSETREF(self->spec, seq);
    Py_ssize_t count = PyTuple_GET_SIZE(seq);
    if (count == 0) {
        PyErr_SetString(PyExc_ValueError, "an ExamplePlan needs at least one feature");
        return -1;
    }
    self->features = PyMem_Calloc((size_t)count, sizeof(Feature));
    if (self->features == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i);
        PyObject *key, *json_key, *kind, *deflt;
        int required;
        if (!PyTuple_Check(item) ||
            !PyArg_ParseTuple(item, "O!O!UpO:ExamplePlan feature", &PyBytes_Type, &key,
                              &PyBytes_Type, &json_key, &kind, &required, &deflt)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "each feature is a tuple (name, JSON key, kind, "
                                                 "required, default entry)");
            return -1;
        }
        Feature *f = &self->features[i];
        self->count = i + 1; /* what plan_free_features frees */
        if (PyUnicode_CompareWithASCIIString(kind, "int64") == 0) f->kind = KIND_INT64;
        else if (PyUnicode_CompareWithASCIIString(kind, "int64/s") == 0) {
            f->kind = KIND_INT64;
            f->per_second = 1;
        } else if (PyUnicode_CompareWithASCIIString(kind, "int64/ms") == 0) {
            f->kind = KIND_INT64;
            f->per_second = 1000;
        } else if (PyUnicode_CompareWithASCIIString(kind, "int64/us") == 0) {
            f->kind = KIND_INT64;
            f->per_second = 1000000;
        } else if (PyUnicode_CompareWithASCIIString(kind, "int64/ns") == 0) {
            f->kind = KIND_INT64;
            f->per_second = 1000000000;
        } else if (PyUnicode_CompareWithASCIIString(kind, "float") == 0) f->kind = KIND_FLOAT;
        else if (PyUnicode_CompareWithASCIIString(kind, "bytes") == 0) f->kind = KIND_BYTES;
        else {
            PyErr_Format(PyExc_ValueError, "unknown feature kind %R", kind);
            return -1;
        }
        f->required = required;
        if ((f->key = copy_bytes(key, &f->key_len)) == NULL) return -1;
        if ((f->json_key = copy_bytes(json_key, &f->json_key_len)) == NULL) return -1;
        if (deflt != Py_None) {
            if (!PyBytes_Check(deflt)) {
                PyErr_SetString(PyExc_TypeError, "a default entry is bytes or None");
                return -1;
            }
            if (required) {
                PyErr_SetString(PyExc_ValueError, "a required feature cannot have a default");
                return -1;
            }
            if ((f->default_entry = copy_bytes(deflt, &f->default_len)) == NULL) return -1;
        }
        f->head[0] = 0x0a;
        f->head_len = put_varint(f->head + 1, (uint64_t)f->key_len) - f->head;
    }
    qsort(self->features, (size_t)count, sizeof(Feature), compare_features);
    for (Py_ssize_t i = 1; i < count; i++) {
        if (compare_features(&self->features[i - 1], &self->features[i]) == 0) {
            PyObject *key = PyBytes_FromStringAndSize((char *)self->features[i].key,
                                                      self->features[i].key_len);
            if (key != NULL) {
                PyErr_Format(PyExc_ValueError, "feature key %R is declared twice", key);
                Py_DECREF(key);
            }
            return -1;
        }
    }
    uint32_t size = 8;
    while (size < 2 * (uint64_t)count) size *= 2;
    self->table = PyMem_Calloc(size, sizeof(int32_t));
    if (self->table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->mask = size - 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        const Feature *f = &self->features[i];
        uint32_t h = hash_key(f->json_key, (size_t)f->json_key_len) & self->mask;
        while (self->table[h] != 0) {
            const Feature *g = &self->features[self->table[h] - 1];
            if (g->json_key_len == f->json_key_len &&
                memcmp(g->json_key, f->json_key, (size_t)f->json_key_len) == 0) {
                PyErr_SetString(PyExc_ValueError, "two features read the same JSON key");
                return -1;
            }
            h = (h + 1) & self->mask;
        }
        self->table[h] = (int32_t)(i + 1);
    }
    return 0;
}

/* The first value of an int64 feature's payload (packed varints), or TIME_UNKNOWN. */
#define TIME_UNKNOWN INT64_MIN

static int64_t first_int64(const Parser *ps, Py_ssize_t i) {
    if (ps->slot[i] != SLOT_VALUE || ps->len[i] == 0) return TIME_UNKNOWN;
    const unsigned char *b = ps->payload.data + ps->off[i];
    uint64_t v = 0;
    for (size_t k = 0, shift = 0; k < ps->len[i] && k < 10; k++, shift += 7) {
        v |= (uint64_t)(b[k] & 0x7F) << shift;
        if (!(b[k] & 0x80)) return (int64_t)v;
    }
    return TIME_UNKNOWN;
}

/* What plan_encode notes of a payload encoded in C: its class and its time. The values are
 * compared as bytes, with the GIL released: `values` is a tuple of bytes, which nothing
 * changes. */
static void note(const Parser *ps, const Capture *cap, PyObject *values, Py_ssize_t k,
                 Py_ssize_t time_index, unsigned char *classes, int64_t *times, Py_ssize_t i) {
    if (cap != NULL) {
        unsigned char c = (unsigned char)k;
        if (cap->state == CAP_OTHER) {
            c = 255;
        } else if (cap->state == CAP_STRING) {
            size_t len = (size_t)(cap->stop - cap->start);
            for (Py_ssize_t j = 0; j < k; j++) {
                PyObject *v = PyTuple_GET_ITEM(values, j);
                if ((size_t)PyBytes_GET_SIZE(v) == len &&
                    memcmp(PyBytes_AS_STRING(v), cap->start, len) == 0) {
                    c = (unsigned char)j;
                    break;
                }
            }
        }
        classes[i] = c;
    }
    if (time_index >= 0) times[i] = first_int64(ps, time_index);
}

/* encode_batch, and with `cap` each payload's class by its captured value (as string_groups
 * classes them: the index of the value in `values`, k for another string or none, 255 for
 * Python to read) into *classes_out, and with time_index >= 0 the first value of that int64
 * feature (TIME_UNKNOWN where the record must be read) into *times_out. */
static PyObject *plan_encode(PlanObject *self, PyObject *payloads, Capture *cap,
                             PyObject *values, Py_ssize_t time_index, PyObject **classes_out,
                             PyObject **times_out) {
    if (self->features == NULL) {
        PyErr_SetString(PyExc_ValueError, "ExamplePlan is not initialized");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(payloads, "payloads must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t count = self->count;
    PyObject *result = NULL;
    PyObject **held = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    size_t *rec_off = PyMem_Malloc(((size_t)n + 1) * sizeof(size_t));
    size_t *rec_len = PyMem_Malloc(((size_t)n + 1) * sizeof(size_t));
    unsigned char *status = PyMem_Malloc((size_t)n + 1);
    unsigned char *classes = NULL;
    int64_t *times = NULL;
    Py_ssize_t k = values == NULL ? 0 : PyTuple_GET_SIZE(values);
    Parser ps = {0};
    Buf out = {0};
    ps.slot = PyMem_Malloc((size_t)count);
    ps.off = PyMem_Malloc((size_t)count * sizeof(size_t));
    ps.len = PyMem_Malloc((size_t)count * sizeof(size_t));
    if (held == NULL || rec_off == NULL || rec_len == NULL || status == NULL || ps.slot == NULL ||
        ps.off == NULL || ps.len == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Unset for the Python path: class 255, time unknown. */
    if (cap != NULL) {
        *classes_out = PyBytes_FromStringAndSize(NULL, n);
        if (*classes_out == NULL) goto done;
        classes = (unsigned char *)PyBytes_AS_STRING(*classes_out);
        memset(classes, 255, (size_t)n);
    }
    if (time_index >= 0) {
        *times_out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
        if (*times_out == NULL) goto done;
        times = (int64_t *)PyBytes_AS_STRING(*times_out);
        for (Py_ssize_t i = 0; i < n; i++) times[i] = TIME_UNKNOWN;
    }
    /* Hold each payload: the sequence may change while the GIL is released; bytes do not. */
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyBytes_Check(items[i])) {
            held[i] = Py_NewRef(items[i]);
            status[i] = ENC_OK;
        } else {
            status[i] = ENC_FALLBACK;
        }
    }
    int nomem = 0, retry = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !nomem; i++) {
        if (held[i] == NULL) continue;
        int r = encode_record(self, &ps, (const unsigned char *)PyBytes_AS_STRING(held[i]),
                              PyBytes_GET_SIZE(held[i]), &out, &rec_off[i], &rec_len[i], cap);
        status[i] = (unsigned char)r;
        if (r == ENC_OK) note(&ps, cap, values, k, time_index, classes, times, i);
        if (r == ENC_NOMEM) nomem = 1;
        if (r == ENC_RETRY) retry = 1;
    }
    Py_END_ALLOW_THREADS
    if (retry && !nomem) {
        ps.allow_slow = 1;
        for (Py_ssize_t i = 0; i < n && !nomem; i++) {
            if (status[i] != ENC_RETRY) continue;
            int r = encode_record(self, &ps, (const unsigned char *)PyBytes_AS_STRING(held[i]),
                                  PyBytes_GET_SIZE(held[i]), &out, &rec_off[i], &rec_len[i], cap);
            status[i] = (unsigned char)(r == ENC_RETRY ? ENC_FALLBACK : r);
            if (r == ENC_OK) note(&ps, cap, values, k, time_index, classes, times, i);
            if (r == ENC_NOMEM) nomem = 1;
        }
    }
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyList_New(n);
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item;
        if (status[i] == ENC_OK) {
            item = PyBytes_FromStringAndSize((const char *)out.data + rec_off[i],
                                             (Py_ssize_t)rec_len[i]);
            if (item == NULL) {
                Py_CLEAR(result);
                goto done;
            }
        } else {
            item = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(result, i, item);
    }
done:
    if (result == NULL && cap != NULL) Py_CLEAR(*classes_out);
    if (result == NULL && time_index >= 0) Py_CLEAR(*times_out);
    if (held != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(held[i]);
    }
    PyMem_Free(held);
    PyMem_Free(rec_off);
    PyMem_Free(rec_len);
    PyMem_Free(status);
    PyMem_Free(ps.slot);
    PyMem_Free(ps.off);
    PyMem_Free(ps.len);
    PyMem_RawFree(ps.payload.data);
    PyMem_RawFree(ps.text.data);
    PyMem_RawFree(out.data);
    Py_DECREF(seq);
    return result;
}

/* encode_routed's answer from plan_encode's: per class (each value, then another string or
 * none) its indexes, its records and their times (int64s, or None), and the indexes left to
 * Python. */
static PyObject *routed_groups(PyObject *records, PyObject *classes, PyObject *times,
                               Py_ssize_t k) {
    Py_ssize_t n = PyList_GET_SIZE(records);
    const unsigned char *cls = (const unsigned char *)PyBytes_AS_STRING(classes);
    const int64_t *at = times == NULL ? NULL : (const int64_t *)PyBytes_AS_STRING(times);
    Py_ssize_t *counts = PyMem_Calloc((size_t)k + 1, sizeof(Py_ssize_t));
    PyObject *groups = PyList_New(k + 1), *rest = PyList_New(0), *result = NULL;
    if (counts == NULL || groups == NULL || rest == NULL) {
        if (counts == NULL) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_GET_ITEM(records, i) != Py_None && cls[i] <= k) counts[cls[i]]++;
    }
    for (Py_ssize_t c = 0; c <= k; c++) {
        PyObject *idx = PyList_New(counts[c]), *recs = PyList_New(counts[c]), *ts = Py_None;
        if (idx != NULL && recs != NULL && at != NULL)
            ts = PyBytes_FromStringAndSize(NULL, counts[c] * (Py_ssize_t)sizeof(int64_t));
        else
            Py_INCREF(ts);
        PyObject *item = (idx && recs && ts) ? PyTuple_Pack(3, idx, recs, ts) : NULL;
        Py_XDECREF(idx);
        Py_XDECREF(recs);
        Py_XDECREF(ts);
        if (item == NULL) goto done;
        PyList_SET_ITEM(groups, c, item);
    }
    memset(counts, 0, ((size_t)k + 1) * sizeof(Py_ssize_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        PyObject *index = PyLong_FromSsize_t(i);
        if (index == NULL) goto done;
        if (record == Py_None || cls[i] > k) {
            int failed = PyList_Append(rest, index);
            Py_DECREF(index);
            if (failed < 0) goto done;
            continue;
        }
        PyObject *group = PyList_GET_ITEM(groups, cls[i]);
        Py_ssize_t j = counts[cls[i]]++;
        PyList_SET_ITEM(PyTuple_GET_ITEM(group, 0), j, index);
        PyList_SET_ITEM(PyTuple_GET_ITEM(group, 1), j, Py_NewRef(record));
        if (at != NULL) ((int64_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(group, 2)))[j] = at[i];
    }
    result = PyTuple_Pack(2, groups, rest);
done:
    PyMem_Free(counts);
    Py_XDECREF(groups);
    Py_XDECREF(rest);
    return result;
}

static PyObject *plan_encode_batch(PlanObject *self, PyObject *payloads) {
    return plan_encode(self, payloads, NULL, NULL, -1, NULL, NULL);
}

static PyObject *plan_encode_routed(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_routed(payloads, key, values, time_feature) takes 4 arguments");
        return NULL;
    }
    if (self->features == NULL) {
        PyErr_SetString(PyExc_ValueError, "ExamplePlan is not initialized");
        return NULL;
    }
    PyObject *key = args[1], *values = args[2], *time_name = args[3];
    if (!PyBytes_Check(key) || !PyTuple_Check(values) ||
        (time_name != Py_None && !PyBytes_Check(time_name))) {
        PyErr_SetString(PyExc_TypeError,
                        "key must be bytes, values a tuple of bytes, time_feature bytes or None");
        return NULL;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(values);
    if (k > 250) {
        PyErr_SetString(PyExc_ValueError, "at most 250 values");
        return NULL;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(values, j))) {
            PyErr_SetString(PyExc_TypeError, "values must be bytes");
            return NULL;
        }
    }
    Py_ssize_t time_index = -1;
    if (time_name != Py_None) {
        for (Py_ssize_t i = 0; i < self->count; i++) {
            const Feature *f = &self->features[i];
            if (f->kind == KIND_INT64 && f->key_len == PyBytes_GET_SIZE(time_name) &&
                memcmp(f->key, PyBytes_AS_STRING(time_name), (size_t)f->key_len) == 0) {
                time_index = i;
                break;
            }
        }
    }
    Capture cap = {(const unsigned char *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
                   CAP_MISSING, NULL, NULL};
    PyObject *classes = NULL, *times = NULL;
    PyObject *records = plan_encode(self, args[0], &cap, values, time_index, &classes,
                                    time_index >= 0 ? &times : NULL);
    if (records == NULL) return NULL;
    PyObject *result = routed_groups(records, classes, times, k);
    Py_DECREF(records);
    Py_DECREF(classes);
    Py_XDECREF(times);
    return result;
}

static PyObject *plan_reduce(PlanObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->spec == NULL) {
        PyErr_SetString(PyExc_ValueError, "ExamplePlan is not initialized");
        return NULL;
    }
    return Py_BuildValue("(O(O))", (PyObject *)Py_TYPE(self), self->spec);
}

static PyObject *plan_get_features(PlanObject *self, void *Py_UNUSED(closure)) {
    if (self->spec == NULL) return PyTuple_New(0);
    return Py_NewRef(self->spec);
}

static PyMethodDef plan_methods[] = {
    {"encode_batch", (PyCFunction)plan_encode_batch, METH_O,
     "encode_batch(payloads, /)\n--\n\n"
     "For each JSON payload, its serialized Example, or None: encode it the Python way."},
    {"encode_routed", (PyCFunction)(void (*)(void))plan_encode_routed, METH_FASTCALL,
     "encode_routed(payloads, key, values, time_feature, /)\n--\n\n"
     "encode_batch's records grouped by the string at a top-level key, with the first value "
     "of an int64 feature of each."},
    {"__reduce__", (PyCFunction)plan_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"features", (getter)plan_get_features, NULL, "The features as given to the constructor.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tfrecordd._cexample.ExamplePlan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ExamplePlan(features)\n--\n\n"
              "A compiled Example encoder for JSON payloads. features: (name, JSON key, kind, "
              "required, default entry) tuples; name and JSON key are UTF-8 bytes, kind is "
              "'int64', 'float', 'bytes' or 'int64/<unit>' (s, ms, us, ns: a timestamp), the "
              "default entry is the serialized map field "
              "written when the value is missing, or None.",
    .tp_methods = plan_methods,
    .tp_getset = plan_getset,
    .tp_init = (initproc)plan_init,
    .tp_new = PyType_GenericNew,
};

/* ---- Reading back: the first value of chosen features of serialized Examples ---------------
 *
 * first_values() reads what tfrecordd.format.features reads, the same way (its docstring says
 * how): protobuf's reading of the Example, its Features and their map entries, of the Feature
 * and value lists of the features asked for only, and of a list only up to its first value. A
 * record that is not well-formed there gives None, never an exception.
 */

#define READ_MAX_DEPTH 64

static int rd_varint(const unsigned char *b, size_t *i, size_t end, uint64_t *out) {
    uint64_t v = 0;
    for (int k = 0; k < 10; k++) {
        if (*i >= end) return -1;
        unsigned char c = b[(*i)++];
        v |= (uint64_t)(c & 0x7F) << (7 * k);
        if (c < 0x80) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Past the value of a field whose tag ended at *i (a group: past its end tag). */
static int rd_skip(const unsigned char *b, size_t *i, size_t end, uint64_t wire, uint64_t number,
                   int depth) {
    uint64_t v;
    switch (wire) {
    case 0:
        return rd_varint(b, i, end, &v);
    case 2:
        if (rd_varint(b, i, end, &v) < 0 || v > end - *i) return -1;
        *i += v;
        return 0;
    case 1:
    case 5: {
        size_t width = wire == 1 ? 8 : 4;
        if (width > end - *i) return -1;
        *i += width;
        return 0;
    }
    case 3:
        if (depth >= READ_MAX_DEPTH) return -1;
        for (;;) {
            uint64_t tag;
            if (rd_varint(b, i, end, &tag) < 0) return -1;
            if ((tag & 7) == 4) return (tag >> 3) == number ? 0 : -1;
            /* Field number 0 is let through in a group, as protobuf does. */
            if (tag > 0xFFFFFFFFu) return -1;
            if (rd_skip(b, i, end, tag & 7, tag >> 3, depth + 1) < 0) return -1;
        }
    default:
        return -1;
    }
}

typedef struct {
    uint64_t number, wire;
    size_t start, stop; /* wire type 2: the payload; others: the value's bytes */
} Field;

static int rd_field(const unsigned char *b, size_t *i, size_t end, Field *f) {
    uint64_t tag;
    if (rd_varint(b, i, end, &tag) < 0) return -1;
    f->number = tag >> 3;
    f->wire = tag & 7;
    if (f->number == 0 || tag > 0xFFFFFFFFu) return -1;
    if (f->wire == 2) {
        uint64_t n;
        if (rd_varint(b, i, end, &n) < 0 || n > end - *i) return -1;
        f->start = *i;
        *i += n;
        f->stop = *i;
        return 0;
    }
    f->start = *i;
    if (rd_skip(b, i, end, f->wire, f->number, 0) < 0) return -1;
    f->stop = *i;
    return 0;
}

/* A feature's first value, read without Python objects: its kind (1 bytes, 2 float, 3 int64)
 * and the value (bytes: its span in the record). */
typedef struct {
    uint64_t kind;
    int64_t i;
    float f;
    size_t start, stop;
} RdValue;

/* The first value of a value list of kind `kind` in b[start:stop]: 1 and *out set, 0 when the
 * list holds none, -1 when it is malformed before its first value. */
static int rd_list_first(const unsigned char *b, size_t start, size_t stop, uint64_t kind,
                         RdValue *out) {
    size_t i = start;
    Field f;
    out->kind = kind;
    while (i < stop) {
        if (rd_field(b, &i, stop, &f) < 0) return -1;
        if (f.number != 1) continue;
        if (kind == 3 && (f.wire == 0 || (f.wire == 2 && f.start < f.stop))) {
            uint64_t v;
            size_t at = f.start;
            if (rd_varint(b, &at, f.wire == 2 ? f.stop : stop, &v) < 0) return -1;
            out->i = (int64_t)v;
            return 1;
        }
        if (kind == 1 && f.wire == 2) {
            out->start = f.start;
            out->stop = f.stop;
            return 1;
        }
        if (kind == 2 && (f.wire == 5 || f.wire == 2)) {
            if (f.wire == 2 && (f.stop - f.start) % 4) return -1;
            if (f.start < f.stop) {
                const unsigned char *p = b + f.start;
                uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                (uint32_t)p[3] << 24;
                memcpy(&out->f, &bits, sizeof out->f);
                return 1;
            }
        }
    }
    return 0;
}

/* The first value of the Feature merged from the value fields of the map entry b[start:stop]
 * (a kind given again replaces the one before; lists of one kind follow each other): 1 and
 * *out set, 0 for none, -1 when malformed. */
static int rd_entry_first(const unsigned char *b, size_t start, size_t stop, RdValue *out) {
    uint64_t kind = 0;
    size_t run = 0; /* where the last run of one kind starts */
    Field e, f;
    for (int pass = 0; pass < 2; pass++) {
        size_t i = start;
        while (i < stop) {
            if (rd_field(b, &i, stop, &e) < 0) return -1;
            if (e.number != 2 || e.wire != 2) continue;
            size_t j = e.start;
            while (j < e.stop) {
                size_t at = j;
                if (rd_field(b, &j, e.stop, &f) < 0) return -1;
                if (f.wire != 2 || f.number < 1 || f.number > 3) continue;
                if (pass == 0) {
                    if (f.number != kind) {
                        kind = f.number;
                        run = at;
                    }
                } else if (at >= run) {
                    int got = rd_list_first(b, f.start, f.stop, kind, out);
                    if (got != 0) return got;
                }
            }
        }
        if (kind == 0) return 0;
    }
    return 0;
}

/* The map entries of the features `names` (UTF-8, `count` of them) in the Example b[0:n]:
 * found[k] is the span of the entry of names[k], plus one at its end (0 where it has none).
 * -1 when the record is not well-formed. Reads no Python object: runs without the GIL. */
static int rd_find(const unsigned char *b, size_t n, const char *const *names,
                   const size_t *name_lens, Py_ssize_t count, size_t (*found)[2]) {
    for (Py_ssize_t k = 0; k < count; k++) found[k][0] = found[k][1] = 0;
    size_t i = 0;
    Field x, y, z;
    while (i < n) {
        if (rd_field(b, &i, n, &x) < 0) return -1;
        if (x.number != 1 || x.wire != 2) continue;
        size_t j = x.start;
        while (j < x.stop) {
            if (rd_field(b, &j, x.stop, &y) < 0) return -1;
            if (y.number != 1 || y.wire != 2) continue;
            size_t q = y.start, key = 0, key_len = 0;
            int unknown = 0;
            while (q < y.stop) {
                if (rd_field(b, &q, y.stop, &z) < 0) return -1;
                if (z.wire == 2 && z.number == 1) {
                    key = z.start;
                    key_len = z.stop - z.start;
                } else if (z.wire != 2 || z.number != 2) {
                    unknown = 1;
                }
            }
            if (unknown) continue;
            for (Py_ssize_t k = 0; k < count; k++) {
                if (name_lens[k] == key_len && memcmp(names[k], b + key, key_len) == 0) {
                    found[k][0] = y.start;
                    found[k][1] = y.stop + 1; /* +1: 0 stays "not found" */
                    break;
                }
            }
        }
    }
    return 0;
}

/* The first value of feature k of a record rd_find read: 1 and *out set, 0 for none, -1 when
 * malformed. */
static inline int rd_value(const unsigned char *b, const size_t (*found)[2], Py_ssize_t k,
                           RdValue *out) {
    return found[k][1] ? rd_entry_first(b, found[k][0], found[k][1] - 1, out) : 0;
}

static PyObject *rd_object(const unsigned char *b, const RdValue *v) {
    if (v->kind == 3) return PyLong_FromLongLong((long long)v->i);
    if (v->kind == 2) return PyFloat_FromDouble((double)v->f);
    return PyBytes_FromStringAndSize((const char *)b + v->start, (Py_ssize_t)(v->stop - v->start));
}

/* One record's row (a tuple, one value or None per name) or None when it is malformed; NULL on
 * a memory error. `found` is scratch space for one entry span per name. */
static PyObject *rd_record(const unsigned char *b, size_t n, const char *const *names,
                           const size_t *name_lens, Py_ssize_t count, size_t (*found)[2]) {
    if (rd_find(b, n, names, name_lens, count, found) < 0) Py_RETURN_NONE;
    PyObject *row = PyTuple_New(count);
    if (row == NULL) return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        RdValue v;
        int got = rd_value(b, found, k, &v);
        if (got < 0) {
            Py_DECREF(row);
            Py_RETURN_NONE;
        }
        PyObject *value = got ? rd_object(b, &v) : Py_NewRef(Py_None);
        if (value == NULL) {
            Py_DECREF(row);
            return NULL;
        }
        PyTuple_SET_ITEM(row, k, value);
    }
    return row;
}

static PyObject *first_values(PyObject *Py_UNUSED(module), PyObject *const *args,
                              Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "first_values(records, names) takes 2 arguments");
        return NULL;
    }
    /* Tuples, not PySequence_Fast: a list given in could be changed by code a garbage
     * collection runs (a finalizer) while the rows below are allocated, freeing the items read;
     * a tuple of our own holds every item alive and never changes. */
    PyObject *records = PySequence_Tuple(args[0]);
    if (records == NULL) return NULL;
    PyObject *names = PySequence_Tuple(args[1]);
    if (names == NULL) {
        Py_DECREF(records);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(names), total = PySequence_Fast_GET_SIZE(records);
    PyObject *const *name_items = PySequence_Fast_ITEMS(names);
    PyObject *result = NULL;
    size_t(*found)[2] = PyMem_Malloc(sizeof *found * (size_t)(count ? count : 1));
    const char **name_ptrs = PyMem_Malloc(sizeof *name_ptrs * (size_t)(count ? count : 1));
    size_t *name_lens = PyMem_Malloc(sizeof *name_lens * (size_t)(count ? count : 1));
    if (found == NULL || name_ptrs == NULL || name_lens == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        if (!PyBytes_Check(name_items[k])) {
            PyErr_SetString(PyExc_TypeError, "names must be bytes");
            goto done;
        }
        name_ptrs[k] = PyBytes_AS_STRING(name_items[k]);
        name_lens[k] = (size_t)PyBytes_GET_SIZE(name_items[k]);
    }
    result = PyList_New(total);
    if (result == NULL) goto done;
    for (Py_ssize_t r = 0; r < total; r++) {
        PyObject *record = PySequence_Fast_GET_ITEM(records, r);
        if (!PyBytes_Check(record)) {
            PyErr_SetString(PyExc_TypeError, "records must be bytes");
            Py_CLEAR(result);
            goto done;
        }
        PyObject *row = rd_record((const unsigned char *)PyBytes_AS_STRING(record),
                                  (size_t)PyBytes_GET_SIZE(record), name_ptrs, name_lens, count,
                                  found);
        if (row == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, r, row);
    }
done:
    PyMem_Free(found);
    PyMem_Free(name_ptrs);
    PyMem_Free(name_lens);
    Py_DECREF(records);
    Py_DECREF(names);
    return result;
}

/* ---- Routing: JSON payloads grouped by one top-level string (a route's field) -------------- */

/* The value of the top-level key `key` of the JSON object in [data, data + size): ENC_OK with
 * its raw content in [*vs, *ve) and *vesc telling whether it holds escapes, when the whole
 * payload is an object this parser validates and the key is there once with a string. Anything
 * else (another value, a key missing or repeated, not JSON, too deep) is ENC_FALLBACK: Python
 * reads that payload. */
static int find_string(Parser *ps, const unsigned char *data, Py_ssize_t size,
                       const unsigned char *key, size_t key_len, size_t *vs, size_t *ve,
                       int *vesc) {
    int r, found = 0;
    ps->p = data;
    ps->end = data + size;
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '{') return ENC_FALLBACK;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
    } else {
        for (;;) {
            if (ps->p >= ps->end || *ps->p != '"') return ENC_FALLBACK;
            const unsigned char *s, *e;
            int esc, match;
            if ((r = scan_string(ps, &s, &e, &esc)) != ENC_OK) return r;
            if (!esc) {
                match = (size_t)(e - s) == key_len && memcmp(s, key, key_len) == 0;
            } else {
                ps->text.len = 0;
                if ((r = decode_escaped(s, e, &ps->text)) != ENC_OK) return r;
                match = ps->text.len == key_len && memcmp(ps->text.data, key, key_len) == 0;
            }
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return ENC_FALLBACK;
            ps->p++;
            skip_ws(ps);
            if (match) {
                if (found || ps->p >= ps->end || *ps->p != '"') return ENC_FALLBACK;
                if ((r = scan_string(ps, &s, &e, vesc)) != ENC_OK) return r;
                *vs = (size_t)(s - data);
                *ve = (size_t)(e - data);
                found = 1;
            } else if ((r = skip_value(ps, 1)) != ENC_OK) {
                return r;
            }
            if ((r = after_item(ps, '}')) == ITEM_MORE) continue;
            if (r == ITEM_DONE) break;
            return r;
        }
    }
    skip_ws(ps);
    if (ps->p != ps->end) return ENC_FALLBACK;
    return found ? ENC_OK : ENC_FALLBACK;
}

/* ---- lax_find: a top-level key's string value, the rest skipped, not validated ------------
 *
 * For a route whose every dataset's encoder parses the whole payload anyway (and fails it as
 * malformed when it is not JSON): the route needs only its key's value, and Python checks the
 * payloads that end up in no dataset. What lax_find accepts of a valid JSON object is what
 * find_string accepts, with the same value; an escaped key or value, a key given twice, or a
 * structure it cannot follow is left to Python as there. */

/* Past the closing quote of the string whose opening quote is at p, NULL if it has none;
 * *esc set when it holds a backslash. */
static const unsigned char *lax_string(const unsigned char *p, const unsigned char *end,
                                       int *esc) {
    p++;
    for (;;) {
        const unsigned char *q = memchr(p, '"', (size_t)(end - p));
        if (q == NULL) return NULL;
        const unsigned char *b = memchr(p, '\\', (size_t)(q - p));
        if (b == NULL) return q + 1;
        *esc = 1;
        p = b + 2;
        if (p > end) return NULL;
    }
}

static inline const unsigned char *lax_ws(const unsigned char *p, const unsigned char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* Past the value at p: a string, a container (strings in it skipped whole, brackets counted),
 * or a scalar (up to the next delimiter); NULL where it cannot be followed. */
static const unsigned char *lax_value(const unsigned char *p, const unsigned char *end) {
    if (p >= end) return NULL;
    unsigned char c = *p;
    int esc = 0;
    if (c == '"') return lax_string(p, end, &esc);
    if (c == '{' || c == '[') {
        int depth = 0;
        while (p < end) {
            c = *p;
            if (c == '"') {
                p = lax_string(p, end, &esc);
                if (p == NULL) return NULL;
                continue;
            }
            if (c == '{' || c == '[') {
                if (++depth > MAX_DEPTH) return NULL;
            } else if (c == '}' || c == ']') {
                if (--depth == 0) return p + 1;
            }
            p++;
        }
        return NULL;
    }
    const unsigned char *s = p;
    while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n' &&
           *p != '\r' && *p != '\t')
        p++;
    return p == s ? NULL : p;
}

/* find_string's answer, the rest of the payload skipped as lax_value skips it. */
static int lax_find(const unsigned char *data, Py_ssize_t size, const unsigned char *key,
                    size_t key_len, size_t *vs, size_t *ve, int *vesc) {
    const unsigned char *p = data, *end = data + size;
    int found = 0;
    p = lax_ws(p, end);
    if (p >= end || *p != '{') return ENC_FALLBACK;
    p = lax_ws(p + 1, end);
    if (p < end && *p == '}') {
        p++;
    } else {
        for (;;) {
            if (p >= end || *p != '"') return ENC_FALLBACK;
            int esc = 0;
            const unsigned char *ks = p + 1;
            const unsigned char *q = lax_string(p, end, &esc);
            if (q == NULL || esc) return ENC_FALLBACK;
            int match = (size_t)(q - 1 - ks) == key_len && memcmp(ks, key, key_len) == 0;
            p = lax_ws(q, end);
            if (p >= end || *p != ':') return ENC_FALLBACK;
            p = lax_ws(p + 1, end);
            if (match) {
                if (found || p >= end || *p != '"') return ENC_FALLBACK;
                *vesc = 0;
                q = lax_string(p, end, vesc);
                if (q == NULL) return ENC_FALLBACK;
                *vs = (size_t)(p + 1 - data);
                *ve = (size_t)(q - 1 - data);
                found = 1;
                p = q;
            } else {
                p = lax_value(p, end);
                if (p == NULL) return ENC_FALLBACK;
            }
            p = lax_ws(p, end);
            if (p < end && *p == ',') {
                p = lax_ws(p + 1, end);
                continue;
            }
            if (p < end && *p == '}') {
                p++;
                break;
            }
            return ENC_FALLBACK;
        }
    }
    p = lax_ws(p, end);
    if (p != end) return ENC_FALLBACK;
    return found ? ENC_OK : ENC_FALLBACK;
}

enum { LINEAR_VALUES = 8 };

/* The class of each payload, as string_groups returns them: the index of its value in `values`,
 * k for another string, k + 1 for Python to read. */
static Py_ssize_t value_class(const unsigned char *s, size_t len, PyObject *values,
                              PyObject *table, Py_ssize_t k) {
    if (table == NULL) {
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *v = PyTuple_GET_ITEM(values, j);
            if ((size_t)PyBytes_GET_SIZE(v) == len && memcmp(PyBytes_AS_STRING(v), s, len) == 0)
                return j;
        }
        return k;
    }
    PyObject *text = PyBytes_FromStringAndSize((const char *)s, (Py_ssize_t)len);
    if (text == NULL) return -1;
    PyObject *j = PyDict_GetItemWithError(table, text);
    Py_DECREF(text);
    if (j == NULL) return PyErr_Occurred() ? -1 : k;
    return PyLong_AsSsize_t(j);
}

static PyObject *string_groups(PyObject *Py_UNUSED(module), PyObject *const *args,
                               Py_ssize_t nargs) {
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "string_groups(payloads, key, values, lax=False) takes 3 or 4 arguments");
        return NULL;
    }
    if (!PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "key must be bytes");
        return NULL;
    }
    int lax = nargs == 4 ? PyObject_IsTrue(args[3]) : 0;
    if (lax < 0) return NULL;
    PyObject *values = PySequence_Tuple(args[2]);
    if (values == NULL) return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(values);
    PyObject *table = NULL, *result = NULL, *key = NULL, *payloads = NULL;
    size_t *span = NULL;
    unsigned char *status = NULL;
    Parser ps = {0};
    for (Py_ssize_t j = 0; j < k; j++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(values, j))) {
            PyErr_SetString(PyExc_TypeError, "values must be bytes");
            goto done;
        }
    }
    if (k > LINEAR_VALUES) {
        if ((table = PyDict_New()) == NULL) goto done;
        for (Py_ssize_t j = k - 1; j >= 0; j--) { /* the first of a value given twice wins */
            PyObject *index = PyLong_FromSsize_t(j);
            if (index == NULL || PyDict_SetItem(table, PyTuple_GET_ITEM(values, j), index) < 0) {
                Py_XDECREF(index);
                goto done;
            }
            Py_DECREF(index);
        }
    }
    /* A tuple of our own holds every payload alive while the GIL is released (first_values
     * says why not PySequence_Fast). */
    if ((payloads = PySequence_Tuple(args[0])) == NULL) goto done;
    key = Py_NewRef(args[1]);
    Py_ssize_t n = PyTuple_GET_SIZE(payloads);
    span = PyMem_Malloc(((size_t)n + 1) * 2 * sizeof(size_t));
    status = PyMem_Malloc((size_t)n + 1);
    if (span == NULL || status == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        status[i] = PyBytes_Check(PyTuple_GET_ITEM(payloads, i)) ? ENC_OK : ENC_FALLBACK;
    const unsigned char *kp = (const unsigned char *)PyBytes_AS_STRING(key);
    size_t klen = (size_t)PyBytes_GET_SIZE(key);
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !nomem; i++) {
        if (status[i] != ENC_OK) continue;
        PyObject *item = PyTuple_GET_ITEM(payloads, i);
        int esc = 0;
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(item);
        Py_ssize_t size = PyBytes_GET_SIZE(item);
        int r = lax ? lax_find(data, size, kp, klen, &span[2 * i], &span[2 * i + 1], &esc)
                    : find_string(&ps, data, size, kp, klen, &span[2 * i], &span[2 * i + 1],
                                  &esc);
        if (r == ENC_NOMEM) nomem = 1;
        /* A value with escapes is left to Python, as rare as it is. */
        status[i] = (unsigned char)(r == ENC_OK && !esc ? ENC_OK : ENC_FALLBACK);
    }
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }
    if ((result = PyList_New(k + 2)) == NULL) goto done;
    for (Py_ssize_t j = 0; j < k + 2; j++) {
        PyObject *group = PyList_New(0);
        if (group == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, j, group);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t c = k + 1;
        if (status[i] == ENC_OK) {
            const unsigned char *data =
                (const unsigned char *)PyBytes_AS_STRING(PyTuple_GET_ITEM(payloads, i));
            c = value_class(data + span[2 * i], span[2 * i + 1] - span[2 * i], values, table, k);
        }
        PyObject *index = c < 0 ? NULL : PyLong_FromSsize_t(i);
        if (index == NULL || PyList_Append(PyList_GET_ITEM(result, c), index) < 0) {
            Py_XDECREF(index);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(index);
    }
done:
    PyMem_Free(span);
    PyMem_Free(status);
    PyMem_RawFree(ps.payload.data);
    PyMem_RawFree(ps.text.data);
    Py_XDECREF(key);
    Py_XDECREF(payloads);
    Py_XDECREF(table);
    Py_DECREF(values);
    return result;
}

/* ---- time_groups: records grouped by the UTC hour of an int64 time ------------------------- */

static long long floor_div(long long a, long long b) { /* b > 0 */
    long long q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

typedef struct {
    long long hour, low, high;
    PyObject *indexes; /* a new list */
} HourGroup;

enum { LINEAR_HOURS = 32 };

/* The index in *groups of the group of `hour`, a new one (first and last `value`) made at the
 * end if there is none; -1 on a memory error. Past LINEAR_HOURS groups a dict (*table, hour to
 * index) finds them, so a batch of thousands of distinct hours still takes linear time. */
static Py_ssize_t hour_group(HourGroup **groups, Py_ssize_t *used, Py_ssize_t *cap,
                             PyObject **table, long long hour, long long value) {
    Py_ssize_t n = *used;
    PyObject *key = NULL;
    if (*table == NULL) {
        for (Py_ssize_t g = 0; g < n; g++)
            if ((*groups)[g].hour == hour) return g;
    } else {
        if ((key = PyLong_FromLongLong(hour)) == NULL) return -1;
        PyObject *at = PyDict_GetItemWithError(*table, key);
        if (at != NULL || PyErr_Occurred()) {
            Py_DECREF(key);
            return at != NULL ? PyLong_AsSsize_t(at) : -1;
        }
    }
    if (n == *cap) {
        HourGroup *more = PyMem_Realloc(*groups, sizeof *more * (size_t)*cap * 2);
        if (more == NULL) {
            Py_XDECREF(key);
            PyErr_NoMemory();
            return -1;
        }
        *groups = more;
        *cap *= 2;
    }
    PyObject *indexes = PyList_New(0);
    if (indexes == NULL) {
        Py_XDECREF(key);
        return -1;
    }
    (*groups)[n] = (HourGroup){hour, value, value, indexes};
    *used = n + 1;
    Py_ssize_t first = n; /* the groups the dict is yet to hold: the new one, or all of them */
    if (*table == NULL) {
        if (*used <= LINEAR_HOURS) return n;
        if ((*table = PyDict_New()) == NULL) return -1;
        first = 0;
    }
    Py_XDECREF(key);
    for (Py_ssize_t g = first; g < *used; g++) {
        PyObject *h = PyLong_FromLongLong((*groups)[g].hour), *at = PyLong_FromSsize_t(g);
        int bad = h == NULL || at == NULL || PyDict_SetItem(*table, h, at) < 0;
        Py_XDECREF(h);
        Py_XDECREF(at);
        if (bad) return -1;
    }
    return n;
}

static PyObject *time_groups(PyObject *Py_UNUSED(module), PyObject *const *args,
                             Py_ssize_t nargs) {
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "time_groups(records, name, per_second, known=None) takes 3 or 4 arguments");
        return NULL;
    }
    PyObject *known = nargs == 4 && args[3] != Py_None ? args[3] : NULL;
    if (known != NULL && !PyBytes_Check(known)) {
        PyErr_SetString(PyExc_TypeError, "known must be bytes or None");
        return NULL;
    }
    if (!PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "name must be bytes");
        return NULL;
    }
    long long per_second = PyLong_AsLongLong(args[2]);
    if (per_second == -1 && PyErr_Occurred()) return NULL;
    if (per_second <= 0) {
        PyErr_SetString(PyExc_ValueError, "per_second must be positive");
        return NULL;
    }
    /* A tuple of our own, as first_values says why. */
    PyObject *records = PySequence_Tuple(args[0]);
    if (records == NULL) return NULL;
    PyObject *slow = NULL, *result = NULL, *table = NULL;
    Py_ssize_t total = PyTuple_GET_SIZE(records), used = 0, cap = 32, last = -1;
    const char *name = PyBytes_AS_STRING(args[1]);
    size_t name_len = (size_t)PyBytes_GET_SIZE(args[1]);
    HourGroup *groups = PyMem_Malloc(sizeof *groups * (size_t)cap);
    int64_t *values = PyMem_Malloc(sizeof *values * (size_t)(total ? total : 1));
    unsigned char *fast = PyMem_Malloc((size_t)(total ? total : 1));
    if (groups == NULL || values == NULL || fast == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < total; r++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(records, r))) {
            PyErr_SetString(PyExc_TypeError, "records must be bytes");
            goto done;
        }
    }
    if (known != NULL && PyBytes_GET_SIZE(known) != total * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "known must hold one int64 per record");
        goto done;
    }
    const int64_t *given = known == NULL ? NULL : (const int64_t *)PyBytes_AS_STRING(known);
    /* Each record's time is read with the GIL released; the groups are made after. */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < total; r++) {
        if (given != NULL && given[r] != TIME_UNKNOWN) {
            fast[r] = 1;
            values[r] = given[r];
            continue;
        }
        PyObject *record = PyTuple_GET_ITEM(records, r);
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(record);
        size_t found[1][2];
        RdValue v;
        fast[r] = rd_find(b, (size_t)PyBytes_GET_SIZE(record), &name, &name_len, 1, found) == 0 &&
                  rd_value(b, found, 0, &v) == 1 && v.kind == 3;
        values[r] = fast[r] ? v.i : 0;
    }
    Py_END_ALLOW_THREADS
    if ((slow = PyList_New(0)) == NULL) goto done;
    for (Py_ssize_t r = 0; r < total; r++) {
        PyObject *index = PyLong_FromSsize_t(r);
        if (index == NULL) goto done;
        PyObject *into = slow;
        if (fast[r]) {
            long long value = values[r];
            long long hour = floor_div(floor_div(value, per_second), 3600);
            if (last < 0 || groups[last].hour != hour) {
                last = hour_group(&groups, &used, &cap, &table, hour, value);
                if (last < 0) {
                    Py_DECREF(index);
                    goto done;
                }
            }
            HourGroup *g = &groups[last];
            if (value < g->low) g->low = value;
            if (value > g->high) g->high = value;
            into = g->indexes;
        }
        int failed = PyList_Append(into, index);
        Py_DECREF(index);
        if (failed < 0) goto done;
    }
    PyObject *out = PyList_New(used);
    if (out == NULL) goto done;
    for (Py_ssize_t g = 0; g < used; g++) {
        PyObject *item = Py_BuildValue("(LOLL)", groups[g].hour, groups[g].indexes,
                                       groups[g].low, groups[g].high);
        if (item == NULL) {
            Py_DECREF(out);
            goto done;
        }
        PyList_SET_ITEM(out, g, item);
    }
    result = PyTuple_Pack(2, out, slow);
    Py_DECREF(out);
done:
    for (Py_ssize_t g = 0; g < used; g++) Py_DECREF(groups[g].indexes);
    PyMem_Free(groups);
    PyMem_Free(values);
    PyMem_Free(fast);
    Py_XDECREF(table);
    Py_XDECREF(slow);
    Py_DECREF(records);
    return result;
}

static PyMethodDef module_methods[] = {
    {"first_values", (PyCFunction)(void (*)(void))first_values, METH_FASTCALL,
     "first_values(records, names, /)\n--\n\n"
     "For each serialized Example of records (bytes), the first value of each feature of names "
     "(bytes), None where absent or empty, in a tuple; None for a record that is not "
     "well-formed."},
    {"string_groups", (PyCFunction)(void (*)(void))string_groups, METH_FASTCALL,
     "string_groups(payloads, key, values, lax=False, /)\n--\n\n"
     "The indexes of payloads (bytes) grouped by the string at the top-level key (bytes, "
     "UTF-8) of the JSON object each holds: a list for each of values (bytes), then one for "
     "another string, then one for payloads Python must read (not a JSON object this parser "
     "validates, the key missing or repeated, its value no string or one with escapes). With "
     "lax, the rest of each payload is skipped, not validated."},
    {"time_groups", (PyCFunction)(void (*)(void))time_groups, METH_FASTCALL,
     "time_groups(records, name, per_second, known=None, /)\n--\n\n"
     "Serialized Examples grouped by the UTC hour of the first value of their int64 feature "
     "name (bytes), a time in 1/per_second seconds: a list of (hour, indexes, lowest value, "
     "highest value) in order of first appearance, and the indexes of the records whose value "
     "is not an int64 (missing, of another kind, or not well-formed). known: each record's "
     "value where it is known (native int64s, the lowest int64 where it must be read)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_cexample",
    .m_doc = "JSON payloads to serialized tf.train.Example records, for schemas of plain features; "
             "chosen features' first values read back from serialized Examples; JSON payloads "
             "grouped by one top-level string (a route's field), serialized Examples by the UTC "
             "hour of an int64 time (a partition's).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__cexample(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "ExamplePlan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
