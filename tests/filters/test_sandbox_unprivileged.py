"""The bubblewrap backend from an unprivileged caller (the hosts where `unshare` is refused).

Run as root, this test drops a child Python to uid ``nobody`` (``setpriv``) and uses the sandbox
from there: bwrap must then build the sandbox in a user namespace. Skipped where that cannot be
arranged (not root, no ``setpriv``, no system interpreter of this Python's version, or the project
not readable by ``nobody``), with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

import gfcr
from gfcr.sandbox import bwrap_available

PROBE = r"""
import json, os, sys
from gfcr.sandbox import SandboxConfig, run_python, unshare_available
from gfcr.filters.verifiers import CodeVerifier
out = {"uid": os.geteuid(), "unshare": unshare_available()}
r = run_python("import os, socket; print(os.getuid(), [n for _, n in socket.if_nameindex()]);"
               "print(sorted(os.listdir('/')))", config=SandboxConfig())
out["run"] = [r.isolation, r.returncode, r.stdout, r.stderr[-300:]]
cv = CodeVerifier(timeout_per_test_s=1.0)
tests = ["assert f(2) == 15", "assert f(0) == 1"]
good = cv.verify("def f(x):\n    return x * 7 + 1\n", tests=tests)
bad = cv.verify("import os\nos._exit(0)\n", tests=tests)
out["good"] = [good.passed, good.evidence.get("isolation")]
out["bad"] = [bad.passed, bad.evidence.get("status")]
print("RESULT" + json.dumps(out))
"""


def _system_python() -> str | None:
    want = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for d in ("/usr/bin", "/usr/local/bin"):
        p = Path(d) / want
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a child as uid nobody")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap not installed or not permitted")
def test_bwrap_from_an_unprivileged_caller():
    python = _system_python()
    if python is None:
        pytest.skip("no system interpreter of this Python's version readable by nobody")
    src = str(Path(gfcr.__file__).resolve().parents[1])
    site = str(Path(pydantic.__file__).resolve().parents[1])
    boot = f"import sys; sys.path[:0] = [{src!r}, {site!r}]\n" + PROBE
    r = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", python, "-I", "-c", boot],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/"}, cwd="/",
    )
    if "RESULT" not in r.stdout:
        if "Permission denied" in r.stderr or "ModuleNotFoundError" in r.stderr:
            pytest.skip(f"the project is not usable by uid nobody here: {r.stderr.strip().splitlines()[-1]}")
        pytest.fail(f"probe failed: {r.stderr[-1000:]}")
    out = json.loads(r.stdout.split("RESULT", 1)[1])
    assert out["uid"] == 65534 and out["unshare"] is False  # unshare is refused to this caller
    isolation, rc, stdout, stderr = out["run"]
    assert isolation == "bwrap" and rc == 0, stderr
    uid_line, root_line = stdout.strip().splitlines()
    assert uid_line == "65534 ['lo']"
    listing = json.loads(root_line.replace("'", '"'))
    assert "home" not in listing and "work" not in listing and "root" not in listing  # only what it needs
    assert out["good"] == [True, "bwrap"]
    assert out["bad"] == [False, "runtime_error"]
