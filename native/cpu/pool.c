/* A persistent thread pool. A job is published by bumping the generation in the high half of
 * one 64-bit counter whose low half is the next task index; a thread claims a task by CAS on
 * that counter, so a thread that wakes late can never take a task of a newer job. The job's
 * fields (function, context, task count) are written only while the counter's task index reads
 * PUBLISHING: a thread that read a newer job's fields then fails its CAS, where it would
 * otherwise have run a task of the new job with an index of the old one, twice over and
 * outside the caller's count (a double conv or state update, a step returning early). The caller
 * takes part as thread 0 and returns once every task has run, without waiting for threads
 * that never woke: under CPU contention the work simply lands on whoever is running.
 * Idle workers spin briefly, then sleep on a condition variable. */
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "internal.h"

#define WORKER_SPINS 4000   // ~0.1 ms of `pause` before an idle worker sleeps
#define CALLER_SPINS 2000   // then the waiting caller yields its core between checks
#define PUBLISHING 0xFFFFFFFFu   // the counter's task index while a job's fields are written

struct fm_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_int sleeping;
    atomic_bool stop;
    _Atomic uint64_t counter;          // (generation << 32) | next task
    atomic_int done;                   // tasks of the current job finished
    _Atomic(fm_task_fn) fn;
    _Atomic(void *) ctx;
    atomic_int n_tasks;
};

typedef struct { fm_pool *pool; int index; } worker_arg;

static inline uint32_t generation(fm_pool *p) { return (uint32_t)(atomic_load(&p->counter) >> 32); }

static void drain(fm_pool *p, uint32_t gen, int thread) {
    for (;;) {
        uint64_t v = atomic_load(&p->counter);
        if ((uint32_t)(v >> 32) != gen) return;
        const uint32_t task = (uint32_t)v;
        if (task == PUBLISHING) {   // this job's fields are being written
            _mm_pause();
            continue;
        }
        // acquire: fields of a newer job come with the PUBLISHING store before them, so the CAS fails
        fm_task_fn fn = atomic_load_explicit(&p->fn, memory_order_acquire);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_acquire);
        const int n = atomic_load_explicit(&p->n_tasks, memory_order_acquire);
        if (task >= (uint32_t)n) return;
        // success proves the job was unchanged while fn, ctx and n were read
        if (atomic_compare_exchange_weak(&p->counter, &v, v + 1)) {
            fn(ctx, (int)task, thread);
            atomic_fetch_add(&p->done, 1);
        }
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    fm_pool *p = wa->pool;
    const int index = wa->index;
    free(wa);
    fm_flush_denormals();   // workers run only pool tasks (internal.h)
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = generation(p)) == seen && !atomic_load(&p->stop)) {
            if (++spins < WORKER_SPINS) {
                _mm_pause();
                continue;
            }
            pthread_mutex_lock(&p->lock);
            atomic_fetch_add(&p->sleeping, 1);
            while (generation(p) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->wake, &p->lock);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->lock);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = gen;
        drain(p, gen, index);
    }
}

fm_pool *fm_pool_new(int n_threads) {
    fm_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->threads = calloc((size_t)p->n_threads, sizeof(pthread_t));
    for (int i = 1; i < p->n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        wa->pool = p;
        wa->index = i;
        pthread_create(&p->threads[i], NULL, worker_main, wa);
    }
    return p;
}

void fm_pool_free(fm_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p);
}

int fm_pool_threads(const fm_pool *p) { return p->n_threads; }

static void run_job(fm_pool *p, fm_task_fn fn, void *ctx, int n_tasks) {
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    const uint32_t gen = generation(p) + 1;
    atomic_store(&p->counter, (uint64_t)gen << 32 | PUBLISHING);
    atomic_store_explicit(&p->fn, fn, memory_order_release);
    atomic_store_explicit(&p->ctx, ctx, memory_order_release);
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_release);
    atomic_store(&p->done, 0);
    atomic_store(&p->counter, (uint64_t)gen << 32);
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    drain(p, gen, 0);
    for (int spins = 0; atomic_load(&p->done) < n_tasks; spins++) {
        if (spins < CALLER_SPINS) _mm_pause();
        else sched_yield();
    }
}

// every task runs in the workers' floating-point mode, whichever thread claims it (internal.h)
void fm_pool_run(fm_pool *p, fm_task_fn fn, void *ctx, int n_tasks) {
    const unsigned mxcsr = fm_flush_denormals();
    run_job(p, fn, ctx, n_tasks);
    _mm_setcsr(mxcsr);
}

// ---- fm_pool_check: short tasks, job sizes that change every run (the publishing race needs a
// job with more tasks than the one before it)

typedef struct { atomic_int *runs; } check_ctx;

static void check_task(void *arg, int task, int thread) {
    (void)thread;
    atomic_fetch_add(&((check_ctx *)arg)->runs[task], 1);
}

long fm_pool_check(fm_pool *p, int jobs, int max_tasks) {
    check_ctx c = { calloc((size_t)max_tasks, sizeof(atomic_int)) };
    if (!c.runs) return -1;
    long bad = 0;
    for (int j = 0; j < jobs; j++) {
        const int n = 1 + (int)((j * 2654435761u) % (unsigned)max_tasks);
        for (int t = 0; t < n; t++) atomic_store(&c.runs[t], 0);
        fm_pool_run(p, check_task, &c, n);
        for (int t = 0; t < n; t++) bad += atomic_load(&c.runs[t]) != 1;
    }
    free(c.runs);
    return bad;
}
