"""Test child run INSIDE the sandbox by the code harness: the only process that runs the solution.

Started fresh (``python -I -c <this source>``, never forked from the harness, so it inherits none of
the harness's memory: no expected values, no result nonce). It speaks JSON lines with the harness
on private duplicates of fd 0/1; the solution's own stdin/stdout are /dev/null. Its first line,
``{"up": true}``, tells the harness the interpreter has started (start-up is not a test's time).
Requests:

- ``{"op": "load", "source": ...}``: run the solution in a fresh namespace;
- ``{"op": "value", "expr": ...}``: evaluate an expression and send its value back, encoded as plain
  data (the harness compares it with the expected value, which this process never sees);
- ``{"op": "exec", "code": ...}``: run a general test statement and report pass / fail / error.

Nothing here is trusted by the harness: whatever this process sends is only data.
"""

import json
import os
import sys

_DEPTH = 200


def _enc(x, depth=0):
    """Tagged plain-data encoding of ``x`` (builtins only); TypeError for anything else."""
    if depth > _DEPTH:
        raise TypeError("value nested too deeply to compare")
    if x is None:
        return ["none"]
    if isinstance(x, bool):
        return ["bool", bool(x)]
    if isinstance(x, int):
        return ["int", str(int.__index__(x))]
    if isinstance(x, float):
        return ["float", float.__repr__(float(x))]
    if isinstance(x, complex):
        return ["complex", [float.__repr__(x.real), float.__repr__(x.imag)]]
    if isinstance(x, str):
        return ["str", str.__str__(x)]
    if isinstance(x, bytes | bytearray):
        return ["bytes", bytes(x).hex()]
    kinds = ((list, "list"), (tuple, "tuple"), (frozenset, "frozenset"), (set, "set"))
    for cls, tag in kinds:
        if isinstance(x, cls):
            return [tag, [_enc(v, depth + 1) for v in cls.__iter__(x)]]
    if isinstance(x, dict):
        return ["dict", [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in dict.items(x)]]
    mod = type(x).__module__ or ""
    if mod.split(".")[0] == "numpy" and hasattr(x, "tolist"):
        return _enc(x.tolist(), depth + 1)
    raise TypeError(f"a value of type {type(x).__name__} cannot be compared outside the solution's process")


def _clip(x, n=300):
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= n else s[:n] + "..."


def _main():
    proto_in = os.fdopen(os.dup(0), "r")
    proto_out = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    ns = {"__name__": "solution"}
    proto_out.write('{"up": true}\n')  # the interpreter is up: the harness starts the test clocks now
    proto_out.flush()
    for line in proto_in:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "load":
                exec(compile(req["source"], "solution.py", "exec"), ns)
                reply = {"ok": True}
            elif op == "value":
                value = eval(compile(req["expr"], f"test_{req['i']}", "eval"), ns)
                reply = {"value": _enc(value)}
            else:
                exec(compile(req["code"], f"test_{req['i']}", "exec"), ns)
                reply = {"outcome": "pass"}
        except BaseException as e:  # the solution's failure, reported as data
            reply = {"error": f"{type(e).__name__}: {_clip(str(e))}", "error_type": type(e).__name__}
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: S110 - the solution may have broken its own stdout; irrelevant here
            pass
        proto_out.write(json.dumps(reply) + "\n")
        proto_out.flush()


_main()
