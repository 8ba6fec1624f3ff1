/*
 * snap_offline.c - mlfs-snap's offline subcommands (contract in snap_offline.h).
 */
#include "tools/snap_offline.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "fs/fdio.h"
#include "fs/manifest.h"
#include "cache/log.h"
#include "cache/utf8.h"
#include "fs/store.h"

const char snap_offline_usage[] =
	"       mlfs-snap list --store DIR [--json]\n"
	"       mlfs-snap restore --store DIR NAME|latest --to DIR\n"
	"       mlfs-snap verify --store DIR [NAME|latest]\n"
	"       mlfs-snap gc --store DIR\n"
	"       mlfs-snap delete --store DIR NAME\n"
	"       mlfs-snap init --store DIR\n";

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Keeps errno: callers say what failed, then return -errno. */
static void say(const char *fmt, ...)
{
	int saved = errno;
	char line[1024], esc[4 * sizeof(line)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* One line, whatever a name holds: a newline or an escape sequence in a name the
	 * user typed must not split the message or reach the terminal (snap_escape). */
	snap_escape(esc, sizeof(esc), line, SNAP_ESC_TTY);
	fprintf(stderr, "mlfs-snap: %s\n", esc);
	errno = saved;
}

/* The longest escaped character, and its NUL: a C1 control for a terminal, \xC2\x9B. */
#define ESC_CHAR_MAX 9

/* The escaped form of the character at p into e (ESC_CHAR_MAX bytes), how as
 * snap_escape; returns the bytes of p it stands for (at least 1). */
static int esc_char(const unsigned char *p, char *e, enum snap_esc how)
{
	int n = utf8_len(p);
	unsigned cp = n == 1 ? p[0] : n == 2 ? (p[0] & 0x1fu) << 6 | (p[1] & 0x3fu) : 0x100;
	const char *sh = cp && cp < 0x80 ? strchr("\"\\\b\f\n\r\t", (int)cp) : NULL;

	if (!n) {
		if (how == SNAP_ESC_JSON)
			strcpy(e, "\\ufffd");
		else
			sprintf(e, "\\x%02x", p[0]);
		return 1;
	}
	if (sh && (how != SNAP_ESC_TTY || (cp != '"' && cp != '\b' && cp != '\f'))) {
		e[0] = '\\';
		e[1] = "\"\\bfnrt"[sh - "\"\\\b\f\n\r\t"];
		e[2] = '\0';
	} else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) {
		if (how == SNAP_ESC_JSON)
			sprintf(e, "\\u%04x", cp);
		else if (n == 2)
			sprintf(e, "\\x%02x\\x%02x", p[0], p[1]);
		else
			sprintf(e, "\\x%02x", cp);
	} else {
		memcpy(e, p, (size_t)n);
		e[n] = '\0';
	}
	return n;
}

size_t snap_escape(char *out, size_t size, const char *str, enum snap_esc how)
{
	const unsigned char *p = (const unsigned char *)str;
	size_t len = 0;

	while (*p) {
		char e[ESC_CHAR_MAX];
		size_t k;

		p += esc_char(p, e, how);
		k = strlen(e);
		if (len + k >= size)
			break; /* cut between two characters, never inside one */
		memcpy(out + len, e, k);
		len += k;
	}
	if (size)
		out[len] = '\0';
	return len;
}

void snap_put_escaped(FILE *f, const char *str, enum snap_esc how)
{
	const unsigned char *p = (const unsigned char *)str;

	while (*p) {
		char e[ESC_CHAR_MAX];

		p += esc_char(p, e, how);
		fputs(e, f);
	}
}

int snap_name_ok(const char *name, int taking)
{
	return taking ? store_name_new(name) : store_name_valid(name);
}

void snap_say_bad_name(const char *name)
{
	say("invalid snapshot name '%s': a name is 1 to 255 bytes of UTF-8 without '/' or "
	    "control characters, not starting with '.' or '-', and not 'latest'", name);
}

/* Readers (list, verify, restore) pass STORE_RDONLY: they write nothing in the store,
 * so a store on a read-only filesystem or one the caller may only read still opens. */
static int open_store(const char *dir, int flags, struct store **s)
{
	int rc;

	log_first_error_reset();
	rc = store_open(dir, flags, s);
	if (rc == -EINVAL)
		say("%s: not an mlfs store", dir);
	else if (rc == -EPROTONOSUPPORT)
		say("%s: store format version not supported by this mlfs-snap", dir);
	else if (rc == -EPERM && log_first_error()[0])
		say("%s", log_first_error()); /* store_dir_trusted: whose, and the fix */
	else if (rc)
		say("%s: %s", dir, strerror(-rc));
	return rc;
}

