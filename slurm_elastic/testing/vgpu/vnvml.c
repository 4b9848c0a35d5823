/*
 * Virtual NVML: a libnvidia-ml.so.1 for machines without GPUs (tests and demo only).
 *
 * It exports the NVML symbols that nvidia-ml-py (module pynvml) calls for what slurm-elastic uses, so the
 * agent's production NVML code runs unchanged and real pynvml.NVMLError_* classes come back from real return
 * codes. The devices are described by a text file per node (path in $SLURM_ELASTIC_VGPU_STATE), written by
 * slurm_elastic/testing/vgpu/state.py; the format is documented there. The file is re-read whenever it changes.
 *
 * Behaviour worth knowing:
 *  - A process entry counts only while /proc/<pid> exists (and, if the entry records a start time, while the
 *    pid's start time still matches it, so a reused pid does not inherit a dead workload's entry).
 *  - Faults: `fault <function> <code> <gpu|-1>` and `delay <function> <ms> <gpu|-1>` lines in the state, or
 *    $SLURM_ELASTIC_VGPU_FAULTS="fn=code[@gpu];fn=delay:ms[@gpu]" make a function return an NVML error code or
 *    sleep first. Function names match without their _vN suffix; "*" matches every function but nvmlShutdown
 *    and nvmlErrorString.
 *  - nvmlDeviceGetProcessUtilization returns one sample per live process stamped "now" (microseconds; a
 *    `clock_us` line pins "now" for tests) and only when it is newer than lastSeenTimeStamp, else NOT_FOUND.
 *  - MIG: read side and write side (mode, GPU/compute instance create/destroy) follow NVML's API; writes go
 *    back to the state file under the same lock protocol as the Python writer.
 *
 * Build: python -m slurm_elastic.testing.vgpu.build OUTDIR (gcc -shared -fPIC -fvisibility=hidden).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NO_ID 0xFFFFFFFFu
#define MIB (1024ULL * 1024ULL)

/* ---- NVML structures, laid out exactly as nvidia-ml-py's ctypes declarations ---------------------------- */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct { unsigned int start, size; } nvmlPlacement_t;
typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;
typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;
typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;
typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

/* ---- handles: stable addresses named by (kind, gpu, gi, ci), valid across state reloads ------------------ */
#define MAX_GPUS 32
#define MAX_GI_ID 16
#define MAX_CI_ID 8
#define HANDLE_MAGIC 0x76475055u /* "vGPU" */
enum { K_GPU = 1, K_MIG = 2, K_GI = 3, K_CI = 4 };
typedef struct vhandle { uint32_t magic; int kind, gpu, gi, ci; } vh_t;

static vh_t H_GPU[MAX_GPUS];
static vh_t H_MIG[MAX_GPUS][MAX_GI_ID][MAX_CI_ID];
static vh_t H_GI[MAX_GPUS][MAX_GI_ID];
static vh_t H_CI[MAX_GPUS][MAX_GI_ID][MAX_CI_ID];

