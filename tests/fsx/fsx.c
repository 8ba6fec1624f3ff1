/* fsx: a seeded random-operation tester for one file, in the spirit of the classic fsx
 * (written anew for mlfs; no code copied).
 *
 * It runs a reproducible random sequence of operations on FILE and keeps an in-memory
 * model of what the file must hold: pwrite (also through a second, write-only
 * descriptor), pread, truncate, ftruncate, mmap MAP_SHARED reads and writes with msync,
 * MAP_PRIVATE writes (which must not reach the file), fallocate (mode 0, KEEP_SIZE,
 * PUNCH_HOLE, ZERO_RANGE),
 * copy_file_range inside the file and from a second one (FILE.src, removed at the end),
 * lseek SEEK_DATA/SEEK_HOLE, O_APPEND writes, O_DIRECT writes and reads (when the
 * filesystem accepts O_DIRECT), close and reopen, fsync, fdatasync and
 * POSIX_FADV_DONTNEED (which makes the next read come from the filesystem, not the page
 * cache). After every operation it checks the size and (every -V ops) all
 * the bytes against the model; on a mismatch it prints the seed, the operation log and
 * the first differing bytes, and exits 1.
 *
 * Offsets are drawn near multiples of the block size (-b) half of the time, so that
 * writes, truncates and holes straddle mlfs's cache blocks.
 *
 * Exit status: 0 all operations matched, 1 a mismatch or an unexpected errno, 2 usage.
 * An errno the filesystem returns where ext4 would succeed is a failure; with -t
 * (tolerant, for tmpfs and the like) an EOPNOTSUPP fallocate mode is switched off
 * instead.
 *
 * -k keeps FILE's bytes as the starting model (resume after a snapshot); -i MODEL does
 * the same with the model read from another file and FILE not read first (after a lazy
 * restore, the first operations then meet blocks that are still only in the store);
 * -o OUT writes the final model to OUT, so a caller can compare a snapshot or a later
 * read with it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIO_ALIGN 4096
#define LOG_KEEP 4096

enum op {
	OP_WRITE, OP_READ, OP_TRUNCATE, OP_FTRUNCATE, OP_MAPREAD, OP_MAPWRITE,
	OP_FALLOC, OP_FALLOC_KEEP, OP_PUNCH, OP_ZERO, OP_ZERO_KEEP, OP_COPY,
	OP_SEEK, OP_APPEND, OP_DIO_WRITE, OP_DIO_READ, OP_REOPEN, OP_FSYNC,
	OP_FDATASYNC, OP_DROP, OP_COPY_FROM, OP_MAPPRIVATE, OP_WO_WRITE, OP_NR
};

static const char *const op_name[OP_NR] = {
	"write", "read", "truncate", "ftruncate", "mapread", "mapwrite",
	"falloc", "falloc_keep", "punch", "zero", "zero_keep", "copy_range",
	"seek", "append", "dio_write", "dio_read", "reopen", "fsync",
	"fdatasync", "dropcache", "copy_from", "mapprivate", "wo_write",
};

/* Relative weights: writes and reads dominate, as in real use. */
static const unsigned op_weight[OP_NR] = {
	[OP_WRITE] = 20, [OP_READ] = 10, [OP_TRUNCATE] = 3, [OP_FTRUNCATE] = 3,
	[OP_MAPREAD] = 4, [OP_MAPWRITE] = 4, [OP_FALLOC] = 2, [OP_FALLOC_KEEP] = 2,
	[OP_PUNCH] = 3, [OP_ZERO] = 2, [OP_ZERO_KEEP] = 2, [OP_COPY] = 4,
	[OP_SEEK] = 3, [OP_APPEND] = 3, [OP_DIO_WRITE] = 3, [OP_DIO_READ] = 2,
	[OP_REOPEN] = 2, [OP_FSYNC] = 1, [OP_FDATASYNC] = 1, [OP_DROP] = 2,
	[OP_COPY_FROM] = 3, [OP_MAPPRIVATE] = 2, [OP_WO_WRITE] = 4,
};

struct logent {
	unsigned long n;
	enum op op;
	uint64_t a, b, c;	/* offset, length, (copy: destination) */
	uint64_t size_after;
	char note[48];
};