static void say_conflict(void *arg, const struct mf_manifest *p, size_t idx, unsigned kept,
			 unsigned part)
{
	char path[1024];

	if (mf_path(p, idx, path, sizeof(path)) < 0)
		snprintf(path, sizeof(path), "(a long path)");
	if (kept == MF_PART_NONE)
		say("group '%s': conflict: part %u's hard link %s names a file that lost a "
		    "conflict; the link is left out", (const char *)arg, part, path);
	else
		say("group '%s': conflict: parts %u and %u hold %s with different contents; "
		    "part %u's is restored", (const char *)arg, kept, part, path, kept);
}

/* NAME or "latest" -> a loaded, verified manifest (a group: the union of its parts);
 * says why not. */
static int load(struct store *s, const char *dir, const char *name, struct mf_manifest **m)
{
	char latest[MF_NAME_MAX + 1];
	uint64_t conflicts = 0;
	int rc;

	if (!strcmp(name, "latest")) {
		rc = store_latest(s, latest);
		if (rc == -ENOENT)
			say("%s: no snapshot usable as latest (none, or only damaged ones, ones "
			    "taken with files open for writing, or groups partial, with "
			    "conflicts or of mixed block sizes: restore one by name)", dir);
		else if (rc)
			say("%s: %s", dir, strerror(-rc));
		if (rc)
			return rc;
		name = latest;
	} else if (snap_name_ok(name, 0)) {
		snap_say_bad_name(name);
		return -EINVAL;
	}
	rc = store_load_snapshot(s, name, say_conflict, (void *)name, m, &conflicts);
	if (!rc && conflicts)
		say("group '%s': %" PRIu64 " conflict%s: the lowest part's version of each is "
		    "restored", name, conflicts, conflicts == 1 ? "" : "s");
	if (rc == -EAGAIN) {
		unsigned parts = 0, workers = 0;

		store_group_state(s, name, &parts, &workers);
		say("%s: group '%s' is partial (%u of %u parts): not restorable", dir, name, parts,
		    workers);
		rc = -ENOENT;
	} else if (rc == -ENOENT)
		say("%s: no snapshot named '%s'", dir, name);
	else if (rc == -EIO)
		say("snapshot '%s' is damaged (%s); not used", name, store_load_why());
	else if (rc)
		say("snapshot '%s': %s", name, strerror(-rc));
	return rc;
}

/* ---- list ---- */

static void fmt_time(int64_t ns, char *buf, size_t size)
{
	/* Floored: -1 ns is the last second of 1969, not 1970's first. */
	time_t t = (time_t)(ns / 1000000000 - (ns % 1000000000 < 0));
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void fmt_bytes(uint64_t b, char *buf, size_t size)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)b;
	int u = 0;

	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, size, "%" PRIu64 " B", b);
	else
		snprintf(buf, size, "%.1f %s", v, unit[u]);
}

static void json_str(const char *s)
{
	putchar('"');
	snap_put_escaped(stdout, s, SNAP_ESC_JSON);
	putchar('"');
}

void snap_print_list(const struct store_snap_info *v, const char *const *states, size_t n,
		     int json)
{
	if (json)
		putchar('[');
	else
		printf("%-24s %-20s %8s %12s %12s %s\n", "NAME", "TIME", "FILES", "LOGICAL", "NEW",
		       "STATE");
	for (size_t i = 0; i < n; i++) {
		const struct store_snap_info *x = &v[i];
		const char *state = states ? states[i]
				    : x->state == STORE_SNAP_DAMAGED ? "damaged"
				    : x->state == STORE_SNAP_PARTIAL ? "partial" : "durable";
		int damaged = !strcmp(state, "damaged");
		char t[32], lb[32], nb[32], name[4 * MF_NAME_MAX + 1];

		fmt_time(x->time_ns, t, sizeof(t));
		snap_escape(name, sizeof(name), x->name, SNAP_ESC_TTY);
		if (json) {
			printf("%s\n {\"name\": ", i ? "," : "");
			json_str(x->name);
			printf(", \"time\": \"%s\", \"time_ns\": %" PRId64 ", \"files\": %" PRIu64
			       ", \"logical_bytes\": %" PRIu64 ", \"new_bytes\": %" PRIu64
			       ", \"state\": \"%s\", \"open_for_write\": %" PRIu64 ", \"workers\": %"
			       PRIu32 ", \"parts\": %" PRIu32 ", \"conflicts\": %" PRIu64 "}",
			       damaged ? "" : t, x->time_ns, x->files, x->logical_bytes, x->new_bytes,
			       state, x->open_writes, x->workers, x->parts, x->conflicts);
			continue;
		}
		fmt_bytes(x->logical_bytes, lb, sizeof(lb));
		fmt_bytes(x->new_bytes, nb, sizeof(nb));
		if (damaged)
			printf("%-24s %-20s %8s %12s %12s %s\n", name, "-", "-", "-", "-", state);
		else
			printf("%-24s %-20s %8" PRIu64 " %12s %12s %s", name, t, x->files, lb, nb,
			       state);
		/* Groups: a partial one is no snapshot yet; one with conflicts is never
		 * latest (store_latest), nor one with files open for writing (a torn write). */
		if (!damaged && !strcmp(state, "partial"))
			printf(" (%" PRIu32 " of %" PRIu32 " parts; not restorable)", x->parts, x->workers);
		else if (!damaged && x->workers > 1)
			printf(" (group of %" PRIu32 ")", x->workers);
		if (!damaged && x->conflicts)
			printf(" (conflicts: %" PRIu64 "; not latest)", x->conflicts);
		if (!damaged && x->open_writes)
			printf(" (open-for-write: %" PRIu64 " file%s; not latest)", x->open_writes,
			       x->open_writes == 1 ? "" : "s");
		if (!damaged && x->block_size == MF_BLOCK_SIZE_MIXED)
			printf(" (block sizes differ; not latest, restore --to only)");
		if (!damaged)
			putchar('\n');
	}
	if (json)
		printf("%s]\n", n ? "\n" : "");
}

