/*
 * later.h - later_: calls tried again on a schedule, by one thread of their own.
 *
 * Why: an open of a SOURCE file on which another process holds a lease fails with
 * EAGAIN (the daemon opens O_NONBLOCK) while the kernel breaks the lease, which lasts
 * until the holder lets go or /proc/sys/fs/lease-break-time (45 s by default) passes.
 * Natively the opener waits that long asleep, holding nothing of anyone else's. A FUSE
 * worker waiting for it would be one of a few (fs/loop.h): a user holding leases on
 * files of their own in SOURCE and opening them through the mount held every worker
 * and stalled every request of the mount, root's checkpoint writes included. So such a
 * request is handed here and its worker goes back to the loop; one thread tries it
 * again after LATER_NAP_MIN_NS, then twice as long each time up to LATER_NAP_MAX_NS,
 * until it is answered.
 *
 * Contract: later_add hands a job over. Its again() runs on the later thread, one job
 * at a time, with why LATER_TRY while the job's deadline is ahead: -EAGAIN to be tried
 * again after the next nap, anything else once it is done. Past the deadline it is
 * called with LATER_LAST, and with LATER_STOP when later_free ends the thread (or a job
 * comes after): then it must finish (answer its request) whatever it returns. A job
 * done is given to its free(). Nothing here touches FUSE: the job answers its request.
 *
 * Costs: nothing while no job waits (the thread sleeps on a condition variable); one
 * wake-up per due job while some do.
 */
#ifndef MLFS_LATER_H
#define MLFS_LATER_H

#include <stdint.h>

#define LATER_NAP_MIN_NS (10 * 1000 * 1000ull)
#define LATER_NAP_MAX_NS (160 * 1000 * 1000ull)

enum later_why { LATER_TRY, LATER_LAST, LATER_STOP };

struct later_job {
	int (*again)(struct later_job *j, enum later_why why);
	void (*free)(struct later_job *j);
	/* later's own */
	struct later_job *next;
	uint64_t due_ns, nap_ns, deadline_ns;
};

struct later;

int later_new(struct later **out);
/* Hands j over (again and free set by the caller), to be tried first after
 * LATER_NAP_MIN_NS and last at timeout_ns from now. */
void later_add(struct later *l, struct later_job *j, uint64_t timeout_ns);
/* Jobs waiting now. */
uint64_t later_waiting(struct later *l);
/* Ends the thread: every job left gets again(LATER_STOP), then free(). NULL is a no-op. */
void later_free(struct later *l);

#endif
