/* tinyctx/_token_scan.h: what the counting formulas read of a text, for
 * _token_speedups.c (its only includer; static functions, one translation unit).
 *
 * A text's characters by kind (ASCII letters, digits, symbols, spaces, newlines; Han,
 * kana, Hangul, the vocabulary's one-token characters, other non-ASCII by UTF-8 size) and
 * its four-space runs, over all of it or over the sample a long text is measured on, and
 * the formulas of ShapeCounter._estimate and HeuristicCounter._estimate over them, in
 * Python's order of operations.
 */
#ifndef TINYCTX_TOKEN_SCAN_H
#define TINYCTX_TOKEN_SCAN_H

#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* the kinds of ASCII byte the shape formula reads (letters are what is left) */
enum { C_LETTER, C_DIGIT, C_SYMBOL, C_SPACE, C_NEWLINE };
static unsigned char byte_class[128];

typedef struct {
    int shape;            /* 0: characters per token (HeuristicCounter), 1: ShapeCounter */
    double per;           /* heuristic: characters per token */
    double letter, digit, symbol, space, per_text, chars_per; /* shape rates */
    double nonascii;      /* shape: tokens per UTF-8 byte; heuristic: bytes per token */
    double common, han, kana, hangul, astral; /* CJK and emoji (common: shape only) */
    const unsigned char *one_token; /* shape: a bit per BMP code point held as one token */
    long base, per_call;  /* per message and per call overheads */
    Py_ssize_t exact_to;  /* longer texts are measured on a sample */
} Rates;

/* What the formulas read of a text (or of its sample): ASCII characters by kind, their
   four-space runs, and the non-ASCII characters by script and UTF-8 size. */
typedef struct {
    Py_ssize_t counts[5], ascii, runs, run, utf8, han, kana, hangul, common_han,
        common_hangul, astral;
} Scan;

/* ASCII text: what the shape counter reads (characters by kind) or what the heuristic
   reads (four-space runs, a run going on from the last call in t->run). Blocks of 64
   bytes take SSE2 compares where the compiler has them (every x86-64); the rest, and
   every other machine, the plain loop, which gives the same numbers. */
static void
scan_ascii_plain(Scan *t, int shape, const unsigned char *data, Py_ssize_t n)
{
    if (shape) {
        for (Py_ssize_t i = 0; i < n; i++)
            t->counts[byte_class[data[i]]]++;
        return;
    }
    Py_ssize_t run = t->run, runs = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (data[i] == ' ')
            run++;
        else if (run) {
            runs += run / 4;
            run = 0;
        }
    }
    t->runs += runs;
    t->run = run;
}

#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>
#define BLOCK 64

static uint64_t
block_mask(const unsigned char *data, __m128i byte)
{
    uint64_t mask = 0;
    for (int k = 0; k < 4; k++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(data + 16 * k));
        mask |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, byte)) << (16 * k);
    }
    return mask;
}

/* the runs of set bits of one block's space mask, the run before it in *run */
static void
block_runs(Scan *t, uint64_t mask, Py_ssize_t *run)
{
    if (mask == ~(uint64_t)0) {
        *run += BLOCK;
        return;
    }
    if (*run) { /* the run from before ends at the first byte that is not a space */
        int ones = __builtin_ctzll(~mask);
        t->runs += (*run + ones) / 4;
        *run = 0;
        mask &= ~(uint64_t)0 << ones; /* ones < 64 here */
    }
    while (mask) {
        int start = __builtin_ctzll(mask);
        uint64_t rest = ~(mask >> start);
        int length = rest ? __builtin_ctzll(rest) : BLOCK - start;
        if (start + length == BLOCK) { /* it goes on into the next block */
            *run = length;
            return;
        }
        t->runs += length / 4;
        mask &= ~((((uint64_t)1 << length) - 1) << start);
    }
}

/* the sum of the 16 bytes of a vector */
static Py_ssize_t
byte_sum(__m128i counts)
{
    uint64_t halves[2];
    _mm_storeu_si128((__m128i *)halves, _mm_sad_epu8(counts, _mm_setzero_si128()));
    return (Py_ssize_t)(halves[0] + halves[1]);
}