static struct {
	const char *path;
	uint64_t seed, rng;
	unsigned long nops, verify_every;
	uint64_t maxsize, maxlen, bsize;
	bool keep, tolerant, quiet;
	const char *out, *initial;
	bool off[OP_NR];	/* disabled ops */
	int fd;
	unsigned char *model, *buf, *dbuf;
	char *src_path;		/* FILE.src: the source of copy_from, maxlen bytes */
	unsigned char *src;
	int src_fd;
	uint64_t size;
	struct logent log[LOG_KEEP];
	unsigned long nlog;
	unsigned long count[OP_NR];
} g;

static uint64_t rnd(void)
{
	/* splitmix64: tiny, seedable, good enough for choosing offsets. */
	uint64_t z = (g.rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static void print_log(void)
{
	unsigned long first = g.nlog > LOG_KEEP ? g.nlog - LOG_KEEP : 0;
	fprintf(stderr, "fsx: op log (%lu ops, last %lu shown):\n", g.nlog, g.nlog - first);
	for (unsigned long i = first; i < g.nlog; i++) {
		const struct logent *e = &g.log[i % LOG_KEEP];
		fprintf(stderr, "  %6lu %-11s 0x%" PRIx64 " len 0x%" PRIx64, e->n, op_name[e->op],
			e->a, e->b);
		if (e->op == OP_COPY || e->op == OP_COPY_FROM)
			fprintf(stderr, " -> 0x%" PRIx64, e->c);
		fprintf(stderr, "  size 0x%" PRIx64 " %s\n", e->size_after, e->note);
	}
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	print_log();
	fprintf(stderr, "fsx: FAILED at op %lu, seed %" PRIu64 ", file %s: ", g.nlog, g.seed,
		g.path);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static struct logent *log_op(enum op op, uint64_t a, uint64_t b, uint64_t c)
{
	struct logent *e = &g.log[g.nlog % LOG_KEEP];
	memset(e, 0, sizeof(*e));
	e->n = g.nlog++;
	e->op = op;
	e->a = a;
	e->b = b;
	e->c = c;
	g.count[op]++;
	return e;
}

/* An offset in [0, limit], near a block boundary half of the time. */
static uint64_t pick_off(uint64_t limit)
{
	if (limit == 0)
		return 0;
	if (rnd() & 1) {
		uint64_t nb = limit / g.bsize + 1;
		uint64_t base = rnd_below(nb) * g.bsize;
		int64_t d = (int64_t)rnd_below(65) - 32;
		int64_t o = (int64_t)base + d;
		if (o < 0)
			o = 0;
		if ((uint64_t)o > limit)
			o = (int64_t)limit;
		return (uint64_t)o;
	}
	return rnd_below(limit + 1);
}

/* A length in [1, maxlen]: short ones often, long ones (crossing blocks) sometimes. */
static uint64_t pick_len(void)
{
	switch (rnd_below(4)) {
	case 0:
		return 1 + rnd_below(16);
	case 1:
		return 1 + rnd_below(4096);
	default:
		return 1 + rnd_below(g.maxlen);
	}
}

static void model_resize(uint64_t n)
{
	if (n > g.size)
		memset(g.model + g.size, 0, n - g.size);
	g.size = n;
}

static void fill(unsigned char *p, uint64_t len)
{
	/* Bytes that name their op number, so a misplaced byte is easy to trace; never 0
	 * runs, so a hole that should not be there shows. */
	uint64_t x = rnd();
	for (uint64_t i = 0; i < len; i++) {
		if ((i & 7) == 0)
			x = x * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = (unsigned char)((x >> ((i & 7) * 8)) | 1);
	}
}

static void compare(const unsigned char *got, uint64_t off, uint64_t len, const char *what)
{
	if (memcmp(got, g.model + off, len) == 0)
		return;
	uint64_t i = 0;
	while (got[i] == g.model[off + i])
		i++;
	uint64_t j = len;
	while (got[j - 1] == g.model[off + j - 1])
		j--;
	fprintf(stderr, "fsx: %s: bytes differ in [0x%" PRIx64 ", 0x%" PRIx64 ") of the file\n",
		what, off + i, off + j);
	for (uint64_t k = i; k < j && k < i + 16; k++)
		fprintf(stderr, "  0x%08" PRIx64 ": got 0x%02x want 0x%02x\n", off + k, got[k],
			g.model[off + k]);
	die("%s: content mismatch at 0x%" PRIx64, what, off + i);
}

static void xpread(int fd, unsigned char *p, uint64_t off, uint64_t len, const char *what)
{
	uint64_t done = 0;
	while (done < len) {
		ssize_t r = pread(fd, p + done, len - done, (off_t)(off + done));
		if (r < 0)
			die("%s: pread 0x%" PRIx64 "+0x%" PRIx64 ": %s", what, off + done,
			    len - done, strerror(errno));
		if (r == 0)
			die("%s: pread at 0x%" PRIx64 ": early EOF (want 0x%" PRIx64 " more)",
			    what, off + done, len - done);
		done += (uint64_t)r;
	}
}

static void xpwrite(int fd, const unsigned char *p, uint64_t off, uint64_t len,
		    const char *what)
{
	uint64_t done = 0;
	while (done < len) {
		ssize_t r = pwrite(fd, p + done, len - done, (off_t)(off + done));
		if (r <= 0)
			die("%s: pwrite 0x%" PRIx64 "+0x%" PRIx64 ": %s", what, off + done,
			    len - done, r < 0 ? strerror(errno) : "wrote 0");
		done += (uint64_t)r;
	}
}

static void check_size(const char *what)
{
	struct stat st;
	if (fstat(g.fd, &st) < 0)
		die("%s: fstat: %s", what, strerror(errno));
	if ((uint64_t)st.st_size != g.size)
		die("%s: size 0x%" PRIx64 ", model 0x%" PRIx64, what, (uint64_t)st.st_size,
		    g.size);
	if (stat(g.path, &st) < 0)
		die("%s: stat: %s", what, strerror(errno));
	if ((uint64_t)st.st_size != g.size)
		die("%s: stat by path: size 0x%" PRIx64 ", model 0x%" PRIx64, what,
		    (uint64_t)st.st_size, g.size);
}

static void check_all(const char *what)
{
	check_size(what);
	xpread(g.fd, g.buf, 0, g.size, what);
	compare(g.buf, 0, g.size, what);
	ssize_t r = pread(g.fd, g.buf, 1, (off_t)g.size);
	if (r != 0)
		die("%s: pread at EOF returned %zd (%s)", what, r, r < 0 ? strerror(errno) : "");
}

static void open_file(int extra)
{
	g.fd = open(g.path, O_RDWR | extra);
	if (g.fd < 0)
		die("open %s: %s", g.path, strerror(errno));
}

/* ---- the operations ---- */

static void do_write(void)
{
	uint64_t off = pick_off(g.maxsize - 1), len = pick_len();
	if (off + len > g.maxsize)
		len = g.maxsize - off;
	log_op(OP_WRITE, off, len, 0);
	fill(g.buf, len);
	xpwrite(g.fd, g.buf, off, len, "write");
	if (off + len > g.size)
		model_resize(off + len);
	memcpy(g.model + off, g.buf, len);
}

/* A pwrite through a second, write-only descriptor (mlfs gives those FOPEN_DIRECT_IO:
 * the bytes go around the page cache that FILE's own descriptor keeps). */
static void do_wo_write(void)
{
	uint64_t off = pick_off(g.maxsize - 1), len = pick_len();
	if (off + len > g.maxsize)
		len = g.maxsize - off;
	log_op(OP_WO_WRITE, off, len, 0);
	int fd = open(g.path, O_WRONLY);
	if (fd < 0)
		die("wo_write: open: %s", strerror(errno));
	fill(g.buf, len);
	xpwrite(fd, g.buf, off, len, "wo_write");
	if (close(fd) < 0)
		die("wo_write: close: %s", strerror(errno));
	if (off + len > g.size)
		model_resize(off + len);
	memcpy(g.model + off, g.buf, len);
}

static void do_read(void)
{
	if (g.size == 0)
		return;
	uint64_t off = pick_off(g.size - 1), len = pick_len();
	if (off + len > g.size)
		len = g.size - off;
	log_op(OP_READ, off, len, 0);
	xpread(g.fd, g.buf, off, len, "read");
	compare(g.buf, off, len, "read");
}

static void do_truncate(bool by_fd)
{
	uint64_t n = rnd_below(4) == 0 ? 0 : pick_off(g.maxsize);
	log_op(by_fd ? OP_FTRUNCATE : OP_TRUNCATE, n, 0, 0);
	int rc = by_fd ? ftruncate(g.fd, (off_t)n) : truncate(g.path, (off_t)n);
	if (rc < 0)
		die("%s to 0x%" PRIx64 ": %s", by_fd ? "ftruncate" : "truncate", n,
		    strerror(errno));
	model_resize(n);
}

static void do_mapread(void)
{
	if (g.size == 0)
		return;
	uint64_t off = pick_off(g.size - 1), len = pick_len();
	if (off + len > g.size)
		len = g.size - off;
	log_op(OP_MAPREAD, off, len, 0);
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), moff = off & ~(pg - 1);
	void *p = mmap(NULL, len + (off - moff), PROT_READ, MAP_SHARED, g.fd, (off_t)moff);
	if (p == MAP_FAILED)
		die("mapread: mmap: %s", strerror(errno));
	compare((unsigned char *)p + (off - moff), off, len, "mapread");
	/* The tail of the last page past EOF reads zero (POSIX). */
	uint64_t end = off + len;
	if (end == g.size && end % pg) {
		const unsigned char *t = (unsigned char *)p + (end - moff);
		for (uint64_t i = 0; i < pg - end % pg; i++)
			if (t[i])
				die("mapread: byte 0x%02x past EOF at 0x%" PRIx64, t[i], end + i);
	}
	munmap(p, len + (off - moff));
}

static void do_mapwrite(void)
{
	uint64_t off = pick_off(g.maxsize - 1), len = pick_len();
	if (off + len > g.maxsize)
		len = g.maxsize - off;
	struct logent *e = log_op(OP_MAPWRITE, off, len, 0);
	if (off + len > g.size) {
		/* A mapping cannot grow a file: extend it first, as a writer would. */
		if (ftruncate(g.fd, (off_t)(off + len)) < 0)
			die("mapwrite: ftruncate: %s", strerror(errno));
		model_resize(off + len);
		snprintf(e->note, sizeof(e->note), "(extended)");
	}
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), moff = off & ~(pg - 1);
	unsigned char *p = mmap(NULL, len + (off - moff), PROT_READ | PROT_WRITE, MAP_SHARED,
				g.fd, (off_t)moff);
	if (p == MAP_FAILED)
		die("mapwrite: mmap: %s", strerror(errno));
	fill(g.model + off, len);
	memcpy(p + (off - moff), g.model + off, len);
	if (msync(p, len + (off - moff), MS_SYNC) < 0)
		die("mapwrite: msync: %s", strerror(errno));
	munmap(p, len + (off - moff));
}

/* A MAP_PRIVATE mapping reads the file and keeps its own writes: they never reach it. */
static void do_mapprivate(void)
{
	if (g.size == 0)
		return;
	uint64_t off = pick_off(g.size - 1), len = pick_len();
	if (off + len > g.size)
		len = g.size - off;
	log_op(OP_MAPPRIVATE, off, len, 0);
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), moff = off & ~(pg - 1);
	unsigned char *p = mmap(NULL, len + (off - moff), PROT_READ | PROT_WRITE, MAP_PRIVATE,
				g.fd, (off_t)moff);
	if (p == MAP_FAILED)
		die("mapprivate: mmap: %s", strerror(errno));
	compare(p + (off - moff), off, len, "mapprivate");
	fill(p + (off - moff), len);
	munmap(p, len + (off - moff));
}

