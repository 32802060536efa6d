// fox/io.h: checked file and memory helpers. Every failure prints one line and exits non-zero.
#ifndef FOX_IO_H
#define FOX_IO_H

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/stat.h>

#if defined(__GNUC__)
#define FOX_NORETURN __attribute__((noreturn))
#define FOX_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FOX_NORETURN
#define FOX_PRINTF(a, b)
#endif

// What fox_fatal does besides printing: removes a half-written directory (a checkpoint being
// written), undoes what a run's failed start made (fox_fatal_undo: its lock file and the run
// directory it created), and appends a hint to the message (which older checkpoint a resume could use).
static char fox_fatal_cleanup_dir[4096];
static void (*fox_fatal_undo)(void);
static char fox_fatal_hint[512];

// Removes a directory that holds only files; returns 0, or -1 with errno set (nothing to remove: 0).
static inline int fox_remove_flat_dir_status(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    char path[4352];
    int rc = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path) || unlink(path)) rc = -1;
    }
    closedir(d);
    return rmdir(dir) || rc ? -1 : 0;
}

// One line "error: ..." (and the hint) on stderr, the half-written directory removed, exit `status`.
// The line goes out in one write: under mpirun the ranks' lines do not interleave.
static inline FOX_NORETURN void fox_vfatal(int status, const char *fmt, va_list ap) {
    char line[8192];
    int n = snprintf(line, sizeof(line), "error: ");
    n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    if (n > (int)sizeof(line) - 2) n = (int)sizeof(line) - 2;
    n += snprintf(line + n, sizeof(line) - (size_t)n, "%s\n", fox_fatal_hint);
    if (n > (int)sizeof(line) - 1) n = (int)sizeof(line) - 1;
    fflush(stdout);
    fputs(line, stderr);
    if (fox_fatal_cleanup_dir[0]) fox_remove_flat_dir_status(fox_fatal_cleanup_dir);
    if (fox_fatal_undo) fox_fatal_undo();
    exit(status);
}

// Bad input is never a crash: one line "error: ..." on stderr and exit status 1.
static inline FOX_NORETURN FOX_PRINTF(1, 2) void fox_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fox_vfatal(1, fmt, ap);
}

static inline void *fox_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fox_fatal("out of memory allocating %zu bytes", bytes);
    return p;
}

static inline void *fox_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fox_fatal("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

static inline void *fox_realloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) fox_fatal("out of memory allocating %zu bytes", bytes);
    return q;
}

static inline char *fox_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)fox_malloc(n);
    memcpy(d, s, n);
    return d;
}

// Reads a whole file into a malloc'd buffer (NUL-terminated for convenience, *len excludes it).
// Returns NULL (errno set) if the file cannot be opened or read.
static inline char *fox_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)fox_malloc(cap + 1);
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) {
            if (ferror(f)) { free(buf); fclose(f); return NULL; }
            break;
        }
        cap *= 2;
        buf = (char *)fox_realloc(buf, cap + 1);
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

static inline FILE *fox_fopen(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (!f) fox_fatal("cannot open %s: %s", path, strerror(errno));
    return f;
}

static inline void fox_fread(void *buf, size_t size, size_t n, FILE *f, const char *path) {
    if (fread(buf, size, n, f) != n) fox_fatal("%s is truncated or unreadable", path);
}

static inline void fox_fwrite(const void *buf, size_t size, size_t n, FILE *f, const char *path) {
    if (fwrite(buf, size, n, f) != n) fox_fatal("cannot write %s: %s", path, strerror(errno));
}

// Flushes and fsyncs a file opened for writing, then closes it.
static inline void fox_fclose_synced(FILE *f, const char *path) {
    if (fflush(f) || fsync(fileno(f))) fox_fatal("cannot write %s: %s", path, strerror(errno));
    if (fclose(f)) fox_fatal("cannot close %s: %s", path, strerror(errno));
}

static inline long long fox_file_size(const char *path) {
    struct stat st;
    if (stat(path, &st)) fox_fatal("cannot open %s: %s", path, strerror(errno));
    return (long long)st.st_size;
}

// fsync a directory, making renames and creations inside it durable.
static inline void fox_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY);
    if (fd < 0) fox_fatal("cannot open directory %s: %s", dir, strerror(errno));
    if (fsync(fd)) fox_fatal("cannot sync directory %s: %s", dir, strerror(errno));
    close(fd);
}

static inline void fox_mkdir_p(const char *dir) {
    char buf[4096];
    if (snprintf(buf, sizeof(buf), "%s", dir) >= (int)sizeof(buf)) fox_fatal("path too long: %s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) fox_fatal("cannot create %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST) fox_fatal("cannot create %s: %s", buf, strerror(errno));
}

// A file DIR/name written whole before anyone sees it: opened as DIR/name.tmp (its path into tmp; DIR made
// if missing), then fox_commit_tmp syncs it and renames it into place.
static inline FILE *fox_open_tmp(const char *dir, const char *name, char *tmp, size_t cap) {
    fox_mkdir_p(dir);
    if (snprintf(tmp, cap, "%s/%s.tmp", dir, name) >= (int)cap) fox_fatal("path too long: %s", dir);
    return fox_fopen(tmp, "w");
}

static inline void fox_commit_tmp(FILE *f, const char *tmp) {
    fox_fclose_synced(f, tmp);
    char final_path[4400];
    snprintf(final_path, sizeof(final_path), "%.*s", (int)(strlen(tmp) - 4), tmp);
    if (rename(tmp, final_path)) fox_fatal("cannot rename %s: %s", tmp, strerror(errno));
}

#endif
