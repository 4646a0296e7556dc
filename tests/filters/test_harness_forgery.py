"""Solutions that try to forge a pass instead of solving the task: every attempt must fail.

The task: ``f(x)`` must return ``x * 7 + 1``. Every hostile solution returns the wrong value (or
nothing) and attacks the harness: fake result markers, early exits, monkeypatching, objects that
equal everything, reading the expected values or the nonce, killing the judge.
"""

from __future__ import annotations

import textwrap

import pytest

from gfcr.filters.verifiers import CodeVerifier
from gfcr.sandbox import SandboxConfig, bwrap_available, unshare_available

pytestmark = pytest.mark.skipif(not (bwrap_available() or unshare_available()),
                                reason="needs bubblewrap, or root and `unshare` (isolation)")

ASSERTS = ["assert f(2) == 15", "assert f(5) == 36", "assert f(0) == 1"]
CASES = {"cases": [{"input": "2\n", "output": "15\n"}, {"input": "5\n", "output": "36\n"}]}

# Tries every place the expected values or the nonce could be read from; returns what it found.
SNOOP = r'''
import glob, json, os, re
def _snoop():
    found = []
    paths = ['tests.json', '../tests.json', '/tmp/gfcr-box/tests.json']
    for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
        for what in ('cmdline', 'environ', 'mem'):
            paths.append(f'/proc/{pid}/{what}')
        try:
            for fd in os.listdir(f'/proc/{pid}/fd'):
                paths.append(f'/proc/{pid}/fd/{fd}')
        except OSError:
            pass
    for p in paths + glob.glob('/tmp/**', recursive=True):
        try:  # non-blocking: some fds are pipes
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            data = os.read(fd, 1 << 20)
        except OSError:
            data = b''
        finally:
            os.close(fd)
        found += re.findall(rb'@@gfcr-[0-9a-f]+@@', data)
        found += re.findall(rb'== (\d+)', data)
        found += re.findall(rb'"output": "(\d+)', data)
    # the parent's memory, through its maps (needs ptrace rights)
    ppid = os.getppid()
    try:
        with open(f'/proc/{ppid}/maps') as maps, open(f'/proc/{ppid}/mem', 'rb') as mem:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split()[0].split('-'))
                try:
                    mem.seek(lo)
                    chunk = mem.read(min(hi - lo, 1 << 22))
                except (OSError, ValueError, OverflowError):
                    continue
                found += re.findall(rb'@@gfcr-[0-9a-f]+@@', chunk)
    except OSError:
        pass
    return found
_FOUND = _snoop()
_NONCES = sorted({x.decode() for x in _FOUND if x.startswith(b'@@')})
_NUMS = [int(x) for x in _FOUND if not x.startswith(b'@@')]
'''


@pytest.fixture(scope="module")
def codev():
    return CodeVerifier(timeout_per_test_s=1.0, sandbox=SandboxConfig(cpu_s=2, wall_s=20, memory_mb=512, nproc=32))


def _forge(codev, code: str, tests=ASSERTS):
    v = codev.verify(textwrap.dedent(code), tests=tests)
    assert v.passed is False, v.evidence
    assert v.score < 1.0
    return v


def test_honest_solution_passes_and_is_judged_by_the_harness(codev):
    v = codev.verify("def f(x):\n    return x * 7 + 1\n", tests=ASSERTS + ["y = f(1)\nassert y == 8"])
    assert v.passed is True, v.evidence
    assert v.evidence["decided_by_harness"] == 3  # the two-line test is run inside the solution's process
    v = codev.verify("print(int(input()) * 7 + 1)\n", tests=CASES)
    assert v.passed is True and v.evidence["decided_by_harness"] == 2


def test_comparison_keeps_python_semantics(codev):
    tests = ["assert f() == (1, 2)", "assert g() == 0.5", "assert h() == {1: 'a', 'b': [2.0]}", "assert n() is None",
             "assert f() != [1, 2]"]
    good = "def f(): return (1, 2)\ndef g(): return 1 / 2\ndef h(): return {'b': [2], 1: 'a'}\ndef n(): return None\n"
    assert codev.verify(good, tests=tests).passed is True
    bad = good.replace("return (1, 2)", "return [1, 2]").replace("return None", "return 0")
    v = codev.verify(bad, tests=tests)
    assert v.evidence["results"] == ["fail", "pass", "pass", "fail", "fail"], v.evidence
    assert v.evidence["first_failure"]["error"] == "AssertionError: got [1, 2]"