static void do_falloc(enum op op)
{
	static const int mode[OP_NR] = {
		[OP_FALLOC] = 0,
		[OP_FALLOC_KEEP] = FALLOC_FL_KEEP_SIZE,
		[OP_PUNCH] = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		[OP_ZERO] = FALLOC_FL_ZERO_RANGE,
		[OP_ZERO_KEEP] = FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
	};
	uint64_t off = pick_off(g.maxsize - 1), len = pick_len();
	if (off + len > g.maxsize)
		len = g.maxsize - off;
	struct logent *e = log_op(op, off, len, 0);
	if (fallocate(g.fd, mode[op], (off_t)off, (off_t)len) < 0) {
		if (errno == EOPNOTSUPP && g.tolerant) {
			g.off[op] = true;
			snprintf(e->note, sizeof(e->note), "EOPNOTSUPP: mode off");
			if (!g.quiet)
				fprintf(stderr, "fsx: %s: EOPNOTSUPP, switched off\n", op_name[op]);
			return;
		}
		die("%s 0x%" PRIx64 "+0x%" PRIx64 ": %s", op_name[op], off, len, strerror(errno));
	}
	uint64_t end = off + len;
	bool keep = op != OP_FALLOC && op != OP_ZERO;
	if (op == OP_PUNCH || op == OP_ZERO || op == OP_ZERO_KEEP) {
		uint64_t zend = end < g.size ? end : g.size;
		if (off < zend)
			memset(g.model + off, 0, zend - off);
	}
	if (!keep && end > g.size)
		model_resize(end);
}

