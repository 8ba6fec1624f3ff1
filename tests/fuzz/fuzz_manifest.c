/*
 * fuzz_manifest.c - libFuzzer target for mf_decode (fs/manifest.h).
 *
 * Properties checked on every input:
 *  1. mf_decode returns 0, -EINVAL, -EIO or -ENOMEM, and never reads outside the input
 *     (the input is the fuzzer's exact-size buffer: ASan sees any overread) nor crashes
 *     (mf_free of a half-built manifest included);
 *  2. whatever decodes re-encodes to exactly the same bytes (the encoding is canonical:
 *     the decoder refuses every input the encoder would not have written).
 * Each input is tried twice: as it is (the checksum almost always refuses it), and
 * "sealed": its length field and trailing XXH3-128 rewritten so that the mutation
 * reaches the parser, which is where the interesting bugs live.
 * Seeds: tests/fuzz/seeds/manifest (manifests written by mlfs itself).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "fs/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *buf, size_t len)
{
	struct mf_manifest *m = NULL;
	void *out = NULL;
	size_t olen = 0;
	int rc = mf_decode(buf, len, &m);

	if (rc != 0 && rc != -EINVAL && rc != -EIO && rc != -ENOMEM) {
		fprintf(stderr, "mf_decode returned %d\n", rc);
		abort();
	}
	if (rc)
		return;
	rc = mf_encode(m, &out, &olen);
	if (rc != 0 || olen != len || memcmp(out, buf, len)) {
		fprintf(stderr, "decode then encode differs: rc %d, %zu bytes for %zu\n", rc, olen,
			len);
		abort();
	}
	free(out);
	mf_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	XXH128_canonical_t sum;
	uint8_t *b;

	check(data, size);
	if (size < 24 + 16)
		return 0;
	b = malloc(size);
	if (!b)
		return 0;
	memcpy(b, data, size);
	for (int i = 0; i < 8; i++)
		b[16 + i] = (uint8_t)((uint64_t)size >> (8 * i));
	XXH128_canonicalFromHash(&sum, XXH3_128bits(b, size - 16));
	memcpy(b + size - 16, sum.digest, 16);
	check(b, size);
	free(b);
	return 0;
}