typedef struct nvmlGpuInstanceInfo_st {
    vh_t *device;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlGpuInstanceInfo_t;
typedef struct {
    vh_t *device;
    vh_t *gpuInstance;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlComputeInstanceInfo_t;

__attribute__((constructor)) static void init_handles(void) {
    for (int g = 0; g < MAX_GPUS; g++) {
        H_GPU[g] = (vh_t){HANDLE_MAGIC, K_GPU, g, -1, -1};
        for (int i = 0; i < MAX_GI_ID; i++) {
            H_GI[g][i] = (vh_t){HANDLE_MAGIC, K_GI, g, i, -1};
            for (int c = 0; c < MAX_CI_ID; c++) {
                H_MIG[g][i][c] = (vh_t){HANDLE_MAGIC, K_MIG, g, i, c};
                H_CI[g][i][c] = (vh_t){HANDLE_MAGIC, K_CI, g, i, c};
            }
        }
    }
}

/* ---- state ----------------------------------------------------------------------------------------------- */
#define NAME_LEN 96
#define MAX_PROFILES 24
#define MAX_STARTS 16
#define MAX_GIS 256
#define MAX_CIS 512
#define MAX_PROCS 4096
#define MAX_FAULTS 64
#define MAX_EXTRA 64
#define LINE_MAX_LEN 512

typedef struct {
    int index, profile_id, slices, instances, sm, placement_size, nstarts;
    int starts[MAX_STARTS];
    unsigned long long mem_mib;
    char name[NAME_LEN];
} giprof_t;
typedef struct { int index, profile_id, slices; } ciprof_t;
typedef struct {
    int index, minor, mig_capable, mig_current, mig_pending, ngiprof, nciprof;
    unsigned long long mem_mib;
    char uuid[NAME_LEN], name[NAME_LEN];
    giprof_t giprof[MAX_PROFILES];
    ciprof_t ciprof[MAX_PROFILES];
} gpu_t;
typedef struct { int gpu, id, profile_id, start, size; } gi_t;
typedef struct { int gpu, gi, id, profile_id, start, size; } ci_t;
typedef struct {
    int pid, gpu, gi, ci, sm, memutil;
    unsigned long long mem_mib, starttime;
} proc_t;
typedef struct { char fn[64]; int code, gpu, delay_ms; } fault_t;

typedef struct {
    char driver[80];
    unsigned long long clock_us;
    int ngpus, ngis, ncis, nprocs, nfaults, nextra;
    gpu_t gpus[MAX_GPUS];
    gi_t gis[MAX_GIS];
    ci_t cis[MAX_CIS];
    proc_t procs[MAX_PROCS];
    fault_t faults[MAX_FAULTS];
    char extra[MAX_EXTRA][LINE_MAX_LEN];
} state_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_init_count = 0;
static state_t *g_state = NULL;   /* cache of the file, NULL until the first good read */
static state_t *g_scratch = NULL; /* parse target; swapped with g_state on success */
static char g_path[4096];
static struct stat g_stat;
static long long g_read_at_ns = 0;

static void debugf(const char *fmt, const char *arg) {
    if (getenv("SLURM_ELASTIC_VGPU_DEBUG")) fprintf(stderr, fmt, arg);
}

static long long realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* -- tokenizer: whitespace-separated fields, the last field of some records is the rest of the line -------- */
static char *tok(char **p) {
    char *s = *p;
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) { *p = s; return NULL; }
    char *e = s;
    while (*e && *e != ' ' && *e != '\t') e++;
    if (*e) *e++ = '\0';
    *p = e;
    return s;
}
static int tok_ll(char **p, long long *out) {
    char *t = tok(p), *end;
    if (!t) return -1;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}
static int tok_int(char **p, int *out) {
    long long v;
    if (tok_ll(p, &v) || v < -2147483647LL || v > 2147483647LL) return -1;
    *out = (int)v;
    return 0;
}
static int tok_ull(char **p, unsigned long long *out) {
    long long v;
    if (tok_ll(p, &v) || v < 0) return -1;
    *out = (unsigned long long)v;
    return 0;
}
static int rest(char **p, char *dst, size_t n) {
    char *s = *p;
    while (*s == ' ' || *s == '\t') s++;
    size_t len = strlen(s);
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
    if (!len || len >= n) return -1;
    memcpy(dst, s, len);
    dst[len] = '\0';
    return 0;
}

static gpu_t *find_gpu(state_t *s, int index) {
    for (int i = 0; i < s->ngpus; i++)
        if (s->gpus[i].index == index) return &s->gpus[i];
    return NULL;
}

/* Parses text into s. Returns 0 when complete, 1 when torn (no `end` line: a writer is mid-way), -1 when bad. */
static int parse_state(char *buf, state_t *s) {
    memset(s, 0, sizeof *s);
    strcpy(s->driver, "550.54.15");
    int seen_header = 0, seen_end = 0;
    char *line = buf;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = '\0';
        char saved[LINE_MAX_LEN];
        snprintf(saved, sizeof saved, "%s", line);
        char *p = line;
        char *kind = tok(&p);
        int bad = 0;
        if (!kind || kind[0] == '#') goto next;
        if (seen_end) return -1;
        if (!seen_header) {
            int v;
            if (strcmp(kind, "vgpu-state") || tok_int(&p, &v) || v != 1) return -1;
            seen_header = 1;
        } else if (!strcmp(kind, "end")) {
            seen_end = 1;
        } else if (!strcmp(kind, "driver")) {
            bad = rest(&p, s->driver, sizeof s->driver);
        } else if (!strcmp(kind, "clock_us")) {
            bad = tok_ull(&p, &s->clock_us);
        } else if (!strcmp(kind, "gpu")) {
            if (s->ngpus >= MAX_GPUS) return -1;
            gpu_t *g = &s->gpus[s->ngpus];
            char *uuid;
            bad = tok_int(&p, &g->index) || tok_int(&p, &g->minor) || tok_ull(&p, &g->mem_mib) ||
                  tok_int(&p, &g->mig_capable) || !(uuid = tok(&p)) || strlen(uuid) >= NAME_LEN ||
                  rest(&p, g->name, sizeof g->name);
            if (!bad) {
                strcpy(g->uuid, uuid);
                if (g->index < 0 || g->index >= MAX_GPUS || find_gpu(s, g->index)) return -1;
                s->ngpus++;
            }
        } else if (!strcmp(kind, "mig")) {
            int idx, cur, pend;
            bad = tok_int(&p, &idx) || tok_int(&p, &cur) || tok_int(&p, &pend);
            gpu_t *g = bad ? NULL : find_gpu(s, idx);
            if (!g) return -1;
            g->mig_current = cur != 0;
            g->mig_pending = pend != 0;
        } else if (!strcmp(kind, "giprofile")) {
            int idx;
            giprof_t pr = {0};
            char *starts;
            bad = tok_int(&p, &idx) || tok_int(&p, &pr.index) || tok_int(&p, &pr.profile_id) ||
                  tok_int(&p, &pr.slices) || tok_int(&p, &pr.instances) || tok_ull(&p, &pr.mem_mib) ||
                  tok_int(&p, &pr.sm) || tok_int(&p, &pr.placement_size) || !(starts = tok(&p)) ||
                  rest(&p, pr.name, sizeof pr.name);
            gpu_t *g = bad ? NULL : find_gpu(s, idx);
            if (!g || g->ngiprof >= MAX_PROFILES) return -1;
            for (char *q = starts; q && *q && pr.nstarts < MAX_STARTS;) {
                char *end;
                long v = strtol(q, &end, 10);
                if (end == q) return -1;
                pr.starts[pr.nstarts++] = (int)v;
                q = (*end == ',') ? end + 1 : end;
            }
            g->giprof[g->ngiprof++] = pr;
        } else if (!strcmp(kind, "ciprofile")) {
            int idx;
            ciprof_t pr;
            bad = tok_int(&p, &idx) || tok_int(&p, &pr.index) || tok_int(&p, &pr.profile_id) ||
                  tok_int(&p, &pr.slices);
            gpu_t *g = bad ? NULL : find_gpu(s, idx);
            if (!g || g->nciprof >= MAX_PROFILES) return -1;
            g->ciprof[g->nciprof++] = pr;
        } else if (!strcmp(kind, "gi")) {
            if (s->ngis >= MAX_GIS) return -1;
            gi_t *x = &s->gis[s->ngis];
            bad = tok_int(&p, &x->gpu) || tok_int(&p, &x->id) || tok_int(&p, &x->profile_id) ||
                  tok_int(&p, &x->start) || tok_int(&p, &x->size);
            if (!bad && (x->id < 0 || x->id >= MAX_GI_ID)) return -1;
            if (!bad) s->ngis++;
        } else if (!strcmp(kind, "ci")) {
            if (s->ncis >= MAX_CIS) return -1;
            ci_t *x = &s->cis[s->ncis];
            bad = tok_int(&p, &x->gpu) || tok_int(&p, &x->gi) || tok_int(&p, &x->id) ||
                  tok_int(&p, &x->profile_id) || tok_int(&p, &x->start) || tok_int(&p, &x->size);
            if (!bad && (x->id < 0 || x->id >= MAX_CI_ID || x->gi < 0 || x->gi >= MAX_GI_ID)) return -1;
            if (!bad) s->ncis++;
        } else if (!strcmp(kind, "proc")) {
            if (s->nprocs >= MAX_PROCS) return -1;
            proc_t *x = &s->procs[s->nprocs];
            bad = tok_int(&p, &x->pid) || tok_int(&p, &x->gpu) || tok_int(&p, &x->gi) || tok_int(&p, &x->ci) ||
                  tok_int(&p, &x->sm) || tok_int(&p, &x->memutil) || tok_ull(&p, &x->mem_mib) ||
                  tok_ull(&p, &x->starttime);
            if (!bad) s->nprocs++;
        } else if (!strcmp(kind, "fault") || !strcmp(kind, "delay")) {
            if (s->nfaults >= MAX_FAULTS) return -1;
            fault_t *f = &s->faults[s->nfaults];
            char *fn = tok(&p);
            int v;
            bad = !fn || strlen(fn) >= sizeof f->fn || tok_int(&p, &v) || tok_int(&p, &f->gpu);
            if (!bad) {
                strcpy(f->fn, fn);
                if (kind[0] == 'f') { f->code = v; f->delay_ms = 0; }
                else { f->code = NVML_SUCCESS; f->delay_ms = v; }
                s->nfaults++;
            }
        } else {
            /* A record this build does not know: kept verbatim so a write-back does not lose it. */
            if (s->nextra < MAX_EXTRA) snprintf(s->extra[s->nextra++], LINE_MAX_LEN, "%s", saved);
        }
        if (bad) return -1;
    next:
        line = nl ? nl + 1 : NULL;
    }
    if (!seen_header) return seen_end ? -1 : 1;
    return seen_end ? 0 : 1;
}

static int lock_file(const char *path, int op, int create) {
    char lp[4200];
    snprintf(lp, sizeof lp, "%s.lock", path);
    int fd = open(lp, create ? (O_RDWR | O_CREAT | O_CLOEXEC) : (O_RDONLY | O_CLOEXEC), 0666);
    if (fd < 0) return -1;
    if (create) fchmod(fd, 0666); /* other users' workloads take the same lock */
    while (flock(fd, op) != 0) {
        if (errno != EINTR) { close(fd); return -1; }
    }
    return fd;
}
static void unlock_file(int fd) {
    if (fd >= 0) { flock(fd, LOCK_UN); close(fd); }
}

