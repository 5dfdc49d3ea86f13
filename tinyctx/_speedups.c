/* tinyctx._speedups: the codec's fast reader, in C.
 *
 * Loading a long thread is mostly building typed messages from parsed JSON: thousands of
 * objects, each with a handful of checked fields. This module does what the Python fast
 * reader in tinyctx/codec.py does (_decode_split, _fast_message and the helpers under
 * them), for the documents it is sure of, and answers None for every other one: the
 * Python reader then decodes that document and, if it is bad, names the problem. So this
 * module never decides what a document means and never raises for one; it only saves
 * the interpreter's work where the answer is certain. It reads the documents the codec
 * writes (compact ASCII JSON) straight from their text, building no parsed objects only to
 * read them once; any other spelling is the Python reader's. Without a C compiler the
 * package installs without it and the Python reader does everything (the results are
 * equal: tests/test_speedups.py compares the two).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <math.h>

/* the levels of objects and arrays a metadata or arguments value may nest, its own object
   counted (tinyctx.codec.MAX_NESTING, given by configure()): deeper JSON goes to the Python
   reader, which refuses it (the writer refuses it too) */
static int max_depth = 0;

typedef struct {
    PyTypeObject *type;
    Py_ssize_t offsets[7];
    int count;
} SlotClass;

/* what configure() was given; NULL until then */
static PyObject *empty;       /* tinyctx.frozen.EMPTY */
static PyObject *text_hole;   /* '{"content":null' */
/* the keys each kind of object may have, as bits of the fields below */
static unsigned tool_mask, assistant_mask, text_mask, call_mask;
static long codec_version;
static SlotClass frozen_dict; /* _data, _hash, _json_chars */
static SlotClass tool_call;   /* id, name, arguments, invalid_arguments, hash */
static SlotClass tool_result; /* tool_call_id, content, name, is_error, essential, metadata, hash */
static SlotClass assistant;   /* content, tool_calls, essential, metadata, hash */
static SlotClass user;        /* content, essential, metadata, hash */
static SlotClass system_;     /* content, essential, metadata, hash */

/* interned keys */
static PyObject *k_v, *k_role, *k_content, *k_tool_calls, *k_tool_call_id, *k_name,
    *k_is_error, *k_essential, *k_metadata, *k_id, *k_arguments, *k_invalid_arguments,
    *k_tool, *k_assistant, *k_user, *k_system, *empty_str;

/* A NULL return with no exception set means "not sure": the Python reader decides. */
#define DOUBT NULL

static int
slot_class(PyObject *spec, SlotClass *out, int count)
{
    /* spec: (type, (member descriptor, ...)); out gets a new reference to the type */
    PyObject *type, *descriptors;
    if (!PyArg_ParseTuple(spec, "O!O!", &PyType_Type, &type, &PyTuple_Type, &descriptors))
        return -1;
    if (!PyType_IS_GC((PyTypeObject *)type)) { /* every class with object slots is */
        PyErr_Format(PyExc_TypeError, "%R is not a class with object slots", type);
        return -1;
    }
    if (PyTuple_GET_SIZE(descriptors) != count) {
        PyErr_Format(PyExc_TypeError, "%R: expected %d slot descriptors", type, count);
        return -1;
    }
    for (int i = 0; i < count; i++) {
        PyObject *d = PyTuple_GET_ITEM(descriptors, i);
        if (!Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%R is not a slot", d);
            return -1;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)d)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY) ||
            !PyType_IsSubtype((PyTypeObject *)type, PyDescr_TYPE(d))) {
            PyErr_Format(PyExc_TypeError, "%R is not a writable object slot of %R", d, type);
            return -1;
        }
        out->offsets[i] = member->offset;
    }
    out->type = (PyTypeObject *)Py_NewRef(type);
    out->count = count;
    return 0;
}

