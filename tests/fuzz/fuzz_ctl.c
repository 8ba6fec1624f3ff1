/*
 * fuzz_ctl.c - libFuzzer target for ctl_parse_request (fs/ctl.h), the parser of what
 * any local process may send to the daemon's control socket.
 *
 * Properties: it never reads outside the input (an exact-size copy: ASan sees any
 * overread) and never writes outside it; it returns 0, -E2BIG, -EPROTO or -EINVAL; on
 * success there are 1..CTL_MAX_ARGS arguments, each inside the buffer, NUL-terminated
 * there, with no tab, newline or NUL inside, the first one non-empty, and joined with
 * tabs they give back exactly the line up to the first newline.
 * Seeds: tests/fuzz/seeds/ctl (requests as mlfs-snap and mlfs-stat send them).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs/ctl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size ? size : 1), *argv[CTL_MAX_ARGS];
	const uint8_t *nl = memchr(data, '\n', size);
	int argc = -1, rc;
	size_t pos = 0;

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	rc = ctl_parse_request(buf, size, argv, &argc);
	if (rc != 0 && rc != -E2BIG && rc != -EPROTO && rc != -EINVAL)
		abort();
	if (rc) {
		if (argc != 0)
			abort();
		free(buf);
		return 0;
	}
	if (!nl || argc < 1 || argc > CTL_MAX_ARGS || !argv[0][0])
		abort();
	for (int i = 0; i < argc; i++) {
		size_t l;

		if (argv[i] != buf + pos)
			abort();
		l = strlen(argv[i]);	/* inside buf: argv[i] ends at a NUL we wrote */
		if (pos + l >= size || strpbrk(argv[i], "\t\n"))
			abort();
		if (memcmp(argv[i], data + pos, l))
			abort();
		pos += l;
		if (i + 1 < argc ? data[pos] != '\t' : data + pos != nl)
			abort();
		pos++;
	}
	free(buf);
	return 0;
}
