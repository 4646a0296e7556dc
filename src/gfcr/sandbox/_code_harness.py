"""Test harness run INSIDE the sandbox (as the program), next to ``solution.py``, ``tests.json`` and
``child.py``. It never runs the solution itself: it is the trusted judge.

1. It reads the tests (with the expected values and the per-run result nonce) and the child runner,
   deletes both files, and makes itself non-dumpable, all before any untrusted code exists; so the
   solution can neither read the expected values nor ptrace this process or open its memory/fds.
2. It compiles the solution (a SyntaxError is a compile error; nothing is executed).
3. Assert tests run in a fresh child interpreter (``child.py``; exec'ed, never forked, so it holds
   no secret) that loads the solution once and runs the tests in order in its namespace. A test of
   the form ``assert EXPR == LITERAL`` (also ``!=``, and ``is``/``is not`` None/True/False) is
   split: the child evaluates only ``EXPR`` and sends its value as plain data; the comparison with
   the literal happens here, so no solution can forge it (it never sees the literal, and an object
   that "equals everything" cannot be sent). Other assert statements are run whole in the child,
   which reports their outcome: those are decided inside the solution's process.
4. Stdin/stdout cases run the solution as ``__main__`` in a fresh process per case; its stdout is
   compared here (trailing whitespace ignored); the child never sees the expected output.
5. Every wait has a deadline: a child that overruns is killed (with its process group) and, for
   assert tests, a new child reloads the solution for the remaining tests.
6. Time limits measure the test, not the interpreter: each fresh interpreter first reports that it
   is up (within its own start-up budget, ``startup_s``), and only then does a test's clock start.
   A test's limit ``timeout_s`` is CPU time of the process running it (read from
   ``/proc/<pid>/stat``), so a correct solution keeps its verdict on a loaded machine; a wall-clock
   backstop of ``WALL_FACTOR × timeout_s`` catches tests that sleep or block. Where ``/proc`` cannot
   be read the limit falls back to wall time.

Only this process writes to the sandbox's stdout (children get pipes): the report is one line,
prefixed with the nonce.
"""

import ast
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

with open("tests.json") as _f:
    _spec = json.load(_f)
os.remove("tests.json")
with open("child.py") as _f:
    _CHILD = _f.read()