/* a new instance with every slot set (steals nothing: each value gets its own reference) */
static PyObject *
build(SlotClass *cls, PyObject **values)
{
    PyObject *obj = cls->type->tp_alloc(cls->type, 0);
    if (obj == NULL)
        return NULL;
    for (int i = 0; i < cls->count; i++) {
        PyObject **slot = (PyObject **)((char *)obj + cls->offsets[i]);
        Py_XSETREF(*slot, Py_NewRef(values[i]));
    }
    /* Out of the cyclic collector's sight (as CPython does for a tuple of atoms): it is
       immutable and holds only what was built from JSON, so it can never be part of a
       cycle, and a long thread's thousands of messages would otherwise be traversed at
       every collection for as long as they live. Freed by reference counting as ever. */
    PyObject_GC_UnTrack(obj);
    return obj;
}

/* the keys a message or call object may have */
enum {
    F_V, F_ROLE, F_CONTENT, F_TOOL_CALLS, F_TOOL_CALL_ID, F_NAME, F_IS_ERROR, F_ESSENTIAL,
    F_METADATA, F_ID, F_ARGUMENTS, F_INVALID_ARGUMENTS, N_FIELDS
};

/* an object's members as read, owned: metadata and arguments frozen, tool_calls a tuple
   of built calls */
typedef struct {
    PyObject *value[N_FIELDS]; /* set where present has the field's bit */
    unsigned present;
} Fields;

#define IS(text) (memcmp(s, text, sizeof(text) - 1) == 0)

/* the field a key's text s[0..n) names, or -1 for any other key */
static int
field_named(const char *s, Py_ssize_t n)
{
    switch (n) {
    case 1:
        return s[0] == 'v' ? F_V : -1;
    case 2:
        return IS("id") ? F_ID : -1;
    case 4:
        return IS("role") ? F_ROLE : IS("name") ? F_NAME : -1;
    case 7:
        return IS("content") ? F_CONTENT : -1;
    case 8:
        return IS("is_error") ? F_IS_ERROR : IS("metadata") ? F_METADATA : -1;
    case 9:
        return IS("arguments") ? F_ARGUMENTS : IS("essential") ? F_ESSENTIAL : -1;
    case 10:
        return IS("tool_calls") ? F_TOOL_CALLS : -1;
    case 12:
        return IS("tool_call_id") ? F_TOOL_CALL_ID : -1;
    case 17:
        return IS("invalid_arguments") ? F_INVALID_ARGUMENTS : -1;
    }
    return -1;
}

#undef IS

/* the field's value (borrowed), or fallback where the object has no such key */
static PyObject *
field(Fields *fields, int i, PyObject *fallback)
{
    return fields->present >> i & 1 ? fields->value[i] : fallback;
}

static PyObject *
wrap(PyObject *data)
{
    PyObject *values[3] = {data, Py_None, Py_None};
    return build(&frozen_dict, values);
}

/* a FrozenDict of a new empty dict: what freezing a nested {} gives */
static PyObject *
wrap_new(void)
{
    PyObject *data = PyDict_New();
    if (data == NULL)
        return NULL;
    PyObject *result = wrap(data);
    Py_DECREF(data);
    return result;
}

/* a field holding a mapping (metadata, arguments), a new reference: read_fields took
   only an object there, frozen; EMPTY when absent */
static PyObject *
mapping_field(Fields *fields, int i)
{
    return Py_NewRef(field(fields, i, empty));
}

static int
is_text(PyObject *value, int nonempty)
{
    return value != NULL && PyUnicode_CheckExact(value) &&
           (!nonempty || PyUnicode_GET_LENGTH(value) > 0);
}

static int
is_bool(PyObject *value)
{
    return value == Py_True || value == Py_False;
}

/* the essential flag and metadata every message has: 0, or -1 where the flag is no bool */
static int
base_fields(Fields *fields, PyObject **essential, PyObject **metadata)
{
    *essential = field(fields, F_ESSENTIAL, Py_True);
    if (!is_bool(*essential))
        return -1;
    *metadata = mapping_field(fields, F_METADATA);
    return 0;
}

/* A message: its own fields are values[0..count - 3); the last three slots of every
   message class are the essential flag, the metadata and no hash yet, read here. */
