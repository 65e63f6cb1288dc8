/*
 * rmqha.store._speedups: the commit-log codec's hot loops, compiled.
 *
 * rmqha/store/_record.py is the reference codec and stays the judge: every
 * function here either answers exactly what the pure-Python code would
 * answer in the common case (a valid record, a message that encodes), or
 * says "not sure" (0 / None), and _record.py then runs its own code for that
 * record, which produces the result or the error with its reason.  So the
 * errors and their texts can only ever come from the Python code, and this
 * file has no error text to keep in step.
 *
 * Every read is bounds-checked against the buffer's length, whatever the
 * lengths inside the bytes say.  No threads; the GIL is held throughout but
 * by crc32() over a big buffer (read-only, under its buffer export).
 * Every integer on disk is big-endian and signed (Java's ByteBuffer).
 *
 * Two pieces here are not codec: Prefault (pages faulted in ahead of the
 * puts, on a thread of its own) and the SIGBUS guard of the segment
 * mappings (guard_add: a segment file truncated under the process must not
 * kill it; see the guard's own comment and docs/store.md).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAGIC_V1 ((int32_t)-626843481)
#define MAGIC_V2 ((int32_t)-626843477)
#define BLANK_MAGIC ((int32_t)-875286124)
#define MIN_FIXED 91          /* _record._MIN_FIXED */
#define BODY_LENGTH_AT 84     /* _record._BODY_LENGTH_AT (IPv4 hosts) */
#define BORNHOST_V6 0x10
#define STOREHOST_V6 0x20
#define MAX_PROPERTIES_LENGTH 32767

/* Faults the SIGBUS guard has absorbed, in all mappings (see below): a put
 * that saw it move declines its result. */
static unsigned long guard_fault_count;

static inline unsigned long
guard_faults_now(void)
{
    return __atomic_load_n(&guard_fault_count, __ATOMIC_ACQUIRE);
}

static inline int32_t
rd32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
                     ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

static inline int16_t
rd16(const unsigned char *p)
{
    return (int16_t)(((uint16_t)p[0] << 8) | (uint16_t)p[1]);
}

static inline int64_t
rd64(const unsigned char *p)
{
    return (int64_t)(((uint64_t)(uint32_t)rd32(p) << 32) | (uint64_t)(uint32_t)rd32(p + 4));
}

static inline void
wr32(unsigned char *p, int64_t v)
{
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)(u >> 24);
    p[1] = (unsigned char)(u >> 16);
    p[2] = (unsigned char)(u >> 8);
    p[3] = (unsigned char)u;
}

static inline void
wr64(unsigned char *p, int64_t v)
{
    uint64_t u = (uint64_t)v;
    wr32(p, (int64_t)(uint32_t)(u >> 32));
    wr32(p + 4, (int64_t)(uint32_t)u);
}

/* -- CRC-32 ----------------------------------------------------------------
 *
 * RocketMQ's body CRC (java.util.zip.CRC32) and the checked framing's CRC are
 * zlib's CRC-32: the reflected IEEE polynomial 0x104C11DB7.  zlib 1.2.13
 * computes it a few bytes per cycle (~1.8 GB/s here); on x86-64 with
 * PCLMULQDQ this folds 64 bytes per step with carry-less multiplications,
 * memory-bound instead.  The method is Intel's "Fast CRC Computation for
 * Generic Polynomials Using PCLMULQDQ Instruction" (Gopal et al., 2009), in
 * the form of Chromium's zlib crc32_simd.c / Linux's crc32-pclmul_asm.S:
 * four 128-bit lanes folded forward by 512 bits (constants k1, k2), reduced
 * to one lane (k3, k4), folded by 128 bits over what remains in 16-byte
 * steps (inputs under 64 bytes: one lane from the start), then 128 -> 64
 * bits (k5) and a Barrett reduction to 32 bits.  The
 * constants are x^n mod P(x) for the fold distances, bit-reflected, from
 * the paper's appendix.
 *
 * The folding runs only on CPUs that have PCLMULQDQ and SSE4.1 (checked once
 * at import, __builtin_cpu_supports), on the first len & ~15 bytes when there
 * are at least CRC_FOLD_MIN; the rest (and everything on other CPUs) goes to zlib's
 * crc32, which both continue from.  The functions using the instructions
 * are compiled for them alone (the target attribute), so the module builds
 * for, and runs on, any x86-64 or other CPU.  tests/test_speedups.py proves
 * the results equal to zlib.crc32 on both paths.
 */

static uint32_t
crc32_zlib(uint32_t crc, const unsigned char *p, size_t length)
{
    /* zlib's crc32 takes a uInt length: feed it in pieces. */
    while (length > 0) {
        uInt piece = length > 0x40000000 ? 0x40000000 : (uInt)length;
        crc = (uint32_t)crc32(crc, p, piece);
        p += piece;
        length -= piece;
    }
    return crc;
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define HAVE_CLMUL 1
#include <immintrin.h>

/* x^(512+64) mod P, x^(512) mod P (fold by 4 lanes); x^(128+64), x^128
 * (fold by 1 lane); x^64 (128 -> 64 bits); P' and mu for Barrett. */
#define K1K2 _mm_set_epi64x(0x01c6e41596, 0x0154442bd4)
#define K3K4 _mm_set_epi64x(0x00ccaa009e, 0x01751997d0)

/*
 * The CRC register after the four lanes x1..x4 (the state of the 64 bytes
 * before p) are folded into one and the n bytes at p (a multiple of 16)
 * folded in; n may be 0.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc32_fold_rest(__m128i x1, __m128i x2, __m128i x3, __m128i x4, const unsigned char *p, size_t n);

/*
 * The CRC register after one lane x1 (the state of the 16 bytes before p),
 * the n bytes at p (a multiple of 16) folded in, then reduced to 32 bits.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc32_fold_one(__m128i x1, const unsigned char *p, size_t n)
{
    const __m128i k3k4 = K3K4;
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x2, t;

#define FOLD128(x, next)                                       \
    t = _mm_clmulepi64_si128(x, k3k4, 0x00);                   \
    x = _mm_clmulepi64_si128(x, k3k4, 0x11);                   \
    x = _mm_xor_si128(_mm_xor_si128(x, t), next);
    while (n >= 16) {
        FOLD128(x1, _mm_loadu_si128((const __m128i *)p))
        p += 16;
        n -= 16;
    }
    /* 128 -> 96 -> 64 bits. */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits. */
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, low32), poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc32_fold_rest(__m128i x1, __m128i x2, __m128i x3, __m128i x4, const unsigned char *p, size_t n)
{
    const __m128i k1k2 = K1K2;
    const __m128i k3k4 = K3K4;
    __m128i y1, y2, y3, y4, t;

    /* Four lanes, each folded 512 bits forward onto the next 64 bytes. */
    while (n >= 64) {
        y1 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        y2 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        y3 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        y4 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, y1), _mm_loadu_si128((const __m128i *)p));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, y2), _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, y3), _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, y4), _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    /* The four lanes into one, 128 bits at a time, then the 16-byte rest. */
    FOLD128(x1, x2)
    FOLD128(x1, x3)
    FOLD128(x1, x4)
    return crc32_fold_one(x1, p, n);
}

/*
 * The CRC register (zlib's value, complemented) after the n bytes at p:
 * n >= 16 and a multiple of 16.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t
crc32_fold(uint32_t crc, const unsigned char *p, size_t n)
{
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));

    if (n < 64)
        return crc32_fold_one(x1, p + 16, n - 16);
    return crc32_fold_rest(
        x1,
        _mm_loadu_si128((const __m128i *)(p + 16)),
        _mm_loadu_si128((const __m128i *)(p + 32)),
        _mm_loadu_si128((const __m128i *)(p + 48)),
        p + 64, n - 64);
}

/*
 * The same with VPCLMULQDQ on 512-bit registers, for n >= CRC_WIDE_MIN (a
 * multiple of 16): four registers of four 128-bit lanes each, folded 2,048
 * bits forward onto the next 256 bytes (x^(2048+64) and x^2048 mod P in
 * every lane, computed like the constants above), then folded into one
 * register 512 bits at a time (k1, k2), whose four lanes are the four
 * lanes crc32_fold_rest goes on from.  Four times the bytes per step of
 * crc32_fold; the CPUs that have it (AVX-512F and VPCLMULQDQ, checked once
 * at import) do not slow their clock for these instructions on the ones
 * this was measured on (docs/benchmarks.md).
 */
#define CRC_WIDE_MIN 256

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.1"))) static uint32_t
crc32_fold_wide(uint32_t crc, const unsigned char *p, size_t n)
{
    const __m512i k16 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x01322d1430, 0x011542778a));
    const __m512i k4 = _mm512_broadcast_i32x4(K1K2);
    __m512i z0, z1, z2, z3;

#define FOLD512(z, k, next)                                                   \
    z = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z, k, 0x00),      \
                                  _mm512_clmulepi64_epi128(z, k, 0x11), next, 0x96);
    z0 = _mm512_xor_si512(
        _mm512_loadu_si512((const void *)p),
        _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128((int)crc), 0));
    z1 = _mm512_loadu_si512((const void *)(p + 64));
    z2 = _mm512_loadu_si512((const void *)(p + 128));
    z3 = _mm512_loadu_si512((const void *)(p + 192));
    p += 256;
    n -= 256;
    while (n >= 256) {
        FOLD512(z0, k16, _mm512_loadu_si512((const void *)p))
        FOLD512(z1, k16, _mm512_loadu_si512((const void *)(p + 64)))
        FOLD512(z2, k16, _mm512_loadu_si512((const void *)(p + 128)))
        FOLD512(z3, k16, _mm512_loadu_si512((const void *)(p + 192)))
        p += 256;
        n -= 256;
    }
    FOLD512(z0, k4, z1)
    FOLD512(z0, k4, z2)
    FOLD512(z0, k4, z3)
#undef FOLD512
    return crc32_fold_rest(
        _mm512_extracti32x4_epi32(z0, 0),
        _mm512_extracti32x4_epi32(z0, 1),
        _mm512_extracti32x4_epi32(z0, 2),
        _mm512_extracti32x4_epi32(z0, 3),
        p, n);
}
#undef FOLD128
#endif

/* Whether crc32_fold may run: the CPU has the instructions (set at import;
 * _speedups._crc32_set_folding turns it off for tests and benchmarks). */
static int crc_folding = 0;
/* Whether crc32_fold_wide may run (with crc_folding): the CPU has AVX-512F
 * and VPCLMULQDQ (set at import; _speedups._crc32_set_wide for tests). */
static int crc_wide = 0;

static int
crc_folding_available(void)
{
#ifdef HAVE_CLMUL
    __builtin_cpu_init();
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#else
    return 0;
#endif
}

static int
crc_wide_available(void)
{
#ifdef HAVE_CLMUL
    __builtin_cpu_init();
    return crc_folding_available() && __builtin_cpu_supports("avx512f")
        && __builtin_cpu_supports("vpclmulqdq");
#else
    return 0;
#endif
}
/* Below this, zlib alone: the fold's fixed cost outweighs its speed. */
#define CRC_FOLD_MIN 16

/* zlib.crc32(p[:length], crc) */
static uint32_t
crc32_any(uint32_t crc, const unsigned char *p, size_t length)
{
#ifdef HAVE_CLMUL
    if (crc_folding && length >= CRC_FOLD_MIN) {
        size_t head = length & ~(size_t)15;
        crc = crc_wide && head >= CRC_WIDE_MIN ? ~crc32_fold_wide(~crc, p, head)
                                               : ~crc32_fold(~crc, p, head);
        p += head;
        length -= head;
    }
#endif
    return length ? crc32_zlib(crc, p, length) : crc;
}

static inline int64_t
body_crc(const unsigned char *p, int64_t length)
{
    return (int64_t)(crc32_any(0, p, (size_t)length) & 0x7FFFFFFFU);
}

/* _record.check_header(...) is None */
static inline int
header_ok(int64_t total, int32_t magic, int64_t position, int64_t size)
{
    if (magic == BLANK_MAGIC)
        return position + total == size;
    if (magic != MAGIC_V1 && magic != MAGIC_V2)
        return 0;
    return total >= MIN_FIXED && position + total <= size;
}

/*
 * _record.check_record(record, at, offset, total, magic) is None, for a
 * record lying whole inside the n bytes at b (1); 0 when it is not valid or
 * not whole in the buffer (the caller asks the Python code then).
 */
static int
record_ok(const unsigned char *b, Py_ssize_t n, int64_t at, int64_t offset,
          int64_t total, int32_t magic)
{
    const unsigned char *r;
    int32_t sysflag, stored_crc, body_length;
    int64_t body_at, topic_at, topic_length, properties_at;

    if (at < 0 || total < MIN_FIXED || at > (int64_t)n || total > (int64_t)n - at)
        return 0;
    r = b + at;
    stored_crc = rd32(r + 8);
    if (rd64(r + 28) != offset)
        return 0;
    sysflag = rd32(r + 36);
    body_at = BODY_LENGTH_AT + ((sysflag & BORNHOST_V6) ? 12 : 0) +
              ((sysflag & STOREHOST_V6) ? 12 : 0);
    if (body_at + 4 > total)
        return 0;
    body_length = rd32(r + body_at);
    body_at += 4;
    topic_at = body_at + body_length;
    if (body_length < 0 || topic_at + 2 > total)
        return 0;
    if (magic == MAGIC_V1) {
        topic_length = (int8_t)r[topic_at];
        properties_at = topic_at + 1 + topic_length;
    }
    else {
        topic_length = rd16(r + topic_at);
        properties_at = topic_at + 2 + topic_length;
    }
    if (topic_length < 0)
        return 0;
    if (properties_at + 2 > total || properties_at + 2 + rd16(r + properties_at) != total)
        return 0;
    if (body_length && body_crc(r + body_at, body_length) != (int64_t)stored_crc)
        return 0;
    return 1;
}

/*
 * parse_record(b, pos, ..., offset, with_body=False, check_crc=..., strict=...)
 * would return a message Record (not a Blank, not an error), reading only
 * the `available` bytes from pos (all inside the buffer).
 */
static int
message_ok(const unsigned char *r, int64_t available, int64_t offset,
           int check_crc, int strict)
{
    int32_t magic, sysflag, body_length;
    int64_t total, p, body_start, topic_length, properties_length;
    int born_v6, store_v6;

    if (available < 8)
        return 0;
    total = rd32(r);
    magic = rd32(r + 4);
    if (magic != MAGIC_V1 && magic != MAGIC_V2)
        return 0;
    if (total < MIN_FIXED || total > available)
        return 0;
    sysflag = rd32(r + 36);
    born_v6 = (sysflag & BORNHOST_V6) != 0;
    store_v6 = (sysflag & STOREHOST_V6) != 0;
    p = 48 + (born_v6 ? 20 : 8) + 8 + (store_v6 ? 20 : 8);
    if (p + 16 > total)
        return 0;
    body_length = rd32(r + p + 12);
    p += 16;
    if (body_length < 0 || p + body_length > total)
        return 0;
    body_start = p;
    p += body_length;
    if (magic == MAGIC_V1) {
        if (p + 1 > total)
            return 0;
        topic_length = (int8_t)r[p];
        p += 1;
    }
    else {
        if (p + 2 > total)
            return 0;
        topic_length = rd16(r + p);
        p += 2;
    }
    if (topic_length < 0 || p + topic_length + 2 > total)
        return 0;
    if (strict && topic_length && r[p + topic_length - 1] == 0)
        return 0;
    p += topic_length;
    properties_length = rd16(r + p);
    p += 2;
    if (properties_length < 0 || p + properties_length > total)
        return 0;
    if (strict && properties_length && r[p + properties_length - 1] == 0)
        return 0;
    p += properties_length;
    if (p != total)
        return 0;
    if (rd64(r + 28) != offset)
        return 0;
    if (check_crc && body_length > 0 &&
        body_crc(r + body_start, body_length) != (int64_t)rd32(r + 8))
        return 0;
    return 1;
}

/* --------------------------------------------------------------------- */

PyDoc_STRVAR(check_record_doc,
"check_record(buf, at, offset, total, magic) -> bool\n\n"
"True when _record.check_record would return None for a record lying\n"
"whole in buf; False otherwise (ask the Python code why).");

