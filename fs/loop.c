/*
 * loop.c - the FUSE request loop (contract in loop.h).
 *
 * Invariants (under l->mu)
 * 1. receivers counts the workers between taking the receiving turn and getting its
 *    result. A worker takes the turn when receivers is 0, as the watcher rescuing a
 *    stuck or handed-off request, or right after it processed a slow request (so
 *    receivers can be 2 or more while slow requests come, as in libfuse's loop; a
 *    worker back from a quick request parks while receivers > 0, which brings it back
 *    to 1). A slow request hands the receiving over only when no one else receives.
 * 2. A worker's quick_since is the time its quick request came (quick counts them), 0
 *    when it has none,
 *    when its request is slow (the receiving was handed over already), or once the
 *    watcher rescued it (so one stuck request costs one rescue, not one per period).
 * 3. At most one worker is the watcher. A free worker receives if no one does and no
 *    quick request is in process (whose worker will receive next; so no request waits
 *    in the kernel while a worker is free but for a quick one's rescue_ns), else takes
 *    the watcher role if it is vacant, else parks. When the watcher leaves the role to receive, it wakes a
 *    parked worker (or starts one) to take it; a quick request that finds no watcher
 *    and no parked worker starts one (below max), so the next stuck request is found.
 * 4. Workers are only added, and only while end is 0; all are joined by loop_run. Up to
 *    max as above; past it (up to hard) only by loop_rescue_slow_locked, when every
 *    worker is busy and a slow request has waited LOOP_SLOW_STUCK_NS.
 * 5. bound counts the workers processing a bound request (ops->bound), at most
 *    hard - max (when max > 1): one received past that goes to the deferred queue, and
 *    a worker done with a bound request takes the queue's next before anything else,
 *    still counted. So the queue is empty whenever bound < hard - max, and once the
 *    rescue started the extra workers, max are left to the other requests however
 *    long bound ones wait.
 */
#include "fs/loop.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/log.h"
#include "cache/mono.h"

struct loop;

struct loop_worker {
	struct loop *l;
	pthread_t thread;
	struct fuse_buf buf;	/* its own request buffer (receive may allocate mem) */
	uint64_t quick_since;	/* invariant 2 */
	uint64_t slow_since;	/* when its slow request came; 0 when it has none */
	int bound;		/* it processes a bound request (invariant 5) */
};

/* A bound request received while hard - max others were in process (invariant 5): a
 * copy. */
struct loop_deferred {
	struct loop_deferred *next;
	struct fuse_buf buf;	/* mem: the bytes after this struct */
};

struct loop {
	const struct loop_ops *ops;
	void *arg;
	uint64_t rescue_ns;
	/* Everything below (the invariants above). Lock order: a leaf: nothing else
	 * is taken under it, and no callback (receive, quick, process, exited) runs
	 * under it but cancels (a comparison of two requests' headers); taken with
	 * nothing held. Never held across I/O: receive, process and cancel run with it
	 * dropped; under it only pthread_create and sem_post. */
	pthread_mutex_t mu;
	pthread_cond_t park;		/* parked workers */
	pthread_cond_t wake;		/* the watcher (CLOCK_MONOTONIC) */
	sem_t done;			/* posted once, when the loop ends */
	unsigned max, hard, nthreads, receivers, parked;
	unsigned quick;			/* workers with a quick_since (invariant 2) */
	unsigned starting;		/* workers started that have not run yet */
	struct loop_worker *watcher;	/* invariant 3; NULL when none */
	int watcher_asleep;		/* idle: waits for the next request, not the clock */
	int handoff;			/* a slow request wants another receiver */
	unsigned bound;			/* invariant 5 */
	struct loop_deferred *dq, **dq_tail;	/* the deferred queue, oldest first */
	uint64_t last_request;		/* when the last request came */
	int end, error;
	struct loop_worker *w;		/* [hard], the first nthreads started */
};

static void *loop_worker_main(void *p);

/* Starts one more worker if fewer than limit run (invariant 4); caller holds l->mu. */
static int loop_spawn_upto_locked(struct loop *l, unsigned limit)
{
	static int logged;
	struct loop_worker *w;
	sigset_t ends, old;
	int rc;

	if (l->end || l->nthreads >= limit)
		return -EAGAIN;
	w = &l->w[l->nthreads];
	w->l = l;
	/* Workers take none of the signals that end a daemon, as libfuse's did not, nor
	 * SIGUSR2 (the daemon's wake-up of loop_run's caller, which would interrupt a
	 * worker's calls): the daemon's signal thread and the caller's wait take them. */
	sigemptyset(&ends);
	sigaddset(&ends, SIGTERM);
	sigaddset(&ends, SIGINT);
	sigaddset(&ends, SIGHUP);
	sigaddset(&ends, SIGQUIT);
	sigaddset(&ends, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &ends, &old);
	rc = pthread_create(&w->thread, NULL, loop_worker_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc) {
		if (!logged++)
			log_warn("loop: cannot start a FUSE worker thread: %s (serving with %u)",
				 strerror(rc), l->nthreads);
		return -rc;
	}
	l->nthreads++;
	l->starting++;
	return 0;
}

