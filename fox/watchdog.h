// fox/watchdog.h: the collective timeout (--collective-timeout; docs/usage.md "Ranks that fail loudly"). A rank
// that dies or stops answering leaves the others waiting in a collective (MPI or NCCL) that has no time limit of
// its own. A thread beside the main one watches the main thread's signs of progress (fox_watchdog_beat: a
// micro-batch, a step, a validation sequence, an evaluation batch, a checkpoint's phases); when none came for the
// timeout it prints one line (where the run stood, the newest complete checkpoint), lets the trainer abort its
// communicator (the GPU trainer's ncclCommAbort, as NCCL's documentation advises for a hung collective) and ends
// the process with FOX_EXIT_PEER_LOST; the launcher (mpirun, srun --kill-on-bad-exit=1) then ends the other
// ranks. Rank 0 speaks first, the others a grace later, rank by rank, so that one line says what happened, and
// one that does speak knows that rank 0 did not end the job. The same thread polls the trainer's asynchronous
// communicator errors (ncclCommGetAsyncError) at every tick.
#ifndef FOX_WATCHDOG_H
#define FOX_WATCHDOG_H

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "io.h"

#define FOX_EXIT_PEER_LOST 76  // a rank died or stopped answering: relaunch with --resume

typedef struct {
    const char *(*poll)(void *ctx);  // an asynchronous communicator error, or NULL
    void (*abort)(void *ctx);        // unblocks and frees the communicator
    void *ctx;
} FoxWatchdogHooks;

// The state both threads read; the main thread's writes are single atomic stores (__atomic builtins: C11 and
// the CUDA trainer's C++ alike).
static struct {
    int on, started, rank;  // on: watching (fox_watchdog_stop ends it for good)
    double timeout;
    long long last_ns;  // the newest sign of progress (CLOCK_MONOTONIC)
    int step, newest_ckpt;
    const char *phase;  // a string literal: "in step", "writing the checkpoint of step", ...
    FoxWatchdogHooks hooks;  // under fox_wd_lock: the trainer sets and clears them as its communicator comes and goes
    pthread_t thread;
} fox_wd;
static pthread_mutex_t fox_wd_lock = PTHREAD_MUTEX_INITIALIZER;

static inline long long fox_wd_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// A sign of progress: the main thread is at `phase` of `step` now.
static inline void fox_watchdog_beat(const char *phase, int step) {
    if (!__atomic_load_n(&fox_wd.on, __ATOMIC_RELAXED)) return;
    __atomic_store_n(&fox_wd.phase, phase, __ATOMIC_RELAXED);
    __atomic_store_n(&fox_wd.step, step, __ATOMIC_RELAXED);
    __atomic_store_n(&fox_wd.last_ns, fox_wd_now_ns(), __ATOMIC_RELEASE);
}

// A sign of progress in the phase and step last given (an evaluation's batches).
static inline void fox_watchdog_alive(void) {
    if (__atomic_load_n(&fox_wd.on, __ATOMIC_RELAXED)) __atomic_store_n(&fox_wd.last_ns, fox_wd_now_ns(), __ATOMIC_RELEASE);
}

// The newest complete checkpoint (-1: none), named by the line the watchdog prints.
static inline void fox_watchdog_checkpoint(int step) { __atomic_store_n(&fox_wd.newest_ckpt, step, __ATOMIC_RELAXED); }

// The trainer's communicator, once it exists; cleared (ctx NULL) before it is destroyed.
static inline void fox_watchdog_hooks(FoxWatchdogHooks h) {
    pthread_mutex_lock(&fox_wd_lock);
    fox_wd.hooks = h;
    pthread_mutex_unlock(&fox_wd_lock);
}

// Forgets the hooks of the communicator ctx, about to be destroyed.
static inline void fox_watchdog_forget(void *ctx) {
    pthread_mutex_lock(&fox_wd_lock);
    if (fox_wd.hooks.ctx == ctx) memset(&fox_wd.hooks, 0, sizeof(fox_wd.hooks));
    pthread_mutex_unlock(&fox_wd_lock);
}

static void fox_wd_on_alarm(int sig) {
    (void)sig;
    _exit(FOX_EXIT_PEER_LOST);
}