static PyObject *
sp_check_record(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long long at, offset, total;
    int magic;
    int ok;

    if (!PyArg_ParseTuple(args, "y*LLLi", &view, &at, &offset, &total, &magic))
        return NULL;
    ok = record_ok(view.buf, view.len, at, offset, total, (int32_t)magic);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(replica_hop_doc,
"replica_hop(chunk, chunk_offset, end, max_offset, segment_size) -> int\n\n"
"ReplicaValidator.advance over the records that lie whole in chunk and are\n"
"valid: the record end it reaches.  It stops (for the Python code to go on)\n"
"at anything else: a record needing bytes from before the chunk, one that\n"
"is not whole yet, one that is not valid.");

/* Copy the n bytes from commit-log offset `from`, which lie in pieces k.. of
 * views (piece i at starts[i]), into dst. */
static void
gather(const Py_buffer *views, const int64_t *starts, Py_ssize_t k, int64_t from,
       int64_t n, unsigned char *dst)
{
    while (n > 0) {
        int64_t at = from - starts[k];
        int64_t take = (int64_t)views[k].len - at;

        if (take > n)
            take = n;
        if (take > 0) {
            memcpy(dst, (const unsigned char *)views[k].buf + at, (size_t)take);
            dst += take;
            from += take;
            n -= take;
        }
        k++;
    }
}

/* The hop of replica_hop and replica_hop_pieces over the n consecutive
 * buffers views (piece i at commit-log offset starts[i], starts[n] their
 * end), from end: where it stops, in *stop.  A record cut between two
 * pieces is checked from a copy of its bytes.  -1 (MemoryError set) if
 * that copy cannot be made. */
static int
hop_pieces(const Py_buffer *views, const int64_t *starts, Py_ssize_t n, int64_t end,
           int64_t max_offset, int64_t size, int64_t *stop)
{
    unsigned char *scratch = NULL;
    int64_t scratch_size = 0;
    Py_ssize_t k = 0;
    int64_t chunk_offset = starts[0], chunk_end = starts[n];
    int64_t position, segment_start, wrote, total;
    int32_t magic;
    unsigned char head[8];
    const unsigned char *h;
    int ok, status = 0;

    if (size <= 0 || end < 0)
        goto done;
    while (end < max_offset) {
        position = end % size;
        segment_start = end - position;
        wrote = max_offset - segment_start < size ? max_offset - segment_start : size;
        while (position < size) {
            if (wrote - position < 8)
                goto done;
            if (!(chunk_offset <= end && end + 8 <= chunk_end))
                goto done;
            /* The piece holding `end` (pieces may be empty). */
            while (k < n && starts[k + 1] <= end)
                k++;
            if (end + 8 <= starts[k + 1])
                h = (const unsigned char *)views[k].buf + (end - starts[k]);
            else {
                gather(views, starts, k, end, 8, head);
                h = head;
            }
            total = rd32(h);
            magic = rd32(h + 4);
            if (!header_ok(total, magic, position, size))
                goto done;
            if (magic == BLANK_MAGIC) {
                if (wrote < size)
                    goto done;
                position = size;
                break;
            }
            if (position + total > wrote || end + total > chunk_end)
                goto done;
            if (end + total <= starts[k + 1])
                ok = record_ok(views[k].buf, views[k].len, end - starts[k], end, total, magic);
            else {
                /* Cut between pieces: at most the pieces' bytes. */
                if (total > scratch_size) {
                    unsigned char *grown = PyMem_Realloc(scratch, (size_t)total);

                    if (grown == NULL) {
                        PyErr_NoMemory();
                        status = -1;
                        goto done;
                    }
                    scratch = grown;
                    scratch_size = total;
                }
                gather(views, starts, k, end, total, scratch);
                ok = record_ok(scratch, (Py_ssize_t)total, 0, end, total, magic);
            }
            if (!ok)
                goto done;
            end += total;
            position += total;
        }
        if (position >= size)
            end = segment_start + size;
    }
done:
    PyMem_Free(scratch);
    *stop = end;
    return status;
}

static PyObject *
sp_replica_hop(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long long chunk_offset, end, max_offset, size;
    int64_t starts[2], stop;
    int status;

    if (!PyArg_ParseTuple(args, "y*LLLL", &view, &chunk_offset, &end, &max_offset, &size))
        return NULL;
    starts[0] = chunk_offset;
    starts[1] = chunk_offset + (int64_t)view.len;
    status = hop_pieces(&view, starts, 1, end, max_offset, size, &stop);
    PyBuffer_Release(&view);
    return status < 0 ? NULL : PyLong_FromLongLong(stop);
}

PyDoc_STRVAR(replica_hop_pieces_doc,
"replica_hop_pieces(pieces, chunk_offset, end, max_offset, segment_size) -> int\n\n"
"replica_hop over the consecutive buffers pieces, the first at commit-log\n"
"chunk_offset (a slave's frame bodies, written one after the other): a\n"
"record cut between two pieces is checked from a copy of its bytes instead\n"
"of stopping there.  It stops where replica_hop stops: a record needing\n"
"bytes from before the first piece, one that is not whole yet, one that is\n"
"not valid, a BLANK filler.");

static PyObject *
sp_replica_hop_pieces(PyObject *module, PyObject *args)
{
    PyObject *pieces, *fast;
    long long chunk_offset, end, max_offset, size;
    Py_buffer *views = NULL;
    int64_t *starts = NULL;
    int64_t stop;
    Py_ssize_t n, i, acquired = 0;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "OLLLL", &pieces, &chunk_offset, &end, &max_offset, &size))
        return NULL;
    fast = PySequence_Fast(pieces, "pieces must be a sequence of buffers");
    if (fast == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(fast);
    views = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    starts = PyMem_Malloc(((size_t)n + 1) * sizeof(int64_t));
    if (views == NULL || starts == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    starts[0] = chunk_offset;
    for (i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &views[i], PyBUF_SIMPLE) < 0)
            goto fail;
        acquired++;
        starts[i + 1] = starts[i] + (int64_t)views[i].len;
    }
    if (hop_pieces(views, starts, n, end, max_offset, size, &stop) == 0)
        result = PyLong_FromLongLong(stop);
fail:
    for (i = 0; i < acquired; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(starts);
    Py_DECREF(fast);
    return result;
}

PyDoc_STRVAR(walk_valid_doc,
"walk_valid(buf, pos, end, offset, check_crc, strict) -> (pos, records, last)\n\n"
"Hop over the message records from buf[pos:] (at commit-log offset) that\n"
"parse_record(buf, pos, end, offset, with_body=False, check_crc=check_crc,\n"
"strict=strict) accepts; stop at the first thing it would not accept as a\n"
"message record (a BLANK, an error, the end).  last is the position of the\n"
"last record accepted, -1 if none.");