static int loop_spawn_locked(struct loop *l)
{
	return loop_spawn_upto_locked(l, l->max);
}

/*
 * Every worker busy, none receiving, watching, parked or starting, and a slow request
 * in process for LOOP_SLOW_STUCK_NS: reads waiting on a hung SOURCE or store (a stopped
 * NFS or GlusterFS server) as many as max held every other request of the mount, the
 * tree in memory and mlfs-stat's getxattr included, for as long as it hung. One more
 * worker then receives (invariant 4), up to hard: each stuck request costs a thread
 * and at most LOOP_SLOW_STUCK_NS plus LOOP_RESCUE_NEXT_NS of the others' waiting.
 * Called by loop_run's caller every LOOP_EXIT_CHECK_NS, and every LOOP_RESCUE_NEXT_NS
 * while a slow request is stuck (the next may follow at any moment). Not with max 1
 * (one thread asked). Returns whether one is stuck.
 */
static int loop_rescue_slow_locked(struct loop *l)
{
	static int logged;
	uint64_t now = mono_now_ns();
	int stuck = 0;

	for (unsigned i = 0; i < l->nthreads && !stuck; i++)
		stuck = l->w[i].slow_since && now - l->w[i].slow_since >= LOOP_SLOW_STUCK_NS;
	if (!stuck || l->end || l->max < 2 || l->receivers || l->watcher || l->parked ||
	    l->starting || l->nthreads < l->max || l->nthreads >= l->hard)
		return stuck;
	if (!loop_spawn_upto_locked(l, l->hard) && !logged++)
		log_warn("loop: all %u FUSE workers wait on slow requests (a hung SOURCE or "
			 "store?); starting more, up to %u", l->max, l->hard);
	return stuck;
}

/* Whether loop_rescue_slow_locked may start another worker soon: a request is stuck
 * and there is room (else the caller's period goes back to LOOP_EXIT_CHECK_NS). */
static int loop_may_rescue_locked(const struct loop *l, int stuck)
{
	return stuck && !l->end && l->max >= 2 && l->nthreads < l->hard;
}

static void loop_end_locked(struct loop *l, int error)
{
	if (l->end)
		return;
	l->end = 1;
	l->error = error;
	pthread_cond_broadcast(&l->park);
	pthread_cond_broadcast(&l->wake);
	sem_post(&l->done);
}

/* Some worker should receive while this one processes a slow request. */
static void loop_handoff_locked(struct loop *l)
{
	l->handoff = 1;
	if (l->parked)
		pthread_cond_signal(&l->park);
	else if (l->watcher)
		pthread_cond_signal(&l->wake);
	else
		loop_spawn_locked(l);
}

/* Whether a quick request has been in process for rescue_ns; marks each such one
 * rescued (invariant 2). Scans every worker: at most max, once per rescue_ns, by the
 * watcher only. */
static int loop_stuck_locked(struct loop *l, uint64_t now)
{
	int stuck = 0;

	for (unsigned i = 0; i < l->nthreads; i++) {
		if (l->w[i].quick_since && now - l->w[i].quick_since >= l->rescue_ns) {
			/* slow from now on, for loop_rescue_slow_locked too: a lookup
			 * on a hung local SOURCE is quick until it blocks */
			l->w[i].slow_since = l->w[i].quick_since;
			l->w[i].quick_since = 0;
			l->quick--;
			stuck = 1;
		}
	}
	return stuck;
}

/* Queues a copy of buf (invariant 5); caller holds l->mu. 0, or -ENOMEM (then the
 * caller processes it itself, as before the queue). */
static int loop_defer_locked(struct loop *l, const struct fuse_buf *buf)
{
	static int logged;
	struct loop_deferred *d = malloc(sizeof(*d) + buf->size);

	if (!d)
		return -ENOMEM;
	d->next = NULL;
	d->buf = *buf;
	d->buf.mem = buf->mem ? memcpy(d + 1, buf->mem, buf->size) : NULL;
	*l->dq_tail = d;
	l->dq_tail = &d->next;
	if (!logged++)
		log_warn("loop: %u FUSE workers wait on SOURCE; its later requests are queued, "
			 "so the mount's others are still served", l->bound);
	return 0;
}

