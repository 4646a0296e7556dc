"""Sandbox launcher: runs as a separate, tiny Python program (``python -I -S``), never imported.

argv: ``LAUNCHER SPEC_FD``. The spec (JSON, read from the inherited file descriptor ``SPEC_FD``,
which is then closed) holds the program text, extra files, the working dir, the rlimits, the uid to
drop to and whether to build private mounts. When started under ``unshare -n -m -p --fork`` the
launcher is PID 1 of a fresh PID namespace (under bwrap, PID 2 under bwrap's reaper): when it
exits, the kernel kills every process left in the namespace (daemons included). It

1. reads the spec from its fd, closes it and makes itself non-dumpable (so a program running as the
   same uid can neither ptrace it nor read its memory or fds through /proc);
2. with ``private_mounts``: mounts fresh size-limited tmpfs over /tmp, /var/tmp, /run/lock and
   /dev/shm and remounts / read-only (for this namespace only), so nothing written survives;
3. forks the program as its child (so the program's parent is the launcher, never the caller),
   which drops to ``uid`` and sets the rlimits before ``exec``;
4. reaps every child until the program exits and exits with its status (128 + signal if killed).

With ``ready_fd`` in the spec (the write end of a pipe whose read end the caller holds), the program
is started through :data:`BOOT`: once the program's interpreter is up, and before any of the
program's code runs, it writes one byte to that fd and closes it, then runs the program as
``__main__``. The caller starts its wall clock there, so interpreter start-up under load is
measured on its own budget instead of eating into the program's time limit.
"""

import ctypes
import json
import os
import resource
import sys

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096


def _mount(libc, source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    rc = libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


PR_SET_DUMPABLE = 4

#: the program's first code (``python -I -c BOOT program.py``): signal "started", close the fd, run
BOOT = (
    "import os, sys, runpy\n"
    "os.write({fd}, b'1')\n"
    "os.close({fd})\n"
    "del os\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def _private_mounts(spec: dict) -> None:
    """Step 2: fresh size-limited tmpfs over the shared temp dirs, the interpreter kept reachable,
    then / remounted read-only (all in this mount namespace only). Sets ``spec["root_readonly"]``."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = spec["tmpfs_bytes"]
    for d in ("/tmp", "/var/tmp", "/run/lock", "/dev/shm"):
        if os.path.isdir(d):
            _mount(libc, "tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    # the interpreter may live under a directory the dropped uid cannot traverse (e.g. /root):
    # bind it to a stash, cover the closed ancestor with an empty tmpfs, bind it back in place
    prefix = spec.get("python_prefix")
    closed = spec.get("closed_ancestor")
    if prefix and closed:
        stash = "/tmp/.gfcr-python"
        os.makedirs(stash)
        _mount(libc, prefix, stash, None, MS_BIND, None)
        _mount(libc, "tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        os.makedirs(prefix, mode=0o755, exist_ok=True)
        _mount(libc, stash, prefix, None, MS_BIND, None)
        _mount(libc, prefix, prefix, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    try:
        _mount(libc, "/", "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        spec["root_readonly"] = True
    except OSError:
        spec["root_readonly"] = False


def main() -> int:
    fd = int(sys.argv[1])
    with os.fdopen(fd, "rb") as f:  # closes the fd: the program never inherits it
        spec = json.loads(f.read())
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    program = spec.pop("program").encode()
    files = spec.pop("files", {})
    workdir = spec["workdir"]
    if spec["private_mounts"]:
        _private_mounts(spec)
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    path = os.path.join(workdir, spec["program_name"])
    with open(path, "wb") as f:
        f.write(program)
    for name, content in files.items():
        with open(os.path.join(workdir, name), "w") as f:
            f.write(content)
    uid = spec["uid"]
    if uid is not None:
        for root, dirs, fs in os.walk(workdir):
            for n in dirs + fs:
                os.chown(os.path.join(root, n), uid, uid)
        os.chown(workdir, uid, uid)

    ready = spec.get("ready_fd")
    argv = list(spec["argv"])
    argv += ["-c", BOOT.format(fd=int(ready)), path] if ready is not None else [path]
    pid = os.fork()
    if pid == 0:
        try:
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            for name, value in spec["rlimits"].items():
                lim = getattr(resource, name)
                # CPU: soft limit sends SIGXCPU (a recognisable death), hard one second later SIGKILL
                hard = value + 1 if name == "RLIMIT_CPU" else value
                resource.setrlimit(lim, (value, hard))
            os.chdir(workdir)
            os.umask(0o077)
            if ready is not None:
                os.set_inheritable(int(ready), True)
            os.execve(argv[0], argv, spec["env"])
        except BaseException as e:  # report, never return into the launcher's code
            os.write(2, f"gfcr-sandbox: could not start the program: {e}\n".encode())
            os._exit(125)
    if ready is not None:
        os.close(int(ready))  # only the program holds it now: EOF without a byte = it never started
    status = 0
    while True:
        try:
            done, st = os.wait()
        except ChildProcessError:
            break
        if done == pid:
            status = st
            break
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
