/*
 * manifest.c - encode, verify and decode snapshot manifests (contract in manifest.h,
 * byte layout in docs/store-format.md).
 *
 * Decoding trusts nothing: the length in the header must equal the buffer's, the
 * trailing XXH3-128 must match, then every field is read through a cursor that refuses
 * to step past the end, every count is checked against the bytes left before anything
 * is allocated for it, and the parsed tree goes through the same mf_check() that
 * mf_encode() applies, so a manifest that decodes is one encode would have written.
 */
#include "fs/manifest.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "fs/le.h"

static const char mf_magic[8] = { 'M', 'L', 'F', 'S', 'M', 'A', 'N', 'F' };

/* magic, version, flags, total length, time, name length */
#define MF_HEADER_MIN (8 + 4 + 4 + 8 + 8 + 2 + 8)
/* ids, type, name length, mode/uid/gid, times, size, target length, counts */
#define MF_ENTRY_MIN (24 + 1 + 2 + 12 + 24 + 8 + 2 + 4 + 4 + 8)	/* version 1; 2 adds 1 */
#define MF_XATTR_MIN (1 + 1 + 4)
#define MF_BLOCK_WIRE (1 + 4 + MF_HASH_LEN)
#define MF_TRAILER (24 + MF_HASH_LEN)

/* ---- encoding ---- */

struct wbuf {
	unsigned char *p;
	size_t len, cap;
	int err;
};

static void w_bytes(struct wbuf *w, const void *src, size_t n)
{
	if (w->err || n == 0)
		return;
	if (w->len + n > w->cap) {
		size_t cap = w->cap ? w->cap : 4096;
		unsigned char *p;

		while (cap < w->len + n)
			cap *= 2;
		p = realloc(w->p, cap);
		if (!p) {
			w->err = -ENOMEM;
			return;
		}
		w->p = p;
		w->cap = cap;
	}
	memcpy(w->p + w->len, src, n);
	w->len += n;
}

static void w_le(struct wbuf *w, uint64_t v, int n)
{
	uint8_t b[8];

	le_put(b, v, n);
	w_bytes(w, b, n);
}

/* ---- decoding cursor: every read checks bounds; after one failure all reads fail ---- */

struct rbuf {
	const unsigned char *p;
	size_t pos, len;
	int err;
};

static uint64_t r_le(struct rbuf *r, int n)
{
	uint64_t v;

	if (r->err || r->len - r->pos < (size_t)n) {
		r->err = -EINVAL;
		return 0;
	}
	v = le_get(r->p + r->pos, n);
	r->pos += n;
	return v;
}

static const void *r_bytes(struct rbuf *r, size_t n)
{
	const void *p;

	if (r->err || r->len - r->pos < n) {
		r->err = -EINVAL;
		return NULL;
	}
	p = r->p + r->pos;
	r->pos += n;
	return p;
}

/* A NUL-terminated copy of n bytes that must not contain a NUL themselves. */
static char *r_str(struct rbuf *r, size_t n)
{
	const char *src = r_bytes(r, n);
	char *s;

	if (!src)
		return NULL;
	if (memchr(src, 0, n)) {
		r->err = -EINVAL;
		return NULL;
	}
	s = malloc(n + 1);
	if (!s) {
		r->err = -ENOMEM;
		return NULL;
	}
	memcpy(s, src, n);
	s[n] = 0;
	return s;
}

static size_t r_left(const struct rbuf *r)
{
	return r->err ? 0 : r->len - r->pos;
}

/* ---- tree rules (manifest.h), shared by encode and decode ---- */

int mf_name_valid(const char *s, size_t len)
{
	if (len == 0 || len > MF_NAME_MAX)
		return 0;
	if (memchr(s, '/', len) || memchr(s, 0, len))
		return 0;
	if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
		return 0;
	return 1;
}

