#!/usr/bin/env python3
"""delayfs: a FUSE passthrough filesystem for tfinit's storage tests and benchmark.

    python delayfs.py BACKING MOUNTPOINT CONTROL

Mirrors BACKING at MOUNTPOINT (multi-threaded libfuse2 through fusepy, `allow_other`). What it
does to each request is steered at run time by CONTROL, a JSON file the daemon re-reads whenever
its mtime or size changes (write it atomically: a temporary file, then rename):

    {
      "delay_ms": 1000,                       # sleep before each of delay_ops (all paths)
      "delay_ops": ["create", "rename", "unlink", "fsync", "fsyncdir", "mkdir"],
      "fail": ["/owners/"],                   # EIO for every operation on these path prefixes
      "hold": ["/records/"],                  # read the request and keep it until the rule goes
      "log": "/tmp/ops.log"                   # one line per operation: `UNIX_TIME OP PATH`
    }

Every key is optional; a missing or unreadable CONTROL means "pass everything through at once".
Paths are as FUSE sees them: `/` is MOUNTPOINT. A prefix matches the path of the operation, and
for a rename either side. `"hold": ["/"]` holds every operation on a path below the root.

A *hang* is not this file's business: SIGSTOP the daemon and it stops reading requests, so every
caller waits in the kernel in a wait that SIGKILL still ends (the request was never read). A
*hold* differs on purpose: the request was read, so the kernel waits it out even on SIGKILL
(fs/fuse/dev.c, request_wait_answer). Killing the daemon ends both: closing /dev/fuse aborts the
connection and fails every request.

Writes `ready` to CONTROL + ".ready" once the kernel has initialised the mount.
"""

import errno
import json
import os
import sys
import threading
import time

from fuse import FUSE, FuseOSError, Operations, fuse_get_context

# Operations that change nothing, so never worth a log line of their own when logging is off.
POLL_S = 0.02


class Control:
    """The rules of CONTROL, reloaded when the file changes."""

    def __init__(self, path):
        self.path = path
        self.key = None
        self.rules = {}
        self.lock = threading.Lock()
        self.log_file = None
        self.log_path = None

    def current(self):
        try:
            st = os.stat(self.path)
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            key = None
        with self.lock:
            if key != self.key:
                self.key = key
                try:
                    with open(self.path) as f:
                        self.rules = json.load(f) if key else {}
                except (OSError, ValueError):
                    self.rules = {}
                log = self.rules.get("log")
                if log != self.log_path:
                    if self.log_file:
                        self.log_file.close()
                    self.log_file = open(log, "a", buffering=1) if log else None
                    self.log_path = log
            return self.rules

    def log(self, op, paths):
        with self.lock:
            if self.log_file:
                self.log_file.write("%.6f %s %s\n" % (time.time(), op, " ".join(paths)))


def matches(prefixes, paths):
    return any(p.startswith(pre) for pre in prefixes or () for p in paths)


class DelayFs(Operations):
    """Passthrough of BACKING with the delays, failures and holds of CONTROL."""

    use_ns = True
    lock = None

    def __init__(self, backing, control, ready):
        self.root = os.path.realpath(backing)
        self.control = control
        self.ready = ready

    def _full(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _gate(self, op, *paths):
        """Applies CONTROL to one request before it is served."""
        rules = self.control.current()
        self.control.log(op, paths)
        while matches(rules.get("hold"), paths):
            time.sleep(POLL_S)
            rules = self.control.current()
        if matches(rules.get("fail"), paths):
            raise FuseOSError(errno.EIO)
        delay = rules.get("delay_ms", 0)
        if delay and op in rules.get("delay_ops", ()):
            time.sleep(delay / 1000.0)

    def _own(self, full):
        """New files and directories belong to the caller, as on a real filesystem."""
        uid, gid, _ = fuse_get_context()
        try:
            os.lchown(full, uid, gid)
        except OSError:
            pass

    # Lifecycle.
    def init(self, path):
        with open(self.ready + ".tmp", "w") as f:
            f.write("ready\n")
        os.rename(self.ready + ".tmp", self.ready)

    # Metadata.
    def access(self, path, mode):
        self._gate("access", path)
        if not os.access(self._full(path), mode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        self._gate("getattr", path)
        st = os.lstat(self._full(path)) if fh is None else os.fstat(fh)
        keys = ("st_atime_ns", "st_ctime_ns", "st_gid", "st_mode", "st_mtime_ns",
                "st_nlink", "st_size", "st_uid", "st_ino", "st_blocks")
        out = {k.replace("_ns", ""): getattr(st, k) for k in keys}
        return out

    def chmod(self, path, mode):
        self._gate("chmod", path)
        os.chmod(self._full(path), mode)

    def chown(self, path, uid, gid):
        self._gate("chown", path)
        os.lchown(self._full(path), uid, gid)

    def utimens(self, path, times=None):
        self._gate("utimens", path)
        os.utime(self._full(path), ns=times) if times else os.utime(self._full(path))

    def readlink(self, path):
        self._gate("readlink", path)
        return os.readlink(self._full(path))

    def statfs(self, path):
        self._gate("statfs", path)
        sv = os.statvfs(self._full(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                "f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(sv, k) for k in keys}

    # Directories.
    def mkdir(self, path, mode):
        self._gate("mkdir", path)
        os.mkdir(self._full(path), mode)
        self._own(self._full(path))

    def rmdir(self, path):
        self._gate("rmdir", path)
        os.rmdir(self._full(path))

    def opendir(self, path):
        self._gate("opendir", path)
        return os.open(self._full(path), os.O_RDONLY | os.O_DIRECTORY)

    def readdir(self, path, fh):
        self._gate("readdir", path)
        return [".", ".."] + os.listdir(self._full(path))

    def releasedir(self, path, fh):
        os.close(fh)

    def fsyncdir(self, path, datasync, fh):
        self._gate("fsyncdir", path)
        os.fsync(fh)

    # Names.
    def unlink(self, path):
        self._gate("unlink", path)
        os.unlink(self._full(path))

    def rename(self, old, new):
        self._gate("rename", old, new)
        os.rename(self._full(old), self._full(new))

    def symlink(self, target, source):
        self._gate("symlink", target)
        os.symlink(source, self._full(target))

    def link(self, target, source):
        self._gate("link", target, source)
        os.link(self._full(source), self._full(target))

    def mknod(self, path, mode, dev):
        self._gate("mknod", path)
        os.mknod(self._full(path), mode, dev)
        self._own(self._full(path))

    # Files.
    def create(self, path, mode, fi=None):
        self._gate("create", path)
        fd = os.open(self._full(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        self._own(self._full(path))
        return fd

    def open(self, path, flags):
        self._gate("open", path)
        return os.open(self._full(path), flags & ~(os.O_CREAT | os.O_EXCL))

    def read(self, path, size, offset, fh):
        self._gate("read", path)
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        self._gate("write", path)
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        self._gate("truncate", path)
        if fh is None:
            os.truncate(self._full(path), length)
        else:
            os.ftruncate(fh, length)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        self._gate("fsync", path)
        os.fsync(fh)

    def release(self, path, fh):
        os.close(fh)


def main():
    if len(sys.argv) != 4:
        sys.stderr.write("usage: delayfs.py BACKING MOUNTPOINT CONTROL\n")
        return 2
    backing, mountpoint, control = sys.argv[1:]
    fs = DelayFs(backing, Control(control), control + ".ready")
    FUSE(fs, mountpoint, foreground=True, nothreads=False, allow_other=True,
         default_permissions=True, use_ino=True, fsname="delayfs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
