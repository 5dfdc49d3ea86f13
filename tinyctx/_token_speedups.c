/* tinyctx._token_speedups: a cold count's per-message loop, in C.
 *
 * A cold count (a history no counter saw) measures every message: its text, a result's
 * call id, each call's id, name and arguments. The Python loops in _token_counters.py
 * (HeuristicCounter._measure) and _token_shapes.py (ShapeCounter._measure) spend most of
 * that time in the interpreter, not in the text. measure() does the same arithmetic here
 * for the messages it is sure of: one of the three built-in message types, a plain ASCII
 * string content no longer than the sample threshold, no metadata, ASCII ids and names.
 * Every other message it leaves to the Python loop (its index is returned in `doubt`), and
 * a call's arguments are always counted by the Python callable it is given. The counts are
 * the same numbers the Python loops give, by the same operations in the same order
 * (tests/test_token_speedups.py compares them); without a C compiler the package installs
 * without this module and the Python loops count everything.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

/* the kinds of ASCII byte the shape formula reads (letters are what is left) */
enum { C_LETTER, C_DIGIT, C_SYMBOL, C_SPACE, C_NEWLINE };
static unsigned char byte_class[128];

static PyObject *k_content, *k_tool_call_id, *k_tool_calls, *k_metadata, *k_id, *k_name,
    *four_spaces;

typedef struct {
    int shape;            /* 0: characters per token (HeuristicCounter), 1: ShapeCounter */
    double per;           /* heuristic: characters per token */
    double letter, digit, symbol, space, per_text, chars_per; /* shape rates */
    long base, per_call;  /* per message and per call overheads */
    Py_ssize_t exact_to;  /* longer texts are sampled: left to Python */
} Rates;

/* The shape formula's tokens for ASCII text (never 0 for a non-empty one), as
   ShapeCounter._measure computes them: one pass counting digits, symbols, spaces and
   newlines. */
static long
shape_tokens(const Rates *r, const unsigned char *data, Py_ssize_t n)
{
    if (n == 0)
        return 0;
    Py_ssize_t counts[5] = {0, 0, 0, 0, 0};
    for (Py_ssize_t i = 0; i < n; i++)
        counts[byte_class[data[i]]]++;
    Py_ssize_t digits = counts[C_DIGIT], symbols = counts[C_SYMBOL], spaces = counts[C_SPACE];
    Py_ssize_t letters = n - digits - symbols - spaces - counts[C_NEWLINE];
    /* left to right, as Python evaluates it (no fused multiply-add: see setup.py) */
    double estimate = r->letter * (double)letters;
    estimate = estimate + r->digit * (double)digits;
    estimate = estimate + r->symbol * (double)symbols;
    estimate = estimate + r->space * (double)spaces;
    estimate = estimate + r->per_text;
    double floor_ = (double)n / r->chars_per;
    return (long)ceil(floor_ > estimate ? floor_ : estimate);
}

/* The heuristic's tokens for ASCII text: ceil((len - 2 * four-space runs) / per). */
static int
heuristic_tokens(const Rates *r, PyObject *text, long *out)
{
    Py_ssize_t runs = PyUnicode_Count(text, four_spaces, 0, PY_SSIZE_T_MAX);
    if (runs < 0)
        return -1;
    *out = (long)ceil((double)(PyUnicode_GET_LENGTH(text) - 2 * runs) / r->per);
    return 0;
}

/* An id or a name: 1 and its tokens in *out, 0 when Python must count it, -1 on error. */
static int
short_tokens(const Rates *r, PyObject *part, int heuristic_plain, long *out)
{
    if (!PyUnicode_CheckExact(part) || !PyUnicode_IS_ASCII(part))
        return 0;
    if (r->shape) {
        *out = shape_tokens(r, PyUnicode_1BYTE_DATA(part), PyUnicode_GET_LENGTH(part));
        return 1;
    }
    if (heuristic_plain) { /* a call's id and name: no four-space run, else Python */
        Py_ssize_t runs = PyUnicode_Count(part, four_spaces, 0, PY_SSIZE_T_MAX);
        if (runs < 0)
            return -1;
        if (runs)
            return 0;
        *out = (long)ceil((double)PyUnicode_GET_LENGTH(part) / r->per);
        return 1;
    }
    return heuristic_tokens(r, part, out) < 0 ? -1 : 1;
}

