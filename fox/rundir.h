// fox/rundir.h: the run directory (--out, docs/model.md §5.1): its lock, the refusal to write into another
// run's directory, --overwrite, the files a killed run left, the log cut back to the checkpoint resumed,
// and the undoing of a failed start.
#ifndef FOX_RUNDIR_H
#define FOX_RUNDIR_H

#include <sys/file.h>
#include "run_base.h"

// One run per directory: rank 0 holds an exclusive lock on OUT/.lock (with its PID inside) for the
// run's life; the kernel drops it when the process ends, however it ends. Returns the holder's PID
// when another run has it, else 0.
static long lock_out_dir(Run *r) {
    char path[4352];
    snprintf(path, sizeof(path), "%s/.lock", r->args.out);
    r->lock_fd = open(path, O_RDWR | O_CREAT, 0644);
    if (r->lock_fd < 0) fox_fatal("cannot open %s: %s", path, strerror(errno));
    if (flock(r->lock_fd, LOCK_EX | LOCK_NB)) {
        if (errno != EWOULDBLOCK) fox_fatal("cannot lock %s: %s", path, strerror(errno));
        char pid[32] = {0};
        ssize_t got = pread(r->lock_fd, pid, sizeof(pid) - 1, 0);
        long holder = got > 0 ? atol(pid) : 0;
        return holder > 0 ? holder : -1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(r->lock_fd, 0) || pwrite(r->lock_fd, pid, (size_t)n, 0) != n) fox_fatal("cannot write %s: %s", path, strerror(errno));
    return 0;
}

// Whether OUT holds the work of an earlier run: checkpoints or a non-empty log.
static int out_dir_used(const char *out) {
    int steps[4096];
    char path[4352];
    struct stat st;
    snprintf(path, sizeof(path), "%s/log.jsonl", out);
    return fox_ckpt_list(out, steps, 4096) > 0 || (stat(path, &st) == 0 && st.st_size > 0);
}

// On resume at `step`, log.jsonl keeps only the lines of steps up to it (a killed run may have logged
// steps past its newest checkpoint, and a line cut short by the kill), so no step appears twice. A
// skipped step's line carries the step it tried (step + 1 for the skips before the checkpoint's next
// step, which a stop checkpoints too): those lines stay while their running count "skipped_steps" is
// within the checkpoint's `skipped`.
static void cut_log(const char *out, int step, long long skipped) {
    char path[4352], tmp[4400];
    snprintf(path, sizeof(path), "%s/log.jsonl", out);
    size_t len;
    char *text = fox_read_file(path, &len);
    if (!text) return;
    FILE *f = fox_open_tmp(out, "log.jsonl", tmp, sizeof(tmp));
    for (char *line = text, *end; (end = strchr(line, '\n')) != NULL; line = end + 1) {
        int st, n = 0;
        long long count;
        if (sscanf(line, "{\"step\": %d, \"skipped\": %n", &st, &n) < 1) continue;
        const char *at = n ? strstr(line, "\"skipped_steps\": ") : NULL;
        int keep = n ? at && at < end && sscanf(at, "\"skipped_steps\": %lld", &count) == 1 && count <= skipped && st <= step + 1
                     : st <= step;
        if (keep) fox_fwrite(line, 1, (size_t)(end - line + 1), f, tmp);
    }
    free(text);
    fox_commit_tmp(f, tmp);
}

// --overwrite: removes what an earlier run left in OUT (checkpoints, temporaries, logs, losses).
static void clear_out_dir(const char *out) {
    DIR *d = opendir(out);
    if (!d) fox_fatal("cannot open %s: %s", out, strerror(errno));
    struct dirent *e;
    char path[4352];
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        snprintf(path, sizeof(path), "%s/%s", out, n);
        if (!strncmp(n, "ckpt_", 5) || !strncmp(n, ".tmp_ckpt_", 10)) fox_remove_flat_dir(path);
        else if (!strcmp(n, "log.jsonl") || !strncmp(n, "train_loss_pos_", 15) || !strncmp(n, "per_token_loss.", 15))
            if (unlink(path)) fox_fatal("cannot remove %s: %s", path, strerror(errno));
    }
    closedir(d);
}