/* Reads and parses path into s; 0 ok, 1 torn, -1 bad, -2 missing. The caller holds the lock file if needed. */
static int read_state(const char *path, state_t *s, struct stat *st_out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -2;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size > 64 * 1024 * 1024) { close(fd); return -1; }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) { close(fd); return -1; }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    int rc = parse_state(buf, s);
    free(buf);
    if (st_out) *st_out = st;
    return rc;
}

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Makes g_state current. Called with g_lock held. */
static nvmlReturn_t load_state(void) {
    const char *path = getenv("SLURM_ELASTIC_VGPU_STATE");
    if (!path || !*path) {
        debugf("vgpu: %s\n", "SLURM_ELASTIC_VGPU_STATE is not set");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        debugf("vgpu: state file %s is missing\n", path);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    long long mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    /* A change within the same timestamp tick as our last read would be invisible to stat: re-read while
     * the cached copy is that young ("racy" in git's sense). */
    int racy = mtime_ns + 20000000LL >= g_read_at_ns;
    if (g_state && !racy && !strcmp(path, g_path) && same_file(&st, &g_stat)) return NVML_SUCCESS;
    if (!g_scratch && !(g_scratch = malloc(sizeof(state_t)))) return NVML_ERROR_MEMORY;
    for (int attempt = 0; attempt < 50; attempt++) {
        long long read_at = realtime_ns();
        int lfd = lock_file(path, LOCK_SH, 0);
        struct stat rst;
        int rc = read_state(path, g_scratch, &rst);
        unlock_file(lfd);
        if (rc == 0) {
            state_t *tmp = g_state;
            g_state = g_scratch;
            g_scratch = tmp;
            snprintf(g_path, sizeof g_path, "%s", path);
            g_stat = rst;
            g_read_at_ns = read_at;
            return NVML_SUCCESS;
        }
        if (rc == -2) return NVML_ERROR_DRIVER_NOT_LOADED;
        if (rc == -1) {
            debugf("vgpu: state file %s is malformed\n", path);
            return NVML_ERROR_UNKNOWN;
        }
        usleep(2000); /* torn: a writer without rename rights is rewriting in place */
    }
    return g_state ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

/* ---- write-back (MIG workflow) --------------------------------------------------------------------------- */
static int write_all(int fd, const char *buf, size_t len) {
    while (len) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static char *format_state(const state_t *s, size_t *len_out) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fprintf(f, "# slurm-elastic virtual GPU state (format: slurm_elastic/testing/vgpu/state.py)\nvgpu-state 1\n");
    fprintf(f, "driver %s\n", s->driver);
    if (s->clock_us) fprintf(f, "clock_us %llu\n", s->clock_us);
    for (int i = 0; i < s->ngpus; i++) {
        const gpu_t *g = &s->gpus[i];
        fprintf(f, "gpu %d %d %llu %d %s %s\n", g->index, g->minor, g->mem_mib, g->mig_capable, g->uuid, g->name);
        if (g->mig_capable) fprintf(f, "mig %d %d %d\n", g->index, g->mig_current, g->mig_pending);
        for (int j = 0; j < g->ngiprof; j++) {
            const giprof_t *p = &g->giprof[j];
            fprintf(f, "giprofile %d %d %d %d %d %llu %d %d ", g->index, p->index, p->profile_id, p->slices,
                    p->instances, p->mem_mib, p->sm, p->placement_size);
            for (int k = 0; k < p->nstarts; k++) fprintf(f, k ? ",%d" : "%d", p->starts[k]);
            fprintf(f, " %s\n", p->name);
        }
        for (int j = 0; j < g->nciprof; j++)
            fprintf(f, "ciprofile %d %d %d %d\n", g->index, g->ciprof[j].index, g->ciprof[j].profile_id,
                    g->ciprof[j].slices);
    }
    for (int i = 0; i < s->ngis; i++)
        fprintf(f, "gi %d %d %d %d %d\n", s->gis[i].gpu, s->gis[i].id, s->gis[i].profile_id, s->gis[i].start,
                s->gis[i].size);
    for (int i = 0; i < s->ncis; i++)
        fprintf(f, "ci %d %d %d %d %d %d\n", s->cis[i].gpu, s->cis[i].gi, s->cis[i].id, s->cis[i].profile_id,
                s->cis[i].start, s->cis[i].size);
    for (int i = 0; i < s->nprocs; i++) {
        const proc_t *p = &s->procs[i];
        fprintf(f, "proc %d %d %d %d %d %d %llu %llu\n", p->pid, p->gpu, p->gi, p->ci, p->sm, p->memutil,
                p->mem_mib, p->starttime);
    }
    for (int i = 0; i < s->nfaults; i++) {
        const fault_t *x = &s->faults[i];
        if (x->delay_ms) fprintf(f, "delay %s %d %d\n", x->fn, x->delay_ms, x->gpu);
        else fprintf(f, "fault %s %d %d\n", x->fn, x->code, x->gpu);
    }
    for (int i = 0; i < s->nextra; i++) fprintf(f, "%s\n", s->extra[i]);
    fprintf(f, "end\n");
    fclose(f);
    *len_out = len;
    return buf;
}

/* Replaces the file's content: temp + rename, or in place when the sticky state directory refuses rename
 * (another user owns the file). Readers hold the shared lock, so neither is seen half-written. */
static int store_state(const char *path, const state_t *s) {
    size_t len;
    char *buf = format_state(s, &len);
    if (!buf) return -1;
    struct stat st;
    mode_t mode = stat(path, &st) == 0 ? (st.st_mode & 07777) : 0666;
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%ld", path, (int)getpid(), (long)syscall(SYS_gettid));
    int rc = -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
        int ok = write_all(fd, buf, len) == 0 && fchmod(fd, mode) == 0 && fsync(fd) == 0;
        close(fd);
        if (ok && rename(tmp, path) == 0) rc = 0;
        else unlink(tmp);
    }
    if (rc != 0) {
        fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
            if (write_all(fd, buf, len) == 0 && ftruncate(fd, (off_t)len) == 0) rc = 0;
            close(fd);
        }
    }
    free(buf);
    return rc;
}

typedef nvmlReturn_t (*mutator_t)(state_t *s, void *arg);

/* Read-modify-write of the state file under the exclusive lock. Called with g_lock held. */
static nvmlReturn_t modify_state(mutator_t fn, void *arg) {
    const char *path = getenv("SLURM_ELASTIC_VGPU_STATE");
    if (!path || !*path) return NVML_ERROR_DRIVER_NOT_LOADED;
    state_t *s = malloc(sizeof *s);
    if (!s) return NVML_ERROR_MEMORY;
    int lfd = lock_file(path, LOCK_EX, 1);
    nvmlReturn_t rc;
    int r = read_state(path, s, NULL);
    if (r == -2) rc = NVML_ERROR_DRIVER_NOT_LOADED;
    else if (r != 0) rc = NVML_ERROR_UNKNOWN;
    else {
        rc = fn(s, arg);
        if (rc == NVML_SUCCESS && store_state(path, s) != 0) rc = NVML_ERROR_NO_PERMISSION;
    }
    unlock_file(lfd);
    free(s);
    g_read_at_ns = 0; /* force a reload on the next call */
    if (rc == NVML_SUCCESS) load_state();
    return rc;
}

/* ---- processes ------------------------------------------------------------------------------------------- */
static unsigned long long proc_starttime(int pid, int *alive) {
    const char *root = getenv("SLURM_ELASTIC_VGPU_PROC");
    char path[512], buf[1024];
    snprintf(path, sizeof path, "%s/%d/stat", root && *root ? root : "/proc", pid);
    *alive = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    *alive = 1;
    char *p = strrchr(buf, ')'); /* comm may hold spaces and parentheses: fields restart after the last ')' */
    if (!p) return 0;
    p++;
    for (int field = 3; field < 22; field++) { /* starttime is field 22 of proc(5) */
        p = strchr(p + 1, ' ');
        if (!p) return 0;
    }
    return strtoull(p + 1, NULL, 10);
}

static int proc_alive(const proc_t *p) {
    if (p->pid <= 0) return 0;
    int alive;
    unsigned long long start = proc_starttime(p->pid, &alive);
    if (!alive) return 0;
    return p->starttime == 0 || start == p->starttime;
}

/* ---- faults ---------------------------------------------------------------------------------------------- */
static size_t base_len(const char *fn) { /* "nvmlDeviceGetCount_v2" -> length of "nvmlDeviceGetCount" */
    size_t n = strlen(fn);
    const char *u = strrchr(fn, '_');
    if (u && u[1] == 'v' && u[2] >= '0' && u[2] <= '9') n = (size_t)(u - fn);
    if (!strncmp(fn, "nvmlInit", 8) && (n == 8 || !strcmp(fn, "nvmlInitWithFlags"))) n = 8;
    return n;
}
static int fn_matches(const char *pattern, const char *fn) {
    if (!strcmp(pattern, "*")) return strcmp(fn, "nvmlShutdown") && strcmp(fn, "nvmlErrorString");
    size_t a = base_len(pattern), b = base_len(fn);
    return a == b && !strncmp(pattern, fn, a);
}