int snap_list(const char *store_dir, int json)
{
	struct store_snap_info *v;
	struct store *s;
	size_t n;
	int rc;

	if (open_store(store_dir, STORE_RDONLY, &s))
		return 1;
	rc = store_list(s, STORE_LIST_DAMAGED, &v, &n);
	store_close(s);
	if (rc) {
		say("%s: %s", store_dir, strerror(-rc));
		return 1;
	}
	snap_print_list(v, NULL, n, json);
	free(v);
	return 0;
}

/* ---- restore ---- */

struct restore {
	struct store *s;
	const struct mf_manifest *m;
	const char *stage;
	char *path[2];		/* rpath's buffers: stage, '/', a path of at most 4095 */
	unsigned char *bad;	/* per entry: left out because of damage */
	void *buf;
	int damaged, xattr_warned;
	int unprivileged;	/* files restored without their setuid/setgid bits or caps */
};

/* What restore --to leaves out (restore_meta): a store may sit on a filesystem others
 * write, and its checksums say nothing of who wrote a snapshot, so a root restore would
 * otherwise make whatever setuid-root program or file capability a crafted manifest
 * names. A checkpoint tree holds no programs; the mount restores them as they were, on
 * a nosuid mount. */
#define RESTORE_DROP_MODE (S_ISUID | S_ISGID)
static int restore_drops_xattr(const char *name)
{
	return !strcmp(name, "security.capability");
}

/* Why a block of a snapshot could not be read, for its fault line. */
static const char *snap_fault_why(int error)
{
	return error == -ENOENT ? "missing" : error == -EIO ? "checksum mismatch" :
	       strerror(-error);
}

/* Checks that every entry's path fits (any user may nest MOUNT/ckpt past PATH_MAX; the
 * tree is written by path) and makes rpath's buffers. A path per entry was kept: 35
 * times the manifest in memory for a tree of long nested names (a tester's 200,000
 * files under 15 names of 255 bytes took 800 MB). */
static int restore_paths(struct restore *r)
{
	char rel[4096];
	size_t n = r->m->nentries;

	r->bad = calloc(n, 1);
	r->path[0] = malloc(strlen(r->stage) + 1 + sizeof(rel));
	r->path[1] = malloc(strlen(r->stage) + 1 + sizeof(rel));
	if (!r->bad || !r->path[0] || !r->path[1])
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		int len = mf_path(r->m, i, rel, sizeof(rel));

		if (len < 0) {
			say("%s: a path of the snapshot: %s", r->stage, strerror(-len));
			return len;
		}
	}
	return 0;
}

/* Entry i's path under the stage, in buffer slot (0 or 1: link() needs two at once),
 * valid until the next call for that slot. restore_paths checked that it fits. */
static const char *rpath(struct restore *r, size_t i, int slot)
{
	char rel[4096];
	int len = mf_path(r->m, i, rel, sizeof(rel));

	snprintf(r->path[slot], strlen(r->stage) + 1 + sizeof(rel), "%s%s%s", r->stage,
		 len > 0 ? "/" : "", len > 0 ? rel : "");
	return r->path[slot];
}

