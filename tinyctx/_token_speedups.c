/* tinyctx._token_speedups: a cold count's per-message loop, in C.
 *
 * A cold count (a history no counter saw) measures every message: its text, a result's
 * call id, each call's id, name and arguments. The Python loops in _token_counters.py
 * (HeuristicCounter._measure) and _token_shapes.py (ShapeCounter._measure) spend most of
 * that time in the interpreter, not in the text. measure() does the same arithmetic here
 * for the messages it is sure of: one of the three built-in message types, a plain ASCII
 * string content (past the sample threshold, measured on the same sample), no metadata,
 * ASCII ids and names.
 * Every other message it leaves to the Python loop (its index is returned in `doubt`); a
 * call's arguments it measures when they are a flat object of ASCII strings, integers,
 * booleans and nulls (the length and kinds of characters of the JSON text the stdlib
 * encoder writes), and leaves every other to the Python callable it is given. The counts are
 * the same numbers the Python loops give, by the same operations in the same order
 * (tests/test_token_speedups.py compares them); without a C compiler the package installs
 * without this module and the Python loops count everything.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_token_scan.h"

static PyObject *k_content, *k_tool_call_id, *k_tool_calls, *k_metadata, *k_id, *k_name,
    *k_arguments, *k_invalid_arguments, *k_data, *k_json_chars;

/* What a call's JSON arguments text holds, as the stdlib encoder writes it (", " and ": "
   between items, ensure_ascii=False), in a Scan: its length (ascii), its four-space runs
   (runs, for the heuristic) and its characters by kind (counts). */
static void
emit(Scan *t, unsigned char c)
{
    t->ascii++;
    t->counts[byte_class[c]]++;
}

/* what an escape changes: a backslash (a symbol) before the character itself ('"' and
   '\\'), before a letter (\n, \t...: the control character goes), or \u00XX (the other
   control characters: u, 0, 0 and two hex digits) */
static void
escape(Scan *t, unsigned char c)
{
    t->ascii++;
    t->counts[C_SYMBOL]++;
    if (c == '"' || c == '\\')
        return;
    t->counts[byte_class[c]]--;
    if (memchr("\b\f\n\r\t", c, 5) != NULL) {
        t->counts[C_LETTER]++;
        return;
    }
    t->ascii += 4;
    t->counts[C_LETTER] += 1 + ((c & 15) >= 10);
    t->counts[C_DIGIT] += 3 + ((c & 15) < 10);
}

/* an ASCII string, quoted and escaped as json.encoder.encode_basestring does: its
   characters scanned as they are, then what each escape changes */
static void
emit_string(Scan *t, int shape, PyObject *text)
{
    const unsigned char *data = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), i = 0;
    emit(t, '"');
    t->run = 0; /* a quote ends every run */
    scan_ascii(t, shape, data, n);
    t->runs += t->run / 4;
    t->run = 0;
#if defined(__SSE2__) && defined(__GNUC__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    const __m128i control = _mm_set1_epi8(0x20);
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(data + i));
        unsigned mask = (unsigned)_mm_movemask_epi8(_mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
            _mm_cmplt_epi8(v, control)));
        for (; mask; mask &= mask - 1)
            escape(t, data[i + __builtin_ctz(mask)]);
    }
#endif
    for (; i < n; i++)
        if (data[i] < 0x20 || data[i] == '"' || data[i] == '\\')
            escape(t, data[i]);
    emit(t, '"');
}

/* 1 when a value is JSON the C loop writes as the stdlib encoder would (ASCII strings,
   integers to 64 bits, booleans, nulls, and lists, tuples and objects of them, `frozen`
   the arguments' own mapping type), its text measured into *t; 0 when Python must
   measure it (floats: Python writes their repr; non-ASCII text; odd keys); -1 on error */
