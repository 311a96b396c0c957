/* The nodes of a placement's answer, joined in one C loop (decider/placement/answers.py).
 *
 * A placement reads one entry per candidate: its JSON bytes and its rank. Read from Python
 * dicts, each candidate costs half a dozen dependent memory reads (the dict's slot, its key,
 * the entry, its bytes) that miss the CPU's caches once a write or a large answer has been
 * through them: at 1,000 candidates about 1 ms of the answer's 2 (docs/benchmarks.md,
 * "Where the time goes"). An EntryIndex is a read-only table of a shape's base entries
 * (decider/placement/overlay.py: a base is never written once made), laid out for that
 * loop: each slot holds the name's hash, the name, the bytes, the rank and the entry, and
 * the loop fetches ahead (a chunk of candidates' slots first, then their names' and bytes'
 * memory, then reads them), so that the misses overlap rather than queue.
 *
 * Nothing here decides anything: the entries, their bytes and ranks are answers.py's, and
 * the answer is byte for byte what its loop in Python made (tests/test_placement_answers.py).
 * Every call holds the GIL throughout and calls no Python code (exact str keys, a slotted
 * frozen dataclass's attributes), so the dicts it reads cannot change under it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_hash_t hash;
    PyObject *name;  /* the entry's, borrowed from it */
    PyObject *head;  /* the entry's JSON bytes, borrowed from it */
    double rank;     /* NaN: refused */
    PyObject *entry; /* a reference of the index's own; NULL: an empty slot */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask;
    Py_ssize_t count;
} EntryIndex;

/* Candidates per round of fetching ahead: their slots, names and bytes (about 300 bytes
 * each) stay within a core's L2 cache until read. */
#define AHEAD 256
/* The longest index text: a Py_ssize_t's digits and "}}". */
#define INDEX_TEXT_MAX 24

/* The bytes of `position`'s index text. */
static inline Py_ssize_t index_text_size(Py_ssize_t position) {
    Py_ssize_t digits = 1;
    for (size_t value = (size_t)position; value >= 10; value /= 10) digits++;
    return digits + 2;
}

static PyObject *str_name, *str_head, *str_rank;

/* An entry's head and rank (NaN for None), and its name if `name` is not NULL; borrowed:
 * the entry is frozen and holds them. */
static int read_entry(PyObject *entry, PyObject **name, PyObject **head, double *rank) {
    PyObject *found_head = PyObject_GetAttr(entry, str_head);
    if (found_head == NULL) return -1;
    PyObject *found_rank = PyObject_GetAttr(entry, str_rank);
    if (found_rank == NULL) {
        Py_DECREF(found_head);
        return -1;
    }
    PyObject *found_name = NULL;
    if (name != NULL && (found_name = PyObject_GetAttr(entry, str_name)) == NULL) {
        Py_DECREF(found_head);
        Py_DECREF(found_rank);
        return -1;
    }
    int ok = PyBytes_CheckExact(found_head) &&
             (found_rank == Py_None || PyFloat_CheckExact(found_rank)) &&
             (name == NULL || PyUnicode_CheckExact(found_name));
    if (ok) {
        *head = found_head;
        *rank = found_rank == Py_None ? NAN : PyFloat_AS_DOUBLE(found_rank);
        if (name != NULL) *name = found_name;
    } else {
        PyErr_SetString(PyExc_TypeError,
                        "an entry's head is bytes, its rank a float or None, its name a str");
    }
    Py_DECREF(found_head);
    Py_DECREF(found_rank);
    Py_XDECREF(found_name);
    return ok ? 0 : -1;
}