static PyObject *
build_message(SlotClass *cls, Fields *fields, PyObject **values)
{
    PyObject **base = values + cls->count - 3;
    if (base_fields(fields, &base[0], &base[1]) < 0)
        return DOUBT;
    base[2] = Py_None;
    PyObject *message = build(cls, values);
    Py_DECREF(base[1]); /* the metadata base_fields made */
    return message;
}

static PyObject *
fast_tool(Fields *fields)
{
    if (fields->present & ~tool_mask)
        return DOUBT;
    PyObject *call_id = field(fields, F_TOOL_CALL_ID, NULL);
    PyObject *content = field(fields, F_CONTENT, NULL);
    PyObject *name = field(fields, F_NAME, empty_str);
    PyObject *is_error = field(fields, F_IS_ERROR, Py_False);
    if (!is_text(call_id, 1) || !is_text(content, 0) || !is_text(name, 0) || !is_bool(is_error))
        return DOUBT;
    PyObject *values[7] = {call_id, content, name, is_error};
    return build_message(&tool_result, fields, values);
}

static PyObject *
call_from_fields(Fields *fields)
{
    if (fields->present & ~call_mask)
        return DOUBT;
    PyObject *call_id = field(fields, F_ID, NULL);
    PyObject *name = field(fields, F_NAME, NULL);
    PyObject *invalid = field(fields, F_INVALID_ARGUMENTS, Py_None);
    if (!is_text(call_id, 1) || !is_text(name, 1) ||
        (invalid != Py_None && !PyUnicode_CheckExact(invalid)))
        return DOUBT;
    PyObject *arguments = mapping_field(fields, F_ARGUMENTS);
    PyObject *values[5] = {call_id, name, arguments, invalid, Py_None};
    PyObject *call = build(&tool_call, values);
    Py_DECREF(arguments);
    return call;
}

/* 1 when the calls' ids are all different, 0 when two are the same, -1 on error */
static int
unique_ids(PyObject *calls)
{
    Py_ssize_t n = PyTuple_GET_SIZE(calls);
    if (n < 2)
        return 1;
    PyObject *ids = PySet_New(NULL);
    if (ids == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = *(PyObject **)((char *)PyTuple_GET_ITEM(calls, i) + tool_call.offsets[0]);
        if (PySet_Add(ids, id) < 0) {
            Py_DECREF(ids);
            return -1;
        }
    }
    int unique = PySet_GET_SIZE(ids) == n;
    Py_DECREF(ids);
    return unique;
}

static PyObject *
fast_assistant(Fields *fields)
{
    if (fields->present & ~assistant_mask)
        return DOUBT;
    PyObject *content = field(fields, F_CONTENT, empty_str);
    if (!is_text(content, 0))
        return DOUBT;
    PyObject *calls = field(fields, F_TOOL_CALLS, NULL); /* built by read_calls */
    PyObject *tool_calls = calls == NULL ? PyTuple_New(0) : Py_NewRef(calls);
    if (tool_calls == NULL)
        return NULL;
    int unique = unique_ids(tool_calls);
    if (unique <= 0) {
        Py_DECREF(tool_calls);
        return unique < 0 ? NULL : DOUBT;
    }
    PyObject *values[5] = {content, tool_calls};
    PyObject *message = build_message(&assistant, fields, values);
    Py_DECREF(tool_calls);
    return message;
}

static PyObject *
fast_text(Fields *fields, SlotClass *cls)
{
    if (fields->present & ~text_mask)
        return DOUBT;
    PyObject *content = field(fields, F_CONTENT, NULL);
    if (!is_text(content, 0))
        return DOUBT;
    PyObject *values[4] = {content};
    return build_message(cls, fields, values);
}

/* A message from its document's members. text, when not NULL, is a split document's
   text: its head holds the text's place with a null "content". */
