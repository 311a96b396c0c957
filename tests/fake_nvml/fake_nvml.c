/*
 * fake_nvml.c - a stand-in for libnvidia-ml.so.1 for tests without a GPU.
 *
 * Part of llmgw-facility's test suite. The exported functions keep NVML's
 * names and C ABI (as used by the nvidia-ml-py / pynvml ctypes bindings), so
 * pynvml runs unchanged against this library. What it reports comes from a
 * JSON file named by $FAKE_NVML_CONFIG; see README.md beside this file for
 * the format. The file is read at nvmlInit* and read again whenever it
 * changes (inode, size or nanosecond mtime), checked at the start of every
 * device-level and system-level call.
 *
 * Power limits set through nvmlDeviceSetPowerManagementLimit are the
 * driver's state, not the file's: kept per GPU uuid across re-reads and
 * nvmlShutdown (as the driver keeps them until reboot), and, when
 * $FAKE_NVML_STATE names a file, written there after every set and read
 * back at nvmlInit*, so that a limit outlives the process that set it.
 *
 * Build: gcc -shared -fPIC -O2 -Wall -Wextra -Werror -o libnvidia-ml.so.1 fake_nvml.c
 * No dependency beyond libc. Thread-safe: one mutex guards all state.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* NVML ABI                                                                  */
/* ------------------------------------------------------------------------ */

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_UNKNOWN 999

#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_TEMPERATURE_GPU 0
#define NVML_TEMPERATURE_THRESHOLD_SHUTDOWN 0
#define NVML_TEMPERATURE_THRESHOLD_SLOWDOWN 1

/* Opaque device handle: a pointer into one of the static arrays below. */
struct fake_handle {
    unsigned char tag;
};
typedef struct fake_handle *nvmlDevice_t;

/* pynvml c_nvmlValue_t */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

/* pynvml c_nvmlFieldValue_t */
typedef struct {
    uint32_t fieldId;
    uint32_t scopeId;
    int64_t timestamp;
    int64_t latencyUsec;
    int valueType;     /* nvmlValueType_t */
    int nvmlReturn;    /* nvmlReturn_t */
    nvmlValue_t value;
} nvmlFieldValue_t;

/* pynvml c_nvmlProcessInfo_v2_t (== _v3_t == unversioned in pynvml) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* pynvml c_nvmlDeviceAttributes */
typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

_Static_assert(sizeof(nvmlValue_t) == 8, "nvmlValue_t layout");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");
_Static_assert(offsetof(nvmlFieldValue_t, value) == 32, "nvmlFieldValue_t layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");
_Static_assert(sizeof(nvmlDeviceAttributes_t) == 40, "nvmlDeviceAttributes_t layout");

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------------ */
/* Error codes and their strings                                             */
/* ------------------------------------------------------------------------ */

struct err_desc {
    int code;
    const char *name;   /* without the NVML_ERROR_ prefix */
    const char *text;   /* what nvmlErrorString returns */
};

static const struct err_desc k_errors[] = {
    {0, "SUCCESS", "Success"},
    {1, "UNINITIALIZED", "Uninitialized"},
    {2, "INVALID_ARGUMENT", "Invalid Argument"},
    {3, "NOT_SUPPORTED", "Not Supported"},
    {4, "NO_PERMISSION", "Insufficient Permissions"},
    {5, "ALREADY_INITIALIZED", "Already Initialized"},
    {6, "NOT_FOUND", "Not Found"},
    {7, "INSUFFICIENT_SIZE", "Insufficient Size"},
    {8, "INSUFFICIENT_POWER", "Insufficient External Power"},
    {9, "DRIVER_NOT_LOADED", "Driver Not Loaded"},
    {10, "TIMEOUT", "Timeout"},
    {11, "IRQ_ISSUE", "Interrupt request issue"},
    {12, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"},
    {13, "FUNCTION_NOT_FOUND", "Function Not Found"},
    {14, "CORRUPTED_INFOROM", "Corrupted infoROM"},
    {15, "GPU_IS_LOST", "GPU is lost"},
    {16, "RESET_REQUIRED", "GPU requires restart"},
    {17, "OPERATING_SYSTEM", "The operating system has blocked the request."},
    {18, "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."},
    {19, "IN_USE", "In use by another client"},
    {20, "MEMORY", "Insufficient Memory"},
    {21, "NO_DATA", "No data"},
    {22, "VGPU_ECC_NOT_SUPPORTED",
     "The requested vgpu operation is not available on target device, because ECC is enabled"},
    {23, "INSUFFICIENT_RESOURCES", "Ran out of critical resources, other than memory"},
    {24, "FREQ_NOT_SUPPORTED", "The requested frequency is not supported"},
    {25, "ARGUMENT_VERSION_MISMATCH", "The provided version is invalid/unsupported"},
    {26, "DEPRECATED", "The requested functionality has been deprecated"},
    {27, "NOT_READY", "The system is not ready for the request"},
    {28, "GPU_NOT_FOUND", "No GPUs were found"},
    {29, "INVALID_STATE", "Resource is in invalid state"},
    {30, "RESET_TYPE_NOT_SUPPORTED", "Reset type is not supported"},
    {999, "UNKNOWN", "Unknown Error"},
};

#define N_ERRORS (sizeof(k_errors) / sizeof(k_errors[0]))

/* ------------------------------------------------------------------------ */
/* Exported functions: one id each, for call counting and error lookup      */
/* ------------------------------------------------------------------------ */

#define FAKE_FUNCS(X)                                  \
    X(nvmlInit)                                        \
    X(nvmlInit_v2)                                     \
    X(nvmlInitWithFlags)                               \
    X(nvmlShutdown)                                    \
    X(nvmlErrorString)                                 \
    X(nvmlSystemGetDriverVersion)                      \
    X(nvmlSystemGetNVMLVersion)                        \
    X(nvmlDeviceGetCount)                              \
    X(nvmlDeviceGetCount_v2)                           \
    X(nvmlDeviceGetHandleByIndex)                      \
    X(nvmlDeviceGetHandleByIndex_v2)                   \
    X(nvmlDeviceGetHandleByUUID)                       \
    X(nvmlDeviceGetIndex)                              \
    X(nvmlDeviceGetName)                               \
    X(nvmlDeviceGetUUID)                               \
    X(nvmlDeviceGetTemperature)                        \
    X(nvmlDeviceGetTemperatureThreshold)               \
    X(nvmlDeviceGetFieldValues)                        \
    X(nvmlDeviceGetPowerUsage)                         \
    X(nvmlDeviceGetEnforcedPowerLimit)                 \
    X(nvmlDeviceGetPowerManagementLimit)               \
    X(nvmlDeviceGetPowerManagementLimitConstraints)    \
    X(nvmlDeviceGetPowerManagementDefaultLimit)        \
    X(nvmlDeviceSetPowerManagementLimit)               \
    X(nvmlDeviceGetTotalEnergyConsumption)             \
    X(nvmlDeviceGetCurrentClocksEventReasons)          \
    X(nvmlDeviceGetSupportedClocksEventReasons)        \
    X(nvmlDeviceGetCurrentClocksThrottleReasons)       \
    X(nvmlDeviceGetSupportedClocksThrottleReasons)     \
    X(nvmlDeviceGetMigMode)                            \
    X(nvmlDeviceGetMaxMigDeviceCount)                  \
    X(nvmlDeviceGetMigDeviceHandleByIndex)             \
    X(nvmlDeviceIsMigDeviceHandle)                     \
    X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle)    \
    X(nvmlDeviceGetGpuInstanceId)                      \
    X(nvmlDeviceGetComputeInstanceId)                  \
    X(nvmlDeviceGetAttributes_v2)                      \
    X(nvmlDeviceGetComputeRunningProcesses)            \
    X(nvmlDeviceGetComputeRunningProcesses_v2)         \
    X(nvmlDeviceGetComputeRunningProcesses_v3)

#define AS_ENUM(n) FN_##n,
enum fn_id { FAKE_FUNCS(AS_ENUM) FN_COUNT };
#undef AS_ENUM

#define AS_NAME(n) #n,
static const char *const k_fn_names[FN_COUNT] = {FAKE_FUNCS(AS_NAME)};
#undef AS_NAME

/* ------------------------------------------------------------------------ */
/* Configuration model                                                       */
/* ------------------------------------------------------------------------ */

#define MAX_DEVICES 64
#define MAX_MIG 8
#define NAME_LEN 96
#define UUID_LEN 96
#define PROFILE_LEN 32
#define VERSION_LEN 80
#define FN_NAME_LEN 64
#define MAX_DELAY_MS 600000u
#define NOT_AVAILABLE_U32 0xFFFFFFFFu
#define NOT_AVAILABLE_U64 0xFFFFFFFFFFFFFFFFull

struct opt_u64 {      /* a reading: absent/null means NOT_SUPPORTED */
    int present;
    uint64_t v;
};

struct fn_map_entry {  /* function name -> value (return code or delay) */
    char name[FN_NAME_LEN];
    long value;
};

struct fn_map {
    size_t n;
    struct fn_map_entry *e;
};

struct proc_cfg {
    unsigned int pid;
    uint64_t used;     /* NOT_AVAILABLE_U64 when null */
};

struct proc_list {
    size_t n;
    struct proc_cfg *p;
};

