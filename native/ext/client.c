/*
 * logbuf._client: the client's per-message data path as CPython extension types.
 *
 * The cffi shim (logbuf._native) keeps the atomics and serves the driver, the tools and the batch paths; this
 * module gives publications and images methods that Python calls with one vectorcall and that stay in C for
 * the whole append or poll.  Both modules link one shared library of the log buffer core (native/lb_*.c,
 * liblogbuf-core.so beside them) and use the static inline helpers of native/include/lb_frame.h, so there is
 * one implementation of the log buffer, and one copy of it in a process.
 *
 * Ownership: a LogMapping holds the one buffer export of a log buffer's mmap.  Publications, images and the
 * memoryviews handed to handlers hold a reference to it, so the mapping cannot be unmapped under them; when
 * the log is closed (LogMapping.close) every later call answers CLOSED / 0 / ClosedError, and the last
 * holder to let go closes the mmap.  None of these calls can block, so none releases the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lb_frame.h"
#include "lb_layout.h"
#include "lb_control.h"
#include "logbuf.h"

/* log2 of the shortest and longest term: the range of a stream's position bits */
#define POSITION_BITS_MIN __builtin_ctz(LB_TERM_MIN_LENGTH)
#define POSITION_BITS_MAX __builtin_ctz(LB_TERM_MAX_LENGTH)

/* ControlledPollAction values: logbuf.client.image.ControlledPollAction is checked against POLL_ACTIONS at import */
#define ACTION_ABORT 1
#define ACTION_BREAK 2
#define ACTION_COMMIT 3
#define ACTION_CONTINUE 4

/* the default fragment limit of poll and controlled_poll (as Aeron's samples) */
#define DEFAULT_FRAGMENT_LIMIT 10

/* the alignment of an int64 counter slot (sub-pos, pub-lmt): what an atomic 64-bit access needs */
#define COUNTER_ALIGNMENT ((uintptr_t)sizeof(int64_t))

static PyObject *ClosedError, *LogCorruptedError, *ClaimStateError, *MessageTooLargeError, *UnboundHeaderError,
    *ReentrantPollError;

static PyObject *closed_error(const char *what)
{
    PyErr_Format(ClosedError, "%s is closed", what);
    return NULL;
}

/* =====================================================================================================
 * The SIGBUS guard of log mappings
 *
 * Any process with write access can truncate a log file under its mappings; the next access to a page past
 * the new end raises SIGBUS, which kills the process by default.  Each LogMapping registers its range here, and
 * a SIGBUS inside a registered range is recovered: the faulting page is replaced by a private zero page (reads
 * see "nothing committed", writes go nowhere), the mapping is flagged truncated, and the access is retried.
 * The slow paths (the client conductor) see the flag, or the shrunk file, and close the stream with an error.
 * A SIGBUS anywhere else goes to the disposition that was there before (by default: the process dies).
 * ===================================================================================================== */

#define GUARD_SLOTS 4096

typedef struct {
    uintptr_t start;
    uintptr_t end;
    int truncated;
} GuardSlot;

static GuardSlot guard_slots[GUARD_SLOTS];
static int guard_high;             /* slots in use lie below this */
static int guard_installed;
static uintptr_t guard_page_size;
static struct sigaction guard_previous;

static void guard_on_sigbus(int sig, siginfo_t *info, void *context)
{
    (void)sig;
    (void)context;
    if (info != NULL && info->si_code > 0) {   /* raised by the kernel for an access, not sent by a process */
        uintptr_t address = (uintptr_t)info->si_addr;
        int high = __atomic_load_n(&guard_high, __ATOMIC_ACQUIRE);
        for (int i = 0; i < high; i++) {
            GuardSlot *slot = &guard_slots[i];
            if (address >= __atomic_load_n(&slot->start, __ATOMIC_ACQUIRE)
                && address < __atomic_load_n(&slot->end, __ATOMIC_ACQUIRE)) {
                void *page = (void *)(address & ~(guard_page_size - 1));
                if (mmap(page, guard_page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                         0) == MAP_FAILED) {
                    break;
                }
                __atomic_store_n(&slot->truncated, 1, __ATOMIC_RELEASE);
                return;   /* the access runs again, on the zero page */
            }
        }
    }
    sigaction(SIGBUS, &guard_previous, NULL);   /* not ours: the faulting access runs again under the old one */
}

static void guard_install(void)
{
    if (guard_installed) return;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = guard_on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    guard_page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (sigaction(SIGBUS, &action, &guard_previous) == 0) guard_installed = 1;
}

/* Registers [start, start + length); the slot, or -1 when every slot is taken (then that log is unguarded). */
static int guard_add(const uint8_t *start, Py_ssize_t length)
{
    guard_install();
    int high = guard_high;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        GuardSlot *slot = &guard_slots[i];
        if (i < high && slot->end != 0) continue;
        slot->truncated = 0;
        __atomic_store_n(&slot->start, (uintptr_t)start, __ATOMIC_RELEASE);
        __atomic_store_n(&slot->end, (uintptr_t)start + (uintptr_t)length, __ATOMIC_RELEASE);
        if (i >= high) __atomic_store_n(&guard_high, i + 1, __ATOMIC_RELEASE);
        return i;
    }
    return -1;
}

static void guard_remove(int index)
{
    if (index < 0) return;
    __atomic_store_n(&guard_slots[index].end, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&guard_slots[index].start, 0, __ATOMIC_RELEASE);
}

static int guard_truncated(int index)
{
    return index >= 0 && __atomic_load_n(&guard_slots[index].truncated, __ATOMIC_ACQUIRE);
}

/* MappingGuard: the SIGBUS guard for a mapping that is not a log (cnc.dat, the loss report). */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int guard;
} MappingGuard;

