// dev/cuda/timeline.cu: a kernel timeline of any CUDA program, for where a training step goes inside the step
// (dev/cuda/step_profile times each piece alone, an upper bound). Built as a CUDA injection library: the driver
// loads it at cuInit when CUDA_INJECTION64_PATH names it, and CUPTI's activity API then records every kernel,
// memset and memcpy with its GPU start and end (ns) and stream, without serializing the kernels. The records are
// written, one a line, to the file FOX_TIMELINE names (a %p in it becomes the process id: one file a rank under
// mpirun): kind (K kernel, S memset, C memcpy), start, end, stream, name (demangled); scripts/timeline.py reads
// them.
// Usage (repository root): make -C dev/cuda timeline.so &&
//   FOX_TIMELINE=/tmp/t.tsv CUDA_INJECTION64_PATH=$PWD/dev/cuda/timeline.so ./train_fox ... &&
//   python3 scripts/timeline.py /tmp/t.tsv
#include <cupti.h>
#include <cxxabi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static FILE *out;

static void die(const char *what, CUptiResult r) {
    const char *s = "";
    cuptiGetResultString(r, &s);
    fprintf(stderr, "timeline: %s: %s\n", what, s);
    exit(1);
}

#define CUPTI_CHECK(call)                  \
    do {                                   \
        CUptiResult r_ = (call);           \
        if (r_ != CUPTI_SUCCESS) die(#call, r_); \
    } while (0)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 8u << 20;
    *buffer = (uint8_t *)aligned_alloc(8, *size);
    if (!*buffer) {
        fprintf(stderr, "timeline: out of host memory for a record buffer\n");
        exit(1);
    }
    *max_records = 0;
}

// A kernel's name as its source spells it (the mangled one where it does not demangle).
static void write_record(char kind, uint64_t start, uint64_t end, uint32_t stream, const char *name) {
    int status = 0;
    char *plain = name[0] == '_' ? abi::__cxa_demangle(name, NULL, NULL, &status) : NULL;
    if (fprintf(out, "%c\t%llu\t%llu\t%u\t%s\n", kind, (unsigned long long)start, (unsigned long long)end, stream,
                plain ? plain : name) < 0) {
        fprintf(stderr, "timeline: writing the timeline failed\n");
        exit(1);
    }
    free(plain);
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    for (;;) {
        CUptiResult r = cuptiActivityGetNextRecord(buffer, valid, &rec);
        if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
        if (r != CUPTI_SUCCESS) die("cuptiActivityGetNextRecord", r);
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
            write_record('K', k->start, k->end, k->streamId, k->name);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *s = (const CUpti_ActivityMemset4 *)rec;
            write_record('S', s->start, s->end, s->streamId, "memset");
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)rec;
            write_record('C', c->start, c->end, c->streamId, "memcpy");
        }
    }
    size_t dropped = 0;
    CUPTI_CHECK(cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped));
    if (dropped) fprintf(stderr, "timeline: %zu records dropped\n", dropped);
    free(buffer);
}

static void flush_at_exit(void) {
    CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    if (fclose(out) != 0) fprintf(stderr, "timeline: closing the timeline failed\n");
}

extern "C" int InitializeInjection(void) {
    const char *path = getenv("FOX_TIMELINE");
    if (!path || !*path) {
        fprintf(stderr, "timeline: set FOX_TIMELINE to the file to write\n");
        exit(1);
    }
    char name[4096];
    const char *p = strstr(path, "%p");
    int n = p ? snprintf(name, sizeof name, "%.*s%d%s", (int)(p - path), path, (int)getpid(), p + 2)
              : snprintf(name, sizeof name, "%s", path);
    if (n < 0 || n >= (int)sizeof name) {
        fprintf(stderr, "timeline: FOX_TIMELINE is too long\n");
        exit(1);
    }
    out = fopen(name, "wx");  // never over another run's timeline
    if (!out) {
        fprintf(stderr, "timeline: cannot create %s (it must not exist)\n", name);
        exit(1);
    }
    CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    if (atexit(flush_at_exit) != 0) {
        fprintf(stderr, "timeline: atexit failed\n");
        exit(1);
    }
    return 1;
}