static void copy_range(int from, uint64_t src, uint64_t dst, uint64_t len)
{
	uint64_t done = 0;
	while (done < len) {
		loff_t in = (loff_t)(src + done), out = (loff_t)(dst + done);
		ssize_t r = copy_file_range(from, &in, g.fd, &out, len - done, 0);
		if (r < 0)
			die("copy_file_range 0x%" PRIx64 " -> 0x%" PRIx64 " len 0x%" PRIx64 ": %s",
			    src + done, dst + done, len - done, strerror(errno));
		if (r == 0)
			die("copy_file_range: 0 before the end of the source (0x%" PRIx64
			    " of 0x%" PRIx64 ")", done, len);
		if ((uint64_t)in != src + done + (uint64_t)r ||
		    (uint64_t)out != dst + done + (uint64_t)r)
			die("copy_file_range: offsets not advanced by %zd", r);
		done += (uint64_t)r;
	}
}

static void do_copy(void)
{
	if (g.size == 0)
		return;
	uint64_t src = pick_off(g.size - 1), len = pick_len();
	if (src + len > g.size)
		len = g.size - src;
	/* The destination must not overlap the source in the same file (EINVAL). */
	uint64_t dst = pick_off(g.maxsize - 1);
	if (dst + len > g.maxsize)
		dst = g.maxsize - len;
	if (dst < src + len && src < dst + len) {
		if (src + len + len <= g.maxsize && rnd() & 1)
			dst = src + len + rnd_below(g.maxsize - src - 2 * len + 1);
		else if (src >= len)
			dst = rnd_below(src - len + 1);
		else
			return;
	}
	log_op(OP_COPY, src, len, dst);
	copy_range(g.fd, src, dst, len);
	if (dst + len > g.size)
		model_resize(dst + len);
	memmove(g.model + dst, g.model + src, len);
}