static PyObject *
sp_walk_valid(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long long pos, end, offset;
    int check_crc, strict;
    int64_t limit, records = 0, last = -1;
    const unsigned char *b;

    if (!PyArg_ParseTuple(args, "y*LLLpp", &view, &pos, &end, &offset, &check_crc, &strict))
        return NULL;
    b = view.buf;
    limit = end < (int64_t)view.len ? end : (int64_t)view.len;
    if (pos >= 0) {
        while (pos < limit && message_ok(b + pos, limit - pos, offset, check_crc, strict)) {
            int64_t total = rd32(b + pos);
            last = pos;
            records++;
            pos += total;
            offset += total;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("LLL", pos, (long long)records, (long long)last);
}

PyDoc_STRVAR(walk_headers_doc,
"walk_headers(buf, pos, size) -> (positions, pos)\n\n"
"scan.walk over one buffer: the positions of the message records whose\n"
"header (positive TOTALSIZE, message magic, ending by size) is in\n"
"buf[pos:], in order, and where the hop stopped: at a header that is not\n"
"a record's, or where fewer than 8 bytes are left in buf.");

static PyObject *
sp_walk_headers(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long long pos, size;
    const unsigned char *b;
    PyObject *positions, *item;
    int64_t total;
    int32_t magic;

    if (!PyArg_ParseTuple(args, "y*LL", &view, &pos, &size))
        return NULL;
    positions = PyList_New(0);
    if (positions == NULL)
        goto fail;
    b = view.buf;
    while (pos >= 0 && pos + 8 <= (int64_t)view.len && pos + 8 <= size) {
        total = rd32(b + pos);
        magic = rd32(b + pos + 4);
        if ((magic != MAGIC_V1 && magic != MAGIC_V2) || total <= 0 || pos + total > size)
            break;
        item = PyLong_FromLongLong(pos);
        if (item == NULL || PyList_Append(positions, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(positions);
            goto fail;
        }
        Py_DECREF(item);
        pos += total;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("NL", positions, pos);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

/* -- consume-queue dispatch --------------------------------------------- */

static const char schedule_topic[] = "SCHEDULE_TOPIC_XXXX";

/* The TAGS hash of properties p[0:n]: 1 and *code, or 0: Python decides. */
static int
cq_tags_hash(const unsigned char *p, int64_t n, int64_t *code)
{
    int64_t at = -1, i, end;
    uint32_t h = 0;

    /* Each name starts the properties or follows a 2: memchr hops from
       one to the next rather than looking at every byte. */
    i = 0;
    while (i + 5 <= n) {
        const unsigned char *next;
        if (memcmp(p + i, "TAGS\x01", 5) == 0) {
            if (at >= 0)
                return 0; /* twice */
            at = i;
        }
        next = memchr(p + i, 2, (size_t)(n - i));
        if (next == NULL)
            break;
        i = (next - p) + 1;
    }
    if (at < 0) {
        *code = 0;
        return 1;
    }
    end = at + 5;
    while (end < n && p[end] != 2)
        end++;
    for (i = at + 5; i < end; i++) {
        if (p[i] >= 0x80)
            return 0;
        h = 31u * h + p[i];
    }
    *code = (int64_t)(int32_t)h;
    return 1;
}

PyDoc_STRVAR(cq_units_doc,
"cq_units(buf, pos, size, base) -> (groups, pos, last_store_timestamp)\n\n"
"ConsumeQueues._one over the whole message records in a row from\n"
"buf[pos:size] (prepared and rolled-back transaction records skipped),\n"
"their units grouped by (topic,\n"
"queue id) in record order, each group (topic bytes, queue id, first\n"
"QUEUEOFFSET, consecutive, units, queue offsets): units are the 20-byte\n"
"units (commit-log offset = base + position in buf, size, tag hash;\n"
"big-endian), queue offsets the records' QUEUEOFFSETs (int64 big-endian\n"
"each), consecutive whether each is one more than the one before.  Stops\n"
"at a BLANK, a header that is not a record's, a record not whole in\n"
"buf[:size] or whose fields do not fit its size, a record whose tag hash\n"
"Python computes (the schedule topic, TAGS twice, non-ASCII tags), and\n"
"before a 65th distinct queue.  The tag hash is Java's String.hashCode of\n"
"the TAGS property, sign-extended; 0 without.  last_store_timestamp is -1\n"
"when no record was read.");

typedef struct {
    const unsigned char *topic;
    int64_t topic_length;
    int32_t queue_id;
    int64_t first, last;
    int consecutive;
    unsigned char *units, *offsets;
    Py_ssize_t count, capacity;
} cq_group;

static int
cq_group_add(cq_group *g, int64_t at, int64_t total, int64_t code, int64_t queue_offset)
{
    unsigned char *p;
    int i;

    if (g->count == g->capacity) {
        Py_ssize_t capacity = g->capacity ? g->capacity * 2 : 64;
        unsigned char *units = PyMem_Realloc(g->units, capacity * 20);
        if (units == NULL)
            return -1;
        g->units = units;
        units = PyMem_Realloc(g->offsets, capacity * 8);
        if (units == NULL)
            return -1;
        g->offsets = units;
        g->capacity = capacity;
    }
    p = g->units + g->count * 20;
    for (i = 0; i < 8; i++)
        p[i] = (unsigned char)((uint64_t)at >> (56 - 8 * i));
    for (i = 0; i < 4; i++)
        p[8 + i] = (unsigned char)((uint32_t)total >> (24 - 8 * i));
    for (i = 0; i < 8; i++)
        p[12 + i] = (unsigned char)((uint64_t)code >> (56 - 8 * i));
    p = g->offsets + g->count * 8;
    for (i = 0; i < 8; i++)
        p[i] = (unsigned char)((uint64_t)queue_offset >> (56 - 8 * i));
    if (g->count && queue_offset != g->last + 1)
        g->consecutive = 0;
    g->last = queue_offset;
    g->count++;
    return 0;
}

/* How many records ahead cq_units asks for the memory it will read. */
#define CQ_AHEAD 6
#if defined(__GNUC__) || defined(__clang__)
#define CQ_PREFETCH(p) __builtin_prefetch(p)
#else
#define CQ_PREFETCH(p) ((void)0)
#endif

static PyObject *
sp_cq_units(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long long pos, size, base;
    const unsigned char *b;
    PyObject *groups = NULL, *item;
    cq_group g[64];
    int ngroups = 0, i, found;
    int64_t total, last_ts = -1, q, body_length, topic_length, props_length, code, queue_offset;
    int32_t magic, sysflag, tran, queue_id;

    if (!PyArg_ParseTuple(args, "y*LLL", &view, &pos, &size, &base))
        return NULL;
    if (size > (long long)view.len)
        size = view.len;
    memset(g, 0, sizeof(g));
    b = view.buf;
    while (pos >= 0 && pos + 8 <= size) {
        int64_t ts;
        total = rd32(b + pos);
        magic = rd32(b + pos + 4);
        if ((magic != MAGIC_V1 && magic != MAGIC_V2) || total < 92 || pos + total > size)
            break;
        {
            /* The head and the tail (topic, properties) of the record
               CQ_AHEAD ahead, guessing the records are of this one's size:
               a walk of a log that is not in the CPU's caches (store
               check) waits on memory otherwise, two misses a record. */
            int64_t ahead = pos + CQ_AHEAD * total;
            if (ahead + total <= size) {
                CQ_PREFETCH(b + ahead);
                CQ_PREFETCH(b + ahead + 64);
                CQ_PREFETCH(b + ahead + total - 128);
                CQ_PREFETCH(b + ahead + total - 64);
            }
        }
        sysflag = rd32(b + pos + 36);
        q = pos + 48 + ((sysflag & 0x10) ? 20 : 8);
        ts = rd64(b + q);
        q += 8 + ((sysflag & 0x20) ? 20 : 8) + 12;
        if (q + 4 > pos + total)
            break;
        body_length = rd32(b + q);
        q += 4;
        if (body_length < 0 || q + body_length + 2 > pos + total)
            break;
        q += body_length;
        if (magic == MAGIC_V1) {
            topic_length = b[q];
            q += 1;
        } else {
            topic_length = (int16_t)((b[q] << 8) | b[q + 1]);
            q += 2;
        }
        if (topic_length < 0 || q + topic_length + 2 > pos + total)
            break;
        props_length = (b[q + topic_length] << 8) | b[q + topic_length + 1];
        if (q + topic_length + 2 + props_length > pos + total)
            break;
        tran = sysflag & 0xC;
        if (tran == 0x4 || tran == 0xC) {
            last_ts = ts;
            pos += total;
            continue;
        }
        if (topic_length == (int64_t)(sizeof(schedule_topic) - 1)
            && memcmp(b + q, schedule_topic, sizeof(schedule_topic) - 1) == 0)
            break;
        if (!cq_tags_hash(b + q + topic_length + 2, props_length, &code))
            break;
        queue_id = rd32(b + pos + 12);
        queue_offset = rd64(b + pos + 20);
        found = -1;
        for (i = 0; i < ngroups; i++) {
            if (g[i].queue_id == queue_id && g[i].topic_length == topic_length
                && memcmp(g[i].topic, b + q, topic_length) == 0) {
                found = i;
                break;
            }
        }
        if (found < 0) {
            if (ngroups == 64)
                break;
            found = ngroups++;
            g[found].topic = b + q;
            g[found].topic_length = topic_length;
            g[found].queue_id = queue_id;
            g[found].first = queue_offset;
            g[found].consecutive = 1;
        }
        if (cq_group_add(&g[found], base + pos, total, code, queue_offset) < 0) {
            PyErr_NoMemory();
            goto fail;
        }
        last_ts = ts;
        pos += total;
    }
    groups = PyList_New(0);
    if (groups == NULL)
        goto fail;
    for (i = 0; i < ngroups; i++) {
        item = Py_BuildValue("(y#iLOy#y#)", (const char *)g[i].topic, (Py_ssize_t)g[i].topic_length,
                             g[i].queue_id, (long long)g[i].first,
                             g[i].consecutive ? Py_True : Py_False,
                             (const char *)g[i].units, g[i].count * 20,
                             (const char *)g[i].offsets, g[i].count * 8);
        if (item == NULL || PyList_Append(groups, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    for (i = 0; i < ngroups; i++) {
        PyMem_Free(g[i].units);
        PyMem_Free(g[i].offsets);
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("NLL", groups, pos, (long long)last_ts);
fail:
    for (i = 0; i < ngroups; i++) {
        PyMem_Free(g[i].units);
        PyMem_Free(g[i].offsets);
    }
    Py_XDECREF(groups);
    PyBuffer_Release(&view);
    return NULL;
}

/* -- the put path ------------------------------------------------------- */

static PyObject *s_body, *s_topic, *s_properties, *s_born_host, *s_sysflag,
    *s_queue_id, *s_flag, *s_born_timestamp, *s_reconsume_times,
    *s_prepared_tx_offset, *s_max_message_size, *s_c_state;

/* The Message attributes the encoder reads, all fetched before any check. */
enum {
    A_BODY, A_TOPIC, A_PROPERTIES, A_BORN_HOST, A_SYSFLAG, A_QUEUE_ID, A_FLAG,
    A_RECONSUME_TIMES, A_PREPARED_TX_OFFSET, A_BORN_TIMESTAMP, N_ATTRS
};
static PyObject **attr_names[N_ATTRS] = {
    &s_body, &s_topic, &s_properties, &s_born_host, &s_sysflag, &s_queue_id, &s_flag,
    &s_reconsume_times, &s_prepared_tx_offset, &s_born_timestamp,
};

/* An exact int within [lo, hi] into *out: 1; anything else 0 (no error set). */
static int
exact_int(PyObject *o, long long lo, long long hi, long long *out)
{
    int overflow;
    long long v;

    if (o == NULL || !PyLong_CheckExact(o))
        return 0;
    v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

#define I32 -2147483648LL, 2147483647LL
#define I64 LLONG_MIN, LLONG_MAX

typedef struct {
    const char *text;
    Py_ssize_t length;
} piece;

#define MAX_INLINE_PROPERTIES 16

PyDoc_STRVAR(encode_doc,
"encode(encoder, buf, pos, room, message, queue_offset, physical_offset,\n"
"       store_timestamp) -> int | None\n\n"
"RecordEncoder.encode for the common message (bytes body, a topic and born\n"
"host the encoder has seen, a dict of str properties, exact ints in range):\n"
"the record's size, or its size negated when it does not fit in room.\n"
"None: not the common case; the Python code decides (and raises).");

static PyObject *
encode_one(PyObject *encoder, PyObject *bufobj, long long pos, long long room,
           PyObject *message, long long queue_offset, long long physical_offset,
           long long store_timestamp)
{
    PyObject *state = NULL, *body, *topic, *properties, *born_host, *tmp = NULL,
             *result = NULL;
    PyObject *attrs[N_ATTRS] = {NULL};
    PyObject *topic_enc, *store_ip, *store_port_o, *store_v6_o, *topics, *hosts;
    long long max_message_size, queue_id, flag, sysflag, born_timestamp,
        reconsume_times, prepared_tx_offset, store_port, born_port;
    const char *born_ip;
    Py_ssize_t born_ip_len, store_ip_len, body_length, topic_length;
    Py_ssize_t properties_length = 0, count = 0, i;
    piece inline_pieces[2 * MAX_INLINE_PROPERTIES];
    piece *pieces = inline_pieces;
    int store_v6, born_v6;
    int64_t fixed, total;
    Py_buffer view;
    unsigned char *w;

    /* Every attribute first: reading one may run Python code (a property
     * of a Message subclass), which could change the encoder's caches or
     * the properties dict; after this point no Python code runs, so the
     * borrowed cache entries and UTF-8 pointers below stay valid. */
    state = PyObject_GetAttr(encoder, s_c_state);
    if (state == NULL)
        goto error;
    tmp = PyObject_GetAttr(encoder, s_max_message_size);
    if (tmp == NULL)
        goto error;
    if (!exact_int(tmp, I64, &max_message_size))
        goto fallback;
    Py_CLEAR(tmp);
    for (i = 0; i < N_ATTRS; i++) {
        attrs[i] = PyObject_GetAttr(message, *attr_names[i]);
        if (attrs[i] == NULL)
            goto error;
    }
    body = attrs[A_BODY];
    topic = attrs[A_TOPIC];
    properties = attrs[A_PROPERTIES];
    born_host = attrs[A_BORN_HOST];

    /* encoder._c_state: (store ip packed, store port, store v6, topics, hosts) */
    if (!PyTuple_CheckExact(state) || PyTuple_GET_SIZE(state) != 5)
        goto fallback;
    store_ip = PyTuple_GET_ITEM(state, 0);
    store_port_o = PyTuple_GET_ITEM(state, 1);
    store_v6_o = PyTuple_GET_ITEM(state, 2);
    topics = PyTuple_GET_ITEM(state, 3);
    hosts = PyTuple_GET_ITEM(state, 4);
    if (!PyBytes_CheckExact(store_ip) || !PyDict_CheckExact(topics) ||
        !PyDict_CheckExact(hosts) || !exact_int(store_port_o, 0, 0xFFFF, &store_port))
        goto fallback;
    store_v6 = store_v6_o == Py_True;
    store_ip_len = PyBytes_GET_SIZE(store_ip);
    if (store_ip_len != (store_v6 ? 16 : 4))
        goto fallback;

    if (!PyBytes_CheckExact(body))
        goto fallback;
    body_length = PyBytes_GET_SIZE(body);
    if (body_length > max_message_size)
        goto fallback;

    if (!PyUnicode_CheckExact(topic))
        goto fallback;
    /* Exact str keys only: hashing and comparing them runs no Python code. */
    topic_enc = PyDict_GetItemWithError(topics, topic); /* borrowed */
    if (topic_enc == NULL) {
        if (PyErr_Occurred())
            goto error;
        goto fallback;
    }
    if (!PyBytes_CheckExact(topic_enc) || PyBytes_GET_SIZE(topic_enc) < 2)
        goto fallback;
    topic_length = PyBytes_GET_SIZE(topic_enc);

    if (!PyDict_CheckExact(properties))
        goto fallback;
    count = PyDict_GET_SIZE(properties);
    if (count) {
        PyObject *key, *value;
        Py_ssize_t at = 0, n = 0;

        if (count > MAX_INLINE_PROPERTIES) {
            pieces = PyMem_Malloc(sizeof(piece) * 2 * (size_t)count);
            if (pieces == NULL) {
                PyErr_NoMemory();
                goto error;
            }
        }
        while (PyDict_Next(properties, &at, &key, &value)) {
            if (n >= 2 * count || !PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(value))
                goto fallback;
            pieces[n].text = PyUnicode_AsUTF8AndSize(key, &pieces[n].length);
            pieces[n + 1].text = PyUnicode_AsUTF8AndSize(value, &pieces[n + 1].length);
            if (pieces[n].text == NULL || pieces[n + 1].text == NULL) {
                PyErr_Clear();  /* e.g. a lone surrogate: Python explains */
                goto fallback;
            }
            if (pieces[n].length == 0)
                goto fallback;
            for (i = n; i < n + 2; i++) {
                if (memchr(pieces[i].text, 1, (size_t)pieces[i].length) ||
                    memchr(pieces[i].text, 2, (size_t)pieces[i].length))
                    goto fallback;
                properties_length += pieces[i].length;
            }
            n += 2;
        }
        if (n != 2 * count)
            goto fallback;
        properties_length += 2 * count - 1;  /* the \x01s and \x02s */
        if (properties_length > MAX_PROPERTIES_LENGTH)
            goto fallback;
    }

    if (born_host == Py_None) {
        born_ip = PyBytes_AS_STRING(store_ip);
        born_ip_len = store_ip_len;
        born_port = store_port;
        born_v6 = store_v6;
    }
    else {
        PyObject *parsed, *packed;

        /* Only exact (str, int) keys: a float or bool port would compare
         * equal to a cached int one and slip past the Python checks. */
        if (!PyTuple_CheckExact(born_host) || PyTuple_GET_SIZE(born_host) != 2 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(born_host, 0)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(born_host, 1)))
            goto fallback;
        parsed = PyDict_GetItemWithError(hosts, born_host); /* borrowed */
        if (parsed == NULL) {
            if (PyErr_Occurred())
                goto error;
            goto fallback;
        }
        if (!PyTuple_CheckExact(parsed) || PyTuple_GET_SIZE(parsed) != 3)
            goto fallback;
        packed = PyTuple_GET_ITEM(parsed, 0);
        if (!PyBytes_CheckExact(packed) ||
            !exact_int(PyTuple_GET_ITEM(parsed, 1), 0, 0xFFFF, &born_port))
            goto fallback;
        born_v6 = PyTuple_GET_ITEM(parsed, 2) == Py_True;
        born_ip = PyBytes_AS_STRING(packed);
        born_ip_len = PyBytes_GET_SIZE(packed);
        if (born_ip_len != (born_v6 ? 16 : 4))
            goto fallback;
    }

    if (!exact_int(attrs[A_SYSFLAG], I32, &sysflag) ||
        !exact_int(attrs[A_QUEUE_ID], I32, &queue_id) ||
        !exact_int(attrs[A_FLAG], I32, &flag) ||
        !exact_int(attrs[A_RECONSUME_TIMES], I32, &reconsume_times) ||
        !exact_int(attrs[A_PREPARED_TX_OFFSET], I64, &prepared_tx_offset))
        goto fallback;
    if (attrs[A_BORN_TIMESTAMP] == Py_None)
        born_timestamp = store_timestamp;
    else if (!exact_int(attrs[A_BORN_TIMESTAMP], I64, &born_timestamp))
        goto fallback;

    fixed = 48 + (born_v6 ? 20 : 8) + 8 + (store_v6 ? 20 : 8) + 16;
    total = fixed + body_length + topic_length + 2 + properties_length;
    if (total > room) {
        result = PyLong_FromLongLong(-total);
        goto finish;
    }
    if (bufobj == Py_None)
        goto fallback;
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        goto fallback;
    }
    if (pos < 0 || pos > (long long)view.len || total > (long long)view.len - pos) {
        PyBuffer_Release(&view);
        goto fallback;
    }
    w = (unsigned char *)view.buf + pos;
    sysflag = (sysflag & ~(long long)(BORNHOST_V6 | STOREHOST_V6)) |
              (store_v6 ? STOREHOST_V6 : 0) | (born_v6 ? BORNHOST_V6 : 0);
    wr32(w, total);
    wr32(w + 4, MAGIC_V1);
    wr32(w + 8, body_crc((const unsigned char *)PyBytes_AS_STRING(body), body_length));
    wr32(w + 12, queue_id);
    wr32(w + 16, flag);
    wr64(w + 20, queue_offset);
    wr64(w + 28, physical_offset);
    wr32(w + 36, sysflag);
    wr64(w + 40, born_timestamp);
    w += 48;
    memcpy(w, born_ip, (size_t)born_ip_len);
    wr32(w + born_ip_len, born_port);
    w += born_ip_len + 4;
    wr64(w, store_timestamp);
    w += 8;
    memcpy(w, PyBytes_AS_STRING(store_ip), (size_t)store_ip_len);
    wr32(w + store_ip_len, store_port);
    w += store_ip_len + 4;
    wr32(w, reconsume_times);
    wr64(w + 4, prepared_tx_offset);
    wr32(w + 12, body_length);
    w += 16;
    memcpy(w, PyBytes_AS_STRING(body), (size_t)body_length);
    w += body_length;
    memcpy(w, PyBytes_AS_STRING(topic_enc), (size_t)topic_length);
    w += topic_length;
    w[0] = (unsigned char)(properties_length >> 8);
    w[1] = (unsigned char)properties_length;
    w += 2;
    for (i = 0; i < 2 * count; i++) {
        if (i) {
            *w++ = (i & 1) ? 1 : 2;
        }
        memcpy(w, pieces[i].text, (size_t)pieces[i].length);
        w += pieces[i].length;
    }
    PyBuffer_Release(&view);
    result = PyLong_FromLongLong(total);
    goto finish;

fallback:
    result = Py_None;
    Py_INCREF(result);
    goto finish;
error:
    result = NULL;
finish:
    if (pieces != inline_pieces)
        PyMem_Free(pieces);
    Py_XDECREF(tmp);
    for (i = 0; i < N_ATTRS; i++)
        Py_XDECREF(attrs[i]);
    Py_XDECREF(state);
    return result;
}

static PyObject *
sp_encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    long long pos, room, queue_offset, physical_offset, store_timestamp;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "encode takes 8 arguments");
        return NULL;
    }
    if (!exact_int(args[2], I64, &pos) || !exact_int(args[3], I64, &room) ||
        !exact_int(args[5], I64, &queue_offset) ||
        !exact_int(args[6], I64, &physical_offset) ||
        !exact_int(args[7], I64, &store_timestamp))
        Py_RETURN_NONE;
    return encode_one(args[0], args[1], pos, room, args[4], queue_offset,
                      physical_offset, store_timestamp);
}

#define TRANSACTION_MASK 0xC
#define TRANSACTION_PREPARED 0x4
#define TRANSACTION_ROLLBACK 0xC

/* -- shared by put_batch and put_one -------------------------------------- */

/* Where a message goes in the queue table: *counted is whether its queue
 * offset counts (not a prepared or rolled-back transaction), and then *key
 * (a new reference, the caller's) is its (topic, queue id) and
 * *queue_offset the table's offset for it (0 for a new queue).
 * 1: done; 0: not the common case (the Python loop decides); -1: an error. */
static int
queue_slot(PyObject *message, PyObject *table, int *counted, PyObject **key,
           long long *queue_offset)
{
    PyObject *sysflag_o, *topic = NULL, *queue_id = NULL, *current;
    long long sysflag;
    int status = -1;

    *key = NULL;
    *queue_offset = 0;
    sysflag_o = PyObject_GetAttr(message, s_sysflag);
    if (sysflag_o == NULL)
        return -1;
    if (!exact_int(sysflag_o, I32, &sysflag)) {
        status = 0;
        goto done;
    }
    *counted = (sysflag & TRANSACTION_MASK) != TRANSACTION_PREPARED &&
               (sysflag & TRANSACTION_MASK) != TRANSACTION_ROLLBACK;
    if (!*counted) {
        status = 1;
        goto done;
    }
    topic = PyObject_GetAttr(message, s_topic);
    if (topic == NULL)
        goto done;
    queue_id = PyObject_GetAttr(message, s_queue_id);
    if (queue_id == NULL)
        goto done;
    /* Exact str and int: hashing and comparing run no Python code. */
    if (!PyUnicode_CheckExact(topic) || !PyLong_CheckExact(queue_id)) {
        status = 0;
        goto done;
    }
    *key = PyTuple_Pack(2, topic, queue_id);
    if (*key == NULL)
        goto done;
    current = PyDict_GetItemWithError(table, *key); /* borrowed */
    if (current == NULL && PyErr_Occurred())
        goto done;
    if (current != NULL && !exact_int(current, 0, LLONG_MAX - 1, queue_offset)) {
        status = 0;
        goto done;
    }
    status = 1;
done:
    if (status != 1)
        Py_CLEAR(*key);
    Py_DECREF(sysflag_o);
    Py_XDECREF(topic);
    Py_XDECREF(queue_id);
    return status;
}

/* An AppendResult (result_type, a NamedTuple) of a record written. */
static PyObject *
append_result(PyObject *result_type, long long offset, long long size,
              long long queue_offset, long long store_timestamp, PyObject *store_host)
{
    /* What a NamedTuple's own __new__ does (tuple.__new__(cls, fields),
     * which allocates through the subtype and fills the items). */
    PyObject *result = ((PyTypeObject *)result_type)->tp_alloc((PyTypeObject *)result_type, 5);
    PyObject *items[4];
    int k, broken = 0;

    if (result == NULL)
        return NULL;
    items[0] = PyLong_FromLongLong(offset);
    items[1] = PyLong_FromLongLong(size);
    items[2] = PyLong_FromLongLong(queue_offset);
    items[3] = PyLong_FromLongLong(store_timestamp);
    for (k = 0; k < 4; k++) {
        if (items[k] == NULL)
            broken = 1;
        PyTuple_SET_ITEM(result, k, items[k]);
    }
    Py_INCREF(store_host);
    PyTuple_SET_ITEM(result, 4, store_host);
    if (broken)
        Py_CLEAR(result);
    return result;
}

/* After an error once bytes were written: zero [from, from + size) of the
 * buffer again, keeping the error. */
static void
unwrite(PyObject *bufobj, long long from, long long size)
{
    PyObject *type, *value, *traceback;
    Py_buffer view;

    PyErr_Fetch(&type, &value, &traceback);
    if (PyObject_GetBuffer(bufobj, &view, PyBUF_WRITABLE) == 0) {
        if (from >= 0 && size > 0 && from + size <= (long long)view.len)
            memset((char *)view.buf + from, 0, (size_t)size);
        PyBuffer_Release(&view);
    }
    else
        PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}

PyDoc_STRVAR(put_batch_doc,
"put_batch(encoder, buf, position, limit, messages, index, table, previous,\n"
"          start, store_timestamp, result_type, store_host, results)\n"
"    -> (index, position, over)\n\n"
"rmqha.store._batch.encode_batch's loop for the common message, from messages[index]\n"
"on: the queue offset from table (the first one of each queue kept in\n"
"previous, for the undo), the record encoded at buf[position:] (room up to\n"
"limit), an AppendResult (result_type) appended to results.  Stops at the\n"
"end (index the length, over None), at a message that does not fit (over\n"
"its size, negated; the table as it was for that message), or at a message\n"
"this code does not do (over None, nothing done for it): the Python loop\n"
"does that one.");

static PyObject *
sp_put_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *encoder, *bufobj, *messages, *table, *previous, *result_type,
        *store_host, *results, *seq;
    long long position, limit, index, start, store_timestamp, call_start;
    Py_ssize_t n;
    PyObject *stop = NULL;

    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "put_batch takes 13 arguments");
        return NULL;
    }
    encoder = args[0];
    bufobj = args[1];
    messages = args[4];
    table = args[6];
    previous = args[7];
    result_type = args[10];
    store_host = args[11];
    results = args[12];
    if (!exact_int(args[2], I64, &position) || !exact_int(args[3], I64, &limit) ||
        !exact_int(args[5], 0, PY_SSIZE_T_MAX, &index) ||
        !exact_int(args[8], I64, &start) || !exact_int(args[9], I64, &store_timestamp) ||
        !PyDict_CheckExact(table) || !PyDict_CheckExact(previous) ||
        !PyList_CheckExact(results) || !PyType_Check(result_type) ||
        !PyType_IsSubtype((PyTypeObject *)result_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "put_batch: bad arguments");
        return NULL;
    }
    call_start = position;
    seq = PySequence_Fast(messages, "messages must be a sequence");
    if (seq == NULL)
        return NULL;
    /* The size is read again every time round: a message's attribute read
     * may run Python code that shrinks a list of messages. */
    for (; index < (n = PySequence_Fast_GET_SIZE(seq)); index++) {
        PyObject *message = PySequence_Fast_GET_ITEM(seq, index);
        PyObject *key = NULL, *encoded = NULL, *fields = NULL, *result = NULL,
                 *next = NULL;
        long long queue_offset = 0, total = 0;
        long long written = 0;
        int counted = 0, ok = 0, slot;

        Py_INCREF(message);  /* the list may drop it meanwhile */
        slot = queue_slot(message, table, &counted, &key, &queue_offset);
        if (slot < 0)
            goto fail_one;
        if (slot == 0)
            goto python_one;
        encoded = encode_one(encoder, bufobj, position, limit - position, message,
                             queue_offset, start + position, store_timestamp);
        if (encoded == NULL)
            goto fail_one;
        if (encoded == Py_None)
            goto python_one;
        total = PyLong_AsLongLong(encoded);
        if (total == -1 && PyErr_Occurred())
            goto fail_one;
        if (total < 0) {
            stop = Py_BuildValue("nLL", (Py_ssize_t)index, position, total);
            goto done_one;
        }
        written = total;
        if (counted) {
            if (PyDict_Contains(previous, key) == 0) {
                PyObject *was = PyLong_FromLongLong(queue_offset);
                if (was == NULL || PyDict_SetItem(previous, key, was) < 0) {
                    Py_XDECREF(was);
                    goto fail_one;
                }
                Py_DECREF(was);
            }
            next = PyLong_FromLongLong(queue_offset + 1);
            if (next == NULL || PyDict_SetItem(table, key, next) < 0)
                goto fail_one;
        }
        result = append_result(result_type, start + position, total, queue_offset,
                               store_timestamp, store_host);
        if (result == NULL)
            goto fail_one;
        if (PyList_Append(results, result) < 0)
            goto fail_one;
        position += total;
        ok = 1;
        goto done_one;
    python_one:
        stop = Py_BuildValue("nLO", (Py_ssize_t)index, position, Py_None);
        goto done_one;
    fail_one:
        /* An error (no memory, say) after records were written: zero what
         * this call wrote, so that the caller's undo (which knows only the
         * positions it was told) leaves nothing behind. */
        if (position + written > call_start)
            unwrite(bufobj, call_start, position + written - call_start);
        stop = NULL;
        ok = -1;
    done_one:
        Py_DECREF(message);
        Py_XDECREF(key);
        Py_XDECREF(encoded);
        Py_XDECREF(fields);
        Py_XDECREF(result);
        Py_XDECREF(next);
        if (ok != 1) {
            Py_DECREF(seq);
            return stop;
        }
    }
    Py_DECREF(seq);
    return Py_BuildValue("nLO", (Py_ssize_t)index, position, Py_None);
}

PyDoc_STRVAR(put_one_doc,
"put_one(encoder, buf, position, limit, message, table, start,\n"
"        store_timestamp, result_type, store_host) -> AppendResult | None\n\n"
"put_batch for one message (CommitLog.put): its AppendResult, with the\n"
"record written and its queue's offset moved on; None when it does not fit\n"
"or is not the common case, with nothing done (put_batch then decides).");

static PyObject *
sp_put_one(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *encoder, *bufobj, *message, *table, *result_type, *store_host;
    PyObject *key = NULL, *encoded = NULL, *next = NULL, *result = NULL;
    long long position, limit, start, store_timestamp, queue_offset = 0, total = 0;
    int counted = 0, slot;
    /* A fault absorbed by the guard while the record was written: it went
     * to a page that is not the file's (declined: put_batch finds why). */
    unsigned long faults = guard_faults_now();

    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "put_one takes 10 arguments");
        return NULL;
    }
    encoder = args[0];
    bufobj = args[1];
    message = args[4];
    table = args[5];
    result_type = args[8];
    store_host = args[9];
    if (!exact_int(args[2], I64, &position) || !exact_int(args[3], I64, &limit) ||
        !exact_int(args[6], I64, &start) || !exact_int(args[7], I64, &store_timestamp) ||
        !PyDict_CheckExact(table) || !PyType_Check(result_type) ||
        !PyType_IsSubtype((PyTypeObject *)result_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "put_one: bad arguments");
        return NULL;
    }
    slot = queue_slot(message, table, &counted, &key, &queue_offset);
    if (slot < 0)
        goto error;
    if (slot == 0)
        goto decline;
    if (counted) {
        next = PyLong_FromLongLong(queue_offset + 1);
        if (next == NULL)
            goto error;
    }
    encoded = encode_one(encoder, bufobj, position, limit - position, message,
                         queue_offset, start + position, store_timestamp);
    if (encoded == NULL)
        goto error;
    if (encoded == Py_None)
        goto decline;
    total = PyLong_AsLongLong(encoded);
    if (total == -1 && PyErr_Occurred()) {
        total = 0;
        goto error;
    }
    if (total < 0)
        goto decline;
    if (guard_faults_now() != faults) {
        unwrite(bufobj, position, total);
        goto decline;
    }
    result = append_result(result_type, start + position, total, queue_offset,
                           store_timestamp, store_host);
    if (result == NULL)
        goto unwrite;
    /* The last step: nothing can fail after the queue's offset moves. */
    if (counted && PyDict_SetItem(table, key, next) < 0)
        goto unwrite;
    goto finish;

unwrite:
    /* An error after the record was written: zero it again. */
    unwrite(bufobj, position, total);
error:
    Py_CLEAR(result);
    goto finish;
decline:
    Py_CLEAR(result);
    result = Py_None;
    Py_INCREF(result);
finish:
    Py_XDECREF(key);
    Py_XDECREF(encoded);
    Py_XDECREF(next);
    return result;
}