static int restore_file(struct restore *r, size_t i)
{
	const struct mf_entry *e = &r->m->entries[i];
	const char *p = rpath(r, i, 0);
	int fd, rc = 0;

	fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		say("%s: %s", p, strerror(errno));
		return -errno;
	}
	for (uint64_t k = 0; k < e->nblocks; k++) {
		const struct mf_block *b = &e->blocks[k];
		char obj[STORE_LABEL_LEN];
		int n;

		if (b->flags & MF_BLOCK_HOLE)
			continue;	/* ftruncate below leaves it a hole */
		n = store_get_block(r->s, b->hash, r->buf, b->len);
		if (n != (int)b->len) {
			/* Never leave a file with wrong or missing bytes looking complete. */
			store_object_label(r->s, b->hash, obj);
			say("damaged: %s (block %" PRIu64 ", %s: %s); left out", p + strlen(r->stage) + 1,
			    k, obj, snap_fault_why(n < 0 ? n : -EIO));
			close(fd);
			unlink(p);
			r->bad[i] = 1;
			r->damaged++;
			return 0;
		}
		/* a short write is the target filling up: the next one says ENOSPC */
		if ((rc = fdio_pwrite_all(fd, r->buf, b->len, k * e->block_size))) {
			say("%s: %s", p, strerror(-rc));
			goto out_close;
		}
	}
	if (ftruncate(fd, (off_t)e->size)) {
		rc = -errno;
		say("%s: %s", p, strerror(errno));
	}
out_close:
	close(fd);
	return rc;
}

static void restore_xattrs(struct restore *r, size_t i)
{
	const struct mf_entry *e = &r->m->entries[i];
	const char *p = rpath(r, i, 0);

	for (uint32_t k = 0; k < e->nxattrs; k++) {
		if (restore_drops_xattr(e->xattrs[k].name)) {
			r->unprivileged++;
			continue;
		}
		if (!lsetxattr(p, e->xattrs[k].name, e->xattrs[k].value ? e->xattrs[k].value : "",
			       e->xattrs[k].value_len, 0) || r->xattr_warned)
			continue;
		/* Not fatal: the target filesystem may lack xattrs; the bytes are what matter. */
		say("warning: %s: xattr %s: %s (further xattr errors not shown)", p,
		    e->xattrs[k].name, strerror(errno));
		r->xattr_warned = 1;
	}
}

/* Pass 1, parents first: create every entry and write every file's bytes. */
static int restore_create(struct restore *r)
{
	int rc;

	for (size_t i = 1; i < r->m->nentries; i++) {
		const struct mf_entry *e = &r->m->entries[i];
		const char *p = rpath(r, i, 0);
		long t;

		if (r->bad[mf_find(r->m, e->parent)]) {
			r->bad[i] = 1;	/* its parent could not be made */
			continue;
		}
		switch (e->type) {
		case MF_DIR:
			if (mkdir(p, 0700)) {
				say("%s: %s", p, strerror(errno));
				return -errno;
			}
			break;
		case MF_SYMLINK:
			if (symlink(e->target, p)) {
				say("%s: %s", p, strerror(errno));
				return -errno;
			}
			break;
		default:
			if (!e->link) {
				if ((rc = restore_file(r, i)))
					return rc;
				break;
			}
			t = mf_find(r->m, e->link);
			if (r->bad[t]) {
				r->bad[i] = 1;	/* the inode it shares was left out */
				say("damaged: %s (hard link to %s); left out",
				    p + strlen(r->stage) + 1,
				    rpath(r, (size_t)t, 1) + strlen(r->stage) + 1);
				r->damaged++;
				continue;
			}
			if (link(rpath(r, (size_t)t, 1), p)) {
				say("%s: %s", p, strerror(errno));
				return -errno;
			}
			continue;	/* the inode's metadata is the target's */
		}
	}
	return 0;
}

/* Pass 2, children first: owners, xattrs, modes and times, so that writing a child cannot
 * bump a restored directory mtime and a read-only directory is made so only once it is
 * full. xattrs come after the chown, which would drop security.capability (killpriv),
 * and before the chmod, which fits a POSIX ACL's entries to the mode they were frozen
 * with and could make a directory read-only for the xattr writes. */
static int restore_meta(struct restore *r)
{
	int root = geteuid() == 0;

	for (size_t i = r->m->nentries; i-- > 0;) {
		const struct mf_entry *e = &r->m->entries[i];
		struct timespec ts[2] = {
			{ .tv_sec = e->atime_ns / 1000000000, .tv_nsec = e->atime_ns % 1000000000 },
			{ .tv_sec = e->mtime_ns / 1000000000, .tv_nsec = e->mtime_ns % 1000000000 },
		};

		if (r->bad[i] || e->link)
			continue;
		for (int k = 0; k < 2; k++)
			if (ts[k].tv_nsec < 0) {
				ts[k].tv_nsec += 1000000000;
				ts[k].tv_sec--;
			}
		/* Owners only as root; chown before chmod, which it would undo for setuid. */
		const char *p = rpath(r, i, 1);

		if (root && lchown(p, e->uid, e->gid)) {
			say("%s: chown: %s", p, strerror(errno));
			return -errno;
		}
		mode_t mode = e->mode & 07777;

		restore_xattrs(r, i);
		if (e->type == MF_FILE && (mode & RESTORE_DROP_MODE)) {
			mode &= ~RESTORE_DROP_MODE;
			r->unprivileged++;
		}
		if (e->type != MF_SYMLINK && chmod(p, mode)) {
			say("%s: chmod: %s", p, strerror(errno));
			return -errno;
		}
		if (utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW)) {
			say("%s: times: %s", p, strerror(errno));
			return -errno;
		}
	}
	return 0;
}

