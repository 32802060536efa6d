// fox/fixture.h: the fixture format train_fox.py writes and the tests read. A fixture is a list
// of named float64 tensors: int32 FOX_FIXTURE_MAGIC, int32 count, then per tensor: int32 name
// length, the name's bytes (no NUL), int32 ndim, int64 dims[ndim], float64 data (row-major).
#ifndef FOX_FIXTURE_H
#define FOX_FIXTURE_H

#define FOX_FIXTURE_MAGIC 20261123

#include <stdint.h>
#include "io.h"

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

// The tensor called name; exits if it is missing.
static inline const FixtureTensor *fixture_get(const Fixture *fx, const char *name) {
    for (int i = 0; i < fx->count; i++)
        if (!strcmp(fx->t[i].name, name)) return &fx->t[i];
    fox_fatal("fixture has no tensor %s", name);
    return NULL;
}

static inline void fixture_free(Fixture *fx) {
    for (int i = 0; i < fx->count; i++) free(fx->t[i].data);
    free(fx->t);
    fx->t = NULL;
    fx->count = 0;
}

#endif