/* the kinds of characters of data[0:n) by 16 bytes (n a multiple of 16): each compare
   gives -1 per byte that matches, subtracted into byte counters, summed every 255 rounds
   (before a byte counter can overflow); symbols are what is left */
static void
vector_counts(Scan *t, const unsigned char *data, Py_ssize_t n)
{
    const __m128i space = _mm_set1_epi8(' '), newline = _mm_set1_epi8('\n');
    const __m128i below_0 = _mm_set1_epi8('0' - 1), above_9 = _mm_set1_epi8('9' + 1);
    const __m128i below_a = _mm_set1_epi8('a' - 1), above_z = _mm_set1_epi8('z' + 1);
    const __m128i lower = _mm_set1_epi8(0x20);
    Py_ssize_t i = 0, kinds[4] = {0, 0, 0, 0};
    while (i < n) {
        __m128i spaces = _mm_setzero_si128(), newlines = spaces, digits = spaces, letters = spaces;
        Py_ssize_t end = n - i > 16 * 255 ? i + 16 * 255 : n;
        for (; i < end; i += 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(data + i));
            __m128i folded = _mm_or_si128(v, lower);
            spaces = _mm_sub_epi8(spaces, _mm_cmpeq_epi8(v, space));
            newlines = _mm_sub_epi8(newlines, _mm_cmpeq_epi8(v, newline));
            digits = _mm_sub_epi8(
                digits, _mm_and_si128(_mm_cmpgt_epi8(v, below_0), _mm_cmplt_epi8(v, above_9)));
            letters = _mm_sub_epi8(letters, _mm_and_si128(_mm_cmpgt_epi8(folded, below_a),
                                                          _mm_cmplt_epi8(folded, above_z)));
        }
        kinds[0] += byte_sum(spaces);
        kinds[1] += byte_sum(newlines);
        kinds[2] += byte_sum(digits);
        kinds[3] += byte_sum(letters);
    }
    t->counts[C_SPACE] += kinds[0];
    t->counts[C_NEWLINE] += kinds[1];
    t->counts[C_DIGIT] += kinds[2];
    t->counts[C_LETTER] += kinds[3];
    t->counts[C_SYMBOL] += n - kinds[0] - kinds[1] - kinds[2] - kinds[3];
}

static void
scan_ascii(Scan *t, int shape, const unsigned char *data, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    if (shape) {
        i = n - n % 16;
        vector_counts(t, data, i);
    }
    else {
        const __m128i space = _mm_set1_epi8(' ');
        Py_ssize_t run = t->run;
        for (; i + BLOCK <= n; i += BLOCK) {
            uint64_t mask = block_mask(data + i, space);
            if (mask == 0 && run == 0)
                continue;
            block_runs(t, mask, &run);
        }
        t->run = run;
    }
    scan_ascii_plain(t, shape, data + i, n - i);
    t->ascii += n;
}
#else
static void
scan_ascii(Scan *t, int shape, const unsigned char *data, Py_ssize_t n)
{
    scan_ascii_plain(t, shape, data, n);
    t->ascii += n;
}
#endif

static void
scan_range(const Rates *r, Scan *t, PyObject *text, Py_ssize_t start, Py_ssize_t end)
{
    if (PyUnicode_IS_ASCII(text)) {
        scan_ascii(t, r->shape, PyUnicode_1BYTE_DATA(text) + start, end - start);
        return;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    for (Py_ssize_t i = start; i < end; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            unsigned char b = (unsigned char)c;
            scan_ascii(t, r->shape, &b, 1);
            continue;
        }
        if (t->run) { /* a non-ASCII character ends a run of spaces */
            t->runs += t->run / 4;
            t->run = 0;
        }
        t->utf8 += c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        t->astral += c >= 0x10000;
        int one = r->one_token != NULL && c < 0x10000 && ((r->one_token[c >> 3] >> (c & 7)) & 1);
        if ((c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) ||
            (c >= 0xF900 && c <= 0xFAFF)) {
            t->han++;
            t->common_han += one;
        }
        else if (c >= 0x3040 && c <= 0x30FF)
            t->kana++;
        else if ((c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x1100 && c <= 0x11FF) ||
                 (c >= 0x3130 && c <= 0x318F)) {
            t->hangul++;
            t->common_hangul += one;
        }
    }
}

