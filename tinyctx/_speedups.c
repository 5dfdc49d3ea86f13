/* tinyctx._speedups: the codec's fast reader, in C.
 *
 * Loading a long thread is mostly building typed messages from parsed JSON: thousands of
 * objects, each with a handful of checked fields. This module does what the Python fast
 * reader in tinyctx/codec.py does (_decode_split, _fast_message and the helpers under
 * them), for the documents it is sure of, and answers None for every other one: the
 * Python reader then decodes that document and, if it is bad, names the problem. So this
 * module never decides what a document means and never raises for one; it only saves
 * the interpreter's work where the answer is certain. Each document is parsed by orjson
 * (the parser the Python reader uses too) and the messages are built in C from its result.
 * It used to scan the JSON text itself; benchmarks/bench_codec_reader.py measured that
 * scanner slower than orjson's parse plus this builder (a 2,000-message load: scanner
 * 48.0 ms, orjson + builder 30.4 ms, medians of 7 interleaved rounds), so it went.
 * Without a C compiler the package installs without it and the Python reader does
 * everything (the results are equal: tests/test_speedups.py compares the two).
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

/* a field holding a mapping (metadata, arguments), a new reference: parsed_fields took
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
    PyObject *calls = field(fields, F_TOOL_CALLS, NULL); /* built by parsed_calls */
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

static void
clear_fields(Fields *fields)
{
    for (int i = 0; i < N_FIELDS; i++)
        if (fields->present >> i & 1)
            Py_DECREF(fields->value[i]);
    fields->present = 0;
}

/* -- building from parsed JSON ------------------------------------------------------------
   orjson.loads's result (dicts, lists, str, int, float, bool, None), built as the Python
   fast reader builds it (tinyctx/_codec_fast.py), with the same doubts: a float past 64
   bits (orjson's reading of a longer integer literal), nesting past max_depth, a key no
   message has. The parsed containers are ours: they are frozen in place, not copied. */

static PyObject *loads; /* orjson.loads, given by configure() */

static PyObject *freeze_parsed(PyObject *value, int depth);

/* a parsed object at nesting level depth, frozen (a FrozenDict over the same dict);
   top: a message's metadata or a call's arguments ({} is EMPTY there) */
static PyObject *
freeze_dict(PyObject *data, int depth, int top)
{
    if (depth > max_depth)
        return DOUBT;
    if (top && PyDict_GET_SIZE(data) == 0)
        return Py_NewRef(empty);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(data, &pos, &key, &value)) {
        PyObject *frozen = freeze_parsed(value, depth + 1);
        if (frozen == NULL)
            return NULL;
        /* a new value for a key already there: allowed while iterating */
        int failed = frozen != value && PyDict_SetItem(data, key, frozen) < 0;
        Py_DECREF(frozen);
        if (failed)
            return NULL;
    }
    return wrap(data);
}

/* a parsed value at nesting level depth (when a container), frozen: a new reference */
static PyObject *
freeze_parsed(PyObject *value, int depth)
{
    if (PyDict_CheckExact(value))
        return freeze_dict(value, depth, 0);
    if (PyList_CheckExact(value)) {
        if (depth > max_depth)
            return DOUBT;
        Py_ssize_t n = PyList_GET_SIZE(value);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyList_GET_ITEM(value, i);
            PyObject *frozen = freeze_parsed(item, depth + 1);
            if (frozen == NULL)
                return NULL;
            PyList_SetItem(value, i, frozen); /* steals frozen, lets go of item */
        }
        return PyList_AsTuple(value);
    }
    if (PyFloat_CheckExact(value)) {
        double x = PyFloat_AS_DOUBLE(value);
        if (!(x > -9223372036854775808.0 && x < 9223372036854775808.0))
            return DOUBT; /* maybe an integer literal past 64 bits: the stdlib reads it */
    }
    return Py_NewRef(value);
}

static PyObject *parsed_calls(PyObject *value);

