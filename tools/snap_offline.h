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
#include <stdio.h>

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

/*
 * Printing names and paths. A name in an older store, a file name in a snapshot or a
 * line from the daemon may hold any byte but '/' and NUL; the tools print none raw:
 * - SNAP_ESC_TTY, for people: backslash, newline, tab and carriage return as \\ \n \t
 *   \r, other C0 controls, DEL, the C1 controls (U+0080..U+009F, bytes C2 80..9F) and
 *   each byte that is not part of valid UTF-8 as \xNN. Other UTF-8 goes through.
 * - SNAP_ESC_JSON, inside a JSON string: '"' and '\\' escaped, \b \f \n \r \t short,
 *   other C0, DEL and C1 controls as \u00XX, and each byte that is not part of valid
 *   UTF-8 as \ufffd (the output stays UTF-8, as JSON must be; the name is lost: the
 *   table form shows its bytes).
 * snap_escape writes the escaped str into out (size bytes, always NUL-terminated, cut
 * between two characters if it does not fit) and returns its length; 4 bytes per byte
 * of str (6 for JSON) always fit.
 */
enum snap_esc { SNAP_ESC_TTY, SNAP_ESC_JSON };
size_t snap_escape(char *out, size_t size, const char *str, enum snap_esc how);
void snap_put_escaped(FILE *f, const char *str, enum snap_esc how);

/* 0 if name may name a snapshot (store_name_valid); taking: a new one, which must also
 * be valid UTF-8 without C1 controls (names an older mlfs took may hold them, so
 * restore, delete and verify take them). -EINVAL if not. */
int snap_name_ok(const char *name, int taking);
/* Says on stderr, in one line, that name is invalid and what a name is. */
void snap_say_bad_name(const char *name);

/* The usage lines of the offline subcommands, for mlfs-snap's help. */
extern const char snap_offline_usage[];

#endif
