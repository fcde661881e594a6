/* Wall-clock time of a computation split into named phases: the caller marks the end of each
 * phase with em_phases_lap, which charges the time since the previous lap (or since
 * em_phases_start) to that phase, with the weight bytes it streamed and the pool hand-offs it
 * made. Off (the default) a lap is one branch; on it is one clock read. The phase table is the
 * caller's (names and count); this file only keeps the sums. Not thread-safe: the thread that
 * runs the computation (and its pool runs) laps. */
#include "base.h"

#include <string.h>

void em_phases_init(em_phases *p, const char *const *names, int n, const em_pool *pool) {
    *p = (em_phases){ .names = names, .n = n < EM_PHASES_MAX ? n : EM_PHASES_MAX, .pool = pool };
}

void em_phases_enable(em_phases *p, bool on) {
    p->on = on;
    em_phases_clear(p);
}

void em_phases_clear(em_phases *p) {
    memset(p->sum, 0, sizeof p->sum);
    p->last = 0;
}

void em_phases_start(em_phases *p) {
    if (!p || !p->on) return;
    p->last = em_time_now();
    p->runs = p->pool ? em_pool_runs(p->pool) : 0;
}

void em_phases_lap(em_phases *p, int phase, uint64_t bytes) {
    if (!p || !p->on || phase < 0 || phase >= p->n) return;
    const double now = em_time_now();
    const uint64_t runs = p->pool ? em_pool_runs(p->pool) : 0;
    em_phase_sum *s = &p->sum[phase];
    if (p->last > 0) s->seconds += now - p->last;
    s->laps++;
    s->bytes += bytes;
    s->pool_runs += runs - p->runs;
    p->last = now;
    p->runs = runs;
}
