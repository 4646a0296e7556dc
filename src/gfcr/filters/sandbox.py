"""A hardened sandbox for untrusted Python programs (model-written code under unit tests).

Each run gets:

- a child process in a **new session** (its own process group), killed as a group at the
  wall-clock timeout;
- **rlimits**: CPU seconds, address space, file size, processes, open files, no core dumps;
- a **scrubbed environment** (PATH, HOME, LANG, TMPDIR only) and a fresh working dir as cwd/HOME;
- with isolation ``"unshare"`` (root, where ``unshare`` is permitted): new **network** namespace
  (only ``lo``, which is down), new **mount** namespace (fresh size-limited tmpfs over /tmp,
  /var/tmp, /run/lock, /dev/shm; / remounted read-only; closed directories such as /root hidden),
  new **PID** namespace (when the program ends, every process it left behind is killed by the
  kernel, daemons included) and the program runs as uid ``nobody``, so planted files readable only
  by the caller stay unreadable and the fork-bomb limit (RLIMIT_NPROC) applies.

With isolation ``"none"`` (no root or no ``unshare``) only the rlimits, the scrubbed environment and
the process-group kill apply; the network is *not* cut. The isolation used is recorded in every
:class:`SandboxResult` (and in the code verifier's evidence). ``SandboxConfig.require_isolation``
(default on) refuses to run without isolation instead of silently degrading.

Bubblewrap is not used yet: on this machine kind the unshare path gives the same guarantees as root;
a bwrap backend for non-root hosts is left for later (see docs/filters.md).
"""

from __future__ import annotations

import functools
import json
import os
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

from pydantic import BaseModel, ConfigDict, Field

LAUNCHER = Path(__file__).with_name("_sandbox_launcher.py")
NOBODY = 65534
BOX_DIR = "/tmp/gfcr-box"


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be established on this host."""


class SandboxConfig(BaseModel):
    """Limits and isolation of one sandboxed run."""

    model_config = ConfigDict(extra="forbid")

    cpu_s: int = Field(5, ge=1, le=3600, description="RLIMIT_CPU: CPU seconds before SIGXCPU/SIGKILL.")
    wall_s: float = Field(10.0, gt=0, le=3600, description="Wall-clock limit; the whole process group is killed.")
    memory_mb: int = Field(1024, ge=64, description="RLIMIT_AS: address-space limit of each process, MiB.")
    file_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE: largest file the program may write, MiB (also caps stdout).")
    nproc: int = Field(64, ge=1, description="RLIMIT_NPROC: processes of the sandbox user (only enforced when not root).")
    nofile: int = Field(64, ge=8, description="RLIMIT_NOFILE: open file descriptors.")
    tmpfs_mb: int = Field(64, ge=1, description="Size of each private tmpfs (/tmp, /dev/shm…) under unshare isolation.")
    max_output_bytes: int = Field(1 << 20, ge=1024, description="stdout/stderr kept in the result (rest truncated).")
    isolation: Literal["auto", "unshare", "none"] = Field(
        "auto", description="auto: unshare when permitted, else none. unshare: fail if not permitted."
    )
    require_isolation: bool = Field(
        True, description="Refuse to run (SandboxUnavailable) when only isolation 'none' is possible."
    )
    python: str | None = Field(
        None, description="Interpreter for the program; default: the base interpreter of this Python, run with -I."
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


def resolve_isolation(config: SandboxConfig) -> str:
    """The isolation a run with ``config`` will use; raises :class:`SandboxUnavailable` if refused."""
    if config.isolation in ("auto", "unshare") and unshare_available():
        return "unshare"
    if config.isolation == "unshare":
        raise SandboxUnavailable(
            "isolation 'unshare' needs root and a working `unshare -n -m -p` on this host; "
            "run as root, or set isolation='none' and require_isolation=False to run without network isolation"
        )
    if config.require_isolation:
        raise SandboxUnavailable(
            "no network isolation is available here (not root, or `unshare` is not permitted); "
            "untrusted code would run with network access. Run as root, or pass "
            "SandboxConfig(require_isolation=False) to accept isolation 'none'"
        )
    return "none"


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
        prog = host_dir / "program.py"
        prog.write_text(source)
        (host_dir / "stdin").write_text(stdin)
        private = isolation == "unshare"
        workdir = BOX_DIR if private else str(host_dir / "box")
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
        uid = NOBODY if private else None
        if os.geteuid() != 0 or uid is not None:
            rlimits["RLIMIT_NPROC"] = cfg.nproc
        prefix = os.path.realpath(sys.base_prefix)
        spec = {
            "program": str(prog),
            "program_name": "main.py",
            "files": files or {},
            "workdir": workdir,
            "private_mounts": private,
            "tmpfs_bytes": cfg.tmpfs_mb * mb,
            "python_prefix": prefix if python.startswith(prefix + os.sep) else None,
            "closed_ancestor": _closed_ancestor(python) if private else None,
            "uid": uid,
            "rlimits": rlimits,
            "argv": [python, "-I"],
            "env": env,
        }
        cmd = [_base_python(), "-I", "-S", str(LAUNCHER), json.dumps(spec)]
        if private:
            cmd = [shutil.which("unshare") or "unshare", "-n", "-m", "-p", "--fork", "--mount-proc", "--kill-child", *cmd]
        out_path, err_path = host_dir / "stdout", host_dir / "stderr"
        t0 = time.perf_counter()
        timed_out = False
        with open(host_dir / "stdin", "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            proc = subprocess.Popen(
                cmd, stdin=fin, stdout=fout, stderr=ferr, env=env, start_new_session=True, close_fds=True
            )
            try:
                proc.wait(timeout=cfg.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        wall = time.perf_counter() - t0
        rc = proc.returncode
        stdout, t1 = _read_capped(out_path, cfg.max_output_bytes)
        stderr, t2 = _read_capped(err_path, cfg.max_output_bytes)
        sig = None
        if timed_out:
            sig = "SIGKILL"
        elif rc is not None and rc < 0:
            sig = signal.Signals(-rc).name
        elif rc is not None and rc > 128 and rc - 128 < signal.NSIG:
            try:
                sig = signal.Signals(rc - 128).name
            except ValueError:
                sig = None
        return SandboxResult(
            returncode=rc if rc is not None else -9,
            stdout=stdout,
            stderr=stderr,
            wall_s=wall,
            timed_out=timed_out,
            signal=sig,
            isolation=isolation,
            truncated=t1 or t2,
            details={"uid": uid, "limits": rlimits, "wall_limit_s": cfg.wall_s},
        )
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the run's whole process group and reap the launcher."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a SIGKILLed child always exits
        pass