// The step of a per-position loss file's name, train_loss_pos_SSSSSSSS.npy, or -1 for another name.
static int train_pos_loss_step(const char *name) {
    if (strlen(name) != 27 || strncmp(name, "train_loss_pos_", 15) || strspn(name + 15, "0123456789") != 8 ||
        strcmp(name + 23, ".npy"))
        return -1;
    return atoi(name + 15);
}

// Removes what a killed run left in OUT that no checkpoint up to `step` (the one resumed, 0 when none)
// accounts for: checkpoint directories whose write did not finish (.tmp_ckpt_*), a half-written copy of
// log.jsonl, and the per-position losses of later steps (written just before a checkpoint that was not).
// Rank 0, under the lock; one line names what went.
static void remove_stale_files(const char *out, int step) {
    DIR *d = opendir(out);
    if (!d) fox_fatal("cannot open %s: %s", out, strerror(errno));
    struct dirent *e;
    char path[4352], gone[1024] = "";
    size_t said = 0;
    int count = 0;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        int tmp_dir = !strncmp(n, ".tmp_ckpt_", 10);
        if (!tmp_dir && strcmp(n, "log.jsonl.tmp") && train_pos_loss_step(n) <= step) continue;
        snprintf(path, sizeof(path), "%s/%s", out, n);
        if (tmp_dir) fox_remove_flat_dir(path);
        else if (unlink(path)) fox_fatal("cannot remove %s: %s", path, strerror(errno));
        if (said < sizeof(gone)) said += (size_t)snprintf(gone + said, sizeof(gone) - said, "%s%s", count ? ", " : "", n);
        count++;
    }
    closedir(d);
    if (count) printf("removed what an interrupted run left in %s: %s\n", out, gone);
}

// What a failed start undoes (fox_fatal_undo): the lock file it created, and the run directory when it
// created that too (rmdir: only while nothing else is in it).
static char run_undo_lock[4352], run_undo_dir[4096];

static void run_undo_start(void) {
    if (run_undo_lock[0]) unlink(run_undo_lock);
    if (run_undo_dir[0]) rmdir(run_undo_dir);
}

// Rank 0 decides whether the run may use OUT (locked by no other run; a fresh run only in an unused
// directory, or with --overwrite, whose deletion waits for the start-up checks: r->clear_out); every
// rank fails alike when it may not, rank 0 saying why.
static void claim_out_dir(Run *r) {
    FoxArgs *a = &r->args;
    char why[4608] = "";
    if (r->dist.rank == 0) {
        struct stat st;
        if (stat(a->out, &st)) snprintf(run_undo_dir, sizeof(run_undo_dir), "%s", a->out);
        snprintf(run_undo_lock, sizeof(run_undo_lock), "%s/.lock", a->out);
        if (stat(run_undo_lock, &st) == 0) run_undo_lock[0] = 0;
        fox_fatal_undo = run_undo_start;
        fox_mkdir_p(a->out);
        long holder = lock_out_dir(r);
        if (holder)
            snprintf(why, sizeof(why), "%s is in use by another run (pid %ld; %s/.lock): one run per directory", a->out,
                     holder, a->out);
        else if (!a->resume && out_dir_used(a->out)) {
            if (!a->overwrite)
                snprintf(why, sizeof(why), "%s holds an earlier run (checkpoints or log.jsonl): add --resume to continue it, "
                         "or --overwrite to delete it and start over", a->out);
            else
                r->clear_out = 1;
        }
    }
    dist_broadcast(&r->dist, why, sizeof(why), 0);
    if (why[0] && r->dist.rank == 0) fox_fatal("%s", why);
    if (why[0]) exit(1);
}

// Rank 0, once the start-up checks have passed: the earlier run deleted (--overwrite), what an
// interrupted run left removed, log.jsonl cut back to the resumed step and opened. From here on a
// failure undoes nothing.
static void open_out_dir(Run *r) {
    const FoxArgs *a = &r->args;
    char path[4352];
    if (r->clear_out) clear_out_dir(a->out);
    remove_stale_files(a->out, r->step);
    if (r->step) cut_log(a->out, r->step, r->skipped);
    snprintf(path, sizeof(path), "%s/log.jsonl", a->out);
    r->log = fox_fopen(path, r->step ? "a" : "w");
    fox_fatal_undo = NULL;
}
#endif
