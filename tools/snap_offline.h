/*
 * snap_offline.h - the subcommands of mlfs-snap that work on a store without a daemon.
 *
 *   list    --store DIR [--json]
 *   restore --store DIR NAME|latest --to DIR
 *   verify  --store DIR [NAME]
 *   gc      --store DIR
 *   delete  --store DIR NAME
 *   init    --store DIR     (make the store; N at once on one empty dir all succeed)
 *
 * Contract: each function prints its result on stdout and any error as one line
 * "mlfs-snap: ..." on stderr (the store library may add "mlfs[pid]: error: ..." lines
 * naming damaged files), and returns the process exit status: 0 success, 1 failure or
 * damage found, 2 bad usage. Bad input (missing name, not a store, damaged manifest,
 * occupied --to) is refused before anything is changed.
 * Thread safety: meant for a process's main thread; they keep no global state.
 * Blocking: file I/O on the store and the restore target, for as long as it takes.
 *
 * restore writes the tree into a hidden sibling of --to and renames it into place only
 * when every block verified and everything is flushed (syncfs), so a --to that exists
 * after a restore is complete. On damage it leaves the partial tree (damaged files left
 * out) under the sibling's name and says where.
 */
#ifndef MLFS_SNAP_OFFLINE_H
#define MLFS_SNAP_OFFLINE_H

#include <stddef.h>

/*
 * 1 if argv (argv[0] = the subcommand) asks for an offline subcommand, i.e. names one
 * of the six above and carries --store: mlfs-snap then calls snap_offline_main().
 */
int snap_offline_wants(int argc, char **argv);

/* Parse argv (argv[0] = the subcommand) and run it; returns the exit status. */
int snap_offline_main(int argc, char **argv);

/* The subcommands themselves, for callers that parsed their own arguments. */
int snap_list(const char *store_dir, int json);
int snap_restore(const char *store_dir, const char *name, const char *to);
int snap_verify(const char *store_dir, const char *name);
int snap_gc(const char *store_dir);
int snap_delete(const char *store_dir, const char *name);
int snap_init(const char *store_dir);

/* Prints snapshots as `list` does (a table, or JSON with --json). states[i] names the
 * state of v[i] ("durable", "pending", "damaged", ...); NULL: from v[i].state. */
struct store_snap_info;
void snap_print_list(const struct store_snap_info *v, const char *const *states, size_t n,
		     int json);

/* The usage lines of the offline subcommands, for mlfs-snap's help. */
extern const char snap_offline_usage[];

#endif