static PyObject *
message_from_fields(Fields *fields, PyObject *text)
{
    if (text != NULL) {
        if (field(fields, F_CONTENT, NULL) != Py_None)
            return DOUBT;
        Py_SETREF(fields->value[F_CONTENT], Py_NewRef(text));
    }
    PyObject *version = field(fields, F_V, NULL);
    if (version == NULL || !PyLong_CheckExact(version))
        return DOUBT;
    int overflow;
    long v = PyLong_AsLongAndOverflow(version, &overflow);
    if (overflow || v != codec_version)
        return DOUBT;
    PyObject *role = field(fields, F_ROLE, NULL);
    if (role == NULL || !PyUnicode_CheckExact(role))
        return DOUBT;
    if (PyUnicode_Compare(role, k_tool) == 0)
        return fast_tool(fields);
    if (PyUnicode_Compare(role, k_assistant) == 0)
        return fast_assistant(fields);
    if (PyUnicode_Compare(role, k_user) == 0)
        return fast_text(fields, &user);
    if (PyUnicode_Compare(role, k_system) == 0)
        return fast_text(fields, &system_);
    return DOUBT;
}

/* -- reading the text ---------------------------------------------------------------------
   A document the codec wrote is compact ASCII JSON (no spaces, non-ASCII escaped); the
   message is read straight from it, with metadata and arguments built frozen. Anything
   else gets DOUBT (a space, an escaped or repeated key, a number it cannot read exactly as
   Python does, a lone surrogate, nesting past max_depth), so what is answered, the Python
   reader answers too (tests/test_speedups.py holds both to the same messages). */

typedef struct {
    const char *p, *end;
    int depth;
} Cursor;

static PyObject *read_value(Cursor *c);

static int
expect(Cursor *c, char ch)
{
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

static int
hex4(const char *p, Py_UCS4 *out)
{
    Py_UCS4 v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        v <<= 4;
        if (ch >= '0' && ch <= '9')
            v |= (Py_UCS4)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            v |= (Py_UCS4)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F')
            v |= (Py_UCS4)(ch - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

/* the first of (p, end) that ends a plain run of string bytes: a quote, a backslash or a
   control character (eight bytes at a time: most text has none of them) */
static const char *
plain_run(const char *p, const char *end)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t quote = w ^ (ones * '"'), slash = w ^ (ones * '\\');
        uint64_t hit = ((quote - ones) & ~quote) | ((slash - ones) & ~slash) | (w - ones * 0x20);
        if (hit & ~w & highs)
            break; /* one of these eight bytes (ASCII text: no high bit set) */
        p += 8;
    }
    while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
        p++;
    return p;
}

/* the character a one-letter escape (after its backslash) stands for, or -1 */
static int
simple_escape(char ch)
{
    switch (ch) {
    case '"':
    case '\\':
    case '/':
        return ch;
    case 'b':
        return '\b';
    case 'f':
        return '\f';
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    }
    return -1;
}

/* a string's escaped text [r, q) decoded to UCS4 (a \u escape past ASCII was found) */
static PyObject *
wide_string(const char *r, const char *q)
{
    Py_ssize_t n = q - r;
    Py_UCS4 stack[256], *buf = n <= 256 ? stack : PyMem_New(Py_UCS4, n);
    if (buf == NULL)
        return PyErr_NoMemory();
    Py_ssize_t len = 0;
    PyObject *result = DOUBT;
    for (; r < q; r++) {
        if (*r != '\\') {
            buf[len++] = (unsigned char)*r;
            continue;
        }
        r++;
        Py_UCS4 ch;
        int simple = simple_escape(*r);
        if (simple >= 0)
            ch = (Py_UCS4)simple;
        else if (*r != 'u')
            goto done;
        else {
            if (q - r < 5 || !hex4(r + 1, &ch))
                goto done;
            r += 4;
            if (ch >= 0xDC00 && ch <= 0xDFFF)
                goto done; /* a lone low surrogate */
            if (ch >= 0xD800 && ch <= 0xDBFF) {
                Py_UCS4 low;
                if (q - r < 7 || r[1] != '\\' || r[2] != 'u' || !hex4(r + 3, &low) ||
                    low < 0xDC00 || low > 0xDFFF)
                    goto done; /* a lone high surrogate */
                ch = 0x10000 + ((ch - 0xD800) << 10) + (low - 0xDC00);
                r += 6;
            }
        }
        buf[len++] = ch;
    }
    result = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, buf, len);
done:
    if (buf != stack)
        PyMem_Free(buf);
    return result;
}