/* copy_file_range from the second file (FILE.src, fixed bytes) into FILE: the kernel
 * may split it, fall back to splice, or pass it to the filesystem. */
static void do_copy_from(void)
{
	uint64_t src = rnd_below(g.maxlen), len = pick_len();
	if (src + len > g.maxlen)
		len = g.maxlen - src;
	uint64_t dst = pick_off(g.maxsize - 1);
	if (dst + len > g.maxsize)
		len = g.maxsize - dst;
	if (len == 0)
		return;
	log_op(OP_COPY_FROM, src, len, dst);
	copy_range(g.src_fd, src, dst, len);
	if (dst + len > g.size)
		model_resize(dst + len);
	memcpy(g.model + dst, g.src + src, len);
}

static bool model_zero(uint64_t a, uint64_t b)
{
	for (uint64_t i = a; i < b; i++)
		if (g.model[i])
			return false;
	return true;
}

static void do_seek(void)
{
	uint64_t off = pick_off(g.size + g.bsize);
	bool data = rnd() & 1;
	struct logent *e = log_op(OP_SEEK, off, 0, 0);
	snprintf(e->note, sizeof(e->note), "%s", data ? "SEEK_DATA" : "SEEK_HOLE");
	off_t r = lseek(g.fd, (off_t)off, data ? SEEK_DATA : SEEK_HOLE);
	if (off >= g.size) {
		if (r >= 0 || errno != ENXIO)
			die("%s at 0x%" PRIx64 " >= size: got %jd (%s), want ENXIO",
			    e->note, off, (intmax_t)r, r < 0 ? strerror(errno) : "");
		return;
	}
	if (r < 0) {
		if (data && errno == ENXIO && model_zero(off, g.size))
			return;
		die("%s at 0x%" PRIx64 ": %s", e->note, off, strerror(errno));
	}
	uint64_t u = (uint64_t)r;
	if (u < off || u > g.size)
		die("%s at 0x%" PRIx64 ": 0x%" PRIx64 " outside [off, size 0x%" PRIx64 "]",
		    e->note, off, u, g.size);
	if (data) {
		/* Everything skipped must be zero; data may be reported early, never late. */
		if (u == g.size || !model_zero(off, u))
			die("SEEK_DATA at 0x%" PRIx64 " -> 0x%" PRIx64 " skips data", off, u);
	} else if (u < g.size && g.model[u]) {
		die("SEEK_HOLE at 0x%" PRIx64 " -> 0x%" PRIx64 " which holds data", off, u);
	}
}

