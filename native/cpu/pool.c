/* A persistent thread pool: workers spin briefly on a generation counter, then sleep on a
 * condition variable. The calling thread takes part as thread 0. Tasks are claimed one at a
 * time from an atomic counter, so a slow core does less of the work. */
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "internal.h"

#define SPIN_ROUNDS 20000   // ~0.3 ms of `pause` before a worker sleeps

struct fm_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_int sleeping;
    atomic_uint generation;
    atomic_int next_task, finished;
    atomic_bool stop;
    fm_task_fn fn;
    void *ctx;
    int n_tasks;
};

typedef struct { fm_pool *pool; int index; } worker_arg;

static void drain(fm_pool *p, int thread) {
    for (int t; (t = atomic_fetch_add(&p->next_task, 1)) < p->n_tasks;) p->fn(p->ctx, t, thread);
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    fm_pool *p = wa->pool;
    const int index = wa->index;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop)) {
            if (++spins < SPIN_ROUNDS) {
                _mm_pause();
                continue;
            }
            pthread_mutex_lock(&p->lock);
            atomic_fetch_add(&p->sleeping, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->lock);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->lock);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = gen;
        drain(p, index);
        atomic_fetch_add(&p->finished, 1);
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

void fm_pool_run(fm_pool *p, fm_task_fn fn, void *ctx, int n_tasks) {
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next_task, 0);
    atomic_store(&p->finished, 0);
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    drain(p, 0);
    while (atomic_load(&p->finished) < p->n_threads - 1) _mm_pause();
}
