/*
 * fsbench: the small-file and metadata loops of the data-path benchmark (bench/run.sh).
 *
 * They are in C, not Python, so that the interpreter's per-call overhead (a few
 * microseconds) does not hide the filesystem's own cost: a warm stat() is ~1 us.
 * Paths in LIST are relative to ROOT (we chdir there), so every target walks the same
 * number of path components.
 *
 *   fsbench read ROOT LIST NPROC   whole-file reads of every path in LIST, in LIST order,
 *                                  split round-robin over NPROC forked reader processes
 *   fsbench stat ROOT LIST         stat() of every path in LIST, one process
 *   fsbench walk ROOT DIR          recursive listing of ROOT/DIR (opendir/readdir, d_type;
 *                                  lstat only where d_type is unknown), one process
 *
 * Each prints one JSON object on stdout: {"files"|"entries", "bytes", "seconds"}.
 * Any error (open, read, short count) is fatal: exit 1 with the path on stderr, so a
 * broken target can never look fast.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *path)
{
	fprintf(stderr, "fsbench: %s %s: %s\n", what, path, strerror(errno));
	exit(1);
}

static char **load_list(const char *file, size_t *n)
{
	FILE *f = fopen(file, "r");
	if (!f)
		die("open list", file);
	size_t cap = 1024, len = 0;
	char **v = malloc(cap * sizeof(*v));
	char *line = NULL;
	size_t lcap = 0;
	ssize_t r;
	while ((r = getline(&line, &lcap, f)) > 0) {
		if (line[r - 1] == '\n')
			line[--r] = 0;
		if (!r)
			continue;
		if (len == cap)
			v = realloc(v, (cap *= 2) * sizeof(*v));
		v[len++] = strdup(line);
	}
	free(line);
	fclose(f);
	*n = len;
	return v;
}

static int cmd_read(char **list, size_t n, int nproc)
{
	int pfd[2];
	if (pipe(pfd))
		die("pipe", "");
	double t0 = now();
	for (int p = 0; p < nproc; p++) {
		pid_t pid = fork();
		if (pid < 0)
			die("fork", "");
		if (pid)
			continue;
		close(pfd[0]);
		size_t bufsz = 1 << 20;
		char *buf = malloc(bufsz);
		uint64_t bytes = 0, files = 0;
		for (size_t i = p; i < n; i += nproc) {
			int fd = open(list[i], O_RDONLY);
			if (fd < 0)
				die("open", list[i]);
			for (;;) {
				ssize_t r = read(fd, buf, bufsz);
				if (r < 0)
					die("read", list[i]);
				if (!r)
					break;
				bytes += r;
			}
			close(fd);
			files++;
		}
		uint64_t out[2] = {files, bytes};
		if (write(pfd[1], out, sizeof(out)) != sizeof(out))
			die("write", "pipe");
		_exit(0);
	}
	close(pfd[1]);
	uint64_t files = 0, bytes = 0;
	int bad = 0, st;
	for (int p = 0; p < nproc; p++) {
		uint64_t in[2];
		if (read(pfd[0], in, sizeof(in)) == sizeof(in)) {
			files += in[0];
			bytes += in[1];
		}
	}
	while (wait(&st) > 0)
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			bad = 1;
	double dt = now() - t0;
	if (bad || files != n) {
		fprintf(stderr, "fsbench: a reader failed (%llu of %zu files)\n",
			(unsigned long long)files, n);
		return 1;
	}
	printf("{\"files\": %llu, \"bytes\": %llu, \"seconds\": %.6f}\n",
	       (unsigned long long)files, (unsigned long long)bytes, dt);
	return 0;
}

static int cmd_stat(char **list, size_t n)
{
	struct stat st;
	uint64_t bytes = 0;
	double t0 = now();
	for (size_t i = 0; i < n; i++) {
		if (stat(list[i], &st))
			die("stat", list[i]);
		bytes += st.st_size;
	}
	double dt = now() - t0;
	printf("{\"files\": %zu, \"bytes\": %llu, \"seconds\": %.6f}\n", n,
	       (unsigned long long)bytes, dt);
	return 0;
}

static uint64_t walk(int dfd, const char *name, uint64_t *dirs)
{
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		die("opendir", name);
	DIR *d = fdopendir(fd);
	if (!d)
		die("fdopendir", name);
	(*dirs)++;
	uint64_t n = 0;
	struct dirent *e;
	errno = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' &&
		    (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
			continue;
		n++;
		int isdir = e->d_type == DT_DIR;
		if (e->d_type == DT_UNKNOWN) {
			struct stat st;
			if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW))
				die("lstat", e->d_name);
			isdir = S_ISDIR(st.st_mode);
		}
		if (isdir)
			n += walk(dirfd(d), e->d_name, dirs);
		errno = 0;
	}
	if (errno)
		die("readdir", name);
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: fsbench read ROOT LIST NPROC | stat ROOT LIST | walk ROOT DIR\n");
		return 2;
	}
	if (chdir(argv[2]))
		die("chdir", argv[2]);
	if (!strcmp(argv[1], "walk")) {
		uint64_t dirs = 0;
		double t0 = now();
		uint64_t n = walk(AT_FDCWD, argv[3], &dirs);
		double dt = now() - t0;
		printf("{\"entries\": %llu, \"dirs\": %llu, \"seconds\": %.6f}\n",
		       (unsigned long long)n, (unsigned long long)dirs, dt);
		return 0;
	}
	size_t n;
	char **list = load_list(argv[3], &n);
	if (!strcmp(argv[1], "read") && argc == 5)
		return cmd_read(list, n, atoi(argv[4]));
	if (!strcmp(argv[1], "stat"))
		return cmd_stat(list, n);
	fprintf(stderr, "fsbench: unknown command %s\n", argv[1]);
	return 2;
}