/* a str of n ASCII bytes */
static PyObject *
ascii_text(const char *data, Py_ssize_t n)
{
    PyObject *text = PyUnicode_New(n, 127);
    if (text != NULL)
        memcpy(PyUnicode_DATA(text), data, (size_t)n);
    return text;
}

/* a string (c->p after its opening quote) */
static PyObject *
read_string(Cursor *c)
{
    const char *start = c->p, *q = plain_run(start, c->end);
    if (q < c->end && *q == '"') { /* no escapes: the text as it is */
        c->p = q + 1;
        return ascii_text(start, q - start);
    }
    /* escapes: find the closing quote, then decode, in one byte per character while the
       text stays ASCII */
    while (q < c->end && *q != '"') {
        if ((unsigned char)*q < 0x20)
            return DOUBT; /* a raw control character: not JSON */
        q += *q == '\\' ? 2 : 1; /* an escaped character never closes the string */
        q = plain_run(q, c->end);
    }
    if (q >= c->end)
        return DOUBT;
    c->p = q + 1;
    Py_ssize_t n = q - start;
    char stack[512], *buf = n <= 512 ? stack : PyMem_Malloc((size_t)n);
    if (buf == NULL)
        return PyErr_NoMemory();
    Py_ssize_t len = 0;
    PyObject *result = DOUBT;
    for (const char *r = start; r < q; r++) {
        if (*r != '\\') {
            buf[len++] = *r;
            continue;
        }
        r++;
        int ch = simple_escape(*r);
        if (ch < 0) {
            Py_UCS4 code;
            if (*r != 'u' || q - r < 5 || !hex4(r + 1, &code))
                goto done;
            if (code >= 0x80) { /* past ASCII: decode the whole text wide */
                result = wide_string(start, q);
                goto done;
            }
            ch = (int)code;
            r += 4;
        }
        buf[len++] = (char)ch;
    }
    result = ascii_text(buf, len);
done:
    if (buf != stack)
        PyMem_Free(buf);
    return result;
}

