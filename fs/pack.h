/*
 * pack.h - pack_: objects packed into large files (STORE/packs/<id>.pack) and the index
 * that finds them.
 *
 * Contract: a persist writes its new objects into a few large packs, each created,
 * written and fsynced once (then renamed into place), instead of one file per 1 MiB
 * object with its own create, rename and directory fsync: a store on a shared filesystem
 * then runs near the filesystem's sequential speed. A pack carries its own index at its
 * end (hash -> offset, lengths, flags), checksummed; the in-memory index (struct
 * pack_set) is the union of the packs' indexes, learnt by pack_set_scan().
 * Byte layout: docs/store-format.md. Invariants (fs/store.c): a file named <id>.pack is
 * complete, durable and never changes (invariant 1); an id is 128 random bits, so two
 * writers on two hosts never share a name (create-once with O_EXCL all the same).
 *
 * Reads (pack_set_get) verify everything: the record's header checksum, that it names
 * the hash asked for and the lengths the index gives, the payload's decoding and the
 * XXH3-128 of the result; any failure is -EIO with a log line naming the pack, offset
 * and object. An object not in the index, or whose pack went away (a gc repacked it), is
 * looked up again after one rescan, then in a killed gc's trash (<id>.pack.gc.*) before
 * -ENOENT. Pack descriptors stay open (up to
 * PACK_FDS_MAX), so the kernel's readahead on a pack follows a restore's sequential
 * reads.
 *
 * Thread safety: a pack_set may be shared by threads (own mutex, a leaf held across
 * open(2) and close(2) of a pack, never across reads: fs/pack.c states its order). A
 * writer (struct pack_writer) belongs to one thread at a time (the store's pmu).
 * Blocking: file I/O on the store.
 */
#ifndef MLFS_PACK_H
#define MLFS_PACK_H

#include <stddef.h>
#include <stdint.h>

#define PACK_REC_HDR 40			/* an object record's header (as a version 1 object's) */
#define PACK_TARGET (128ull << 20)	/* a pack is finished once it holds this much */
#define PACK_MERGE_BELOW (16ull << 20)	/* gc merges mostly-live packs smaller than this */
#define PACK_FDS_MAX 256		/* pack descriptors kept open for reads */

/* Object record header: magic "MLOB", version 1, flags (0 raw, 1 lz4), pad, logical and
 * stored length, hash, XXH3-64 of the first 32 bytes. */
void pack_rec_header(uint8_t hdr[PACK_REC_HDR], const uint8_t hash[16], uint32_t logical,
		     uint32_t stored, int lz4);
/* NULL if hdr is a valid header of the object named hash as its index entry describes
 * it (stored and logical lengths, flags); else why not. A record that decodes but
 * contradicts its entry is damage too: gc copies it under the entry's lengths and flags. */
const char *pack_rec_bad(const uint8_t hdr[PACK_REC_HDR], const uint8_t hash[16], uint64_t stored,
			 uint32_t logical, unsigned flags);
/* Decode a record's payload (already read; hdr checked by pack_rec_bad) into buf[len] and
 * check its hash: the logical length, or NULL-free -EIO with *why set. */
int pack_rec_decode(const uint8_t hdr[PACK_REC_HDR], const void *payload, void *buf, uint32_t len,
		    const uint8_t hash[16], const char **why);

/* 0 and the number of objects in *n if fd holds a whole pack whose index verifies (the
 * checks of a scan), else -EINVAL, or the read's -errno. For the fuzz target. */
int pack_check_fd(int fd, size_t *n);

struct pack_set;

/* packdir: an open STORE/packs (borrowed, outlives ps); store_path for log lines. */
int pack_set_new(int packdir, const char *store_path, struct pack_set **out);
void pack_set_free(struct pack_set *ps);

/* Learn packs made since the last scan (reading their indexes) and forget packs that
 * are gone. A pack whose index does not verify is logged once and ignored (its objects
 * are missing, never wrong). Lists packs/: O(packs) plus the new packs' index bytes. */
int pack_set_scan(struct pack_set *ps);

/* 1 if hash is in a known pack (no I/O; the index as of the last scan). */
int pack_set_has(struct pack_set *ps, const uint8_t hash[16]);

