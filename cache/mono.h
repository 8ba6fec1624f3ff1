/*
 * mono.h - the one clock of mlfs, and the one running average of a cost per MiB.
 *
 * Contract: every interval, timeout and deadline in mlfs is taken on CLOCK_MONOTONIC,
 * so an NTP step at boot neither stretches nor cuts a wait; a condition variable that
 * waits for a mono_abstime() is set to that clock (pthread_condattr_setclock). Times are
 * nanoseconds since an arbitrary start, comparable within one boot only (never stored).
 * Header-only: every function is inline, thread safe, never blocks, and costs one vDSO
 * clock read at most.
 */
#ifndef MLFS_MONO_H
#define MLFS_MONO_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t mono_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mono_now_ms(void)
{
	return mono_now_ns() / 1000000ull;
}

/* The absolute time t (a mono_now_ns() value) as pthread_cond_timedwait, sem_clockwait
 * and the like take it. */
static inline struct timespec mono_abstime(uint64_t t)
{
	return (struct timespec){ .tv_sec = (time_t)(t / 1000000000ull),
				  .tv_nsec = (long)(t % 1000000000ull) };
}

/* The absolute time ns from now, for the same waits. */
static inline struct timespec mono_deadline(uint64_t ns)
{
	return mono_abstime(mono_now_ns() + ns);
}

/* Folds a sample (ns to move len bytes) into *avg, nanoseconds per MiB with a weight of
 * 1/8; the first sample is taken whole, len 0 is ignored. Relaxed load and store: two
 * racing samples may lose one, as an estimate may. */
static inline void mono_avg_ns_per_mib(_Atomic uint64_t *avg, uint64_t ns, uint64_t len)
{
	uint64_t sample, old;

	if (!len)
		return;
	sample = (uint64_t)((double)ns * (double)(1u << 20) / (double)len);
	old = atomic_load_explicit(avg, memory_order_relaxed);
	atomic_store_explicit(avg, old ? old - old / 8 + sample / 8 : sample,
			      memory_order_relaxed);
}

#endif