long mf_find(const struct mf_manifest *m, uint64_t id)
{
	size_t lo = 0, hi = m->nentries;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (m->entries[mid].id == id)
			return (long)mid;
		if (m->entries[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -ENOENT;
}

static int mf_check_blocks(const struct mf_entry *e)
{
	static const uint8_t zero[MF_HASH_LEN];
	uint64_t want;

	if (e->type != MF_FILE || e->link) {
		if (e->block_size || e->nblocks || e->blocks)
			return -EINVAL;
		return 0;
	}
	if (e->block_size == 0 || e->block_size > MF_BLOCK_SIZE_MAX || e->size > MF_FILE_SIZE_MAX)
		return -EINVAL;
	want = e->size / e->block_size + (e->size % e->block_size != 0);
	if (e->nblocks != want || (e->nblocks && !e->blocks))
		return -EINVAL;
	for (uint64_t i = 0; i < e->nblocks; i++) {
		const struct mf_block *b = &e->blocks[i];
		uint64_t len = i + 1 < e->nblocks ? e->block_size
						  : e->size - (e->nblocks - 1) * e->block_size;

		if (b->len != len || (b->flags & ~MF_BLOCK_HOLE))
			return -EINVAL;
		if ((b->flags & MF_BLOCK_HOLE) && memcmp(b->hash, zero, MF_HASH_LEN))
			return -EINVAL;
	}
	return 0;
}

static int mf_xattr_cmp(const void *a, const void *b)
{
	return strcmp((*(const struct mf_xattr *const *)a)->name,
		      (*(const struct mf_xattr *const *)b)->name);
}

int mf_xattrs_check(const struct mf_entry *e)
{
	const struct mf_xattr **v;
	uint64_t total = 0;
	int rc = 0;

	if (e->nxattrs == 0)
		return e->xattrs ? -EINVAL : 0;
	if (!e->xattrs)
		return -EINVAL;
	for (uint32_t k = 0; k < e->nxattrs; k++) {
		const struct mf_xattr *x = &e->xattrs[k];
		size_t xl = x->name ? strlen(x->name) : 0;

		if (xl == 0 || xl > MF_NAME_MAX || x->value_len > MF_XATTR_VALUE_MAX ||
		    (x->value_len && !x->value))
			return -EINVAL;
		total += xl + x->value_len;
	}
	if (total > MF_XATTR_TOTAL_MAX)
		return -EINVAL;
	if (e->nxattrs == 1)
		return 0;
	if (!(v = malloc(e->nxattrs * sizeof(*v))))
		return -ENOMEM;
	for (uint32_t k = 0; k < e->nxattrs; k++)
		v[k] = &e->xattrs[k];
	qsort(v, e->nxattrs, sizeof(*v), mf_xattr_cmp);
	for (uint32_t k = 1; k < e->nxattrs; k++)
		if (!strcmp(v[k - 1]->name, v[k]->name))
			rc = -EINVAL;
	free(v);
	return rc;
}

/* The version m is written in: its own, or for 0 the lowest that holds its base and
 * flags. */
static uint32_t mf_version(const struct mf_manifest *m)
{
	uint32_t v = MF_VERSION;

	if (m->version)
		return m->version;
	for (size_t i = 0; i < m->nentries; i++) {
		const struct mf_entry *e = &m->entries[i];

		if (!(e->flags & MF_ENTRY_INHERITED))
			continue;
		if (e->type == MF_SYMLINK)
			return 5; /* (without a base mf_check refuses it) */
		v = 3;
	}
	return m->base ? 4 : v;
}

/* version: mf_version(m), computed once by the caller (it scans every entry). */
static int mf_check_entry(const struct mf_manifest *m, size_t i, uint32_t version)
{
	const struct mf_entry *e = &m->entries[i];
	size_t nlen = e->name ? strlen(e->name) : 0;
	long j;
	int rc;

	if (e->type < MF_FILE || e->type > MF_SYMLINK || (e->mode & ~07777u))
		return -EINVAL;
	/* chown(2)'s "unchanged": no inode has it (a link's fields are its target's) */
	if (!e->link && (e->uid == UINT32_MAX || e->gid == UINT32_MAX))
		return -EINVAL;
	if ((e->flags & ~(MF_ENTRY_OPEN_WRITE | MF_ENTRY_INHERITED)) ||
	    (e->flags && (version < 2 || e->link)) ||
	    ((e->flags & MF_ENTRY_OPEN_WRITE) && e->type != MF_FILE) ||
	    ((e->flags & MF_ENTRY_INHERITED) &&
	     (version < 3 || (e->flags & MF_ENTRY_OPEN_WRITE) ||
	      (e->type == MF_DIR && version < 4) ||
	      (e->type == MF_SYMLINK && version < 5))))
		return -EINVAL;
	if (i == 0) {
		if (e->id != 1 || e->parent || e->link || nlen || e->type != MF_DIR)
			return -EINVAL;
	} else {
		if (e->id <= m->entries[i - 1].id || e->parent >= e->id)
			return -EINVAL;
		if (!e->name || !mf_name_valid(e->name, nlen))
			return -EINVAL;
		j = mf_find(m, e->parent);
		if (j < 0 || m->entries[j].type != MF_DIR)
			return -EINVAL;
	}
	if (e->link) {
		if (e->type != MF_FILE || e->link >= e->id || e->nxattrs || e->size)
			return -EINVAL;
		j = mf_find(m, e->link);
		if (j < 0 || m->entries[j].type != MF_FILE || m->entries[j].link)
			return -EINVAL;
	}
	if (e->type == MF_SYMLINK) {
		size_t tl = e->target ? strlen(e->target) : 0;

		if (tl == 0 || tl > MF_TARGET_MAX || e->size != tl)
			return -EINVAL;
	} else if (e->target) {
		return -EINVAL;
	}
	if (e->type == MF_DIR && e->size)
		return -EINVAL;
	if ((rc = mf_xattrs_check(e)))
		return rc;
	return mf_check_blocks(e);
}

/* Orders entry indexes by (parent id, name): equal neighbours are duplicate names. */
static int mf_name_cmp(const void *a, const void *b, void *arg)
{
	const struct mf_entry *ents = arg;
	const struct mf_entry *x = &ents[*(const size_t *)a], *y = &ents[*(const size_t *)b];

	if (x->parent != y->parent)
		return x->parent < y->parent ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* No two entries of one directory share a name (a restore would show both and rmdir
 * of the directory would fail for good). O(n log n) time, 8 bytes an entry. */
static int mf_check_unique(const struct mf_manifest *m)
{
	size_t n = m->nentries - 1, *v;
	int rc = 0;

	if (n < 2)
		return 0;
	if (!(v = malloc(n * sizeof(*v))))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		v[i] = i + 1;
	qsort_r(v, n, sizeof(*v), mf_name_cmp, m->entries);
	for (size_t i = 1; i < n && !rc; i++)
		if (!mf_name_cmp(&v[i - 1], &v[i], m->entries))
			rc = -EINVAL;
	free(v);
	return rc;
}

static int mf_check(const struct mf_manifest *m)
{
	uint32_t version;
	int rc;

	if (!mf_name_valid(m->name, strnlen(m->name, sizeof(m->name))) ||
	    strnlen(m->name, sizeof(m->name)) > MF_NAME_MAX || m->nentries == 0 || !m->entries)
		return -EINVAL;
	if (m->version > MF_VERSION_MAX || m->flags)
		return -EINVAL;
	version = mf_version(m);
	if ((version >= 4) != !!m->base)
		return -EINVAL;
	for (size_t i = 0; i < m->nentries; i++)
		if ((rc = mf_check_entry(m, i, version)))
			return rc;
	return mf_check_unique(m);
}

/* ---- public ---- */

int mf_encode(const struct mf_manifest *m, void **buf, size_t *len)
{
	struct wbuf w = { 0 };
	XXH128_canonical_t sum;
	uint32_t version;
	int rc;

	if ((rc = mf_check(m)))
		return rc;
	version = mf_version(m);
	w_bytes(&w, mf_magic, sizeof(mf_magic));
	w_le(&w, version, 4);
	w_le(&w, m->flags, 4);
	w_le(&w, 0, 8);		/* total length, patched below */
	w_le(&w, (uint64_t)m->time_ns, 8);
	w_le(&w, strlen(m->name), 2);
	w_bytes(&w, m->name, strlen(m->name));
	if (version >= 4)
		w_le(&w, m->base, 8);
	w_le(&w, m->nentries, 8);
	for (size_t i = 0; i < m->nentries; i++) {
		const struct mf_entry *e = &m->entries[i];
		size_t nl = e->name ? strlen(e->name) : 0;
		size_t tl = e->target ? strlen(e->target) : 0;

		w_le(&w, e->id, 8);
		w_le(&w, e->parent, 8);
		w_le(&w, e->link, 8);
		w_le(&w, e->type, 1);
		if (version >= 2)
			w_le(&w, e->flags, 1);
		w_le(&w, nl, 2);
		w_bytes(&w, e->name, nl);
		w_le(&w, e->mode, 4);
		w_le(&w, e->uid, 4);
		w_le(&w, e->gid, 4);
		w_le(&w, (uint64_t)e->atime_ns, 8);
		w_le(&w, (uint64_t)e->mtime_ns, 8);
		w_le(&w, (uint64_t)e->ctime_ns, 8);
		w_le(&w, e->size, 8);
		w_le(&w, tl, 2);
		w_bytes(&w, e->target, tl);
		w_le(&w, e->nxattrs, 4);
		for (uint32_t k = 0; k < e->nxattrs; k++) {
			const struct mf_xattr *x = &e->xattrs[k];

			w_le(&w, strlen(x->name), 1);
			w_bytes(&w, x->name, strlen(x->name));
			w_le(&w, x->value_len, 4);
			w_bytes(&w, x->value, x->value_len);
		}
		w_le(&w, e->block_size, 4);
		w_le(&w, e->nblocks, 8);
		for (uint64_t k = 0; k < e->nblocks; k++) {
			w_le(&w, e->blocks[k].flags, 1);
			w_le(&w, e->blocks[k].len, 4);
			w_bytes(&w, e->blocks[k].hash, MF_HASH_LEN);
		}
	}
	w_le(&w, m->files, 8);
	w_le(&w, m->logical_bytes, 8);
	w_le(&w, m->new_bytes, 8);
	if (w.err) {
		free(w.p);
		return w.err;
	}
	le_put(w.p + 16, w.len + MF_HASH_LEN, 8);
	XXH128_canonicalFromHash(&sum, XXH3_128bits(w.p, w.len));
	w_bytes(&w, sum.digest, MF_HASH_LEN);
	if (w.err) {
		free(w.p);
		return w.err;
	}
	*buf = w.p;
	*len = w.len;
	return 0;
}

/* Parses one entry into e (zeroed by the caller). A count is stored in e only once the
 * array it counts is allocated, so mf_free() of a half-built entry walks only what
 * exists. */
static int mf_decode_entry(struct rbuf *r, uint32_t version, struct mf_entry *e)
{
	uint64_t nblocks;
	uint32_t nxattrs;
	size_t n;

	e->id = r_le(r, 8);
	e->parent = r_le(r, 8);
	e->link = r_le(r, 8);
	e->type = (uint8_t)r_le(r, 1);
	if (version >= 2)
		e->flags = (uint8_t)r_le(r, 1);
	n = r_le(r, 2);
	e->name = r_str(r, n);
	e->mode = (uint32_t)r_le(r, 4);
	e->uid = (uint32_t)r_le(r, 4);
	e->gid = (uint32_t)r_le(r, 4);
	e->atime_ns = (int64_t)r_le(r, 8);
	e->mtime_ns = (int64_t)r_le(r, 8);
	e->ctime_ns = (int64_t)r_le(r, 8);
	e->size = r_le(r, 8);
	n = r_le(r, 2);
	if (n)
		e->target = r_str(r, n);
	nxattrs = (uint32_t)r_le(r, 4);
	if (r->err)
		return r->err;
	if (nxattrs > r_left(r) / MF_XATTR_MIN)
		return -EINVAL;
	if (nxattrs) {
		e->xattrs = calloc(nxattrs, sizeof(*e->xattrs));
		if (!e->xattrs)
			return -ENOMEM;
		e->nxattrs = nxattrs;
	}
	for (uint32_t k = 0; k < e->nxattrs; k++) {
		struct mf_xattr *x = &e->xattrs[k];
		const void *v;
		uint32_t vlen;

		x->name = r_str(r, r_le(r, 1));
		vlen = (uint32_t)r_le(r, 4);
		if (r->err)
			return r->err;
		if (vlen > MF_XATTR_VALUE_MAX)
			return -EINVAL;
		v = r_bytes(r, vlen);
		if (!v)
			return r->err;
		if (vlen) {
			x->value = malloc(vlen);
			if (!x->value)
				return -ENOMEM;
			memcpy(x->value, v, vlen);
		}
		x->value_len = vlen;
	}
	e->block_size = (uint32_t)r_le(r, 4);
	nblocks = r_le(r, 8);
	if (r->err)
		return r->err;
	if (nblocks > r_left(r) / MF_BLOCK_WIRE)
		return -EINVAL;
	if (nblocks) {
		e->blocks = calloc(nblocks, sizeof(*e->blocks));
		if (!e->blocks)
			return -ENOMEM;
		e->nblocks = nblocks;
	}
	for (uint64_t k = 0; k < e->nblocks; k++) {
		const void *h;

		e->blocks[k].flags = (uint8_t)r_le(r, 1);
		e->blocks[k].len = (uint32_t)r_le(r, 4);
		h = r_bytes(r, MF_HASH_LEN);
		if (!h)
			return r->err;
		memcpy(e->blocks[k].hash, h, MF_HASH_LEN);
	}
	return r->err;
}

int mf_check_prefix(const void *buf, size_t len, uint64_t file_size)
{
	struct rbuf r = { .p = buf, .len = len };
	uint32_t version;

	if (len < MF_PREFIX_LEN || file_size < MF_HEADER_MIN + MF_TRAILER ||
	    memcmp(buf, mf_magic, sizeof(mf_magic)))
		return -EINVAL;
	r.pos = 8;
	version = (uint32_t)r_le(&r, 4);
	(void)r_le(&r, 4);
	if (version < 1 || version > MF_VERSION_MAX || r_le(&r, 8) != file_size)
		return -EINVAL;
	return 0;
}

int mf_decode(const void *buf, size_t len, struct mf_manifest **out)
{
	struct rbuf r = { .p = buf, .len = len };
	XXH128_canonical_t sum;
	struct mf_manifest *m;
	const void *name;
	uint64_t nentries;
	uint32_t version;
	size_t nlen, entry_min;
	int rc;

	/* Length first: it makes every truncation a definite refusal, not a checksum bet. */
	if (len < MF_HEADER_MIN + MF_TRAILER || memcmp(buf, mf_magic, sizeof(mf_magic)))
		return -EINVAL;
	r.pos = 16;
	if (r_le(&r, 8) != len)
		return -EINVAL;
	XXH128_canonicalFromHash(&sum, XXH3_128bits(buf, len - MF_HASH_LEN));
	if (memcmp(sum.digest, (const unsigned char *)buf + len - MF_HASH_LEN, MF_HASH_LEN))
		return -EIO;
	r.pos = 8;
	version = (uint32_t)r_le(&r, 4);
	if (version < 1 || version > MF_VERSION_MAX)
		return -EINVAL;
	entry_min = MF_ENTRY_MIN + (version >= 2);
	r.len = len - MF_HASH_LEN;	/* the checksum is not part of the body */

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->version = version;
	m->flags = (uint32_t)r_le(&r, 4);
	(void)r_le(&r, 8);
	m->time_ns = (int64_t)r_le(&r, 8);
	nlen = r_le(&r, 2);
	name = r_bytes(&r, nlen);
	if (!name || nlen > MF_NAME_MAX || memchr(name, 0, nlen)) {
		rc = -EINVAL;
		goto fail;
	}
	memcpy(m->name, name, nlen);
	if (version >= 4)
		m->base = r_le(&r, 8);
	/* The count is checked against the bytes left before it is stored or allocated
	 * for: mf_free() walks m->nentries entries. */
	nentries = r_le(&r, 8);
	if (r.err || nentries == 0 || nentries > r_left(&r) / entry_min) {
		rc = -EINVAL;
		goto fail;
	}
	m->entries = calloc(nentries, sizeof(*m->entries));
	if (!m->entries) {
		rc = -ENOMEM;
		goto fail;
	}
	m->nentries = nentries;
	for (size_t i = 0; i < m->nentries; i++) {
		if ((rc = mf_decode_entry(&r, version, &m->entries[i])))
			goto fail;
		m->open_writes += !!(m->entries[i].flags & MF_ENTRY_OPEN_WRITE);
	}
	m->files = r_le(&r, 8);
	m->logical_bytes = r_le(&r, 8);
	m->new_bytes = r_le(&r, 8);
	if (r.err || r.pos != r.len || m->flags) {
		rc = -EINVAL;
		goto fail;
	}
	if ((rc = mf_check(m)))
		goto fail;
	*out = m;
	return 0;
fail:
	mf_free(m);
	return rc;
}

/* Frees what e owns (not e). */
static void mf_entry_release(struct mf_entry *e)
{
	free(e->name);
	free(e->target);
	for (uint32_t k = 0; k < e->nxattrs; k++) {
		free(e->xattrs[k].name);
		free(e->xattrs[k].value);
	}
	free(e->xattrs);
	free(e->blocks);
}

void mf_free(struct mf_manifest *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->nentries; i++)
		mf_entry_release(&m->entries[i]);
	free(m->entries);
	free(m);
}

int mf_path(const struct mf_manifest *m, size_t idx, char *buf, size_t size)
{
	size_t pos = size;
	long i = (long)idx;

	if (idx >= m->nentries || size == 0)
		return -EINVAL;
	/* Built back to front from the leaf; the tree rules bound the walk by the depth. */
	buf[--pos] = 0;
	while (i > 0) {
		const struct mf_entry *e = &m->entries[i];
		size_t nl = strlen(e->name);

		if (pos < nl + (pos != size - 1))
			return -ENAMETOOLONG;
		if (pos != size - 1)
			buf[--pos] = '/';
		pos -= nl;
		memcpy(buf + pos, e->name, nl);
		i = mf_find(m, e->parent);
		if (i < 0)
			return -EINVAL;
	}
	memmove(buf, buf + pos, size - pos);
	return (int)(size - pos - 1);
}

uint32_t mf_block_size(const struct mf_manifest *m)
{
	uint32_t bs = 0;

	for (uint64_t i = 0; i < m->nentries; i++) {
		const struct mf_entry *e = &m->entries[i];

		if (e->type != MF_FILE || !e->nblocks)
			continue;
		if (bs && e->block_size != bs)
			return MF_BLOCK_SIZE_MIXED;
		bs = e->block_size;
	}
	return bs;
}

uint64_t mf_id(const struct mf_manifest *m)
{
	uint64_t h = XXH3_64bits_withSeed(m->name, strnlen(m->name, sizeof(m->name)),
					  (uint64_t)m->time_ns);

	return h && h != UINT64_MAX ? h : 1; /* 0 is "no base", UINT64_MAX MF_BASE_MIXED */
}

/* ---- merge: the union of a group's parts (mf_merge) ---- */

/* The merged tree so far, and an index over (parent, name) -> entry, open addressing
 * with linear probing (slots hold index + 1, 0 empty). */
struct mf_union {
	struct mf_manifest *m;
	size_t cap;
	size_t *slot;
	size_t nslot;
	/* Paths a part held as a hard link that lost (its inode lost a conflict, or is no
	 * file in the union) before the union had them: a later part's untouched copy there
	 * is not one only untouched copies hold (mf_union_drop). The names are the
	 * parts' (borrowed for the merge). */
	struct mf_contested {
		uint64_t parent;
		const char *name;
	} *contested;
	size_t ncontested, ccap;
};

static uint64_t mf_union_key(uint64_t parent, const char *name)
{
	return XXH3_64bits_withSeed(name, strlen(name), parent);
}

static int mf_union_grow(struct mf_union *u)
{
	size_t n = u->nslot ? 2 * u->nslot : 1024, *s = calloc(n, sizeof(*s));

	if (!s)
		return -ENOMEM;
	for (size_t i = 1; i < u->m->nentries; i++) { /* the root has no name */
		const struct mf_entry *e = &u->m->entries[i];
		size_t h = mf_union_key(e->parent, e->name) & (n - 1);

		while (s[h])
			h = (h + 1) & (n - 1);
		s[h] = i + 1;
	}
	free(u->slot);
	u->slot = s;
	u->nslot = n;
	return 0;
}

/* Index of parent's child name in the union, or -1. */
static long mf_union_find(const struct mf_union *u, uint64_t parent, const char *name)
{
	size_t h = mf_union_key(parent, name) & (u->nslot - 1);

	for (; u->slot[h]; h = (h + 1) & (u->nslot - 1)) {
		const struct mf_entry *e = &u->m->entries[u->slot[h] - 1];

		if (e->parent == parent && !strcmp(e->name, name))
			return (long)(u->slot[h] - 1);
	}
	return -1;
}

/* A deep copy of e (everything it owns) into *d, with the union's id, parent, link. */
static int mf_entry_copy(struct mf_entry *d, const struct mf_entry *e)
{
	*d = *e;
	d->name = strdup(e->name);
	d->target = e->target ? strdup(e->target) : NULL;
	d->xattrs = e->nxattrs ? calloc(e->nxattrs, sizeof(*d->xattrs)) : NULL;
	d->blocks = e->nblocks ? malloc(e->nblocks * sizeof(*d->blocks)) : NULL;
	if (!d->name || (e->target && !d->target) || (e->nxattrs && !d->xattrs) ||
	    (e->nblocks && !d->blocks))
		goto fail;
	if (e->nblocks)
		memcpy(d->blocks, e->blocks, e->nblocks * sizeof(*d->blocks));
	for (uint32_t i = 0; i < e->nxattrs; i++) {
		d->xattrs[i].name = strdup(e->xattrs[i].name);
		d->xattrs[i].value_len = e->xattrs[i].value_len;
		d->xattrs[i].value = e->xattrs[i].value_len ? malloc(e->xattrs[i].value_len) : NULL;
		if (!d->xattrs[i].name || (e->xattrs[i].value_len && !d->xattrs[i].value))
			goto fail;
		if (e->xattrs[i].value_len)
			memcpy(d->xattrs[i].value, e->xattrs[i].value, e->xattrs[i].value_len);
	}
	return 0;
fail:
	for (uint32_t i = 0; d->xattrs && i < e->nxattrs; i++) {
		free(d->xattrs[i].name);
		free(d->xattrs[i].value);
	}
	free(d->xattrs);
	free(d->blocks);
	free(d->target);
	free(d->name);
	memset(d, 0, sizeof(*d));
	return -ENOMEM;
}

/* The entry holding e's content: e itself, or the target of a hard link. */
static const struct mf_entry *mf_content(const struct mf_manifest *m, const struct mf_entry *e)
{
	long t = e->link ? mf_find(m, e->link) : -1;

	return t >= 0 ? &m->entries[t] : e;
}

/* 1 if a and b hold the same thing at one path: two directories (they merge), or the
 * same type with the same bytes (files: size and every block; symlinks: target).
 * Metadata (times, mode, owner) may differ: the first part's is kept. */
static int mf_same(const struct mf_entry *a, const struct mf_entry *b)
{
	if (a->type != b->type)
		return 0;
	if (a->type == MF_DIR)
		return 1;
	if (a->type == MF_SYMLINK)
		return !strcmp(a->target, b->target);
	if (a->size != b->size || a->nblocks != b->nblocks || a->block_size != b->block_size)
		return 0;
	for (uint64_t k = 0; k < a->nblocks; k++)
		if (a->blocks[k].len != b->blocks[k].len || a->blocks[k].flags != b->blocks[k].flags ||
		    memcmp(a->blocks[k].hash, b->blocks[k].hash, MF_HASH_LEN))
			return 0;
	return 1;
}

/* What the union knows of one of its paths besides the entry: the part whose entry it
 * is, and who holds the path (for the deletions rule, mf_union_drop). */
struct mf_slot {
	unsigned owner;		/* the part whose entry is in the union */
	uint32_t inherited;	/* parts holding it MF_ENTRY_INHERITED, with a base */
	uint32_t others;	/* parts holding anything else at this path */
	uint64_t base;		/* the inherited holders' base; MF_BASE_MIXED when two differ */
	bool conflict;		/* some part's entry here lost: nothing below is dropped */
	bool linked;		/* a hard link in the union names this file */
};

#define MF_BASE_MIXED UINT64_MAX

/* Counts part p (of base `base`) as a holder of union path at, with entry e. */
static void mf_slot_hold(struct mf_slot *s, const struct mf_entry *e, uint64_t base)
{
	if (base && !e->link && (e->flags & MF_ENTRY_INHERITED)) {
		s->base = !s->inherited || s->base == base ? base : MF_BASE_MIXED;
		s->inherited++;
	} else {
		s->others++;
	}
}

/* Adds part p's entries to the union: map[i] is where p's entry i went (-1: dropped,
 * its parent lost to a conflict, or itself in conflict). */
static int mf_union_add(struct mf_union *u, const struct mf_manifest *p, unsigned pi,
			struct mf_slot **slots, long *map, mf_conflict_fn fn, void *arg,
			uint64_t *conflicts)
{
	map[0] = 0; /* roots merge */
	for (size_t i = 1; i < p->nentries; i++) {
		const struct mf_entry *e = &p->entries[i];
		long pp = mf_find(p, e->parent), at, tgt = -1;
		uint64_t parent;

		map[i] = -1;
		if (pp < 0 || map[pp] < 0)
			continue; /* under a conflict: the first part's tree stands there */
		parent = u->m->entries[map[pp]].id;
		at = mf_union_find(u, parent, e->name);
		if (at >= 0)
			mf_slot_hold(&(*slots)[at], e, p->base);
		if (e->link) {
			long t = mf_find(p, e->link);

			if (t >= 0 && map[t] >= 0) { /* the union's file for its inode */
				tgt = map[t];
				if (u->m->entries[tgt].link)
					tgt = mf_find(u->m, u->m->entries[tgt].link);
			}
			if (tgt < 0 || u->m->entries[tgt].type != MF_FILE) {
				/* its inode lost a conflict elsewhere, or its inode's path holds
				 * another part's directory or symlink in the union: a link to
				 * that is no file, so this path has no content: a conflict */
				(*conflicts)++;
				if (at >= 0) {
					(*slots)[at].conflict = true;
				} else {
					if (u->ncontested == u->ccap) {
						size_t cap = u->ccap ? 2 * u->ccap : 16;
						void *nc = realloc(u->contested,
								   cap * sizeof(*u->contested));

						if (!nc)
							return -ENOMEM;
						u->contested = nc;
						u->ccap = cap;
					}
					u->contested[u->ncontested++] =
						(struct mf_contested){ parent, e->name };
				}
				if (fn)
					fn(arg, p, i, at >= 0 ? (*slots)[at].owner : MF_PART_NONE,
					   pi);
				continue;
			}
		}
		if (at >= 0) {
			struct mf_entry *slot = &u->m->entries[at];
			const struct mf_entry *have = mf_content(u->m, slot), *mine = mf_content(p, e);

			/* (an untouched directory is the same as another part's directory,
			 * but never yields to a file or symlink: what it holds would land
			 * below a non-directory, and its new files would vanish unreported) */
			if (mf_same(have, mine) ||
			    (mine->flags & MF_ENTRY_INHERITED && mine->type != MF_DIR &&
			     !(have->flags & MF_ENTRY_INHERITED))) {
				map[i] = at; /* the same, or ours is an untouched copy */
				continue;
			}
			if ((have->flags & MF_ENTRY_INHERITED) && !(mine->flags & MF_ENTRY_INHERITED) &&
			    !slot->link && !e->link && slot->type != MF_DIR &&
			    (mine->type == MF_FILE || !(*slots)[at].linked)) {
				/* an untouched file or symlink in the union, rewritten
				 * by this part (a symlink by another target: symlink(2)
				 * makes a new one, never in place), or replaced by one of
				 * another type (which the copy would yield to, came this
				 * part first): the rewrite stands (its id, parent and name
				 * stay; links to it see the new content, as links to one
				 * inode do; a file a link names stays a file; no link
				 * names a symlink) */
				struct mf_entry d;

				if (mf_entry_copy(&d, e))
					return -ENOMEM;
				d.id = slot->id;
				d.parent = slot->parent;
				d.link = 0;
				mf_entry_release(slot);
				*slot = d;
				(*slots)[at].owner = pi;
				map[i] = at;
				continue;
			}
			(*conflicts)++;
			(*slots)[at].conflict = true;
			if (fn)
				fn(arg, p, i, (*slots)[at].owner, pi);
			continue;
		}
		/* A new path: append (parent first, ids increase: the tree rules hold). */
		if (u->m->nentries == u->cap) {
			size_t cap = 2 * u->cap;
			void *ne = realloc(u->m->entries, cap * sizeof(*u->m->entries));
			void *ns = ne ? realloc(*slots, cap * sizeof(**slots)) : NULL;

			if (ne)
				u->m->entries = ne;
			if (!ns)
				return -ENOMEM;
			*slots = ns;
			u->cap = cap;
		}
		if (2 * (u->m->nentries + 1) > u->nslot && mf_union_grow(u))
			return -ENOMEM;
		struct mf_entry *d = &u->m->entries[u->m->nentries];

		if (mf_entry_copy(d, e))
			return -ENOMEM;
		d->id = u->m->nentries + 1;
		d->parent = parent;
		d->link = tgt >= 0 ? u->m->entries[tgt].id : 0;
		(*slots)[u->m->nentries] = (struct mf_slot){ .owner = pi };
		if (tgt >= 0)
			(*slots)[tgt].linked = true;
		mf_slot_hold(&(*slots)[u->m->nentries], e, p->base);
		size_t h = mf_union_key(d->parent, d->name) & (u->nslot - 1);

		while (u->slot[h])
			h = (h + 1) & (u->nslot - 1);
		u->slot[h] = u->m->nentries + 1;
		map[i] = (long)u->m->nentries++;
	}
	return 0;
}

/* Parts of the group with base b (nonzero): those that each started from the same
 * restored tree. */
static uint32_t mf_parts_of_base(struct mf_manifest *const *parts, size_t n, uint64_t b)
{
	uint32_t k = 0;

	for (size_t i = 0; i < n; i++)
		k += parts[i]->base == b;
	return k;
}

/*
 * The deletions rule (mf_merge): a path whose holders all hold it INHERITED of one base,
 * fewer than the parts of that base, was removed by a worker that started from the same
 * tree, and leaves the union. Walked backwards (children have larger indexes than their
 * parent, links than their target), so a directory is judged after everything below
 * it and a file after every link to it; then the survivors are compacted in order and
 * renumbered (the tree rules hold: parents and link targets keep coming first). In
 * the union an entry's id is its index + 1 (mf_union_add appends so, and a rewrite
 * keeps the slot's id), so parents and targets are found by id - 1.
 * Returns how many entries left, or -ENOMEM.
 */
static long mf_union_drop(struct mf_union *u, const struct mf_slot *slots,
			  struct mf_manifest *const *parts, size_t n)
{
	struct mf_manifest *m = u->m;
	uint64_t *newid = calloc(m->nentries, sizeof(*newid));
	uint32_t *kept_below = calloc(m->nentries, sizeof(*kept_below));
	bool *guarded = calloc(m->nentries, sizeof(*guarded));
	size_t i, w;
	long dropped = 0;

	if (!newid || !kept_below || !guarded) {
		dropped = -ENOMEM;
		goto out;
	}
	/* Forwards first: a path below a conflict is guarded (the parts disagree there). */
	for (i = 1; i < m->nentries; i++)
		guarded[i] = slots[i].conflict || guarded[m->entries[i].parent - 1];
	for (i = m->nentries - 1; i > 0; i--) {
		const struct mf_entry *e = &m->entries[i];
		const struct mf_slot *s = &slots[i];
		/* (MF_BASE_MIXED is no part's base: such a path is kept) */
		bool drop = !guarded[i] && !s->others && s->inherited && !kept_below[i] &&
			    s->inherited < mf_parts_of_base(parts, n, s->base);

		if (drop) {
			newid[i] = 0;
			dropped++;
			continue;
		}
		newid[i] = 1; /* kept: numbered below */
		kept_below[e->parent - 1]++;
		if (e->link)
			kept_below[e->link - 1]++; /* a link kept keeps its target */
	}
	if (!dropped)
		goto out;
	newid[0] = 1;
	for (i = 0, w = 0; i < m->nentries; i++) {
		struct mf_entry *e = &m->entries[i];

		if (!newid[i]) {
			mf_entry_release(e);
			continue;
		}
		newid[i] = w + 1;
		if (i) /* their old ids: parents and targets, numbered already */
			e->parent = newid[e->parent - 1];
		if (e->link)
			e->link = newid[e->link - 1];
		e->id = w + 1;
		m->entries[w++] = *e;
	}
	m->nentries = w;
out:
	free(newid);
	free(kept_below);
	free(guarded);
	return dropped;
}

int mf_merge(struct mf_manifest *const *parts, size_t n, mf_conflict_fn fn, void *arg,
	     struct mf_manifest **out, uint64_t *conflicts)
{
	struct mf_union u = { 0 };
	struct mf_slot *slots = NULL;
	long *map = NULL;
	int rc = -ENOMEM;

	*conflicts = 0;
	if (!n)
		return -EINVAL;
	u.m = calloc(1, sizeof(*u.m));
	u.cap = 64;
	if (!u.m || !(u.m->entries = calloc(u.cap, sizeof(*u.m->entries))) ||
	    !(slots = calloc(u.cap, sizeof(*slots))))
		goto out;
	snprintf(u.m->name, sizeof(u.m->name), "%s", parts[0]->name);
	u.m->version = MF_VERSION;
	if ((rc = mf_entry_copy(&u.m->entries[0], &parts[0]->entries[0])))
		goto out;
	u.m->nentries = 1;
	if ((rc = mf_union_grow(&u)))
		goto out;
	for (size_t k = 0; k < n; k++) {
		long *nm = realloc(map, (parts[k]->nentries ? parts[k]->nentries : 1) * sizeof(*map));

		rc = -ENOMEM;
		if (!nm)
			goto out;
		map = nm;
		if (parts[k]->time_ns > u.m->time_ns)
			u.m->time_ns = parts[k]->time_ns;
		u.m->new_bytes += parts[k]->new_bytes;
		if ((rc = mf_union_add(&u, parts[k], (unsigned)k, &slots, map, fn, arg, conflicts)))
			goto out;
	}
	for (size_t k = 0; k < u.ncontested; k++) {
		long at = mf_union_find(&u, u.contested[k].parent, u.contested[k].name);

		if (at >= 0)
			slots[at].conflict = true; /* as if the link had come after it */
	}
	if ((rc = (int)mf_union_drop(&u, slots, parts, n)) < 0)
		goto out;
	/* The summary of the union: files (links once), bytes, open files. Its entries
	 * are nobody's inherited copies: the flag is the parts' business. */
	for (size_t i = 0; i < u.m->nentries; i++) {
		struct mf_entry *e = &u.m->entries[i];

		e->flags &= (uint8_t)~MF_ENTRY_INHERITED;

		if (e->type != MF_FILE || e->link)
			continue;
		u.m->files++;
		u.m->logical_bytes += e->size;
		u.m->open_writes += !!(e->flags & MF_ENTRY_OPEN_WRITE);
	}
	*out = u.m;
	u.m = NULL;
	rc = 0;
out:
	mf_free(u.m);
	free(u.slot);
	free(u.contested);
	free(slots);
	free(map);
	return rc;
}
