/*
 * test.h - the tiny harness every C unit test program uses (STYLE.md 10).
 *
 * EXPECT(cond) records a pass or prints file:line and the failed condition.
 * EXPECT_EQ(a, b) does the same for two integers and prints both values.
 * test_summary() prints "N passed, N failed" and returns the exit status.
 * Single-threaded use only: the counters are plain ints.
 */
#ifndef MLFS_TEST_H
#define MLFS_TEST_H

#include <stdio.h>

static int test_passed, test_failed;

#define EXPECT(cond)                                                               \
	do {                                                                       \
		if (cond) {                                                        \
			test_passed++;                                             \
		} else {                                                           \
			test_failed++;                                             \
			fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                  \
	} while (0)

#define EXPECT_EQ(a, b)                                                            \
	do {                                                                       \
		long long ea_ = (long long)(a), eb_ = (long long)(b);              \
		if (ea_ == eb_) {                                                  \
			test_passed++;                                             \
		} else {                                                           \
			test_failed++;                                             \
			fprintf(stderr, "%s:%d: FAILED: %s == %s (%lld != %lld)\n",     \
				__FILE__, __LINE__, #a, #b, ea_, eb_);             \
		}                                                                  \
	} while (0)

static inline int test_summary(void)
{
	printf("%d passed, %d failed\n", test_passed, test_failed);
	return test_failed ? 1 : 0;
}

#endif
