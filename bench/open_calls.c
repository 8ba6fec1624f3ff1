/*
 * open_calls: what the SOURCE calls of one OPEN of mlfs's default mode cost, timed alone
 * (issue 12, row 5; docs/performance.md, "The OPEN round trip, measured").
 *
 *   cc -O2 -o open_calls bench/open_calls.c
 *   ./open_calls SOURCE LIST      (LIST: paths relative to SOURCE, one per line, as
 *                                  bench/epoch_open.py writes them in its work dir)
 *
 * For every path of LIST, in its order, twice per variant, prints the mean per path:
 *   open      openat2 beneath SOURCE (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 *             RESOLVE_NO_MAGICLINKS) O_RDONLY|O_NONBLOCK|O_NOCTTY, fstat, fcntl to clear
 *             O_NONBLOCK, close: what data_open_source and data_release do
 *   open-nb   the same without the fcntl (and without O_NONBLOCK)
 *   o-path    openat2 O_PATH, fstat, close
 *   fstatat   fstatat from SOURCE's descriptor (no descriptor made)
 *   statx     statx from SOURCE's descriptor
 * Warm: run it once first so that every dentry and inode is cached.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int open_beneath(int root, const char *path, int flags)
{
	struct open_how how = { .flags = (unsigned)(flags | O_CLOEXEC),
				.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
					   RESOLVE_NO_MAGICLINKS };

	return (int)syscall(SYS_openat2, root, path, &how, sizeof(how));
}

/* One variant on one path; 0, or -1 if a call failed. */
static int one(int mode, int root, const char *path)
{
	struct stat st;
	struct statx sx;
	int fd;

	switch (mode) {
	case 0:
		fd = open_beneath(root, path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
		if (fd < 0 || fstat(fd, &st) || fcntl(fd, F_SETFL, 0))
			return -1;
		return close(fd);
	case 1:
		fd = open_beneath(root, path, O_RDONLY | O_NOCTTY);
		if (fd < 0 || fstat(fd, &st))
			return -1;
		return close(fd);
	case 2:
		fd = open_beneath(root, path, O_PATH);
		if (fd < 0 || fstat(fd, &st))
			return -1;
		return close(fd);
	case 3:
		return fstatat(root, path, &st, AT_SYMLINK_NOFOLLOW);
	default:
		return statx(root, path, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx);
	}
}

int main(int argc, char **argv)
{
	static const char *const names[] = { "open", "open-nb", "o-path", "fstatat", "statx" };
	size_t n = 0, cap = 1024;
	char **list, line[4096];
	FILE *f;
	int root;

	if (argc != 3) {
		fprintf(stderr, "usage: open_calls SOURCE LIST\n");
		return 2;
	}
	if ((root = open(argv[1], O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0 ||
	    !(f = fopen(argv[2], "re"))) {
		perror(root < 0 ? argv[1] : argv[2]);
		return 1;
	}
	if (!(list = malloc(cap * sizeof(*list))))
		return 1;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		if (!*line)
			continue;
		if (n == cap && !(list = realloc(list, (cap *= 2) * sizeof(*list))))
			return 1;
		if (!(list[n++] = strdup(line)))
			return 1;
	}
	fclose(f);
	if (!n) {
		fprintf(stderr, "open_calls: %s lists no path\n", argv[2]);
		return 1;
	}
	for (int mode = 0; mode < 5; mode++) {
		for (int rep = 0; rep < 2; rep++) {
			double t0 = now_s();

			for (size_t i = 0; i < n; i++) {
				if (one(mode, root, list[i])) {
					perror(list[i]);
					return 1;
				}
			}
			printf("%-8s %6.2f us per path (%zu paths)\n", names[mode],
			       (now_s() - t0) / (double)n * 1e6, n);
		}
	}
	return 0;
}