static void do_append(void)
{
	uint64_t len = pick_len();
	if (g.size >= g.maxsize)
		return;
	if (g.size + len > g.maxsize)
		len = g.maxsize - g.size;
	log_op(OP_APPEND, g.size, len, 0);
	int fd = open(g.path, O_WRONLY | O_APPEND);
	if (fd < 0)
		die("append: open: %s", strerror(errno));
	fill(g.buf, len);
	uint64_t done = 0;
	while (done < len) {
		ssize_t r = write(fd, g.buf + done, len - done);
		if (r <= 0)
			die("append: write: %s", r < 0 ? strerror(errno) : "wrote 0");
		done += (uint64_t)r;
	}
	off_t pos = lseek(fd, 0, SEEK_CUR);
	if (pos < 0 || (uint64_t)pos != g.size + len)
		die("append: position 0x%jx after, want 0x%" PRIx64, (intmax_t)pos, g.size + len);
	close(fd);
	uint64_t at = g.size;
	model_resize(at + len);
	memcpy(g.model + at, g.buf, len);
}

static int open_direct(const char *what)
{
	int fd = open(g.path, O_RDWR | O_DIRECT);
	if (fd < 0) {
		if (errno == EINVAL) {
			/* The filesystem refuses O_DIRECT (tmpfs before 6.6): allowed. */
			g.off[OP_DIO_WRITE] = g.off[OP_DIO_READ] = true;
			if (!g.quiet)
				fprintf(stderr, "fsx: O_DIRECT refused (EINVAL), switched off\n");
			return -1;
		}
		die("%s: open O_DIRECT: %s", what, strerror(errno));
	}
	return fd;
}

static void do_dio_write(void)
{
	uint64_t nblk = g.maxsize / DIO_ALIGN;
	if (nblk == 0)
		return;
	uint64_t off = rnd_below(nblk) * DIO_ALIGN;
	uint64_t nlen = g.maxlen / DIO_ALIGN ? g.maxlen / DIO_ALIGN : 1;
	uint64_t len = (1 + rnd_below(nlen)) * DIO_ALIGN;
	if (off + len > nblk * DIO_ALIGN)
		len = nblk * DIO_ALIGN - off;
	struct logent *e = log_op(OP_DIO_WRITE, off, len, 0);
	int fd = open_direct("dio_write");
	if (fd < 0) {
		snprintf(e->note, sizeof(e->note), "O_DIRECT refused");
		return;
	}
	fill(g.dbuf, len);
	uint64_t done = 0;
	while (done < len) {
		ssize_t r = pwrite(fd, g.dbuf + done, len - done, (off_t)(off + done));
		if (r <= 0)
			die("dio_write: pwrite: %s", r < 0 ? strerror(errno) : "wrote 0");
		done += (uint64_t)r;
	}
	close(fd);
	if (off + len > g.size)
		model_resize(off + len);
	memcpy(g.model + off, g.dbuf, len);
}

static void do_dio_read(void)
{
	if (g.size < DIO_ALIGN)
		return;
	uint64_t off = rnd_below(g.size / DIO_ALIGN) * DIO_ALIGN;
	uint64_t nlen = g.maxlen / DIO_ALIGN ? g.maxlen / DIO_ALIGN : 1;
	uint64_t len = (1 + rnd_below(nlen)) * DIO_ALIGN;
	struct logent *e = log_op(OP_DIO_READ, off, len, 0);
	int fd = open_direct("dio_read");
	if (fd < 0) {
		snprintf(e->note, sizeof(e->note), "O_DIRECT refused");
		return;
	}
	uint64_t want = off + len > g.size ? g.size - off : len, done = 0;
	for (;;) {
		ssize_t r = pread(fd, g.dbuf + done, len - done, (off_t)(off + done));
		if (r < 0)
			die("dio_read: pread: %s", strerror(errno));
		if (r == 0)
			break;
		done += (uint64_t)r;
		if (done >= len)
			break;
	}
	close(fd);
	if (done != want)
		die("dio_read 0x%" PRIx64 "+0x%" PRIx64 ": read 0x%" PRIx64 ", want 0x%" PRIx64,
		    off, len, done, want);
	compare(g.dbuf, off, want, "dio_read");
}