/* The deferred queue's oldest, or NULL; caller holds l->mu. */
static struct loop_deferred *loop_undefer_locked(struct loop *l)
{
	struct loop_deferred *d = l->dq;

	if (d && !(l->dq = d->next))
		l->dq_tail = &l->dq;
	return d;
}

/* Whether buf interrupts a deferred request: if so it is taken out of the queue and
 * answered unprocessed (the interrupt then needs nothing more); caller holds l->mu,
 * which the answer is made without. */
static int loop_cancel_locked(struct loop *l, const struct fuse_buf *buf)
{
	struct loop_deferred **p, *d;

	if (!l->dq || !l->ops->cancels || !l->ops->cancel || !l->ops->cancels(l->arg, buf, NULL))
		return 0;
	for (p = &l->dq; (d = *p); p = &d->next)
		if (l->ops->cancels(l->arg, buf, &d->buf))
			break;
	if (!d)
		return 0;
	if (!(*p = d->next))
		l->dq_tail = p;
	pthread_mutex_unlock(&l->mu);
	l->ops->cancel(l->arg, &d->buf);
	free(d);
	pthread_mutex_lock(&l->mu);
	return 1;
}

/* After a bound request: the deferred ones, in turn, by this worker (invariant 5), each
 * as a slow request (another receives meanwhile); caller holds l->mu. Returns whether
 * it processed any. */
static int loop_drain_locked(struct loop *l, struct loop_worker *w)
{
	struct loop_deferred *d;
	int any = 0;

	while (!l->end && (d = loop_undefer_locked(l))) {
		any = 1;
		w->slow_since = mono_now_ns();
		if (!l->receivers)
			loop_handoff_locked(l);
		pthread_mutex_unlock(&l->mu);
		l->ops->process(l->arg, &d->buf);
		free(d);
		pthread_mutex_lock(&l->mu);
		w->slow_since = 0;
	}
	w->bound = 0;
	l->bound--;
	return any;
}

/* Takes the receiving turn, then processes what came; caller holds l->mu. Returns
 * whether what it processed was slow (0 for none). */
static int loop_serve_locked(struct loop *l, struct loop_worker *w)
{
	int r, quick, bound, slow;

	l->handoff = 0;
	l->receivers++;
	pthread_mutex_unlock(&l->mu);
	pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
	r = l->ops->receive(l->arg, &w->buf);
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	quick = r > 0 && l->ops->quick(l->arg, &w->buf);
	bound = r > 0 && l->ops->bound && l->ops->bound(l->arg, &w->buf);
	pthread_mutex_lock(&l->mu);
	l->receivers--;
	if (r == -EINTR)
		return 0;
	if (r <= 0) {
		loop_end_locked(l, r);
		return 0;
	}
	l->last_request = mono_now_ns();
	if (bound && l->max > 1 && l->bound >= l->hard - l->max &&
	    !loop_defer_locked(l, &w->buf))
		return 0;	/* this worker is free again (invariant 5) */
	if (loop_cancel_locked(l, &w->buf))
		return 0;
	if (bound) {
		l->bound++;
		w->bound = 1;
	}
	if (!quick) {
		w->slow_since = l->last_request;
		if (!l->receivers) /* else one waits in receive already (invariant 1) */
			loop_handoff_locked(l);
	} else {
		w->quick_since = l->last_request;
		l->quick++;
		/* No watcher and no worker free to become one (they were all busy when it
		 * left): start one, so that this request is rescued if it blocks. */
		if (!l->watcher && !l->parked && !l->starting)
			loop_spawn_locked(l);
		if (l->watcher_asleep) {
			l->watcher_asleep = 0; /* one wake-up per burst after an idle spell */
			pthread_cond_signal(&l->wake);
		}
	}
	pthread_mutex_unlock(&l->mu);
	l->ops->process(l->arg, &w->buf);
	pthread_mutex_lock(&l->mu);
	w->slow_since = 0;
	if (w->quick_since) {
		w->quick_since = 0;
		l->quick--;
	}
	slow = !quick;
	if (w->bound && loop_drain_locked(l, w))
		slow = 1;
	return slow;
}