os.remove("child.py")
ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
_nonce = _spec.pop("nonce")
_PER_TEST = float(_spec["timeout_s"])
_STARTUP = float(_spec.get("startup_s", 30.0))
WALL_FACTOR = 4.0
_CLK = os.sysconf("SC_CLK_TCK")
_startup_total = [0.0, 0]  # seconds spent starting interpreters, how many
#: a case process's first code: report "up" on the pipe, close it, run the solution as __main__
_BOOT = ("import os, sys, runpy\nos.write({fd}, b'1')\nos.close({fd})\ndel os\n"
         "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
_MAX_LINE = 8 << 20
_MAX_OUT = 8 << 20


def _emit(d):
    sys.stdout.write(_nonce + json.dumps(d) + "\n")
    sys.stdout.flush()


def _clip(x, n=300):
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[:n] + "..."


def _norm(text):
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _cpu_seconds(pid):
    """User + system CPU seconds of process ``pid`` (all its threads), or None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _CLK
    except (OSError, ValueError, IndexError):
        return None


class _Clock:
    """A test's limit: ``limit`` CPU seconds of ``pid`` since start, or ``WALL_FACTOR × limit`` wall
    seconds, whichever comes first (wall ``limit`` alone when the CPU time cannot be read)."""

    def __init__(self, pid, limit):
        self.pid, self.limit = pid, limit
        self.t0, self.cpu0 = time.monotonic(), _cpu_seconds(pid)

    def expired(self):
        wall = time.monotonic() - self.t0
        if self.cpu0 is None:
            return wall > self.limit
        cpu = _cpu_seconds(self.pid)
        return wall > WALL_FACTOR * self.limit or (cpu is not None and cpu - self.cpu0 > self.limit)

    def wait_s(self):
        """How long to sleep before looking again."""
        return max(0.0, min(0.05, self.t0 + WALL_FACTOR * self.limit - time.monotonic()))


def _wait_up(fd, proc):
    """Wait (start-up budget) for a fresh interpreter's first line/byte on ``fd``; True when it came."""
    t0 = time.monotonic()
    while True:
        left = t0 + _STARTUP - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            _startup_total[0] += time.monotonic() - t0
            _startup_total[1] += 1
            return True
        if proc.poll() is not None:
            return False


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.kill()
    except OSError:
        pass
    proc.wait()


# --- assert tests: split "assert EXPR == LITERAL" -------------------------------------------------

_SINGLETONS = (None, True, False)


def split_test(test):
    """``(expr, op, expected)`` when ``test`` is one ``assert`` comparing an expression with a literal."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    cmp = tree.body[0].test
    if not isinstance(cmp, ast.Compare) or len(cmp.ops) != 1:
        return None
    op = type(cmp.ops[0]).__name__
    if op not in ("Eq", "NotEq", "Is", "IsNot"):
        return None
    left, right = cmp.left, cmp.comparators[0]
    for expr, lit in ((left, right), (right, left)):
        try:
            expected = ast.literal_eval(lit)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if op in ("Is", "IsNot") and not any(expected is s for s in _SINGLETONS):
            return None
        return ast.unparse(expr), op, expected
    return None


def _dec(v, depth=0):
    """Decode the child's tagged value into plain builtins (ValueError on anything malformed)."""
    if depth > 250 or not isinstance(v, list) or not v or not isinstance(v[0], str):
        raise ValueError("malformed value")
    tag = v[0]
    if tag == "none":
        return None
    x = v[1]
    if tag == "bool" and isinstance(x, bool):
        return x
    if tag == "int" and isinstance(x, str):
        return int(x)
    if tag == "float" and isinstance(x, str):
        return float(x)
    if tag == "complex" and isinstance(x, list) and len(x) == 2:
        return complex(float(x[0]), float(x[1]))
    if tag == "str" and isinstance(x, str):
        return x
    if tag == "bytes" and isinstance(x, str):
        return bytes.fromhex(x)
    if tag in ("list", "tuple", "set", "frozenset") and isinstance(x, list):
        items = [_dec(i, depth + 1) for i in x]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" and isinstance(x, list):
        return {_dec(k, depth + 1): _dec(val, depth + 1) for k, val in x}
    raise ValueError(f"malformed value tag {tag!r}")


def compare(got, op, expected):
    """The assertion, decided here on plain data."""
    if op == "Eq":
        return got == expected
    if op == "NotEq":
        return got != expected
    if op == "Is":
        return got is expected
    return got is not expected


class Child:
    """A fresh interpreter running child.py; JSON lines over pipes, every read with a deadline."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
        )
        self.buf = b""
        self.up = _wait_up(self.proc.stdout.fileno(), self.proc)  # its first line says it is up
        if self.up:
            self._line(None)

    def ask(self, req, timeout):
        """The reply dict, or ``("timeout"|"died"|"garbled", message)``."""
        if not self.up:
            self.close()
            return ("died", f"the test process did not start within {_STARTUP}s")
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            return self._died()
        return self._line(_Clock(self.proc.pid, timeout))

    def _line(self, clock):
        """The next JSON line (the start-up line when ``clock`` is None: no limit but the budget)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            if clock is not None and clock.expired():
                self.close()
                return ("timeout", f"timed out after {clock.limit}s")
            ready, _, _ = select.select([fd], [], [], clock.wait_s() if clock is not None else _STARTUP)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return self._died()
            self.buf += chunk
            if len(self.buf) > _MAX_LINE:
                self.close()
                return ("garbled", "reply too large")
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):
            return ("garbled", "unreadable reply from the test process")
        return reply if isinstance(reply, dict) else ("garbled", "unreadable reply from the test process")

    def _died(self):
        self.close()
        code = self.proc.returncode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        return ("died", f"the test process ended ({how})")

    def close(self):
        _kill(self.proc)


def _load(source):
    """A child with the solution loaded, or ``(None, error)``."""
    child = Child()
    reply = child.ask({"op": "load", "source": source}, _PER_TEST)
    if isinstance(reply, tuple):
        what = "timeout while loading the solution" if reply[0] == "timeout" else reply[1]
        return None, what
    if not reply.get("ok"):
        child.close()
        return None, str(reply.get("error", "the solution failed to load"))
    return child, None


