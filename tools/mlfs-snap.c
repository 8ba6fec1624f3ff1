/*
 * mlfs-snap - snapshots of MOUNT/ckpt.
 *
 * With --store DIR the store is used directly, no daemon needed (snap_offline.c).
 * Otherwise the first argument after the subcommand is a mount point, and the command
 * goes to that mount's daemon over its control socket (fs/ctl.h), which checks that
 * the caller is root or the user who mounted.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs/ctl.h"
#include "fs/store.h"
#include "tools/snap_offline.h"

static const char usage_text[] =
	"usage: mlfs-snap take MOUNT NAME [--wait | --group-wait [--timeout SECONDS]]\n"
	"       mlfs-snap list MOUNT [--json] [--timeout SECONDS]\n"
	"       mlfs-snap restore MOUNT NAME|latest [--timeout SECONDS]\n"
	"       mlfs-snap delete MOUNT NAME [--timeout SECONDS]\n"
	"       mlfs-snap advise MOUNT\n"
	"       mlfs-snap gc MOUNT [--timeout SECONDS]\n";

static void usage(FILE *f)
{
	fputs(usage_text, f);
	fputs(snap_offline_usage, f);
	fputs("--timeout (list, restore, delete, gc through MOUNT): how long the daemon waits "
	      "for its store; default 60 s, gc 600 s\n", f);
}

struct list_rows {
	struct store_snap_info *v;
	const char **states;
	size_t n, cap;
};

/* "snap NAME TIME_NS FILES LOGICAL NEW STATE [OPEN_WRITES [WORKERS PARTS CONFLICTS]]",
 * tab separated (fs/snapd.c ctl_list; an older daemon sends fewer). */
static void collect_row(void *arg, const char *line)
{
	struct list_rows *r = arg;
	struct store_snap_info *x;
	char state[32];

	if (strncmp(line, "snap\t", 5))
		return;
	if (r->n == r->cap) {
		size_t cap = r->cap ? 2 * r->cap : 16;
		void *v = realloc(r->v, cap * sizeof(*r->v));
		void *st = v ? realloc(r->states, cap * sizeof(*r->states)) : NULL;

		if (v)
			r->v = v;
		if (!st)
			return;
		r->states = st;
		r->cap = cap;
	}
	x = &r->v[r->n];
	memset(x, 0, sizeof(*x));
	const char *p = line + 5, *tab = strchr(p, '\t');

	if (!tab || (size_t)(tab - p) > MF_NAME_MAX)
		return;
	memcpy(x->name, p, tab - p);
	x->workers = x->parts = 1;
	if (sscanf(tab + 1, "%" SCNd64 "\t%" SCNu64 "\t%" SCNu64 "\t%" SCNu64 "\t%31s\t%" SCNu64
		   "\t%" SCNu32 "\t%" SCNu32 "\t%" SCNu64 "\t%" SCNu32, &x->time_ns, &x->files,
		   &x->logical_bytes, &x->new_bytes, state, &x->open_writes, &x->workers,
		   &x->parts, &x->conflicts, &x->block_size) < 5)
		return;
	r->states[r->n] = strdup(state);
	if (r->states[r->n])
		r->n++;
}

/* Daemon lines are escaped (snap_escape): they may hold names an older mlfs took with
 * control characters or bytes that are not UTF-8. */
static void print_line(void *arg, const char *line)
{
	/* Progress lines ("progress ...") only make sense on a terminal. */
	if (!strncmp(line, "progress ", 9)) {
		if (isatty(STDERR_FILENO)) {
			fputc('\r', stderr);
			snap_put_escaped(stderr, line + 9, SNAP_ESC_TTY);
			fputs("\033[K", stderr);
		}
		return;
	}
	snap_put_escaped(stdout, line, SNAP_ESC_TTY);
	putchar('\n');
	/* Streamed as the daemon sends them: a script logging `take --wait` to a file sees
	 * "taken NAME" once the freeze is done, not when the persist ends. */
	fflush(stdout);
}

/* 1 if mnt's daemon knows no snapshot command at all: mounted without -o store=. Asks
 * for a listing with a short --timeout (a daemon with a store answers whatever its
 * store does; only one without snapd says the command is unknown). */
static int has_no_store(const char *mnt)
{
	const char *argv[3] = { "snap-list", "--timeout", "1" };
	int fd = ctl_connect(mnt), rc;

	if (fd < 0)
		return 0;
	rc = ctl_call(fd, 3, argv, NULL, NULL, NULL, 0);
	close(fd);
	return rc == -EOPNOTSUPP;
}

/* Sends argv (the subcommand and its arguments, mount point removed) to mnt's daemon;
 * out() gets each output line. */
