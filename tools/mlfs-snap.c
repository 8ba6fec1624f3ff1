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
		   "\t%" SCNu32 "\t%" SCNu32 "\t%" SCNu64, &x->time_ns, &x->files,
		   &x->logical_bytes, &x->new_bytes, state, &x->open_writes, &x->workers,
		   &x->parts, &x->conflicts) < 5)
		return;
	r->states[r->n] = strdup(state);
	if (r->states[r->n])
		r->n++;
}

static void print_line(void *arg, const char *line)
{
	/* Progress lines ("progress ...") only make sense on a terminal. */
	if (!strncmp(line, "progress ", 9)) {
		if (isatty(STDERR_FILENO))
			fprintf(stderr, "\r%s\033[K", line + 9);
		return;
	}
	puts(line);
	/* Streamed as the daemon sends them: a script logging `take --wait` to a file sees
	 * "taken NAME" once the freeze is done, not when the persist ends. */
	fflush(stdout);
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
	if (rc) {
		fprintf(stderr, "mlfs-snap: %s\n", msg[0] ? msg : strerror(-rc));
		return 1;
	}
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
		return 0;
	}
	if (snap_offline_wants(argc - 1, argv + 1))
		return snap_offline_main(argc - 1, argv + 1);
	if (argc < 3 || argc - 1 > CTL_MAX_ARGS) {
		usage(stderr);
		return 2;
	}
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
