"""A hardened sandbox for untrusted Python programs (model-written code under unit tests).

Each run gets:

- a child process in a **new session** (its own process group), killed as a group at the
  wall-clock timeout;
- **rlimits**: CPU seconds, address space, file size, processes, open files, no core dumps;
- a **scrubbed environment** (PATH, HOME, LANG, TMPDIR only) and a fresh working dir as cwd/HOME;
- with isolation ``"bwrap"`` (bubblewrap installed and permitted: as root, or unprivileged where
  user namespaces are allowed): new **network**, **PID**, IPC and UTS namespaces and a minimal
  **filesystem view** built from nothing: read-only /usr (and the /bin, /lib… links), the
  interpreter's prefix, a few /etc files, fresh /proc and /dev, size-limited tmpfs on /tmp,
  /var/tmp and /dev/shm, and / read-only. The caller's home, the project and the host's /tmp are
  simply absent. As root the program drops to a fresh unprivileged uid of its own (see below);
  unprivileged, bwrap maps it to ``nobody`` in a new user namespace.
- with isolation ``"unshare"`` (root, where ``unshare`` is permitted): new **network** namespace
  (only ``lo``, which is down), new **mount** namespace (fresh size-limited tmpfs over /tmp,
  /var/tmp, /run/lock, /dev/shm; / remounted read-only; closed directories such as /root hidden),
  new **PID** namespace (when the program ends, every process it left behind is killed by the
  kernel, daemons included) and the program runs as a fresh unprivileged uid, so planted files
  readable only by the caller stay unreadable and the fork-bomb limit (RLIMIT_NPROC) applies.

As root, each run gets its own uid, drawn from ``RUN_UIDS`` (no passwd entry, far above the usual
subordinate-uid ranges): RLIMIT_NPROC counts processes per uid, so a fork bomb in one run cannot
starve a concurrent run of processes, and runs cannot signal each other.

``"auto"`` prefers bwrap, then unshare. With isolation ``"none"`` only the rlimits, the scrubbed
environment and the process-group kill apply; the network is *not* cut. The isolation used is
recorded in every :class:`SandboxResult` (and in the code verifier's evidence).
``SandboxConfig.require_isolation`` (default on) refuses to run without isolation instead of
silently degrading.

The launcher gets its spec (program text, extra files) on an inherited file descriptor, never on
its command line or a path the program could read, and makes itself non-dumpable before the
program starts.

Time limits: starting the sandbox (bwrap or unshare, the launcher, the program's interpreter) takes
from ~0.1 s on an idle machine to seconds under heavy load. That start-up has its own budget,
``startup_s``; ``wall_s`` counts from the moment the program's own code starts (the program's
interpreter signals it on a private pipe before running any of it, see
:mod:`gfcr.sandbox._launcher`). Both are reported: ``SandboxResult.wall_s`` is the
program's time, ``details["startup_s"]`` the start-up's.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from gfcr.config import StrictModel

LAUNCHER = Path(__file__).with_name("_launcher.py")
NOBODY = 65534
#: uids given to sandboxed runs when the caller is root: one drawn at random per run
RUN_UIDS = range(3_000_000_000, 3_100_000_000)
BOX_DIR = "/tmp/gfcr-box"


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be established on this host."""