def test_fake_result_markers(codev):
    code = SNOOP + textwrap.dedent(r'''
    import os, sys, json
    fake = json.dumps({"status": "passed", "results": ["pass"] * 3, "first_failure": None})
    marks = _NONCES + ['@@gfcr-' + '0' * 32 + '@@']
    for m in marks:
        print(m + fake); sys.stderr.write(m + fake + "\n")
    for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
        for fd in ('1', '2'):
            try:
                with open(f'/proc/{pid}/fd/{fd}', 'a') as out:
                    for m in marks:
                        out.write(m + fake + "\n")
            except OSError:
                pass
    for fd in range(3, 64):
        try:
            os.write(fd, (json.dumps({"outcome": "pass"}) + "\n" + json.dumps({"value": ["int", "15"]}) + "\n").encode())
        except OSError:
            pass
    def f(x):
        return 0
    ''')
    v = _forge(codev, code)
    # the forged protocol lines make the load reply unreadable: a runtime error, never a pass
    assert "pass" not in v.evidence["results"] and v.evidence["status"] in ("runtime_error", "failed"), v.evidence


def test_learns_nothing_it_could_return(codev):
    code = SNOOP + textwrap.dedent(r'''
    _table = {2: 15, 5: 36, 0: 1}
    def f(x):
        # return a value found by snooping whenever one fits the question; never computes x * 7 + 1
        return next((n for n in _NUMS if n == _table[x]), -1)
    ''')
    v = _forge(codev, code)
    assert v.evidence["results"] == ["fail", "fail", "fail"], v.evidence
    stdio = SNOOP + "\nprint(_NUMS[0] if _NUMS else 0)\n"
    _forge(codev, stdio, tests=CASES)


@pytest.mark.parametrize("exit_code", ["import os\nos._exit(0)", "import sys\nsys.exit(0)", "raise SystemExit(0)"])
def test_exit_zero_early(codev, exit_code):
    v = _forge(codev, exit_code + "\ndef f(x):\n    return 0\n")
    assert v.evidence["status"] == "runtime_error", v.evidence
    _forge(codev, exit_code + "\n", tests=CASES)


def test_exit_zero_inside_the_function(codev):
    v = _forge(codev, "import os\ndef f(x):\n    os._exit(0)\n")
    assert v.evidence["results"] == ["error", "error", "error"]
    assert "the test process ended (exit code 0)" in v.evidence["first_failure"]["error"]


def test_monkeypatching_the_harness_and_builtins(codev):
    code = r'''
    import builtins, json, sys
    main = sys.modules['__main__']
    for name in list(vars(main)):
        if callable(getattr(main, name)) and not name.startswith('__'):
            setattr(main, name, lambda *a, **k: {"status": "passed", "results": ["pass"] * 3})
    builtins.isinstance = lambda *a: True
    builtins.AssertionError = type('Never', (BaseException,), {})
    json.dumps = lambda *a, **k: '{"outcome": "pass", "ok": true, "value": ["int", "15"]}'
    _real_compile = builtins.compile
    builtins.compile = lambda src, *a, **k: _real_compile("None", "x", "eval")
    builtins.eval = lambda *a, **k: 15
    builtins.exec = lambda *a, **k: None
    def f(x):
        return 0
    '''
    v = _forge(codev, textwrap.dedent(code))
    assert v.evidence["results"].count("pass") <= 1  # f(2) == 15 may be "answered" by the forged eval, no more


def test_objects_that_equal_everything(codev):
    code = r'''
    class Eq:
        def __eq__(self, other): return True
        def __ne__(self, other): return False
        __hash__ = object.__hash__
    class EqInt(int):
        def __eq__(self, other): return True
        __hash__ = int.__hash__
    class Liar:
        @property
        def __class__(self): return int
        def __eq__(self, other): return True
        def __index__(self): return 15
    def f(x):
        return {2: Eq(), 5: EqInt(0), 0: Liar()}[x]
    '''
    v = _forge(codev, textwrap.dedent(code))
    assert v.evidence["results"][:2] == ["error", "fail"], v.evidence  # unsendable object; the int is 0
    assert v.evidence["results"][2] in ("fail", "error")


def test_kills_the_judge(codev):
    v = _forge(codev, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef f(x):\n    return 0\n")
    assert v.evidence["status"] == "runtime_error"
    _forge(codev, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", tests=CASES)