static int
emit_value(Scan *t, int shape, PyObject *value, PyTypeObject *frozen, int depth)
{
    if (depth > 64)
        return 0;
    if (PyUnicode_CheckExact(value)) {
        if (!PyUnicode_IS_ASCII(value))
            return 0;
        emit_string(t, shape, value);
        return 1;
    }
    if (value == Py_True || value == Py_False || value == Py_None) {
        const char *word = value == Py_True ? "true" : value == Py_False ? "false" : "null";
        for (; *word; word++)
            emit(t, (unsigned char)*word);
        return 1;
    }
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        char digits[32];
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow)
            return 0;
        if (number == -1 && PyErr_Occurred())
            return -1;
        int written = snprintf(digits, sizeof(digits), "%lld", number);
        for (int k = 0; k < written; k++)
            emit(t, (unsigned char)digits[k]);
        return 1;
    }
    if (PyTuple_CheckExact(value) || PyList_CheckExact(value)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(value);
        emit(t, '[');
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i) {
                emit(t, ',');
                emit(t, ' ');
            }
            int sure = emit_value(t, shape, PySequence_Fast_GET_ITEM(value, i), frozen, depth + 1);
            if (sure <= 0)
                return sure;
        }
        emit(t, ']');
        return 1;
    }
    PyObject *data = value;
    if (Py_TYPE(value) == frozen) { /* a nested mapping: its own dict */
        data = PyObject_GetAttr(value, k_data);
        if (data == NULL)
            return -1;
        Py_DECREF(data); /* the mapping holds it */
    }
    if (!PyDict_CheckExact(data))
        return 0;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *item;
    emit(t, '{');
    while (PyDict_Next(data, &pos, &key, &item)) {
        if (!PyUnicode_CheckExact(key) || !PyUnicode_IS_ASCII(key))
            return 0;
        if (i++) {
            emit(t, ',');
            emit(t, ' ');
        }
        emit_string(t, shape, key);
        emit(t, ':');
        emit(t, ' ');
        int sure = emit_value(t, shape, item, frozen, depth + 1);
        if (sure <= 0)
            return sure;
    }
    emit(t, '}');
    return 1;
}

/* A call's arguments' tokens in *out: 1, or 0 when Python must count them, -1 on error. */
static int
arguments_tokens(const Rates *r, PyObject *call, long *out)
{
    PyObject *invalid = PyObject_GetAttr(call, k_invalid_arguments), *arguments, *data;
    if (invalid == NULL)
        return -1;
    Py_DECREF(invalid);
    if (invalid != Py_None)
        return 0;
    if ((arguments = PyObject_GetAttr(call, k_arguments)) == NULL)
        return -1;
    int sure = 0;
    if (!r->shape) { /* the size a counter remembered on the mapping */
        PyObject *chars = PyObject_GetAttr(arguments, k_json_chars);
        if (chars == NULL) {
            Py_DECREF(arguments);
            return -1;
        }
        if (PyLong_CheckExact(chars)) {
            long known = PyLong_AsLong(chars);
            Py_DECREF(chars);
            Py_DECREF(arguments);
            if (known == -1 && PyErr_Occurred())
                return -1;
            if (known < 0)
                return 0;
            *out = (long)ceil((double)known / r->per);
            return 1;
        }
        Py_DECREF(chars);
    }
    PyTypeObject *frozen = Py_TYPE(arguments);
    data = PyObject_GetAttr(arguments, k_data);
    Py_DECREF(arguments);
    if (data == NULL)
        return -1;
    Scan t = {{0}};
    sure = emit_value(&t, r->shape, data, frozen, 0);
    Py_DECREF(data);
    if (sure <= 0)
        return sure;
    if (!r->shape) {
        *out = (long)ceil((double)(t.ascii - 2 * t.runs) / r->per);
        return 1;
    }
    Py_ssize_t digits = t.counts[C_DIGIT], symbols = t.counts[C_SYMBOL];
    Py_ssize_t spaces = t.counts[C_SPACE];
    Py_ssize_t letters = t.ascii - digits - symbols - spaces - t.counts[C_NEWLINE];
    double estimate = r->letter * (double)letters;
    estimate = estimate + r->digit * (double)digits;
    estimate = estimate + r->symbol * (double)symbols;
    estimate = estimate + r->space * (double)spaces;
    estimate = estimate + r->per_text;
    double floor_ = (double)t.ascii / r->chars_per;
    long tokens = (long)ceil(floor_ > estimate ? floor_ : estimate);
    *out = tokens > 1 ? tokens : 1;
    return 1;
}