static void index_dealloc(EntryIndex *self) {
    if (self->slots != NULL) {
        for (size_t i = 0; i <= self->mask; i++) Py_XDECREF(self->slots[i].entry);
        PyMem_Free(self->slots);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *index_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"base", NULL};
    PyObject *base;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:EntryIndex", keywords, &PyDict_Type, &base))
        return NULL;
    EntryIndex *self = (EntryIndex *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    size_t wanted = (size_t)PyDict_GET_SIZE(base), size = 8;
    while (size < wanted + wanted / 2 + 1) size <<= 1; /* at most two thirds full */
    self->slots = PyMem_Calloc(size, sizeof(Slot));
    if (self->slots == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->mask = size - 1;
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(base, &position, &key, &value)) {
        PyObject *name, *head;
        double rank;
        if (!PyUnicode_CheckExact(key)) {
            PyErr_SetString(PyExc_TypeError, "a base's keys are node names (str)");
            goto fail;
        }
        if (read_entry(value, &name, &head, &rank) < 0) goto fail;
        int same = PyUnicode_Compare(name, key);
        if (same == -1 && PyErr_Occurred()) goto fail;
        if (same != 0) {
            PyErr_Format(PyExc_ValueError, "the entry under %R is %R's", key, name);
            goto fail;
        }
        Py_hash_t hash = PyObject_Hash(key);
        if (hash == -1) goto fail;
        size_t i = (size_t)hash & self->mask;
        while (self->slots[i].entry != NULL) i = (i + 1) & self->mask;
        Slot *slot = &self->slots[i];
        slot->hash = hash;
        slot->name = name;
        slot->head = head;
        slot->rank = rank;
        Py_INCREF(value);
        slot->entry = value;
        self->count++;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static inline int same_name(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    Py_ssize_t length = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return length == PyUnicode_GET_LENGTH(b) && kind == (int)PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)length * (size_t)kind) == 0;
}

/* The slot with this hash at or after slot `i`, or NULL past the run of used slots. */
static inline Slot *probe(EntryIndex *self, size_t i, Py_hash_t hash) {
    for (;;) {
        Slot *slot = &self->slots[i];
        if (slot->entry == NULL) return NULL;
        if (slot->hash == hash) return slot;
        i = (i + 1) & self->mask;
    }
}

typedef struct {
    double rank;
    Py_ssize_t position;
} Ranked;

/* By rank, then by position: a stable sort's order, the scheduler's among equal ranks. */
static int by_rank(const void *left, const void *right) {
    const Ranked *a = left, *b = right;
    if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
    return (a->position > b->position) - (a->position < b->position);
}

/* `position` in decimal and "}}", as b"%d}}" spells it; the bytes written. */
static inline Py_ssize_t write_index_text(char *at, Py_ssize_t position) {
    char digits[INDEX_TEXT_MAX];
    Py_ssize_t count = 0;
    size_t value = (size_t)position;
    do {
        digits[count++] = (char)('0' + value % 10);
        value /= 10;
    } while (value);
    for (Py_ssize_t k = 0; k < count; k++) at[k] = digits[count - 1 - k];
    at[count] = '}';
    at[count + 1] = '}';
    return count + 2;
}

PyDoc_STRVAR(join_doc,
"join(over, candidates) -> (nodes, order, refused) | int\n\n"
"Each candidate's entry, from `over` (a shape's overlay: an entry, or None for one to work\n"
"out) or else this index (its base): `nodes` the answer's nodes (each entry's head without\n"
"the first one's comma, an allowed node's followed by its index and \"}}\"), `order` the\n"
"allowed candidates by rank then position, `refused` the refused entries in the\n"
"candidates' order. An int: the position of the first candidate with no entry.");

static PyObject *index_join(EntryIndex *self, PyObject *args) {
    PyObject *over, *candidates;
    if (!PyArg_ParseTuple(args, "O!O!:join", &PyDict_Type, &over, &PyList_Type, &candidates))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(candidates);
    PyObject **heads = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n ? n : 1));
    Ranked *allowed = PyMem_Malloc(sizeof(Ranked) * (size_t)(n ? n : 1));
    PyObject *refused = PyList_New(0), *nodes = NULL, *order = NULL, *result = NULL;
    Py_hash_t hashes[AHEAD];
    Slot *slots[AHEAD];
    Py_ssize_t allowed_count = 0, size = 0;
    int overlaid = PyDict_GET_SIZE(over) > 0;
    if (heads == NULL || allowed == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (refused == NULL) goto done;
    for (Py_ssize_t start = 0; start < n; start += AHEAD) {
        Py_ssize_t end = n - start > AHEAD ? start + AHEAD : n;
        /* The slots first, */
        for (Py_ssize_t j = start; j < end; j++) {
            PyObject *name = PyList_GET_ITEM(candidates, j);
            if (!PyUnicode_CheckExact(name)) {
                PyErr_SetString(PyExc_TypeError, "candidates are node names (str)");
                goto done;
            }
            Py_hash_t hash = PyObject_Hash(name);
            if (hash == -1) goto done;
            hashes[j - start] = hash;
            __builtin_prefetch(&self->slots[(size_t)hash & self->mask]);
        }
        /* then what the slots point to (a name, about 300 bytes of JSON), */
        for (Py_ssize_t j = start; j < end; j++) {
            Py_hash_t hash = hashes[j - start];
            Slot *slot = probe(self, (size_t)hash & self->mask, hash);
            slots[j - start] = slot;
            if (slot != NULL) {
                const char *name = (const char *)slot->name, *head = (const char *)slot->head;
                __builtin_prefetch(name);
                __builtin_prefetch(name + 64);
                for (int line = 0; line < 4; line++) __builtin_prefetch(head + 64 * line);
            }
        }
        /* then each candidate's entry: the overlay's if it names the node, else the base's. */
        for (Py_ssize_t j = start; j < end; j++) {
            PyObject *name = PyList_GET_ITEM(candidates, j), *head = NULL, *entry = NULL;
            double rank = NAN;
            if (overlaid) {
                PyObject *mine = PyDict_GetItemWithError(over, name);
                if (mine == NULL && PyErr_Occurred()) goto done;
                if (mine == Py_None) { /* stale in this View: to work out */
                    result = PyLong_FromSsize_t(j);
                    goto done;
                }
                if (mine != NULL) {
                    if (read_entry(mine, NULL, &head, &rank) < 0) goto done;
                    entry = mine;
                }
            }
            if (entry == NULL) {
                Py_hash_t hash = hashes[j - start];
                Slot *slot = slots[j - start];
                while (slot != NULL && !same_name(slot->name, name)) /* hashes alike, names not */
                    slot = probe(self, ((size_t)(slot - self->slots) + 1) & self->mask, hash);
                if (slot == NULL) {
                    result = PyLong_FromSsize_t(j);
                    goto done;
                }
                head = slot->head;
                rank = slot->rank;
                entry = slot->entry;
            }
            heads[j] = head;
            size += PyBytes_GET_SIZE(head);
            if (isnan(rank)) {
                if (PyList_Append(refused, entry) < 0) goto done;
            } else {
                allowed[allowed_count].rank = rank;
                allowed[allowed_count].position = j;
                allowed_count++;
                size += index_text_size(j);
            }
        }
    }
    if (n > 0 && PyBytes_GET_SIZE(heads[0]) > 0) size--; /* the first node's comma */
    nodes = PyBytes_FromStringAndSize(NULL, size);
    if (nodes == NULL) goto done;
    char *out = PyBytes_AS_STRING(nodes), *at = out;
    for (Py_ssize_t j = 0, next = 0; j < n; j++) {
        Py_ssize_t length = PyBytes_GET_SIZE(heads[j]);
        const char *data = PyBytes_AS_STRING(heads[j]);
        if (j == 0 && length > 0) { /* every head starts with the comma before it */
            data++;
            length--;
        }
        memcpy(at, data, (size_t)length);
        at += length;
        if (next < allowed_count && allowed[next].position == j) {
            at += write_index_text(at, j);
            next++;
        }
    }
    assert(at - out == size);
    qsort(allowed, (size_t)allowed_count, sizeof(Ranked), by_rank);
    order = PyList_New(allowed_count);
    if (order == NULL) goto done;
    for (Py_ssize_t k = 0; k < allowed_count; k++) {
        PyObject *name = PyList_GET_ITEM(candidates, allowed[k].position);
        Py_INCREF(name);
        PyList_SET_ITEM(order, k, name);
    }
    result = PyTuple_Pack(3, nodes, order, refused);
done:
    Py_XDECREF(nodes);
    Py_XDECREF(order);
    Py_XDECREF(refused);
    PyMem_Free(heads);
    PyMem_Free(allowed);
    return result;
}