// The process ends here: the line, the communicator aborted (bounded: an abort that hangs is cut short by
// SIGALRM), the exit code.
static void fox_wd_fire(const char *why) {
    signal(SIGALRM, fox_wd_on_alarm);
    alarm(20);
    char line[768], ckpt[64] = "no checkpoint yet";
    int newest = __atomic_load_n(&fox_wd.newest_ckpt, __ATOMIC_RELAXED);
    if (newest >= 0) snprintf(ckpt, sizeof(ckpt), "the newest checkpoint is ckpt_%08d", newest);
    int n = snprintf(line, sizeof(line), "error: rank %d: %s %s %d: %s; relaunch with --resume (exit %d)\n", fox_wd.rank, why,
                     __atomic_load_n(&fox_wd.phase, __ATOMIC_RELAXED), __atomic_load_n(&fox_wd.step, __ATOMIC_RELAXED), ckpt,
                     FOX_EXIT_PEER_LOST);
    fflush(stdout);
    if (n > 0 && write(2, line, (size_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1)) < 0) n = 0;
    pthread_mutex_lock(&fox_wd_lock);  // held until the exit: the communicator is not destroyed under the abort
    if (fox_wd.hooks.ctx && fox_wd.hooks.abort) fox_wd.hooks.abort(fox_wd.hooks.ctx);
    _exit(FOX_EXIT_PEER_LOST);
}

static void *fox_wd_main(void *arg) {
    (void)arg;
    double tick = fox_wd.timeout / 8 < 1.0 ? fox_wd.timeout / 8 : 1.0;
    struct timespec pause = {(time_t)tick, (long)((tick - (double)(time_t)tick) * 1e9)};
    // Ranks other than 0 wait a grace more (a tenth of the timeout, at least 5 s), rank 1 first, then one every
    // 3 s: the first to speak ends the job.
    int later = fox_wd.rank < 21 ? fox_wd.rank - 1 : 20;
    double grace = fox_wd.timeout / 10 > 5.0 ? fox_wd.timeout / 10 : 5.0;
    double limit = fox_wd.timeout + (fox_wd.rank ? grace + 3.0 * later : 0.0);
    long long woke = fox_wd_now_ns(), resumed = 0;
    for (;;) {
        nanosleep(&pause, NULL);
        long long now = fox_wd_now_ns();
        // A tick that came far too late means this process itself was stopped (SIGSTOP, a debugger, mpirun's
        // SIGCONT that begins its kill sequence): its own pause is not the others' silence, so the idle time
        // counts from its return (the main thread's sign of progress may come a moment later).
        if (now - woke > (long long)(1e9 * (tick + fox_wd.timeout / 2))) resumed = now;
        woke = now;
        if (!__atomic_load_n(&fox_wd.on, __ATOMIC_ACQUIRE)) continue;
        pthread_mutex_lock(&fox_wd_lock);
        const char *err = fox_wd.hooks.ctx && fox_wd.hooks.poll ? fox_wd.hooks.poll(fox_wd.hooks.ctx) : NULL;
        pthread_mutex_unlock(&fox_wd_lock);
        if (err) {
            char why[256];
            snprintf(why, sizeof(why), "the communicator failed (%s)", err);
            fox_wd_fire(why);
        }
        long long last = __atomic_load_n(&fox_wd.last_ns, __ATOMIC_ACQUIRE);
        double idle = 1e-9 * (double)(now - (last > resumed ? last : resumed));
        if (idle < limit) continue;
        char why[256];
        if (fox_wd.rank == 0)
            snprintf(why, sizeof(why), "no progress for %.0f s (--collective-timeout %g): a rank died or stopped answering,", idle,
                     fox_wd.timeout);
        else
            snprintf(why, sizeof(why), "no progress for %.0f s (--collective-timeout %g), and rank 0 did not end the job: "
                     "rank 0 (or every other rank) is stuck or gone,", idle, fox_wd.timeout);
        fox_wd_fire(why);
    }
    return NULL;
}

// Starts the watchdog of a run of several ranks (timeout 0: none).
static inline void fox_watchdog_start(double timeout, int rank, int newest_ckpt) {
    if (timeout <= 0 || fox_wd.started) return;
    fox_wd.started = 1;
    fox_wd.rank = rank;
    fox_wd.timeout = timeout;
    fox_wd.newest_ckpt = newest_ckpt;
    fox_wd.phase = "starting, before step";
    fox_wd.last_ns = fox_wd_now_ns();
    fox_wd.on = 1;
    int rc = pthread_create(&fox_wd.thread, NULL, fox_wd_main, NULL);
    if (rc || pthread_detach(fox_wd.thread)) fox_fatal("cannot start the collective-timeout thread: %s", strerror(rc));
}

// From here on one rank works alone while the others wait for it (rank 0's sample after training): no limit.
static inline void fox_watchdog_stop(void) { __atomic_store_n(&fox_wd.on, 0, __ATOMIC_RELEASE); }

#endif