/* the members of a parsed object into fields: 1, or 0 (doubt or error) */
static int
parsed_fields(PyObject *obj, unsigned allowed, Fields *fields)
{
    fields->present = 0;
    if (!PyDict_CheckExact(obj))
        return 0;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        if (!PyUnicode_IS_COMPACT_ASCII(key))
            return 0; /* no field's name */
        int i = field_named((const char *)PyUnicode_DATA(key), PyUnicode_GET_LENGTH(key));
        if (i < 0 || !(allowed >> i & 1))
            return 0;
        PyObject *item;
        if (i == F_METADATA || i == F_ARGUMENTS)
            item = PyDict_CheckExact(value) ? freeze_dict(value, 1, 1) : DOUBT;
        else if (i == F_TOOL_CALLS)
            item = parsed_calls(value);
        else
            item = Py_NewRef(value);
        if (item == NULL)
            return 0;
        fields->value[i] = item;
        fields->present |= 1u << i;
    }
    return 1;
}

/* a parsed message's tool calls, built: a tuple of calls, or DOUBT */
static PyObject *
parsed_calls(PyObject *value)
{
    if (!PyList_CheckExact(value))
        return DOUBT;
    Py_ssize_t n = PyList_GET_SIZE(value);
    PyObject *calls = PyTuple_New(n);
    if (calls == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Fields fields = {.present = 0};
        PyObject *call = DOUBT;
        if (parsed_fields(PyList_GET_ITEM(value, i), call_mask, &fields))
            call = call_from_fields(&fields);
        clear_fields(&fields);
        if (call == NULL) {
            Py_DECREF(calls);
            return NULL;
        }
        PyTuple_SET_ITEM(calls, i, call);
    }
    PyObject_GC_UnTrack(calls); /* holds untracked calls only */
    return calls;
}

/* the message of a document parsed by loads (text: a split document's text, or NULL) */
static PyObject *
parsed_message(PyObject *doc, PyObject *text)
{
    PyObject *obj = PyObject_CallOneArg(loads, doc);
    if (obj == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return NULL;
        PyErr_Clear(); /* JSON orjson refuses: the stdlib parser names the problem */
        return DOUBT;
    }
    Fields fields = {.present = 0};
    PyObject *message = DOUBT;
    if (parsed_fields(obj, tool_mask | assistant_mask | text_mask, &fields))
        message = message_from_fields(&fields, text);
    clear_fields(&fields);
    Py_DECREF(obj);
    return message;
}

/* one stored row: a whole document (str), or a split document's (head, text) */
static PyObject *
read_row(PyObject *row)
{
    if (PyUnicode_CheckExact(row))
        return parsed_message(row, NULL);
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 2)
        return DOUBT;
    PyObject *head = PyTuple_GET_ITEM(row, 0), *text = PyTuple_GET_ITEM(row, 1);
    if (!PyUnicode_CheckExact(head))
        return DOUBT;
    if (text == Py_None)
        return parsed_message(head, NULL);
    if (!PyUnicode_CheckExact(text) || PyUnicode_Tailmatch(head, text_hole, 0, 15, -1) != 1)
        return DOUBT;
    return parsed_message(head, text);
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
        PyObject *built = read_row(PyTuple_GET_ITEM(seq, i));
        if (built == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(out);
                Py_DECREF(seq);
                return NULL;
            }
            built = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(out, i, built);
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
                            "call_keys", "version", "text_hole", "max_depth", "loads",
                            NULL};
    PyObject *new_empty, *specs[6], *tk, *ak, *xk, *ck, *hole, *new_loads;
    long version;
    int new_max_depth;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOOOOOOOOOOlUiO:configure", names,
                                     &new_empty, &specs[0], &specs[1], &specs[2], &specs[3],
                                     &specs[4], &specs[5], &tk, &ak, &xk, &ck, &version, &hole,
                                     &new_max_depth, &new_loads))
        return NULL;
    if (!PyCallable_Check(new_loads)) {
        PyErr_SetString(PyExc_TypeError, "loads must be callable");
        return NULL;
    }
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
    replace(&loads, new_loads);
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