/* -- decoding a span into Arrow column buffers (the data pipeline) ------- */

/* decode_span runs without the GIL (a remote store's next block is read
 * on another thread meanwhile): these buffers use the raw allocator and
 * report running out of memory by returning -1, PyErr_NoMemory being
 * raised once the GIL is back. */
typedef struct {
    char *data;
    Py_ssize_t length, capacity;
} gbuf;

static int
gbuf_reserve(gbuf *g, Py_ssize_t more)
{
    Py_ssize_t want;
    char *grown;

    if (more > PY_SSIZE_T_MAX - g->length)
        return -1;
    want = g->length + more;
    if (want <= g->capacity)
        return 0;
    if (g->capacity < 256)
        g->capacity = 256;
    while (g->capacity < want)
        g->capacity = g->capacity > PY_SSIZE_T_MAX / 2 ? want : g->capacity * 2;
    grown = PyMem_RawRealloc(g->data, (size_t)g->capacity);
    if (grown == NULL)
        return -1;
    g->data = grown;
    return 0;
}

static int
gbuf_put(gbuf *g, const void *p, Py_ssize_t n)
{
    if (gbuf_reserve(g, n) < 0)
        return -1;
    if (n)
        memcpy(g->data + g->length, p, (size_t)n);
    g->length += n;
    return 0;
}

static int
gbuf_i32(gbuf *g, int32_t v)
{
    return gbuf_put(g, &v, 4);
}

static int
gbuf_i64(gbuf *g, int64_t v)
{
    return gbuf_put(g, &v, 8);
}

/* A column buffer handed to Python as it is (no copy into a bytes
 * object: for the body column that copy, into fresh memory, cost about
 * as much as decoding): the gbuf's memory, freed with the object.  Read
 * through the buffer protocol (pyarrow.py_buffer keeps it alive). */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t length;
} ColumnBufferObject;

static void
column_buffer_dealloc(ColumnBufferObject *self)
{
    PyMem_RawFree(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
column_buffer_getbuffer(ColumnBufferObject *self, Py_buffer *view, int flags)
{
    static char empty[1];
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data ? self->data : empty,
                             self->length, 1, flags);
}

static Py_ssize_t
column_buffer_length(ColumnBufferObject *self)
{
    return self->length;
}

static PyBufferProcs column_buffer_as_buffer = {
    (getbufferproc)column_buffer_getbuffer,
    NULL,
};

static PySequenceMethods column_buffer_as_sequence = {
    .sq_length = (lenfunc)column_buffer_length,
};

static PyTypeObject ColumnBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rmqha.store._speedups.ColumnBuffer",
    .tp_basicsize = sizeof(ColumnBufferObject),
    .tp_dealloc = (destructor)column_buffer_dealloc,
    .tp_as_sequence = &column_buffer_as_sequence,
    .tp_as_buffer = &column_buffer_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One column buffer of decode_span (read-only, buffer protocol).",
};

/* The gbuf's memory as a ColumnBuffer (the gbuf is left empty), shrunk
 * first when much of it was reserved and not used. */
static PyObject *
column_buffer_take(gbuf *g)
{
    ColumnBufferObject *self;

    if (g->data != NULL && g->capacity - g->length >= (1 << 16)) {
        char *shrunk = PyMem_RawRealloc(g->data, g->length ? (size_t)g->length : 1);
        if (shrunk != NULL) {
            g->data = shrunk;
            g->capacity = g->length;
        }
    }
    self = PyObject_New(ColumnBufferObject, &ColumnBufferType);
    if (self == NULL)
        return NULL;
    self->data = g->data;
    self->length = g->length;
    g->data = NULL;
    g->length = g->capacity = 0;
    return (PyObject *)self;
}

static int
all_ascii(const unsigned char *p, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++)
        if (p[i] & 0x80)
            return 0;
    return 1;
}

/* Arrow's validity / boolean bitmaps: LSB first. */
static int
bitmap_set(gbuf *g, Py_ssize_t index, int bit)
{
    Py_ssize_t byte = index >> 3;
    if (byte >= g->length) {
        if (gbuf_reserve(g, byte + 1 - g->length) < 0)
            return -1;
        memset(g->data + g->length, 0, (size_t)(byte + 1 - g->length));
        g->length = byte + 1;
    }
    if (bit)
        g->data[byte] |= (char)(1 << (index & 7));
    return 0;
}

enum {
    /* int64 columns */
    C_OFFSET, C_QUEUE_OFFSET, C_BORN_TS, C_STORE_TS, C_PREPARED,
    /* int32 columns */
    C_SIZE, C_QUEUE_ID, C_FLAG, C_SYSFLAG, C_RECONSUME, C_BODY_SIZE,
    C_CRC_OK,  /* bitmap */
    C_TOPIC_OFF, C_TOPIC, C_BHOST_OFF, C_BHOST, C_SHOST_OFF, C_SHOST,
    C_MAP_OFF, C_PKEY_OFF, C_PKEY, C_PVAL_OFF, C_PVAL,
    C_TAGS_VALID, C_TAGS_OFF, C_TAGS, C_KEYS_VALID, C_KEYS_OFF, C_KEYS,
    C_BODY_OFF, C_BODY,
    C_COUNT
};

/* Bodies of one batch stay well inside Arrow's int32 offsets. */
#define MAX_BATCH_BODY_BYTES (1LL << 30)
#define MAX_PROPERTY_PAIRS 64
/* The most decode_span reserves for bodies before it has seen them: the
 * largest block a pipeline reader reads (docs/pipeline.md). */
#define BODY_RESERVE_MAX (64LL << 20)

typedef struct {
    unsigned char raw[8];  /* IPv4 address and int32 port, as stored */
    char text[32];
    int length;            /* -1: nothing formatted yet */
} host_text;

/* format_host: "a.b.c.d:port"; a log's hosts repeat, so the last one is kept. */
static int
put_host(gbuf *g, gbuf *offsets, const unsigned char *p, host_text *last)
{
    if (last->length < 0 || memcmp(last->raw, p, 8)) {
        memcpy(last->raw, p, 8);
        last->length = snprintf(last->text, sizeof last->text, "%u.%u.%u.%u:%d",
                                p[0], p[1], p[2], p[3], (int)rd32(p + 4));
    }
    if (gbuf_put(g, last->text, last->length) < 0)
        return -1;
    return gbuf_i32(offsets, (int32_t)g->length);
}

PyDoc_STRVAR(decode_span_doc,
"decode_span(buf, pos, end, base, bodies, max_rows) -> (stop, rows, buffers)\n\n"
"The message records from buf[pos:end] (buf[0] at commit-log offset base)\n"
"as Arrow column buffers (scan.arrow_schema's columns, little-endian), for\n"
"the records that parse_record(strict=True, check_crc=False,\n"
"report_crc=True) accepts and that are plain: IPv4 hosts, ASCII topic and\n"
"properties, no property name twice.  It stops at the first other thing\n"
"(the Python decoder takes that record), after max_rows rows, or before\n"
"1 GiB of bodies.  The buffers are ColumnBuffer objects (read-only, the\n"
"buffer protocol): the decoder's own memory, not copied.");