struct mig_cfg {
    unsigned int gi;
    unsigned int ci;
    char profile[PROFILE_LEN];
    char uuid[UUID_LEN];
    unsigned int sm_count;
    unsigned int slices;
    uint64_t memory_size_mb;
    unsigned int ce, dec, enc, jpg, ofa;
    struct proc_list procs;
    struct fn_map errors;
    struct fn_map delays;
};

struct dev_cfg {
    char name[NAME_LEN];
    char uuid[UUID_LEN];
    struct opt_u64 temp, memtemp, slowdown, shutdown;
    struct opt_u64 power, limit, energy, reasons, supported;
    struct opt_u64 default_limit;  /* nvmlDeviceGetPowerManagementDefaultLimit */
    int has_constraints;           /* 0: the card's limit cannot be set (NOT_SUPPORTED) */
    unsigned int min_limit, max_limit;
    struct opt_u64 sm_count;
    uint64_t memory_size_mb;
    int mig_supported;           /* 0: nvmlDeviceGetMigMode -> NOT_SUPPORTED */
    unsigned int mig_current, mig_pending;
    unsigned int max_mig;
    size_t nmig;
    struct mig_cfg mig[MAX_MIG];
    struct proc_list procs;
    struct fn_map errors;
    struct fn_map delays;
};

struct config {
    char driver[VERSION_LEN];
    char nvml[VERSION_LEN];
    struct fn_map errors;
    struct fn_map delays;
    size_t ndev;
    struct dev_cfg *dev;
};

/* Stable handles: same index -> same pointer, across config re-reads. */
static struct fake_handle g_dev_handles[MAX_DEVICES];
static struct fake_handle g_mig_handles[MAX_DEVICES][MAX_MIG];

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount;
static struct config *g_cfg;
static unsigned long long g_calls[FN_COUNT];

struct file_sig {
    dev_t dev;
    ino_t ino;
    off_t size;
    time_t mtime_sec;
    long mtime_nsec;
};

/* Power limits set at run time, by GPU uuid: the driver's state, not the file's. */
struct set_limit {
    char uuid[UUID_LEN];
    unsigned int mw;
};
static struct set_limit g_limits[MAX_DEVICES];
static size_t g_nlimits;

static char *g_path;              /* path the current config came from */
static struct file_sig g_sig;     /* signature of the file it came from */
static int g_have_failed_sig;     /* a re-read of g_failed_sig already failed */
static struct file_sig g_failed_sig;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* one line, whatever the message holds */
    for (char *c = buf; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    fprintf(stderr, "fake_nvml: %s\n", buf);
    fflush(stderr);
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static nvmlReturn_t copy_string(char *dst, unsigned int len, const char *src)
{
    size_t need;
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    need = strlen(src) + 1;
    if ((size_t)len < need)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, need);
    return NVML_SUCCESS;
}

static int lookup_error_name(const char *s, int *code)
{
    const char *name = s;
    if (strncmp(name, "NVML_ERROR_", 11) == 0)
        name += 11;
    else if (strcmp(name, "NVML_SUCCESS") == 0)
        name = "SUCCESS";
    for (size_t i = 0; i < N_ERRORS; i++) {
        if (strcmp(k_errors[i].name, name) == 0) {
            *code = k_errors[i].code;
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* A small JSON parser (RFC 8259), into a tree                               */
/* ------------------------------------------------------------------------ */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jval {
    enum jtype t;
    int line;            /* where the value starts, for messages */
    int b;               /* J_BOOL */
    int is_int;          /* J_NUM: an integer literal (no fraction/exponent) */
    int neg;             /* J_NUM integer: negative */
    uint64_t mag;        /* J_NUM integer: magnitude (valid when !overflow) */
    int overflow;        /* J_NUM integer: magnitude above UINT64_MAX */
    char *s;             /* J_STR */
    size_t n;            /* J_ARR / J_OBJ: number of items */
    struct jval *items;  /* J_ARR / J_OBJ values */
    char **keys;         /* J_OBJ keys */
};

struct jparser {
    const char *p;
    const char *end;
    int line;
    int depth;
    char *err;
    size_t errlen;
};

#define JSON_MAX_DEPTH 64

static void jfree(struct jval *v)
{
    if (v == NULL)
        return;
    free(v->s);
    v->s = NULL;
    for (size_t i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    v->items = NULL;
    v->keys = NULL;
    v->n = 0;
}

static int jfail(struct jparser *ps, const char *what)
{
    if (ps->p >= ps->end)
        set_err(ps->err, ps->errlen, "line %d: %s (at end of input)", ps->line, what);
    else
        set_err(ps->err, ps->errlen, "line %d: %s (at '%c')", ps->line, what,
                (*ps->p >= 0x20 && *ps->p < 0x7f) ? *ps->p : '?');
    return -1;
}

static void jskip_ws(struct jparser *ps)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '\n') {
            ps->line++;
            ps->p++;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            ps->p++;
        } else {
            break;
        }
    }
}

static int jparse_value(struct jparser *ps, struct jval *out);

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int jparse_hex4(struct jparser *ps, unsigned int *cp)
{
    unsigned int v = 0;
    if (ps->end - ps->p < 4)
        return jfail(ps, "short \\u escape");
    for (int i = 0; i < 4; i++) {
        int h = hexval(ps->p[i]);
        if (h < 0)
            return jfail(ps, "bad hex digit in \\u escape");
        v = (v << 4) | (unsigned int)h;
    }
    ps->p += 4;
    *cp = v;
    return 0;
}

/* Parses a string starting at the opening quote; returns a malloc'd copy. */
static int jparse_string(struct jparser *ps, char **out)
{
    size_t cap = 32, len = 0;
    char *buf;
    if (ps->p >= ps->end || *ps->p != '"')
        return jfail(ps, "expected a string");
    ps->p++;
    buf = malloc(cap);
    if (buf == NULL)
        return jfail(ps, "out of memory");
    for (;;) {
        unsigned char c;
        char tmp[4];
        size_t tn = 0;
        if (ps->p >= ps->end) {
            free(buf);
            return jfail(ps, "unterminated string");
        }
        c = (unsigned char)*ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) {
            free(buf);
            return jfail(ps, "control character in string");
        }
        if (c != '\\') {
            tmp[tn++] = (char)c;
            ps->p++;
        } else {
            char e;
            ps->p++;
            if (ps->p >= ps->end) {
                free(buf);
                return jfail(ps, "unterminated escape");
            }
            e = *ps->p++;
            switch (e) {
            case '"': tmp[tn++] = '"'; break;
            case '\\': tmp[tn++] = '\\'; break;
            case '/': tmp[tn++] = '/'; break;
            case 'b': tmp[tn++] = '\b'; break;
            case 'f': tmp[tn++] = '\f'; break;
            case 'n': tmp[tn++] = '\n'; break;
            case 'r': tmp[tn++] = '\r'; break;
            case 't': tmp[tn++] = '\t'; break;
            case 'u': {
                unsigned int cp;
                if (jparse_hex4(ps, &cp) < 0) {
                    free(buf);
                    return -1;
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned int lo;
                    if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                        free(buf);
                        return jfail(ps, "lone high surrogate in \\u escape");
                    }
                    ps->p += 2;
                    if (jparse_hex4(ps, &lo) < 0) {
                        free(buf);
                        return -1;
                    }
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        free(buf);
                        return jfail(ps, "bad low surrogate in \\u escape");
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    free(buf);
                    return jfail(ps, "lone low surrogate in \\u escape");
                }
                if (cp == 0) {
                    free(buf);
                    return jfail(ps, "\\u0000 is not allowed in strings here");
                }
                if (cp < 0x80) {
                    tmp[tn++] = (char)cp;
                } else if (cp < 0x800) {
                    tmp[tn++] = (char)(0xC0 | (cp >> 6));
                    tmp[tn++] = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    tmp[tn++] = (char)(0xE0 | (cp >> 12));
                    tmp[tn++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    tmp[tn++] = (char)(0x80 | (cp & 0x3F));
                } else {
                    tmp[tn++] = (char)(0xF0 | (cp >> 18));
                    tmp[tn++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    tmp[tn++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    tmp[tn++] = (char)(0x80 | (cp & 0x3F));
                }
                break;
            }
            default:
                ps->p--;
                free(buf);
                return jfail(ps, "bad escape in string");
            }
        }
        if (len + tn + 1 > cap) {
            char *nb;
            while (len + tn + 1 > cap)
                cap *= 2;
            nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                return jfail(ps, "out of memory");
            }
            buf = nb;
        }
        memcpy(buf + len, tmp, tn);
        len += tn;
    }
    buf[len] = '\0';
    *out = buf;
    return 0;
}

static int jparse_number(struct jparser *ps, struct jval *out)
{
    int is_int = 1, neg = 0, overflow = 0;
    uint64_t mag = 0;
    if (ps->p < ps->end && *ps->p == '-') {
        neg = 1;
        ps->p++;
    }
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return jfail(ps, "bad number");
    if (*ps->p == '0' && ps->p + 1 < ps->end && ps->p[1] >= '0' && ps->p[1] <= '9')
        return jfail(ps, "leading zero in number");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        unsigned int d = (unsigned int)(*ps->p - '0');
        if (mag > (UINT64_MAX - d) / 10)
            overflow = 1;
        else
            mag = mag * 10 + d;
        ps->p++;
    }
    if (ps->p < ps->end && *ps->p == '.') {
        is_int = 0;
        ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return jfail(ps, "bad fraction in number");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        is_int = 0;
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
            ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return jfail(ps, "bad exponent in number");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            ps->p++;
    }
    out->t = J_NUM;
    out->is_int = is_int;
    out->neg = neg;
    out->mag = mag;
    out->overflow = overflow;
    return 0;
}