/* The formula over a scan, not rounded: ShapeCounter._estimate and
   HeuristicCounter._estimate, each in its order of operations (left to right, as Python
   evaluates it; no fused multiply-add: see setup.py). Where Python skips a CJK term
   because no CJK character is there, the term is 0.0 here, and x + 0.0 is x. */
static double
estimate_of(const Rates *r, const Scan *t)
{
    Py_ssize_t bytes_left = t->utf8 - 3 * (t->han + t->kana + t->hangul);
    if (!r->shape) {
        double estimate = (double)(t->ascii - 2 * t->runs) / r->per;
        if (t->utf8 == 0)
            return estimate;
        estimate = estimate + ((double)t->han * r->han + (double)t->kana * r->kana +
                               (double)t->hangul * r->hangul);
        estimate = estimate + (double)bytes_left / r->nonascii;
        return estimate + (double)t->astral * r->astral;
    }
    double non_ascii = 0.0;
    if (t->utf8) {
        non_ascii = (double)(t->common_han + t->common_hangul) * r->common +
                    (double)(t->han - t->common_han) * r->han + (double)t->kana * r->kana +
                    (double)(t->hangul - t->common_hangul) * r->hangul;
        non_ascii = non_ascii + (double)bytes_left * r->nonascii;
        non_ascii = non_ascii + (double)t->astral * r->astral;
    }
    Py_ssize_t digits = t->counts[C_DIGIT], symbols = t->counts[C_SYMBOL];
    Py_ssize_t spaces = t->counts[C_SPACE];
    Py_ssize_t letters = t->ascii - digits - symbols - spaces - t->counts[C_NEWLINE];
    double estimate = r->letter * (double)letters + r->digit * (double)digits +
                      r->symbol * (double)symbols + r->space * (double)spaces;
    if (t->utf8)
        estimate = estimate + non_ascii;
    return estimate + r->per_text;
}

/* ShapeCounter's floor: at least one token per max_chars_per_token characters */
static double
floored(const Rates *r, double estimate, Py_ssize_t n)
{
    if (!r->shape)
        return estimate;
    double floor_ = (double)n / r->chars_per;
    return floor_ > estimate ? floor_ : estimate;
}

/* A long text is measured on 8 windows of 256 characters spread evenly over it, the first
   at its start and the last at its end (_token_counters._sample), as if joined (a run of
   spaces goes on across a join). */
#define WINDOWS 8
#define WIDTH 256

/* count_text: the formula (on the sample past the threshold, scaled to the length), at
   least one token for a non-empty text */
static long
count_text(const Rates *r, PyObject *text)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (n == 0)
        return 0;
    Scan t = {{0}};
    double estimate;
    if (n > r->exact_to) {
        Py_ssize_t span = n - WIDTH;
        for (int w = 0; w < WINDOWS; w++) {
            Py_ssize_t start = span * w / (WINDOWS - 1);
            scan_range(r, &t, text, start, start + WIDTH);
        }
        t.runs += t.run / 4;
        estimate = estimate_of(r, &t) * (double)n / (double)(WINDOWS * WIDTH);
    }
    else {
        scan_range(r, &t, text, 0, n);
        t.runs += t.run / 4;
        estimate = estimate_of(r, &t);
    }
    long tokens = (long)ceil(floored(r, estimate, n));
    return tokens > 1 ? tokens : 1;
}

/* An id or a name as the Python loops count one: an ASCII one by the formula over all of
   it (never sampled), any other by count_text */
static long
part_tokens(const Rates *r, PyObject *part)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(part);
    if (!PyUnicode_IS_ASCII(part))
        return count_text(r, part);
    if (n == 0)
        return 0;
    Scan t = {{0}};
    scan_ascii(&t, r->shape, PyUnicode_1BYTE_DATA(part), n);
    t.runs += t.run / 4;
    return (long)ceil(floored(r, estimate_of(r, &t), n));
}

#endif /* TINYCTX_TOKEN_SCAN_H */
