/*
 * hset.h - hset_: a set of 16-byte object hashes with an int per hash (gc: referenced;
 * verify: status; a session: put already; the pack index: where).
 *
 * Contract: open addressing over the hash's first 8 bytes (the keys are XXH3-128
 * hashes already, so no further mixing), grown to keep the load under 1/2. A value of
 * 0 marks an empty slot: callers store non-zero values. Not thread safe: the owner
 * locks. A zeroed struct is an empty set.
 */
#ifndef MLFS_HSET_H
#define MLFS_HSET_H

#include <stddef.h>
#include <stdint.h>

struct hset {
	uint8_t (*keys)[16];
	int *vals;	/* 0 = empty slot */
	size_t cap, n;
};

/*
 * The value slot of h (borrowed: valid until the next insert). insert: add h with value
 * 1 if absent (NULL only on ENOMEM); else NULL if absent.
 */
int *hset_find(struct hset *t, const uint8_t h[16], int insert);
void hset_free(struct hset *t);

#endif
