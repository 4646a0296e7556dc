"""Test harness run INSIDE the sandbox (as the program), next to ``solution.py`` and ``tests.json``.

It compiles the solution (a SyntaxError is a compile error), runs it, then each test with its own
timer: assert-style tests are executed in the solution's namespace; stdin/stdout cases run the
solution as ``__main__`` with that stdin and compare its stdout (trailing whitespace ignored).
Results go out on a duplicate of fd 1 taken before any untrusted code runs, prefixed with a
per-run nonce; ``tests.json`` is deleted before the solution runs.
"""

import io
import json
import os
import signal
import sys

_out = os.fdopen(os.dup(1), "w")
with open("tests.json") as _f:
    _spec = json.load(_f)
os.remove("tests.json")
_nonce = _spec["nonce"]


def _emit(d):
    _out.write(_nonce + json.dumps(d) + "\n")
    _out.flush()


class _TestTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _TestTimeout()


def _clip(x, n=300):
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[:n] + "..."


def _norm(text):
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _main():
    with open("solution.py") as f:
        src = f.read()
    try:
        code = compile(src, "solution.py", "exec")
    except (SyntaxError, ValueError) as e:
        _emit({"status": "compile_error", "error": f"{type(e).__name__}: {e}", "results": []})
        return
    signal.signal(signal.SIGALRM, _alarm)
    per_test = float(_spec["timeout_s"])
    results = []
    first_failure = None
    real_stdin, real_stdout = sys.stdin, sys.stdout
    if _spec["kind"] == "assert":
        ns = {"__name__": "solution"}
        signal.setitimer(signal.ITIMER_REAL, per_test)
        try:
            exec(code, ns)
        except _TestTimeout:
            _emit({"status": "runtime_error", "error": "timeout while loading the solution", "results": []})
            return
        except BaseException as e:
            _emit({"status": "runtime_error", "error": f"{type(e).__name__}: {_clip(str(e))}", "results": []})
            return
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for i, test in enumerate(_spec["tests"]):
            outcome, err = "pass", None
            signal.setitimer(signal.ITIMER_REAL, per_test)
            try:
                exec(compile(test, f"test_{i}", "exec"), ns)
            except _TestTimeout:
                outcome, err = "timeout", f"timed out after {per_test}s"
            except AssertionError as e:
                outcome, err = "fail", f"AssertionError: {_clip(str(e))}"
            except BaseException as e:
                outcome, err = "error", f"{type(e).__name__}: {_clip(str(e))}"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            results.append(outcome)
            if outcome != "pass" and first_failure is None:
                first_failure = {"index": i, "test": _clip(test), "error": err}
    else:
        for i, case in enumerate(_spec["tests"]):
            buf = io.StringIO()
            sys.stdin, sys.stdout = io.StringIO(case["input"]), buf
            outcome, err = "pass", None
            signal.setitimer(signal.ITIMER_REAL, per_test)
            try:
                exec(code, {"__name__": "__main__"})
            except _TestTimeout:
                outcome, err = "timeout", f"timed out after {per_test}s"
            except SystemExit as e:
                if e.code not in (None, 0):
                    outcome, err = "error", f"SystemExit: {_clip(str(e.code))}"
            except BaseException as e:
                outcome, err = "error", f"{type(e).__name__}: {_clip(str(e))}"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                sys.stdin, sys.stdout = real_stdin, real_stdout
            got = buf.getvalue()
            if outcome == "pass" and _norm(got) != _norm(case["output"]):
                outcome, err = "fail", "wrong output"
            results.append(outcome)
            if outcome != "pass" and first_failure is None:
                first_failure = {
                    "index": i,
                    "input": _clip(case["input"]),
                    "expected": _clip(case["output"]),
                    "got": _clip(got),
                    "error": err,
                }
    if any(r in ("error", "timeout") for r in results):
        status = "runtime_error"
    elif all(r == "pass" for r in results):
        status = "passed"
    else:
        status = "failed"
    _emit({"status": status, "results": results, "first_failure": first_failure})


_main()
