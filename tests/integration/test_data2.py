"""MOUNT/data as an outside tester found it: what another user may read of SOURCE."""
import errno
import os

import pytest

from test_posix4 import GROUP, NOBODY, as_creds


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other users)")


@needs_root
def test_data_xattr_of_revoked_file_refused(mounter, tmp_path):
    """A user.* extended attribute, which SOURCE gives only to a reader of the file, is
    refused to another user once the file or a directory above it is made private in
    SOURCE, as SOURCE refuses it: mlfs read it as root and the kernel checked the mode it
    caches for data_timeout (an hour), so the value of a file made 600 stayed readable.
    Its owner (here by a supplementary group) and root still read it."""
    src = str(tmp_path / "src")
    os.makedirs(os.path.join(src, "sub"))
    os.chmod(str(tmp_path), 0o755)
    os.chmod(src, 0o755)
    for rel in ("f", "sub/g", "gf"):
        path = os.path.join(src, rel)
        with open(path, "w") as fh:
            fh.write(rel)
        os.setxattr(path, "user.tag", rel.encode())
        os.chmod(path, 0o644)
    os.chown(os.path.join(src, "gf"), 0, GROUP)
    m = mounter(src=src, opts="allow_other")
    data = m.data

    def get(rel, groups=()):
        return as_creds(lambda: os.getxattr(os.path.join(data, rel), "user.tag"),
                        NOBODY, NOBODY, list(groups))

    def names(rel):
        return as_creds(lambda: os.listxattr(os.path.join(data, rel)), NOBODY, NOBODY, [])

    assert get("f") == ("ok", b"f")
    assert get("sub/g") == ("ok", b"sub/g")
    assert get("gf", [GROUP]) == ("ok", b"gf")
    assert names("sub/g") == ("ok", ["user.tag"])
    os.chmod(os.path.join(src, "f"), 0o600)
    os.chmod(os.path.join(src, "gf"), 0o640)
    os.chmod(os.path.join(src, "sub"), 0o700)
    assert get("f") == ("err", errno.EACCES)
    assert get("gf") == ("err", errno.EACCES)
    assert get("gf", [GROUP]) == ("ok", b"gf")
    assert get("sub/g") == ("err", errno.EACCES)
    assert names("sub/g") == ("err", errno.EACCES)
    assert os.getxattr(os.path.join(data, "f"), "user.tag") == b"f"
    assert os.getxattr(os.path.join(data, "sub", "g"), "user.tag") == b"sub/g"
    assert os.listxattr(os.path.join(data, "sub", "g")) == ["user.tag"]


@needs_root
def test_data_acls_of_source_decide_for_another_user(mounter, tmp_path):
    """SOURCE's POSIX ACLs decide what another user reads, content and user.* values
    alike: one granted by a named entry of a file mode 600 reads both, one denied by a
    named group entry of a file mode 644 (a member of that group) reads neither, as on
    SOURCE itself. The kernel asks the daemon for the ACL as the caller."""
    src = str(tmp_path / "src")
    os.makedirs(src)
    os.chmod(str(tmp_path), 0o755)
    os.chmod(src, 0o755)
    for rel, mode, acl in (("granted", 0o600, "u:%d:r" % NOBODY),
                           ("denied", 0o644, "g:%d:-" % GROUP)):
        path = os.path.join(src, rel)
        with open(path, "w") as fh:
            fh.write(rel)
        os.setxattr(path, "user.tag", rel.encode())
        os.chmod(path, mode)
        if os.system("setfacl -m %s %s" % (acl, path)) != 0:
            pytest.skip("SOURCE's filesystem takes no ACLs")
    m = mounter(src=src, opts="allow_other")

    def both(rel, groups=()):
        path = os.path.join(m.data, rel)

        def run():
            with open(path, "rb") as fh:
                return fh.read(), os.getxattr(path, "user.tag")
        return as_creds(run, NOBODY, NOBODY, list(groups))

    assert both("granted") == ("ok", (b"granted", b"granted"))
    assert both("denied") == ("ok", (b"denied", b"denied"))
    assert both("denied", [GROUP]) == ("err", errno.EACCES)
    assert as_creds(lambda: os.getxattr(os.path.join(m.data, "denied"), "user.tag"),
                    NOBODY, NOBODY, [GROUP]) == ("err", errno.EACCES)


@needs_root
def test_data_readlink_below_revoked_directory_refused(mounter, tmp_path):
    """A symlink's target below a directory made private in SOURCE is refused to another
    user, as SOURCE refuses it: the kernel walked into the directory by the mode it
    caches for data_timeout and mlfs read the link as root. Root still reads it."""
    src = str(tmp_path / "src")
    os.makedirs(os.path.join(src, "sub"))
    os.chmod(str(tmp_path), 0o755)
    os.chmod(src, 0o755)
    os.symlink("secret-target", os.path.join(src, "sub", "l"))
    m = mounter(src=src, opts="allow_other")
    link = os.path.join(m.data, "sub", "l")
    assert as_creds(lambda: os.readlink(link), NOBODY, NOBODY, []) == \
        ("ok", "secret-target")
    os.chmod(os.path.join(src, "sub"), 0o700)
    assert as_creds(lambda: os.readlink(link), NOBODY, NOBODY, []) == \
        ("err", errno.EACCES)
    assert os.readlink(link) == "secret-target"