/* Store-relative path of the pack holding hash ("packs/<id>.pack") into buf[64] and the
 * record's offset; -ENOENT if no known pack has it. For tests and log lines. */
int pack_set_where(struct pack_set *ps, const uint8_t hash[16], char buf[64], uint64_t *off);

/* 1, the id of the known pack holding hash (its first copy) as 16 bytes, the bytes of
 * its record there (*bytes) and that pack's size (*pack_bytes), else 0. A lease names a
 * pack by this id (the shape of an object hash) when it needs at least half of its
 * bytes: gc keeps the whole pack. */
int pack_set_pack_of(struct pack_set *ps, const uint8_t hash[16], uint8_t id[16],
		     uint64_t *bytes, uint64_t *pack_bytes);

/* Distinct objects in known packs. */
uint64_t pack_set_count(struct pack_set *ps);

/* Read and verify the object named hash into buf[len]: its logical length, -ENOENT,
 * -EIO (logged), or the read's -errno. When the copy the index names is damaged, each
 * other copy in the packs is tried (two writers stored the object at once); one in no
 * pack is looked for in a killed gc's trash (logged when found there). */
int pack_set_get(struct pack_set *ps, const uint8_t hash[16], void *buf, uint32_t len);

struct pack_writer;

/*
 * Append one object to *w, opening a new pack (packs/.tmp.<id>, O_EXCL) if *w is NULL,
 * and finishing it (pack_writer_finish) once it holds PACK_TARGET bytes. A failed write
 * truncates the pack back to its last whole record: earlier objects stay.
 */
int pack_writer_add(struct pack_set *ps, struct pack_writer **w, const uint8_t hash[16],
		    uint32_t logical, int lz4, const void *payload, uint32_t stored);
/* Write the pack's index, fsync it, rename it to packs/<id>.pack, fsync packs/ and add
 * it to ps. *w is NULL afterwards either way; on error the temporary is removed. -EIO
 * from the directory fsync means what reached the disk is unknown (invariant 6). */
int pack_writer_finish(struct pack_set *ps, struct pack_writer **w);
/* The id of the pack w writes (128 bits, the shape of an object hash: a lease names it
 * among its objects, so gc leaves the temporary of a live writer alone). 0 if w is
 * NULL, else 1. */
int pack_writer_id(const struct pack_writer *w, uint8_t id[16]);
/* How many records w holds (0 for NULL): whether pack_writer_finish will publish it
 * (and so fsync packs/ after the rename) or drop it. */
size_t pack_writer_count(const struct pack_writer *w);
/* Drop *w and its temporary file. NULL is fine. */
void pack_writer_abort(struct pack_set *ps, struct pack_writer **w);

/* gc over packs, in two phases (fs/store.c invariant 3). */
struct pack_gc;
typedef int (*pack_live_fn)(void *arg, const uint8_t hash[16]);	/* 1 live, 0 not */

/*
 * Phase 1: put back other gcs' trash holding a live object no pack holds (any age);
 * remove temporaries and the rest of the trash older than grace_ns at now_ns (the store
 * filesystem's clock); then for every pack older than grace_ns: no live object ->
 * renamed to <id>.pack.gc.<token>; live objects under half its object bytes -> copied
 * (verified) into a new pack, which is made durable, then the old pack is renamed the
 * same way; two or more mostly-live packs smaller than PACK_MERGE_BELOW -> merged the
 * same way (up to PACK_TARGET bytes of them a run). *out (handed over to
 * pack_gc_settle) lists the renamed packs.
 */
int pack_gc_sweep(struct pack_set *ps, pack_live_fn live, void *arg, int64_t now_ns,
		  int64_t grace_ns, const char *token, struct pack_gc **out, uint64_t *freed);
/* Packs g renamed in phase 1 (0: phase 2 needs no second mark). */
size_t pack_gc_trashed(const struct pack_gc *g);
/*
 * Phase 2: a renamed pack holding an object live2 says is live and no other pack holds
 * is put back; the others are removed. live2 NULL: put every one back. Frees g. Counts
 * the removed objects and bytes into *objs, *bytes.
 */
int pack_gc_settle(struct pack_set *ps, struct pack_gc *g, pack_live_fn live2, void *arg,
		   uint64_t *objs, uint64_t *bytes);

#endif
