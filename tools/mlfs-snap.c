/*
 * mlfs-snap - snapshots of MOUNT/ckpt.
 *
 * With --store DIR the store is used directly, no daemon needed (snap_offline.c).
 * Otherwise the first argument after the subcommand is a mount point, and the command
 * goes to that mount's daemon over its control socket (fs/ctl.h), which checks that
 * the caller is root or the user who mounted.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs/ctl.h"
#include "tools/snap_offline.h"

static const char usage_text[] =
	"usage: mlfs-snap take MOUNT NAME [--wait]\n"
	"       mlfs-snap list MOUNT [--json]\n"
	"       mlfs-snap restore MOUNT NAME|latest\n"
	"       mlfs-snap delete MOUNT NAME\n"
	"       mlfs-snap advise MOUNT\n";

static void usage(FILE *f)
{
	fputs(usage_text, f);
	fputs(snap_offline_usage, f);
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
}

/* Sends argv (the subcommand and its arguments, mount point removed) to mnt's daemon. */
static int online(const char *mnt, int argc, const char **argv)
{
	char msg[512] = "";
	int fd = ctl_connect(mnt), rc;

	if (fd < 0) {
		if (fd == -ENOTCONN)
			fprintf(stderr, "mlfs-snap: %s is not an mlfs mount point\n", mnt);
		else if (fd == -EPERM)
			fprintf(stderr, "mlfs-snap: %s: %s\n", mnt,
				"permission denied: only root and the user who mounted may "
				"manage its snapshots");
		else
			fprintf(stderr, "mlfs-snap: %s: %s\n", mnt, strerror(-fd));
		return 1;
	}
	rc = ctl_call(fd, argc, argv, print_line, NULL, msg, sizeof(msg));
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

	snprintf(cmd, sizeof(cmd), "snap-%s", argv[1]);
	args[n++] = cmd;
	for (i = 3; i < argc; i++)
		args[n++] = argv[i];
	return online(argv[2], n, args);
}
