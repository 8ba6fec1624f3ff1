/*
 * later.c - calls tried again on a schedule (contract in later.h).
 *
 * Invariants (under l->mu)
 * 1. l->jobs holds every job handed over and not being tried; a job being tried is the
 *    thread's alone until it is put back or freed.
 * 2. Once l->stop is set later_add puts no job on l->jobs (it finishes a late one
 *    itself), and the thread finishes every job it holds or finds there before it ends.
 */
#include "fs/later.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "cache/mono.h"

struct later {
	pthread_mutex_t mu;
	pthread_cond_t cv;		/* CLOCK_MONOTONIC: a new job, or stop */
	pthread_t thread;
	struct later_job *jobs;		/* invariant 1 */
	uint64_t waiting;
	int stop;			/* invariant 2 */
};

static void later_finish(struct later_job *j, enum later_why why)
{
	j->again(j, why);
	j->free(j);
}

/* Takes the jobs due at now off l->jobs; *next gets the earliest due time of the rest
 * (UINT64_MAX if none). Caller holds l->mu. */
static struct later_job *later_take_due_locked(struct later *l, uint64_t now, uint64_t *next)
{
	struct later_job *due = NULL, **pp = &l->jobs;

	*next = UINT64_MAX;
	while (*pp) {
		struct later_job *j = *pp;

		if (j->due_ns <= now) {
			*pp = j->next;
			j->next = due;
			due = j;
		} else {
			if (j->due_ns < *next)
				*next = j->due_ns;
			pp = &j->next;
		}
	}
	return due;
}

static void *later_main(void *arg)
{
	struct later *l = arg;

	pthread_mutex_lock(&l->mu);
	while (!l->stop) {
		uint64_t next;
		struct later_job *due = later_take_due_locked(l, mono_now_ns(), &next);

		if (!due) {
			if (next == UINT64_MAX) {
				pthread_cond_wait(&l->cv, &l->mu);
			} else {
				struct timespec ts = mono_abstime(next);

				pthread_cond_timedwait(&l->cv, &l->mu, &ts);
			}
			continue;
		}
		pthread_mutex_unlock(&l->mu);
		struct later_job *back = NULL;

		while (due) {
			struct later_job *j = due;
			uint64_t now = mono_now_ns();
			enum later_why why = now >= j->deadline_ns ? LATER_LAST : LATER_TRY;

			due = j->next;
			if (j->again(j, why) == -EAGAIN && why == LATER_TRY) {
				j->due_ns = mono_now_ns() + j->nap_ns;
				if ((j->nap_ns *= 2) > LATER_NAP_MAX_NS)
					j->nap_ns = LATER_NAP_MAX_NS;
				j->next = back;
				back = j;
			} else {
				pthread_mutex_lock(&l->mu);
				l->waiting--;
				pthread_mutex_unlock(&l->mu);
				j->free(j);
			}
		}
		pthread_mutex_lock(&l->mu);
		while (back) {
			struct later_job *j = back;

			back = j->next;
			j->next = l->jobs;
			l->jobs = j;
		}
	}
	/* Invariant 2: nothing comes onto l->jobs any more; what is there is finished. */
	struct later_job *left = l->jobs;

	l->jobs = NULL;
	l->waiting = 0;
	pthread_mutex_unlock(&l->mu);
	while (left) {
		struct later_job *j = left;

		left = j->next;
		later_finish(j, LATER_STOP);
	}
	return NULL;
}

int later_new(struct later **out)
{
	struct later *l = calloc(1, sizeof(*l));
	pthread_condattr_t ca;
	int rc;

	if (!l)
		return -ENOMEM;
	pthread_mutex_init(&l->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&l->cv, &ca);
	pthread_condattr_destroy(&ca);
	if ((rc = pthread_create(&l->thread, NULL, later_main, l))) {
		pthread_cond_destroy(&l->cv);
		pthread_mutex_destroy(&l->mu);
		free(l);
		return -rc;
	}
	*out = l;
	return 0;
}

void later_add(struct later *l, struct later_job *j, uint64_t timeout_ns)
{
	uint64_t now = mono_now_ns();

	j->nap_ns = LATER_NAP_MIN_NS;
	j->due_ns = now + j->nap_ns;
	j->deadline_ns = now + timeout_ns;
	j->nap_ns *= 2;
	pthread_mutex_lock(&l->mu);
	if (l->stop) {
		pthread_mutex_unlock(&l->mu);
		later_finish(j, LATER_STOP);
		return;
	}
	j->next = l->jobs;
	l->jobs = j;
	l->waiting++;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

uint64_t later_waiting(struct later *l)
{
	uint64_t n;

	pthread_mutex_lock(&l->mu);
	n = l->waiting;
	pthread_mutex_unlock(&l->mu);
	return n;
}

void later_free(struct later *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->stop = 1;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
	pthread_join(l->thread, NULL);
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mu);
	free(l);
}
