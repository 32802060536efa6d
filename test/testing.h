// test/testing.h: the checks of the C and CUDA tests: PASS/FAIL lines, a count for the closing
// "N passed, M failed" line, and the norm-relative error of a tensor against a float64 reference.
#ifndef FOX_TESTING_H
#define FOX_TESTING_H

#include <stdarg.h>
#include <stdio.h>
#include <math.h>
#include "fox/io.h"  // FOX_PRINTF

static int passed, failed;

static FOX_PRINTF(2, 3) void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) passed++;
    else failed++;
}

// Max |a − ref| and that over max |ref| (a norm-relative error, robust to tiny entries).
typedef struct { double abs, rel; } Err;

static inline Err compare(const float *a, const double *ref, size_t n) {
    double mx = 0.0, mref = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (d > mx || isnan(d)) mx = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
    }
    Err e = {mx, mref > 0 ? mx / mref : mx};
    return e;
}

// A PASS line when the tensor's norm-relative error is within tol.
static inline void check_rel(const char *fx, const char *what, const float *a, const double *ref, size_t n, double tol) {
    Err e = compare(a, ref, n);
    check(e.rel <= tol, "%-18s %-24s max abs %.3e  rel %.3e  (tol rel %.0e)", fx, what, e.abs, e.rel, tol);
}

#endif