/* First matching fault from the environment, then from the state. gpu < 0: a call on no device. */
static void find_fault(const char *fn, int gpu, int *code, int *delay_ms) {
    *code = NVML_SUCCESS;
    *delay_ms = 0;
    const char *env = getenv("SLURM_ELASTIC_VGPU_FAULTS");
    if (env && *env) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", env);
        char *save = NULL;
        for (char *item = strtok_r(buf, ";,", &save); item; item = strtok_r(NULL, ";,", &save)) {
            char *eq = strchr(item, '=');
            if (!eq) continue;
            *eq = '\0';
            char *val = eq + 1, *at = strchr(val, '@');
            int fgpu = -1;
            if (at) { *at = '\0'; fgpu = atoi(at + 1); }
            while (*item == ' ') item++;
            if (!fn_matches(item, fn) || (fgpu >= 0 && fgpu != gpu)) continue;
            if (!strncmp(val, "delay:", 6)) { if (!*delay_ms) *delay_ms = atoi(val + 6); }
            else if (*code == NVML_SUCCESS) *code = atoi(val);
        }
    }
    if (!g_state) return;
    for (int i = 0; i < g_state->nfaults; i++) {
        const fault_t *f = &g_state->faults[i];
        if (!fn_matches(f->fn, fn) || (f->gpu >= 0 && f->gpu != gpu)) continue;
        if (f->delay_ms) { if (!*delay_ms) *delay_ms = f->delay_ms; }
        else if (*code == NVML_SUCCESS) *code = f->code;
    }
}

/* ---- call context ---------------------------------------------------------------------------------------- */
typedef struct {
    state_t *s;
    gpu_t *g;     /* the physical GPU the handle belongs to */
    gi_t *gi;     /* for GI, CI and MIG device handles */
    ci_t *ci;     /* for CI and MIG device handles */
    vh_t *h;
} ctx_t;

static gi_t *find_gi(state_t *s, int gpu, int id) {
    for (int i = 0; i < s->ngis; i++)
        if (s->gis[i].gpu == gpu && s->gis[i].id == id) return &s->gis[i];
    return NULL;
}
static ci_t *find_ci(state_t *s, int gpu, int gi, int id) {
    for (int i = 0; i < s->ncis; i++)
        if (s->cis[i].gpu == gpu && s->cis[i].gi == gi && s->cis[i].id == id) return &s->cis[i];
    return NULL;
}
static int is_handle(const void *h) {
    const char *p = h;
    return h && ((p >= (const char *)H_GPU && p < (const char *)(H_GPU + MAX_GPUS)) ||
                 (p >= (const char *)H_MIG && p < (const char *)H_MIG + sizeof H_MIG) ||
                 (p >= (const char *)H_GI && p < (const char *)H_GI + sizeof H_GI) ||
                 (p >= (const char *)H_CI && p < (const char *)H_CI + sizeof H_CI)) &&
           ((const vh_t *)h)->magic == HANDLE_MAGIC;
}

enum { NEED_NONE = 0, NEED_DEVICE = 1, NEED_GI = 2, NEED_CI = 3 };

/* Takes g_lock, checks initialisation, loads the state, resolves the handle, applies faults and delays.
 * On success the caller must finish with leave(); on failure the lock is already released. */
static nvmlReturn_t enter(const char *fn, void *handle, int need, ctx_t *c) {
    int delayed = 0;
    for (;;) {
        memset(c, 0, sizeof *c);
        pthread_mutex_lock(&g_lock);
        nvmlReturn_t rc = NVML_SUCCESS;
        if (g_init_count == 0) rc = NVML_ERROR_UNINITIALIZED;
        if (rc == NVML_SUCCESS) rc = load_state();
        int gpu = -1;
        if (rc == NVML_SUCCESS && need != NEED_NONE) {
            vh_t *h = handle;
            if (!is_handle(h)) rc = NVML_ERROR_INVALID_ARGUMENT;
            else if ((need == NEED_DEVICE && h->kind != K_GPU && h->kind != K_MIG) ||
                     (need == NEED_GI && h->kind != K_GI) || (need == NEED_CI && h->kind != K_CI))
                rc = NVML_ERROR_INVALID_ARGUMENT;
            else {
                c->h = h;
                c->s = g_state;
                c->g = find_gpu(g_state, h->gpu);
                gpu = h->gpu;
                if (!c->g) rc = NVML_ERROR_INVALID_ARGUMENT;
                else if (h->kind != K_GPU) {
                    c->gi = find_gi(g_state, h->gpu, h->gi);
                    if (!c->gi || !c->g->mig_current) rc = NVML_ERROR_INVALID_ARGUMENT;
                    else if (h->kind == K_MIG || h->kind == K_CI) {
                        c->ci = find_ci(g_state, h->gpu, h->gi, h->ci);
                        if (!c->ci) rc = NVML_ERROR_INVALID_ARGUMENT;
                    }
                }
            }
        }
        c->s = g_state;
        if (rc == NVML_SUCCESS || rc == NVML_ERROR_INVALID_ARGUMENT) {
            int code, delay_ms;
            find_fault(fn, gpu, &code, &delay_ms);
            if (delay_ms > 0 && !delayed) {
                pthread_mutex_unlock(&g_lock);
                usleep((useconds_t)delay_ms * 1000u);
                delayed = 1;
                continue;
            }
            if (code != NVML_SUCCESS) rc = code;
        }
        if (rc != NVML_SUCCESS) pthread_mutex_unlock(&g_lock);
        return rc;
    }
}
static nvmlReturn_t leave(nvmlReturn_t rc) {
    pthread_mutex_unlock(&g_lock);
    return rc;
}

static unsigned long long now_us(const state_t *s) {
    return s->clock_us ? s->clock_us : (unsigned long long)(realtime_ns() / 1000LL);
}

