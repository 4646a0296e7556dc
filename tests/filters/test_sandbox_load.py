"""Verdicts under heavy CPU load: the sandbox and the code harness time the program and the test,
not the interpreter start-up, and a test's limit is CPU time, so correct code keeps its verdict.

The load is synthetic and bounded: ``4 × cores`` busy Python processes (no network at all), each of
which stops by itself after ``LOAD_S`` seconds and is killed when the test ends.
"""

import os
import subprocess
import sys
import time

import pytest

from gfcr.filters.verifiers import CodeVerifier
from gfcr.sandbox import SandboxConfig, SandboxUnavailable, resolve_isolation, run_python

LOAD_S = 90
BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


def _isolated() -> bool:
    try:
        return resolve_isolation(SandboxConfig()) != "none"
    except SandboxUnavailable:
        return False


pytestmark = pytest.mark.skipif(not _isolated(), reason="no sandbox isolation (bwrap/unshare) on this host")


@pytest.fixture(scope="module")
def cpu_load():
    n = 4 * (os.cpu_count() or 2)
    procs = [subprocess.Popen([sys.executable, "-c", BUSY.format(s=LOAD_S)]) for _ in range(n)]
    time.sleep(1.0)
    try:
        yield n
    finally:
        for p in procs:
            p.kill()
            p.wait()


SOLUTION = "def add(a, b):\n    return a + b\n\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
TESTS = ["assert add(2, 3) == 5", "assert fib(30) == 832040", "assert add(-1, 1) == 0"]


def test_startup_is_measured_apart_from_the_program_time(cpu_load):
    # 0.5 s for the program alone: interpreter start-up under this load takes longer than that
    res = run_python("print(sum(range(1000)))", config=SandboxConfig(wall_s=0.5, startup_s=60))
    assert res.ok and res.stdout.strip() == "499500", res
    assert res.details["startup_s"] > 0 and res.details["timed_out_in"] is None
    # a program that overruns its own wall clock is still stopped, and the phase is named
    slow = run_python("import time\ntime.sleep(30)", config=SandboxConfig(wall_s=0.5, startup_s=60))
    assert slow.timed_out and slow.details["timed_out_in"] == "run" and slow.wall_s < 10


def test_correct_solution_passes_every_time_under_load(cpu_load):
    cv = CodeVerifier(timeout_per_test_s=0.5, sandbox=SandboxConfig(wall_s=30, startup_s=60))
    verdicts = [cv.verify(f"```python\n{SOLUTION}```", tests=TESTS) for _ in range(4)]
    assert [v.passed for v in verdicts] == [True] * 4, [v.evidence for v in verdicts]
    assert all(v.score == 1.0 for v in verdicts)
    io = cv.verify("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n",
                   tests={"cases": [{"input": "1 2 3\n", "output": "6\n"}, {"input": "10 20\n", "output": "30\n"}]})
    assert io.passed, io.evidence


def test_limits_still_bite_under_load(cpu_load):
    cv = CodeVerifier(timeout_per_test_s=0.5, sandbox=SandboxConfig(wall_s=30, startup_s=60))
    spin = cv.verify("def f():\n    while True:\n        pass\n", tests=["assert f() == 1", "assert 1 == 1"])
    assert spin.passed is False and spin.evidence["results"][0] == "timeout"
    assert spin.evidence["results"][1] == "pass"  # a fresh child ran the next test
    nap = cv.verify("import time\ndef f():\n    time.sleep(60)\n", tests=["assert f() is None"])
    assert nap.passed is False and nap.evidence["results"] == ["timeout"]  # the wall backstop