static int target_ok(const char *to)
{
	struct stat st;
	struct dirent64 *d;
	struct fdio_dir *dir;
	int empty = 1, rc;

	if (lstat(to, &st)) {
		if (errno == ENOENT)
			return 0;
		say("%s: %s", to, strerror(errno));
		return -errno;
	}
	if (!S_ISDIR(st.st_mode) || fdio_opendir(AT_FDCWD, to, &dir)) {
		say("%s: exists and is not an empty directory", to);
		return -EEXIST;
	}
	while ((rc = fdio_readdir(dir, &d)) > 0)
		if (strcmp(d->d_name, ".") && strcmp(d->d_name, ".."))
			empty = 0;
	fdio_closedir(dir);
	if (rc < 0) {
		say("%s: %s", to, strerror(-rc));
		return rc;
	}
	if (!empty) {
		say("%s: exists and is not an empty directory", to);
		return -EEXIST;
	}
	return 0;
}

static uint32_t max_block(const struct mf_manifest *m)
{
	uint32_t b = 1;

	for (size_t i = 0; i < m->nentries; i++)
		if (m->entries[i].block_size > b)
			b = m->entries[i].block_size;
	return b;
}

/* Walks the directories of path ('/' and every prefix; path absolute, its own copy,
 * cut and put back) and says which one another user can change: not owned by root or
 * the caller, or writable by others outside a sticky directory (/tmp, where others
 * cannot rename what is not theirs). A symlink on the way must be root's or the
 * caller's, and ends the walk: what it leads to is the resolved path's to check. 0, or
 * -errno after one line. */
static int chain_safe(char *path, const char *to)
{
	int rc = 0;

	for (char *p = path;; p++) {
		const char *at = p == path ? "/" : path;
		struct stat st;
		char c = *p;

		if (c != '/' && c != 0)
			continue;
		*p = 0;
		if (lstat(at, &st)) {
			rc = -errno;
			say("%s: %s", at, strerror(errno));
		} else if ((st.st_uid != 0 && st.st_uid != geteuid()) ||
			   (!S_ISLNK(st.st_mode) && (st.st_mode & 0022) && !(st.st_mode & S_ISVTX))) {
			rc = -EPERM;
			say("%s: refusing to restore below %s: another user can change it (owner "
			    "uid %u, mode %o)", to, at, (unsigned)st.st_uid,
			    (unsigned)(st.st_mode & 07777));
		}
		*p = c;
		if (rc || !c || S_ISLNK(st.st_mode))
			return rc;
	}
}

/*
 * The tree is built by path under a stage beside to, so every directory above it must
 * be one that nobody but root and the caller can change: otherwise another user could
 * rename the stage (or a directory above) away and put a symlink in its place between
 * two steps, and the files (whose bytes any user of MOUNT/ckpt may have written) would
 * be made wherever it points, as root. So both the path as given (up to a symlink in it,
 * which must be root's or the caller's: another user's directory could hold one that
 * leads anywhere) and to's parent with symlinks resolved (realpath) are walked by
 * chain_safe. Sets *out to to's absolute form under that resolved parent (handed over);
 * -errno after one line.
 */
static int target_safe(const char *to, char **out)
{
	char *dup = strdup(to), *base, *real = NULL, *given = NULL;
	size_t len;
	int rc = 0;

	if (!dup)
		return -ENOMEM;
	for (len = strlen(dup); len > 1 && dup[len - 1] == '/'; len--)
		dup[len - 1] = 0;
	base = strrchr(dup, '/');
	if (base)
		*base++ = 0;
	else
		base = dup;
	if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
		say("%s: name a new or empty directory", to);
		rc = -EINVAL;
		goto out;
	}
	{
		char cwd[PATH_MAX];
		const char *parent = base == dup ? "." : *dup ? dup : "/";

		if (parent[0] != '/' && !getcwd(cwd, sizeof(cwd))) {
			rc = -errno;
			say("%s: %s", to, strerror(errno));
			goto out;
		}
		if (asprintf(&given, "%s%s%s", parent[0] == '/' ? "" : cwd,
			     parent[0] == '/' ? "" : "/", parent) < 0) {
			given = NULL;
			rc = -ENOMEM;
			goto out;
		}
		if ((rc = chain_safe(given, to)))
			goto out;
	}
	if (!(real = realpath(base == dup ? "." : *dup ? dup : "/", NULL))) {
		rc = -errno;
		say("%s: %s", to, strerror(errno));
		goto out;
	}
	if ((rc = chain_safe(real, to)))
		goto out;
	if (asprintf(out, "%s/%s", strcmp(real, "/") ? real : "", base) < 0)
		rc = -ENOMEM;