def run_asserts(source, tests):
    results, trusted, first_failure = [], [], None
    child, err = _load(source)
    if child is None:
        return {"status": "runtime_error", "error": err, "results": []}
    for i, test in enumerate(tests):
        if child is None:
            child, err = _load(source)
            if child is None:
                outcome, msg = "error", f"could not reload the solution: {err}"
                results.append(outcome)
                trusted.append(False)
                first_failure = first_failure or {"index": i, "test": _clip(test), "error": msg}
                continue
        split = split_test(test)
        req = {"op": "value", "expr": split[0], "i": i} if split else {"op": "exec", "code": test, "i": i}
        reply = child.ask(req, _PER_TEST)
        outcome, msg = "pass", None
        if isinstance(reply, tuple):
            outcome = "timeout" if reply[0] == "timeout" else "error"
            msg = reply[1]
            child.close()  # timed out, died or out of step: the remaining tests get a fresh child
            child = None
        elif "error" in reply:
            outcome = "fail" if reply.get("error_type") == "AssertionError" else "error"
            msg = str(reply["error"])
        elif split:
            try:
                got = _dec(reply["value"])
            except (KeyError, ValueError, TypeError, OverflowError, RecursionError):
                outcome, msg = "error", "malformed value from the test process"
            else:
                if not compare(got, split[1], split[2]):
                    outcome, msg = "fail", f"AssertionError: got {_clip(got)}"
        elif reply.get("outcome") != "pass":
            outcome, msg = "error", "unexpected reply from the test process"
        results.append(outcome)
        trusted.append(bool(split))
        if outcome != "pass" and first_failure is None:
            first_failure = {"index": i, "test": _clip(test), "error": msg}
    if child is not None:
        child.close()
    return _summary(results, first_failure, trusted)


# --- stdin/stdout cases -----------------------------------------------------------------------


def run_case(case_input):
    """Run solution.py as __main__ on ``case_input``; ``(stdout, error or None)``. The clock starts
    when the case's interpreter reports it is up (see :data:`_BOOT`)."""
    with open(".case-in", "w") as f:
        f.write(case_input)
    up_r, up_w = os.pipe()
    with open(".case-in", "rb") as fin, open(".case-err", "wb") as ferr:
        proc = subprocess.Popen([sys.executable, "-I", "-c", _BOOT.format(fd=up_w), "solution.py"], stdin=fin,
                                stdout=subprocess.PIPE, stderr=ferr, start_new_session=True, close_fds=True,
                                pass_fds=(up_w,))
    os.close(up_w)
    up = _wait_up(up_r, proc)
    os.close(up_r)
    fd = proc.stdout.fileno()
    out, err = b"", None
    clock = _Clock(proc.pid, _PER_TEST)
    if not up and proc.poll() is None:
        err = f"the case process did not start within {_STARTUP}s"
    while err is None:
        if clock.expired():
            err = f"timed out after {_PER_TEST}s"
            break
        ready, _, _ = select.select([fd], [], [], clock.wait_s())
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        out += chunk
        if len(out) > _MAX_OUT:
            err = "output too large"
            break
    while err is None and proc.poll() is None:  # stdout closed: wait for the exit, on the same clock
        if clock.expired():
            err = f"timed out after {_PER_TEST}s"
        else:
            time.sleep(clock.wait_s())
    _kill(proc)
    proc.stdout.close()
    if err is None and proc.returncode != 0:
        with open(".case-err", "rb") as f:
            tail = f.read()[-2000:].decode("utf-8", errors="replace").strip().splitlines()
        err = tail[-1] if tail else f"exit code {proc.returncode}"
    return out.decode("utf-8", errors="replace"), err


def run_cases(cases):
    results, first_failure = [], None
    for i, case in enumerate(cases):
        got, err = run_case(case["input"])
        if err is not None:
            outcome = "timeout" if err.startswith("timed out") else "error"
        else:
            outcome = "pass" if _norm(got) == _norm(case["output"]) else "fail"
            err = None if outcome == "pass" else "wrong output"
        results.append(outcome)
        if outcome != "pass" and first_failure is None:
            first_failure = {"index": i, "input": _clip(case["input"]), "expected": _clip(case["output"]),
                             "got": _clip(got), "error": err}
    return _summary(results, first_failure, [True] * len(results))


def _summary(results, first_failure, trusted):
    if any(r in ("error", "timeout") for r in results):
        status = "runtime_error"
    elif all(r == "pass" for r in results):
        status = "passed"
    else:
        status = "failed"
    return {"status": status, "results": results, "first_failure": first_failure,
            "decided_by_harness": sum(trusted), "startup_s": round(_startup_total[0], 3),
            "interpreters_started": _startup_total[1]}


def _main():
    with open("solution.py") as f:
        src = f.read()
    try:
        compile(src, "solution.py", "exec")
    except (SyntaxError, ValueError) as e:
        _emit({"status": "compile_error", "error": f"{type(e).__name__}: {e}", "results": []})
        return
    if _spec["kind"] == "assert":
        _emit(run_asserts(src, _spec["tests"]))
    else:
        _emit(run_cases(_spec["tests"]))


_main()
