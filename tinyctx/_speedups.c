/* tinyctx._speedups: the codec's fast reader, in C.
 *
 * Loading a long thread is mostly building typed messages from parsed JSON: thousands of
 * objects, each with a handful of checked fields. This module does what the Python fast
 * reader in tinyctx/codec.py does (_decode_split, _fast_message and the helpers under
 * them), for the documents it is sure of, and answers None for every other one: the
 * Python reader then decodes that document and, if it is bad, names the problem. So this
 * module never decides what a document means and never raises for one; it only saves
 * the interpreter's work where the answer is certain. Without a C compiler the package
 * installs without it and the Python reader does everything (the results are equal:
 * tests/test_speedups.py compares the two).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define MAX_DEPTH 200 /* deeper JSON goes to the Python reader */

typedef struct {
    PyTypeObject *type;
    Py_ssize_t offsets[7];
    int count;
} SlotClass;

/* what configure() was given; NULL until then */
static PyObject *loads;
static PyObject *empty;       /* tinyctx.frozen.EMPTY */
static PyObject *tool_keys, *assistant_keys, *text_keys, *call_keys;
static PyObject *text_hole;   /* '{"content":null' */
static long codec_version;
static double big_float;
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

/* obj.get(key, fallback) as a borrowed reference; NULL with an error only on failure */
static PyObject *
get(PyObject *obj, PyObject *key, PyObject *fallback)
{
    PyObject *value = PyDict_GetItemWithError(obj, key);
    if (value == NULL && !PyErr_Occurred())
        return fallback;
    return value;
}

/* 1 when every key of obj is in allowed, 0 when one is not, -1 on error */
static int
keys_within(PyObject *obj, PyObject *allowed)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        int found = PySet_Contains(allowed, key);
        if (found <= 0)
            return found;
    }
    return 1;
}

static PyObject *freeze_value(PyObject *value, int depth);

static PyObject *
wrap(PyObject *data)
{
    PyObject *values[3] = {data, Py_None, Py_None};
    return build(&frozen_dict, values);
}

/* _freeze_object: a flat object is adopted as it is; a nested one is copied, frozen */
static PyObject *
freeze_object(PyObject *obj, int depth)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    int flat = 1;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        if (PyDict_CheckExact(value) || PyList_CheckExact(value) || PyFloat_CheckExact(value)) {
            flat = 0;
            break;
        }
    }
    if (flat)
        return wrap(obj);
    if (depth >= MAX_DEPTH)
        return DOUBT;
    PyObject *copy = PyDict_New();
    if (copy == NULL)
        return NULL;
    pos = 0;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        PyObject *frozen = freeze_value(value, depth + 1);
        if (frozen == NULL || PyDict_SetItem(copy, key, frozen) < 0) {
            Py_XDECREF(frozen);
            Py_DECREF(copy);
            return NULL;
        }
        Py_DECREF(frozen);
    }
    PyObject *result = wrap(copy);
    Py_DECREF(copy);
    return result;
}

static PyObject *
freeze_value(PyObject *value, int depth)
{
    if (PyDict_CheckExact(value))
        return freeze_object(value, depth);
    if (PyList_CheckExact(value)) {
        if (depth >= MAX_DEPTH)
            return DOUBT;
        Py_ssize_t n = PyList_GET_SIZE(value);
        PyObject *tuple = PyTuple_New(n);
        if (tuple == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *frozen = freeze_value(PyList_GET_ITEM(value, i), depth + 1);
            if (frozen == NULL) {
                Py_DECREF(tuple);
                return NULL;
            }
            PyTuple_SET_ITEM(tuple, i, frozen);
        }
        return tuple;
    }
    if (PyFloat_CheckExact(value)) {
        double d = PyFloat_AS_DOUBLE(value);
        if (!(-big_float < d && d < big_float))
            return DOUBT; /* maybe an integer past 64 bits: the stdlib must read it */
    }
    return Py_NewRef(value);
}