/* A call's id and name. HeuristicCounter counts both by their length when both are
   ASCII without a four-space run, else both by count_text; ShapeCounter each as a part. */
static int
plain_ascii(PyObject *part)
{
    if (!PyUnicode_IS_ASCII(part))
        return 0;
    Scan t = {{0}};
    scan_ascii(&t, 0, PyUnicode_1BYTE_DATA(part), PyUnicode_GET_LENGTH(part));
    return t.runs == 0 && t.run < 4;
}

static long
call_names_tokens(const Rates *r, PyObject *id, PyObject *name)
{
    if (!r->shape && !(plain_ascii(id) && plain_ascii(name)))
        return count_text(r, id) + count_text(r, name);
    return part_tokens(r, id) + part_tokens(r, name);
}

/* Whether a FrozenDict (metadata) holds anything: the size of its dict, without a call of
   its __len__ (any other object: its truth) */
static int
is_set(PyObject *mapping)
{
    PyObject *data = PyObject_GetAttr(mapping, k_data);
    if (data == NULL) {
        PyErr_Clear();
        return PyObject_IsTrue(mapping);
    }
    int set = PyDict_CheckExact(data) ? PyDict_GET_SIZE(data) > 0 : PyObject_IsTrue(mapping);
    Py_DECREF(data);
    return set;
}

/* The count of one message: 1 and the count in *out, 0 when Python must count it, -1 on
   error. */
static int
measure_one(const Rates *r, PyObject *message, PyTypeObject *kinds[3], PyObject *arguments,
            long *out)
{
    PyTypeObject *type = Py_TYPE(message);
    int assistant = type == kinds[1], result = type == kinds[2];
    if (!(type == kinds[0] || assistant || result))
        return 0;
    int sure = 0;
    long tokens = r->base;
    PyObject *content = PyObject_GetAttr(message, k_content);
    PyObject *calls = NULL, *metadata = NULL, *part = NULL;
    if (content == NULL)
        return -1;
    if (!PyUnicode_CheckExact(content))
        goto done; /* parts: media, joined text */
    tokens += count_text(r, content);
    if (result) {
        if ((part = PyObject_GetAttr(message, k_tool_call_id)) == NULL)
            goto error;
        if (!PyUnicode_CheckExact(part))
            goto done;
        tokens += part_tokens(r, part);
    }
    else if (assistant) {
        if ((metadata = PyObject_GetAttr(message, k_metadata)) == NULL)
            goto error;
        int has_metadata = is_set(metadata);
        if (has_metadata != 0) { /* reasoning tokens: Python reads them */
            sure = has_metadata < 0 ? -1 : 0;
            goto done;
        }
        if ((calls = PyObject_GetAttr(message, k_tool_calls)) == NULL)
            goto error;
        if (!PyTuple_CheckExact(calls))
            goto done;
        Py_ssize_t n = PyTuple_GET_SIZE(calls);
        tokens += r->per_call * (long)n;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *call = PyTuple_GET_ITEM(calls, i);
            PyObject *id = PyObject_GetAttr(call, k_id), *name = NULL;
            if (id == NULL)
                goto error;
            name = PyObject_GetAttr(call, k_name);
            if (name == NULL) {
                Py_DECREF(id);
                goto error;
            }
            int plain = PyUnicode_CheckExact(id) && PyUnicode_CheckExact(name);
            if (plain)
                tokens += call_names_tokens(r, id, name);
            Py_DECREF(id);
            Py_DECREF(name);
            if (!plain)
                goto done;
            long argument_tokens = 0;
            int known = arguments_tokens(r, call, &argument_tokens);
            if (known < 0)
                goto error;
            if (known == 0) { /* Python measures them */
                PyObject *counted = PyObject_CallOneArg(arguments, call);
                if (counted == NULL)
                    goto error;
                argument_tokens = PyLong_AsLong(counted);
                Py_DECREF(counted);
                if (argument_tokens == -1 && PyErr_Occurred())
                    goto error;
            }
            tokens += argument_tokens;
        }
    }
    *out = tokens;
    sure = 1;
    goto done;
error:
    sure = -1;
