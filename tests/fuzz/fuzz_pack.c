/*
 * fuzz_pack.c - libFuzzer target for the pack index check (pack_check_fd, fs/pack.h):
 * what a scan reads from every pack of a shared store, which any writer of that store
 * (another host, a damaged disk) may have made.
 *
 * Properties: it never crashes or reads outside the file; it returns 0 or a -errno; on
 * success the index's entries fit the file (n * 40 + 48 bytes at most).
 * Seeds: tests/fuzz/seeds/pack (packs mlfs wrote).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fs/pack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = memfd_create("pack", MFD_CLOEXEC), rc;
	size_t n = 0;

	if (fd < 0)
		return 0;
	if (write(fd, data, size) != (ssize_t)size) {
		close(fd);
		return 0;
	}
	rc = pack_check_fd(fd, &n);
	if (rc > 0 || (rc == 0 && n * 40 + 48 > size))
		abort();
	close(fd);
	return 0;
}
