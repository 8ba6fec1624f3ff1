/*
 * hset.c - a set of object hashes (contract in hset.h).
 */
#include "fs/hset.h"

#include <stdlib.h>
#include <string.h>

#include "fs/le.h"

static uint64_t hset_slot(const uint8_t *h)
{
	return le_get(h, 8);	/* the keys are hashes already */
}

int *hset_find(struct hset *t, const uint8_t h[16], int insert)
{
	size_t i;

	if (insert && 2 * (t->n + 1) > t->cap) {
		struct hset old = *t;

		t->cap = old.cap ? 2 * old.cap : 1024;
		t->keys = calloc(t->cap, 16);
		t->vals = calloc(t->cap, sizeof(int));
		if (!t->keys || !t->vals) {
			free(t->keys);
			free(t->vals);
			*t = old;
			return NULL;
		}
		t->n = 0;
		for (size_t j = 0; j < old.cap; j++)
			if (old.vals[j])
				*hset_find(t, old.keys[j], 1) = old.vals[j];
		free(old.keys);
		free(old.vals);
	}
	if (!t->cap)
		return NULL;
	for (i = hset_slot(h) & (t->cap - 1); t->vals[i]; i = (i + 1) & (t->cap - 1))
		if (!memcmp(t->keys[i], h, 16))
			return &t->vals[i];
	if (!insert)
		return NULL;
	memcpy(t->keys[i], h, 16);
	t->n++;
	t->vals[i] = 1;
	return &t->vals[i];
}

void hset_free(struct hset *t)
{
	free(t->keys);
	free(t->vals);
	memset(t, 0, sizeof(*t));
}
