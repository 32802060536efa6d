// test/fixture.h: the fixture format train_fox.py writes and the tests read. A fixture is a list
// of named float64 tensors: int32 FOX_FIXTURE_MAGIC, int32 count, then per tensor: int32 name
// length, the name's bytes (no NUL), int32 ndim, int64 dims[ndim], float64 data (row-major).
#ifndef FOX_FIXTURE_H
#define FOX_FIXTURE_H

#define FOX_FIXTURE_MAGIC 20261123

#include <stdint.h>
#include "fox/io.h"      // fox_fopen, fox_fread, fox_fatal
#include "fox/config.h"  // FoxConfig, FOX_CONFIG_FIELDS: a fixture carries its model's config

typedef struct {
    char name[128];
    int ndim;
    int64_t dims[8];
    size_t numel;
    double *data;
} FixtureTensor;

typedef struct {
    int count;
    FixtureTensor *t;
} Fixture;

static inline void fixture_load(Fixture *fx, const char *path) {
    FILE *f = fox_fopen(path, "rb");
    int32_t head[2];
    fox_fread(head, sizeof(int32_t), 2, f, path);
    if (head[0] != FOX_FIXTURE_MAGIC) fox_fatal("%s is not a fixture (bad magic)", path);
    fx->count = head[1];
    fx->t = (FixtureTensor *)fox_calloc((size_t)fx->count, sizeof(FixtureTensor));
    for (int i = 0; i < fx->count; i++) {
        FixtureTensor *t = &fx->t[i];
        int32_t len, ndim;
        fox_fread(&len, sizeof(int32_t), 1, f, path);
        if (len <= 0 || len >= (int32_t)sizeof(t->name)) fox_fatal("%s: bad tensor name length %d", path, len);
        fox_fread(t->name, 1, (size_t)len, f, path);
        fox_fread(&ndim, sizeof(int32_t), 1, f, path);
        if (ndim < 0 || ndim > 8) fox_fatal("%s: tensor %s has %d dims", path, t->name, ndim);
        t->ndim = ndim;
        fox_fread(t->dims, sizeof(int64_t), (size_t)ndim, f, path);
        t->numel = 1;
        for (int d = 0; d < ndim; d++) t->numel *= (size_t)t->dims[d];
        t->data = (double *)fox_malloc(t->numel * sizeof(double));
        fox_fread(t->data, sizeof(double), t->numel, f, path);
    }
    fclose(f);
}

// The tensor called name, or NULL.
static inline const FixtureTensor *fixture_find(const Fixture *fx, const char *name) {
    for (int i = 0; i < fx->count; i++)
        if (!strcmp(fx->t[i].name, name)) return &fx->t[i];
    return NULL;
}

// The tensor called name; exits if it is missing.
static inline const FixtureTensor *fixture_get(const Fixture *fx, const char *name) {
    const FixtureTensor *t = fixture_find(fx, name);
    if (!t) fox_fatal("fixture has no tensor %s", name);
    return t;
}

// The document separator a fixture was computed with (its "doc_sep" tensor, docs/model.md §1.8), or -1
// for a fixture without the document mask.
static inline int fixture_doc_sep(const Fixture *fx) {
    const FixtureTensor *t = fixture_find(fx, "doc_sep");
    return t ? (int)t->data[0] : -1;
}

// The model config a fixture was computed for (its "config" tensor, FOX_CONFIG_FIELDS order).
static inline FoxConfig fixture_config(const Fixture *fx) {
    const FixtureTensor *t = fixture_get(fx, "config");
    FoxConfig c;
    int i = 0;
#define FOX_FX_INT(name) c.name = (int)t->data[i++];
#define FOX_FX_FLOAT(name) c.name = (float)t->data[i++];
#define X(type, name, dflt) FOX_FX_##type(name)
    FOX_CONFIG_FIELDS(X)
#undef X
#undef FOX_FX_INT
#undef FOX_FX_FLOAT
    if ((size_t)i != t->numel) fox_fatal("fixture config has %zu fields, this build %d", t->numel, i);
    return c;
}

// Token ids stored as float64 values, back to ints.
static inline void fixture_ints(int *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (int)src[i];
}

// The fixture's tensors prefix.<name> (e.g. "param.") as one fp32 vector in the FOX_PARAMS layout.
static inline void fixture_params(const Fixture *fx, const FoxLayout *lay, const char *prefix, float *dst) {
    char name[160];
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &lay->p[k];
        if (!p->numel) continue;
        snprintf(name, sizeof(name), "%s%s", prefix, p->name);
        const FixtureTensor *t = fixture_get(fx, name);
        if (t->numel != p->numel) fox_fatal("fixture %s has %zu values, layout needs %zu", name, t->numel, p->numel);
        for (size_t i = 0; i < p->numel; i++) dst[p->offset + i] = (float)t->data[i];
    }
}

static inline void fixture_free(Fixture *fx) {
    for (int i = 0; i < fx->count; i++) free(fx->t[i].data);
    free(fx->t);
    fx->t = NULL;
    fx->count = 0;
}

#endif