static PyObject *
sp_decode_span(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long long pos, end, base, max_rows;
    int bodies;
    gbuf g[C_COUNT];
    Py_ssize_t rows = 0, i;
    const unsigned char *b;
    int64_t limit;
    PyObject *buffers = NULL, *result = NULL;
    host_text born_text = {{0}, {0}, -1}, store_text = {{0}, {0}, -1};
    PyThreadState *save;
    int out_of_memory = 0;

    if (!PyArg_ParseTuple(args, "y*LLLpL", &view, &pos, &end, &base, &bodies, &max_rows))
        return NULL;
    memset(g, 0, sizeof g);
    b = view.buf;
    limit = end < (int64_t)view.len ? end : (int64_t)view.len;
    /* No Python object is touched from here to PyEval_RestoreThread (the
     * buffer stays exported, so it cannot move or shrink meanwhile). */
    save = PyEval_SaveThread();
    if (bodies && pos >= 0 && pos < limit && max_rows > 0) {
        /* The body column, reserved at once for as many bytes as the
         * records given can hold (up to BODY_RESERVE_MAX: a reader's
         * block): never grown and copied while decoding (a batch's bodies
         * are most of its bytes), what is not used never touched, and
         * given back by column_buffer_take.  Only a wish: refused (an
         * address-space limit), the buffer grows as it goes. */
        Py_ssize_t most = limit - pos < BODY_RESERVE_MAX ? (Py_ssize_t)(limit - pos)
                                                         : (Py_ssize_t)BODY_RESERVE_MAX;
        char *reserved = PyMem_RawMalloc((size_t)most);
        if (reserved != NULL) {
            g[C_BODY].data = reserved;
            g[C_BODY].capacity = most;
        }
    }
    if (gbuf_i32(&g[C_TOPIC_OFF], 0) < 0 || gbuf_i32(&g[C_BHOST_OFF], 0) < 0 ||
        gbuf_i32(&g[C_SHOST_OFF], 0) < 0 || gbuf_i32(&g[C_MAP_OFF], 0) < 0 ||
        gbuf_i32(&g[C_PKEY_OFF], 0) < 0 || gbuf_i32(&g[C_PVAL_OFF], 0) < 0 ||
        gbuf_i32(&g[C_TAGS_OFF], 0) < 0 || gbuf_i32(&g[C_KEYS_OFF], 0) < 0 ||
        gbuf_i32(&g[C_BODY_OFF], 0) < 0)
        goto oom;

    while (pos >= 0 && pos < limit && rows < max_rows) {
        const unsigned char *r = b + pos, *topic, *props, *body;
        int64_t offset = base + pos, total, p, body_length, topic_length, props_length;
        int32_t sysflag, magic;
        const unsigned char *tags = NULL, *keys = NULL;
        int64_t tags_length = 0, keys_length = 0;
        const unsigned char *names[MAX_PROPERTY_PAIRS];
        int64_t name_lengths[MAX_PROPERTY_PAIRS];
        int pairs = 0, plain = 1, k;
        int64_t start, q;

        if (!message_ok(r, limit - pos, offset, 0, 1))
            break;
        total = rd32(r);
        magic = rd32(r + 4);
        sysflag = rd32(r + 36);
        if (magic != MAGIC_V1 || (sysflag & (BORNHOST_V6 | STOREHOST_V6)))
            break;  /* v2 topic lengths and IPv6 hosts: the Python decoder */
        p = BODY_LENGTH_AT;
        body_length = rd32(r + p);
        body = r + p + 4;
        p += 4 + body_length;
        topic_length = (int8_t)r[p];
        topic = r + p + 1;
        p += 1 + topic_length;
        props_length = rd16(r + p);
        props = r + p + 2;
        if (!all_ascii(topic, topic_length) || !all_ascii(props, props_length))
            break;
        if (rows && ((bodies && g[C_BODY].length + body_length > MAX_BATCH_BODY_BYTES) ||
                     g[C_PKEY].length + g[C_PVAL].length + props_length > MAX_BATCH_BODY_BYTES))
            break;  /* the batch's int32 offsets stay far from overflowing */
        /* decode_properties: chunks split at \x02; a chunk of 3 or more
         * characters with a \x01 strictly inside is name\x01value. */
        start = 0;
        while (start <= props_length) {
            int64_t stop = start, index = -1;
            while (stop < props_length && props[stop] != 2)
                stop++;
            if (stop - start >= 3) {
                for (q = start; q < stop; q++)
                    if (props[q] == 1) {
                        index = q - start;
                        break;
                    }
                if (index > 0 && index < stop - start - 1) {
                    const unsigned char *name = props + start;
                    for (k = 0; k < pairs; k++)
                        if (name_lengths[k] == index && !memcmp(names[k], name, (size_t)index))
                            plain = 0;  /* a name twice: the last value wins, in Python */
                    if (pairs == MAX_PROPERTY_PAIRS)
                        plain = 0;
                    if (!plain)
                        break;
                    names[pairs] = name;
                    name_lengths[pairs] = index;
                    pairs++;
                    if (gbuf_put(&g[C_PKEY], name, index) < 0 ||
                        gbuf_i32(&g[C_PKEY_OFF], (int32_t)g[C_PKEY].length) < 0 ||
                        gbuf_put(&g[C_PVAL], name + index + 1, stop - start - index - 1) < 0 ||
                        gbuf_i32(&g[C_PVAL_OFF], (int32_t)g[C_PVAL].length) < 0)
                        goto oom;
                    if (index == 4 && !memcmp(name, "TAGS", 4)) {
                        tags = name + 5;
                        tags_length = stop - start - 5;
                    }
                    else if (index == 4 && !memcmp(name, "KEYS", 4)) {
                        keys = name + 5;
                        keys_length = stop - start - 5;
                    }
                }
            }
            start = stop + 1;
        }
        if (!plain) {
            /* Take back this record's properties: Python decodes it. */
            int32_t key_end = ((int32_t *)g[C_PKEY_OFF].data)[g[C_PKEY_OFF].length / 4 - 1 - pairs];
            int32_t value_end = ((int32_t *)g[C_PVAL_OFF].data)[g[C_PVAL_OFF].length / 4 - 1 - pairs];
            g[C_PKEY_OFF].length -= 4 * pairs;
            g[C_PVAL_OFF].length -= 4 * pairs;
            g[C_PKEY].length = key_end;
            g[C_PVAL].length = value_end;
            break;
        }
        if (gbuf_i64(&g[C_OFFSET], offset) < 0 ||
            gbuf_i64(&g[C_QUEUE_OFFSET], rd64(r + 20)) < 0 ||
            gbuf_i64(&g[C_BORN_TS], rd64(r + 40)) < 0 ||
            gbuf_i64(&g[C_STORE_TS], rd64(r + 56)) < 0 ||
            gbuf_i64(&g[C_PREPARED], rd64(r + 76)) < 0 ||
            gbuf_i32(&g[C_SIZE], (int32_t)total) < 0 ||
            gbuf_i32(&g[C_QUEUE_ID], rd32(r + 12)) < 0 ||
            gbuf_i32(&g[C_FLAG], rd32(r + 16)) < 0 ||
            gbuf_i32(&g[C_SYSFLAG], sysflag) < 0 ||
            gbuf_i32(&g[C_RECONSUME], rd32(r + 72)) < 0 ||
            gbuf_i32(&g[C_BODY_SIZE], (int32_t)body_length) < 0 ||
            bitmap_set(&g[C_CRC_OK], rows,
                       body_length == 0 ||
                           body_crc(body, body_length) == (int64_t)rd32(r + 8)) < 0 ||
            gbuf_put(&g[C_TOPIC], topic, topic_length) < 0 ||
            gbuf_i32(&g[C_TOPIC_OFF], (int32_t)g[C_TOPIC].length) < 0 ||
            put_host(&g[C_BHOST], &g[C_BHOST_OFF], r + 48, &born_text) < 0 ||
            put_host(&g[C_SHOST], &g[C_SHOST_OFF], r + 64, &store_text) < 0 ||
            gbuf_i32(&g[C_MAP_OFF], (int32_t)(g[C_PKEY_OFF].length / 4 - 1)) < 0 ||
            bitmap_set(&g[C_TAGS_VALID], rows, tags != NULL) < 0 ||
            gbuf_put(&g[C_TAGS], tags, tags_length) < 0 ||
            gbuf_i32(&g[C_TAGS_OFF], (int32_t)g[C_TAGS].length) < 0 ||
            bitmap_set(&g[C_KEYS_VALID], rows, keys != NULL) < 0 ||
            gbuf_put(&g[C_KEYS], keys, keys_length) < 0 ||
            gbuf_i32(&g[C_KEYS_OFF], (int32_t)g[C_KEYS].length) < 0)
            goto oom;
        if (bodies && (gbuf_put(&g[C_BODY], body, body_length) < 0 ||
                       gbuf_i32(&g[C_BODY_OFF], (int32_t)g[C_BODY].length) < 0))
            goto oom;
        rows++;
        pos += total;
    }
    goto decoded;
oom:
    out_of_memory = 1;
decoded:
    PyEval_RestoreThread(save);
    if (out_of_memory) {
        PyErr_NoMemory();
        goto error;
    }
    buffers = PyTuple_New(C_COUNT);
    if (buffers == NULL)
        goto error;
    for (i = 0; i < C_COUNT; i++) {
        PyObject *item = column_buffer_take(&g[i]);
        if (item == NULL)
            goto error;
        PyTuple_SET_ITEM(buffers, i, item);
    }
    result = Py_BuildValue("LnN", pos, rows, buffers);
    buffers = NULL;
error:
    Py_XDECREF(buffers);
    for (i = 0; i < C_COUNT; i++)
        PyMem_RawFree(g[i].data);
    PyBuffer_Release(&view);
    return result;
}

/* -- a pull's records, for the client ------------------------------------ */

/* The instance-dict keys of rmqha.client._consume.ReceivedMessage. */
static PyObject *k_topic, *k_body, *k_queue, *k_queue_offset, *k_commit_log_offset,
    *k_flag, *k_sys_flag, *k_born_timestamp, *k_store_timestamp, *k_reconsume_times,
    *k_body_crc, *k_lazy, *empty_tuple;

PyDoc_STRVAR(pull_decode_doc,
"pull_decode(buf, pos, cls, queue, topic, queue_id, extra, tags, out) -> pos\n\n"
"rmqha.client._consume._decode_one over the records of a FOUND pull body from\n"
"buf[pos:], each appended to out as an instance of cls (ReceivedMessage)\n"
"whose __dict__ holds the eager fields and _lazy (properties bytes, born\n"
"and store host bytes, extra), the queue being `queue` itself.  Records\n"
"whose TAGS is not in the set `tags` (None: every record) are skipped.\n"
"It stops, answering where, at the end, at anything _decode_one refuses\n"
"(it then says why), and at what it leaves to _decode_one: fewer than 91\n"
"bytes, a v2 record, IPv6 hosts, a compressed body, another topic (bytes\n"
"`topic`) or queue id, and (with tags) non-ASCII properties.");

/* _decode_one's tag test on ASCII properties: the last TAGS value in the set. */
static int
pull_tags_match(const unsigned char *props, int64_t n, PyObject *tags)
{
    const unsigned char *value = NULL;
    int64_t value_length = 0, start = 0;

    while (start <= n) {
        int64_t stop = start, index = -1, q;
        while (stop < n && props[stop] != 2)
            stop++;
        for (q = start; q < stop; q++)
            if (props[q] == 1) {
                index = q - start;
                break;
            }
        if (index > 0 && index < stop - start - 1 && index == 4 && !memcmp(props + start, "TAGS", 4)) {
            value = props + start + 5;
            value_length = stop - start - 5;
        }
        start = stop + 1;
    }
    if (value == NULL)
        return 0;
    {
        PyObject *text = PyUnicode_FromStringAndSize((const char *)value, (Py_ssize_t)value_length);
        int found;
        if (text == NULL)
            return -1;
        found = PySet_Contains(tags, text);
        Py_DECREF(text);
        return found;
    }
}

static PyObject *
sp_pull_decode(PyObject *module, PyObject *args)
{
    Py_buffer view, topic;
    long long pos;
    int queue_id;
    PyObject *cls, *queue, *extra, *tags, *out;
    PyObject *born = NULL, *store = NULL, *result = NULL, *topic_text = NULL;
    const unsigned char *b;
    int64_t end;

    if (!PyArg_ParseTuple(args, "y*LO!Oy*iOOO!", &view, &pos, &PyType_Type, &cls, &queue,
                          &topic, &queue_id, &extra, &tags, &PyList_Type, &out))
        return NULL;
    if (tags != Py_None && !PyAnySet_Check(tags)) {
        PyErr_SetString(PyExc_TypeError, "tags must be a set or None");
        goto done;
    }
    if ((topic_text = PyObject_GetAttr(queue, k_topic)) == NULL)
        goto done;
    b = view.buf;
    end = view.len;
    while (pos >= 0 && end - pos >= MIN_FIXED) {
        const unsigned char *r = b + pos, *props;
        int64_t total = rd32(r), p, body_length, topic_length, props_length;
        int32_t sysflag = rd32(r + 36);
        PyObject *dict, *lazy, *message, *props_bytes;

        if (!message_ok(r, end - pos, rd64(r + 28), 0, 0))
            break;
        if (rd32(r + 4) != MAGIC_V1 || (sysflag & (BORNHOST_V6 | STOREHOST_V6 | 0x1)))
            break;
        if (rd32(r + 12) != queue_id)
            break;
        body_length = rd32(r + BODY_LENGTH_AT);
        p = BODY_LENGTH_AT + 4 + body_length;
        topic_length = (int8_t)r[p];
        if (topic_length != (int64_t)topic.len || memcmp(r + p + 1, topic.buf, (size_t)topic_length))
            break;
        p += 1 + topic_length;
        props_length = rd16(r + p);
        props = r + p + 2;
        if (tags != Py_None) {
            int found;
            if (!all_ascii(props, props_length))
                break;
            found = pull_tags_match(props, props_length, tags);
            if (found < 0)
                goto done;
            if (!found) {
                pos += total;
                continue;
            }
        }
        /* A pull's hosts repeat: the last ones' bytes are kept. */
        if (born == NULL || memcmp(PyBytes_AS_STRING(born), r + 48, 8)) {
            Py_XDECREF(born);
            if ((born = PyBytes_FromStringAndSize((const char *)r + 48, 8)) == NULL)
                goto done;
        }
        if (store == NULL || memcmp(PyBytes_AS_STRING(store), r + 64, 8)) {
            Py_XDECREF(store);
            if ((store = PyBytes_FromStringAndSize((const char *)r + 64, 8)) == NULL)
                goto done;
        }
        props_bytes = PyBytes_FromStringAndSize((const char *)props, (Py_ssize_t)props_length);
        if (props_bytes == NULL)
            goto done;
        lazy = PyTuple_Pack(4, props_bytes, born, store, extra);
        Py_DECREF(props_bytes);
        if (lazy == NULL)
            goto done;
        dict = PyDict_New();
        if (dict == NULL) {
            Py_DECREF(lazy);
            goto done;
        }
#define PUT(key, make)                                                   \
        do {                                                             \
            PyObject *v_ = (make);                                       \
            if (v_ == NULL || PyDict_SetItem(dict, key, v_) < 0) {       \
                Py_XDECREF(v_);                                          \
                Py_DECREF(dict);                                         \
                Py_DECREF(lazy);                                         \
                goto done;                                               \
            }                                                            \
            Py_DECREF(v_);                                               \
        } while (0)
        Py_INCREF(topic_text);
        PUT(k_topic, topic_text);
        PUT(k_body, PyBytes_FromStringAndSize((const char *)r + BODY_LENGTH_AT + 4, (Py_ssize_t)body_length));
        Py_INCREF(queue);
        PUT(k_queue, queue);
        PUT(k_queue_offset, PyLong_FromLongLong(rd64(r + 20)));
        PUT(k_commit_log_offset, PyLong_FromLongLong(rd64(r + 28)));
        PUT(k_flag, PyLong_FromLong(rd32(r + 16)));
        PUT(k_sys_flag, PyLong_FromLong(sysflag));
        PUT(k_born_timestamp, PyLong_FromLongLong(rd64(r + 40)));
        PUT(k_store_timestamp, PyLong_FromLongLong(rd64(r + 56)));
        PUT(k_reconsume_times, PyLong_FromLong(rd32(r + 72)));
        PUT(k_body_crc, PyLong_FromLong(rd32(r + 8)));
        Py_INCREF(lazy);
        PUT(k_lazy, lazy);
#undef PUT
        Py_DECREF(lazy);
        message = PyBaseObject_Type.tp_new((PyTypeObject *)cls, empty_tuple, NULL);
        if (message == NULL || PyObject_GenericSetDict(message, dict, NULL) < 0 ||
            PyList_Append(out, message) < 0) {
            Py_XDECREF(message);
            Py_DECREF(dict);
            goto done;
        }
        Py_DECREF(message);
        Py_DECREF(dict);
        pos += total;
    }
    result = PyLong_FromLongLong(pos);
done:
    Py_XDECREF(topic_text);
    Py_XDECREF(born);
    Py_XDECREF(store);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&view);
    return result;
}

/* -- a pull's consume-queue units, for the broker ------------------------- */

PyDoc_STRVAR(pull_walk_doc,
"pull_walk(units, walk, runs, matches, max_msg_nums, bytes_in_memory,\n"
"          count_in_memory, bytes_in_disk, count_in_disk, in_disk_below,\n"
"          log_min, log_max, segment_size) -> bool\n\n"
"rmqha.remoting.pulls._walk_units compiled: get_message's walk over the\n"
"20-byte units of one chunk, `walk` ([count, total, scanned, max_pulling,\n"
"next_file_start, status]) and `runs` (lists [start, end]) updated in\n"
"place, `matches` (None or a callable of a tag code) called for each unit\n"
"scanned; True when the batch is full.");

static int
set_walk(PyObject *walk, Py_ssize_t i, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    return PyList_SetItem(walk, i, v);  /* (steals v) */
}