static void do_reopen(void)
{
	log_op(OP_REOPEN, 0, 0, 0);
	if (close(g.fd) < 0)
		die("close: %s", strerror(errno));
	open_file(0);
}

static void do_sync(enum op op)
{
	log_op(op, 0, 0, 0);
	if ((op == OP_FSYNC ? fsync(g.fd) : fdatasync(g.fd)) < 0)
		die("%s: %s", op_name[op], strerror(errno));
}

static void do_drop(void)
{
	log_op(OP_DROP, 0, 0, 0);
	/* Clean pages only: the daemon must serve the next read. */
	if (fsync(g.fd) < 0)
		die("dropcache: fsync: %s", strerror(errno));
	int rc = posix_fadvise(g.fd, 0, 0, POSIX_FADV_DONTNEED);
	if (rc)
		die("dropcache: posix_fadvise: %s", strerror(rc));
}

static enum op pick_op(void)
{
	unsigned total = 0;
	for (int i = 0; i < OP_NR; i++)
		total += g.off[i] ? 0 : op_weight[i];
	unsigned r = (unsigned)rnd_below(total);
	for (int i = 0; i < OP_NR; i++) {
		if (g.off[i])
			continue;
		if (r < op_weight[i])
			return (enum op)i;
		r -= op_weight[i];
	}
	return OP_WRITE;
}

static void run_op(enum op op)
{
	switch (op) {
	case OP_WRITE: do_write(); break;
	case OP_READ: do_read(); break;
	case OP_TRUNCATE: do_truncate(false); break;
	case OP_FTRUNCATE: do_truncate(true); break;
	case OP_MAPREAD: do_mapread(); break;
	case OP_MAPWRITE: do_mapwrite(); break;
	case OP_FALLOC: case OP_FALLOC_KEEP: case OP_PUNCH: case OP_ZERO: case OP_ZERO_KEEP:
		do_falloc(op);
		break;
	case OP_COPY: do_copy(); break;
	case OP_COPY_FROM: do_copy_from(); break;
	case OP_MAPPRIVATE: do_mapprivate(); break;
	case OP_WO_WRITE: do_wo_write(); break;
	case OP_SEEK: do_seek(); break;
	case OP_APPEND: do_append(); break;
	case OP_DIO_WRITE: do_dio_write(); break;
	case OP_DIO_READ: do_dio_read(); break;
	case OP_REOPEN: do_reopen(); break;
	case OP_FSYNC: case OP_FDATASYNC: do_sync(op); break;
	case OP_DROP: do_drop(); break;
	case OP_NR: break;
	}
}

static void usage(void)
{
	fprintf(stderr,
		"usage: mlfs-fsx [-s SEED] [-n OPS] [-S MAXSIZE] [-l MAXLEN] [-b BLOCK] [-V EVERY]\n"
		"           [-x OP,...] [-k | -i MODEL] [-t] [-q] [-o OUT] FILE\n"
		"  -s seed (default 1)          -n operations (default 1000)\n"
		"  -S largest file size (4M)    -l longest single I/O (1M)\n"
		"  -b block size to straddle (1M)  -V verify all bytes every N ops (1)\n"
		"  -x ops to leave out, by name (e.g. -x mapwrite,dio_write)\n"
		"  -k start from FILE's bytes (else it is created empty)\n"
		"  -i MODEL start from MODEL's bytes, which FILE holds (FILE is not read first)\n"
		"  -t tolerant: an EOPNOTSUPP fallocate mode is switched off, not a failure\n"
		"  -o OUT write the final model to OUT    -q quiet\n");
	exit(2);
}

static uint64_t parse_size(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 0);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	if (*end)
		usage();
	return v;
}

static void leave_out(char *list)
{
	for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
		int i;
		for (i = 0; i < OP_NR; i++)
			if (!strcmp(t, op_name[i]))
				break;
		if (i == OP_NR) {
			fprintf(stderr, "fsx: unknown op '%s'\n", t);
			usage();
		}
		g.off[i] = true;
	}
}