/* a number, read as Python's json reads it: an int of any size, or a finite float */
static PyObject *
read_number(Cursor *c)
{
    const char *start = c->p, *q = start;
    int is_float = 0;
    if (q < c->end && *q == '-')
        q++;
    if (q >= c->end || *q < '0' || *q > '9')
        return DOUBT;
    if (*q == '0')
        q++;
    else
        while (q < c->end && *q >= '0' && *q <= '9')
            q++;
    if (q < c->end && *q == '.') {
        is_float = 1;
        q++;
        if (q >= c->end || *q < '0' || *q > '9')
            return DOUBT;
        while (q < c->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < c->end && (*q == 'e' || *q == 'E')) {
        is_float = 1;
        q++;
        if (q < c->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= c->end || *q < '0' || *q > '9')
            return DOUBT;
        while (q < c->end && *q >= '0' && *q <= '9')
            q++;
    }
    Py_ssize_t n = q - start;
    if (n > 40)
        return DOUBT; /* a long number: the Python reader reads it */
    char text[41];
    memcpy(text, start, (size_t)n);
    text[n] = '\0';
    c->p = q;
    if (!is_float) /* 18 digits fit a long long */
        return n <= 18 ? PyLong_FromLongLong(strtoll(text, NULL, 10))
                       : PyLong_FromString(text, NULL, 10);
    char *stop;
    double d = PyOS_string_to_double(text, &stop, NULL);
    if (d == -1.0 && PyErr_Occurred())
        return NULL;
    if (stop != text + n || !isfinite(d))
        return DOUBT; /* past the largest float: the Python reader says what that is */
    return PyFloat_FromDouble(d);
}

/* an object, frozen; top: a message's metadata or a call's arguments ({} is EMPTY there) */
static PyObject *
read_object(Cursor *c, int top)
{
    if (c->depth >= max_depth)
        return DOUBT;
    if (expect(c, '}'))
        return top ? Py_NewRef(empty) : wrap_new();
    PyObject *data = PyDict_New();
    if (data == NULL)
        return NULL;
    c->depth++;
    do {
        PyObject *key = expect(c, '"') ? read_string(c) : DOUBT;
        if (key == NULL)
            goto fail;
        PyObject *value = expect(c, ':') ? read_value(c) : DOUBT;
        if (value == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        Py_ssize_t before = PyDict_GET_SIZE(data);
        int failed = PyDict_SetItem(data, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (failed < 0 || PyDict_GET_SIZE(data) == before) /* an error, or a repeated key */
            goto fail;
    } while (expect(c, ','));
    c->depth--;
    if (!expect(c, '}')) {
        Py_DECREF(data);
        return DOUBT;
    }
    PyObject *result = wrap(data);
    Py_DECREF(data);
    return result;
fail:
    Py_DECREF(data);
    return NULL;
}

/* appends a new reference and lets go of it; -1 where there is none (an error or DOUBT)
   or the append failed */
static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

static PyObject *
read_array(Cursor *c)
{
    if (c->depth >= max_depth)
        return DOUBT;
    if (expect(c, ']'))
        return PyTuple_New(0);
    PyObject *items = PyList_New(0);
    if (items == NULL)
        return NULL;
    c->depth++;
    do {
        if (append_new(items, read_value(c)) < 0) {
            Py_DECREF(items);
            return NULL;
        }
    } while (expect(c, ','));
    c->depth--;
    PyObject *result = expect(c, ']') ? PyList_AsTuple(items) : DOUBT;
    Py_DECREF(items);
    return result;
}

static int
literal(Cursor *c, const char *text, Py_ssize_t n)
{
    if (c->end - c->p < n || memcmp(c->p, text, (size_t)n) != 0)
        return 0;
    c->p += n;
    return 1;
}

/* any JSON value, frozen as the codec freezes one (objects FrozenDicts, arrays tuples) */
static PyObject *
read_value(Cursor *c)
{
    if (c->p >= c->end)
        return DOUBT;
    switch (*c->p) {
    case '"':
        c->p++;
        return read_string(c);
    case '{':
        c->p++;
        return read_object(c, 0);
    case '[':
        c->p++;
        return read_array(c);
    case 't':
        return literal(c, "true", 4) ? Py_NewRef(Py_True) : DOUBT;
    case 'f':
        return literal(c, "false", 5) ? Py_NewRef(Py_False) : DOUBT;
    case 'n':
        return literal(c, "null", 4) ? Py_NewRef(Py_None) : DOUBT;
    }
    return read_number(c);
}

/* a key of a message or call object: a known field, never escaped; -1 for any other */
static int
read_key(Cursor *c)
{
    if (!expect(c, '"'))
        return -1;
    const char *start = c->p;
    while (c->p < c->end && *c->p != '"' && *c->p != '\\')
        c->p++;
    if (c->p >= c->end || *c->p != '"')
        return -1;
    Py_ssize_t n = c->p - start;
    c->p++;
    return expect(c, ':') ? field_named(start, n) : -1;
}

static void
clear_fields(Fields *fields)
{
    for (int i = 0; i < N_FIELDS; i++)
        if (fields->present >> i & 1)
            Py_DECREF(fields->value[i]);
    fields->present = 0;
}

static PyObject *read_calls(Cursor *c);

/* the members of an object (c->p after its '{') into fields: 1, or 0 (doubt or error) */
static int
read_fields(Cursor *c, unsigned allowed, Fields *fields)
{
    fields->present = 0;
    if (expect(c, '}'))
        return 1;
    do {
        int i = read_key(c);
        if (i < 0 || !(allowed >> i & 1) || fields->present >> i & 1)
            return 0; /* another key, or a repeated one (or a key the role has not) */
        PyObject *value;
        if (i == F_METADATA || i == F_ARGUMENTS)
            value = expect(c, '{') ? read_object(c, 1) : DOUBT; /* else Python says why */
        else if (i == F_TOOL_CALLS)
            value = read_calls(c);
        else
            value = read_value(c);
        if (value == NULL)
            return 0;
        fields->value[i] = value;
        fields->present |= 1u << i;
    } while (expect(c, ','));
    return expect(c, '}');
}

/* a message's tool calls, built: a tuple of calls, or DOUBT */
static PyObject *
read_calls(Cursor *c)
{
    if (!expect(c, '['))
        return DOUBT;
    PyObject *calls = PyList_New(0);
    if (calls == NULL)
        return NULL;
    if (!expect(c, ']')) {
        do {
            Fields fields = {.present = 0};
            PyObject *call = DOUBT;
            if (expect(c, '{') && read_fields(c, call_mask, &fields))
                call = call_from_fields(&fields);
            clear_fields(&fields);
            if (append_new(calls, call) < 0) {
                Py_DECREF(calls);
                return NULL;
            }
        } while (expect(c, ','));
        if (!expect(c, ']')) {
            Py_DECREF(calls);
            return DOUBT;
        }
    }
    PyObject *result = PyList_AsTuple(calls);
    Py_DECREF(calls);
    if (result != NULL)
        PyObject_GC_UnTrack(result); /* holds untracked calls only */
    return result;
}

/* the message of a document the codec wrote (text: a split document's text, or NULL) */
static PyObject *
direct_message(PyObject *doc, PyObject *text)
{
    if (!PyUnicode_IS_COMPACT_ASCII(doc))
        return DOUBT;
    const char *data = (const char *)PyUnicode_DATA(doc);
    Cursor c = {data, data + PyUnicode_GET_LENGTH(doc), 0};
    Fields fields = {.present = 0};
    PyObject *message = DOUBT;
    if (expect(&c, '{') &&
        read_fields(&c, tool_mask | assistant_mask | text_mask, &fields) && c.p == c.end)
        message = message_from_fields(&fields, text);
    clear_fields(&fields);
    return message;
}

/* one stored row: a whole document (str), or a split document's (head, text) */
static PyObject *
read_row(PyObject *row)
{
    if (PyUnicode_CheckExact(row))
        return direct_message(row, NULL);
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 2)
        return DOUBT;
    PyObject *head = PyTuple_GET_ITEM(row, 0), *text = PyTuple_GET_ITEM(row, 1);
    if (!PyUnicode_CheckExact(head))
        return DOUBT;
    if (text == Py_None)
        return direct_message(head, NULL);
    if (!PyUnicode_CheckExact(text) || PyUnicode_Tailmatch(head, text_hole, 0, 15, -1) != 1)
        return DOUBT;
    return direct_message(head, text);
}

static PyObject *
read_rows(PyObject *module, PyObject *rows)
{
    if (frozen_dict.type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "tinyctx._speedups.configure() was not called");
        return NULL;
    }
    /* a tuple of the rows (the same one when given a tuple): no other thread can change it
       while the parser runs */
    PyObject *seq = PySequence_Tuple(rows);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *message = read_row(PyTuple_GET_ITEM(seq, i));
        if (message == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(out);
                Py_DECREF(seq);
                return NULL;
            }
            message = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(out, i, message);
    }
    Py_DECREF(seq);
    return out;
}

