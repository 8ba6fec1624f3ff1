/*
 * test_mlfs.h - what a namespace driven without FUSE runs on in a unit test program
 * (test_ckpt, test_data): a struct mlfs with a block cache of block_size blocks and
 * budget bytes (mem_max), and a tier that is never started (no governor, no prefetch
 * threads). 0 or -errno; tier_free and bc_free undo it.
 */
#ifndef MLFS_TEST_MLFS_H
#define MLFS_TEST_MLFS_H

#include "cache/bcache.h"
#include "fs/mlfs.h"
#include "tiering/tier.h"

static inline int test_mlfs_init(struct mlfs *m, uint32_t block_size, uint64_t budget)
{
	struct tier_config tc;
	int rc = bc_new(block_size, budget, &m->bc);

	if (rc)
		return rc;
	tier_config_defaults(&tc);
	tc.use_gov = 0;
	tc.prefetch_threads = 0;
	if ((rc = tier_new(&tc, m->bc, &m->tier))) {
		bc_free(m->bc);
		m->bc = NULL;
		return rc;
	}
	m->cfg.block_size = block_size;
	m->cfg.mem_max = budget;
	m->cfg.workers = 1;
	return 0;
}

#endif
