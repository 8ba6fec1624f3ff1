"""The tools' output and usage: mlfs-stat's JSON and people view with paths that hold
quotes, controls, bytes that are not UTF-8 or run to PATH_MAX; mlfs-snap's names (new
ones UTF-8 without controls, old ones printed escaped), its exit codes and messages."""
import contextlib
import json
import os
import shutil
import socket
import subprocess

import pytest

import mlfs_util as U
import snap_util as S

pytestmark = pytest.mark.daemon

# Every byte a terminal acts on, a JSON-breaking quote and backslash, and a byte that
# is not UTF-8: each must come out escaped.
EVIL = b' "q" \\b\tt\nn\x01\x1b[31m\xc2\x9bc\xffz'


def run(argv, timeout=60):
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


@contextlib.contextmanager
def mounted(src, mnt, opts=None):
    """mlfs SRC MNT (bytes paths allowed), always unmounted."""
    argv = [U.MLFS] + (["-o", opts] if opts else []) + [src, mnt]
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert r.returncode == 0, r
    try:
        yield mnt
    finally:
        m = os.fsdecode(mnt)
        U.fusermount_u(m)
        if U.is_mounted(m):
            U.force_unmount(m)


def no_raw_controls(b):
    """No C0 control but newline, no DEL, no C1 control, valid UTF-8."""
    t = b.decode("utf-8")  # raises on a byte that is not UTF-8
    bad = [c for c in t if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f]
    assert not bad, (bad, t[:300])
    return t


# ---------------------------------------------------------------- mlfs-stat

def test_stat_json_escapes_paths(mounter):
    """SOURCE holds '"', '\\', a tab, a newline, C0 and C1 controls and a byte 0xff:
    --json is one line of valid UTF-8 JSON that gives the path back (0xff as U+FFFD);
    it printed them raw."""
    mounter.require_binary()
    base = mounter.tempdir("esc-").encode()
    src, mnt = base + b"/s" + EVIL, base + b"/mnt"
    os.makedirs(src)
    os.mkdir(mnt)
    with mounted(src, mnt):
        rc, out, err = run([U.MLFS_STAT, "--json", mnt])
        assert rc == 0, err
        assert out.count(b"\n") == 1 and out.endswith(b"\n"), out[:300]
        t = no_raw_controls(out)
        d = json.loads(t)
        assert d["source"] == src.decode("utf-8", errors="replace"), d["source"]
        assert d["mountpoint"] == mnt.decode() and d["pid"] > 0, d


def test_stat_people_view_escapes_mountpoint(mounter):
    """A path to the mount holding a newline and an escape sequence cannot add lines or
    fake figures in the people view."""
    m = mounter()
    link = os.path.join(m.base.encode(), b"l\nhits 999\x1b[2J\xc2\x9b")
    os.symlink(m.mnt, link)
    rc, plain, err = run([U.MLFS_STAT, m.mnt])
    assert rc == 0, err
    rc, out, err = run([U.MLFS_STAT, link])
    assert rc == 0, err
    t = no_raw_controls(out)
    assert len(t.splitlines()) == len(plain.splitlines()), t
    assert "l\\x0ahits 999\\x1b[2J\\xc2\\x9b (pid" in t.splitlines()[0], t.splitlines()[0]
    assert "\nhits 999" not in t


def _long_dir(root, n, comp=b"d" * 250):
    p = root
    while len(p) + len(comp) + 1 < n:
        p += b"/" + comp
    p += b"/" + b"e" * (n - len(p) - 1)
    os.makedirs(p)
    return p