static Py_ssize_t index_length(EntryIndex *self) { return self->count; }

static PyMethodDef index_methods[] = {
    {"join", (PyCFunction)index_join, METH_VARARGS, join_doc},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods index_as_sequence = {
    .sq_length = (lenfunc)index_length,
};

PyDoc_STRVAR(index_doc,
"EntryIndex(base)\n\n"
"A read-only table of a shape's base entries (a dict of node name to Entry, never written\n"
"once made) for `join`; it holds a reference to each entry.");

static PyTypeObject EntryIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "decider.placement._entry_index.EntryIndex",
    .tp_basicsize = sizeof(EntryIndex),
    .tp_dealloc = (destructor)index_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = index_doc,
    .tp_new = index_new,
    .tp_methods = index_methods,
    .tp_as_sequence = &index_as_sequence,
};

static struct PyModuleDef entry_index_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "decider.placement._entry_index",
    .m_doc = "The nodes of a placement's answer, joined in one C loop.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__entry_index(void) {
    str_name = PyUnicode_InternFromString("name");
    str_head = PyUnicode_InternFromString("head");
    str_rank = PyUnicode_InternFromString("rank");
    if (str_name == NULL || str_head == NULL || str_rank == NULL) return NULL;
    if (PyType_Ready(&EntryIndexType) < 0) return NULL;
    PyObject *module = PyModule_Create(&entry_index_module);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "EntryIndex", (PyObject *)&EntryIndexType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