static int online(const char *mnt, int argc, const char **argv,
		  void (*out)(void *arg, const char *line), void *arg)
{
	char msg[512] = "";
	int fd = ctl_connect(mnt), rc;

	if (fd < 0) {
		ctl_connect_error("mlfs-snap", mnt, fd);
		return 1;
	}
	rc = ctl_call(fd, argc, argv, out, arg, msg, sizeof(msg));
	close(fd);
	if (isatty(STDERR_FILENO))
		fprintf(stderr, "\r\033[K");
	if (rc == -ETIMEDOUT && !msg[0]) {
		ctl_connect_error("mlfs-snap", mnt, rc); /* the request was never taken */
		return 1;
	}
	if (rc == -ECONNRESET && !msg[0]) { /* no answer, ever: the daemon died */
		fprintf(stderr, "mlfs-snap: the daemon of %s went away before it answered%s\n",
			mnt, !strcmp(argv[0], "snap-take") ? ": the snapshot is durable only if "
			"list --store shows it so" : "");
		return 1;
	}
	if (rc == -EOPNOTSUPP && !strncmp(msg, "unknown command", 15)) {
		if (!strcmp(argv[0], "snap-list") || has_no_store(mnt))
			fprintf(stderr, "mlfs-snap: %s has no snapshot store: it was mounted "
				"without -o store=DIR\n", mnt);
		else
			fprintf(stderr, "mlfs-snap: the daemon of %s does not know '%s' (an older "
				"mlfs?)\n", mnt, argv[0] + 5);
		return 1;
	}
	if (rc) {
		fputs("mlfs-snap: ", stderr);
		snap_put_escaped(stderr, msg[0] ? msg : strerror(-rc), SNAP_ESC_TTY);
		fputc('\n', stderr);
		return 1;
	}
	return 0;
}

/* One line on stderr (fmt has one %s, for arg); returns the exit status of bad usage. */
static int bad_usage(const char *fmt, const char *arg)
{
	fputs("mlfs-snap: ", stderr);
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	return 2;
}

/* Checks, before anything is sent, what the daemon would refuse anyway: the subcommand,
 * --store where it has no meaning, extra arguments to advise, and snapshot names
 * (snap_name_ok: a new name must be UTF-8 without controls), and arguments the control
 * protocol cannot carry (a tab or newline). 0, or the exit status 2 after saying why. */
static int check_online(int argc, char **argv)
{
	static const char *const cmds[] = { "take", "list", "restore", "delete", "advise",
					    "gc" };
	const char *cmd = argv[1];
	size_t k;
	int i;

	for (k = 0; k < sizeof(cmds) / sizeof(cmds[0]); k++)
		if (!strcmp(cmd, cmds[k]))
			break;
	if (!strcmp(cmd, "verify") || !strcmp(cmd, "init"))
		return bad_usage("%s works on a store, not a mount: give it --store DIR", cmd);
	if (k == sizeof(cmds) / sizeof(cmds[0]))
		return bad_usage("unknown subcommand '%s'", cmd);
	for (i = 2; i < argc; i++)
		if (!strcmp(argv[i], "--store") || !strncmp(argv[i], "--store=", 8))
			return bad_usage("%s has no --store form: it needs the daemon of a MOUNT",
					 cmd);
	if (argc < 3 || argc - 1 > CTL_MAX_ARGS) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(cmd, "advise") && argc > 3)
		return bad_usage("advise takes nothing after MOUNT, not '%s'", argv[3]);
	/* The name: the argument after MOUNT, or after a "--" there (which ends the
	 * options: a name an older mlfs let begin with '-'). */
	const char *name = argc > 4 && !strcmp(argv[3], "--") ? argv[4] :
			   argc > 3 && argv[3][0] != '-' ? argv[3] : NULL;

	if (name && !(!strcmp(cmd, "restore") && !strcmp(name, "latest")) &&
	    (!strcmp(cmd, "take") || !strcmp(cmd, "restore") || !strcmp(cmd, "delete")) &&
	    snap_name_ok(name, !strcmp(cmd, "take"))) {
		snap_say_bad_name(name);
		return 2;
	}
	if (name && !strcmp(cmd, "take") &&
	    !strncmp(name, STORE_AUTO_PREFIX, strlen(STORE_AUTO_PREFIX)))
		return bad_usage("names beginning with '%s' are autosnap's, which keep= deletes; "
				 "choose another", STORE_AUTO_PREFIX);
	for (i = 3; i < argc; i++)
		if (strpbrk(argv[i], "\t\n"))
			return bad_usage("%s", "an argument holds a tab or a newline, which no "
					 "subcommand takes");
	return 0;
}

int main(int argc, char **argv)
{
	const char *args[CTL_MAX_ARGS];
	int i, n = 0;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(stdout);
		/* A write that failed (a full disk) is no success. */
		return fflush(stdout) || ferror(stdout) ? 1 : 0;
	}
	if (snap_offline_wants(argc - 1, argv + 1))
		return snap_offline_main(argc - 1, argv + 1);
	if ((i = check_online(argc, argv)))
		return i;
	/* "snap-<cmd>" then the arguments after the mount point. */
	static char cmd[64];
	int json = 0, rc;

	snprintf(cmd, sizeof(cmd), "snap-%s", argv[1]);
	args[n++] = cmd;
	for (i = 3; i < argc; i++) {
		if (!strcmp(argv[1], "list") && !strcmp(argv[i], "--json"))
			json = 1;
		else
			args[n++] = argv[i];
	}
	if (strcmp(argv[1], "list"))
		return online(argv[2], n, args, print_line, NULL);

	struct list_rows rows = { 0 };

	rc = online(argv[2], n, args, collect_row, &rows);
	if (!rc)
		snap_print_list(rows.v, rows.states, rows.n, json);
	for (size_t k = 0; k < rows.n; k++)
		free((char *)rows.states[k]);
	free(rows.states);
	free(rows.v);
	return rc;
}