@pytest.mark.parametrize("kind", ["long", "controls"])
def test_stat_json_long_paths_whole(mounter, kind):
    """SOURCE near PATH_MAX (or whose escaped form is 6 times its length) and a long
    mount point: the figures went as one control line of at most 4096 bytes, so --json
    was cut (invalid, exit 0) and the people view printed 0 for every later figure."""
    mounter.require_binary()
    base = mounter.tempdir("long-").encode()
    if kind == "long":
        src = _long_dir(base + b"/src", 4050)
    else:
        src = base + b"/c"
        for _ in range(4):
            src += b"/" + b"\x01" * 200
        os.makedirs(src)
    mnt = _long_dir(base + b"/mnt", 2800)
    with mounted(src, mnt):
        rc, out, err = run([U.MLFS_STAT, "--json", mnt])
        assert rc == 0, err
        assert out.count(b"\n") == 1, out[-300:]
        d = json.loads(out)
        assert d["source"] == src.decode() and d["mountpoint"] == mnt.decode()
        assert d["pid"] > 0 and d["mem_budget"] > 0 and d["gov_samples"] >= 0, d
        rc, out, err = run([U.MLFS_STAT, mnt])
        assert rc == 0, err
        t = out.decode()
        assert f"(pid {d['pid']}," in t, t[-500:]
        budget = [ln for ln in t.splitlines() if ln.split()[:1] == ["mem_budget"]]
        assert budget and budget[0].split()[1] != "0", budget


