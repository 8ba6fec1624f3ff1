/*
 * seedgen.c - writes the fuzzing seeds (tests/fuzz/seeds/<target>/) with mlfs's own
 * encoder: `make fuzz-seeds` (the seeds are committed; rerun after a format change).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs/manifest.h"

static struct mf_entry *add(struct mf_manifest *m, uint64_t parent, const char *name, int type)
{
	struct mf_entry *e;

	m->entries = realloc(m->entries, (m->nentries + 1) * sizeof(*e));
	e = &m->entries[m->nentries];
	memset(e, 0, sizeof(*e));
	e->id = ++m->nentries;
	e->parent = parent;
	e->name = strdup(name);
	e->type = (uint8_t)type;
	e->mode = type == MF_DIR ? 0755 : type == MF_SYMLINK ? 0777 : 0644;
	e->uid = 1000;
	e->gid = 100;
	e->mtime_ns = 1763700000000000000LL;
	return e;
}

static void blocks(struct mf_entry *e, uint64_t size, uint32_t bs, int hole)
{
	e->size = size;
	e->block_size = bs;
	e->nblocks = size / bs + (size % bs != 0);
	e->blocks = calloc(e->nblocks ? e->nblocks : 1, sizeof(*e->blocks));
	for (uint64_t i = 0; i < e->nblocks; i++) {
		e->blocks[i].len = i + 1 < e->nblocks ? bs : (uint32_t)(size - i * bs);
		if (hole && i == 1)
			e->blocks[i].flags = MF_BLOCK_HOLE;
		else
			for (int k = 0; k < MF_HASH_LEN; k++)
				e->blocks[i].hash[k] = (uint8_t)(i * 7 + k);
	}
}

static void xattr(struct mf_entry *e, const char *name, const char *value)
{
	e->xattrs = realloc(e->xattrs, (e->nxattrs + 1) * sizeof(*e->xattrs));
	e->xattrs[e->nxattrs].name = strdup(name);
	e->xattrs[e->nxattrs].value_len = (uint32_t)strlen(value);
	e->xattrs[e->nxattrs].value = *value ? strdup(value) : NULL;
	e->nxattrs++;
}

static int emit(struct mf_manifest *m, const char *dir, const char *file)
{
	char path[512];
	void *buf;
	size_t len;
	FILE *f;
	int rc = mf_encode(m, &buf, &len);

	if (rc) {
		fprintf(stderr, "seedgen: %s: encode: %d\n", file, rc);
		return 1;
	}
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
		perror(path);
		return 1;
	}
	free(buf);
	mf_free(m);
	return 0;
}

static struct mf_manifest *new_manifest(const char *name, uint32_t version)
{
	struct mf_manifest *m = calloc(1, sizeof(*m));

	snprintf(m->name, sizeof(m->name), "%s", name);
	m->version = version;
	m->time_ns = 1763700000123456789LL;
	add(m, 0, "", MF_DIR);
	return m;
}

static int manifests(const char *dir)
{
	struct mf_manifest *m;
	struct mf_entry *e;
	int bad = 0;

	bad |= emit(new_manifest("empty", 0), dir, "empty");
	bad |= emit(new_manifest("empty-v1", 1), dir, "empty-v1");
	for (uint32_t v = 1; v <= MF_VERSION; v++) {
		m = new_manifest(v == 1 ? "tree-v1" : "tree", v);
		e = add(m, 1, "model.pt", MF_FILE);
		blocks(e, 3 * 4096 + 17, 4096, 1);
		xattr(e, "user.step", "1000");
		xattr(e, "user.empty", "");
		if (v >= 2)
			e->flags = MF_ENTRY_OPEN_WRITE;
		e = add(m, 1, "sub", MF_DIR);
		xattr(e, "user.d", "x");
		add(m, 3, "empty", MF_FILE)->block_size = 4096;
		add(m, 3, "link", MF_FILE)->link = 2;
		e = add(m, 3, "sym", MF_SYMLINK);
		e->target = strdup("../model.pt");
		e->size = strlen(e->target);
		m->files = 2;
		m->logical_bytes = 3 * 4096 + 17;
		m->new_bytes = 2 * 4096;
		bad |= emit(m, dir, v == 1 ? "tree-v1" : "tree");
	}
	/* A worker's part after a group restore (version 4): a base, INHERITED on a file
	 * and on the directory above it. */
	m = new_manifest("part", 0);
	m->base = 0x5eed;
	e = add(m, 1, "ckpt", MF_DIR);
	e->flags = MF_ENTRY_INHERITED;
	e = add(m, 2, "shard-0", MF_FILE);
	blocks(e, 4096 + 5, 4096, 0);
	e->flags = MF_ENTRY_INHERITED;
	add(m, 2, "shard-1", MF_FILE)->block_size = 4096;
	bad |= emit(m, dir, "part-v4");
	/* Version 5: the same with an INHERITED symlink beside the file, and one not. */
	m = new_manifest("part", 0);
	m->base = 0x5eed;
	e = add(m, 1, "ckpt", MF_DIR);
	e->flags = MF_ENTRY_INHERITED;
	e = add(m, 2, "shard-0", MF_FILE);
	blocks(e, 4096 + 5, 4096, 0);
	e->flags = MF_ENTRY_INHERITED;
	e = add(m, 2, "latest", MF_SYMLINK);
	e->target = strdup("shard-0");
	e->size = strlen(e->target);
	e->flags = MF_ENTRY_INHERITED;
	e = add(m, 1, "new", MF_SYMLINK);
	e->target = strdup("ckpt/latest");
	e->size = strlen(e->target);
	bad |= emit(m, dir, "part-v5");
	m = new_manifest("deep", 0);
	for (int i = 0; i < 40; i++)
		add(m, (uint64_t)i + 1, "d", MF_DIR);
	bad |= emit(m, dir, "deep");
	return bad;
}

static int ctl(const char *dir)
{
	static const char *const reqs[][2] = {
		{ "take", "snap-take\tstep-1000\t--wait\n" },
		{ "list", "snap-list\n" },
		{ "restore", "snap-restore\tlatest\n" },
		{ "delete", "snap-delete\tstep-1000\n" },
		{ "gc", "snap-gc\n" },
		{ "advise", "snap-advise\n" },
		{ "stats", "stats\tjson\n" },
		{ "trailing", "snap-list\nsnap-gc\n" },
	};
	char path[512];
	int bad = 0;

	for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
		FILE *f;

		snprintf(path, sizeof(path), "%s/%s", dir, reqs[i][0]);
		f = fopen(path, "wb");
		if (!f || fputs(reqs[i][1], f) < 0 || fclose(f)) {
			perror(path);
			bad = 1;
		}
	}
	return bad;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: seedgen MANIFEST_DIR CTL_DIR\n");
		return 2;
	}
	return manifests(argv[1]) | ctl(argv[2]);
}