static PyObject *MappingGuard_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *mapping;
    static char *kwlist[] = {"mapping", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:MappingGuard", kwlist, &mapping)) return NULL;
    MappingGuard *self = (MappingGuard *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->guard = -1;
    if (PyObject_GetBuffer(mapping, &self->view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->guard = guard_add((const uint8_t *)self->view.buf, self->view.len);
    return (PyObject *)self;
}

static void mapping_guard_release(MappingGuard *self)
{
    guard_remove(self->guard);   /* first: the mapping may be unmapped once the export goes */
    self->guard = -1;
    if (self->view.obj != NULL) PyBuffer_Release(&self->view);
}

static void MappingGuard_dealloc(MappingGuard *self)
{
    mapping_guard_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *MappingGuard_release(MappingGuard *self, PyObject *unused)
{
    mapping_guard_release(self);
    Py_RETURN_NONE;
}

static PyObject *MappingGuard_truncated(MappingGuard *self, void *c) { return PyBool_FromLong(guard_truncated(self->guard)); }

static PyMethodDef MappingGuard_methods[] = {
    {"release", (PyCFunction)MappingGuard_release, METH_NOARGS,
     "Stops guarding and lets go of the mapping's export (before the mapping is closed)."},
    {NULL}};

static PyGetSetDef MappingGuard_getset[] = {
    {"truncated", (getter)MappingGuard_truncated, NULL,
     "True once an access past the end of the (truncated) file was recovered.", NULL},
    {NULL}};

static PyTypeObject MappingGuardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logbuf._client.MappingGuard",
    .tp_basicsize = sizeof(MappingGuard),
    .tp_dealloc = (destructor)MappingGuard_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "MappingGuard(mapping)\n--\n\nGuards a shared mapping against SIGBUS after its file is truncated "
              "(holds an export of it until release()).",
    .tp_methods = MappingGuard_methods,
    .tp_getset = MappingGuard_getset,
    .tp_new = MappingGuard_new,
};

/* =====================================================================================================
 * LogMapping: the one export of a log buffer mapping
 * ===================================================================================================== */

typedef struct {
    PyObject_HEAD
    Py_buffer view;        /* export of the mapping (held until the last reference goes) */
    PyObject *mapping;     /* the exporter (an mmap), closed by the last holder once the log is closed */
    uint8_t *terms;
    uint8_t *meta;
    int32_t term_length;
    int32_t position_bits;
    int closed;
    int guard;             /* its SIGBUS guard slot (-1: none) */
} LogMapping;

static PyTypeObject LogMappingType;

static PyObject *LogMapping_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *mapping;
    int term_length;
    static char *kwlist[] = {"mapping", "term_length", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oi:LogMapping", kwlist, &mapping, &term_length)) return NULL;
    if (term_length < LB_TERM_MIN_LENGTH || term_length > LB_TERM_MAX_LENGTH || (term_length & (term_length - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "term length %d is not a power of two within [%d, %d]", term_length,
                     LB_TERM_MIN_LENGTH, LB_TERM_MAX_LENGTH);
        return NULL;
    }
    LogMapping *self = (LogMapping *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->guard = -1;
    if (PyObject_GetBuffer(mapping, &self->view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    if (self->view.len < (Py_ssize_t)LB_PARTITION_COUNT * term_length + LB_LOG_META_DATA_LENGTH) {
        PyErr_Format(PyExc_ValueError, "a mapping of %zd bytes cannot hold three terms of %d and the metadata",
                     self->view.len, term_length);
        Py_DECREF(self);
        return NULL;
    }
    if (((uintptr_t)self->view.buf & (COUNTER_ALIGNMENT - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "the mapping is not 8-byte aligned");
        Py_DECREF(self);
        return NULL;
    }
    self->mapping = Py_NewRef(mapping);
    self->terms = (uint8_t *)self->view.buf;
    self->meta = self->terms + self->view.len - LB_LOG_META_DATA_LENGTH;
    self->term_length = term_length;
    self->position_bits = __builtin_ctz((unsigned)term_length);
    self->guard = guard_add(self->terms, self->view.len);
    return (PyObject *)self;
}

static void LogMapping_dealloc(LogMapping *self)
{
    guard_remove(self->guard);   /* before the last export goes: the range may be unmapped from then on */
    self->guard = -1;
    if (self->view.obj != NULL) PyBuffer_Release(&self->view);
    if (self->mapping != NULL) {
        if (self->closed) {   /* the log was closed while others still held it: the last holder unmaps */
            PyObject *r = PyObject_CallMethod(self->mapping, "close", NULL);
            if (r == NULL) PyErr_Clear(); else Py_DECREF(r);
        }
        Py_DECREF(self->mapping);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Memoryviews of payloads and claims are views of this object, so each keeps the mapping alive. */
static int LogMapping_getbuffer(LogMapping *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->view.buf, self->view.len, 0, flags);
}

static PyBufferProcs LogMapping_as_buffer = {(getbufferproc)LogMapping_getbuffer, NULL};

static PyObject *LogMapping_close(LogMapping *self, PyObject *unused)
{
    self->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *LogMapping_is_closed(LogMapping *self, void *c) { return PyBool_FromLong(self->closed); }
static PyObject *LogMapping_truncated(LogMapping *self, void *c) { return PyBool_FromLong(guard_truncated(self->guard)); }

static PyMethodDef LogMapping_methods[] = {
    {"close", (PyCFunction)LogMapping_close, METH_NOARGS,
     "Marks the log closed: publications and images on it answer CLOSED / 0 / ClosedError from now on."},
    {NULL}};

static PyGetSetDef LogMapping_getset[] = {
    {"is_closed", (getter)LogMapping_is_closed, NULL, "True once close() was called.", NULL},
    {"truncated", (getter)LogMapping_truncated, NULL,
     "True once an access past the end of the (truncated) file was recovered: the stream's data is gone.", NULL},
    {NULL}};

static PyTypeObject LogMappingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logbuf._client.LogMapping",
    .tp_basicsize = sizeof(LogMapping),
    .tp_dealloc = (destructor)LogMapping_dealloc,
    .tp_as_buffer = &LogMapping_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LogMapping(mapping, term_length)\n--\n\nHolds the buffer export of a log buffer mapping (three "
              "terms then the " Py_STRINGIFY(LB_LOG_META_DATA_LENGTH) "-byte metadata block) for the native objects "
              "that use it.",
    .tp_methods = LogMapping_methods,
    .tp_getset = LogMapping_getset,
    .tp_new = LogMapping_new,
};

/* A memoryview of the whole mapping that shares the LogMapping's export (the base for payload views). */
static PyObject *mapping_view(LogMapping *log) { return PyMemoryView_FromObject((PyObject *)log); }

/*
 * Payload views, two ways.
 *
 * Fast (the default where it was checked): a view nobody else holds is re-pointed at the next payload by writing
 * its Py_buffer, i.e. the layout of PyMemoryViewObject, which is CPython's (not part of its stable API).  It is
 * compiled only for the CPython versions it was checked against, with the GIL (a free-threaded build could
 * see the view from another thread).
 *
 * Portable (every other build, and after _use_cpython_internals(False), which the tests use to run the same
 * cases both ways): each payload gets a fresh view sliced from the mapping's view through the public API.
 */
#if defined(PYPY_VERSION) || defined(Py_LIMITED_API) || defined(Py_GIL_DISABLED) || PY_VERSION_HEX < 0x030A0000 \
    || PY_VERSION_HEX >= 0x030E0000
#define HAVE_VIEW_INTERNALS 0
#else
#define HAVE_VIEW_INTERNALS 1
#endif

/* Per-subclass method descriptors (specialize) pay off only with CPython's specialising interpreter (3.11+). */
#if defined(PYPY_VERSION) || PY_VERSION_HEX < 0x030B0000
#define HAVE_SPECIALIZER 0
#else
#define HAVE_SPECIALIZER 1
#endif

static int use_internals = HAVE_VIEW_INTERNALS;

/* The portable view of [buf, buf + len) inside base's buffer: base[start:start + len], sharing its export. */
static PyObject *slice_view(PyObject *base, uint8_t *buf, Py_ssize_t len)
{
    const uint8_t *start = (const uint8_t *)PyMemoryView_GET_BUFFER(base)->buf;
    Py_ssize_t offset = buf == NULL ? 0 : (Py_ssize_t)(buf - start);
    if (buf == NULL) len = 0;
    PyObject *lo = PyLong_FromSsize_t(offset), *hi = PyLong_FromSsize_t(offset + len);
    PyObject *slice = (lo != NULL && hi != NULL) ? PySlice_New(lo, hi, NULL) : NULL;
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    if (slice == NULL) return NULL;
    PyObject *view = PyObject_GetItem(base, slice);
    Py_DECREF(slice);
    return view;
}

#if HAVE_VIEW_INTERNALS
static inline void write_view(PyObject *mv, uint8_t *buf, Py_ssize_t len)
{
    Py_buffer *v = &((PyMemoryViewObject *)mv)->view;
    v->buf = buf;
    v->len = len;
    v->shape[0] = len;
}
#endif

/* A new 1-D byte view sharing base's managed buffer, of [buf, buf + len) inside the mapping (NULL: empty). */
static PyObject *view_at(PyObject *base, uint8_t *buf, Py_ssize_t len)
{
#if HAVE_VIEW_INTERNALS
    if (use_internals) {
        /* the view is ours alone (a fresh object), so setting its pointer and length is not observable */
        PyObject *mv = PyMemoryView_FromObject(base);
        if (mv != NULL) write_view(mv, buf, len);
        return mv;
    }
#endif
    return slice_view(base, buf, len);
}

/* Points *slot, a view nobody else holds (reference count 1), at the next payload: re-pointed in place (fast)
 * or replaced by a fresh view (portable).  -1 with an exception when no view could be made. */
static inline int repoint_view(PyObject **slot, PyObject *base, uint8_t *buf, Py_ssize_t len)
{
#if HAVE_VIEW_INTERNALS
    if (use_internals) {
        write_view(*slot, buf, len);
        return 0;
    }
#endif
    PyObject *fresh = slice_view(base, buf, len);
    if (fresh == NULL) return -1;
    Py_SETREF(*slot, fresh);
    return 0;
}

/* After a callback: a view the handler kept is released (valid only inside the callback) and replaced. */
static int recycle_view(PyObject **slot, PyObject *base)
{
    if (Py_REFCNT(*slot) == 1) return 0;
    PyObject *r = PyObject_CallMethod(*slot, "release", NULL);
    if (r == NULL) PyErr_Clear();   /* still exported (e.g. numpy kept it): it keeps the mapping alive */
    else Py_DECREF(r);
    Py_SETREF(*slot, view_at(base, NULL, 0));
    return *slot == NULL ? -1 : 0;
}

/* Borrows the (obj, offset) counter slot for an int64 position: returns its address inside `view`. */
static int64_t *counter_address(PyObject *obj, Py_ssize_t offset, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) return NULL;
    uint8_t *address = (uint8_t *)view->buf + offset;
    if (offset < 0 || offset > view->len - (Py_ssize_t)sizeof(int64_t) || ((uintptr_t)address & (COUNTER_ALIGNMENT - 1)) != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "counter offset %zd is outside a buffer of %zd bytes or not 8-aligned",
                     offset, view->len);
        return NULL;
    }
    return (int64_t *)address;
}

/*
 * Positional + keyword arguments of a METH_FASTCALL | METH_KEYWORDS method into out[0..n) (NULL: not given).
 * names lists the parameters in order; the first `required` must be given.
 */
static int fast_args(const char *fname, const char *const *names, int n, int required, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames, PyObject **out)
{
    for (int i = 0; i < n; i++) out[i] = NULL;
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, n, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        while (i < n && PyUnicode_CompareWithASCIIString(key, names[i]) != 0) i++;
        if (i == n || out[i] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected or repeated argument '%U'", fname, key);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (int i = 0; i < required; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
            return -1;
        }
    }
    return 0;
}

/* =====================================================================================================
 * Header: the flyweight handed to handlers
 * ===================================================================================================== */

typedef struct {
    PyObject_HEAD
    const uint8_t *frame;   /* the frame in the term; NULL outside a handler call */
    int32_t offset;
    int32_t initial_term_id;
    int32_t position_bits;
} Header;

static PyTypeObject HeaderType;

static PyObject *Header_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    int initial_term_id = 0, position_bits = POSITION_BITS_MIN;
    static char *kwlist[] = {"initial_term_id", "position_bits", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|ii:Header", kwlist, &initial_term_id, &position_bits)) return NULL;
    if (position_bits < POSITION_BITS_MIN || position_bits > POSITION_BITS_MAX) {
        PyErr_Format(PyExc_ValueError, "position_bits %d is not log2 of a term length", position_bits);
        return NULL;
    }
    Header *self = (Header *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->initial_term_id = initial_term_id;
    self->position_bits = position_bits;
    return (PyObject *)self;
}

static void Header_dealloc(Header *self) { Py_TYPE(self)->tp_free((PyObject *)self); }

static inline const uint8_t *header_frame(Header *self)
{
    if (self->frame == NULL) {
        PyErr_SetString(UnboundHeaderError, "a Header is valid only inside the handler call it was given to");
    }
    return self->frame;
}

#define HEADER_I32_GETTER(name, field)                                              \
    static PyObject *Header_##name(Header *self, void *c)                          \
    {                                                                               \
        const uint8_t *f = header_frame(self);                                      \
        return f == NULL ? NULL : PyLong_FromLong(lb_get_i32(f + (field)));        \
    }
HEADER_I32_GETTER(frame_length, LB_FRAME_LENGTH_OFFSET)
HEADER_I32_GETTER(session_id, LB_SESSION_ID_OFFSET)
HEADER_I32_GETTER(stream_id, LB_STREAM_ID_OFFSET)
HEADER_I32_GETTER(term_id, LB_TERM_ID_OFFSET)

static PyObject *Header_flags(Header *self, void *c)
{
    const uint8_t *f = header_frame(self);
    return f == NULL ? NULL : PyLong_FromLong(f[LB_FLAGS_OFFSET]);
}

static PyObject *Header_type(Header *self, void *c)
{
    const uint8_t *f = header_frame(self);
    uint16_t type;
    if (f == NULL) return NULL;
    memcpy(&type, f + LB_TYPE_OFFSET, 2);
    return PyLong_FromLong(type);
}

static PyObject *Header_term_offset(Header *self, void *c)
{
    return header_frame(self) == NULL ? NULL : PyLong_FromLong(self->offset);
}

static PyObject *Header_reserved_value(Header *self, void *c)
{
    const uint8_t *f = header_frame(self);
    return f == NULL ? NULL : PyLong_FromLongLong(lb_get_i64(f + LB_RESERVED_VALUE_OFFSET));
}

static PyObject *Header_position(Header *self, void *c)
{
    const uint8_t *f = header_frame(self);
    if (f == NULL) return NULL;
    int64_t end = self->offset + lb_align_frame(lb_get_i32(f + LB_FRAME_LENGTH_OFFSET));
    return PyLong_FromLongLong(
        lb_compute_position(lb_get_i32(f + LB_TERM_ID_OFFSET), end, self->position_bits, self->initial_term_id));
}

static PyObject *Header_initial_term_id(Header *self, void *c) { return PyLong_FromLong(self->initial_term_id); }
static PyObject *Header_position_bits(Header *self, void *c) { return PyLong_FromLong(self->position_bits); }
static PyObject *Header_is_bound(Header *self, void *c) { return PyBool_FromLong(self->frame != NULL); }

static PyObject *Header_repr(Header *self)
{
    if (self->frame == NULL) return PyUnicode_FromString("Header(<unbound>)");
    const uint8_t *f = self->frame;
    PyObject *position = Header_position(self, NULL);
    if (position == NULL) return NULL;
    PyObject *r = PyUnicode_FromFormat(
        "Header(position=%S, session_id=%d, stream_id=%d, term_id=%d, term_offset=%d, flags=0x%02x, "
        "reserved_value=%lld)",
        position, (int)lb_get_i32(f + LB_SESSION_ID_OFFSET), (int)lb_get_i32(f + LB_STREAM_ID_OFFSET),
        (int)lb_get_i32(f + LB_TERM_ID_OFFSET), (int)self->offset, (unsigned)f[LB_FLAGS_OFFSET],
        (long long)lb_get_i64(f + LB_RESERVED_VALUE_OFFSET));
    Py_DECREF(position);
    return r;
}

static PyGetSetDef Header_getset[] = {
    {"frame_length", (getter)Header_frame_length, NULL, "Frame length (header + payload).", NULL},
    {"flags", (getter)Header_flags, NULL, "BEGIN (" Py_STRINGIFY(LB_BEGIN_FLAG) ") / END (" Py_STRINGIFY(LB_END_FLAG) ") / EOS ("
     Py_STRINGIFY(LB_EOS_FLAG) ") flags.", NULL},
    {"type", (getter)Header_type, NULL, "Frame type (DATA = " Py_STRINGIFY(LB_HDR_TYPE_DATA) ").", NULL},
    {"term_offset", (getter)Header_term_offset, NULL, "Offset of the frame in its term.", NULL},
    {"offset", (getter)Header_term_offset, NULL, "Alias of term_offset.", NULL},
    {"session_id", (getter)Header_session_id, NULL, "Session id of the publisher.", NULL},
    {"stream_id", (getter)Header_stream_id, NULL, "Stream id.", NULL},
    {"term_id", (getter)Header_term_id, NULL, "Term id of the frame's term.", NULL},
    {"reserved_value", (getter)Header_reserved_value, NULL, "The frame's 64-bit reserved value.", NULL},
    {"position", (getter)Header_position, NULL, "The stream position just after this fragment.", NULL},
    {"initial_term_id", (getter)Header_initial_term_id, NULL, "Initial term id of the stream.", NULL},
    {"position_bits", (getter)Header_position_bits, NULL, "log2 of the term length.", NULL},
    {"is_bound", (getter)Header_is_bound, NULL, "True inside the handler call (fields may be read).", NULL},
    {NULL}};

static PyTypeObject HeaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logbuf._client.Header",
    .tp_basicsize = sizeof(Header),
    .tp_dealloc = (destructor)Header_dealloc,
    .tp_repr = (reprfunc)Header_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Header(initial_term_id=0, position_bits=16)\n--\n\n"
              "Flyweight over the frame header of the fragment a handler is given: one per image, re-pointed "
              "in place at each fragment; fields are read from shared memory only when asked for.  Valid only "
              "inside the handler call: reading a field afterwards raises UnboundHeaderError.",
    .tp_getset = Header_getset,
    .tp_new = Header_new,
};

/* =====================================================================================================
 * Publication
 * ===================================================================================================== */

typedef struct {
    PyObject_HEAD
    lb_publication_t pub;
    LogMapping *log;           /* NULL until attached, and again once closed */
    Py_buffer limit_view;      /* export of the pub-lmt counter's buffer */
    PyObject *base_view;       /* memoryview of the mapping, the base of claim buffers (lazy) */
    int exclusive;
    int attached;
    int closed;
} Publication;

static PyTypeObject PublicationType;

static inline int pub_is_open(const Publication *self)
{
    return !self->closed && self->attached && !self->log->closed;
}

static void pub_release(Publication *self)
{
    if (self->pub.wake != NULL) {
        lb_wake_close(self->pub.wake);
        self->pub.wake = NULL;
    }
    self->pub.waiting = NULL;
    if (self->limit_view.obj != NULL) PyBuffer_Release(&self->limit_view);
    Py_CLEAR(self->base_view);
    Py_CLEAR(self->log);
}

static int Publication_traverse(Publication *self, visitproc visit, void *arg)
{
    Py_VISIT(self->base_view);
    Py_VISIT(self->log);
    return 0;
}

static int Publication_clear(Publication *self)
{
    self->closed = 1;
    pub_release(self);
    return 0;
}

/* (a Python subclass's dealloc clears its __dict__ and weakrefs and drops the type, then calls this) */
static void Publication_dealloc(Publication *self)
{
    PyObject_GC_UnTrack(self);
    Publication_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(Publication_attach_doc,
"_attach($self, log, limit_buffer, limit_offset, session_id, stream_id, initial_term_id, max_payload_length,\n"
"        max_message_length, exclusive, wake_semaphore=None, /)\n--\n\n"
"Binds this publication to a LogMapping and its pub-lmt counter (an int64 at limit_offset of limit_buffer);\n"
"both are held (buffer exports) until close.  wake_semaphore names the stream's semaphore to post.");

static PyObject *Publication_attach(Publication *self, PyObject *args)
{
    PyObject *log, *limit_obj, *wake_name = Py_None;
    Py_ssize_t limit_offset;
    int session_id, stream_id, initial_term_id, max_payload_length, max_message_length, exclusive;
    if (!PyArg_ParseTuple(args, "O!Oniiiiip|O:_attach", &LogMappingType, &log, &limit_obj, &limit_offset,
                          &session_id, &stream_id, &initial_term_id, &max_payload_length, &max_message_length,
                          &exclusive, &wake_name)) {
        return NULL;
    }
    if (self->attached) {
        PyErr_SetString(PyExc_RuntimeError, "publication is already attached");
        return NULL;
    }
    LogMapping *m = (LogMapping *)log;
    if (m->closed) return closed_error("log buffer");
    if (max_payload_length <= 0 || max_payload_length > m->term_length / LB_MAX_MESSAGE_TERM_DIVISOR ||
        max_message_length <= 0) {
        PyErr_SetString(PyExc_ValueError, "max payload / message length out of range");
        return NULL;
    }
    int64_t *limit = counter_address(limit_obj, limit_offset, &self->limit_view);
    if (limit == NULL) return NULL;
    lb_publication_t *p = &self->pub;
    memset(p, 0, sizeof(*p));
    p->terms = m->terms;
    p->meta = m->meta;
    p->limit = limit;
    p->term_length = m->term_length;
    p->position_bits = m->position_bits;
    p->max_possible_position = (int64_t)m->term_length << LB_POSITION_TERM_COUNT_BITS;
    p->initial_term_id = initial_term_id;
    p->session_id = session_id;
    p->stream_id = stream_id;
    p->max_payload_length = max_payload_length;
    p->max_message_length = max_message_length;
    if (wake_name != Py_None) {
        const char *name = PyBytes_AsString(wake_name);
        if (name == NULL) goto fail;
        p->wake = lb_wake_open(name);
        if (p->wake == NULL) {
            PyErr_Format(PyExc_FileNotFoundError, "wake-up semaphore %s does not exist", name);
            goto fail;
        }
        p->waiting = (int32_t *)(m->meta + LB_META_WAITING_SUBSCRIBERS);
    }
    if (exclusive) {
        /* the single writer keeps its own copy of the tail, starting from the log's */
        int32_t term_count = lb_ld_i32(m->meta + LB_META_ACTIVE_TERM_COUNT);
        int64_t raw = lb_ld_i64(m->meta + LB_META_TAIL_COUNTERS
                                + lb_index_by_term_count(term_count) * LB_TAIL_COUNTER_LENGTH);
        p->ex_term_count = term_count;
        p->ex_term_id = lb_raw_term_id(raw);
        p->ex_term_offset = lb_raw_term_offset(raw, m->term_length);
    }
    self->log = (LogMapping *)Py_NewRef(log);
    self->exclusive = exclusive;
    self->attached = 1;
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&self->limit_view);
    return NULL;
}

/* Raises for data that cannot be offered; returns 0 with the bytes and length set (and view to release). */
static int offer_data(Publication *self, PyObject *data, Py_buffer *view, const char **buf, Py_ssize_t *len)
{
    if (PyBytes_CheckExact(data)) {
        view->obj = NULL;
        *buf = PyBytes_AS_STRING(data);
        *len = PyBytes_GET_SIZE(data);
    } else if (PyUnicode_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "offer takes bytes-like data, not str (encode it first)");
        return -1;
    } else {
        if (PyObject_GetBuffer(data, view, PyBUF_SIMPLE) < 0) return -1;
        *buf = (const char *)view->buf;
        *len = view->len;
    }
    if (*len > self->pub.max_message_length) {
        if (view->obj != NULL) PyBuffer_Release(view);
        PyErr_Format(MessageTooLargeError, "message of %zd bytes > max %d", *len, (int)self->pub.max_message_length);
        return -1;
    }
    return 0;
}

static PyObject *append_result(int64_t result)
{
    if (result == LB_CORRUPT_FRAME) {
        PyObject *exc = PyObject_CallFunction(LogCorruptedError, "sL",
                                              "the log's tail counters cannot be a tail (corrupted metadata)",
                                              (long long)-1);
        if (exc != NULL) {
            PyErr_SetObject(LogCorruptedError, exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    return PyLong_FromLongLong(result);
}

PyDoc_STRVAR(Publication_offer_doc,
"offer($self, data, reserved_value=0)\n--\n\n"
"Copies data (any contiguous bytes-like object, not str) into the log, fragmenting past one frame's payload.\n"
"Returns the new position, or a PublicationResult code (< 0); CLOSED once the publication or its log is\n"
"closed.  Raises MessageTooLargeError past max_message_length.");

static PyObject *Publication_offer(Publication *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"data", "reserved_value"};
    PyObject *given[2];
    if (kwnames == NULL && nargs == 1) {
        given[0] = args[0];
        given[1] = NULL;
    } else if (fast_args("offer", names, 2, 1, args, nargs, kwnames, given) < 0) {
        return NULL;
    }
    int64_t reserved_value = 0;
    if (given[1] != NULL) {
        reserved_value = PyLong_AsLongLong(given[1]);
        if (reserved_value == -1 && PyErr_Occurred()) return NULL;
    }
    if (!pub_is_open(self)) return PyLong_FromLong(LB_CLOSED);
    Py_buffer view;
    const char *buf;
    Py_ssize_t len;
    if (offer_data(self, given[0], &view, &buf, &len) < 0) return NULL;
    int64_t result = self->exclusive ? lb_offer_exclusive(&self->pub, buf, (int32_t)len, reserved_value)
                                     : lb_offer(&self->pub, buf, (int32_t)len, reserved_value);
    if (view.obj != NULL) PyBuffer_Release(&view);
    return append_result(result);
}

/* ---- BufferClaim ---- */

typedef struct {
    PyObject_HEAD
    Publication *pub;      /* strong reference while a claim is open */
    uint8_t *frame;
    int32_t frame_length;
    int64_t result;
    int open;
    PyObject *buffer;      /* memoryview of the payload while open, else None */
} BufferClaim;

static PyTypeObject BufferClaimType;

static PyObject *BufferClaim_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "BufferClaim() takes no arguments");
        return NULL;
    }
    BufferClaim *self = (BufferClaim *)type->tp_alloc(type, 0);
    if (self != NULL) self->buffer = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static int BufferClaim_traverse(BufferClaim *self, visitproc visit, void *arg)
{
    Py_VISIT(self->pub);
    Py_VISIT(self->buffer);
    return 0;
}

static int BufferClaim_clear(BufferClaim *self)
{
    Py_CLEAR(self->pub);
    Py_CLEAR(self->buffer);
    self->open = 0;
    return 0;
}

static void BufferClaim_dealloc(BufferClaim *self)
{
    PyObject_GC_UnTrack(self);
    BufferClaim_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void claim_finish(BufferClaim *self)
{
    self->open = 0;
    Py_CLEAR(self->pub);
    Py_SETREF(self->buffer, Py_NewRef(Py_None));
}

static int claim_check_open(BufferClaim *self)
{
    if (!self->open) {
        PyErr_SetString(ClaimStateError, "no open claim: try_claim failed, or it was already committed or aborted");
        return -1;
    }
    if (!pub_is_open(self->pub)) {
        claim_finish(self);
        closed_error("the claim's publication");
        return -1;
    }
    return 0;
}

static PyObject *BufferClaim_commit(BufferClaim *self, PyObject *unused)
{
    if (claim_check_open(self) < 0) return NULL;
    lb_claim_commit_wake(&self->pub->pub, self->frame - self->pub->pub.terms, self->frame_length);
    claim_finish(self);
    Py_RETURN_NONE;
}

static PyObject *BufferClaim_abort(BufferClaim *self, PyObject *unused)
{
    if (claim_check_open(self) < 0) return NULL;
    lb_claim_abort(self->pub->pub.terms, self->frame - self->pub->pub.terms, self->frame_length);
    claim_finish(self);
    Py_RETURN_NONE;
}

static PyObject *BufferClaim_enter(BufferClaim *self, PyObject *unused)
{
    if (claim_check_open(self) < 0) return NULL;
    return Py_NewRef(self->buffer);
}

static PyObject *BufferClaim_exit(BufferClaim *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!self->open) Py_RETURN_NONE;
    PyObject *r = (nargs > 0 && args[0] != Py_None) ? BufferClaim_abort(self, NULL) : BufferClaim_commit(self, NULL);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static int BufferClaim_bool(BufferClaim *self) { return self->open; }

static PyObject *BufferClaim_get_result(BufferClaim *self, void *c) { return PyLong_FromLongLong(self->result); }
static PyObject *BufferClaim_get_buffer(BufferClaim *self, void *c) { return Py_NewRef(self->buffer); }
static PyObject *BufferClaim_get_length(BufferClaim *self, void *c)
{
    return PyLong_FromLong(self->frame_length ? self->frame_length - LB_HEADER_LENGTH : -LB_HEADER_LENGTH);
}

static PyObject *BufferClaim_get_reserved_value(BufferClaim *self, void *c)
{
    if (claim_check_open(self) < 0) return NULL;
    return PyLong_FromLongLong(lb_get_i64(self->frame + LB_RESERVED_VALUE_OFFSET));
}

static int BufferClaim_set_reserved_value(BufferClaim *self, PyObject *value, void *c)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete reserved_value");
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (claim_check_open(self) < 0) return -1;
    int64_t rv = v;
    memcpy(self->frame + LB_RESERVED_VALUE_OFFSET, &rv, sizeof rv);
    return 0;
}

static PyObject *BufferClaim_repr(BufferClaim *self)
{
    const char *state = self->open ? "open" : (self->result < 0 ? "failed" : "done");
    int length = self->frame_length ? self->frame_length - LB_HEADER_LENGTH : -LB_HEADER_LENGTH;
    return PyUnicode_FromFormat("BufferClaim(%s, result=%lld, length=%d)", state, (long long)self->result, length);
}

static PyMethodDef BufferClaim_methods[] = {
    {"commit", (PyCFunction)BufferClaim_commit, METH_NOARGS,
     "Makes the frame visible to readers (stores its positive length with release semantics)."},
    {"abort", (PyCFunction)BufferClaim_abort, METH_NOARGS, "Turns the frame into padding that readers skip."},
    {"__enter__", (PyCFunction)BufferClaim_enter, METH_NOARGS, "Yields the payload buffer."},
    {"__exit__", (PyCFunction)(void (*)(void))BufferClaim_exit, METH_FASTCALL,
     "Commits on normal exit, aborts on an exception."},
    {NULL}};

static PyGetSetDef BufferClaim_getset[] = {
    {"result", (getter)BufferClaim_get_result, NULL, "The position after the frame, or the PublicationResult code.",
     NULL},
    {"position", (getter)BufferClaim_get_result, NULL, "The stream position after this frame (when claimed).", NULL},
    {"buffer", (getter)BufferClaim_get_buffer, NULL, "Writable memoryview of the payload while the claim is open.",
     NULL},
    {"length", (getter)BufferClaim_get_length, NULL, "Payload length of the claimed frame.", NULL},
    {"reserved_value", (getter)BufferClaim_get_reserved_value, (setter)BufferClaim_set_reserved_value,
     "The frame's 64-bit reserved value (while open).", NULL},
    {NULL}};

static PyNumberMethods BufferClaim_as_number = {.nb_bool = (inquiry)BufferClaim_bool};

static PyTypeObject BufferClaimType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logbuf.client.publication.BufferClaim",
    .tp_basicsize = sizeof(BufferClaim),
    .tp_dealloc = (destructor)BufferClaim_dealloc,
    .tp_repr = (reprfunc)BufferClaim_repr,
    .tp_as_number = &BufferClaim_as_number,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "BufferClaim()\n--\n\n"
              "One claimed frame: write the payload into buffer, then commit() (or abort()).  Truthy only when "
              "the claim succeeded; otherwise result says why (a PublicationResult).  As a context manager it "
              "yields the buffer, commits on normal exit and aborts on an exception.",
    .tp_traverse = (traverseproc)BufferClaim_traverse,
    .tp_clear = (inquiry)BufferClaim_clear,
    .tp_methods = BufferClaim_methods,
    .tp_getset = BufferClaim_getset,
    .tp_new = BufferClaim_new,
};

PyDoc_STRVAR(Publication_try_claim_doc,
"try_claim($self, length, claim=None)\n--\n\n"
"Claims one frame of length payload bytes for zero-copy writing.  Returns claim (or a new BufferClaim),\n"
"truthy when claimed; its result is the position or the PublicationResult code.  length is at most\n"
"max_payload_length (a claim is one frame).");

static PyObject *Publication_try_claim(Publication *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"length", "claim"};
    PyObject *given[2];
    if (fast_args("try_claim", names, 2, 1, args, nargs, kwnames, given) < 0) return NULL;
    long length = PyLong_AsLong(given[0]);
    if (length == -1 && PyErr_Occurred()) return NULL;
    BufferClaim *claim;
    if (given[1] != NULL && given[1] != Py_None) {
        if (!PyObject_TypeCheck(given[1], &BufferClaimType)) {
            PyErr_SetString(PyExc_TypeError, "claim must be a BufferClaim");
            return NULL;
        }
        claim = (BufferClaim *)Py_NewRef(given[1]);
        if (claim->open) {
            Py_DECREF(claim);
            PyErr_SetString(ClaimStateError, "the claim is still open: commit or abort it first");
            return NULL;
        }
    } else {
        claim = (BufferClaim *)BufferClaimType.tp_alloc(&BufferClaimType, 0);
        if (claim == NULL) return NULL;
        claim->buffer = Py_NewRef(Py_None);
    }
    claim->frame_length = 0;
    if (!pub_is_open(self)) {
        claim->result = LB_CLOSED;
        return (PyObject *)claim;
    }
    if (length < 0 || length > self->pub.max_payload_length) {
        Py_DECREF(claim);
        PyErr_Format(MessageTooLargeError, "claim of %ld bytes: must be 0..%d (one frame; use offer to fragment)",
                     length, (int)self->pub.max_payload_length);
        return NULL;
    }
    if (self->base_view == NULL && (self->base_view = mapping_view(self->log)) == NULL) {
        Py_DECREF(claim);
        return NULL;
    }
    lb_claim_t out;
    int64_t result = self->exclusive ? lb_try_claim_exclusive(&self->pub, (int32_t)length, &out)
                                     : lb_try_claim(&self->pub, (int32_t)length, &out);
    claim->result = result;
    if (result > 0) {
        uint8_t *frame = self->pub.terms + out.frame_offset;
        PyObject *buffer = view_at(self->base_view, frame + LB_HEADER_LENGTH, length);
        if (buffer == NULL) {
            lb_claim_abort(self->pub.terms, out.frame_offset, out.frame_length);
            Py_DECREF(claim);
            return NULL;
        }
        Py_SETREF(claim->buffer, buffer);
        Py_XSETREF(claim->pub, (Publication *)Py_NewRef(self));
        claim->frame = frame;
        claim->frame_length = out.frame_length;
        claim->open = 1;
    } else if (result == LB_CORRUPT_FRAME) {
        Py_DECREF(claim);
        return append_result(result);
    }
    return (PyObject *)claim;
}

static PyObject *Publication_get_position(Publication *self, void *c)
{
    if (!pub_is_open(self)) return closed_error("publication");
    return PyLong_FromLongLong(self->exclusive ? lb_exclusive_position(&self->pub) : lb_producer_position(&self->pub));
}

static PyObject *Publication_get_limit(Publication *self, void *c)
{
    if (!pub_is_open(self)) return closed_error("publication");
    return PyLong_FromLongLong(lb_ld_i64((const uint8_t *)self->pub.limit));
}

static PyObject *Publication_available_window(Publication *self, PyObject *unused)
{
    if (!pub_is_open(self)) return closed_error("publication");
    int64_t position = self->exclusive ? lb_exclusive_position(&self->pub) : lb_producer_position(&self->pub);
    return PyLong_FromLongLong(lb_ld_i64((const uint8_t *)self->pub.limit) - position);
}

static PyObject *Publication_get_is_closed(Publication *self, void *c)
{
    return PyBool_FromLong(!pub_is_open(self));
}

static PyObject *Publication_get_struct_address(Publication *self, void *c)
{
    if (!pub_is_open(self)) return closed_error("publication");
    return PyLong_FromVoidPtr(&self->pub);
}

static PyObject *Publication_close_native(Publication *self, PyObject *unused)
{
    self->closed = 1;
    pub_release(self);
    Py_RETURN_NONE;
}

static PyMethodDef Publication_methods[] = {
    {"_attach", (PyCFunction)Publication_attach, METH_VARARGS, Publication_attach_doc},
    {"offer", (PyCFunction)(void (*)(void))Publication_offer, METH_FASTCALL | METH_KEYWORDS, Publication_offer_doc},
    {"try_claim", (PyCFunction)(void (*)(void))Publication_try_claim, METH_FASTCALL | METH_KEYWORDS, Publication_try_claim_doc},
    {"available_window", (PyCFunction)Publication_available_window, METH_NOARGS,
     "Bytes that can be appended before back-pressure; raises ClosedError once closed."},
    {"_close_native", (PyCFunction)Publication_close_native, METH_NOARGS,
     "Marks the publication closed and lets go of the log, the limit counter and the semaphore."},
    {NULL}};

static PyGetSetDef Publication_getset[] = {
    {"position", (getter)Publication_get_position, NULL,
     "The producer position (the tail of the active term); raises ClosedError once closed.", NULL},
    {"position_limit_value", (getter)Publication_get_limit, NULL,
     "The publication limit (pub-lmt); raises ClosedError once closed.", NULL},
    {"is_closed", (getter)Publication_get_is_closed, NULL, "True once the publication or its log is closed.", NULL},
    {"_struct_address", (getter)Publication_get_struct_address, NULL,
     "Address of the lb_publication_t (for the cffi batch path, valid while open).", NULL},
    {NULL}};

static PyTypeObject PublicationType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logbuf._client.Publication",
    .tp_basicsize = sizeof(Publication),
    .tp_dealloc = (destructor)Publication_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Native core of a publication: append, claim, positions.  logbuf.client.publication's classes "
              "subclass it.",
    .tp_traverse = (traverseproc)Publication_traverse,
    .tp_clear = (inquiry)Publication_clear,
    .tp_methods = Publication_methods,
    .tp_getset = Publication_getset,
    .tp_new = PyType_GenericNew,
};

/* =====================================================================================================
 * Image
 * ===================================================================================================== */

typedef struct {
    PyObject_HEAD
    LogMapping *log;
    Py_buffer sub_view;        /* export of the sub-pos counter's buffer */
    int64_t *sub_pos;
    int64_t position;          /* the read cursor */
    int32_t session_id;
    int32_t stream_id;
    int32_t initial_term_id;
    int32_t term_length;
    int32_t bits;
    int hold;
    int attached;
    int closed;
    int dispatching;           /* inside poll/controlled_poll (a handler polling the same image is refused) */
    Header *header;
    PyObject *base_view;       /* memoryview of the mapping, base of payload views */
    PyObject *payload;         /* the payload view handed to handlers, re-pointed while nobody keeps it */
} Image;

static PyTypeObject ImageType;

static inline int image_is_open(const Image *self) { return !self->closed && self->attached && !self->log->closed; }

static void image_release(Image *self)
{
    if (self->sub_view.obj != NULL) PyBuffer_Release(&self->sub_view);
    self->sub_pos = NULL;
    Py_CLEAR(self->payload);
    Py_CLEAR(self->base_view);
    Py_CLEAR(self->log);
}

static int Image_traverse(Image *self, visitproc visit, void *arg)
{
    Py_VISIT(self->log);
    Py_VISIT(self->header);
    Py_VISIT(self->base_view);
    Py_VISIT(self->payload);
    return 0;
}

static int Image_clear(Image *self)
{
    self->closed = 1;
    image_release(self);
    Py_CLEAR(self->header);
    return 0;
}

static void Image_dealloc(Image *self)
{
    PyObject_GC_UnTrack(self);
    Image_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(Image_attach_doc,
"_attach($self, log, sub_pos_buffer, sub_pos_offset, session_id, stream_id, initial_term_id, /)\n--\n\n"
"Binds this image to a LogMapping and its sub-pos counter (an int64 at sub_pos_offset of sub_pos_buffer);\n"
"both are held (buffer exports) until close.  The read cursor starts at the counter's value.");

static PyObject *Image_attach(Image *self, PyObject *args)
{
    PyObject *log, *sub_obj;
    Py_ssize_t sub_offset;
    int session_id, stream_id, initial_term_id;
    if (!PyArg_ParseTuple(args, "O!Oniii:_attach", &LogMappingType, &log, &sub_obj, &sub_offset, &session_id,
                          &stream_id, &initial_term_id)) {
        return NULL;
    }
    if (self->attached) {
        PyErr_SetString(PyExc_RuntimeError, "image is already attached");
        return NULL;
    }
    LogMapping *m = (LogMapping *)log;
    if (m->closed) return closed_error("log buffer");
    int64_t *sub_pos = counter_address(sub_obj, sub_offset, &self->sub_view);
    if (sub_pos == NULL) return NULL;
    self->log = (LogMapping *)Py_NewRef(log);
    self->base_view = mapping_view(m);
    self->payload = self->base_view ? view_at(self->base_view, NULL, 0) : NULL;
    self->header = (Header *)HeaderType.tp_alloc(&HeaderType, 0);
    if (self->payload == NULL || self->header == NULL) {
        image_release(self);
        return NULL;
    }
    self->header->initial_term_id = initial_term_id;
    self->header->position_bits = m->position_bits;
    self->sub_pos = sub_pos;
    self->position = lb_ld_i64((const uint8_t *)sub_pos);
    self->session_id = session_id;
    self->stream_id = stream_id;
    self->initial_term_id = initial_term_id;
    self->term_length = m->term_length;
    self->bits = m->position_bits;
    self->attached = 1;
    Py_RETURN_NONE;
}

static inline void image_commit(Image *self, int64_t new_position)
{
    if (new_position > self->position) {
        self->position = new_position;
        if (!self->hold) lb_st_i64((uint8_t *)self->sub_pos, new_position);
    }
}

static PyObject *image_corrupt(Image *self, int64_t position)
{
    PyObject *exc = PyObject_CallFunction(
        LogCorruptedError, "NL",
        PyUnicode_FromFormat("corrupted frame in stream %d session %d at position %lld", (int)self->stream_id,
                             (int)self->session_id, (long long)position),
        (long long)position);
    if (exc != NULL) {
        PyErr_SetObject(LogCorruptedError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static int parse_poll_args(const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                           PyObject **handler, int *limit)
{
    static const char *const names[] = {"handler", "fragment_limit"};
    PyObject *given[2];
    if (kwnames == NULL && nargs >= 1 && nargs <= 2) {
        given[0] = args[0];
        given[1] = nargs == 2 ? args[1] : NULL;
    } else if (fast_args(name, names, 2, 1, args, nargs, kwnames, given) < 0) {
        return -1;
    }
    *handler = given[0];
    *limit = DEFAULT_FRAGMENT_LIMIT;
    if (given[1] != NULL) {
        long v = PyLong_AsLong(given[1]);
        if (v == -1 && PyErr_Occurred()) return -1;
        *limit = v > INT32_MAX ? INT32_MAX : (int)v;
    }
    return 0;
}

/*
 * The dispatch loop of poll and controlled_poll: reads committed frames from the cursor (at most to the end of
 * the term), skips PAD frames, and calls handler(payload, header) for each DATA frame.  A frame header that
 * cannot be a frame, or a DATA frame that is not this image's (session, stream, term id), stops the read
 * before it; at the cursor itself it raises LogCorruptedError.
 */
static PyObject *image_dispatch(Image *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                                int controlled)
{
    PyObject *handler;
    int limit;
    if (parse_poll_args(controlled ? "controlled_poll" : "poll", args, nargs, kwnames, &handler, &limit) < 0) {
        return NULL;
    }
    if (!image_is_open(self)) return PyLong_FromLong(0);
    const int64_t position = self->position;
    const int32_t T = self->term_length;
    const int32_t term_offset = (int32_t)(position & (T - 1));
    const int64_t base = position - term_offset;
    LogMapping *log = self->log;
    const uint8_t *term = log->terms + (int64_t)lb_index_by_position(position, self->bits) * T;
    if (lb_ld_i32(term + term_offset) <= 0) return PyLong_FromLong(0);   /* nothing committed yet */
    if (self->payload == NULL && (self->payload = view_at(self->base_view, NULL, 0)) == NULL) return NULL;
    const int32_t term_id = lb_term_id_of_position(position, self->bits, self->initial_term_id);
    Header *header = self->header;
    PyObject *call_args[2];
    int32_t offset = term_offset;   /* consumed up to here */
    int delivered = 0;
    int failed = 0;
    Py_INCREF(log);   /* the term stays mapped even if the handler closes the image or the log */
    while (delivered < limit && offset < T) {
        uint16_t type;
        int32_t frame_length = lb_committed_frame(term, T, offset, &type);
        if (frame_length == 0) break;
        int32_t next = offset + (int32_t)lb_align_frame(frame_length);
        if (frame_length < 0
            || (type == LB_HDR_TYPE_DATA && !lb_frame_is_own(term + offset, self->session_id, self->stream_id, term_id))
            || lb_next_frame_misplaced(term, T, next)) {
            if (offset == term_offset) {
                Py_DECREF(log);
                return image_corrupt(self, base + offset);
            }
            break;
        }
        if (type != LB_HDR_TYPE_DATA) {
            offset = next;
            continue;
        }
        if (Py_REFCNT(self->payload) != 1 && recycle_view(&self->payload, self->base_view) < 0) {
            failed = 1;   /* held by an outer handler (a poll from inside a handler): never re-point it */
            break;
        }
        if (repoint_view(&self->payload, self->base_view, (uint8_t *)term + offset + LB_HEADER_LENGTH,
                         frame_length - LB_HEADER_LENGTH) < 0) {
            failed = 1;
            break;
        }
        header->frame = term + offset;
        header->offset = offset;
        call_args[0] = Py_NewRef(self->payload);   /* ours: a close on another thread may drop self->payload */
        call_args[1] = (PyObject *)header;
        PyObject *r = PyObject_Vectorcall(handler, call_args, 2, NULL);
        header->frame = NULL;
        Py_DECREF(call_args[0]);
        if (!image_is_open(self) || self->position != position) {
            /* the handler closed the image or its log, or polled it itself (which moved the position on from
             * where this poll reads): stop here */
            if (r != NULL && self->position != position && image_is_open(self)) image_commit(self, base + next);
            Py_DECREF(log);
            if (r == NULL) return NULL;
            Py_DECREF(r);
            return PyLong_FromLong(delivered + 1);
        }
        if (Py_REFCNT(self->payload) != 1) {   /* kept (or in a traceback): release it, use a fresh one */
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            int recycled = recycle_view(&self->payload, self->base_view);
            if (recycled == 0 || type != NULL) PyErr_Restore(type, value, traceback);
            if (recycled < 0) Py_CLEAR(r);
        }
        if (r == NULL) {
            if (!controlled) offset = next;   /* as Aeron: poll moves past a fragment whose handler raised */
            failed = 1;
            break;
        }
        if (controlled) {
            long action = PyLong_Check(r) ? PyLong_AsLong(r) : ACTION_CONTINUE;
            Py_DECREF(r);
            if (action == -1 && PyErr_Occurred()) PyErr_Clear();
            if (action == ACTION_ABORT) break;
            delivered++;
            offset = next;
            if (action == ACTION_BREAK) break;
            if (action == ACTION_COMMIT) image_commit(self, base + offset);
        } else {
            Py_DECREF(r);
            delivered++;
            offset = next;
        }
    }
    image_commit(self, base + offset);
    Py_DECREF(log);
    if (failed) return NULL;
    return PyLong_FromLong(delivered);
}

static PyObject *image_guarded_dispatch(Image *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                                        int controlled)
{
    if (self->dispatching) {
        PyErr_SetString(ReentrantPollError, "an image cannot be polled from inside one of its own handlers");
        return NULL;
    }
    self->dispatching = 1;
    PyObject *r = image_dispatch(self, args, nargs, kwnames, controlled);
    self->dispatching = 0;
    return r;
}

static PyObject *Image_poll(Image *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return image_guarded_dispatch(self, args, nargs, kwnames, 0);
}

static PyObject *Image_controlled_poll(Image *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return image_guarded_dispatch(self, args, nargs, kwnames, 1);
}

static PyObject *Image_is_data_available(Image *self, PyObject *unused)
{
    if (!image_is_open(self)) Py_RETURN_FALSE;
    const int32_t T = self->term_length;
    const uint8_t *term = self->log->terms + (int64_t)lb_index_by_position(self->position, self->bits) * T;
    return PyBool_FromLong(lb_ld_i32(term + (self->position & (T - 1))) > 0);
}

static PyObject *Image_commit_position(Image *self, PyObject *arg)
{
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (!image_is_open(self)) return closed_error("image");
    image_commit(self, v);
    Py_RETURN_NONE;
}

static PyObject *Image_hold_position(Image *self, PyObject *unused)
{
    self->hold = 1;
    Py_RETURN_NONE;
}

static PyObject *Image_release_to(Image *self, PyObject *arg)
{
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (!image_is_open(self)) return closed_error("image");
    if (v > self->position) {
        PyErr_Format(PyExc_ValueError, "cannot release to %lld: only read up to %lld", v, (long long)self->position);
        return NULL;
    }
    if (v > lb_ld_i64((const uint8_t *)self->sub_pos)) lb_st_i64((uint8_t *)self->sub_pos, v);
    Py_RETURN_NONE;
}

static PyObject *Image_close_native(Image *self, PyObject *unused)
{
    self->closed = 1;
    /* A close from another thread while a handler runs leaves that handler's header bound: the dispatch holds
     * the log (the term stays mapped) and unbinds the header itself when the handler returns. */
    if (self->header != NULL && !self->dispatching) self->header->frame = NULL;
    image_release(self);
    Py_RETURN_NONE;
}

static PyObject *Image_get_position(Image *self, void *c) { return PyLong_FromLongLong(self->position); }

static int Image_set_position(Image *self, PyObject *value, void *c)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete the position");
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || (v & (LB_FRAME_ALIGNMENT - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "position %lld is not a frame boundary", v);
        return -1;
    }
    self->position = v;
    return 0;
}

static PyObject *Image_get_released(Image *self, void *c)
{
    if (!image_is_open(self)) return closed_error("image");
    return PyLong_FromLongLong(lb_ld_i64((const uint8_t *)self->sub_pos));
}

static PyObject *Image_get_is_closed(Image *self, void *c) { return PyBool_FromLong(!image_is_open(self)); }
static PyObject *Image_get_header(Image *self, void *c) { return Py_NewRef(self->header ? (PyObject *)self->header : Py_None); }

static PyMethodDef Image_methods[] = {
    {"_attach", (PyCFunction)Image_attach, METH_VARARGS, Image_attach_doc},
    {"poll", (PyCFunction)(void (*)(void))Image_poll, METH_FASTCALL | METH_KEYWORDS,
     "poll($self, handler, fragment_limit=10)\n--\n\n"
     "Delivers up to fragment_limit committed fragments to handler(buffer, header): buffer is a zero-copy\n"
     "memoryview of the payload and header a flyweight, both valid only inside the call.  Returns how many\n"
     "fragments were delivered (0 once closed).  If the handler raises, the position still moves past that\n"
     "fragment (as in Aeron) and the exception propagates."},
    {"controlled_poll", (PyCFunction)(void (*)(void))Image_controlled_poll, METH_FASTCALL | METH_KEYWORDS,
     "controlled_poll($self, handler, fragment_limit=10)\n--\n\n"
     "As poll, with the handler returning a ControlledPollAction (ABORT, BREAK, COMMIT, CONTINUE)."},
    {"is_data_available", (PyCFunction)Image_is_data_available, METH_NOARGS,
     "True when a committed frame sits at this image's position."},
    {"_commit_position", (PyCFunction)Image_commit_position, METH_O,
     "Moves the read cursor (and, unless held, sub-pos) forward to the given position."},
    {"hold_position", (PyCFunction)Image_hold_position, METH_NOARGS,
     "From now on polls move only the read cursor; sub-pos moves only by release_to()."},
    {"release_to", (PyCFunction)Image_release_to, METH_O,
     "Publishes the given position (at most the read cursor) as this image's sub-pos."},
    {"_close_native", (PyCFunction)Image_close_native, METH_NOARGS,
     "Marks the image closed and lets go of the log and the sub-pos counter."},
    {NULL}};

static PyGetSetDef Image_getset[] = {
    {"position", (getter)Image_get_position, NULL, "The read cursor (the position of the next fragment).", NULL},
    {"_position", (getter)Image_get_position, (setter)Image_set_position,
     "The read cursor; settable (to a frame boundary) for tests and recovery.", NULL},
    {"released_position", (getter)Image_get_released, NULL,
     "The published sub-pos; raises ClosedError once closed.", NULL},
    {"is_closed", (getter)Image_get_is_closed, NULL, "True once the image or its log is closed.", NULL},
    {"_header", (getter)Image_get_header, NULL, "The Header flyweight this image hands to handlers.", NULL},
    {NULL}};

static PyTypeObject ImageType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logbuf._client.Image",
    .tp_basicsize = sizeof(Image),
    .tp_dealloc = (destructor)Image_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Native core of an image: the poll dispatch loop and the subscriber position.  "
              "logbuf.client.image.Image subclasses it.",
    .tp_traverse = (traverseproc)Image_traverse,
    .tp_clear = (inquiry)Image_clear,
    .tp_methods = Image_methods,
    .tp_getset = Image_getset,
    .tp_new = PyType_GenericNew,
};

/* =====================================================================================================
 * FragmentAssembler
 * ===================================================================================================== */

typedef struct {
    PyObject_HEAD
    PyObject *handler;
    PyObject *builders;    /* session id -> bytearray of a message being assembled */
    vectorcallfunc vectorcall;
} FragmentAssembler;

static PyTypeObject FragmentAssemblerType;

/* flags and session id of the fragment: straight from the frame for our Header, by attribute otherwise */
static int fragment_fields(PyObject *header, int *flags, PyObject **session_id)
{
    if (Py_IS_TYPE(header, &HeaderType)) {
        const uint8_t *f = header_frame((Header *)header);
        if (f == NULL) return -1;
        *flags = f[LB_FLAGS_OFFSET];
        if (session_id == NULL) return 0;
        *session_id = PyLong_FromLong(lb_get_i32(f + LB_SESSION_ID_OFFSET));
        return *session_id == NULL ? -1 : 0;
    }
    PyObject *v = PyObject_GetAttrString(header, "flags");
    if (v == NULL) return -1;
    *flags = (int)PyLong_AsLong(v);
    Py_DECREF(v);
    if (*flags == -1 && PyErr_Occurred()) return -1;
    if (session_id == NULL) return 0;
    *session_id = PyObject_GetAttrString(header, "session_id");
    return *session_id == NULL ? -1 : 0;
}

static PyObject *FragmentAssembler_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FragmentAssembler *self = (FragmentAssembler *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "FragmentAssembler(buffer, header) takes two positional arguments");
        return NULL;
    }
    int flags;
    if (fragment_fields(args[1], &flags, NULL) < 0) return NULL;
    if ((flags & LB_UNFRAGMENTED) == LB_UNFRAGMENTED) return PyObject_Vectorcall(self->handler, args, 2, NULL);
    PyObject *session_id;
    if (fragment_fields(args[1], &flags, &session_id) < 0) return NULL;
    PyObject *result = NULL;
    if (flags & LB_BEGIN_FLAG) {
        PyObject *builder = PyByteArray_FromObject(args[0]);
        if (builder != NULL && PyDict_SetItem(self->builders, session_id, builder) == 0) result = Py_NewRef(Py_None);
        Py_XDECREF(builder);
        Py_DECREF(session_id);
        return result;
    }
    PyObject *builder = PyDict_GetItemWithError(self->builders, session_id);   /* borrowed */
    if (builder == NULL) {
        Py_DECREF(session_id);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;   /* joined mid-message: drop until the next BEGIN */
    }
    Py_INCREF(builder);
    PyObject *grown = PySequence_InPlaceConcat(builder, args[0]);
    if (grown == NULL) goto done;
    Py_DECREF(grown);
    if (flags & LB_END_FLAG) {
        if (PyDict_DelItem(self->builders, session_id) < 0) goto done;
        PyObject *view = PyMemoryView_FromObject(builder);
        if (view == NULL) goto done;
        PyObject *call_args[2] = {view, args[1]};
        result = PyObject_Vectorcall(self->handler, call_args, 2, NULL);
        Py_DECREF(view);
    } else {
        result = Py_NewRef(Py_None);
    }
done:
    Py_DECREF(builder);
    Py_DECREF(session_id);
    return result;
}

static PyObject *FragmentAssembler_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *handler;
    static char *kwlist[] = {"handler", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:FragmentAssembler", kwlist, &handler)) return NULL;
    if (!PyCallable_Check(handler)) {
        PyErr_SetString(PyExc_TypeError, "handler must be callable");
        return NULL;
    }
    FragmentAssembler *self = (FragmentAssembler *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->handler = Py_NewRef(handler);
    self->builders = PyDict_New();
    self->vectorcall = FragmentAssembler_vectorcall;
    if (self->builders == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int FragmentAssembler_traverse(FragmentAssembler *self, visitproc visit, void *arg)
{
    Py_VISIT(self->handler);
    Py_VISIT(self->builders);
    return 0;
}

static int FragmentAssembler_clear(FragmentAssembler *self)
{
    Py_CLEAR(self->handler);
    Py_CLEAR(self->builders);
    return 0;
}

static void FragmentAssembler_dealloc(FragmentAssembler *self)
{
    PyObject_GC_UnTrack(self);
    FragmentAssembler_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *FragmentAssembler_free_session(FragmentAssembler *self, PyObject *session_id)
{
    if (PyDict_Contains(self->builders, session_id) == 1 && PyDict_DelItem(self->builders, session_id) < 0) return NULL;
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *FragmentAssembler_get_handler(FragmentAssembler *self, void *c) { return Py_NewRef(self->handler); }

static PyMethodDef FragmentAssembler_methods[] = {
    {"free_session", (PyCFunction)FragmentAssembler_free_session, METH_O,
     "Forgets a partial message of the session (its image went away)."},
    {NULL}};

static PyGetSetDef FragmentAssembler_getset[] = {
    {"handler", (getter)FragmentAssembler_get_handler, NULL, "The wrapped handler.", NULL}, {NULL}};

static PyTypeObject FragmentAssemblerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logbuf.client.fragment_assembler.FragmentAssembler",
    .tp_basicsize = sizeof(FragmentAssembler),
    .tp_dealloc = (destructor)FragmentAssembler_dealloc,
    .tp_vectorcall_offset = offsetof(FragmentAssembler, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "FragmentAssembler(handler)\n--\n\n"
              "Rebuilds messages that offer split into BEGIN .. END fragments.  Pass it to poll in place of the "
              "handler: unfragmented messages go straight through (zero-copy); fragmented ones are collected "
              "per session and delivered whole, as handler(memoryview, header), once their END fragment "
              "arrives.  A session joined mid-message is dropped until its next BEGIN.",
    .tp_traverse = (traverseproc)FragmentAssembler_traverse,
    .tp_clear = (inquiry)FragmentAssembler_clear,
    .tp_methods = FragmentAssembler_methods,
    .tp_getset = FragmentAssembler_getset,
    .tp_new = FragmentAssembler_new,
};

/* =====================================================================================================
 * module
 * ===================================================================================================== */

static int set_int(PyObject *dict, const char *name, long value)
{
    PyObject *v = PyLong_FromLong(value);
    int r = v == NULL ? -1 : PyDict_SetItemString(dict, name, v);
    Py_XDECREF(v);
    return r;
}

/* Adds table (a new reference, or NULL on an error already set) to the module as name. */
static int add_table(PyObject *module, const char *name, PyObject *table)
{
    if (table != NULL && PyModule_AddObject(module, name, table) == 0) return 0;
    Py_XDECREF(table);
    return -1;
}

/* The log layout (lb_layout.h): {Python's name: value}. */
static PyObject *layout_table(void)
{
    PyObject *layout = PyDict_New();
    if (layout == NULL) return NULL;
#define L(name, value) \
    if (set_int(layout, name, value) < 0) goto fail;
    L("HEADER_LENGTH", LB_HEADER_LENGTH)
    L("FRAME_ALIGNMENT", LB_FRAME_ALIGNMENT)
    L("FRAME_LENGTH_OFFSET", LB_FRAME_LENGTH_OFFSET)
    L("VERSION_OFFSET", LB_VERSION_OFFSET)
    L("FLAGS_OFFSET", LB_FLAGS_OFFSET)
    L("TYPE_OFFSET", LB_TYPE_OFFSET)
    L("TERM_OFFSET_OFFSET", LB_TERM_OFFSET_OFFSET)
    L("SESSION_ID_OFFSET", LB_SESSION_ID_OFFSET)
    L("STREAM_ID_OFFSET", LB_STREAM_ID_OFFSET)
    L("TERM_ID_OFFSET", LB_TERM_ID_OFFSET)
    L("RESERVED_VALUE_OFFSET", LB_RESERVED_VALUE_OFFSET)
    L("CURRENT_VERSION", LB_CURRENT_VERSION)
    L("EOS_FLAG", LB_EOS_FLAG)
    L("HDR_TYPE_PAD", LB_HDR_TYPE_PAD)
    L("HDR_TYPE_DATA", LB_HDR_TYPE_DATA)
    L("HDR_TYPE_NAK", LB_HDR_TYPE_NAK)
    L("HDR_TYPE_SM", LB_HDR_TYPE_SM)
    L("HDR_TYPE_ERR", LB_HDR_TYPE_ERR)
    L("HDR_TYPE_SETUP", LB_HDR_TYPE_SETUP)
    L("HDR_TYPE_RTTM", LB_HDR_TYPE_RTTM)
    L("BEGIN_FLAG", LB_BEGIN_FLAG)
    L("END_FLAG", LB_END_FLAG)
    L("UNFRAGMENTED", LB_UNFRAGMENTED)
    L("PARTITION_COUNT", LB_PARTITION_COUNT)
    L("TERM_MIN_LENGTH", LB_TERM_MIN_LENGTH)
    L("TERM_MAX_LENGTH", LB_TERM_MAX_LENGTH)
    L("LOG_META_DATA_LENGTH", LB_LOG_META_DATA_LENGTH)
    L("TERM_TAIL_COUNTERS_OFFSET", LB_META_TAIL_COUNTERS)
    L("LOG_ACTIVE_TERM_COUNT_OFFSET", LB_META_ACTIVE_TERM_COUNT)
    L("LOG_END_OF_STREAM_POSITION_OFFSET", LB_META_END_OF_STREAM_POSITION)
    L("LOG_IS_CONNECTED_OFFSET", LB_META_IS_CONNECTED)
    L("LOG_DEFAULT_FRAME_HEADER_OFFSET", LB_META_DEFAULT_HEADER)
    L("LOG_WAITING_SUBSCRIBERS_OFFSET", LB_META_WAITING_SUBSCRIBERS)
    L("MAX_WAKE_POSTS", LB_MAX_WAKE_POSTS)
    L("POSITION_TERM_COUNT_BITS", LB_POSITION_TERM_COUNT_BITS)
    L("MAX_MESSAGE_TERM_DIVISOR", LB_MAX_MESSAGE_TERM_DIVISOR)
    L("MAX_MESSAGE_LENGTH_CAP", LB_MAX_MESSAGE_LENGTH_CAP)
#undef L
    return layout;
fail:
    Py_DECREF(layout);
    return NULL;
}

/* A new dict at frames[name], borrowed (frames owns it); NULL on error. */
static PyObject *add_frame(PyObject *frames, const char *name)
{
    PyObject *frame = PyDict_New();
    if (frame == NULL) return NULL;
    int r = PyDict_SetItemString(frames, name, frame);
    Py_DECREF(frame);
    return r < 0 ? NULL : frame;
}

/* The control frames' layouts (lb_control.h), per logbuf.protocol module: {module: {Python's name: value}}. */
static PyObject *control_layout_table(void)
{
    PyObject *frames = PyDict_New(), *frame;
    if (frames == NULL) return NULL;
#define FRAME(name) \
    if ((frame = add_frame(frames, name)) == NULL) goto fail;
#define F(name, value) \
    if (set_int(frame, name, value) < 0) goto fail;
    FRAME("status_message")
    F("STATUS_MESSAGE_LENGTH", LB_SM_LENGTH)
    F("SESSION_ID_FIELD_OFFSET", LB_SM_SESSION_ID_OFFSET)
    F("STREAM_ID_FIELD_OFFSET", LB_SM_STREAM_ID_OFFSET)
    F("CONSUMPTION_TERM_ID_FIELD_OFFSET", LB_SM_CONSUMPTION_TERM_ID_OFFSET)
    F("CONSUMPTION_TERM_OFFSET_FIELD_OFFSET", LB_SM_CONSUMPTION_TERM_OFFSET_OFFSET)
    F("RECEIVER_WINDOW_FIELD_OFFSET", LB_SM_RECEIVER_WINDOW_OFFSET)
    F("RECEIVER_ID_FIELD_OFFSET", LB_SM_RECEIVER_ID_OFFSET)
    F("FEEDBACK_OFFSET", LB_SM_FEEDBACK_OFFSET)
    F("SEND_SETUP_FLAG", LB_SM_SETUP_FLAG)
    F("END_OF_STREAM_FLAG", LB_SM_EOS_FLAG)
    FRAME("nak")
    F("NAK_LENGTH", LB_NAK_LENGTH)
    F("SESSION_ID_FIELD_OFFSET", LB_NAK_SESSION_ID_OFFSET)
    F("STREAM_ID_FIELD_OFFSET", LB_NAK_STREAM_ID_OFFSET)
    F("TERM_ID_FIELD_OFFSET", LB_NAK_TERM_ID_OFFSET)
    F("TERM_OFFSET_FIELD_OFFSET", LB_NAK_TERM_OFFSET_OFFSET)
    F("LENGTH_FIELD_OFFSET", LB_NAK_LENGTH_FIELD_OFFSET)
    FRAME("setup")
    F("SETUP_LENGTH", LB_SETUP_LENGTH)
    F("TERM_OFFSET_FIELD_OFFSET", LB_SETUP_TERM_OFFSET_OFFSET)
    F("SESSION_ID_FIELD_OFFSET", LB_SETUP_SESSION_ID_OFFSET)
    F("STREAM_ID_FIELD_OFFSET", LB_SETUP_STREAM_ID_OFFSET)
    F("INITIAL_TERM_ID_FIELD_OFFSET", LB_SETUP_INITIAL_TERM_ID_OFFSET)
    F("ACTIVE_TERM_ID_FIELD_OFFSET", LB_SETUP_ACTIVE_TERM_ID_OFFSET)
    F("TERM_LENGTH_FIELD_OFFSET", LB_SETUP_TERM_LENGTH_OFFSET)
    F("MTU_FIELD_OFFSET", LB_SETUP_MTU_OFFSET)
    F("TTL_FIELD_OFFSET", LB_SETUP_TTL_OFFSET)
    F("MAX_MTU", LB_MAX_MTU)
    FRAME("rttm")
    F("RTTM_LENGTH", LB_RTTM_LENGTH)
    F("SESSION_ID_FIELD_OFFSET", LB_RTTM_SESSION_ID_OFFSET)
    F("STREAM_ID_FIELD_OFFSET", LB_RTTM_STREAM_ID_OFFSET)
    F("ECHO_TIMESTAMP_FIELD_OFFSET", LB_RTTM_ECHO_TIMESTAMP_OFFSET)
    F("RECEPTION_DELTA_FIELD_OFFSET", LB_RTTM_RECEPTION_DELTA_OFFSET)
    F("RECEIVER_ID_FIELD_OFFSET", LB_RTTM_RECEIVER_ID_OFFSET)
    F("REPLY_FLAG", LB_RTTM_REPLY_FLAG)
    FRAME("error_frame")
    F("ERROR_HEADER_LENGTH", LB_ERR_HEADER_LENGTH)
    F("SESSION_ID_FIELD_OFFSET", LB_ERR_SESSION_ID_OFFSET)
    F("STREAM_ID_FIELD_OFFSET", LB_ERR_STREAM_ID_OFFSET)
    F("RECEIVER_ID_FIELD_OFFSET", LB_ERR_RECEIVER_ID_OFFSET)
    F("GROUP_TAG_FIELD_OFFSET", LB_ERR_GROUP_TAG_OFFSET)
    F("ERROR_CODE_FIELD_OFFSET", LB_ERR_CODE_OFFSET)
    F("ERROR_LENGTH_FIELD_OFFSET", LB_ERR_TEXT_LENGTH_OFFSET)
    F("ERROR_TEXT_OFFSET", LB_ERR_TEXT_OFFSET)
    F("MAX_ERROR_TEXT_LENGTH", LB_ERR_MAX_TEXT_LENGTH)
#undef F
#undef FRAME
    return frames;
fail:
    Py_DECREF(frames);
    return NULL;
}

/* Named integer tables Python checks at import against its own enums (PublicationResult, ControlledPollAction). */
static int add_codes(PyObject *module)
{
    PyObject *results = PyDict_New(), *actions = PyDict_New();
    if (results == NULL || actions == NULL) goto fail;
    if (set_int(results, "NOT_CONNECTED", LB_NOT_CONNECTED) < 0 || set_int(results, "BACK_PRESSURED", LB_BACK_PRESSURED) < 0
        || set_int(results, "ADMIN_ACTION", LB_ADMIN_ACTION) < 0 || set_int(results, "CLOSED", LB_CLOSED) < 0
        || set_int(results, "MAX_POSITION_EXCEEDED", LB_MAX_POSITION_EXCEEDED) < 0
        || set_int(actions, "ABORT", ACTION_ABORT) < 0 || set_int(actions, "BREAK", ACTION_BREAK) < 0
        || set_int(actions, "COMMIT", ACTION_COMMIT) < 0 || set_int(actions, "CONTINUE", ACTION_CONTINUE) < 0) {
        goto fail;
    }
    if (PyModule_AddObjectRef(module, "RESULT_CODES", results) < 0
        || PyModule_AddObjectRef(module, "POLL_ACTIONS", actions) < 0) {
        goto fail;
    }
    Py_DECREF(results);
    Py_DECREF(actions);
    return 0;
fail:
    Py_XDECREF(results);
    Py_XDECREF(actions);
    return -1;
}

static int load_errors(void)
{
    PyObject *errors = PyImport_ImportModule("logbuf.errors");
    if (errors == NULL) return -1;
    ClosedError = PyObject_GetAttrString(errors, "ClosedError");
    LogCorruptedError = PyObject_GetAttrString(errors, "LogCorruptedError");
    ClaimStateError = PyObject_GetAttrString(errors, "ClaimStateError");
    MessageTooLargeError = PyObject_GetAttrString(errors, "MessageTooLargeError");
    UnboundHeaderError = PyObject_GetAttrString(errors, "UnboundHeaderError");
    ReentrantPollError = PyObject_GetAttrString(errors, "ReentrantPollError");
    Py_DECREF(errors);
    return (ClosedError && LogCorruptedError && ClaimStateError && MessageTooLargeError && UnboundHeaderError
            && ReentrantPollError) ? 0 : -1;
}

/* The methods a Python subclass gets its own descriptors of (see specialize). */
static const char *const hot_publication_methods[] = {"offer", "try_claim", NULL};
static const char *const hot_image_methods[] = {"poll", "controlled_poll", "is_data_available", NULL};

static int define_own_descriptors(PyTypeObject *cls, PyMethodDef *defs, const char *const *names)
{
    for (const char *const *name = names; *name != NULL; name++) {
        PyMethodDef *def = defs;
        while (def->ml_name != NULL && strcmp(def->ml_name, *name) != 0) def++;
        if (def->ml_name == NULL) continue;
        PyObject *descr = PyDescr_NewMethod(cls, def);
        if (descr == NULL) return -1;
        int r = PyObject_SetAttrString((PyObject *)cls, *name, descr);
        Py_DECREF(descr);
        if (r < 0) return -1;
    }
    return 0;
}

PyDoc_STRVAR(specialize_doc,
"specialize($module, cls, /)\n--\n\n"
"Gives a Python subclass of Publication or Image its own method descriptors of the hot methods (offer,\n"
"try_claim; poll, controlled_poll, is_data_available).  CPython's call specialisation requires the\n"
"descriptor's type to be exactly the instance's type: without this, every call on a subclass instance\n"
"takes the generic (slower) call path.  A no-op before CPython 3.11 and while the CPython internals are off\n"
"(_use_cpython_internals(False)): the subclass then uses the inherited descriptors.");

PyDoc_STRVAR(use_internals_doc,
"_use_cpython_internals($module, enabled, /)\n--\n\n"
"Turns the CPython-specific fast paths (payload views re-pointed in place; per-subclass descriptors from\n"
"specialize) on or off for what is created from now on; returns the previous setting.  Off, every payload\n"
"gets a fresh memoryview through the public API.  On is refused (ValueError) where this build has no such\n"
"path (CPYTHON_INTERNALS is False).  For tests and comparisons: the behaviour is the same either way.");

static PyObject *client_use_internals(PyObject *module, PyObject *arg)
{
    int enabled = PyObject_IsTrue(arg);
    if (enabled < 0) return NULL;
    if (enabled && !HAVE_VIEW_INTERNALS) {
        PyErr_SetString(PyExc_ValueError, "this build of logbuf._client has no CPython-internals fast path");
        return NULL;
    }
    int previous = use_internals;
    use_internals = enabled;
    return PyBool_FromLong(previous);
}

static PyObject *client_specialize(PyObject *module, PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "specialize() takes a class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    if (!PyType_IsSubtype(type, &PublicationType) && !PyType_IsSubtype(type, &ImageType)) {
        PyErr_SetString(PyExc_TypeError, "specialize() takes a subclass of Publication or Image");
        return NULL;
    }
    /* without the specialising interpreter (or with the internals off) the inherited descriptors serve: the
     * same methods, on the generic call path */
    if (!HAVE_SPECIALIZER || !use_internals) Py_RETURN_NONE;
    int r = PyType_IsSubtype(type, &PublicationType)
                ? define_own_descriptors(type, PublicationType.tp_methods, hot_publication_methods)
                : define_own_descriptors(type, ImageType.tp_methods, hot_image_methods);
    if (r < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef client_functions[] = {
    {"specialize", (PyCFunction)client_specialize, METH_O, specialize_doc},
    {"_use_cpython_internals", (PyCFunction)client_use_internals, METH_O, use_internals_doc},
    {NULL}};

static struct PyModuleDef client_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "logbuf._client",
    .m_doc = "Extension types of logbuf's client data path (offer, claims, poll, fragment assembly).",
    .m_size = -1,
    .m_methods = client_functions,
};

PyMODINIT_FUNC PyInit__client(void)
{
    if (load_errors() < 0) return NULL;
    PyTypeObject *types[] = {&LogMappingType, &HeaderType, &PublicationType, &BufferClaimType, &ImageType,
                             &FragmentAssemblerType, &MappingGuardType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyType_Ready(types[i]) < 0) return NULL;
    }
    PyObject *m = PyModule_Create(&client_module);
    if (m == NULL) return NULL;
    const char *names[] = {"LogMapping", "Header", "Publication", "BufferClaim", "Image", "FragmentAssembler",
                           "MappingGuard"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0) goto fail;
    }
    if (add_table(m, "LAYOUT", layout_table()) < 0 || add_table(m, "CONTROL_LAYOUT", control_layout_table()) < 0
        || add_codes(m) < 0) {
        goto fail;
    }
    if (PyModule_AddIntConstant(m, "NOT_CONNECTED", LB_NOT_CONNECTED) < 0
        || PyModule_AddIntConstant(m, "BACK_PRESSURED", LB_BACK_PRESSURED) < 0
        || PyModule_AddIntConstant(m, "ADMIN_ACTION", LB_ADMIN_ACTION) < 0
        || PyModule_AddIntConstant(m, "CLOSED", LB_CLOSED) < 0
        || PyModule_AddIntConstant(m, "MAX_POSITION_EXCEEDED", LB_MAX_POSITION_EXCEEDED) < 0
        || PyModule_AddObjectRef(m, "CPYTHON_INTERNALS", HAVE_VIEW_INTERNALS ? Py_True : Py_False) < 0) {
        goto fail;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