/* _fast_mapping: a message's metadata or a call's arguments, EMPTY when absent or {} */
static PyObject *
fast_mapping(PyObject *value)
{
    if (value == empty)
        return Py_NewRef(empty);
    if (!PyDict_CheckExact(value))
        return DOUBT;
    if (PyDict_GET_SIZE(value) == 0)
        return Py_NewRef(empty);
    return freeze_object(value, 0);
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

/* the essential flag and metadata every message has: 0, or -1 (an error, or doubt) */
static int
base_fields(PyObject *obj, PyObject **essential, PyObject **metadata)
{
    *essential = get(obj, k_essential, Py_True);
    if (*essential == NULL || !is_bool(*essential))
        return -1;
    PyObject *raw = get(obj, k_metadata, empty);
    if (raw == NULL)
        return -1;
    *metadata = fast_mapping(raw);
    return *metadata == NULL ? -1 : 0;
}

/* A message: its own fields are values[0..count - 3); the last three slots of every
   message class are the essential flag, the metadata and no hash yet, read here. */
static PyObject *
build_message(SlotClass *cls, PyObject *obj, PyObject **values)
{
    PyObject **base = values + cls->count - 3;
    if (base_fields(obj, &base[0], &base[1]) < 0)
        return DOUBT;
    base[2] = Py_None;
    PyObject *message = build(cls, values);
    Py_DECREF(base[1]); /* the metadata base_fields made */
    return message;
}

static PyObject *
fast_tool(PyObject *obj)
{
    if (keys_within(obj, tool_keys) <= 0)
        return DOUBT;
    PyObject *call_id = get(obj, k_tool_call_id, NULL);
    PyObject *content = get(obj, k_content, NULL);
    PyObject *name = get(obj, k_name, empty_str);
    PyObject *is_error = get(obj, k_is_error, Py_False);
    if (!is_text(call_id, 1) || !is_text(content, 0) || !is_text(name, 0) || is_error == NULL ||
        !is_bool(is_error))
        return DOUBT;
    PyObject *values[7] = {call_id, content, name, is_error};
    return build_message(&tool_result, obj, values);
}

static PyObject *
fast_call(PyObject *obj)
{
    if (!PyDict_CheckExact(obj))
        return DOUBT;
    PyObject *arguments_key = get(obj, k_arguments, NULL);
    int usual = PyDict_GET_SIZE(obj) == 3 && arguments_key != NULL;
    if (!usual && keys_within(obj, call_keys) <= 0)
        return DOUBT;
    PyObject *call_id = get(obj, k_id, NULL);
    PyObject *name = get(obj, k_name, NULL);
    PyObject *invalid = usual ? Py_None : get(obj, k_invalid_arguments, Py_None);
    if (!is_text(call_id, 1) || !is_text(name, 1) || invalid == NULL ||
        (invalid != Py_None && !PyUnicode_CheckExact(invalid)))
        return DOUBT;
    PyObject *raw = get(obj, k_arguments, empty);
    if (raw == NULL)
        return DOUBT;
    PyObject *arguments = fast_mapping(raw);
    if (arguments == NULL)
        return DOUBT;
    PyObject *values[5] = {call_id, name, arguments, invalid, Py_None};
    PyObject *call = build(&tool_call, values);
    Py_DECREF(arguments);
    return call;
}

static PyObject *
fast_assistant(PyObject *obj)
{
    if (keys_within(obj, assistant_keys) <= 0)
        return DOUBT;
    PyObject *content = get(obj, k_content, empty_str);
    if (!is_text(content, 0))
        return DOUBT;
    PyObject *calls = get(obj, k_tool_calls, NULL);
    PyObject *tool_calls;
    if (calls == NULL) {
        if (PyErr_Occurred())
            return NULL;
        tool_calls = PyTuple_New(0);
    }
    else if (PyList_CheckExact(calls)) {
        Py_ssize_t n = PyList_GET_SIZE(calls);
        tool_calls = PyTuple_New(n);
        if (tool_calls == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *call = fast_call(PyList_GET_ITEM(calls, i));
            if (call == NULL) {
                Py_DECREF(tool_calls);
                return NULL;
            }
            PyTuple_SET_ITEM(tool_calls, i, call);
        }
        PyObject_GC_UnTrack(tool_calls); /* holds untracked calls only */
        if (n > 1) { /* call ids are unique */
            PyObject *ids = PySet_New(NULL);
            if (ids == NULL) {
                Py_DECREF(tool_calls);
                return NULL;
            }
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *id = *(PyObject **)((char *)PyTuple_GET_ITEM(tool_calls, i) +
                                              tool_call.offsets[0]);
                if (PySet_Add(ids, id) < 0) {
                    Py_DECREF(ids);
                    Py_DECREF(tool_calls);
                    return NULL;
                }
            }
            Py_ssize_t unique = PySet_GET_SIZE(ids);
            Py_DECREF(ids);
            if (unique != n) {
                Py_DECREF(tool_calls);
                return DOUBT;
            }
        }
    }
    else
        return DOUBT; /* null, or not a list */
    if (tool_calls == NULL)
        return NULL;
    PyObject *values[5] = {content, tool_calls};
    PyObject *message = build_message(&assistant, obj, values);
    Py_DECREF(tool_calls);
    return message;
}

