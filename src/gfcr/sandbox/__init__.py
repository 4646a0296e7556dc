"""Process isolation for untrusted code: model output run by the code verifier and by tool envs.

:func:`run_python` runs a program under rlimits, with no network (bubblewrap, else ``unshare -n``),
in a throw-away directory, as a spare uid where it can; :mod:`~gfcr.sandbox.process` says how.
``_code_harness.py`` and ``_code_child.py`` are the test harness the code verifier runs inside it.
"""

from pathlib import Path

from gfcr.sandbox.process import (
    RUN_UIDS,
    SandboxConfig,
    SandboxResult,
    SandboxUnavailable,
    bwrap_available,
    bwrap_status,
    resolve_isolation,
    run_python,
    unshare_available,
)

#: the code verifier's harness and its per-test child, run inside the sandbox (read as text)
CODE_HARNESS = Path(__file__).with_name("_code_harness.py")
CODE_CHILD = Path(__file__).with_name("_code_child.py")

__all__ = ["CODE_CHILD", "CODE_HARNESS", "RUN_UIDS", "SandboxConfig", "SandboxResult", "SandboxUnavailable",
           "bwrap_available", "bwrap_status", "resolve_isolation", "run_python", "unshare_available"]