/* The count of one message: 1 and the count in *out, 0 when Python must count it. */
static int
measure_one(const Rates *r, PyObject *message, PyTypeObject *kinds[3], PyObject *arguments,
            long *out)
{
    PyTypeObject *type = Py_TYPE(message);
    int user = type == kinds[0], assistant = type == kinds[1], result = type == kinds[2];
    if (!(user || assistant || result))
        return 0;
    int sure = 0;
    long tokens = r->base, part_tokens = 0;
    PyObject *content = PyObject_GetAttr(message, k_content);
    PyObject *calls = NULL, *metadata = NULL, *call = NULL, *part = NULL;
    if (content == NULL)
        return -1;
    if (!PyUnicode_CheckExact(content) || !PyUnicode_IS_ASCII(content) ||
        PyUnicode_GET_LENGTH(content) > r->exact_to)
        goto done;
    if (r->shape)
        tokens += shape_tokens(r, PyUnicode_1BYTE_DATA(content), PyUnicode_GET_LENGTH(content));
    else if (heuristic_tokens(r, content, &part_tokens) < 0)
        goto error;
    else
        tokens += part_tokens;
    if (result) {
        if ((part = PyObject_GetAttr(message, k_tool_call_id)) == NULL)
            goto error;
        int known = short_tokens(r, part, 0, &part_tokens);
        if (known <= 0) {
            sure = known;
            goto done;
        }
        tokens += part_tokens;
    }
    else if (assistant) {
        if ((metadata = PyObject_GetAttr(message, k_metadata)) == NULL)
            goto error;
        int has_metadata = PyObject_IsTrue(metadata);
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
            call = PyTuple_GET_ITEM(calls, i);
            PyObject *id = PyObject_GetAttr(call, k_id), *name = NULL;
            if (id == NULL)
                goto error;
            name = PyObject_GetAttr(call, k_name);
            if (name == NULL) {
                Py_DECREF(id);
                goto error;
            }
            long id_tokens = 0, name_tokens = 0;
            int known = short_tokens(r, id, 1, &id_tokens);
            if (known > 0)
                known = short_tokens(r, name, 1, &name_tokens);
            Py_DECREF(id);
            Py_DECREF(name);
            if (known <= 0) {
                sure = known;
                goto done;
            }
            PyObject *counted = PyObject_CallOneArg(arguments, call);
            if (counted == NULL)
                goto error;
            long argument_tokens = PyLong_AsLong(counted);
            Py_DECREF(counted);
            if (argument_tokens == -1 && PyErr_Occurred())
                goto error;
            tokens += id_tokens + name_tokens + argument_tokens;
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
    static char *names[] = {"messages", "kinds", "shape", "rates", "base", "per_call",
                            "exact_to", "arguments", NULL};
    PyObject *messages, *rates_tuple, *arguments;
    PyTypeObject *kinds[3];
    Rates r;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!(O!O!O!)pO!llnO:measure", names,
                                     &PyTuple_Type, &messages, &PyType_Type, &kinds[0],
                                     &PyType_Type, &kinds[1], &PyType_Type, &kinds[2], &r.shape,
                                     &PyTuple_Type, &rates_tuple, &r.base, &r.per_call,
                                     &r.exact_to, &arguments))
        return NULL;
    if (r.shape) {
        if (!PyArg_ParseTuple(rates_tuple, "dddddd;shape rates: letter, digit, symbol, space, "
                                           "per_text, chars_per",
                              &r.letter, &r.digit, &r.symbol, &r.space, &r.per_text,
                              &r.chars_per))
            return NULL;
    }
    else if (!PyArg_ParseTuple(rates_tuple, "d;heuristic rates: per", &r.per))
        return NULL;
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
    INTERN(four_spaces, "    ");
#undef INTERN
    return PyModule_Create(&module_def);
}
