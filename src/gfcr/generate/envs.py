"""Environments for multi-turn rollouts: an ``Env`` Protocol and two built-in tool envs.

``reset(task) -> observation`` returns an optional instruction shown before the first turn (added
to the system message); ``step(action_text) -> (observation, done, info)`` reacts to one assistant
turn. Observations become context tokens (see :class:`gfcr.generate.topologies.MultiTurn`).

==============  ======================================================================
name            env
==============  ======================================================================
``calculator``  :class:`CalculatorEnv`: ``<calc>2 * (3 + 4)</calc>`` → ``<result>14</result>``
``python``      :class:`PythonEnv`: a ```python block is run in the code sandbox → its output
==============  ======================================================================
"""

from __future__ import annotations

import ast
import operator
import re
import subprocess
import sys
from typing import Any, Protocol, runtime_checkable

from gfcr.records import Prompt


@runtime_checkable
class Env(Protocol):
    """A multi-turn environment; one instance per episode."""

    name: str

    def reset(self, task: Prompt) -> str | None: ...

    def step(self, action_text: str) -> tuple[str | None, bool, dict[str, Any]]: ...


_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def safe_eval(expr: str, max_pow: int = 64, max_abs: float = 1e18) -> int | float:
    """Evaluate an arithmetic expression (numbers, ``+ - * / // % **``, parentheses) without ``eval``."""

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(b) > max_pow:
                raise ValueError(f"exponent {b} too large")
            v = _OPS[type(node.op)](a, b)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            v = _OPS[type(node.op)](ev(node.operand))
        else:
            raise ValueError(f"unsupported syntax: {type(node).__name__}")
        if abs(v) > max_abs:
            raise ValueError("result too large")
        return v

    return ev(ast.parse(expr.strip(), mode="eval"))


def _fmt(v: int | float) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(round(v, 10)) if isinstance(v, float) else str(v)


class CalculatorEnv:
    """A calculator tool. Each ``<calc>EXPR</calc>`` in a turn is evaluated and answered with
    ``<result>VALUE</result>`` (or ``<error>...</error>``); a turn without a call ends the episode."""

    name = "calculator"
    TAG = re.compile(r"<calc>(.*?)</calc>", re.S)
    INSTRUCTION = "You can use a calculator: write <calc>EXPRESSION</calc> and the result is returned in <result>...</result>."

    def __init__(self, max_calls: int = 8):
        self.max_calls = max_calls
        self.calls = 0

    def reset(self, task: Prompt) -> str | None:
        self.calls = 0
        return self.INSTRUCTION

    def step(self, action_text: str) -> tuple[str | None, bool, dict[str, Any]]:
        exprs = self.TAG.findall(action_text)
        if not exprs:
            return None, True, {"calls": 0}
        outs = []
        for x in exprs:
            self.calls += 1
            if self.calls > self.max_calls:
                return "<error>too many calculator calls</error>", True, {"calls": len(exprs), "limit": True}
            try:
                outs.append(f"<result>{_fmt(safe_eval(x))}</result>")
            except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as e:
                outs.append(f"<error>{type(e).__name__}: {e}</error>")
        return "\n".join(outs), False, {"calls": len(exprs)}


class PythonEnv:
    """A Python tool. The last ```python block of a turn is run (in ``gfcr.filters.sandbox`` when
    it is installed, else in a subprocess with a timeout) and its stdout/stderr come back as
    ``<output>...</output>``; a turn without a code block ends the episode."""

    name = "python"
    BLOCK = re.compile(r"```python\n(.*?)```", re.S)
    INSTRUCTION = "You can run Python: write a ```python code block and its output is returned in <output>...</output>."

    def __init__(self, timeout_s: float = 10.0, max_output: int = 2000, sandbox: dict[str, Any] | None = None):
        self.timeout_s = timeout_s
        self.max_output = max_output
        self.sandbox = sandbox

    def reset(self, task: Prompt) -> str | None:
        return self.INSTRUCTION

    def run(self, code: str) -> tuple[str, dict[str, Any]]:
        try:
            from gfcr.filters.sandbox import SandboxConfig, run_python
        except ImportError:
            run_python = None
        if run_python is not None:
            cfg = SandboxConfig(**({"wall_s": self.timeout_s} | (self.sandbox or {})))
            r = run_python(code, config=cfg)
            out = (r.stdout or "") + (r.stderr or "")
            return out, {"returncode": r.returncode, "timed_out": r.timed_out, "runner": "sandbox", "isolation": r.isolation}
        try:
            p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=self.timeout_s)
            return p.stdout + p.stderr, {"returncode": p.returncode, "timed_out": False, "runner": "subprocess"}
        except subprocess.TimeoutExpired:
            return f"TimeoutError: ran longer than {self.timeout_s}s", {"returncode": None, "timed_out": True, "runner": "subprocess"}

    def step(self, action_text: str) -> tuple[str | None, bool, dict[str, Any]]:
        blocks = self.BLOCK.findall(action_text)
        if not blocks:
            return None, True, {"ran": False}
        out, info = self.run(blocks[-1])
        if len(out) > self.max_output:
            out = out[: self.max_output] + "\n...[truncated]"
        return f"<output>\n{out}</output>", False, info | {"ran": True}


ENVS: dict[str, type] = {"calculator": CalculatorEnv, "python": PythonEnv}


def make_env(name: str, **kw: Any) -> Env:
    """A new env instance by name (``ENVS``) or import path ``pkg.mod:Class``."""
    if name in ENVS:
        return ENVS[name](**kw)
    if ":" in name:
        import importlib

        mod, _, cls = name.partition(":")
        return getattr(importlib.import_module(mod), cls)(**kw)
    raise ValueError(f"unknown env {name!r}; choose one of {sorted(ENVS)} or give 'pkg.module:Class'")