class SandboxConfig(StrictModel):
    """Limits and isolation of one sandboxed run."""

    cpu_s: int = Field(5, ge=1, le=3600, description="RLIMIT_CPU: CPU seconds before SIGXCPU/SIGKILL.")
    wall_s: float = Field(10.0, gt=0, le=3600, description=(
        "Wall-clock limit of the program, counted from when its own code starts; the whole process group is "
        "killed."))
    startup_s: float = Field(30.0, gt=0, le=3600, description=(
        "Separate budget for starting the sandbox and the program's interpreter (bwrap/unshare, launcher, "
        "Python start-up), which load slows."))
    memory_mb: int = Field(1024, ge=64, description="RLIMIT_AS: address-space limit of each process, MiB.")
    file_mb: int = Field(16, ge=1, description=(
        "RLIMIT_FSIZE: largest file the program may write, MiB (also caps stdout)."))
    nproc: int = Field(64, ge=1, description=(
        "RLIMIT_NPROC: processes of the run's uid (a fresh uid per run when the caller is root)."))
    nofile: int = Field(64, ge=8, description="RLIMIT_NOFILE: open file descriptors.")
    tmpfs_mb: int = Field(64, ge=1, description=(
        "Size of each private tmpfs (/tmp, /dev/shm…) under unshare isolation."))
    max_output_bytes: int = Field(1 << 20, ge=1024, description=(
        "stdout/stderr kept in the result (rest truncated)."))
    isolation: Literal["auto", "bwrap", "unshare", "none"] = Field(
        "auto",
        description="auto: bwrap when installed and permitted, else unshare when permitted, else none "
        "(refused unless require_isolation=False). bwrap/unshare: fail if not available.",
    )
    require_isolation: bool = Field(
        True, description="Refuse to run (SandboxUnavailable) when only isolation 'none' is possible."
    )
    python: str | None = Field(
        None, description=(
            "Interpreter for the program; default: the base interpreter of this Python, run with -I.")
    )