def test_stat_watch_json_one_object_per_line(mlfs):
    """-w with --json was taken and ignored: it prints one whole object per sample."""
    p = subprocess.Popen([U.MLFS_STAT, "-w", "0.2", "--json", mlfs.mnt],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [p.stdout.readline() for _ in range(2)]
    finally:
        p.kill()
        p.wait(10)
    for ln in lines:
        d = json.loads(ln)
        assert d["pid"] == mlfs.pid, d


def test_stat_watch_across_a_remount_starts_counting_again(mounter):
    """The mount is made again between two samples of -w: the new daemon's counters
    start from zero, and the rates of that interval were differences of unsigned
    counters gone backwards (a hit rate of anything). It now says so and starts again."""
    mounter.require_binary()
    base = mounter.tempdir("watch-")
    src, mnt = os.path.join(base, "src"), os.path.join(base, "mnt")
    os.makedirs(src)
    os.mkdir(mnt)
    with open(os.path.join(src, "f"), "wb") as f:
        f.write(os.urandom(3 << 20))
    p = None
    try:
        with mounted(src, mnt):
            p = subprocess.Popen([U.MLFS_STAT, "-w", "3", mnt], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            with open(os.path.join(mnt, "data", "f"), "rb") as f:
                assert len(f.read()) == 3 << 20  # misses counted by the first daemon
            lines = [p.stdout.readline(), p.stdout.readline()]  # the header, one row
        with mounted(src, mnt):  # well within the 3 s to the next sample
            lines += [p.stdout.readline(), p.stdout.readline(), p.stdout.readline()]
    finally:
        if p:
            p.kill()
            p.wait(10)
    assert "a new daemon" in lines[2], lines
    assert lines[3].split()[-1] == "hit%", lines
    assert 0.0 <= float(lines[4].split()[-1]) <= 100.0, lines


def test_relative_governor_paths_work_in_the_background(mounter):
    """meminfo_file= and pressure_file= given relative: a daemon that detaches (and
    leaves for /) said "No such file or directory" for files that exist, where relative
    SOURCE, mount point, store= and spill= work. They are taken from where mlfs ran."""
    mounter.require_binary()
    base = mounter.tempdir("rel-")
    for d in ("src", "mnt"):
        os.mkdir(os.path.join(base, d))
    with open(os.path.join(base, "mi"), "w") as f:
        f.write("MemTotal: 24684084 kB\nMemAvailable: 20000000 kB\n")
    with open(os.path.join(base, "psi"), "w") as f:
        f.write("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    r = subprocess.run([U.MLFS, "-o", "meminfo_file=mi,pressure_file=psi", "src", "mnt"],
                       cwd=base, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    mnt = os.path.join(base, "mnt")
    try:
        assert r.returncode == 0, r
        rc, out, err = run([U.MLFS_STAT, "--json", mnt])
        assert rc == 0, err
        d = json.loads(out)
        assert d["mem_available"] == 20000000 * 1024, d
    finally:
        if U.is_mounted(mnt):
            U.fusermount_u(mnt)


@pytest.mark.parametrize("closed", ["<&- >&- 2>&-", ">&- 2>&-"])
def test_started_with_standard_descriptors_closed(mounter, closed):
    """mlfs started with stdin, stdout or stderr closed (a service manager or a script
    may): SOURCE's directory and the control socket took those free numbers, and the
    detach put /dev/null over them; it exited 0 with MOUNT/data answering ENOTDIR and
    mlfs-snap refused (an outside tester)."""
    mounter.require_binary()
    m = mounter.prepare()
    U.write_file(os.path.join(m.src, "x"), b"dataset bytes")
    opts = mounter.options(m, "")
    r = subprocess.run(["sh", "-c", f'exec "$0" -o "$1" "$2" "$3" {closed}', U.MLFS, opts,
                        m.src, m.mnt], stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r
    mounter._find_pid(m)
    with open(os.path.join(m.data, "x"), "rb") as f:
        assert f.read() == b"dataset bytes"
    U.write_file(os.path.join(m.ckpt, "c"), b"ckpt")
    rc, out, err = run([S.SNAP, "take", m.mnt, "s1", "--wait"])
    assert rc == 0, (out, err)
    rc, out, err = run([U.MLFS_STAT, "--json", m.mnt])
    assert rc == 0 and json.loads(out)["ckpt_blocks"] >= 1, (out, err)


@pytest.mark.parametrize("args", [["--prom", "--json"], ["-w", "1", "--prom"]])
def test_stat_prom_conflicts_refused(mlfs, args):
    rc, out, err = run([U.MLFS_STAT, *args, mlfs.mnt])
    assert rc == 2 and not out, (rc, out, err)
    assert err.decode().strip() == "mlfs-stat: --prom goes with neither --json nor -w"


# ---------------------------------------------------------------- mlfs-snap names

NEW_BAD = {"not-utf8": b"ckpt\xff", "c1-csi": b"x\xc2\x9b31mRED", "tab": b"a\tb",
           "c1-nel": b"a\xc2\x85b", "surrogate": b"a\xed\xa0\x80b", "overlong": b"a\xc0\xafb"}


@pytest.mark.parametrize("case", sorted(NEW_BAD))
def test_snap_take_refuses_name_not_utf8_or_c1(mounter, case):
    """take accepted names that are not UTF-8 or hold C1 controls (then printed raw);
    a tab gave "Invalid argument". Now: the naming rule, escaped, exit 2."""
    m = mounter()
    name = NEW_BAD[case]
    rc, out, err = run([S.SNAP, "take", m.mnt, name, "--wait"])
    assert rc == 2, (rc, out, err)
    lines = no_raw_controls(err).splitlines()
    assert len(lines) == 1 and "invalid snapshot name" in lines[0], lines
    assert "UTF-8" in lines[0], lines
    assert S.list_json(m.mnt) == {}


def raw_take(mnt, name):
    """take NAME --wait straight over the control socket, as an older mlfs-snap could
    send it."""
    ctl = os.getxattr(mnt, "user.mlfs.control").rstrip(b"\0").decode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(ctl)
        s.sendall(b"snap-take\t" + name + b"\t--wait\n")
        out = b""
        while not out.endswith(b"ok\n") and b"\nerr " not in b"\n" + out:
            b = s.recv(4096)
            if not b:
                break
            out += b
    return out


BAD_NAMES = [b"old\xff", b"x\xc2\x9b31mRED", b"e\x1b[2J", b"-x"]


def test_daemon_refuses_names_not_utf8_or_with_controls(mounter):
    """The daemon itself refuses a new snapshot name that is not UTF-8 or holds a C0 or
    C1 control (store_name_new), whatever client sends it: an older mlfs-snap took the
    first two, which then printed raw on terminals and made list --json invalid."""
    m = mounter()
    with open(os.path.join(m.ckpt, "f"), "wb") as f:
        f.write(b"x" * 5000)
    for n in BAD_NAMES:
        out = raw_take(m.mnt, n)
        assert b"\nerr " in b"\n" + out and not out.endswith(b"ok\n"), (n, out)
    assert raw_take(m.mnt, "caf\u00e9-\u6a21\u578b".encode()).endswith(b"ok\n")
    rc, out, err = run([S.SNAP, "list", m.mnt, "--json"])
    assert rc == 0, err
    assert [e["name"] for e in json.loads(no_raw_controls(out))] == ["caf\u00e9-\u6a21\u578b"]


def test_snap_no_new_name_begins_with_a_dash(mounter):
    """A mistyped option became a snapshot's name (take MNT --wiat), and a name taken
    as "-x" could then be named by no --store form ("unknown option"). Now a new name
    may not begin with '-', an unknown option is refused as one, and "--" ends the
    options of every subcommand, online and offline, for a name an older mlfs took
    (found by an outside tester)."""
    m = mounter()
    U.write_file(os.path.join(m.ckpt, "f"), b"x" * 5000)
    for opt in ("--wiat", "-x"):
        rc, out, err = run([S.SNAP, "take", m.mnt, opt, "--wait"])
        assert rc != 0 and f"unknown option '{opt}'".encode() in err, (rc, out, err)
    rc, out, err = run([S.SNAP, "take", m.mnt, "--", "-x", "--wait"])
    assert rc == 2 and b"invalid snapshot name '-x'" in err, (rc, out, err)
    assert S.list_json(m.mnt) == {}
    rc, out, err = run([S.SNAP, "take", m.mnt, "--", "s1", "--wait"])
    assert rc == 0 and b"durable s1" in out, (rc, out, err)
    exp = os.path.join(m.base, "exp")
    for argv in (["verify", "--store", m.store, "--", "s1"],
                 ["restore", "--store", m.store, "--to", exp, "--", "s1"]):
        rc, out, err = run([S.SNAP, *argv])
        assert rc == 0, (argv, rc, out, err)
    assert open(os.path.join(exp, "f"), "rb").read() == b"x" * 5000
    rc, out, err = run([S.SNAP, "verify", "--store", m.store, "--", "-x"])
    assert rc == 1 and b"no snapshot named '-x'" in err, (rc, out, err)
    rc, out, err = run([S.SNAP, "delete", m.mnt, "--", "s1"])
    assert rc == 0, (rc, out, err)
    assert S.list_json(m.mnt) == {}


def test_snap_take_by_hand_refuses_autosnaps_prefix(mounter):
    """keep=N deletes the oldest snapshots named auto-*, and a hand take could use that
    prefix: with autosnap=1s,keep=1 a durable auto-by-hand was gone seconds later,
    though snapshots taken by hand are never deleted (found by an outside tester).
    Now a take by hand refuses the prefix, whichever client sends it."""
    m = mounter(opts="autosnap=1s,keep=1")
    U.write_file(os.path.join(m.ckpt, "f"), b"x" * 5000)
    rc, out, err = run([S.SNAP, "take", m.mnt, "auto-by-hand", "--wait"])
    assert rc == 2 and b"autosnap's" in err, (rc, out, err)
    out = raw_take(m.mnt, b"auto-raw")
    assert b"\nerr " in b"\n" + out and b"autosnap's" in out, out
    assert not [n for n in S.list_json(m.mnt) if n in ("auto-by-hand", "auto-raw")]


def test_snap_verify_names_an_unreadable_pack_and_why(mounter):
    """A pack the caller may not read was reported block by block as "checksum
    mismatch", under a version 1 object path the store does not have (found by an
    outside tester). Now the read's own error, and a last line names the pack."""
    m = mounter()
    U.write_file(os.path.join(m.ckpt, "model.pt"), os.urandom(3 << 20))
    S.snap_ok("take", m.mnt, "s", "--wait")
    for d, _, files in os.walk(m.store):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    packs = [f for f in os.listdir(os.path.join(m.store, "packs")) if f.endswith(".pack")]
    assert len(packs) == 1, packs
    os.chmod(os.path.join(m.store, "packs", packs[0]), 0)
    r = S.snap("verify", "--store", m.store, as_nobody=True)
    assert r.rc == 1, repr(r)
    assert "checksum mismatch" not in r.out + r.err, repr(r)
    faults = [ln for ln in r.out.splitlines() if "damaged: model.pt" in ln]
    assert faults and all("Permission denied" in ln for ln in faults), repr(r)
    assert f"packs/{packs[0]}: Permission denied" in r.err, repr(r)


def test_snap_restore_to_inside_the_store_is_refused(mounter):
    """restore --to a directory inside the store wrote the tree there: list showed it
    as a partial group and gc would have removed its files (found by an outside
    tester). Refused now, however the path is spelled."""
    m = mounter()
    U.write_file(os.path.join(m.ckpt, "f"), b"x" * 5000)
    S.snap_ok("take", m.mnt, "s", "--wait")
    os.symlink(m.store, os.path.join(m.base, "link"))
    for to in (os.path.join(m.store, "snaps", "X"), os.path.join(m.base, "link", "X")):
        r = S.snap("restore", "--store", m.store, "s", "--to", to)
        assert r.rc == 1 and "inside the store" in r.err, repr(r)
    assert sorted(os.listdir(os.path.join(m.store, "snaps"))) == ["s"]
    assert list(S.list_json(m.store, store=True)) == ["s"]


def test_snap_take_timeout_goes_with_group_wait(mounter):
    """take NAME --timeout S without --group-wait was taken and the timeout ignored
    (the synopsis: [--wait | --group-wait [--timeout S]]; found by an outside tester)."""
    m = mounter()
    rc, out, err = run([S.SNAP, "take", m.mnt, "n", "--wait", "--timeout", "5"])
    assert rc != 0 and b"--timeout goes with --group-wait" in err, (rc, out, err)
    assert S.list_json(m.mnt) == {}


# ---------------------------------------------------------------- mlfs-snap usage

def test_snap_store_form_exit_codes(mounter):
    """Bad usage exits 2 in every --store form: restore with a bad name exited 1, and
    take/advise/an unknown subcommand with --store exited 1 ("--store: No such file")."""
    mounter.require_binary()
    d = mounter.tempdir("exit-")
    st = os.path.join(d, "store")
    assert run([S.SNAP, "init", "--store", st])[0] == 0
    for argv in (["verify", "--store", st, "../x"], ["delete", "--store", st, "../x"],
                 ["restore", "--store", st, "../x", "--to", d + "/exp"],
                 ["take", "--store", st, "name"], ["advise", "--store", st],
                 ["bogus", "--store", st], ["take", "--store=" + st, "name"]):
        rc, out, err = run([S.SNAP, *argv])
        assert rc == 2, (argv, rc, err)
        assert len(err.splitlines()) == 1 and b"No such file" not in err, (argv, err)
    assert not os.path.exists(d + "/exp")


def test_snap_mount_form_usage(mounter):
    """verify/init given a MOUNT said "unknown command 'snap-verify'"; advise MOUNT extra
    exited 0; both are bad usage (2) with one line saying what to do."""
    m = mounter()
    for argv, want in ((["verify", m.mnt], b"--store"), (["init", m.mnt], b"--store"),
                       (["advise", m.mnt, "extra"], b"advise takes nothing"),
                       (["bogus", m.mnt], b"unknown subcommand")):
        rc, out, err = run([S.SNAP, *argv])
        assert rc == 2, (argv, rc, err)
        assert len(err.splitlines()) == 1 and want in err and b"snap-" not in err, err
    assert run([S.SNAP, "advise", m.mnt])[0] == 0


def test_snap_mount_without_store_says_so(mounter):
    """A snapshot command on a mount without -o store= said "unknown command
    'snap-take'"."""
    mounter.require_binary()
    d = mounter.tempdir("nostore-")
    os.mkdir(d + "/src")
    os.mkdir(d + "/mnt")
    with mounted(d + "/src", d + "/mnt"):
        for argv in (["take", d + "/mnt", "x"], ["list", d + "/mnt"]):
            rc, out, err = run([S.SNAP, *argv])
            assert rc == 1, (argv, rc, err)
            assert b"has no snapshot store" in err and b"snap-" not in err, err


def test_mount_refuses_unknown_option_before_the_store(mounter):
    """An option neither mlfs nor libfuse knows was found only once the daemon had
    started: the store opened (and a restore= read: its damaged manifest logged), a
    store in use by another daemon waited for. Now it fails first, in one line."""
    mounter.require_binary()
    d = mounter.tempdir("unknown-")
    st = os.path.join(d, "store")
    for sub in ("src", "mnt"):
        os.mkdir(os.path.join(d, sub))
    assert run([S.SNAP, "init", "--store", st])[0] == 0
    with open(os.path.join(st, "snaps", "s1"), "wb") as f:
        f.write(b"not a manifest")
    for bad in (["-o", f"bogus,store={st},restore=s1"],
                ["--bogus", "-o", f"store={st},restore=s1"]):
        rc, out, err = run([U.MLFS, *bad, d + "/src", d + "/mnt"])
        assert rc == 1 and not U.is_mounted(d + "/mnt"), (bad, rc, err)
        assert len(err.splitlines()) == 1 and b"unknown option" in err, (bad, err)
    assert os.listdir(os.path.join(st, "leases")) == []


def test_mount_option_given_twice_takes_the_last(mounter):
    """mlfs(8): an option given twice takes its last value."""
    m = mounter(opts="mem_max=64M,mem_max=96M")
    assert m.stat()["mem_max"] == 96 << 20


def test_tools_given_a_tree_of_the_mount_name_the_mount_point(mounter):
    """MOUNT/ckpt given where MOUNT is wanted said only "is not an mlfs mount point"
    (found by an outside tester): the tools now say to give its parent."""
    m = mounter()
    for argv in ([U.MLFS_STAT, m.ckpt], [S.SNAP, "list", m.data + "/"]):
        rc, out, err = run(argv)
        assert rc != 0 and b"give the mount point, its parent directory" in err, (argv, err)
    rc, out, err = run([U.MLFS_STAT, m.src])
    assert rc != 0 and b"is not an mlfs mount point\n" in err, err


# ---------------------------------------------------------------- man pages

def test_man_pages_render_without_stray_fonts():
    """mlfs(8) rendered "auto-IYYYYMMDDBTIHHMMSSBZR": form feeds where \\f was meant."""
    man = os.path.join(os.path.dirname(__file__), "..", "..", "man")
    for page in os.listdir(man):
        with open(os.path.join(man, page), "rb") as f:
            assert b"\x0c" not in f.read(), f"{page}: a form feed byte (meant \\f?)"
    if not shutil.which("groff"):
        return
    r = subprocess.run(["groff", "-man", "-Tutf8", "-P", "-cbou", os.path.join(man, "mlfs.8")],
                       capture_output=True, timeout=60)
    t = r.stdout.decode(errors="replace")
    assert "auto-YYYYMMDDTHHMMSSZ of the boundary" in " ".join(t.split()), "workers="
    for bad in ("IYYYY", "ILASTR"):
        assert bad not in t