static PyObject *
sp_pull_walk(PyObject *module, PyObject *args)
{
    Py_buffer view;
    PyObject *walk, *runs, *matches, *current = NULL, *result = NULL;
    long long max_msg_nums, bytes_mem, count_mem, bytes_disk, count_disk, in_disk_below,
        log_min, log_max, segment;
    long long state[6];
    long long count, total, scanned, max_pulling, next_file_start, status, current_end = 0;
    const unsigned char *u;
    Py_ssize_t n, i;
    int full = 0, dirty = 0, beyond = 0, moved = 0;
    int64_t beyond_base = 0;  /* beyond: next_file_start is beyond_base + segment > INT64_MAX */

    if (!PyArg_ParseTuple(args, "y*O!O!OLLLLLLLLL", &view, &PyList_Type, &walk, &PyList_Type, &runs,
                          &matches, &max_msg_nums, &bytes_mem, &count_mem, &bytes_disk, &count_disk,
                          &in_disk_below, &log_min, &log_max, &segment))
        return NULL;
    if (PyList_GET_SIZE(walk) != 6 || segment <= 0) {
        PyErr_SetString(PyExc_ValueError, "walk must hold 6 integers and segment_size be positive");
        goto done;
    }
    for (i = 0; i < 6; i++) {
        int overflow = 0;
        state[i] = PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(walk, i), &overflow);
        if (state[i] == -1 && PyErr_Occurred())
            goto done;
        if (overflow && !(i == 4 && overflow > 0)) {
            PyErr_SetString(PyExc_OverflowError, "a walk value does not fit 64 bits");
            goto done;
        }
        if (overflow)
            beyond = 1;  /* (past every unit's offset: left as it is unless moved) */
    }
    count = state[0], total = state[1], scanned = state[2], max_pulling = state[3];
    next_file_start = state[4], status = state[5];
    if (PyList_GET_SIZE(runs) > 0) {
        current = PyList_GET_ITEM(runs, PyList_GET_SIZE(runs) - 1);
        if (!PyList_Check(current) || PyList_GET_SIZE(current) != 2) {
            PyErr_SetString(PyExc_ValueError, "runs must be lists [start, end]");
            current = NULL;
            goto done;
        }
        Py_INCREF(current);
        current_end = PyLong_AsLongLong(PyList_GET_ITEM(current, 1));
        if (current_end == -1 && PyErr_Occurred())
            goto done;
    }
    u = view.buf;
    n = view.len / 20;
    for (i = 0; i < n; i++, u += 20) {
        int64_t offset = rd64(u), size = rd32(u + 8), code = rd64(u + 12);

        max_pulling = offset;
        if (beyond || offset < next_file_start) {
            scanned++;
            continue;
        }
        if (count) {
            if (max_msg_nums <= count) {
                full = 1;
                break;
            }
            if (offset < in_disk_below ? (total + size > bytes_disk || count > count_disk - 1)
                                       : (total + size > bytes_mem || count > count_mem - 1)) {
                full = 1;
                break;
            }
        }
        scanned++;
        if (matches != Py_None) {
            PyObject *arg = PyLong_FromLongLong(code), *answer;
            int yes;
            if (arg == NULL)
                goto done;
            answer = PyObject_CallOneArg(matches, arg);
            Py_DECREF(arg);
            if (answer == NULL)
                goto done;
            yes = PyObject_IsTrue(answer);
            Py_DECREF(answer);
            if (yes < 0)
                goto done;
            if (!yes)
                continue;
        }
        if (!(log_min <= offset && offset <= log_max - size) || size <= 0) {
            /* (Its log file was deleted: on to the next one; Python's %.) */
            int64_t m = offset % segment;
            if (m < 0)
                m += segment;
            if (!count)
                status = 1;
            moved = 1;
            beyond = offset - m > INT64_MAX - segment;
            if (beyond)
                beyond_base = offset - m;
            else
                next_file_start = offset - m + segment;
            continue;
        }
        if (current != NULL && current_end == offset && offset % segment != 0) {
            current_end += size;
            dirty = 1;
        }
        else {
            PyObject *run;
            if (dirty && set_walk(current, 1, current_end) < 0)
                goto done;
            dirty = 0;
            run = Py_BuildValue("[LL]", (long long)offset, (long long)(offset + size));
            if (run == NULL)
                goto done;
            if (PyList_Append(runs, run) < 0) {
                Py_DECREF(run);
                goto done;
            }
            Py_XDECREF(current);
            current = run;  /* (the reference Py_BuildValue gave) */
            current_end = offset + size;
        }
        count++;
        total += size;
        status = 2;
        next_file_start = -1;
        beyond = 0;
        moved = 1;
    }
    if (dirty && set_walk(current, 1, current_end) < 0)
        goto done;
    state[0] = count, state[1] = total, state[2] = scanned, state[3] = max_pulling;
    state[4] = next_file_start, state[5] = status;
    for (i = 0; i < 6; i++) {
        if (i == 4 && beyond) {
            /* Python's value: base + segment, past 64 bits. */
            PyObject *base, *step, *sum;
            if (!moved)
                continue;
            base = PyLong_FromLongLong(beyond_base);
            step = PyLong_FromLongLong(segment);
            sum = base && step ? PyNumber_Add(base, step) : NULL;
            Py_XDECREF(base);
            Py_XDECREF(step);
            if (sum == NULL || PyList_SetItem(walk, 4, sum) < 0)
                goto done;
            continue;
        }
        if (set_walk(walk, i, state[i]) < 0)
            goto done;
    }
    result = PyBool_FromLong(full);
done:
    Py_XDECREF(current);
    PyBuffer_Release(&view);
    return result;
}

/* -- crc32(data, value=0) ------------------------------------------------ */

/* Inputs this long are checksummed with the GIL released. */
#define CRC_NOGIL_MIN (64 * 1024)

PyDoc_STRVAR(crc32_doc,
"crc32(data, value=0, /) -> int\n\n"
"zlib.crc32(data, value), the same results: folded with PCLMULQDQ where\n"
"the CPU has it, zlib's crc32 otherwise; the GIL released for big inputs.");

static PyObject *
sp_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    uint32_t crc = 0;

    /* zlib.crc32's own words for a wrong call. */
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "crc32 expected at least 1 argument, got 0");
        return NULL;
    }
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "crc32 expected at most 2 arguments, got %zd", nargs);
        return NULL;
    }
    if (nargs == 2) {
        /* Masked to 32 bits, as zlib.crc32 takes it. */
        unsigned long value = PyLong_AsUnsignedLongMask(args[1]);
        if (value == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        crc = (uint32_t)value;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len >= CRC_NOGIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc32_any(crc, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    }
    else
        crc = crc32_any(crc, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(crc32_set_folding_doc,
"_crc32_set_folding(on, /) -> bool\n\n"
"For tests and benchmarks: whether crc32 (and every CRC in this module)\n"
"folds with PCLMULQDQ; it can only be turned on where the CPU has it.\n"
"Returns the setting now in force.");

/* Set *flag from arg's truth, on only where available() says the CPU can;
 * the setting now in force. */
static PyObject *
crc_setting(PyObject *arg, int *flag, int (*available)(void))
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    *flag = on && available();
    return PyBool_FromLong(*flag);
}

static PyObject *
sp_crc32_set_folding(PyObject *self, PyObject *arg)
{
    return crc_setting(arg, &crc_folding, crc_folding_available);
}

PyDoc_STRVAR(crc32_set_wide_doc,
"_crc32_set_wide(on, /) -> bool\n\n"
"For tests and benchmarks: whether folding (while it is on) takes 256\n"
"bytes a step with AVX-512 VPCLMULQDQ; it can only be turned on where the\n"
"CPU has it. Returns the setting now in force.");

static PyObject *
sp_crc32_set_wide(PyObject *self, PyObject *arg)
{
    return crc_setting(arg, &crc_wide, crc_wide_available);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* ---- Prefault: the pages ahead of the put position, on a C thread --------
 *
 * One per writable commit log (rmqha/store/_prefault.py wraps it). The put
 * thread says how far it wants the current mapping populated (ask); a
 * pthread of its own, which never touches a Python object and never takes
 * the GIL, populates [done, target) CHUNK bytes per madvise. The mapping is
 * held as a buffer export from ask until release, so the mmap cannot be
 * closed under the thread (close raises BufferError), and release waits for
 * the chunk in flight with the GIL dropped.
 */

#define PREFAULT_CHUNK (1 << 20)

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop, busy, working, has_view;
    pid_t pid; /* the process the thread runs in */
    Py_buffer view;
    char *base; /* NULL: nothing to do */
    size_t done, target;
    long long cpu_ns; /* the thread's CPU time when its last chunk ended */
} PrefaultObject;

static void *
prefault_main(void *arg)
{
    PrefaultObject *self = (PrefaultObject *)arg;
    long page = sysconf(_SC_PAGESIZE);

    pthread_mutex_lock(&self->mu);
    for (;;) {
        char *base;
        size_t start, length;
        struct timespec used;
        int rc;

        while (!self->stop && (self->base == NULL || self->done >= self->target))
            pthread_cond_wait(&self->cv, &self->mu);
        if (self->stop)
            break;
        base = self->base;
        start = self->done - self->done % (size_t)page;
        length = self->target - start;
        if (length > PREFAULT_CHUNK)
            length = PREFAULT_CHUNK;
        self->busy = 1;
        pthread_mutex_unlock(&self->mu);
        rc = madvise(base + start, length, MADV_POPULATE_WRITE);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &used);
        pthread_mutex_lock(&self->mu);
        self->busy = 0;
        self->cpu_ns = (long long)used.tv_sec * 1000000000LL + used.tv_nsec;
        if (rc != 0) {
            /* No MADV_POPULATE_WRITE (EINVAL before Linux 5.14), or the
               kernel would not: the puts fault their pages in themselves. */
            self->working = 0;
            self->base = NULL;
        }
        else if (self->base == base && self->done < start + length)
            self->done = start + length;
        pthread_cond_broadcast(&self->cv);
    }
    pthread_mutex_unlock(&self->mu);
    return NULL;
}

/* In a child forked while the thread ran, there is no thread (and its
   mutex may have been held at the fork): start afresh. */
static void
prefault_forked(PrefaultObject *self)
{
    if (self->started && self->pid != getpid()) {
        pthread_mutex_init(&self->mu, NULL);
        pthread_cond_init(&self->cv, NULL);
        self->started = self->busy = 0;
        self->base = NULL;
        self->done = self->target = 0;
        self->cpu_ns = 0;
    }
}

/* Forget the mapping, waiting (GIL dropped) for a chunk in flight. */
static void
prefault_drop(PrefaultObject *self)
{
    prefault_forked(self);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    self->base = NULL;
    self->done = self->target = 0;
    while (self->busy)
        pthread_cond_wait(&self->cv, &self->mu);
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    if (self->has_view) {
        self->has_view = 0;
        PyBuffer_Release(&self->view);
    }
}

static void
prefault_stop(PrefaultObject *self)
{
    prefault_drop(self);
    if (self->started) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mu);
        self->stop = 1;
        pthread_cond_broadcast(&self->cv);
        pthread_mutex_unlock(&self->mu);
        pthread_join(self->thread, NULL);
        Py_END_ALLOW_THREADS
        self->started = 0;
    }
    self->stop = 1;
}

static PyObject *
prefault_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PrefaultObject *self;

    if (!_PyArg_NoPositional("Prefault", args) || !_PyArg_NoKeywords("Prefault", kwds))
        return NULL;
    self = (PrefaultObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->cv, NULL);
    self->working = 1;
    return (PyObject *)self;
}

static void
prefault_dealloc(PrefaultObject *self)
{
    prefault_stop(self);
    pthread_cond_destroy(&self->cv);
    pthread_mutex_destroy(&self->mu);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(prefault_ask_doc,
"ask(mm, position, target, /) -> bool\n\n"
"Populate the writable mapping mm (an mmap) from the page of position up\n"
"to target, on this object's thread (started on the first ask). A new mm\n"
"replaces the one held (released first). False once the kernel could\n"
"not (no MADV_POPULATE_WRITE) or after stop: nothing is done then.");

static PyObject *
prefault_ask(PrefaultObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long position, target;
    int working;

    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "ask takes 3 arguments");
        return NULL;
    }
    if (!exact_int(args[1], 0, LLONG_MAX, &position) || !exact_int(args[2], 0, LLONG_MAX, &target)) {
        PyErr_SetString(PyExc_TypeError, "ask: position and target must be ints >= 0");
        return NULL;
    }
    if (self->stop || !self->working)
        Py_RETURN_FALSE;
    prefault_forked(self);
    if (!self->has_view || self->view.obj != args[0]) {
        prefault_drop(self);
        if (PyObject_GetBuffer(args[0], &self->view, PyBUF_WRITABLE) < 0)
            return NULL;
        self->has_view = 1;
    }
    if (target > self->view.len)
        target = self->view.len;
    if (position > target)
        position = target;
    if (!self->started) {
        if (pthread_create(&self->thread, NULL, prefault_main, self) != 0) {
            self->working = 0;
            Py_RETURN_FALSE;
        }
        self->started = 1;
        self->pid = getpid();
    }
    pthread_mutex_lock(&self->mu);
    if (self->base != self->view.buf) {
        self->base = self->view.buf;
        self->done = (size_t)position;
        self->target = (size_t)target;
    }
    else {
        if (self->done < (size_t)position)
            self->done = (size_t)position;
        if (self->target < (size_t)target)
            self->target = (size_t)target;
    }
    pthread_cond_signal(&self->cv);
    working = self->working;
    pthread_mutex_unlock(&self->mu);
    return PyBool_FromLong(working);
}

PyDoc_STRVAR(prefault_release_doc,
"release() -> None\n\n"
"Stop working on the mapping held, waiting for a chunk in flight (at most\n"
"1 MiB), and release it: call before the mapping is closed.");

