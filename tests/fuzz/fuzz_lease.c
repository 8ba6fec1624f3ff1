/*
 * fuzz_lease.c - libFuzzer target for lease_parse (fs/lease.h): gc reads every other
 * writer's lease from the shared store.
 *
 * Properties: it never reads outside the input (an exact-size copy); it returns 0 or
 * -EINVAL; on success it reported exactly (size - 34) / 33 hashes.
 * Seeds: tests/fuzz/seeds/lease (leases mlfs wrote).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fs/lease.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int count(void *arg, const uint8_t h[16])
{
	(void)h;
	(*(size_t *)arg)++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size ? size : 1);
	size_t n = 0;
	int rc;

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	rc = lease_parse(buf, size, count, &n);
	if ((rc && rc != -EINVAL) || (rc == 0 && (size < 34 || n != (size - 34) / 33)))
		abort();
	free(buf);
	return 0;
}