static int copy_str(char *dst, unsigned int len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

/* ---- profiles -------------------------------------------------------------------------------------------- */
static giprof_t *giprof_by_index(gpu_t *g, unsigned int index) {
    for (int i = 0; i < g->ngiprof; i++)
        if ((unsigned)g->giprof[i].index == index) return &g->giprof[i];
    return NULL;
}
static giprof_t *giprof_by_id(gpu_t *g, unsigned int id) {
    for (int i = 0; i < g->ngiprof; i++)
        if ((unsigned)g->giprof[i].profile_id == id) return &g->giprof[i];
    return NULL;
}
static ciprof_t *ciprof_by_index(gpu_t *g, unsigned int index) {
    for (int i = 0; i < g->nciprof; i++)
        if ((unsigned)g->ciprof[i].index == index) return &g->ciprof[i];
    return NULL;
}
static ciprof_t *ciprof_by_id(gpu_t *g, unsigned int id) {
    for (int i = 0; i < g->nciprof; i++)
        if ((unsigned)g->ciprof[i].profile_id == id) return &g->ciprof[i];
    return NULL;
}
/* "MIG 3g.20gb" -> "3g.20gb" */
static const char *short_name(const char *name) { return strncmp(name, "MIG ", 4) ? name : name + 4; }

static void ci_profile_name(const giprof_t *gp, const ciprof_t *cp, char *dst, size_t n) {
    if (cp->slices >= gp->slices) snprintf(dst, n, "%s", gp->name);
    else snprintf(dst, n, "MIG %dc.%.72s", cp->slices % 100, short_name(gp->name));
}

/* Name of the MIG device behind a compute instance, e.g. "1c.3g.20gb" or "3g.20gb". */
static void mig_profile_name(gpu_t *g, const gi_t *gi, const ci_t *ci, char *dst, size_t n) {
    giprof_t *gp = giprof_by_id(g, (unsigned)gi->profile_id);
    ciprof_t *cp = ciprof_by_id(g, (unsigned)ci->profile_id);
    char full[NAME_LEN];
    if (!gp) { snprintf(dst, n, "unknown"); return; }
    if (cp) ci_profile_name(gp, cp, full, sizeof full);
    else snprintf(full, sizeof full, "%s", gp->name);
    snprintf(dst, n, "%s", short_name(full));
}

static void mig_uuid(const gpu_t *g, int gi, int ci, char *dst, size_t n) {
    /* Stable and unique per (GPU, GI, CI): the GPU's UUID body with the last four hex digits replaced. */
    const char *body = strncmp(g->uuid, "GPU-", 4) ? g->uuid : g->uuid + 4;
    size_t len = strlen(body);
    char head[NAME_LEN];
    snprintf(head, sizeof head, "%.*s", (int)(len > 4 ? len - 4 : 0), body);
    snprintf(dst, n, "MIG-%.80s%02x%02x", head, gi & 0xff, ci & 0xff);
}

/* ---- system ---------------------------------------------------------------------------------------------- */
static nvmlReturn_t do_init(const char *fn) {
    pthread_mutex_lock(&g_lock);
    int code, delay_ms;
    find_fault(fn, -1, &code, &delay_ms); /* environment faults: the state may be what is missing */
    nvmlReturn_t rc = code;
    if (rc == NVML_SUCCESS) rc = load_state();
    if (rc == NVML_SUCCESS) {
        find_fault(fn, -1, &code, &delay_ms);
        rc = code;
    }
    if (rc == NVML_SUCCESS) g_init_count++;
    pthread_mutex_unlock(&g_lock);
    if (delay_ms > 0) usleep((useconds_t)delay_ms * 1000u);
    return rc;
}
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init("nvmlInitWithFlags"); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init("nvmlInit_v2"); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init("nvmlInit"); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = g_init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_init_count > 0) g_init_count--;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t rc) {
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Version mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlSystemGetDriverVersion", NULL, NEED_NONE, &c);
    if (rc) return rc;
    return leave(copy_str(version, length, c.s->driver));
}
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlSystemGetNVMLVersion", NULL, NEED_NONE, &c);
    if (rc) return rc;
    char v[96];
    snprintf(v, sizeof v, "12.%s", c.s->driver);
    return leave(copy_str(version, length, v));
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlSystemGetCudaDriverVersion", NULL, NEED_NONE, &c);
    if (rc) return rc;
    if (!v) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *v = 12040;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ---- devices --------------------------------------------------------------------------------------------- */
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetCount_v2", NULL, NEED_NONE, &c);
    if (rc) return rc;
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned)c.s->ngpus;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, vh_t **device) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByIndex_v2", NULL, NEED_NONE, &c);
    if (rc) return rc;
    /* Faults aimed at one GPU also hit the call that hands out its handle. */
    int code, delay_ms;
    find_fault("nvmlDeviceGetHandleByIndex_v2", (int)index, &code, &delay_ms);
    if (code) return leave(code);
    if (!device || index >= MAX_GPUS || !find_gpu(c.s, (int)index)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &H_GPU[index];
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, vh_t **device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, vh_t **device) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByUUID", NULL, NEED_NONE, &c);
    if (rc) return rc;
    if (!uuid || !device) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < c.s->ngpus; i++) {
        gpu_t *g = &c.s->gpus[i];
        if (!strcmp(g->uuid, uuid)) { *device = &H_GPU[g->index]; return leave(NVML_SUCCESS); }
    }
    for (int i = 0; i < c.s->ncis; i++) {
        ci_t *ci = &c.s->cis[i];
        gpu_t *g = find_gpu(c.s, ci->gpu);
        char u[NAME_LEN];
        if (!g || !g->mig_current) continue;
        mig_uuid(g, ci->gi, ci->id, u, sizeof u);
        if (!strcmp(u, uuid)) { *device = &H_MIG[ci->gpu][ci->gi][ci->id]; return leave(NVML_SUCCESS); }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(vh_t *device, unsigned int *index) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetIndex", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!index) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.h->kind == K_MIG) return leave(NVML_ERROR_NOT_SUPPORTED);
    *index = (unsigned)c.g->index;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(vh_t *device, char *name, unsigned int length) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetName", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (c.h->kind == K_GPU) return leave(copy_str(name, length, c.g->name));
    char prof[NAME_LEN], full[2 * NAME_LEN + 8];
    mig_profile_name(c.g, c.gi, c.ci, prof, sizeof prof);
    snprintf(full, sizeof full, "%s MIG %s", c.g->name, prof);
    return leave(copy_str(name, length, full));
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(vh_t *device, char *uuid, unsigned int length) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetUUID", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (c.h->kind == K_GPU) return leave(copy_str(uuid, length, c.g->uuid));
    char u[NAME_LEN];
    mig_uuid(c.g, c.gi->id, c.ci->id, u, sizeof u);
    return leave(copy_str(uuid, length, u));
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(vh_t *device, unsigned int *minor) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetMinorNumber", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!minor) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.h->kind == K_MIG) return leave(NVML_ERROR_NOT_SUPPORTED);
    *minor = (unsigned)c.g->minor;
    return leave(NVML_SUCCESS);
}

/* Does a live process belong to the device behind the context (whole GPU, or one MIG instance)? */
static int proc_on(const ctx_t *c, const proc_t *p, int whole_gi) {
    if (p->gpu != c->g->index) return 0;
    if (c->h->kind == K_MIG) {
        if (p->gi != c->gi->id) return 0;
        if (!whole_gi && p->ci != c->ci->id) return 0;
    }
    return proc_alive(p);
}