@dataclass
class SandboxResult:
    """Outcome of one sandboxed run."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False
    signal: str | None = None
    isolation: str = "none"
    truncated: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.cache
def unshare_available() -> bool:
    """True when this process may create net+mount+PID namespaces with ``unshare`` (needs root)."""
    exe = shutil.which("unshare")
    if exe is None or os.geteuid() != 0:
        return False
    try:
        r = subprocess.run(
            [exe, "-n", "-m", "-p", "--fork", "--mount-proc", "--kill-child", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@functools.cache
def bwrap_status() -> tuple[bool, str]:
    """``(usable, reason)``: whether bubblewrap is installed and may build this sandbox here.

    Probed once per process by running ``true`` under the same namespaces and mounts a real run uses.
    """
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = [exe, *_bwrap_args(tmpfs_bytes=1 << 20, python_roots=[]), "true"]
    try:
        r = subprocess.run(probe, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap could not be started: {e}"
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip()[-300:]
        return False, f"bwrap is installed but may not create the sandbox here: {err or f'exit {r.returncode}'}"
    return True, "ok"


def bwrap_available() -> bool:
    """True when bubblewrap is installed and permitted here (see :func:`bwrap_status`)."""
    return bwrap_status()[0]


def resolve_isolation(config: SandboxConfig) -> str:
    """The isolation a run with ``config`` will use; raises :class:`SandboxUnavailable` if refused."""
    want = config.isolation
    if want in ("auto", "bwrap") and bwrap_available():
        return "bwrap"
    if want == "bwrap":
        raise SandboxUnavailable(
            f"isolation 'bwrap' is not available: {bwrap_status()[1]}; use isolation='auto' to fall back "
            "to unshare (root), or install bubblewrap"
        )
    if want in ("auto", "unshare") and unshare_available():
        return "unshare"
    if want == "unshare":
        raise SandboxUnavailable(
            "isolation 'unshare' needs root and a working `unshare -n -m -p` on this host; "
            "run as root, use isolation='bwrap' where bubblewrap is installed, or set isolation='none' "
            "and require_isolation=False to run without network isolation"
        )
    if config.require_isolation:
        raise SandboxUnavailable(
            "no network isolation is available here (bubblewrap: "
            f"{bwrap_status()[1]}; unshare: needs root and a permitted `unshare -n -m -p`); "
            "untrusted code would run with network access. Install bubblewrap or run as root, or pass "
            "SandboxConfig(require_isolation=False) to accept isolation 'none'"
        )
    return "none"


#: files of /etc the sandboxed interpreter may read under bwrap (the rest of /etc is absent)
_BWRAP_ETC = ("ld.so.cache", "localtime", "passwd", "group", "nsswitch.conf")
_BWRAP_LAUNCHER = "/run/gfcr/launcher.py"


def _bwrap_args(tmpfs_bytes: int, python_roots: list[str]) -> list[str]:
    """bubblewrap options (before the command) of one sandboxed run; see the module docstring."""
    args = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "gfcr-box", "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:
        # real root: no user namespace; the launcher keeps only what it needs to drop to the run's uid
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                 "--cap-add", "CAP_CHOWN"]
    else:
        args += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in _BWRAP_ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # fresh /proc, /dev and tmpfs first, so an interpreter living under /tmp is bound on top
    args += ["--proc", "/proc", "--dev", "/dev"]
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        args += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", d]
    made: set[str] = set()
    for root in dict.fromkeys(python_roots):
        if (root + os.sep).startswith("/usr/"):
            continue
        # bwrap copies the modes of the source's parents (/root is 0700): make them traversable
        for anc in reversed(Path(root).parents):
            if str(anc) not in ("/", *made) and not str(anc).startswith("/usr"):
                args += ["--perms", "0755", "--dir", str(anc)]
                made.add(str(anc))
        args += ["--ro-bind", root, root]
    args += ["--perms", "0755", "--dir", os.path.dirname(_BWRAP_LAUNCHER),
             "--ro-bind", str(LAUNCHER), _BWRAP_LAUNCHER, "--remount-ro", "/"]
    return args


def _base_python() -> str:
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(exe)


def _closed_ancestor(path: str) -> str | None:
    """Top-most ancestor directory of ``path`` that others may not traverse (no o+x), if any."""
    p = Path(path)
    for anc in reversed(p.parents):  # from "/" downwards
        if str(anc) == "/":
            continue
        try:
            mode = anc.stat().st_mode
        except OSError:
            return None
        if not mode & stat.S_IXOTH:
            return str(anc)
    return None


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap


def _python_root(python: str) -> str:
    """The directory to expose for interpreter ``python``: its install prefix (``<root>/bin/python``)."""
    prefix = os.path.realpath(sys.base_prefix)
    if python.startswith(prefix + os.sep):
        return prefix
    return os.path.dirname(os.path.dirname(os.path.realpath(python)))


def _launch_spec(source: str, files: dict[str, str] | None, cfg: SandboxConfig, isolation: str, python: str,
                 workdir: str) -> tuple[dict[str, Any], dict[str, str], dict[str, int], int | None]:
    """The launcher's spec for one run, the program's environment, its rlimits and the uid it drops
    to (None: no drop)."""
    private = isolation in ("unshare", "bwrap")
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
    }
    mb = 1 << 20
    rlimits = {
        "RLIMIT_CPU": cfg.cpu_s,
        "RLIMIT_AS": cfg.memory_mb * mb,
        "RLIMIT_FSIZE": cfg.file_mb * mb,
        "RLIMIT_NOFILE": cfg.nofile,
        "RLIMIT_CORE": 0,
    }
    root = os.geteuid() == 0
    # as root the launcher drops to a uid of this run's own (RLIMIT_NPROC is per uid: a fork
    # bomb in one run must not starve another); unprivileged bwrap maps the sandbox to
    # `nobody` in a user namespace instead
    uid = RUN_UIDS[secrets.randbelow(len(RUN_UIDS))] if private and root else None
    if not root or uid is not None:
        rlimits["RLIMIT_NPROC"] = cfg.nproc
    prefix = os.path.realpath(sys.base_prefix)
    spec = {
        "program": source,
        "program_name": "main.py",
        "files": files or {},
        "workdir": workdir,
        "private_mounts": isolation == "unshare",
        "tmpfs_bytes": cfg.tmpfs_mb * mb,
        "python_prefix": prefix if python.startswith(prefix + os.sep) else None,
        "closed_ancestor": _closed_ancestor(python) if isolation == "unshare" else None,
        "uid": uid,
        "rlimits": rlimits,
        "argv": [python, "-I"],
        "env": env,
    }
    return spec, env, rlimits, uid


def _command(isolation: str, cfg: SandboxConfig, python: str, spec_fd: int) -> list[str]:
    """The command line that starts the launcher under ``isolation`` (bwrap, unshare or none)."""
    launcher = [_base_python(), "-I", "-S"]
    if isolation == "bwrap":
        roots = [_python_root(_base_python()), _python_root(python)]
        return [shutil.which("bwrap") or "bwrap", *_bwrap_args(cfg.tmpfs_mb * (1 << 20), roots), *launcher,
                _BWRAP_LAUNCHER, str(spec_fd)]
    if isolation == "unshare":
        return [shutil.which("unshare") or "unshare", "-n", "-m", "-p", "--fork", "--mount-proc", "--kill-child",
                *launcher, str(LAUNCHER), str(spec_fd)]
    return [*launcher, str(LAUNCHER), str(spec_fd)]


def _signal_name(rc: int | None) -> str | None:
    """The signal that ended the program, from its exit status (``-N``, or ``128 + N`` from the launcher)."""
    if rc is not None and rc < 0:
        return signal.Signals(-rc).name
    if rc is not None and rc > 128 and rc - 128 < signal.NSIG:
        try:
            return signal.Signals(rc - 128).name
        except ValueError:
            return None
    return None


def run_python(
    source: str,
    stdin: str = "",
    config: SandboxConfig | None = None,
    files: dict[str, str] | None = None,
) -> SandboxResult:
    """Run the Python program ``source`` in the sandbox and return its outcome.

    ``stdin`` is fed to the program; ``files`` ({name: text}) are written next to it in its working
    dir. The caller's process is never the program's parent, shares no session with it, and keeps
    no file the program wrote (its temp dir is removed before returning).
    """
    cfg = config or SandboxConfig()
    isolation = resolve_isolation(cfg)
    python = cfg.python or _base_python()
    host_dir = Path(tempfile.mkdtemp(prefix="gfcr-sbx-"))
    try:
        (host_dir / "stdin").write_text(stdin)
        private = isolation in ("unshare", "bwrap")
        workdir = BOX_DIR if private else str(host_dir / "box")
        spec, env, rlimits, uid = _launch_spec(source, files, cfg, isolation, python, workdir)
        # the spec (program, tests, secrets) travels on an inherited fd of an unlinked file: never on
        # a command line (/proc/*/cmdline is world-readable) nor at a path the program could open
        ready_r, ready_w = os.pipe()  # the program's interpreter writes one byte here when it is up
        spec["ready_fd"] = ready_w
        spec_path = host_dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        spec_fd = os.open(spec_path, os.O_RDONLY)
        spec_path.unlink()
        cmd = _command(isolation, cfg, python, spec_fd)
        out_path, err_path = host_dir / "stdout", host_dir / "stderr"
        timed_out, phase = False, None
        try:
            with open(host_dir / "stdin", "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
                t0 = time.perf_counter()
                proc = subprocess.Popen(
                    cmd, stdin=fin, stdout=fout, stderr=ferr, env=env, start_new_session=True, close_fds=True,
                    pass_fds=(spec_fd, ready_w),
                )
                os.close(ready_w)
                ready_w = -1
                try:
                    startup, phase = _wait_started(proc, ready_r, t0, cfg.startup_s)
                    t1 = time.perf_counter()
                    inits = _identities(_children(proc.pid))  # the namespace inits, while the launcher lives
                    if phase is None:
                        proc.wait(timeout=cfg.wall_s)
                except subprocess.TimeoutExpired:
                    phase = "run"
                finally:
                    _kill_group(proc)
                    # a run that ended by itself: its launcher is gone, so _kill_group saw no children; the
                    # namespace inits it had may still be tearing their namespaces down (a daemon alive
                    # for a moment): wait until each is released
                    _wait_released(inits, timeout_s=5.0)
                timed_out = phase is not None
        finally:
            for fd in (spec_fd, ready_r, ready_w):
                if fd >= 0:
                    os.close(fd)
        wall = time.perf_counter() - t1
        rc = proc.returncode
        stdout, t1 = _read_capped(out_path, cfg.max_output_bytes)
        stderr, t2 = _read_capped(err_path, cfg.max_output_bytes)
        sig = "SIGKILL" if timed_out else _signal_name(rc)
        return SandboxResult(
            returncode=rc if rc is not None else -9,
            stdout=stdout,
            stderr=stderr,
            wall_s=wall,
            timed_out=timed_out,
            signal=sig,
            isolation=isolation,
            truncated=t1 or t2,
            details={"uid": uid if uid is not None else (NOBODY if private else None), "limits": rlimits,
                     "wall_limit_s": cfg.wall_s, "startup_s": startup, "startup_limit_s": cfg.startup_s,
                     "timed_out_in": phase},
        )
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def _wait_started(proc: subprocess.Popen, ready_r: int, t0: float, budget: float) -> tuple[float, str | None]:
    """Wait until the program's interpreter reports it is up (one byte on ``ready_r``), the launcher
    exits, or the start-up ``budget`` (seconds since ``t0``) runs out. Returns ``(start-up seconds,
    "startup" if the budget ran out else None)``. EOF without a byte (the program could not start,
    or the launcher failed) ends the start-up too: the exit status then says what happened."""
    import select

    while True:
        left = t0 + budget - time.perf_counter()
        if left <= 0:
            return time.perf_counter() - t0, "startup"
        ready, _, _ = select.select([ready_r], [], [], min(left, 0.5))
        if ready:
            os.read(ready_r, 1)
            return time.perf_counter() - t0, None
        if proc.poll() is not None:
            return time.perf_counter() - t0, None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the run and everything it started, and return only once it is all gone.

    Under bwrap or unshare the launcher's child is the init of the run's PID namespace: killing it
    makes the kernel kill every process in the namespace (daemons that left the process group
    included) before that init is released. Killing only the launcher's process group would leave
    that to the parent-death signal, which arrives asynchronously: a daemon could then still be
    alive for a moment after this returned (seen under load). So the launcher is stopped first (it
    cannot start another child meanwhile), its children are killed, the group is killed, and the
    children are waited for.
    """
    try:
        os.kill(proc.pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        pass
    kids = _children(proc.pid)
    ids = _identities(kids)
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a SIGKILLed child always exits
        pass
    _wait_released(ids, timeout_s=5.0)


def _children(pid: int) -> list[int]:
    """The direct children of ``pid``, read from /proc (empty where /proc cannot say)."""
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(x) for x in f.read().split()]
        return kids
    except (OSError, ValueError):
        pass
    try:  # kernels without the children file: scan every process's parent
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            kids.append(int(d))
                except (OSError, ValueError, IndexError):
                    pass
    except OSError:
        pass
    return kids


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks): with the pid, a process's identity."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _identities(pids: list[int]) -> list[tuple[int, str]]:
    return [(pid, st) for pid in pids if (st := _start_time(pid)) is not None]


def _wait_released(ids: list[tuple[int, str]], timeout_s: float) -> None:
    """Wait until each process of ``ids`` (pid, start time: :func:`_identities`) has exited: gone, a
    zombie (a PID namespace's init becomes a zombie only after every other process in its namespace
    has been released), or its pid reused by another process since. Never signals anything."""
    deadline = time.monotonic() + timeout_s
    for pid, st in ids:
        while time.monotonic() < deadline and _start_time(pid) == st:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        break
            except (OSError, IndexError):
                break
            time.sleep(0.005)