/* The watcher (invariant 3): returns when it should receive, or at the end. */
static void loop_watch_locked(struct loop *l, struct loop_worker *w)
{
	l->watcher = w;
	while (!l->end) {
		uint64_t now = mono_now_ns();
		struct timespec ts;

		if (!l->receivers && (l->handoff || loop_stuck_locked(l, now)))
			break;
		if (now - l->last_request >= LOOP_IDLE_NS) {
			l->watcher_asleep = 1;
			pthread_cond_wait(&l->wake, &l->mu);
			l->watcher_asleep = 0;
			continue;
		}
		ts = mono_abstime(now + l->rescue_ns);
		pthread_cond_timedwait(&l->wake, &l->mu, &ts);
	}
	l->watcher = NULL;
	if (l->end)
		return;
	if (l->parked)
		pthread_cond_signal(&l->park); /* the next watcher */
	else
		loop_spawn_locked(l);	       /* or none, at max */
}

static void *loop_worker_main(void *p)
{
	struct loop_worker *w = p;
	struct loop *l = w->l;
	int slow = 0; /* what this worker processed last was slow */

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	pthread_mutex_lock(&l->mu);
	l->starting--;
	while (!l->end) {
		/* Receive right after a slow request (invariant 1): a stream of them (a
		 * writer's 1 MiB WRITEs) then finds a worker already waiting in receive, woken
		 * by the kernel as in libfuse's loop, instead of a hand-over each. Receive too
		 * if no one does and no quick request's worker is coming back to. Else watch
		 * over the others if no one does (invariant 3), else park. */
		if (slow || (!l->receivers && !l->quick)) {
			slow = loop_serve_locked(l, w);
		} else if (!l->watcher && l->max > 1) {
			loop_watch_locked(l, w);
			if (!l->end)
				slow = loop_serve_locked(l, w);
		} else {
			l->parked++;
			pthread_cond_wait(&l->park, &l->mu);
			l->parked--;
		}
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

int loop_run(const struct loop_ops *ops, void *arg, unsigned max_threads, unsigned extra_max,
	     uint64_t rescue_ns)
{
	struct loop l = { .ops = ops, .arg = arg, .rescue_ns = rescue_ns,
			  .max = max_threads ? max_threads : 1 };
	pthread_condattr_t ca;
	unsigned n;
	int rc;

	l.hard = l.max + (extra_max ? extra_max : 1);
	l.dq_tail = &l.dq;
	if (!(l.w = calloc(l.hard, sizeof(*l.w))))
		return -ENOMEM;
	pthread_mutex_init(&l.mu, NULL);
	pthread_cond_init(&l.park, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&l.wake, &ca);
	pthread_condattr_destroy(&ca);
	sem_init(&l.done, 0, 0);
	pthread_mutex_lock(&l.mu);
	l.last_request = mono_now_ns();
	rc = loop_spawn_locked(&l); /* the receiver, then the watcher */
	if (!rc && l.max > 1)
		loop_spawn_locked(&l);
	pthread_mutex_unlock(&l.mu);
	if (!rc) {
		/* A signal interrupts the wait (EINTR): the caller's way to end us early. One
		 * that lands between the check and the wait is lost, and an INIT that failed
		 * ends the session with no request to come: so the wait also ends every
		 * LOOP_EXIT_CHECK_NS to look at exited() again. */
		for (int rescued = 0;;) {
			struct timespec ts = mono_deadline(rescued ? LOOP_RESCUE_NEXT_NS
							   : LOOP_EXIT_CHECK_NS);

			if (ops->exited(arg))
				break;
			if (!sem_clockwait(&l.done, CLOCK_MONOTONIC, &ts))
				break;
			pthread_mutex_lock(&l.mu);
			rescued = loop_may_rescue_locked(&l, loop_rescue_slow_locked(&l));
			pthread_mutex_unlock(&l.mu);
		}
	}
	pthread_mutex_lock(&l.mu);
	loop_end_locked(&l, rc);
	n = l.nthreads;
	pthread_mutex_unlock(&l.mu);
	for (unsigned i = 0; i < n; i++)
		pthread_cancel(l.w[i].thread); /* acts only inside receive */
	for (unsigned i = 0; i < n; i++) {
		pthread_join(l.w[i].thread, NULL);
		free(l.w[i].buf.mem);
	}
	/* Deferred requests never processed: the session ends, the kernel answers them. */
	for (struct loop_deferred *d; (d = loop_undefer_locked(&l));)
		free(d);
	rc = l.error;
	sem_destroy(&l.done);
	pthread_cond_destroy(&l.wake);
	pthread_cond_destroy(&l.park);
	pthread_mutex_destroy(&l.mu);
	free(l.w);
	return rc;
}
