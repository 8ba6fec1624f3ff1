/*
 * le.h - le_: the one little-endian codec of mlfs's byte formats (manifests, packs, the
 * store's files, ACL xattr values; docs/store-format.md).
 *
 * Contract: le_put writes the low n bytes of v at p, least significant first; le_get
 * reads n such bytes back (n from 1 to 8). No bounds check: the caller has made sure
 * that p holds n bytes. Header-only, pure, thread safe.
 */
#ifndef MLFS_LE_H
#define MLFS_LE_H

#include <stdint.h>

static inline void le_put(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t le_get(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

#endif