done:
    Py_DECREF(content);
    Py_XDECREF(part);
    Py_XDECREF(metadata);
    Py_XDECREF(calls);
    return sure;
}

static PyObject *
measure(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"messages", "kinds",    "shape",    "rates",     "one_token",
                            "base",     "per_call", "exact_to", "arguments", NULL};
    PyObject *messages, *rates_tuple, *one_token, *arguments;
    PyTypeObject *kinds[3];
    Rates r = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!(O!O!O!)pO!OllnO:measure", names,
                                     &PyTuple_Type, &messages, &PyType_Type, &kinds[0],
                                     &PyType_Type, &kinds[1], &PyType_Type, &kinds[2], &r.shape,
                                     &PyTuple_Type, &rates_tuple, &one_token, &r.base,
                                     &r.per_call, &r.exact_to, &arguments))
        return NULL;
    if (r.shape) {
        if (!PyArg_ParseTuple(rates_tuple,
                              "dddddddddddd;shape rates: letter, digit, symbol, space, "
                              "per_text, chars_per, nonascii, common, han, kana, hangul, astral",
                              &r.letter, &r.digit, &r.symbol, &r.space, &r.per_text, &r.chars_per,
                              &r.nonascii, &r.common, &r.han, &r.kana, &r.hangul, &r.astral))
            return NULL;
        if (!PyBytes_CheckExact(one_token) || PyBytes_GET_SIZE(one_token) != 0x10000 / 8) {
            PyErr_SetString(PyExc_TypeError, "one_token must be 8192 bytes (a bit per BMP code point)");
            return NULL;
        }
        r.one_token = (const unsigned char *)PyBytes_AS_STRING(one_token);
    }
    else if (!PyArg_ParseTuple(rates_tuple,
                               "dddddd;heuristic rates: per, nonascii, astral, han, kana, hangul",
                               &r.per, &r.nonascii, &r.astral, &r.han, &r.kana, &r.hangul))
        return NULL;
    if (r.exact_to < WINDOWS * WIDTH) {
        PyErr_SetString(PyExc_ValueError, "exact_to must be at least 2048 (the sample's size)");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(messages);
    PyObject *counts = PyList_New(n), *doubt = PyList_New(0);
    if (counts == NULL || doubt == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        long tokens = 0;
        int sure = measure_one(&r, PyTuple_GET_ITEM(messages, i), kinds, arguments, &tokens);
        if (sure < 0)
            goto error;
        PyObject *value = PyLong_FromLong(sure ? tokens : 0);
        if (value == NULL)
            goto error;
        PyList_SET_ITEM(counts, i, value);
        if (!sure) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(doubt, index) < 0) {
                Py_XDECREF(index);
                goto error;
            }
            Py_DECREF(index);
        }
    }
    return Py_BuildValue("(NN)", counts, doubt);
error:
    Py_XDECREF(counts);
    Py_XDECREF(doubt);
    return NULL;
}

static PyMethodDef methods[] = {
    {"measure", (PyCFunction)(void (*)(void))measure, METH_VARARGS | METH_KEYWORDS,
     "(counts, doubt): the whole count of each message it is sure of, and the indices of "
     "those the Python loop must count (their counts are 0)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tinyctx._token_speedups", "A cold count's per-message loop, in C.",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__token_speedups(void)
{
    for (int b = 0; b < 128; b++) {
        byte_class[b] = b == ' '                      ? C_SPACE
                        : b == '\n'                   ? C_NEWLINE
                        : b >= '0' && b <= '9'        ? C_DIGIT
                        : (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') ? C_LETTER
                                                      : C_SYMBOL;
    }
#define INTERN(var, text)                                                                      \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                      \
        return NULL;
    INTERN(k_content, "content");
    INTERN(k_tool_call_id, "tool_call_id");
    INTERN(k_tool_calls, "tool_calls");
    INTERN(k_metadata, "metadata");
    INTERN(k_id, "id");
    INTERN(k_name, "name");
    INTERN(k_arguments, "arguments");
    INTERN(k_invalid_arguments, "invalid_arguments");
    INTERN(k_data, "_data");
    INTERN(k_json_chars, "_json_chars");
#undef INTERN
    return PyModule_Create(&module_def);
}