/* the fields named in value (a frozenset of key names) as bits; -1 on error */
static int
key_mask(PyObject *value, const char *what, unsigned *mask)
{
    if (!PyFrozenSet_CheckExact(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be a frozenset", what);
        return -1;
    }
    PyObject *keys[N_FIELDS] = {
        [F_V] = k_v, [F_ROLE] = k_role, [F_CONTENT] = k_content,
        [F_TOOL_CALLS] = k_tool_calls, [F_TOOL_CALL_ID] = k_tool_call_id, [F_NAME] = k_name,
        [F_IS_ERROR] = k_is_error, [F_ESSENTIAL] = k_essential, [F_METADATA] = k_metadata,
        [F_ID] = k_id, [F_ARGUMENTS] = k_arguments, [F_INVALID_ARGUMENTS] = k_invalid_arguments,
    };
    *mask = 0;
    for (int i = 0; i < N_FIELDS; i++) {
        int found = PySet_Contains(value, keys[i]);
        if (found < 0)
            return -1;
        if (found)
            *mask |= 1u << i;
    }
    /* a key the reader does not know is never read here: its documents go to Python */
    return 0;
}

static void
replace(PyObject **target, PyObject *value)
{
    Py_XSETREF(*target, Py_NewRef(value));
}

static void
replace_class(SlotClass *target, SlotClass *value)
{
    Py_XDECREF(target->type);
    *target = *value; /* takes over the new reference to the type */
}

/* Everything is checked before anything changes: a refused call leaves the reader as it was. */
static PyObject *
configure(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"empty", "frozen_dict", "tool_call", "tool_result", "assistant",
                            "user", "system", "tool_keys", "assistant_keys", "text_keys",
                            "call_keys", "version", "text_hole", "max_depth", NULL};
    PyObject *new_empty, *specs[6], *tk, *ak, *xk, *ck, *hole;
    long version;
    int new_max_depth;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOOOOOOOOOOlUi:configure", names,
                                     &new_empty, &specs[0], &specs[1], &specs[2], &specs[3],
                                     &specs[4], &specs[5], &tk, &ak, &xk, &ck, &version, &hole,
                                     &new_max_depth))
        return NULL;
    if (new_max_depth < 1 || new_max_depth > 1000) { /* the C stack holds 1000 levels */
        PyErr_SetString(PyExc_ValueError, "max_depth must be in 1..1000");
        return NULL;
    }
    if (PyUnicode_GET_LENGTH(hole) != 15) {
        PyErr_SetString(PyExc_ValueError, "text_hole must be 15 characters");
        return NULL;
    }
    unsigned masks[4];
    if (key_mask(tk, "tool_keys", &masks[0]) < 0 || key_mask(ak, "assistant_keys", &masks[1]) < 0 ||
        key_mask(xk, "text_keys", &masks[2]) < 0 || key_mask(ck, "call_keys", &masks[3]) < 0)
        return NULL;
    static const int counts[6] = {3, 5, 7, 5, 4, 4};
    SlotClass classes[6] = {{0}};
    for (int i = 0; i < 6; i++) {
        if (slot_class(specs[i], &classes[i], counts[i]) < 0) {
            for (int j = 0; j < i; j++)
                Py_DECREF(classes[j].type);
            return NULL;
        }
    }
    SlotClass *targets[6] = {&frozen_dict, &tool_call, &tool_result, &assistant, &user, &system_};
    for (int i = 0; i < 6; i++)
        replace_class(targets[i], &classes[i]);
    tool_mask = masks[0];
    assistant_mask = masks[1];
    text_mask = masks[2];
    call_mask = masks[3];
    replace(&empty, new_empty);
    replace(&text_hole, hole);
    codec_version = version;
    max_depth = new_max_depth;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Give the reader the codec's classes, slots and key sets."},
    {"read_rows", read_rows, METH_O,
     "The message of each stored row (a document, or a split document's (head, text)), "
     "or None where the Python reader must decide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "tinyctx._speedups", "The codec's fast reader, in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
#define INTERN(var, text)                                                                      \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                      \
        return NULL;
    INTERN(k_v, "v");
    INTERN(k_role, "role");
    INTERN(k_content, "content");
    INTERN(k_tool_calls, "tool_calls");
    INTERN(k_tool_call_id, "tool_call_id");
    INTERN(k_name, "name");
    INTERN(k_is_error, "is_error");
    INTERN(k_essential, "essential");
    INTERN(k_metadata, "metadata");
    INTERN(k_id, "id");
    INTERN(k_arguments, "arguments");
    INTERN(k_invalid_arguments, "invalid_arguments");
    INTERN(k_tool, "tool");
    INTERN(k_assistant, "assistant");
    INTERN(k_user, "user");
    INTERN(k_system, "system");
    INTERN(empty_str, "");
#undef INTERN
    return PyModule_Create(&module_def);
}