static int jliteral(struct jparser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return jfail(ps, "unexpected token");
    ps->p += n;
    return 0;
}

static int jpush(struct jval *arr, size_t *cap, int with_keys)
{
    if (arr->n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 8;
        struct jval *ni = realloc(arr->items, ncap * sizeof *ni);
        if (ni == NULL)
            return -1;
        arr->items = ni;
        if (with_keys) {
            char **nk = realloc(arr->keys, ncap * sizeof *nk);
            if (nk == NULL)
                return -1;
            arr->keys = nk;
        }
        *cap = ncap;
    }
    memset(&arr->items[arr->n], 0, sizeof arr->items[arr->n]);
    if (with_keys)
        arr->keys[arr->n] = NULL;
    arr->n++;
    return 0;
}

static int jparse_container(struct jparser *ps, struct jval *out, int is_obj)
{
    size_t cap = 0;
    char close = is_obj ? '}' : ']';
    out->t = is_obj ? J_OBJ : J_ARR;
    ps->p++; /* '{' or '[' */
    if (++ps->depth > JSON_MAX_DEPTH)
        return jfail(ps, "nesting too deep");
    jskip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        ps->depth--;
        return 0;
    }
    for (;;) {
        struct jval *slot;
        jskip_ws(ps);
        if (jpush(out, &cap, is_obj) < 0)
            return jfail(ps, "out of memory");
        slot = &out->items[out->n - 1];
        if (is_obj) {
            char *key = NULL;
            if (jparse_string(ps, &key) < 0)
                return -1;
            out->keys[out->n - 1] = key;
            for (size_t i = 0; i + 1 < out->n; i++) {
                if (strcmp(out->keys[i], key) == 0) {
                    set_err(ps->err, ps->errlen, "line %d: duplicate key \"%s\"", ps->line, key);
                    return -1;
                }
            }
            jskip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return jfail(ps, "expected ':' after key");
            ps->p++;
            jskip_ws(ps);
        }
        if (jparse_value(ps, slot) < 0)
            return -1;
        jskip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            ps->depth--;
            return 0;
        }
        return jfail(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int jparse_value(struct jparser *ps, struct jval *out)
{
    memset(out, 0, sizeof *out);
    jskip_ws(ps);
    out->line = ps->line;
    if (ps->p >= ps->end)
        return jfail(ps, "expected a value");
    switch (*ps->p) {
    case '{':
        return jparse_container(ps, out, 1);
    case '[':
        return jparse_container(ps, out, 0);
    case '"':
        out->t = J_STR;
        return jparse_string(ps, &out->s);
    case 't':
        out->t = J_BOOL;
        out->b = 1;
        return jliteral(ps, "true");
    case 'f':
        out->t = J_BOOL;
        out->b = 0;
        return jliteral(ps, "false");
    case 'n':
        out->t = J_NULL;
        return jliteral(ps, "null");
    default:
        return jparse_number(ps, out);
    }
}

static int json_parse(const char *text, size_t len, struct jval *out, char *err, size_t errlen)
{
    struct jparser ps = {text, text + len, 1, 0, err, errlen};
    /* tolerate a UTF-8 byte order mark */
    if (len >= 3 && (unsigned char)text[0] == 0xEF && (unsigned char)text[1] == 0xBB &&
        (unsigned char)text[2] == 0xBF)
        ps.p += 3;
    if (jparse_value(&ps, out) < 0) {
        jfree(out);
        return -1;
    }
    jskip_ws(&ps);
    if (ps.p != ps.end) {
        jfail(&ps, "trailing characters after the JSON value");
        jfree(out);
        return -1;
    }
    return 0;
}

static const struct jval *jget(const struct jval *obj, const char *key)
{
    for (size_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return &obj->items[i];
    return NULL;
}

static const char *jtype_name(enum jtype t)
{
    switch (t) {
    case J_NULL: return "null";
    case J_BOOL: return "a boolean";
    case J_NUM: return "a number";
    case J_STR: return "a string";
    case J_ARR: return "an array";
    case J_OBJ: return "an object";
    }
    return "?";
}

/* ------------------------------------------------------------------------ */
/* JSON tree -> config                                                       */
/* ------------------------------------------------------------------------ */

static void free_fn_map(struct fn_map *m)
{
    free(m->e);
    m->e = NULL;
    m->n = 0;
}

static void free_procs(struct proc_list *l)
{
    free(l->p);
    l->p = NULL;
    l->n = 0;
}

static void free_config(struct config *c)
{
    if (c == NULL)
        return;
    free_fn_map(&c->errors);
    free_fn_map(&c->delays);
    for (size_t i = 0; i < c->ndev; i++) {
        struct dev_cfg *d = &c->dev[i];
        for (size_t k = 0; k < d->nmig; k++) {
            free_procs(&d->mig[k].procs);
            free_fn_map(&d->mig[k].errors);
            free_fn_map(&d->mig[k].delays);
        }
        free_procs(&d->procs);
        free_fn_map(&d->errors);
        free_fn_map(&d->delays);
    }
    free(c->dev);
    free(c);
}

/* Keys starting with '_' are comments; any other key must be known. */
static int check_keys(const struct jval *obj, const char *const *allowed, const char *where,
                      char *err, size_t errlen)
{
    for (size_t i = 0; i < obj->n; i++) {
        const char *k = obj->keys[i];
        int ok = (k[0] == '_');
        for (size_t j = 0; !ok && allowed[j]; j++)
            ok = (strcmp(allowed[j], k) == 0);
        if (!ok) {
            set_err(err, errlen, "line %d: unknown key \"%s\" in %s", obj->items[i].line, k,
                    where);
            return -1;
        }
    }
    return 0;
}

static int want_uint(const struct jval *v, uint64_t max, const char *where, uint64_t *out,
                     char *err, size_t errlen)
{
    if (v->t != J_NUM || !v->is_int) {
        set_err(err, errlen, "line %d: %s must be an integer, got %s", v->line, where,
                v->t == J_NUM ? "a fraction" : jtype_name(v->t));
        return -1;
    }
    if ((v->neg && v->mag != 0) || v->overflow || v->mag > max) {
        set_err(err, errlen, "line %d: %s out of range (0..%llu)", v->line, where,
                (unsigned long long)max);
        return -1;
    }
    *out = v->mag;
    return 0;
}

/* An optional reading: absent or null -> not present (NOT_SUPPORTED). */
static int opt_uint(const struct jval *obj, const char *key, uint64_t max, const char *where,
                    struct opt_u64 *out, char *err, size_t errlen)
{
    const struct jval *v = jget(obj, key);
    char what[384];
    out->present = 0;
    out->v = 0;
    if (v == NULL || v->t == J_NULL)
        return 0;
    snprintf(what, sizeof what, "%s.%s", where, key);
    if (want_uint(v, max, what, &out->v, err, errlen) < 0)
        return -1;
    out->present = 1;
    return 0;
}

/* An optional count with a default when absent or null. */
static int uint_default(const struct jval *obj, const char *key, uint64_t max, uint64_t dflt,
                        const char *where, uint64_t *out, char *err, size_t errlen)
{
    struct opt_u64 o;
    if (opt_uint(obj, key, max, where, &o, err, errlen) < 0)
        return -1;
    *out = o.present ? o.v : dflt;
    return 0;
}

static int want_string(const struct jval *obj, const char *key, int required, const char *dflt,
                       char *dst, size_t dstlen, const char *where, char *err, size_t errlen)
{
    const struct jval *v = jget(obj, key);
    if (v == NULL || v->t == J_NULL) {
        if (required) {
            set_err(err, errlen, "line %d: %s needs \"%s\" (a string)", obj->line, where, key);
            return -1;
        }
        snprintf(dst, dstlen, "%s", dflt);
        return 0;
    }
    if (v->t != J_STR) {
        set_err(err, errlen, "line %d: %s.%s must be a string, got %s", v->line, where, key,
                jtype_name(v->t));
        return -1;
    }
    if (strlen(v->s) + 1 > dstlen) {
        set_err(err, errlen, "line %d: %s.%s is longer than %zu bytes", v->line, where, key,
                dstlen - 1);
        return -1;
    }
    memcpy(dst, v->s, strlen(v->s) + 1);
    return 0;
}

/* "errors": {"fn": code-or-name}, "delays_ms": {"fn": ms} */
static int parse_fn_map(const struct jval *obj, const char *key, int is_errors, const char *where,
                        struct fn_map *out, char *err, size_t errlen)
{
    const struct jval *m = jget(obj, key);
    out->n = 0;
    out->e = NULL;
    if (m == NULL || m->t == J_NULL)
        return 0;
    if (m->t != J_OBJ) {
        set_err(err, errlen, "line %d: %s.%s must be an object (function name -> %s)", m->line,
                where, key, is_errors ? "NVML return code" : "milliseconds");
        return -1;
    }
    if (m->n == 0)
        return 0;
    out->e = calloc(m->n, sizeof *out->e);
    if (out->e == NULL) {
        set_err(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < m->n; i++) {
        const char *fname = m->keys[i];
        const struct jval *v = &m->items[i];
        struct fn_map_entry *e = &out->e[out->n];
        char what[384];
        if (fname[0] == '_')
            continue;
        if (strlen(fname) + 1 > sizeof e->name) {
            set_err(err, errlen, "line %d: function name \"%s\" too long", v->line, fname);
            return -1;
        }
        if (strncmp(fname, "nvml", 4) != 0) {
            set_err(err, errlen, "line %d: %s.%s: \"%s\" is not an NVML function name", v->line,
                    where, key, fname);
            return -1;
        }
        snprintf(what, sizeof what, "%s.%s.%s", where, key, fname);
        memcpy(e->name, fname, strlen(fname) + 1);
        if (is_errors) {
            int code;
            if (v->t == J_STR) {
                if (!lookup_error_name(v->s, &code)) {
                    set_err(err, errlen, "line %d: %s: unknown NVML error name \"%s\"", v->line,
                            what, v->s);
                    return -1;
                }
            } else {
                uint64_t u;
                if (want_uint(v, 1000000, what, &u, err, errlen) < 0)
                    return -1;
                code = (int)u;
            }
            e->value = code;
        } else {
            uint64_t u;
            if (want_uint(v, MAX_DELAY_MS, what, &u, err, errlen) < 0)
                return -1;
            e->value = (long)u;
        }
        out->n++;
    }
    return 0;
}

static int parse_procs(const struct jval *obj, const char *where, struct proc_list *out,
                       char *err, size_t errlen)
{
    static const char *const keys[] = {"pid", "used_memory_bytes", NULL};
    const struct jval *a = jget(obj, "processes");
    out->n = 0;
    out->p = NULL;
    if (a == NULL || a->t == J_NULL)
        return 0;
    if (a->t != J_ARR) {
        set_err(err, errlen, "line %d: %s.processes must be an array", a->line, where);
        return -1;
    }
    if (a->n == 0)
        return 0;
    out->p = calloc(a->n, sizeof *out->p);
    if (out->p == NULL) {
        set_err(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < a->n; i++) {
        const struct jval *p = &a->items[i];
        char what[256];
        struct opt_u64 pid, used;
        snprintf(what, sizeof what, "%s.processes[%zu]", where, i);
        if (p->t != J_OBJ) {
            set_err(err, errlen, "line %d: %s must be an object", p->line, what);
            return -1;
        }
        if (check_keys(p, keys, what, err, errlen) < 0)
            return -1;
        if (opt_uint(p, "pid", UINT32_MAX, what, &pid, err, errlen) < 0)
            return -1;
        if (!pid.present) {
            set_err(err, errlen, "line %d: %s needs \"pid\"", p->line, what);
            return -1;
        }
        if (opt_uint(p, "used_memory_bytes", UINT64_MAX - 1, what, &used, err, errlen) < 0)
            return -1;
        out->p[i].pid = (unsigned int)pid.v;
        out->p[i].used = used.present ? used.v : NOT_AVAILABLE_U64;
        out->n++;
    }
    return 0;
}

static unsigned int slices_from_profile(const char *profile)
{
    /* "3g.40gb" -> 3; "1c.3g.40gb" (a compute-instance profile) -> 3 */
    const char *g;
    const char *s = profile;
    unsigned int n = 0;
    const char *dot = strchr(profile, '.');
    if (dot && dot[1] >= '0' && dot[1] <= '9' && dot > profile && dot[-1] == 'c')
        s = dot + 1;
    g = strchr(s, 'g');
    if (g == NULL)
        return 0;
    for (const char *c = s; c < g; c++) {
        if (*c < '0' || *c > '9')
            return 0;
        n = n * 10 + (unsigned int)(*c - '0');
        if (n > 64)
            return 0;
    }
    return n;
}

static int parse_mig(const struct jval *m, const char *where, struct mig_cfg *out, char *err,
                     size_t errlen)
{
    static const char *const keys[] = {
        "gpu_instance_id", "compute_instance_id", "profile", "sm_count", "uuid",
        "memory_size_mb", "shared_copy_engine_count", "shared_decoder_count",
        "shared_encoder_count", "shared_jpeg_count", "shared_ofa_count",
        "gpu_instance_slice_count", "processes", "errors", "delays_ms", NULL};
    struct opt_u64 gi, sm;
    uint64_t u;
    if (m->t != J_OBJ) {
        set_err(err, errlen, "line %d: %s must be an object", m->line, where);
        return -1;
    }
    if (check_keys(m, keys, where, err, errlen) < 0)
        return -1;
    if (opt_uint(m, "gpu_instance_id", UINT32_MAX - 1, where, &gi, err, errlen) < 0)
        return -1;
    if (!gi.present) {
        set_err(err, errlen, "line %d: %s needs \"gpu_instance_id\"", m->line, where);
        return -1;
    }
    out->gi = (unsigned int)gi.v;
    if (uint_default(m, "compute_instance_id", UINT32_MAX - 1, 0, where, &u, err, errlen) < 0)
        return -1;
    out->ci = (unsigned int)u;
    if (want_string(m, "profile", 1, "", out->profile, sizeof out->profile, where, err,
                    errlen) < 0)
        return -1;
    if (want_string(m, "uuid", 1, "", out->uuid, sizeof out->uuid, where, err, errlen) < 0)
        return -1;
    if (opt_uint(m, "sm_count", UINT32_MAX, where, &sm, err, errlen) < 0)
        return -1;
    if (!sm.present) {
        set_err(err, errlen, "line %d: %s needs \"sm_count\"", m->line, where);
        return -1;
    }
    out->sm_count = (unsigned int)sm.v;
    if (uint_default(m, "gpu_instance_slice_count", 64, slices_from_profile(out->profile),
                     where, &u, err, errlen) < 0)
        return -1;
    out->slices = (unsigned int)u;
    if (uint_default(m, "memory_size_mb", UINT64_MAX, 0, where, &out->memory_size_mb, err,
                     errlen) < 0)
        return -1;
#define COUNT_KEY(key, field)                                                            \
    do {                                                                                 \
        if (uint_default(m, key, UINT32_MAX, 0, where, &u, err, errlen) < 0)             \
            return -1;                                                                   \
        out->field = (unsigned int)u;                                                    \
    } while (0)
    COUNT_KEY("shared_copy_engine_count", ce);
    COUNT_KEY("shared_decoder_count", dec);
    COUNT_KEY("shared_encoder_count", enc);
    COUNT_KEY("shared_jpeg_count", jpg);
    COUNT_KEY("shared_ofa_count", ofa);
#undef COUNT_KEY
    if (parse_procs(m, where, &out->procs, err, errlen) < 0)
        return -1;
    if (parse_fn_map(m, "errors", 1, where, &out->errors, err, errlen) < 0)
        return -1;
    if (parse_fn_map(m, "delays_ms", 0, where, &out->delays, err, errlen) < 0)
        return -1;
    return 0;
}

static int parse_device(const struct jval *d, size_t idx, struct dev_cfg *out, char *err,
                        size_t errlen)
{
    static const char *const keys[] = {
        "name", "uuid", "temperature_c", "memory_temperature_c", "slowdown_temperature_c",
        "shutdown_temperature_c", "power_mw", "enforced_power_limit_mw", "total_energy_mj",
        "clocks_event_reasons", "supported_clocks_event_reasons", "multiprocessor_count",
        "memory_size_mb", "mig_mode", "max_mig_device_count", "mig_instances", "processes",
        "errors", "delays_ms", "default_power_limit_mw", "power_limit_constraints_mw", NULL};
    char where[64];
    const struct jval *mig, *mode;
    uint64_t u;
    snprintf(where, sizeof where, "devices[%zu]", idx);
    if (d->t != J_OBJ) {
        set_err(err, errlen, "line %d: %s must be an object", d->line, where);
        return -1;
    }
    if (check_keys(d, keys, where, err, errlen) < 0)
        return -1;
    if (want_string(d, "name", 1, "", out->name, sizeof out->name, where, err, errlen) < 0)
        return -1;
    if (want_string(d, "uuid", 1, "", out->uuid, sizeof out->uuid, where, err, errlen) < 0)
        return -1;
#define READING(key, field, max)                                                   \
    do {                                                                           \
        if (opt_uint(d, key, max, where, &out->field, err, errlen) < 0)            \
            return -1;                                                             \
    } while (0)
    READING("temperature_c", temp, UINT32_MAX);
    READING("memory_temperature_c", memtemp, UINT32_MAX);
    READING("slowdown_temperature_c", slowdown, UINT32_MAX);
    READING("shutdown_temperature_c", shutdown, UINT32_MAX);
    READING("power_mw", power, UINT32_MAX);
    READING("enforced_power_limit_mw", limit, UINT32_MAX);
    READING("total_energy_mj", energy, UINT64_MAX);
    READING("clocks_event_reasons", reasons, UINT64_MAX);
    READING("supported_clocks_event_reasons", supported, UINT64_MAX);
    READING("multiprocessor_count", sm_count, UINT32_MAX);
    READING("default_power_limit_mw", default_limit, UINT32_MAX);
#undef READING
    {
        /* [min, max] in mW: the range nvmlDeviceSetPowerManagementLimit accepts */
        const struct jval *range = jget(d, "power_limit_constraints_mw");
        uint64_t lo, hi;
        out->has_constraints = 0;
        if (range != NULL && range->t != J_NULL) {
            if (range->t != J_ARR || range->n != 2) {
                set_err(err, errlen, "line %d: %s.power_limit_constraints_mw must be null or "
                        "[min, max]", range->line, where);
                return -1;
            }
            if (want_uint(&range->items[0], UINT32_MAX, "power_limit_constraints_mw[0]", &lo, err,
                          errlen) < 0 ||
                want_uint(&range->items[1], UINT32_MAX, "power_limit_constraints_mw[1]", &hi, err,
                          errlen) < 0)
                return -1;
            if (lo > hi) {
                set_err(err, errlen, "line %d: %s.power_limit_constraints_mw: min %llu is above "
                        "max %llu", range->line, where, (unsigned long long)lo,
                        (unsigned long long)hi);
                return -1;
            }
            out->has_constraints = 1;
            out->min_limit = (unsigned int)lo;
            out->max_limit = (unsigned int)hi;
        }
    }
    if (uint_default(d, "memory_size_mb", UINT64_MAX, 0, where, &out->memory_size_mb, err,
                     errlen) < 0)
        return -1;

    mig = jget(d, "mig_instances");
    out->nmig = 0;
    if (mig != NULL && mig->t != J_NULL) {
        if (mig->t != J_ARR) {
            set_err(err, errlen, "line %d: %s.mig_instances must be an array", mig->line, where);
            return -1;
        }
        if (mig->n > MAX_MIG) {
            set_err(err, errlen, "line %d: %s.mig_instances: at most %d instances", mig->line,
                    where, MAX_MIG);
            return -1;
        }
        for (size_t k = 0; k < mig->n; k++) {
            char mwhere[128];
            snprintf(mwhere, sizeof mwhere, "%s.mig_instances[%zu]", where, k);
            /* count first, so free_config releases what a failed parse allocated */
            out->nmig = k + 1;
            if (parse_mig(&mig->items[k], mwhere, &out->mig[k], err, errlen) < 0)
                return -1;
        }
    }

    /* mig_mode: absent -> from mig_instances; null -> NOT_SUPPORTED; [current, pending] */
    mode = jget(d, "mig_mode");
    if (mode == NULL) {
        out->mig_supported = 1;
        out->mig_current = out->mig_pending = out->nmig > 0 ? 1 : 0;
    } else if (mode->t == J_NULL) {
        out->mig_supported = 0;
    } else {
        uint64_t cur, pend;
        if (mode->t != J_ARR || mode->n != 2) {
            set_err(err, errlen, "line %d: %s.mig_mode must be null or [current, pending]",
                    mode->line, where);
            return -1;
        }
        if (want_uint(&mode->items[0], 1, "mig_mode[0]", &cur, err, errlen) < 0 ||
            want_uint(&mode->items[1], 1, "mig_mode[1]", &pend, err, errlen) < 0)
            return -1;
        out->mig_supported = 1;
        out->mig_current = (unsigned int)cur;
        out->mig_pending = (unsigned int)pend;
    }
    if (out->nmig > 0 && !(out->mig_supported && out->mig_current == 1)) {
        set_err(err, errlen, "line %d: %s has mig_instances but its mig_mode is not current=1",
                d->line, where);
        return -1;
    }
    if (uint_default(d, "max_mig_device_count", MAX_MIG, out->mig_supported && out->nmig ? 7 : 0,
                     where, &u, err, errlen) < 0)
        return -1;
    out->max_mig = (unsigned int)u;
    if (out->max_mig < out->nmig) {
        set_err(err, errlen, "line %d: %s.max_mig_device_count is less than mig_instances",
                d->line, where);
        return -1;
    }
    if (parse_procs(d, where, &out->procs, err, errlen) < 0)
        return -1;
    if (parse_fn_map(d, "errors", 1, where, &out->errors, err, errlen) < 0)
        return -1;
    if (parse_fn_map(d, "delays_ms", 0, where, &out->delays, err, errlen) < 0)
        return -1;
    return 0;
}

static struct config *build_config(const struct jval *root, char *err, size_t errlen)
{
    static const char *const keys[] = {"driver_version", "nvml_version", "errors", "delays_ms",
                                       "devices", NULL};
    struct config *c;
    const struct jval *devs;
    if (root->t != J_OBJ) {
        set_err(err, errlen, "the top level must be an object, got %s", jtype_name(root->t));
        return NULL;
    }
    if (check_keys(root, keys, "the top level", err, errlen) < 0)
        return NULL;
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    if (want_string(root, "driver_version", 0, "550.54.15", c->driver, sizeof c->driver,
                    "the top level", err, errlen) < 0)
        goto fail;
    {
        char dflt[VERSION_LEN + 8];
        snprintf(dflt, sizeof dflt, "12.%s", c->driver);
        dflt[VERSION_LEN - 1] = '\0';
        if (want_string(root, "nvml_version", 0, dflt, c->nvml, sizeof c->nvml, "the top level",
                        err, errlen) < 0)
            goto fail;
    }
    if (parse_fn_map(root, "errors", 1, "the top level", &c->errors, err, errlen) < 0)
        goto fail;
    if (parse_fn_map(root, "delays_ms", 0, "the top level", &c->delays, err, errlen) < 0)
        goto fail;
    devs = jget(root, "devices");
    if (devs != NULL && devs->t != J_NULL) {
        if (devs->t != J_ARR) {
            set_err(err, errlen, "line %d: \"devices\" must be an array", devs->line);
            goto fail;
        }
        if (devs->n > MAX_DEVICES) {
            set_err(err, errlen, "line %d: at most %d devices", devs->line, MAX_DEVICES);
            goto fail;
        }
        if (devs->n > 0) {
            c->dev = calloc(devs->n, sizeof *c->dev);
            if (c->dev == NULL) {
                set_err(err, errlen, "out of memory");
                goto fail;
            }
        }
        for (size_t i = 0; i < devs->n; i++) {
            c->ndev = i + 1;
            if (parse_device(&devs->items[i], i, &c->dev[i], err, errlen) < 0)
                goto fail;
        }
    }
    return c;
fail:
    free_config(c);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Loading and re-reading the file                                           */
/* ------------------------------------------------------------------------ */

static void sig_of(const struct stat *st, struct file_sig *sig)
{
    memset(sig, 0, sizeof *sig);
    sig->dev = st->st_dev;
    sig->ino = st->st_ino;
    sig->size = st->st_size;
    sig->mtime_sec = st->st_mtim.tv_sec;
    sig->mtime_nsec = st->st_mtim.tv_nsec;
}

static int sig_equal(const struct file_sig *a, const struct file_sig *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_sec == b->mtime_sec && a->mtime_nsec == b->mtime_nsec;
}

/*
 * Reads and parses `path`. On success returns the new config and fills *sig
 * with the signature of what was read; on failure returns NULL, with the
 * reason in err (and *sig filled when the file could at least be stat'ed).
 */
static struct config *read_config(const char *path, struct file_sig *sig, int *have_sig,
                                  char *err, size_t errlen)
{
    FILE *f;
    struct stat st;
    char *text = NULL;
    size_t len = 0, cap;
    struct jval root;
    struct config *c;
    char perr[512];

    *have_sig = 0;
    f = fopen(path, "rb");
    if (f == NULL) {
        set_err(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) != 0) {
        set_err(err, errlen, "cannot stat %s: %s", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    sig_of(&st, sig);
    *have_sig = 1;
    if (!S_ISREG(st.st_mode)) {
        set_err(err, errlen, "%s is not a regular file", path);
        fclose(f);
        return NULL;
    }
    cap = (size_t)st.st_size + 1;
    if (st.st_size > 64 * 1024 * 1024) {
        set_err(err, errlen, "%s is larger than 64 MiB", path);
        fclose(f);
        return NULL;
    }
    text = malloc(cap);
    if (text == NULL) {
        set_err(err, errlen, "out of memory reading %s", path);
        fclose(f);
        return NULL;
    }
    for (;;) {
        size_t got;
        if (len + 1 >= cap) {
            char *nt = realloc(text, cap * 2);
            if (nt == NULL) {
                free(text);
                fclose(f);
                set_err(err, errlen, "out of memory reading %s", path);
                return NULL;
            }
            text = nt;
            cap *= 2;
        }
        got = fread(text + len, 1, cap - 1 - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        set_err(err, errlen, "cannot read %s: %s", path, strerror(errno));
        free(text);
        fclose(f);
        return NULL;
    }
    fclose(f);
    text[len] = '\0';
    if (memchr(text, '\0', len) != NULL) {
        set_err(err, errlen, "%s: contains a NUL byte", path);
        free(text);
        return NULL;
    }
    if (json_parse(text, len, &root, perr, sizeof perr) < 0) {
        set_err(err, errlen, "%s: invalid JSON: %s", path, perr);
        free(text);
        return NULL;
    }
    free(text);
    c = build_config(&root, perr, sizeof perr);
    jfree(&root);
    if (c == NULL) {
        set_err(err, errlen, "%s: %s", path, perr);
        return NULL;
    }
    return c;
}

static void install_config(struct config *c, const char *path, const struct file_sig *sig)
{
    char *p = strdup(path);
    free_config(g_cfg);
    g_cfg = c;
    free(g_path);
    g_path = p; /* NULL on OOM: forces a re-read next time, which is harmless */
    g_sig = *sig;
    g_have_failed_sig = 0;
}

/* ------------------------------------------------------------------------ */
/* Power limits set at run time, and their state file ($FAKE_NVML_STATE)    */
/* ------------------------------------------------------------------------ */

static struct set_limit *find_limit(const char *uuid)
{
    for (size_t i = 0; i < g_nlimits; i++)
        if (strcmp(g_limits[i].uuid, uuid) == 0)
            return &g_limits[i];
    return NULL;
}

/* JSON string body: quotes, backslashes and control characters escaped. */
static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/*
 * {"power_limits_mw": {"<uuid>": mW, ...}} written to a temporary name and
 * renamed over $FAKE_NVML_STATE, so a reader never sees half a file.
 * Returns 0, or -1 with one line on stderr. Unset: nothing to write.
 */
static int write_state(const char *fn)
{
    const char *path = getenv("FAKE_NVML_STATE");
    char tmp[4096];
    FILE *f;
    int ok;
    if (path == NULL || path[0] == '\0')
        return 0;
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        log_line("%s: FAKE_NVML_STATE path too long", fn);
        return -1;
    }
    f = fopen(tmp, "w");
    if (f == NULL) {
        log_line("%s: cannot write %s: %s", fn, tmp, strerror(errno));
        return -1;
    }
    fputs("{\"power_limits_mw\": {", f);
    for (size_t i = 0; i < g_nlimits; i++) {
        fputs(i ? ", " : "", f);
        put_json_string(f, g_limits[i].uuid);
        fprintf(f, ": %u", g_limits[i].mw);
    }
    fputs("}}\n", f);
    ok = !ferror(f);
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        log_line("%s: cannot write %s: %s", fn, path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

/*
 * At nvmlInit*: when $FAKE_NVML_STATE names a file, the limits in it replace
 * those held (the file is what the driver kept); a missing file means none.
 * Returns 0, or -1 with one line on stderr (an unreadable or invalid file).
 */
static int read_state(const char *fn)
{
    const char *path = getenv("FAKE_NVML_STATE");
    FILE *f;
    char text[64 * 1024];
    size_t len;
    struct jval root;
    const struct jval *limits;
    char err[512];
    if (path == NULL || path[0] == '\0')
        return 0;
    f = fopen(path, "rb");
    if (f == NULL) {
        if (errno == ENOENT) {
            g_nlimits = 0;
            return 0;
        }
        log_line("%s: cannot open %s: %s", fn, path, strerror(errno));
        return -1;
    }
    len = fread(text, 1, sizeof text - 1, f);
    if (ferror(f) || !feof(f)) {
        log_line("%s: cannot read %s (or larger than 64 KiB)", fn, path);
        fclose(f);
        return -1;
    }
    fclose(f);
    text[len] = '\0';
    if (json_parse(text, len, &root, err, sizeof err) < 0) {
        log_line("%s: %s: invalid JSON: %s", fn, path, err);
        return -1;
    }
    limits = root.t == J_OBJ ? jget(&root, "power_limits_mw") : NULL;
    if (limits == NULL || limits->t != J_OBJ || limits->n > MAX_DEVICES) {
        log_line("%s: %s: needs {\"power_limits_mw\": {uuid: mW, ...}} (at most %d GPUs)", fn,
                 path, MAX_DEVICES);
        jfree(&root);
        return -1;
    }
    for (size_t i = 0; i < limits->n; i++) {
        uint64_t mw;
        if (strlen(limits->keys[i]) + 1 > UUID_LEN ||
            want_uint(&limits->items[i], UINT32_MAX, limits->keys[i], &mw, err, sizeof err) < 0) {
            log_line("%s: %s: bad entry \"%s\": %s", fn, path, limits->keys[i],
                     strlen(limits->keys[i]) + 1 > UUID_LEN ? "uuid too long" : err);
            jfree(&root);
            return -1;
        }
    }
    g_nlimits = limits->n;
    for (size_t i = 0; i < limits->n; i++) {
        memcpy(g_limits[i].uuid, limits->keys[i], strlen(limits->keys[i]) + 1);
        g_limits[i].mw = (unsigned int)limits->items[i].mag;
    }
    jfree(&root);
    return 0;
}

/* At nvmlInit*: always read. Returns 0 or -1 (with one line on stderr). */
static int load_at_init(const char *fn)
{
    const char *path = getenv("FAKE_NVML_CONFIG");
    char err[768];
    struct file_sig sig;
    int have_sig;
    struct config *c;
    if (path == NULL || path[0] == '\0') {
        log_line("%s: FAKE_NVML_CONFIG is not set; it must name the JSON file that describes "
                 "the fake GPUs", fn);
        return -1;
    }
    c = read_config(path, &sig, &have_sig, err, sizeof err);
    if (c == NULL) {
        log_line("%s: %s", fn, err);
        return -1;
    }
    install_config(c, path, &sig);
    return 0;
}

/*
 * Before a device- or system-level call: re-read the file if it changed.
 * On a failed re-read the call fails with UNKNOWN (one stderr line per
 * distinct failing file version) and the previous config stays.
 */
static nvmlReturn_t maybe_reload(const char *fn)
{
    const char *path = getenv("FAKE_NVML_CONFIG");
    struct stat st;
    struct file_sig now;
    char err[768];
    int have_sig;
    struct config *c;

    if (path == NULL || path[0] == '\0') {
        if (g_cfg != NULL)
            return NVML_SUCCESS; /* unset after init: keep what we have */
        log_line("%s: FAKE_NVML_CONFIG is not set", fn);
        return NVML_ERROR_UNKNOWN;
    }
    if (g_cfg != NULL && g_path != NULL && strcmp(path, g_path) == 0 && stat(path, &st) == 0) {
        sig_of(&st, &now);
        if (sig_equal(&now, &g_sig))
            return NVML_SUCCESS;
    }
    c = read_config(path, &now, &have_sig, err, sizeof err);
    if (c == NULL) {
        if (!(g_have_failed_sig && have_sig && sig_equal(&now, &g_failed_sig)))
            log_line("%s: re-reading the config failed, keeping the previous one: %s", fn, err);
        g_have_failed_sig = have_sig;
        if (have_sig)
            g_failed_sig = now;
        return NVML_ERROR_UNKNOWN;
    }
    install_config(c, path, &now);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Per-call context                                                          */
/* ------------------------------------------------------------------------ */

/* "nvmlFoo_v3" -> length of "nvmlFoo"; otherwise the full length */
static size_t base_len(const char *name)
{
    size_t n = strlen(name);
    size_t i = n;
    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
        i--;
    if (i < n && i >= 2 && name[i - 1] == 'v' && name[i - 2] == '_')
        return i - 2;
    return n;
}

/*
 * Does map key `key` apply to function `fn`? Yes when equal, when the key
 * is the function's name without its _vN suffix ("nvmlDeviceGetCount"
 * covers nvmlDeviceGetCount_v2), and "nvmlInit" also covers
 * nvmlInitWithFlags (what pynvml.nvmlInit() calls).
 */
static int key_applies(const char *key, const char *fn)
{
    size_t bl;
    if (strcmp(key, fn) == 0)
        return 1;
    bl = base_len(fn);
    if (strlen(key) == bl && strncmp(key, fn, bl) == 0)
        return 1;
    if (strcmp(key, "nvmlInit") == 0 && strcmp(fn, "nvmlInitWithFlags") == 0)
        return 1;
    return 0;
}

static int map_lookup(const struct fn_map *m, const char *fn, long *value)
{
    /* an exact key wins over a base-name key */
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->e[i].name, fn) == 0) {
            *value = m->e[i].value;
            return 1;
        }
    for (size_t i = 0; i < m->n; i++)
        if (key_applies(m->e[i].name, fn)) {
            *value = m->e[i].value;
            return 1;
        }
    return 0;
}

enum handle_use {
    H_NONE,      /* no device handle */
    H_PHYS,      /* physical handles only; a MIG handle -> NOT_SUPPORTED */
    H_ANY,       /* physical or MIG */
};

struct call {
    enum fn_id fn;
    int dev;                 /* device index, -1 when none */
    int mig;                 /* MIG index, -1 for a physical handle */
    struct dev_cfg *d;
    struct mig_cfg *m;
};

static int resolve_handle(nvmlDevice_t h, int *dev, int *mig)
{
    uintptr_t p = (uintptr_t)h;
    uintptr_t d0 = (uintptr_t)&g_dev_handles[0];
    uintptr_t m0 = (uintptr_t)&g_mig_handles[0][0];
    if (h == NULL)
        return 0;
    if (p >= d0 && p < d0 + sizeof g_dev_handles) {
        if ((p - d0) % sizeof g_dev_handles[0] != 0)
            return 0;
        *dev = (int)((p - d0) / sizeof g_dev_handles[0]);
        *mig = -1;
        return 1;
    }
    if (p >= m0 && p < m0 + sizeof g_mig_handles) {
        size_t off;
        if ((p - m0) % sizeof g_mig_handles[0][0] != 0)
            return 0;
        off = (p - m0) / sizeof g_mig_handles[0][0];
        *dev = (int)(off / MAX_MIG);
        *mig = (int)(off % MAX_MIG);
        return 1;
    }
    return 0;
}

/* Binds c->d / c->m for a handle against the current config. */
static nvmlReturn_t bind_handle(struct call *c, nvmlDevice_t h)
{
    int dev, mig;
    c->d = NULL;
    c->m = NULL;
    if (!resolve_handle(h, &dev, &mig))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_cfg == NULL || (size_t)dev >= g_cfg->ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    c->dev = dev;
    c->mig = mig;
    c->d = &g_cfg->dev[dev];
    if (mig >= 0) {
        if ((size_t)mig >= c->d->nmig || c->d->mig_current != 1)
            return NVML_ERROR_INVALID_ARGUMENT; /* the instance went away */
        c->m = &c->d->mig[mig];
    }
    return NVML_SUCCESS;
}

static void sleep_ms(long ms)
{
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static long delay_for(const struct call *c)
{
    long v;
    const char *name = k_fn_names[c->fn];
    if (c->m && map_lookup(&c->m->delays, name, &v))
        return v;
    if (c->d && map_lookup(&c->d->delays, name, &v))
        return v;
    if (g_cfg && map_lookup(&g_cfg->delays, name, &v))
        return v;
    return 0;
}

/*
 * Common prologue of every device- and system-level call. Takes the lock
 * (the caller must call leave()). Order: initialised? -> re-read the file
 * -> valid handle? -> injected delay -> injected error (MIG instance map,
 * then the device map, then the library map) -> MIG handle where only a
 * physical one makes sense.
 */
static nvmlReturn_t enter(struct call *c, enum fn_id fn, nvmlDevice_t h, enum handle_use use)
{
    nvmlReturn_t r;
    long v, delay;
    const char *name = k_fn_names[fn];

    memset(c, 0, sizeof *c);
    c->fn = fn;
    c->dev = -1;
    c->mig = -1;
    pthread_mutex_lock(&g_lock);
    g_calls[fn]++;
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    r = maybe_reload(name);
    if (r != NVML_SUCCESS)
        return r;
    if (use != H_NONE) {
        r = bind_handle(c, h);
        if (r != NVML_SUCCESS)
            return r;
    }
    delay = delay_for(c);
    if (delay > 0) {
        pthread_mutex_unlock(&g_lock);
        sleep_ms(delay);
        pthread_mutex_lock(&g_lock);
        /* the world may have changed while we slept */
        if (g_refcount == 0)
            return NVML_ERROR_UNINITIALIZED;
        r = maybe_reload(name);
        if (r != NVML_SUCCESS)
            return r;
        if (use != H_NONE) {
            r = bind_handle(c, h);
            if (r != NVML_SUCCESS)
                return r;
        }
    }
    /* the most specific map that names the function decides; 0 means "no error" */
    if ((c->m && map_lookup(&c->m->errors, name, &v)) ||
        (c->d && map_lookup(&c->d->errors, name, &v)) || map_lookup(&g_cfg->errors, name, &v)) {
        if (v != NVML_SUCCESS)
            return (nvmlReturn_t)v;
    }
    if (use == H_PHYS && c->m != NULL)
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t r)
{
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Library                                                                   */
/* ------------------------------------------------------------------------ */

static nvmlReturn_t do_init(enum fn_id fn)
{
    long v;
    pthread_mutex_lock(&g_lock);
    g_calls[fn]++;
    if (load_at_init(k_fn_names[fn]) < 0 || read_state(k_fn_names[fn]) < 0)
        return leave(NVML_ERROR_UNKNOWN);
    if (map_lookup(&g_cfg->errors, k_fn_names[fn], &v) && v != NVML_SUCCESS)
        return leave((nvmlReturn_t)v);
    g_refcount++;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit(void) { return do_init(FN_nvmlInit); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(FN_nvmlInit_v2); }

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init(FN_nvmlInitWithFlags);
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    long v;
    pthread_mutex_lock(&g_lock);
    g_calls[FN_nvmlShutdown]++;
    if (g_refcount == 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    if (g_cfg && map_lookup(&g_cfg->errors, "nvmlShutdown", &v) && v != NVML_SUCCESS)
        return leave((nvmlReturn_t)v);
    g_refcount--;
    if (g_refcount == 0) {
        free_config(g_cfg);
        g_cfg = NULL;
        free(g_path);
        g_path = NULL;
        g_have_failed_sig = 0;
    }
    return leave(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    pthread_mutex_lock(&g_lock);
    g_calls[FN_nvmlErrorString]++;
    pthread_mutex_unlock(&g_lock);
    for (size_t i = 0; i < N_ERRORS; i++)
        if (k_errors[i].code == result)
            return k_errors[i].text;
    return "Unknown Error";
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlSystemGetDriverVersion, NULL, H_NONE);
    if (r != NVML_SUCCESS)
        return leave(r);
    return leave(copy_string(version, length, g_cfg->driver));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlSystemGetNVMLVersion, NULL, H_NONE);
    if (r != NVML_SUCCESS)
        return leave(r);
    return leave(copy_string(version, length, g_cfg->nvml));
}

/* ------------------------------------------------------------------------ */
/* Enumeration                                                               */
/* ------------------------------------------------------------------------ */

static nvmlReturn_t get_count(enum fn_id fn, unsigned int *count)
{
    struct call c;
    nvmlReturn_t r = enter(&c, fn, NULL, H_NONE);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (count == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)g_cfg->ndev;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    return get_count(FN_nvmlDeviceGetCount, count);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    return get_count(FN_nvmlDeviceGetCount_v2, count);
}

static nvmlReturn_t get_handle_by_index(enum fn_id fn, unsigned int index, nvmlDevice_t *device)
{
    struct call c;
    long v;
    nvmlReturn_t r = enter(&c, fn, NULL, H_NONE);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (device == NULL || index >= g_cfg->ndev)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* a device's own error map applies to getting its handle too */
    if (map_lookup(&g_cfg->dev[index].errors, k_fn_names[fn], &v) && v != NVML_SUCCESS)
        return leave((nvmlReturn_t)v);
    *device = &g_dev_handles[index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return get_handle_by_index(FN_nvmlDeviceGetHandleByIndex, index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return get_handle_by_index(FN_nvmlDeviceGetHandleByIndex_v2, index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetHandleByUUID, NULL, H_NONE);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (uuid == NULL || device == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (size_t i = 0; i < g_cfg->ndev; i++) {
        struct dev_cfg *d = &g_cfg->dev[i];
        if (strcmp(d->uuid, uuid) == 0) {
            *device = &g_dev_handles[i];
            return leave(NVML_SUCCESS);
        }
        for (size_t k = 0; d->mig_current == 1 && k < d->nmig; k++) {
            if (strcmp(d->mig[k].uuid, uuid) == 0) {
                *device = &g_mig_handles[i][k];
                return leave(NVML_SUCCESS);
            }
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetIndex, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (index == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)c.dev;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct call c;
    char buf[NAME_LEN + PROFILE_LEN + 8];
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetName, device, H_ANY);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (c.m != NULL) /* NVML names a MIG device "<GPU name> MIG <profile>" */
        snprintf(buf, sizeof buf, "%s MIG %s", c.d->name, c.m->profile);
    else
        snprintf(buf, sizeof buf, "%s", c.d->name);
    return leave(copy_string(name, length, buf));
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetUUID, device, H_ANY);
    if (r != NVML_SUCCESS)
        return leave(r);
    return leave(copy_string(uuid, length, c.m ? c.m->uuid : c.d->uuid));
}

/* ------------------------------------------------------------------------ */
/* Readings                                                                  */
/* ------------------------------------------------------------------------ */

static nvmlReturn_t put_u32(const struct opt_u64 *o, unsigned int *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!o->present)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)o->v;
    return NVML_SUCCESS;
}

static nvmlReturn_t put_u64(const struct opt_u64 *o, unsigned long long *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!o->present)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned long long)o->v;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType,
                                             unsigned int *temp)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetTemperature, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(put_u32(&c.d->temp, temp));
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int thresholdType,
                                                      unsigned int *temp)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetTemperatureThreshold, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (thresholdType == NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        return leave(put_u32(&c.d->slowdown, temp));
    if (thresholdType == NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        return leave(put_u32(&c.d->shutdown, temp));
    if (temp == NULL || thresholdType < 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                             nvmlFieldValue_t *values)
{
    struct call c;
    struct timespec ts;
    int64_t now_us;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetFieldValues, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (values == NULL || valuesCount <= 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    clock_gettime(CLOCK_REALTIME, &ts);
    now_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *fv = &values[i];
        fv->timestamp = now_us;
        fv->latencyUsec = 0;
        memset(&fv->value, 0, sizeof fv->value);
        if (fv->fieldId == NVML_FI_DEV_MEMORY_TEMP) {
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            if (c.d->memtemp.present) {
                fv->nvmlReturn = NVML_SUCCESS;
                fv->value.uiVal = (unsigned int)c.d->memtemp.v;
            } else {
                fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            }
        } else {
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return leave(NVML_SUCCESS);
}

#define READING_U32(fname, field)                                              \
    EXPORT nvmlReturn_t fname(nvmlDevice_t device, unsigned int *out)          \
    {                                                                          \
        struct call c;                                                         \
        nvmlReturn_t r = enter(&c, FN_##fname, device, H_PHYS);                \
        if (r != NVML_SUCCESS)                                                 \
            return leave(r);                                                   \
        return leave(put_u32(&c.d->field, out));                               \
    }

#define READING_U64(fname, field)                                              \
    EXPORT nvmlReturn_t fname(nvmlDevice_t device, unsigned long long *out)    \
    {                                                                          \
        struct call c;                                                         \
        nvmlReturn_t r = enter(&c, FN_##fname, device, H_PHYS);                \
        if (r != NVML_SUCCESS)                                                 \
            return leave(r);                                                   \
        return leave(put_u64(&c.d->field, out));                               \
    }

READING_U32(nvmlDeviceGetPowerManagementDefaultLimit, default_limit)

/* A card whose limit was set draws what the file says, up to that limit. */
EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    struct call c;
    const struct set_limit *set;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetPowerUsage, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    r = put_u32(&c.d->power, power);
    set = find_limit(c.d->uuid);
    if (r == NVML_SUCCESS && set != NULL && *power > set->mw)
        *power = set->mw;
    return leave(r);
}

/* The limit set at run time, else the file's enforced_power_limit_mw. */
EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    struct call c;
    const struct set_limit *set;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetEnforcedPowerLimit, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    set = find_limit(c.d->uuid);
    if (set == NULL || limit == NULL)
        return leave(put_u32(&c.d->limit, limit));
    *limit = set->mw;
    return leave(NVML_SUCCESS);
}

/* The limit set at run time, else the card's default limit. */
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    struct call c;
    const struct set_limit *set;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetPowerManagementLimit, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    set = find_limit(c.d->uuid);
    if (set == NULL || limit == NULL)
        return leave(put_u32(&c.d->default_limit, limit));
    *limit = set->mw;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                                 unsigned int *minLimit,
                                                                 unsigned int *maxLimit)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetPowerManagementLimitConstraints, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (minLimit == NULL || maxLimit == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c.d->has_constraints)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *minLimit = c.d->min_limit;
    *maxLimit = c.d->max_limit;
    return leave(NVML_SUCCESS);
}

/*
 * Outside [min, max] -> INVALID_ARGUMENT, as the driver answers; a card with
 * no power_limit_constraints_mw -> NOT_SUPPORTED. NO_PERMISSION (not root)
 * comes from the file's "errors", like every injected error.
 */
EXPORT nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit)
{
    struct call c;
    struct set_limit *set, before;
    int added = 0;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceSetPowerManagementLimit, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (!c.d->has_constraints)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (limit < c.d->min_limit || limit > c.d->max_limit)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    set = find_limit(c.d->uuid);
    if (set == NULL) {
        if (g_nlimits == MAX_DEVICES) {
            log_line("nvmlDeviceSetPowerManagementLimit: limits held for %d GPUs already",
                     MAX_DEVICES);
            return leave(NVML_ERROR_UNKNOWN);
        }
        set = &g_limits[g_nlimits++];
        memcpy(set->uuid, c.d->uuid, sizeof set->uuid);
        added = 1;
    }
    before = *set;
    set->mw = limit;
    if (write_state("nvmlDeviceSetPowerManagementLimit") < 0) {
        /* nothing half-applied: the limit stays what the state file says */
        if (added)
            g_nlimits--;
        else
            *set = before;
        return leave(NVML_ERROR_UNKNOWN);
    }
    return leave(NVML_SUCCESS);
}
READING_U64(nvmlDeviceGetTotalEnergyConsumption, energy)
READING_U64(nvmlDeviceGetCurrentClocksEventReasons, reasons)
READING_U64(nvmlDeviceGetSupportedClocksEventReasons, supported)
READING_U64(nvmlDeviceGetCurrentClocksThrottleReasons, reasons)
READING_U64(nvmlDeviceGetSupportedClocksThrottleReasons, supported)

/* ------------------------------------------------------------------------ */
/* MIG                                                                       */
/* ------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                         unsigned int *pendingMode)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetMigMode, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (currentMode == NULL || pendingMode == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c.d->mig_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *currentMode = c.d->mig_current;
    *pendingMode = c.d->mig_pending;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetMaxMigDeviceCount, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (count == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = c.d->max_mig;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetMigDeviceHandleByIndex, device, H_PHYS);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (migDevice == NULL || index >= c.d->max_mig)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.d->mig_current != 1 || index >= c.d->nmig)
        return leave(NVML_ERROR_NOT_FOUND);
    *migDevice = &g_mig_handles[c.dev][index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceIsMigDeviceHandle, device, H_ANY);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (isMigDevice == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = c.m != NULL ? 1u : 0u;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                 nvmlDevice_t *device)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetDeviceHandleFromMigDeviceHandle, migDevice, H_ANY);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (device == NULL || c.m == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_dev_handles[c.dev];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetGpuInstanceId, device, H_ANY);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (id == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.m == NULL)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = c.m->gi;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetComputeInstanceId, device, H_ANY);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (id == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.m == NULL)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = c.m->ci;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                               nvmlDeviceAttributes_t *attributes)
{
    struct call c;
    nvmlReturn_t r = enter(&c, FN_nvmlDeviceGetAttributes_v2, device, H_ANY);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (attributes == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(attributes, 0, sizeof *attributes);
    if (c.m != NULL) {
        attributes->multiprocessorCount = c.m->sm_count;
        attributes->sharedCopyEngineCount = c.m->ce;
        attributes->sharedDecoderCount = c.m->dec;
        attributes->sharedEncoderCount = c.m->enc;
        attributes->sharedJpegCount = c.m->jpg;
        attributes->sharedOfaCount = c.m->ofa;
        attributes->gpuInstanceSliceCount = c.m->slices;
        attributes->computeInstanceSliceCount = c.m->slices;
        attributes->memorySizeMB = c.m->memory_size_mb;
        return leave(NVML_SUCCESS);
    }
    if (!c.d->sm_count.present)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    attributes->multiprocessorCount = (unsigned int)c.d->sm_count.v;
    attributes->memorySizeMB = c.d->memory_size_mb;
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------ */
/* Processes                                                                 */
/* ------------------------------------------------------------------------ */

/*
 * A MIG handle lists its instance's processes. A physical handle lists the
 * device's own "processes" and, in MIG mode, every instance's (tagged with
 * their GPU/compute instance ids), as NVML does on the parent device.
 */
static nvmlReturn_t get_procs(enum fn_id fn, nvmlDevice_t device, unsigned int *infoCount,
                              nvmlProcessInfo_t *infos)
{
    struct call c;
    size_t need, k = 0;
    nvmlReturn_t r = enter(&c, fn, device, H_ANY);
    if (r != NVML_SUCCESS)
        return leave(r);
    if (infoCount == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.m != NULL) {
        need = c.m->procs.n;
    } else {
        need = c.d->procs.n;
        for (size_t i = 0; c.d->mig_current == 1 && i < c.d->nmig; i++)
            need += c.d->mig[i].procs.n;
    }
    if (need > UINT_MAX)
        return leave(NVML_ERROR_UNKNOWN);
    if (*infoCount < need) {
        *infoCount = (unsigned int)need;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    *infoCount = (unsigned int)need;
    if (need == 0)
        return leave(NVML_SUCCESS);
    if (infos == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.m != NULL) {
        for (size_t i = 0; i < c.m->procs.n; i++, k++) {
            infos[k].pid = c.m->procs.p[i].pid;
            infos[k].usedGpuMemory = c.m->procs.p[i].used;
            infos[k].gpuInstanceId = c.m->gi;
            infos[k].computeInstanceId = c.m->ci;
        }
        return leave(NVML_SUCCESS);
    }
    for (size_t i = 0; i < c.d->procs.n; i++, k++) {
        infos[k].pid = c.d->procs.p[i].pid;
        infos[k].usedGpuMemory = c.d->procs.p[i].used;
        infos[k].gpuInstanceId = NOT_AVAILABLE_U32;
        infos[k].computeInstanceId = NOT_AVAILABLE_U32;
    }
    for (size_t j = 0; c.d->mig_current == 1 && j < c.d->nmig; j++) {
        const struct mig_cfg *m = &c.d->mig[j];
        for (size_t i = 0; i < m->procs.n; i++, k++) {
            infos[k].pid = m->procs.p[i].pid;
            infos[k].usedGpuMemory = m->procs.p[i].used;
            infos[k].gpuInstanceId = m->gi;
            infos[k].computeInstanceId = m->ci;
        }
    }
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_t *infos)
{
    return get_procs(FN_nvmlDeviceGetComputeRunningProcesses, device, infoCount, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    return get_procs(FN_nvmlDeviceGetComputeRunningProcesses_v2, device, infoCount, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    return get_procs(FN_nvmlDeviceGetComputeRunningProcesses_v3, device, infoCount, infos);
}

/* ------------------------------------------------------------------------ */
/* Test helpers (not part of NVML)                                           */
/* ------------------------------------------------------------------------ */

/* How many times `name` was called since load or the last reset; NULL: all. */
EXPORT unsigned long long fakeNvmlGetCallCount(const char *name)
{
    unsigned long long n = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < FN_COUNT; i++)
        if (name == NULL || strcmp(name, k_fn_names[i]) == 0)
            n += g_calls[i];
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Back to the just-loaded state: not initialised, no config, counters zero. */
EXPORT void fakeNvmlReset(void)
{
    pthread_mutex_lock(&g_lock);
    g_refcount = 0;
    free_config(g_cfg);
    g_cfg = NULL;
    free(g_path);
    g_path = NULL;
    g_have_failed_sig = 0;
    memset(g_calls, 0, sizeof g_calls);
    g_nlimits = 0;
    pthread_mutex_unlock(&g_lock);
}

/* The init reference count, for tests that check balanced init/shutdown. */
EXPORT unsigned int fakeNvmlGetRefCount(void)
{
    unsigned int n;
    pthread_mutex_lock(&g_lock);
    n = g_refcount;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* sizeof of the ABI structs, so a test can compare them with pynvml's. */
EXPORT size_t fakeNvmlSizeof(const char *type)
{
    if (type == NULL)
        return 0;
    if (strcmp(type, "nvmlFieldValue_t") == 0)
        return sizeof(nvmlFieldValue_t);
    if (strcmp(type, "nvmlProcessInfo_t") == 0)
        return sizeof(nvmlProcessInfo_t);
    if (strcmp(type, "nvmlDeviceAttributes_t") == 0)
        return sizeof(nvmlDeviceAttributes_t);
    if (strcmp(type, "nvmlValue_t") == 0)
        return sizeof(nvmlValue_t);
    return 0;
}