static void memory_of(const ctx_t *c, unsigned long long *total, unsigned long long *used) {
    *used = 0;
    if (c->h->kind == K_MIG) {
        giprof_t *gp = giprof_by_id(c->g, (unsigned)c->gi->profile_id);
        *total = (gp ? gp->mem_mib : 0) * MIB;
    } else {
        *total = c->g->mem_mib * MIB;
    }
    for (int i = 0; i < c->s->nprocs; i++)
        if (proc_on(c, &c->s->procs[i], 1)) *used += c->s->procs[i].mem_mib * MIB;
    if (*used > *total) *used = *total;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(vh_t *device, nvmlMemory_t *memory) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetMemoryInfo", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!memory) return leave(NVML_ERROR_INVALID_ARGUMENT);
    memory_of(&c, &memory->total, &memory->used);
    memory->free = memory->total - memory->used;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(vh_t *device, nvmlMemory_v2_t *memory) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetMemoryInfo_v2", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!memory) return leave(NVML_ERROR_INVALID_ARGUMENT);
    memory_of(&c, &memory->total, &memory->used);
    memory->reserved = 0;
    memory->free = memory->total - memory->used;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(vh_t *device, nvmlUtilization_t *util) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetUtilizationRates", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!util) return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* As on real hardware: no utilization counters for MIG instances, nor for a GPU in MIG mode. */
    if (c.h->kind == K_MIG || c.g->mig_current) return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned sm = 0, mem = 0;
    for (int i = 0; i < c.s->nprocs; i++) {
        const proc_t *p = &c.s->procs[i];
        if (proc_on(&c, p, 1)) { sm += (unsigned)p->sm; mem += (unsigned)p->memutil; }
    }
    util->gpu = sm > 100 ? 100 : sm;
    util->memory = mem > 100 ? 100 : mem;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t running_processes(const char *fn, vh_t *device, unsigned int *count, nvmlProcessInfo_t *infos) {
    ctx_t c;
    nvmlReturn_t rc = enter(fn, device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = 0;
    for (int i = 0; i < c.s->nprocs; i++)
        if (proc_on(&c, &c.s->procs[i], 0)) n++;
    if (n == 0) { *count = 0; return leave(NVML_SUCCESS); }
    if (!infos || *count < n) { *count = n; return leave(NVML_ERROR_INSUFFICIENT_SIZE); }
    unsigned k = 0;
    for (int i = 0; i < c.s->nprocs && k < n; i++) {
        const proc_t *p = &c.s->procs[i];
        if (!proc_on(&c, p, 0)) continue;
        infos[k].pid = (unsigned)p->pid;
        infos[k].usedGpuMemory = p->mem_mib * MIB;
        infos[k].gpuInstanceId = c.g->mig_current && p->gi >= 0 ? (unsigned)p->gi : NO_ID;
        infos[k].computeInstanceId = c.g->mig_current && p->ci >= 0 ? (unsigned)p->ci : NO_ID;
        k++;
    }
    *count = k;
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(vh_t *d, unsigned int *n, nvmlProcessInfo_t *p) {
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v3", d, n, p);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(vh_t *d, unsigned int *n, nvmlProcessInfo_t *p) {
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v2", d, n, p);
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(vh_t *device, nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count, unsigned long long lastSeenTimeStamp) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetProcessUtilization", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.h->kind == K_MIG || c.g->mig_current) return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long now = now_us(c.s);
    unsigned n = 0;
    if (now > lastSeenTimeStamp)
        for (int i = 0; i < c.s->nprocs; i++)
            if (proc_on(&c, &c.s->procs[i], 1)) n++;
    if (n == 0) { *count = 0; return leave(NVML_ERROR_NOT_FOUND); }
    if (!samples || *count < n) { *count = n; return leave(NVML_ERROR_INSUFFICIENT_SIZE); }
    unsigned k = 0;
    for (int i = 0; i < c.s->nprocs && k < n; i++) {
        const proc_t *p = &c.s->procs[i];
        if (!proc_on(&c, p, 1)) continue;
        samples[k] = (nvmlProcessUtilizationSample_t){(unsigned)p->pid, now, (unsigned)p->sm,
                                                      (unsigned)p->memutil, 0, 0};
        k++;
    }
    *count = k;
    return leave(NVML_SUCCESS);
}

/* ---- MIG: read side -------------------------------------------------------------------------------------- */
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(vh_t *device, unsigned int *current, unsigned int *pending) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetMigMode", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!current || !pending) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.h->kind == K_MIG || !c.g->mig_capable) return leave(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned)c.g->mig_current;
    *pending = (unsigned)c.g->mig_pending;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(vh_t *device, unsigned int *count) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetMaxMigDeviceCount", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned m = 0;
    if (c.h->kind == K_GPU && c.g->mig_capable)
        for (int i = 0; i < c.g->ngiprof; i++)
            if ((unsigned)c.g->giprof[i].instances > m) m = (unsigned)c.g->giprof[i].instances;
    *count = m;
    return leave(NVML_SUCCESS);
}

/* Compute instances of one GPU in (GI id, CI id) order: MIG device index order. */
static int sorted_cis(state_t *s, int gpu, ci_t **out, int max) {
    int n = 0;
    for (int i = 0; i < s->ncis && n < max; i++)
        if (s->cis[i].gpu == gpu && find_gi(s, gpu, s->cis[i].gi)) out[n++] = &s->cis[i];
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && (out[j - 1]->gi > out[j]->gi ||
                                  (out[j - 1]->gi == out[j]->gi && out[j - 1]->id > out[j]->id)); j--) {
            ci_t *t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(vh_t *device, unsigned int index, vh_t **mig) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetMigDeviceHandleByIndex", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!mig || c.h->kind != K_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!c.g->mig_current) return leave(NVML_ERROR_NOT_SUPPORTED);
    ci_t *list[MAX_GI_ID * MAX_CI_ID];
    int n = sorted_cis(c.s, c.g->index, list, MAX_GI_ID * MAX_CI_ID);
    if ((int)index >= n) return leave(NVML_ERROR_NOT_FOUND);
    *mig = &H_MIG[c.g->index][list[index]->gi][list[index]->id];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(vh_t *device, unsigned int *is_mig) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceIsMigDeviceHandle", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!is_mig) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = c.h->kind == K_MIG;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(vh_t *device, unsigned int *id) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetGpuInstanceId", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!id) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.h->kind != K_MIG) return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = (unsigned)c.gi->id;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(vh_t *device, unsigned int *id) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetComputeInstanceId", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!id) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (c.h->kind != K_MIG) return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = (unsigned)c.ci->id;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(vh_t *mig, vh_t **device) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!device || c.h->kind != K_MIG) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &H_GPU[c.g->index];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t need_mig_capable_gpu(const ctx_t *c) {
    if (c->h->kind != K_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    return c->g->mig_capable ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

static void fill_giprof_v1(const giprof_t *p, nvmlGpuInstanceProfileInfo_t *i) {
    *i = (nvmlGpuInstanceProfileInfo_t){(unsigned)p->profile_id, 0, (unsigned)p->slices, (unsigned)p->instances,
                                        (unsigned)p->sm, (unsigned)p->slices, 0, 0, 0, 0, p->mem_mib};
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(vh_t *device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetGpuInstanceProfileInfo", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!info) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = need_mig_capable_gpu(&c))) return leave(rc);
    giprof_t *p = giprof_by_index(c.g, profile);
    if (!p) return leave(NVML_ERROR_NOT_SUPPORTED);
    fill_giprof_v1(p, info);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(vh_t *device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetGpuInstanceProfileInfoV", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!info) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = need_mig_capable_gpu(&c))) return leave(rc);
    giprof_t *p = giprof_by_index(c.g, profile);
    if (!p) return leave(NVML_ERROR_NOT_SUPPORTED);
    nvmlGpuInstanceProfileInfo_t v1;
    fill_giprof_v1(p, &v1);
    unsigned version = info->version;
    memcpy(&info->id, &v1, offsetof(nvmlGpuInstanceProfileInfo_t, memorySizeMB));
    info->version = version;
    info->memorySizeMB = p->mem_mib;
    snprintf(info->name, sizeof info->name, "%s", p->name);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(vh_t *device, unsigned int profileId,
                                                                  nvmlPlacement_t *placements,
                                                                  unsigned int *count) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetGpuInstancePossiblePlacements_v2", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = need_mig_capable_gpu(&c))) return leave(rc);
    giprof_t *p = giprof_by_id(c.g, profileId);
    if (!p) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!placements) { *count = (unsigned)p->nstarts; return leave(NVML_SUCCESS); }
    if (*count < (unsigned)p->nstarts) { *count = (unsigned)p->nstarts; return leave(NVML_ERROR_INSUFFICIENT_SIZE); }
    for (int i = 0; i < p->nstarts; i++)
        placements[i] = (nvmlPlacement_t){(unsigned)p->starts[i], (unsigned)p->placement_size};
    *count = (unsigned)p->nstarts;
    return leave(NVML_SUCCESS);
}

static int overlaps(int a_start, int a_size, int b_start, int b_size) {
    return a_start < b_start + b_size && b_start < a_start + a_size;
}
static int gi_slot_free(state_t *s, int gpu, int start, int size) {
    for (int i = 0; i < s->ngis; i++)
        if (s->gis[i].gpu == gpu && overlaps(start, size, s->gis[i].start, s->gis[i].size)) return 0;
    return 1;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(vh_t *device, unsigned int profileId,
                                                              unsigned int *count) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetGpuInstanceRemainingCapacity", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = need_mig_capable_gpu(&c))) return leave(rc);
    if (!c.g->mig_current) return leave(NVML_ERROR_NOT_SUPPORTED);
    giprof_t *p = giprof_by_id(c.g, profileId);
    if (!p) return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* Greedy: how many more instances fit in the free placements, each taking its slot. */
    unsigned n = 0;
    int taken[MAX_STARTS] = {0};
    for (int i = 0; i < p->nstarts; i++) {
        if (!gi_slot_free(c.s, c.g->index, p->starts[i], p->placement_size)) continue;
        int clash = 0;
        for (int j = 0; j < i; j++)
            if (taken[j] && overlaps(p->starts[i], p->placement_size, p->starts[j], p->placement_size)) clash = 1;
        if (!clash) { taken[i] = 1; n++; }
    }
    unsigned existing = 0;
    for (int i = 0; i < c.s->ngis; i++)
        if (c.s->gis[i].gpu == c.g->index && (unsigned)c.s->gis[i].profile_id == profileId) existing++;
    unsigned room = existing >= (unsigned)p->instances ? 0 : (unsigned)p->instances - existing;
    *count = n < room ? n : room;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(vh_t *device, unsigned int profileId, vh_t **instances,
                                              unsigned int *count) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetGpuInstances", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!count || !instances) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = need_mig_capable_gpu(&c))) return leave(rc);
    if (!c.g->mig_current) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!giprof_by_id(c.g, profileId)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = 0;
    for (int i = 0; i < c.s->ngis; i++)
        if (c.s->gis[i].gpu == c.g->index && (unsigned)c.s->gis[i].profile_id == profileId)
            instances[n++] = &H_GI[c.g->index][c.s->gis[i].id];
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(vh_t *device, unsigned int id, vh_t **instance) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceGetGpuInstanceById", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!instance) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((rc = need_mig_capable_gpu(&c))) return leave(rc);
    if (!c.g->mig_current) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (id >= MAX_GI_ID || !find_gi(c.s, c.g->index, (int)id)) return leave(NVML_ERROR_NOT_FOUND);
    *instance = &H_GI[c.g->index][id];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(vh_t *gi, nvmlGpuInstanceInfo_t *info) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlGpuInstanceGetInfo", gi, NEED_GI, &c);
    if (rc) return rc;
    if (!info) return leave(NVML_ERROR_INVALID_ARGUMENT);
    info->device = &H_GPU[c.g->index];
    info->id = (unsigned)c.gi->id;
    info->profileId = (unsigned)c.gi->profile_id;
    info->placement = (nvmlPlacement_t){(unsigned)c.gi->start, (unsigned)c.gi->size};
    return leave(NVML_SUCCESS);
}

/* A compute-instance profile as seen from one GPU instance (its slices bound what fits). */
static nvmlReturn_t ci_profile_on(const ctx_t *c, unsigned int index, ciprof_t **cp, giprof_t **gp) {
    *gp = giprof_by_id(c->g, (unsigned)c->gi->profile_id);
    *cp = ciprof_by_index(c->g, index);
    if (!*gp || !*cp || (*cp)->slices > (*gp)->slices) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(vh_t *gi, unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_t *info) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, NEED_GI, &c);
    if (rc) return rc;
    if (!info || engProfile != 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    ciprof_t *cp;
    giprof_t *gp;
    if ((rc = ci_profile_on(&c, profile, &cp, &gp))) return leave(rc);
    *info = (nvmlComputeInstanceProfileInfo_t){(unsigned)cp->profile_id, (unsigned)cp->slices,
                                               (unsigned)(gp->slices / cp->slices),
                                               (unsigned)(gp->sm * cp->slices / gp->slices), 1, 0, 0, 0, 0};
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(vh_t *gi, unsigned int profile,
                                                                  unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlGpuInstanceGetComputeInstanceProfileInfoV", gi, NEED_GI, &c);
    if (rc) return rc;
    if (!info || engProfile != 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    ciprof_t *cp;
    giprof_t *gp;
    if ((rc = ci_profile_on(&c, profile, &cp, &gp))) return leave(rc);
    unsigned version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->id = (unsigned)cp->profile_id;
    info->sliceCount = (unsigned)cp->slices;
    info->instanceCount = (unsigned)(gp->slices / cp->slices);
    info->multiprocessorCount = (unsigned)(gp->sm * cp->slices / gp->slices);
    info->sharedCopyEngineCount = 1;
    ci_profile_name(gp, cp, info->name, sizeof info->name);
    return leave(NVML_SUCCESS);
}

static int ci_slot_free(state_t *s, const gi_t *gi, int start, int size) {
    for (int i = 0; i < s->ncis; i++)
        if (s->cis[i].gpu == gi->gpu && s->cis[i].gi == gi->id && overlaps(start, size, s->cis[i].start, s->cis[i].size))
            return 0;
    return 1;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(vh_t *gi, unsigned int profileId,
                                                                        nvmlPlacement_t *placements,
                                                                        unsigned int *count) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlGpuInstanceGetComputeInstancePossiblePlacements", gi, NEED_GI, &c);
    if (rc) return rc;
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    giprof_t *gp = giprof_by_id(c.g, (unsigned)c.gi->profile_id);
    ciprof_t *cp = ciprof_by_id(c.g, profileId);
    if (!gp || !cp || cp->slices > gp->slices) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = (unsigned)(gp->slices / cp->slices);
    if (!placements) { *count = n; return leave(NVML_SUCCESS); }
    if (*count < n) { *count = n; return leave(NVML_ERROR_INSUFFICIENT_SIZE); }
    for (unsigned i = 0; i < n; i++)
        placements[i] = (nvmlPlacement_t){i * (unsigned)cp->slices, (unsigned)cp->slices};
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(vh_t *gi, unsigned int profileId,
                                                                       unsigned int *count) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", gi, NEED_GI, &c);
    if (rc) return rc;
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    giprof_t *gp = giprof_by_id(c.g, (unsigned)c.gi->profile_id);
    ciprof_t *cp = ciprof_by_id(c.g, profileId);
    if (!gp || !cp || cp->slices > gp->slices) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = 0;
    for (int start = 0; start + cp->slices <= gp->slices; start += cp->slices)
        if (ci_slot_free(c.s, c.gi, start, cp->slices)) n++;
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(vh_t *gi, unsigned int profileId, vh_t **instances,
                                                       unsigned int *count) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlGpuInstanceGetComputeInstances", gi, NEED_GI, &c);
    if (rc) return rc;
    if (!count || !instances) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = 0;
    for (int i = 0; i < c.s->ncis; i++) {
        const ci_t *x = &c.s->cis[i];
        if (x->gpu == c.g->index && x->gi == c.gi->id && (unsigned)x->profile_id == profileId)
            instances[n++] = &H_CI[x->gpu][x->gi][x->id];
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(vh_t *gi, unsigned int id, vh_t **instance) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlGpuInstanceGetComputeInstanceById", gi, NEED_GI, &c);
    if (rc) return rc;
    if (!instance) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (id >= MAX_CI_ID || !find_ci(c.s, c.g->index, c.gi->id, (int)id)) return leave(NVML_ERROR_NOT_FOUND);
    *instance = &H_CI[c.g->index][c.gi->id][id];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(vh_t *ci, nvmlComputeInstanceInfo_t *info) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlComputeInstanceGetInfo_v2", ci, NEED_CI, &c);
    if (rc) return rc;
    if (!info) return leave(NVML_ERROR_INVALID_ARGUMENT);
    info->device = &H_GPU[c.g->index];
    info->gpuInstance = &H_GI[c.g->index][c.gi->id];
    info->id = (unsigned)c.ci->id;
    info->profileId = (unsigned)c.ci->profile_id;
    info->placement = (nvmlPlacement_t){(unsigned)c.ci->start, (unsigned)c.ci->size};
    return leave(NVML_SUCCESS);
}
EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(vh_t *ci, nvmlComputeInstanceInfo_t *info) {
    return nvmlComputeInstanceGetInfo_v2(ci, info);
}

/* ---- MIG: write side (state file read-modify-write) -------------------------------------------------------- */
static int live_procs_on_gpu(state_t *s, int gpu, int gi, int ci) {
    for (int i = 0; i < s->nprocs; i++) {
        const proc_t *p = &s->procs[i];
        if (p->gpu != gpu || (gi >= 0 && p->gi != gi) || (ci >= 0 && p->ci != ci)) continue;
        if (proc_alive(p)) return 1;
    }
    return 0;
}

struct mig_mode_arg { int gpu, mode; };
static nvmlReturn_t mut_mig_mode(state_t *s, void *arg) {
    struct mig_mode_arg *a = arg;
    gpu_t *g = find_gpu(s, a->gpu);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    if (g->mig_current == a->mode) { g->mig_pending = a->mode; return NVML_SUCCESS; }
    if (live_procs_on_gpu(s, a->gpu, -1, -1)) return NVML_ERROR_IN_USE;
    for (int i = 0; i < s->ngis; i++)
        if (s->gis[i].gpu == a->gpu) return NVML_ERROR_IN_USE;
    g->mig_current = g->mig_pending = a->mode;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceSetMigMode(vh_t *device, unsigned int mode, nvmlReturn_t *activationStatus) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlDeviceSetMigMode", device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!activationStatus || mode > 1 || c.h->kind != K_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct mig_mode_arg a = {c.g->index, (int)mode};
    rc = modify_state(mut_mig_mode, &a);
    *activationStatus = rc;
    return leave(rc);
}

struct create_gi_arg { int gpu; unsigned profile_id; int start, size; /* -1: first free */ int id_out; };
static nvmlReturn_t mut_create_gi(state_t *s, void *arg) {
    struct create_gi_arg *a = arg;
    gpu_t *g = find_gpu(s, a->gpu);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_capable || !g->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    giprof_t *p = giprof_by_id(g, a->profile_id);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    if (s->ngis >= MAX_GIS) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    int count = 0, start = -1;
    for (int i = 0; i < s->ngis; i++)
        if (s->gis[i].gpu == a->gpu && (unsigned)s->gis[i].profile_id == a->profile_id) count++;
    if (count >= p->instances) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (a->start >= 0) {
        int valid = 0;
        for (int i = 0; i < p->nstarts; i++) valid |= p->starts[i] == a->start;
        if (!valid || a->size != p->placement_size) return NVML_ERROR_INVALID_ARGUMENT;
        if (!gi_slot_free(s, a->gpu, a->start, p->placement_size)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
        start = a->start;
    } else {
        for (int i = 0; i < p->nstarts && start < 0; i++)
            if (gi_slot_free(s, a->gpu, p->starts[i], p->placement_size)) start = p->starts[i];
        if (start < 0) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    int id = 1;
    while (id < MAX_GI_ID && find_gi(s, a->gpu, id)) id++;
    if (id >= MAX_GI_ID) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    s->gis[s->ngis++] = (gi_t){a->gpu, id, (int)a->profile_id, start, p->placement_size};
    a->id_out = id;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(const char *fn, vh_t *device, unsigned int profileId, int start, int size,
                              vh_t **out) {
    ctx_t c;
    nvmlReturn_t rc = enter(fn, device, NEED_DEVICE, &c);
    if (rc) return rc;
    if (!out || c.h->kind != K_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct create_gi_arg a = {c.g->index, profileId, start, size, -1};
    rc = modify_state(mut_create_gi, &a);
    if (rc == NVML_SUCCESS) *out = &H_GI[a.gpu][a.id_out];
    return leave(rc);
}
EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(vh_t *device, unsigned int profileId, vh_t **gi) {
    return create_gi("nvmlDeviceCreateGpuInstance", device, profileId, -1, -1, gi);
}
EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(vh_t *device, unsigned int profileId,
                                                             const nvmlPlacement_t *placement, vh_t **gi) {
    if (!placement) return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi("nvmlDeviceCreateGpuInstanceWithPlacement", device, profileId, (int)placement->start,
                     (int)placement->size, gi);
}

struct gi_ref { int gpu, gi; };
static nvmlReturn_t mut_destroy_gi(state_t *s, void *arg) {
    struct gi_ref *a = arg;
    if (!find_gi(s, a->gpu, a->gi)) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < s->ncis; i++)
        if (s->cis[i].gpu == a->gpu && s->cis[i].gi == a->gi) return NVML_ERROR_IN_USE;
    if (live_procs_on_gpu(s, a->gpu, a->gi, -1)) return NVML_ERROR_IN_USE;
    int k = 0;
    for (int i = 0; i < s->ngis; i++)
        if (!(s->gis[i].gpu == a->gpu && s->gis[i].id == a->gi)) s->gis[k++] = s->gis[i];
    s->ngis = k;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(vh_t *gi) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlGpuInstanceDestroy", gi, NEED_GI, &c);
    if (rc) return rc;
    struct gi_ref a = {c.g->index, c.gi->id};
    return leave(modify_state(mut_destroy_gi, &a));
}

struct create_ci_arg { int gpu, gi; unsigned profile_id; int start; int id_out; };
static nvmlReturn_t mut_create_ci(state_t *s, void *arg) {
    struct create_ci_arg *a = arg;
    gpu_t *g = find_gpu(s, a->gpu);
    gi_t *gi = g ? find_gi(s, a->gpu, a->gi) : NULL;
    if (!gi) return NVML_ERROR_INVALID_ARGUMENT;
    giprof_t *gp = giprof_by_id(g, (unsigned)gi->profile_id);
    ciprof_t *cp = ciprof_by_id(g, a->profile_id);
    if (!gp || !cp || cp->slices > gp->slices) return NVML_ERROR_INVALID_ARGUMENT;
    if (s->ncis >= MAX_CIS) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    int start = -1;
    if (a->start >= 0) {
        if (a->start % cp->slices || a->start + cp->slices > gp->slices) return NVML_ERROR_INVALID_ARGUMENT;
        if (!ci_slot_free(s, gi, a->start, cp->slices)) return NVML_ERROR_INSUFFICIENT_RESOURCES;
        start = a->start;
    } else {
        for (int x = 0; x + cp->slices <= gp->slices && start < 0; x += cp->slices)
            if (ci_slot_free(s, gi, x, cp->slices)) start = x;
        if (start < 0) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    int id = 0;
    while (id < MAX_CI_ID && find_ci(s, a->gpu, a->gi, id)) id++;
    if (id >= MAX_CI_ID) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    s->cis[s->ncis++] = (ci_t){a->gpu, a->gi, id, (int)a->profile_id, start, cp->slices};
    a->id_out = id;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_ci(const char *fn, vh_t *gi, unsigned int profileId, int start, vh_t **out) {
    ctx_t c;
    nvmlReturn_t rc = enter(fn, gi, NEED_GI, &c);
    if (rc) return rc;
    if (!out) return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct create_ci_arg a = {c.g->index, c.gi->id, profileId, start, -1};
    rc = modify_state(mut_create_ci, &a);
    if (rc == NVML_SUCCESS) *out = &H_CI[a.gpu][a.gi][a.id_out];
    return leave(rc);
}
EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(vh_t *gi, unsigned int profileId, vh_t **ci) {
    return create_ci("nvmlGpuInstanceCreateComputeInstance", gi, profileId, -1, ci);
}
EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(vh_t *gi, unsigned int profileId,
                                                                      const nvmlPlacement_t *placement,
                                                                      vh_t **ci) {
    if (!placement) return NVML_ERROR_INVALID_ARGUMENT;
    return create_ci("nvmlGpuInstanceCreateComputeInstanceWithPlacement", gi, profileId, (int)placement->start, ci);
}

struct ci_ref { int gpu, gi, ci; };
static nvmlReturn_t mut_destroy_ci(state_t *s, void *arg) {
    struct ci_ref *a = arg;
    if (!find_ci(s, a->gpu, a->gi, a->ci)) return NVML_ERROR_INVALID_ARGUMENT;
    if (live_procs_on_gpu(s, a->gpu, a->gi, a->ci)) return NVML_ERROR_IN_USE;
    int k = 0;
    for (int i = 0; i < s->ncis; i++)
        if (!(s->cis[i].gpu == a->gpu && s->cis[i].gi == a->gi && s->cis[i].id == a->ci)) s->cis[k++] = s->cis[i];
    s->ncis = k;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(vh_t *ci) {
    ctx_t c;
    nvmlReturn_t rc = enter("nvmlComputeInstanceDestroy", ci, NEED_CI, &c);
    if (rc) return rc;
    struct ci_ref a = {c.g->index, c.gi->id, c.ci->id};
    return leave(modify_state(mut_destroy_ci, &a));
}