int main(int argc, char **argv)
{
	int c;
	g.seed = 1;
	g.nops = 1000;
	g.maxsize = 4 << 20;
	g.maxlen = 1 << 20;
	g.bsize = 1 << 20;
	g.verify_every = 1;
	while ((c = getopt(argc, argv, "s:n:S:l:b:V:x:kti:o:qh")) != -1) {
		switch (c) {
		case 's': g.seed = strtoull(optarg, NULL, 0); break;
		case 'n': g.nops = strtoul(optarg, NULL, 0); break;
		case 'S': g.maxsize = parse_size(optarg); break;
		case 'l': g.maxlen = parse_size(optarg); break;
		case 'b': g.bsize = parse_size(optarg); break;
		case 'V': g.verify_every = strtoul(optarg, NULL, 0); break;
		case 'x': leave_out(optarg); break;
		case 'k': g.keep = true; break;
		case 'i': g.initial = optarg; break;
		case 't': g.tolerant = true; break;
		case 'o': g.out = optarg; break;
		case 'q': g.quiet = true; break;
		default: usage();
		}
	}
	if (optind != argc - 1 || g.maxsize < 2 || g.maxlen == 0 || g.bsize == 0)
		usage();
	if (g.maxlen > g.maxsize)
		g.maxlen = g.maxsize;
	g.path = argv[optind];
	g.rng = g.seed;
	/* The model and the read buffer may hold a whole file of maxsize plus a page. */
	g.model = calloc(1, g.maxsize + DIO_ALIGN);
	g.buf = malloc(g.maxsize + DIO_ALIGN);
	if (!g.model || !g.buf || posix_memalign((void **)&g.dbuf, DIO_ALIGN,
						  g.maxlen + DIO_ALIGN))
		die("out of memory");

	/* The source of copy_from: maxlen bytes of its own, written once, read back. */
	if (asprintf(&g.src_path, "%s.src", g.path) < 0 || !(g.src = malloc(g.maxlen)))
		die("out of memory");
	g.src_fd = open(g.src_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (g.src_fd < 0)
		die("create %s: %s", g.src_path, strerror(errno));
	fill(g.src, g.maxlen);
	xpwrite(g.src_fd, g.src, 0, g.maxlen, "copy_from source");
	if (g.initial) {
		int fd = open(g.initial, O_RDONLY);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) < 0)
			die("-i %s: %s", g.initial, strerror(errno));
		if ((uint64_t)st.st_size > g.maxsize)
			die("-i: MODEL holds 0x%jx bytes, more than -S", (intmax_t)st.st_size);
		g.size = (uint64_t)st.st_size;
		xpread(fd, g.model, 0, g.size, "-i initial read");
		close(fd);
		open_file(0);
		check_size("initial");
	} else if (g.keep) {
		open_file(0);
		struct stat st;
		if (fstat(g.fd, &st) < 0)
			die("fstat: %s", strerror(errno));
		if ((uint64_t)st.st_size > g.maxsize)
			die("-k: FILE holds 0x%jx bytes, more than -S", (intmax_t)st.st_size);
		g.size = (uint64_t)st.st_size;
		xpread(g.fd, g.model, 0, g.size, "-k initial read");
		check_all("initial");
	} else {
		g.fd = open(g.path, O_RDWR | O_CREAT | O_TRUNC, 0644);
		if (g.fd < 0)
			die("create %s: %s", g.path, strerror(errno));
		check_all("initial");
	}

	for (unsigned long i = 0; i < g.nops; i++) {
		run_op(pick_op());
		g.log[(g.nlog - 1) % LOG_KEEP].size_after = g.size;
		if (g.verify_every && (i + 1) % g.verify_every == 0)
			check_all(op_name[g.log[(g.nlog - 1) % LOG_KEEP].op]);
		else
			check_size(op_name[g.log[(g.nlog - 1) % LOG_KEEP].op]);
	}
	check_all("final");
	if (close(g.fd) < 0)
		die("close: %s", strerror(errno));
	xpread(g.src_fd, g.buf, 0, g.maxlen, "copy_from source");
	if (memcmp(g.buf, g.src, g.maxlen))
		die("copy_from source %s changed", g.src_path);
	close(g.src_fd);
	unlink(g.src_path);
	if (g.out) {
		int fd = open(g.out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			die("open %s: %s", g.out, strerror(errno));
		xpwrite(fd, g.model, 0, g.size, "-o");
		if (g.size == 0 && ftruncate(fd, 0) < 0)
			die("-o: %s", strerror(errno));
		close(fd);
	}
	if (!g.quiet) {
		printf("fsx: seed %" PRIu64 ": %lu ops passed, final size %" PRIu64 "\n", g.seed,
		       g.nops, g.size);
		for (int i = 0; i < OP_NR; i++)
			printf("  %-11s %lu\n", op_name[i], g.count[i]);
	}
	return 0;
}