static PyObject *
prefault_release(PrefaultObject *self, PyObject *unused)
{
    prefault_drop(self);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(prefault_stop_doc,
"stop() -> None\n\nrelease(), and end the thread; later asks do nothing.");

static PyObject *
prefault_stop_method(PrefaultObject *self, PyObject *unused)
{
    prefault_stop(self);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(prefault_wait_doc,
"wait() -> int\n\n"
"For tests: wait (GIL dropped) until what was asked is populated, or the\n"
"kernel could not; the bytes populated of the mapping held.");

static PyObject *
prefault_wait(PrefaultObject *self, PyObject *unused)
{
    size_t done;

    prefault_forked(self);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    while (self->base != NULL && self->done < self->target && self->started && !self->stop)
        pthread_cond_wait(&self->cv, &self->mu);
    while (self->busy)
        pthread_cond_wait(&self->cv, &self->mu);
    done = self->base != NULL ? self->done : 0;
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    return PyLong_FromSize_t(done);
}

PyDoc_STRVAR(prefault_cpu_time_doc,
"cpu_time() -> float\n\n"
"The seconds of CPU the thread had used when its last chunk ended (0.0\n"
"before it started): what the pre-faulting itself costs.");

static PyObject *
prefault_cpu_time(PrefaultObject *self, PyObject *unused)
{
    long long ns;

    prefault_forked(self);
    pthread_mutex_lock(&self->mu);
    ns = self->cpu_ns;
    pthread_mutex_unlock(&self->mu);
    return PyFloat_FromDouble((double)ns / 1e9);
}

static PyObject *
prefault_get_working(PrefaultObject *self, void *closure)
{
    return PyBool_FromLong(self->working && !self->stop);
}

static PyObject *
prefault_get_running(PrefaultObject *self, void *closure)
{
    return PyBool_FromLong(self->started);
}

static PyMethodDef prefault_methods[] = {
    {"ask", (PyCFunction)(void (*)(void))prefault_ask, METH_FASTCALL, prefault_ask_doc},
    {"release", (PyCFunction)prefault_release, METH_NOARGS, prefault_release_doc},
    {"cpu_time", (PyCFunction)prefault_cpu_time, METH_NOARGS, prefault_cpu_time_doc},
    {"stop", (PyCFunction)prefault_stop_method, METH_NOARGS, prefault_stop_doc},
    {"wait", (PyCFunction)prefault_wait, METH_NOARGS, prefault_wait_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef prefault_getset[] = {
    {"working", (getter)prefault_get_working, NULL, "False once it cannot or was stopped.", NULL},
    {"running", (getter)prefault_get_running, NULL, "Whether its thread is running.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PrefaultType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rmqha.store._speedups.Prefault",
    .tp_basicsize = sizeof(PrefaultObject),
    .tp_dealloc = (destructor)prefault_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Populates the pages ahead of the put position on a thread of its own.",
    .tp_methods = prefault_methods,
    .tp_getset = prefault_getset,
    .tp_new = prefault_new,
};


/* ---- The SIGBUS guard of the segment mappings --------------------------
 *
 * A page of a shared file mapping that lies past the end of its file
 * cannot be read or written: the access raises SIGBUS, whose default action
 * kills the process.  Another process truncating a segment file under a
 * broker did exactly that to its next put (issue 25).  Checking the file's
 * size before each access would leave a window (the truncation can come
 * between the check and the access) and cost a system call per put, so the
 * access itself is made unable to kill: every segment mapping is registered
 * here (guard_add), and this SIGBUS handler, for a fault inside one, maps
 * anonymous zero pages over the mapping from the faulting page to its end
 * (mmap MAP_FIXED; the file's pages there are gone anyway), records where,
 * and returns: the access runs again against those pages and completes.
 * What it wrote is not in the file and what it read is zeros, so the store
 * asks (guard_fault, guard_faults; put_one declines by itself) before it
 * answers a put or sends what it read, and refuses writes from then on.
 *
 * This covers every access — CPython's mmap slicing, memoryviews, the
 * codec — with no longjmp out of code that holds references or locks.  A
 * fault anywhere else, or a SIGBUS another process sent, goes to whatever
 * handler was in place before this one (faulthandler's, or the default
 * action): this handler puts it back and returns (the fault then happens
 * again and meets it) or raises the signal again.  guard_add installs the
 * handler whenever it is not the one in place.  (faulthandler enabled after
 * it sees a guarded fault first, dumps the stacks and raises the signal
 * towards this handler, which lets the access run again: the process
 * lives, with faulthandler's dump on stderr.)
 */

#define GUARD_SLOTS 1024

typedef struct {
    uintptr_t base;   /* written before length, read after it */
    size_t length;    /* 0: a free slot */
    size_t fault_at;  /* 1 + where the lowest faulting page starts; 0: none */
    int prot;
} guard_slot_t;

static guard_slot_t guard_slots[GUARD_SLOTS];
static struct sigaction guard_previous;
static volatile sig_atomic_t guard_chaining;
static long guard_page;

static void
guard_handler(int signum, siginfo_t *info, void *context)
{
    int saved = errno;
    int i;

    (void)signum;
    (void)context;
    /* si_code > 0: raised by the kernel for an access (not kill/raise). */
    if (info != NULL && info->si_code > 0 && !guard_chaining) {
        uintptr_t address = (uintptr_t)info->si_addr;

        for (i = 0; i < GUARD_SLOTS; i++) {
            guard_slot_t *slot = &guard_slots[i];
            size_t length = __atomic_load_n(&slot->length, __ATOMIC_ACQUIRE);
            uintptr_t base, page;
            size_t position, was;

            if (length == 0)
                continue;
            base = __atomic_load_n(&slot->base, __ATOMIC_RELAXED);
            if (address < base || address - base >= length)
                continue;
            page = address - (address - base) % (uintptr_t)guard_page;
            if (mmap((void *)page, base + length - page, slot->prot,
                     MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                == MAP_FAILED)
                break;
            position = (size_t)(page - base) + 1;
            was = __atomic_load_n(&slot->fault_at, __ATOMIC_RELAXED);
            while ((was == 0 || position < was) &&
                   !__atomic_compare_exchange_n(&slot->fault_at, &was, position, 0,
                                                __ATOMIC_RELEASE, __ATOMIC_RELAXED))
                ;
            __atomic_add_fetch(&guard_fault_count, 1, __ATOMIC_RELEASE);
            errno = saved;
            return;
        }
    }
    if (info != NULL && info->si_code <= 0 && info->si_pid == getpid() && !guard_chaining) {
        /* Raised by this process: faulthandler, enabled after this handler
         * was installed, passing a fault on to the handler it replaced
         * (this one) after dumping the stacks.  Returning lets that fault
         * happen again and be judged here. */
        errno = saved;
        return;
    }
    if (guard_chaining) {
        /* Back here while passing a signal on (a previous handler raising
         * it again towards the one it replaced, this one): the default
         * action, as if no handler had been there. */
        struct sigaction fallback;

        memset(&fallback, 0, sizeof fallback);
        fallback.sa_handler = SIG_DFL;
        sigemptyset(&fallback.sa_mask);
        sigaction(SIGBUS, &fallback, NULL);
        raise(SIGBUS);
        errno = saved;
        return;
    }
    /* Not ours: to the handler that was there before. */
    guard_chaining = 1;
    sigaction(SIGBUS, &guard_previous, NULL);
    if (info == NULL || info->si_code <= 0)
        raise(SIGBUS);
    /* (A fault: returning runs the access again, which faults again.) */
    errno = saved;
}

/* Make guard_handler the SIGBUS handler if it is not, keeping the one in
 * place to pass other signals on to.  0, or -1 with errno set. */
static int
guard_install(void)
{
    struct sigaction current, mine;

    if (sigaction(SIGBUS, NULL, &current) != 0)
        return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == guard_handler &&
        !guard_chaining)
        return 0;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = guard_handler;
    mine.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART;
    sigemptyset(&mine.sa_mask);
    if (!((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == guard_handler))
        guard_previous = current;
    guard_chaining = 0;
    return sigaction(SIGBUS, &mine, NULL);
}

PyDoc_STRVAR(guard_add_doc,
"guard_add(mm, /) -> int\n\n"
"Guard the mapping mm (an mmap.mmap) against SIGBUS: a fault in it maps\n"
"zero pages over it from the faulting page on instead of killing the\n"
"process (see guard_fault). Returns the guard's slot, or -1 when every\n"
"slot is taken (the mapping is then not guarded). Call guard_remove\n"
"before the mapping is closed.");

static PyObject *
sp_guard_add(PyObject *module, PyObject *mm)
{
    Py_buffer view;
    uintptr_t base;
    size_t length;
    int prot, i;

    if (strcmp(Py_TYPE(mm)->tp_name, "mmap.mmap") != 0) {
        PyErr_SetString(PyExc_TypeError, "guard_add: not an mmap.mmap");
        return NULL;
    }
    if (PyObject_GetBuffer(mm, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    base = (uintptr_t)view.buf;
    length = (size_t)view.len;
    prot = view.readonly ? PROT_READ : PROT_READ | PROT_WRITE;
    PyBuffer_Release(&view);
    if (guard_page <= 0)
        guard_page = sysconf(_SC_PAGESIZE);
    if (length == 0 || guard_page <= 0 || base % (uintptr_t)guard_page)
        return PyLong_FromLong(-1);
    if (guard_install() != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    /* Slots are taken and given back with the GIL held; the handler only
     * reads them (length last written, first read). */
    for (i = 0; i < GUARD_SLOTS; i++) {
        guard_slot_t *slot = &guard_slots[i];

        if (__atomic_load_n(&slot->length, __ATOMIC_ACQUIRE) != 0)
            continue;
        __atomic_store_n(&slot->base, base, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->fault_at, 0, __ATOMIC_RELAXED);
        slot->prot = prot;
        __atomic_store_n(&slot->length, length, __ATOMIC_RELEASE);
        return PyLong_FromLong(i);
    }
    return PyLong_FromLong(-1);
}

static int
guard_slot_arg(PyObject *arg, int *slot)
{
    long value = PyLong_AsLong(arg);

    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0 || value >= GUARD_SLOTS) {
        PyErr_Format(PyExc_ValueError, "guard slot %ld is out of range", value);
        return -1;
    }
    *slot = (int)value;
    return 0;
}

PyDoc_STRVAR(guard_remove_doc,
"guard_remove(slot, /) -> None\n\n"
"Stop guarding the mapping of slot (before it is closed).");

static PyObject *
sp_guard_remove(PyObject *module, PyObject *arg)
{
    int slot;

    if (guard_slot_arg(arg, &slot) < 0)
        return NULL;
    __atomic_store_n(&guard_slots[slot].length, 0, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(guard_fault_doc,
"guard_fault(slot, /) -> int\n\n"
"Where, in the mapping of slot, the lowest page the guard replaced\n"
"starts (an access there faulted: the file does not reach it, or it\n"
"could not be read); -1: none.");

static PyObject *
sp_guard_fault(PyObject *module, PyObject *arg)
{
    int slot;
    size_t at;

    if (guard_slot_arg(arg, &slot) < 0)
        return NULL;
    at = __atomic_load_n(&guard_slots[slot].fault_at, __ATOMIC_ACQUIRE);
    return PyLong_FromLongLong(at == 0 ? -1 : (long long)(at - 1));
}

PyDoc_STRVAR(guard_faults_doc,
"guard_faults() -> int\n\n"
"How many faults the guard has absorbed in this process, all mappings\n"
"together (a cheap \"anything new?\").");

static PyObject *
sp_guard_faults(PyObject *module, PyObject *unused)
{
    return PyLong_FromUnsignedLong(guard_faults_now());
}

/* ---------------------------------------------------------------------------
 * Remoting frames (rmqha/remoting/_frames.py is the reference, and
 * rmqha/remoting/sends.py for the send header): the JSON header of a
 * command as a client writes it, a SEND_MESSAGE_V2 header's fields, and the
 * JSON header of an answer.  As above, each either answers exactly what the
 * Python code answers or says "not sure" (None), and the Python code then
 * runs, with its errors.
 */

typedef struct {
    const unsigned char *p, *end;
    char *scratch;          /* for strings with escapes */
    Py_ssize_t scratch_size;
} jscan;

static void
js_ws(jscan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

/* After an object's member: 1 at a ',' (consumed, with the spaces after
 * it: the next member follows), 0 at the closing '}' (consumed), -1 at
 * anything else. */
static int
js_member_end(jscan *s)
{
    js_ws(s);
    if (s->p < s->end && *s->p == ',') {
        s->p++;
        js_ws(s);
        return 1;
    }
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    return -1;
}

static int
js_hex4(const unsigned char *p, unsigned int *out)
{
    unsigned int v = 0;
    int i;

    for (i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    *out = v;
    return 0;
}

/* A JSON string at s->p (its opening quote): a new str, or NULL with no
 * exception set when it is not one this scanner takes (Python's decoder
 * then says what is wrong, or takes it: a surrogate escape).  -1 return
 * value through *failed on a real error (memory). */
static PyObject *
js_string(jscan *s, int *failed)
{
    const unsigned char *p = s->p + 1, *start = p;
    Py_ssize_t out = 0;
    int escaped = 0;
    PyObject *text;

    *failed = 0;
    /* First pass: find the end, validate escapes, size the result. */
    while (p < s->end && *p != '"') {
        if (*p < 0x20)
            return NULL;    /* strict JSON: a raw control character */
        if (*p == '\\') {
            unsigned int u;

            escaped = 1;
            if (p + 1 >= s->end)
                return NULL;
            switch (p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p += 2; out += 1;
                break;
            case 'u':
                if (s->end - p < 6 || js_hex4(p + 2, &u) < 0)
                    return NULL;
                if (u >= 0xD800 && u <= 0xDFFF)
                    return NULL;    /* surrogates: Python's decoder */
                out += u < 0x80 ? 1 : u < 0x800 ? 2 : 3;
                p += 6;
                break;
            default:
                return NULL;
            }
            continue;
        }
        p++; out++;
    }
    if (p >= s->end)
        return NULL;
    s->p = p + 1;
    if (!escaped) {
        text = PyUnicode_DecodeUTF8((const char *)start, p - start, NULL);
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                *failed = 1;
                return NULL;
            }
            PyErr_Clear();
        }
        return text;
    }
    if (out > s->scratch_size) {
        char *bigger = PyMem_Realloc(s->scratch, out);

        if (bigger == NULL) {
            PyErr_NoMemory();
            *failed = 1;
            return NULL;
        }
        s->scratch = bigger;
        s->scratch_size = out;
    }
    {
        const unsigned char *q = start;
        char *w = s->scratch;

        while (q < p) {
            if (*q != '\\') {
                *w++ = (char)*q++;
                continue;
            }
            switch (q[1]) {
            case 'b': *w++ = '\b'; q += 2; break;
            case 'f': *w++ = '\f'; q += 2; break;
            case 'n': *w++ = '\n'; q += 2; break;
            case 'r': *w++ = '\r'; q += 2; break;
            case 't': *w++ = '\t'; q += 2; break;
            case 'u': {
                unsigned int u = 0;

                js_hex4(q + 2, &u);
                if (u < 0x80) {
                    *w++ = (char)u;
                } else if (u < 0x800) {
                    *w++ = (char)(0xC0 | (u >> 6));
                    *w++ = (char)(0x80 | (u & 0x3F));
                } else {
                    *w++ = (char)(0xE0 | (u >> 12));
                    *w++ = (char)(0x80 | ((u >> 6) & 0x3F));
                    *w++ = (char)(0x80 | (u & 0x3F));
                }
                q += 6;
                break;
            }
            default: *w++ = (char)q[1]; q += 2; break;   /* " \ / */
            }
        }
        text = PyUnicode_DecodeUTF8(s->scratch, w - s->scratch, NULL);
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                *failed = 1;
                return NULL;
            }
            PyErr_Clear();
        }
        return text;
    }
}

/* A JSON integer (-?(0|[1-9][0-9]*), at most 18 digits, not followed by a
 * fraction or exponent): 1 with *value set, 0 when it is not one. */
static int
js_int(jscan *s, long long *value)
{
    const unsigned char *p = s->p;
    int negative = 0, digits = 0;
    long long v = 0;

    if (p < s->end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= s->end || *p < '0' || *p > '9')
        return 0;
    if (*p == '0') {
        p++;
        digits = 1;
    } else {
        while (p < s->end && *p >= '0' && *p <= '9') {
            if (++digits > 18)
                return 0;
            v = v * 10 + (*p++ - '0');
        }
    }
    if (p < s->end && (*p == '.' || *p == 'e' || *p == 'E' || (*p >= '0' && *p <= '9')))
        return 0;
    s->p = p;
    *value = negative ? -v : v;
    return 1;
}

static int
js_literal(jscan *s, const char *word)
{
    size_t n = strlen(word);

    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return 0;
    s->p += n;
    return 1;
}

enum { JF_CODE, JF_LANGUAGE, JF_VERSION, JF_OPAQUE, JF_FLAG, JF_REMARK, JF_EXT, JF_OTHER };

static int
js_field(const unsigned char *key, Py_ssize_t n)
{
#define IS(word) (n == (Py_ssize_t)sizeof(word) - 1 && memcmp(key, word, n) == 0)
    if (IS("code")) return JF_CODE;
    if (IS("language")) return JF_LANGUAGE;
    if (IS("version")) return JF_VERSION;
    if (IS("opaque")) return JF_OPAQUE;
    if (IS("flag")) return JF_FLAG;
    if (IS("remark")) return JF_REMARK;
    if (IS("extFields")) return JF_EXT;
    return JF_OTHER;
#undef IS
}

/* A key: its raw bytes when it has no escape (the field it names), else
 * JF_OTHER with a str decoded (escaped keys never name a field we read
 * unless they decode to one: then it is left to Python). */
static int
js_key(jscan *s, int *field, int *failed)
{
    const unsigned char *p = s->p + 1, *start = p;

    *failed = 0;
    while (p < s->end && *p != '"' && *p != '\\' && *p >= 0x20 && *p < 0x80)
        p++;
    if (p < s->end && *p == '"') {
        *field = js_field(start, p - start);
        s->p = p + 1;
        return 1;
    }
    return 0;   /* escapes or non-ASCII in a top-level key: Python's decoder */
}

PyDoc_STRVAR(json_command_doc,
"json_command(header, /) -> tuple | None\n\n"
"A remoting command's JSON header (bytes) as (code, language name or None,\n"
"version, opaque, flag, remark or None, extFields dict or None), exactly\n"
"what rmqha.remoting._frames reads from it, when the header is an object\n"
"whose code, version, opaque and flag are integers in the int32 range (or\n"
"null), whose language and remark are strings (or null), whose extFields\n"
"is an object of strings (or null), and whose other members are strings,\n"
"integers, booleans or null.  None: any other header, which the Python\n"
"reader takes (a surrogate escape, a float, a nested value, an error).");

static PyObject *
sp_json_command(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    jscan s;
    long long ints[5] = {0, 0, 0, 0, 0};    /* code, version, opaque, flag (by JF_ index below) */
    PyObject *language = NULL, *remark = NULL, *ext = NULL, *result = NULL;
    int failed = 0, ok = 0;

    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    s.p = view.buf;
    s.end = s.p + view.len;
    s.scratch = NULL;
    s.scratch_size = 0;
    js_ws(&s);
    if (s.p >= s.end || *s.p != '{')
        goto done;
    s.p++;
    js_ws(&s);
    if (s.p < s.end && *s.p == '}') {
        s.p++;
    } else {
        for (;;) {
            int field, next;

            if (s.p >= s.end || *s.p != '"' || !js_key(&s, &field, &failed))
                goto done;
            js_ws(&s);
            if (s.p >= s.end || *s.p != ':')
                goto done;
            s.p++;
            js_ws(&s);
            if (s.p >= s.end)
                goto done;
            if (field == JF_CODE || field == JF_VERSION || field == JF_OPAQUE || field == JF_FLAG) {
                int slot = field == JF_CODE ? 0 : field == JF_VERSION ? 1 : field == JF_OPAQUE ? 2 : 3;
                long long v;

                if (js_literal(&s, "null")) {
                    v = 0;
                } else {
                    if (!js_int(&s, &v) || v < -2147483648LL || v > 2147483647LL)
                        goto done;
                }
                ints[slot] = v;
            } else if (field == JF_LANGUAGE || field == JF_REMARK) {
                PyObject *text = NULL;

                if (*s.p == '"') {
                    text = js_string(&s, &failed);
                    if (text == NULL)
                        goto done;
                } else if (!js_literal(&s, "null")) {
                    goto done;
                }
                if (field == JF_LANGUAGE)
                    Py_XSETREF(language, text);
                else
                    Py_XSETREF(remark, text);
            } else if (field == JF_EXT) {
                if (js_literal(&s, "null")) {
                    Py_CLEAR(ext);
                } else {
                    if (*s.p != '{')
                        goto done;
                    Py_XSETREF(ext, PyDict_New());
                    if (ext == NULL) {
                        failed = 1;
                        goto done;
                    }
                    s.p++;
                    js_ws(&s);
                    if (s.p < s.end && *s.p == '}') {
                        s.p++;
                    } else {
                        for (;;) {
                            PyObject *key, *value;
                            int set, next;

                            if (s.p >= s.end || *s.p != '"')
                                goto done;
                            key = js_string(&s, &failed);
                            if (key == NULL)
                                goto done;
                            js_ws(&s);
                            if (s.p >= s.end || *s.p != ':') {
                                Py_DECREF(key);
                                goto done;
                            }
                            s.p++;
                            js_ws(&s);
                            if (s.p >= s.end || *s.p != '"') {
                                Py_DECREF(key);
                                goto done;  /* not a string: Python converts or refuses */
                            }
                            value = js_string(&s, &failed);
                            if (value == NULL) {
                                Py_DECREF(key);
                                goto done;
                            }
                            set = PyDict_SetItem(ext, key, value);
                            Py_DECREF(key);
                            Py_DECREF(value);
                            if (set < 0) {
                                failed = 1;
                                goto done;
                            }
                            next = js_member_end(&s);
                            if (next < 0)
                                goto done;
                            if (next == 0)
                                break;
                        }
                    }
                }
            } else {
                /* Another member: read and dropped, as Python drops it. */
                long long ignored;

                if (*s.p == '"') {
                    PyObject *text = js_string(&s, &failed);

                    if (text == NULL)
                        goto done;
                    Py_DECREF(text);
                } else if (!js_literal(&s, "null") && !js_literal(&s, "true")
                           && !js_literal(&s, "false") && !js_int(&s, &ignored)) {
                    goto done;
                }
            }
            next = js_member_end(&s);
            if (next < 0)
                goto done;
            if (next == 0)
                break;
        }
    }
    js_ws(&s);
    if (s.p != s.end)
        goto done;
    ok = 1;
done:
    if (ok) {
        result = Py_BuildValue(
            "(LOLLLOO)", ints[0], language ? language : Py_None, ints[1], ints[2], ints[3],
            remark ? remark : Py_None, ext ? ext : Py_None);
    } else if (!failed) {
        result = Py_NewRef(Py_None);
    }
    Py_XDECREF(language);
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    PyMem_Free(s.scratch);
    PyBuffer_Release(&view);
    return result;
}

/* "Plain" as sends.py's _plain: ASCII digits only, at least one, and the
 * number at most most.  1 with *value, 0 when not. */
static int
plain_digits(PyObject *text, long long most, long long *value)
{
    const char *p;
    Py_ssize_t n, i;
    unsigned long long v = 0;

    if (!PyUnicode_CheckExact(text) || !PyUnicode_IS_ASCII(text))
        return 0;
    p = (const char *)PyUnicode_DATA(text);
    n = PyUnicode_GET_LENGTH(text);
    if (n == 0)
        return 0;
    for (i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        if (v > (unsigned long long)most / 10 + 1)
            return 0;   /* past any bound: leading zeros aside, too big */
        v = v * 10 + (unsigned long long)(p[i] - '0');
    }
    if (v > (unsigned long long)most)
        return 0;
    *value = (long long)v;
    return 1;
}

/* "true" in any case (Java's Boolean.parseBoolean as text.lower() == "true"),
 * for ASCII text; -1 for other text (then Python decides). */
static int
ascii_true(PyObject *text)
{
    const char *p;

    if (!PyUnicode_CheckExact(text) || !PyUnicode_IS_ASCII(text))
        return -1;
    if (PyUnicode_GET_LENGTH(text) != 4)
        return 0;
    p = (const char *)PyUnicode_DATA(text);
    return (p[0] | 0x20) == 't' && (p[1] | 0x20) == 'r' && (p[2] | 0x20) == 'u' && (p[3] | 0x20) == 'e';
}

static PyObject *v2_keys[14];

PyDoc_STRVAR(send_header_v2_doc,
"send_header_v2(ext, /) -> tuple | None\n\n"
"A SEND_MESSAGE_V2 header's extFields (a dict of str) as the 14 values of\n"
"SendMessageRequestHeader (producer group, topic, default topic, queue\n"
"count, queue id, sysFlag, born timestamp, flag, properties, reconsume\n"
"times, unit mode, max reconsume times, batch, broker name), when a to c\n"
"are there and every number is plain digits in range: what\n"
"rmqha.remoting.sends.read_send_header reads then.  None otherwise.");

static PyObject *
sp_send_header_v2(PyObject *module, PyObject *ext)
{
    PyObject *v[14];
    long long d, e, f, g, h, j = 0, l = 0;
    int k = 0, m = 0, i;

    if (!PyDict_CheckExact(ext))
        Py_RETURN_NONE;
    for (i = 0; i < 14; i++) {
        v[i] = PyDict_GetItemWithError(ext, v2_keys[i]);  /* borrowed */
        if (v[i] == NULL && PyErr_Occurred())
            return NULL;
        if (v[i] != NULL && !PyUnicode_CheckExact(v[i]))
            Py_RETURN_NONE;
    }
    if (v[0] == NULL || v[1] == NULL || v[2] == NULL
        || v[3] == NULL || !plain_digits(v[3], 2147483647LL, &d)
        || v[4] == NULL || !plain_digits(v[4], 2147483647LL, &e)
        || v[5] == NULL || !plain_digits(v[5], 2147483647LL, &f)
        || v[6] == NULL || !plain_digits(v[6], 9223372036854775807LL, &g)
        || v[7] == NULL || !plain_digits(v[7], 2147483647LL, &h)
        || (v[9] != NULL && !plain_digits(v[9], 2147483647LL, &j))
        || (v[11] != NULL && !plain_digits(v[11], 2147483647LL, &l)))
        Py_RETURN_NONE;
    if (v[10] != NULL && (k = ascii_true(v[10])) < 0)
        Py_RETURN_NONE;
    if (v[12] != NULL && (m = ascii_true(v[12])) < 0)
        Py_RETURN_NONE;
    {
        PyObject *out = PyTuple_New(14), *item;

        if (out == NULL)
            return NULL;
#define PUT(index, expr)                      \
        if ((item = (expr)) == NULL) {        \
            Py_DECREF(out);                   \
            return NULL;                      \
        }                                     \
        PyTuple_SET_ITEM(out, index, item);
        PUT(0, Py_NewRef(v[0]));
        PUT(1, Py_NewRef(v[1]));
        PUT(2, Py_NewRef(v[2]));
        PUT(3, PyLong_FromLongLong(d));
        PUT(4, PyLong_FromLongLong(e));
        PUT(5, PyLong_FromLongLong(f));
        PUT(6, PyLong_FromLongLong(g));
        PUT(7, PyLong_FromLongLong(h));
        PUT(8, Py_NewRef(v[8] ? v[8] : Py_None));
        PUT(9, v[9] ? PyLong_FromLongLong(j) : Py_NewRef(Py_None));
        PUT(10, PyBool_FromLong(k));
        PUT(11, PyBool_FromLong(m));
        PUT(12, v[11] ? PyLong_FromLongLong(l) : Py_NewRef(Py_None));
        PUT(13, Py_NewRef(v[13] ? v[13] : Py_None));
#undef PUT
        return out;
    }
}

/* -- the answer's JSON header ------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t size, used;
} jbuf;

static int
jb_reserve(jbuf *b, Py_ssize_t more)
{
    if (b->used + more > b->size) {
        Py_ssize_t size = (b->used + more) * 2;
        char *bigger = PyMem_Realloc(b->data, size);

        if (bigger == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = bigger;
        b->size = size;
    }
    return 0;
}

static int
jb_put(jbuf *b, const char *text, Py_ssize_t n)
{
    if (jb_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->used, text, n);
    b->used += n;
    return 0;
}

/* An int subclass that f-strings format as its number (an IntEnum: its
 * __format__ is int's), not a bool; the last such type is remembered. */
static PyTypeObject *int_like_type;

static int
formats_as_int(PyObject *value)
{
    PyTypeObject *type = Py_TYPE(value);
    PyObject *mine, *ints;
    int same;

    if (!PyLong_Check(value) || PyBool_Check(value))
        return 0;
    if (type == int_like_type)
        return 1;
    mine = PyObject_GetAttrString((PyObject *)type, "__format__");
    ints = PyObject_GetAttrString((PyObject *)&PyLong_Type, "__format__");
    same = mine != NULL && mine == ints;
    Py_XDECREF(mine);
    Py_XDECREF(ints);
    PyErr_Clear();
    if (same) {
        Py_INCREF(type);
        Py_XSETREF(int_like_type, type);
    }
    return same;
}

static int
jb_int(jbuf *b, PyObject *value)
{
    char text[32];
    long long v;
    int overflow;

    if (!PyLong_CheckExact(value) && !formats_as_int(value))
        return 1;
    v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 1;
    }
    return jb_put(b, text, snprintf(text, sizeof text, "%lld", v));
}

/* A str quoted as fastjson writes it (_frames._json_string): 0 done, 1 not
 * an exact str or not encodable (Python's encoder says why), -1 error. */
static int
jb_string(jbuf *b, PyObject *text)
{
    const unsigned char *p;
    Py_ssize_t n, i;
    static const char hex[] = "0123456789ABCDEF";

    if (!PyUnicode_CheckExact(text))
        return 1;
    p = (const unsigned char *)PyUnicode_AsUTF8AndSize(text, &n);
    if (p == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return -1;
        PyErr_Clear();
        return 1;
    }
    /* At most 6 bytes out for each byte in (a \uXXXX for a 1-byte character;
     * the 2- and 3-byte ones escaped take 6 for 2 or 3), and the quotes. */
    if (jb_reserve(b, 6 * n + 2) < 0)
        return -1;
    {
        char *w = b->data + b->used;

        *w++ = '"';
        for (i = 0; i < n; i++) {
            unsigned char c = p[i];
            unsigned int u;

            if (c >= 0x20 && c != '"' && c != '\\' && c < 0x7F) {
                *w++ = (char)c;
                continue;
            }
            if (c == '"' || c == '\\') {
                *w++ = '\\';
                *w++ = (char)c;
                continue;
            }
            if (c < 0x20) {
                char shortform = c == '\b' ? 'b' : c == '\t' ? 't' : c == '\n' ? 'n'
                                 : c == '\f' ? 'f' : c == '\r' ? 'r' : 0;

                if (shortform) {
                    *w++ = '\\';
                    *w++ = shortform;
                    continue;
                }
                u = c;
            } else if (c == 0x7F) {
                u = c;
            } else if (c == 0xC2 && i + 1 < n && p[i + 1] >= 0x80 && p[i + 1] <= 0x9F) {
                u = p[i + 1];       /* U+0080..U+009F */
                i += 1;
            } else if (c == 0xE2 && i + 2 < n && p[i + 1] == 0x80 && (p[i + 2] == 0xA8 || p[i + 2] == 0xA9)) {
                u = p[i + 2] == 0xA8 ? 0x2028 : 0x2029;   /* U+2028, U+2029 */
                i += 2;
            } else {
                *w++ = (char)c;     /* the rest of UTF-8 as is */
                continue;
            }
            *w++ = '\\';
            *w++ = 'u';
            *w++ = hex[(u >> 12) & 0xF];
            *w++ = hex[(u >> 8) & 0xF];
            *w++ = hex[(u >> 4) & 0xF];
            *w++ = hex[u & 0xF];
        }
        *w++ = '"';
        b->used = w - b->data;
    }
    return 0;
}

PyDoc_STRVAR(json_header_doc,
"json_header(code, ext, order, flag, language, opaque, remark, version, /)\n"
"    -> bytes | None\n\n"
"A command's JSON header as rmqha.remoting._frames._json_header writes it:\n"
"ext (a dict of str, or None) in the order of the keys in order (a tuple),\n"
"language the language's name (a str).  None when a value is not an exact\n"
"str or int, or a str does not encode (Python's encoder then runs).");

static PyObject *
sp_json_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *code, *ext, *order, *flag, *language, *opaque, *remark, *version, *result = NULL;
    jbuf b = {NULL, 0, 0};
    int r;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "json_header takes 8 arguments");
        return NULL;
    }
    code = args[0]; ext = args[1]; order = args[2]; flag = args[3];
    language = args[4]; opaque = args[5]; remark = args[6]; version = args[7];
    if (jb_reserve(&b, 256) < 0)
        return NULL;
#define TRY(call)                   \
    if ((r = (call)) != 0)          \
        goto out;
#define LIT(text) TRY(jb_put(&b, text, sizeof(text) - 1))
    LIT("{\"code\":");
    TRY(jb_int(&b, code));
    if (ext != Py_None) {
        Py_ssize_t i, n;

        if (!PyDict_CheckExact(ext) || !PyTuple_CheckExact(order)) {
            r = 1;
            goto out;
        }
        n = PyTuple_GET_SIZE(order);
        if (n != PyDict_GET_SIZE(ext)) {
            r = 1;
            goto out;
        }
        LIT(",\"extFields\":{");
        for (i = 0; i < n; i++) {
            PyObject *key = PyTuple_GET_ITEM(order, i);
            PyObject *value = PyDict_GetItemWithError(ext, key);

            if (value == NULL) {
                r = PyErr_Occurred() ? -1 : 1;
                goto out;
            }
            if (i)
                LIT(",");
            TRY(jb_string(&b, key));
            LIT(":");
            TRY(jb_string(&b, value));
        }
        LIT("}");
    }
    LIT(",\"flag\":");
    TRY(jb_int(&b, flag));
    LIT(",\"language\":\"");
    if (!PyUnicode_CheckExact(language) || !PyUnicode_IS_ASCII(language)) {
        r = 1;
        goto out;
    }
    TRY(jb_put(&b, (const char *)PyUnicode_DATA(language), PyUnicode_GET_LENGTH(language)));
    LIT("\",\"opaque\":");
    TRY(jb_int(&b, opaque));
    if (remark != Py_None) {
        LIT(",\"remark\":");
        TRY(jb_string(&b, remark));
    }
    LIT(",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":");
    TRY(jb_int(&b, version));
    LIT("}");
#undef LIT
#undef TRY
    r = 0;
out:
    if (r == 0)
        result = PyBytes_FromStringAndSize(b.data, b.used);
    else if (r > 0)
        result = Py_NewRef(Py_None);
    PyMem_Free(b.data);
    return result;
}

static PyMethodDef methods[] = {
    {"check_record", sp_check_record, METH_VARARGS, check_record_doc},
    {"replica_hop", sp_replica_hop, METH_VARARGS, replica_hop_doc},
    {"replica_hop_pieces", sp_replica_hop_pieces, METH_VARARGS, replica_hop_pieces_doc},
    {"walk_valid", sp_walk_valid, METH_VARARGS, walk_valid_doc},
    {"walk_headers", sp_walk_headers, METH_VARARGS, walk_headers_doc},
    {"cq_units", sp_cq_units, METH_VARARGS, cq_units_doc},
    {"encode", (PyCFunction)(void (*)(void))sp_encode, METH_FASTCALL, encode_doc},
    {"put_batch", (PyCFunction)(void (*)(void))sp_put_batch, METH_FASTCALL, put_batch_doc},
    {"put_one", (PyCFunction)(void (*)(void))sp_put_one, METH_FASTCALL, put_one_doc},
    {"decode_span", sp_decode_span, METH_VARARGS, decode_span_doc},
    {"pull_decode", sp_pull_decode, METH_VARARGS, pull_decode_doc},
    {"pull_walk", sp_pull_walk, METH_VARARGS, pull_walk_doc},
    {"crc32", (PyCFunction)(void (*)(void))sp_crc32, METH_FASTCALL, crc32_doc},
    {"_crc32_set_folding", sp_crc32_set_folding, METH_O, crc32_set_folding_doc},
    {"_crc32_set_wide", sp_crc32_set_wide, METH_O, crc32_set_wide_doc},
    {"guard_add", sp_guard_add, METH_O, guard_add_doc},
    {"guard_remove", sp_guard_remove, METH_O, guard_remove_doc},
    {"guard_fault", sp_guard_fault, METH_O, guard_fault_doc},
    {"guard_faults", sp_guard_faults, METH_NOARGS, guard_faults_doc},
    {"json_command", sp_json_command, METH_O, json_command_doc},
    {"send_header_v2", sp_send_header_v2, METH_O, send_header_v2_doc},
    {"json_header", (PyCFunction)(void (*)(void))sp_json_header, METH_FASTCALL, json_header_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "rmqha.store._speedups",
    "The commit-log codec's hot loops in C; rmqha.store._record is the reference.",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
#define INTERN(var, text)                          \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;
    INTERN(s_body, "body");
    INTERN(s_topic, "topic");
    INTERN(s_properties, "properties");
    INTERN(s_born_host, "born_host");
    INTERN(s_sysflag, "sysflag");
    INTERN(s_queue_id, "queue_id");
    INTERN(s_flag, "flag");
    INTERN(s_born_timestamp, "born_timestamp");
    INTERN(s_reconsume_times, "reconsume_times");
    INTERN(s_prepared_tx_offset, "prepared_tx_offset");
    INTERN(s_max_message_size, "max_message_size");
    INTERN(s_c_state, "_c_state");
    {
        static const char *names[14] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n"};
        int i;

        for (i = 0; i < 14; i++)
            INTERN(v2_keys[i], names[i]);
    }
    INTERN(k_topic, "topic");
    INTERN(k_body, "body");
    INTERN(k_queue, "queue");
    INTERN(k_queue_offset, "queue_offset");
    INTERN(k_commit_log_offset, "commit_log_offset");
    INTERN(k_flag, "flag");
    INTERN(k_sys_flag, "sys_flag");
    INTERN(k_born_timestamp, "born_timestamp");
    INTERN(k_store_timestamp, "store_timestamp");
    INTERN(k_reconsume_times, "reconsume_times");
    INTERN(k_body_crc, "body_crc");
    INTERN(k_lazy, "_lazy");
    if ((empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
#undef INTERN
    crc_folding = crc_folding_available();
    crc_wide = crc_wide_available();
    {
        PyObject *module;

        if (PyType_Ready(&PrefaultType) < 0 || PyType_Ready(&ColumnBufferType) < 0)
            return NULL;
        module = PyModule_Create(&module_def);
        if (module == NULL)
            return NULL;
        Py_INCREF(&PrefaultType);
        if (PyModule_AddObject(module, "Prefault", (PyObject *)&PrefaultType) < 0) {
            Py_DECREF(&PrefaultType);
            Py_DECREF(module);
            return NULL;
        }
        return module;
    }
}