static PyObject *
fast_text(PyObject *obj, SlotClass *cls)
{
    if (keys_within(obj, text_keys) <= 0)
        return DOUBT;
    PyObject *content = get(obj, k_content, NULL);
    if (!is_text(content, 0))
        return DOUBT;
    PyObject *values[4] = {content};
    return build_message(cls, obj, values);
}

static PyObject *
fast_message(PyObject *obj)
{
    if (!PyDict_CheckExact(obj))
        return DOUBT;
    PyObject *version = get(obj, k_v, NULL);
    if (version == NULL || !PyLong_CheckExact(version))
        return DOUBT;
    int overflow;
    long v = PyLong_AsLongAndOverflow(version, &overflow);
    if (overflow || v != codec_version)
        return DOUBT;
    PyObject *role = get(obj, k_role, NULL);
    if (role == NULL || !PyUnicode_CheckExact(role))
        return DOUBT;
    if (PyUnicode_Compare(role, k_tool) == 0)
        return fast_tool(obj);
    if (PyUnicode_Compare(role, k_assistant) == 0)
        return fast_assistant(obj);
    if (PyUnicode_Compare(role, k_user) == 0)
        return fast_text(obj, &user);
    if (PyUnicode_Compare(role, k_system) == 0)
        return fast_text(obj, &system_);
    return DOUBT;
}

/* loads(text), or DOUBT when the parser refuses it (the Python reader names why) */
static PyObject *
parse(PyObject *text)
{
    PyObject *obj = PyObject_CallOneArg(loads, text);
    if (obj == NULL && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear();
    return obj;
}

/* one stored row: a whole document (str), or a split document's (head, text) */
static PyObject *
read_row(PyObject *row)
{
    if (PyUnicode_CheckExact(row)) {
        PyObject *obj = parse(row);
        if (obj == NULL)
            return NULL;
        PyObject *message = fast_message(obj);
        Py_DECREF(obj);
        return message;
    }
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 2)
        return DOUBT;
    PyObject *head = PyTuple_GET_ITEM(row, 0), *text = PyTuple_GET_ITEM(row, 1);
    if (!PyUnicode_CheckExact(head))
        return DOUBT;
    if (text == Py_None)
        return read_row(head);
    if (!PyUnicode_CheckExact(text) || PyUnicode_Tailmatch(head, text_hole, 0, 15, -1) != 1)
        return DOUBT;
    PyObject *obj = parse(head);
    if (obj == NULL)
        return NULL;
    PyObject *message = DOUBT;
    if (PyDict_CheckExact(obj)) {
        PyObject *hole = get(obj, k_content, NULL);
        /* a repeated "content" key fills the hole: the whole document decides then */
        if (hole == Py_None && PyDict_SetItem(obj, k_content, text) == 0)
            message = fast_message(obj);
    }
    Py_DECREF(obj);
    return message;
}

static PyObject *
read_rows(PyObject *module, PyObject *rows)
{
    if (loads == NULL) {
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

static int
frozenset_arg(PyObject *value, const char *what)
{
    if (PyFrozenSet_CheckExact(value))
        return 0;
    PyErr_Format(PyExc_TypeError, "%s must be a frozenset", what);
    return -1;
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
    static char *names[] = {"loads", "empty", "frozen_dict", "tool_call", "tool_result",
                            "assistant", "user", "system", "tool_keys", "assistant_keys",
                            "text_keys", "call_keys", "version", "big_float", "text_hole",
                            NULL};
    PyObject *new_loads, *new_empty, *specs[6], *tk, *ak, *xk, *ck, *hole;
    long version;
    double big;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOOOOOOOOOOOldU:configure", names,
                                     &new_loads, &new_empty, &specs[0], &specs[1], &specs[2],
                                     &specs[3], &specs[4], &specs[5], &tk, &ak, &xk, &ck,
                                     &version, &big, &hole))
        return NULL;
    if (PyUnicode_GET_LENGTH(hole) != 15) {
        PyErr_SetString(PyExc_ValueError, "text_hole must be 15 characters");
        return NULL;
    }
    if (!PyCallable_Check(new_loads)) {
        PyErr_SetString(PyExc_TypeError, "loads must be callable");
        return NULL;
    }
    if (frozenset_arg(tk, "tool_keys") < 0 || frozenset_arg(ak, "assistant_keys") < 0 ||
        frozenset_arg(xk, "text_keys") < 0 || frozenset_arg(ck, "call_keys") < 0)
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
    replace(&tool_keys, tk);
    replace(&assistant_keys, ak);
    replace(&text_keys, xk);
    replace(&call_keys, ck);
    replace(&empty, new_empty);
    replace(&text_hole, hole);
    codec_version = version;
    big_float = big;
    replace(&loads, new_loads);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Give the reader the codec's classes, slots, key sets and parser."},
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