out:
	free(given);
	free(real);
	free(dup);
	return rc;
}

/* Whether to (absolute, its parent resolved: target_safe) lies outside the store: a tree
 * restored inside it showed in list as a partial group, and gc would have removed its
 * files after its grace. -EINVAL after one line when it does not. */
static int target_outside(const char *to, const char *store_dir)
{
	char *real = realpath(store_dir, NULL);
	size_t n = real ? strlen(real) : 0;
	int inside = real && !strncmp(to, real, n) && (to[n] == '/' || !to[n] || n == 1);

	if (inside)
		say("%s: inside the store %s; restore to a directory outside it", to, real);
	free(real);
	return inside ? -EINVAL : 0;
}

int snap_restore(const char *store_dir, const char *name, const char *to_arg)
{
	struct restore r = { 0 };
	struct mf_manifest *m = NULL;
	char *stage = NULL, *slash, *parent = NULL, *to = NULL;
	int rc, status = 1, fd;

	if (strcmp(name, "latest") && snap_name_ok(name, 0)) {
		snap_say_bad_name(name);
		return 2; /* bad usage, as for verify and delete */
	}
	if (open_store(store_dir, STORE_RDONLY, &r.s))
		return 1;
	if (load(r.s, store_dir, name, &m) || target_safe(to_arg, &to) ||
	    target_outside(to, store_dir) || target_ok(to))
		goto out;
	/* A sibling, so the final rename stays within one filesystem. */
	if (asprintf(&stage, "%s.mlfs-restore.%ld", to, (long)getpid()) < 0)
		goto out;
	if (mkdir(stage, 0700)) {
		say("%s: %s", stage, strerror(errno));
		goto out;
	}
	r.m = m;
	r.stage = stage;
	r.buf = malloc(max_block(m));
	if (!r.buf || (rc = restore_paths(&r))) {
		if (!r.buf || rc == -ENOMEM)
			say("out of memory");
		goto out_partial;
	}
	if ((rc = restore_create(&r)) || (rc = restore_meta(&r)))
		goto out_partial;
	if (r.unprivileged)
		say("note: %d setuid/setgid bit(s) or file capabilities not restored (restore "
		    "--to makes no privileged program; the mount keeps them)", r.unprivileged);
	if (r.damaged) {
		say("restore of '%s' incomplete: %d damaged file(s) left out; partial tree in %s",
		    m->name, r.damaged, stage);
		goto out;
	}
	/* Durable before it appears under its name: one flush for the whole tree. */
	fd = open(stage, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	rc = fd < 0 || syncfs(fd) ? -errno : 0;
	if (fd >= 0)
		close(fd);
	if (rc || rename(stage, to)) {
		say("%s: %s", to, strerror(rc ? -rc : errno));
		goto out_partial;
	}
	/* The rename is durable only once the parent is flushed: a failure here is a
	 * restore a power cut may undo, so it is not reported as done. to is absolute
	 * (target_safe). */
	parent = strdup(to);
	slash = parent ? strrchr(parent, '/') : NULL;
	if (!slash) {
		say("out of memory");
		goto out;
	}
	*(slash == parent ? slash + 1 : slash) = 0;
	fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	rc = fd < 0 || fsync(fd) ? -errno : 0;
	if (fd >= 0)
		close(fd);
	if (rc) {
		say("%s: flushing %s: %s; the restored tree may not survive a power cut", to,
		    parent, strerror(-rc));
		goto out;
	}
	fputs("restored '", stdout);
	snap_put_escaped(stdout, m->name, SNAP_ESC_TTY);
	fputs("' to ", stdout);
	snap_put_escaped(stdout, to, SNAP_ESC_TTY);
	printf(": %" PRIu64 " files, %" PRIu64 " bytes\n", m->files, m->logical_bytes);
	status = 0;
	goto out;
out_partial:
	say("restore of '%s' failed; partial tree left in %s", m->name, stage);
out:
	free(r.path[0]);
	free(r.path[1]);
	free(r.bad);
	free(r.buf);
	free(parent);
	free(stage);
	free(to);
	mf_free(m);
	store_close(r.s);
	return status;
}

/* ---- verify, gc, delete ---- */

/* One line per fault, names escaped (snap_escape): *(int *)arg counts the lines, so
 * the summary's count is the number of lines printed. */
static void print_fault(void *arg, const struct store_fault *f)
{
	snap_put_escaped(stdout, f->snap, SNAP_ESC_TTY);
	if (f->error == -EEXIST) {
		/* a group's conflict: reported, not damage (not counted) */
		fputs(": conflict: ", stdout);
		snap_put_escaped(stdout, f->file, SNAP_ESC_TTY);
		if (f->parts[0] == MF_PART_NONE)
			printf(" (part %u's hard link names a file that lost a conflict; the "
			       "link is left out)\n", f->parts[1]);
		else
			printf(" (parts %u and %u hold it with different contents; part %u's "
			       "is restored)\n", f->parts[0], f->parts[1], f->parts[0]);
		return;
	}
	if (f->file) {
		fputs(": damaged: ", stdout);
		snap_put_escaped(stdout, f->file, SNAP_ESC_TTY);
		printf(" (block %" PRIu64 ", ", f->block);
		snap_put_escaped(stdout, f->object, SNAP_ESC_TTY);
		printf(": %s)\n", snap_fault_why(f->error));
	} else {
		fputs(": damaged manifest: ", stdout);
		snap_put_escaped(stdout, f->object, SNAP_ESC_TTY);
		/* (called on the thread that loaded it, right after: store.h) */
		printf(" (%s)\n", store_load_why());
	}
	++*(int *)arg;
}

int snap_verify(const char *store_dir, const char *name)
{
	struct store *s;
	char latest[MF_NAME_MAX + 1];
	int rc, lines = 0;

	if (name && strcmp(name, "latest") && snap_name_ok(name, 0)) {
		snap_say_bad_name(name);
		return 2; /* bad usage: before the store is opened */
	}
	log_first_error_reset();
	if (open_store(store_dir, STORE_RDONLY, &s))
		return 1;
	if (name && !strcmp(name, "latest")) {
		if ((rc = store_latest(s, latest))) {
			say("%s: %s", store_dir, rc == -ENOENT ? "no snapshot usable as latest" : strerror(-rc));
			store_close(s);
			return 1;
		}
		name = latest;
	}
	rc = store_verify(s, name, print_fault, &lines);
	store_close(s);
	if (rc == -ENOENT) {
		say("%s: no snapshot named '%s'", store_dir, name);
		return 1;
	}
	if (rc < 0) {
		say("verify: %s", strerror(-rc));
		return 1;
	}
	if (rc > 0 || lines) {
		/* store_verify counts distinct damaged objects; the user counts lines (one
		 * per file block using a damaged object): say the count they can check. */
		say("verify: %d fault(s) in %s", lines > rc ? lines : rc, store_dir);
		/* Objects of a damaged pack show as missing: the store's line names it. */
		if (strstr(log_first_error(), "/packs/"))
			say("verify: %s", log_first_error());
		return 1;
	}
	snap_put_escaped(stdout, name ? name : store_dir, SNAP_ESC_TTY);
	fputs(": every object and manifest verified\n", stdout);
	return 0;
}

int snap_gc(const char *store_dir)
{
	struct store *s;
	uint64_t objs = 0, bytes = 0;
	char b[32];
	int rc;

	if (open_store(store_dir, 0, &s))
		return 1;
	log_first_error_reset();
	rc = store_gc(s, &objs, &bytes);
	store_close(s);
	if (rc == -EBUSY) { /* store_gc: only a format 1 daemon's STORE/lock does it here */
		say("%s: a daemon of an mlfs before store format 2 has the store mounted (it holds "
		    "%s/lock and would not see gc's leases); gc not run: unmount or upgrade it",
		    store_dir, store_dir);
		return 1;
	}
	if (rc == -EIO && log_first_error()[0]) {
		/* The store's line names the damaged manifest or the fresh lease that does
		 * not parse (verify names no lease), or the read that failed. */
		say("%s: gc refused: %s", store_dir, log_first_error());
		return 1;
	}
	if (rc == -EIO) {
		/* Damage and a failing store both come back as -EIO: say both, so that a
		 * store that failed one read is not taken for a snapshot to delete. */
		say("%s: gc refused: Input/output error: a damaged manifest or fresh lease (verify "
		    "names it; delete it first), or the store failed a read, a listing or a flush "
		    "(try again)", store_dir);
		return 1;
	}
	fmt_bytes(bytes, b, sizeof(b));
	if (rc == -ENOSPC) {
		say("%s: gc removed %" PRIu64 " objects, freed %s, then no room was left on the "
		    "store's filesystem (%s): a pack that also holds live blocks is repacked "
		    "only with room for a copy of them; free some, or delete the snapshots that "
		    "hold them, and run gc again", store_dir, objs, b,
		    log_first_error()[0] ? log_first_error() : "No space left on device");
		return 1;
	}
	if (rc) {
		say("gc: %s", strerror(-rc));
		return 1;
	}
	printf("removed %" PRIu64 " objects, freed %s\n", objs, b);
	return 0;
}

int snap_delete(const char *store_dir, const char *name)
{
	struct store *s;
	int rc;

	if (snap_name_ok(name, 0)) {
		snap_say_bad_name(name);
		return 2;
	}
	if (open_store(store_dir, 0, &s))
		return 1;
	log_first_error_reset();
	rc = store_delete(s, name);
	store_close(s);
	if (rc == -ENOENT) {
		say("%s: no snapshot named '%s'", store_dir, name);
		return 1;
	}
	if (rc) {
		/* The store's line, when it logged one, names what stopped it. */
		say("delete '%s': %s", name,
		    log_first_error()[0] ? log_first_error() : strerror(-rc));
		return 1;
	}
	fputs("deleted '", stdout);
	snap_put_escaped(stdout, name, SNAP_ESC_TTY);
	fputs("' (its blocks are freed by gc)\n", stdout);
	return 0;
}

int snap_init(const char *store_dir)
{
	struct store *s;

	/* STORE_CREATE is create-once (fs/store.c invariant 8): any number of init calls
	 * and daemons at once on one empty directory all succeed. */
	if (open_store(store_dir, STORE_CREATE, &s))
		return 1;
	store_close(s);
	printf("%s: mlfs store ready (format version %d)\n", store_dir, STORE_FORMAT_VERSION);
	return 0;
}

/* ---- argument parsing ---- */

static const char *const subcmds[] = { "list", "restore", "verify", "gc", "delete", "init" };

int snap_offline_wants(int argc, char **argv)
{
	int known = 0;

	if (argc < 1)
		return 0;
	for (size_t i = 0; i < sizeof(subcmds) / sizeof(subcmds[0]); i++)
		known |= !strcmp(argv[0], subcmds[i]);
	for (int i = 1; known && i < argc; i++)
		if (!strcmp(argv[i], "--store") || !strncmp(argv[i], "--store=", 8))
			return 1;
	return 0;
}

static int usage(const char *why)
{
	say("%s", why);
	fprintf(stderr, "usage:\n%s", snap_offline_usage);
	return 2;
}

int snap_offline_main(int argc, char **argv)
{
	const char *store = NULL, *to = NULL, *pos[2] = { NULL, NULL };
	const char *cmd = argc > 0 ? argv[0] : "";
	int json = 0, npos = 0;

	/* The tool says every failure itself, in one line (say()); the store library's
	 * own log lines would repeat it. */
	log_set_quiet(1);

	for (int i = 1, opts = 1; i < argc; i++) {
		const char *a = argv[i];

		if (opts && !strcmp(a, "--")) {
			opts = 0; /* the rest are names: one an older mlfs let begin with '-' */
		} else if (!opts || a[0] != '-' || !a[1]) {
			if (npos == 2)
				return usage("too many arguments");
			pos[npos++] = a;
		} else if (!strcmp(a, "--store") || !strcmp(a, "--to")) {
			if (i + 1 >= argc)
				return usage("option needs a directory");
			*(a[2] == 's' ? &store : &to) = argv[++i];
		} else if (!strncmp(a, "--store=", 8)) {
			store = a + 8;
		} else if (!strncmp(a, "--to=", 5)) {
			to = a + 5;
		} else if (!strcmp(a, "--json")) {
			json = 1;
		} else {
			char why[300];

			snprintf(why, sizeof(why), "unknown option '%s'", a);
			return usage(why);
		}
	}
	if (!store || !*store)
		return usage("--store DIR is required");
	if ((to && strcmp(cmd, "restore")) || (json && strcmp(cmd, "list")))
		return usage("option not valid for this subcommand");
	if (!strcmp(cmd, "list") && npos == 0)
		return snap_list(store, json);
	if (!strcmp(cmd, "restore")) {
		if (npos != 1 || !to || !*to)
			return usage("restore needs NAME|latest and --to DIR");
		return snap_restore(store, pos[0], to);
	}
	if (!strcmp(cmd, "verify") && npos <= 1)
		return snap_verify(store, pos[0]);
	if (!strcmp(cmd, "gc") && npos == 0)
		return snap_gc(store);
	if (!strcmp(cmd, "init") && npos == 0)
		return snap_init(store);
	if (!strcmp(cmd, "delete")) {
		if (npos != 1)
			return usage("delete needs a snapshot NAME");
		return snap_delete(store, pos[0]);
	}
	return usage("unknown subcommand or wrong arguments");
}
