"""Environments for multi-turn rollouts: an ``Env`` Protocol and two built-in tool envs.

``reset(task) -> observation`` returns an optional instruction shown before the first turn (added
to the system message); ``step(action_text) -> (observation, done, info)`` reacts to one assistant
turn. Observations become context tokens (see :class:`gfcr.generate.topologies.MultiTurn`).

**Success signal (optional).** An env that can judge the episode says so in ``info``:
``info["success"]`` (bool) and/or ``info["reward"]`` (finite float), usually on the step that ends
the episode. The latest reported values are the episode's (:func:`env_signal`); ``MultiTurn``
stores them as ``signals["env_reward"]`` (the reward, else ``float(success)``) and
``meta["env_success"]``. An env that cannot judge reports neither key, and the rollout gets
neither field. The built-in envs judge only when the task has a gold ``answer``: on the turn that
ends the episode they read a final ``<answer>X</answer>`` (else an ``Answer: X`` line) and compare
it with the gold (:func:`judge_final_answer`). How the training loop turns the signal into a
reward is :func:`episode_reward` (``verify.reward_source``).

==============  ======================================================================
name            env
==============  ======================================================================
``calculator``  :class:`CalculatorEnv`: ``<calc>2 * (3 + 4)</calc>`` → ``<result>14</result>``
``python``      :class:`PythonEnv`: a ```python block is run in the code sandbox → its output
``retry``       :class:`RetryEnv`: a wrong answer gets "That is not correct. Try again."
==============  ======================================================================
"""

from __future__ import annotations

import ast
import math
import operator
import re
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from gfcr.records import Message, Prompt


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


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ANSWER_LINE = re.compile(r"(?im)^\s*answer\s*:\s*(.+?)\s*$")


def final_answer(text: str) -> str | None:
    """The answer a turn states: the last ``<answer>X</answer>``, else the last ``Answer: X`` line, else None.

    Examples: ``"so <answer> 14 </answer>"`` → ``"14"``; ``"work\nAnswer: 1,024"`` → ``"1,024"``;
    ``"it is 14"`` → None (no last-number guess: an env judges only an explicit answer).
    """
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    lines = _ANSWER_LINE.findall(text)
    return lines[-1].strip() if lines else None


def _number(s: str) -> float | None:
    try:
        v = float(s.replace(",", "").replace(" ", "").rstrip("."))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def answers_match(pred: str, gold: str) -> bool:
    """Numbers compare by value (``"1,024"`` = ``"1024.0"``, relative tolerance 1e-9); anything else
    compares as case-folded text with surrounding whitespace removed."""
    a, b = _number(pred), _number(str(gold))
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return pred.strip().casefold() == str(gold).strip().casefold()


def judge_final_answer(text: str, gold: str | None) -> dict[str, Any]:
    """The ``info`` keys a built-in env adds on its last step: ``{}`` without a gold answer (it cannot
    judge), else ``{"success": bool, "answer": str | None}``; no stated answer is a failure."""
    if gold is None:
        return {}
    pred = final_answer(text)
    return {"success": pred is not None and answers_match(pred, gold), "answer": pred}


def env_signal(infos: Sequence[dict[str, Any]], env: str = "env") -> tuple[float | None, bool | None]:
    """The episode's ``(env_reward, env_success)`` from the ``info`` dicts of its steps, in order.

    The latest step that reports a key wins; ``env_reward`` defaults to ``float(success)`` when only
    success is reported; ``(None, None)`` when nothing is reported. A reward that is not a finite
    number or a success that is not a bool raises ``ValueError`` naming ``env``.
    Example: ``[{"calls": 1}, {"success": True}]`` → ``(1.0, True)``;
    ``[{"reward": 0.2}, {"reward": 0.7}]`` → ``(0.7, None)``.
    """
    reward: float | None = None
    success: bool | None = None
    for info in infos:
        if not isinstance(info, dict):
            continue
        if info.get("reward") is not None:
            r = info["reward"]
            if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(float(r)):
                raise ValueError(f"env {env!r} reported info['reward'] = {r!r}; it must be a finite number")
            reward = float(r)
        if info.get("success") is not None:
            ok = info["success"]
            if not isinstance(ok, bool):
                raise ValueError(f"env {env!r} reported info['success'] = {ok!r}; it must be True or False")
            success = ok
    if reward is None and success is not None:
        reward = float(success)
    return reward, success


#: where a multi-turn episode's reward comes from (``verify.reward_source`` in the training config)
RewardSource = Literal["verifier", "env", "env_or_verifier", "weighted"]
REWARD_SOURCES: tuple[str, ...] = ("verifier", "env", "env_or_verifier", "weighted")


def episode_reward(
    source: str,
    verifier_score: float,
    verifier_passed: bool | None,
    env_reward: float | None,
    env_success: bool | None,
    env_weight: float = 0.5,
) -> tuple[float, bool | None, str]:
    """An episode's ``(reward, verified, used)`` from the verifier's verdict and the env's signal.

    ``verifier``: the verifier's score and verdict. ``env``: the env's reward and success (``0.0``
    and ``None`` when the env reported nothing). ``env_or_verifier``: the env's when it reported
    anything, else the verifier's. ``weighted``: ``w·env + (1−w)·verifier`` (a missing env reward
    counts 0); verified when every part that judged passed (None when neither judged).
    ``used`` names what decided: ``verifier``, ``env``, ``env+verifier`` or ``none``.
    Examples: ``("env", 1.0, True, 0.0, False)`` → ``(0.0, False, "env")``;
    ``("weighted", 1.0, True, 0.0, False, 0.25)`` → ``(0.75, False, "env+verifier")``.
    """
    has_env = env_reward is not None or env_success is not None
    env_r = float(env_reward) if env_reward is not None else float(bool(env_success))
    if source == "verifier":
        return float(verifier_score), verifier_passed, "verifier"
    if source == "env":
        return (env_r, env_success, "env") if has_env else (0.0, None, "none")
    if source == "env_or_verifier":
        return (env_r, env_success, "env") if has_env else (float(verifier_score), verifier_passed, "verifier")
    if source == "weighted":
        if not 0.0 <= env_weight <= 1.0:
            raise ValueError(f"env_weight must lie in [0, 1], got {env_weight}")
        verdicts = [v for v in (env_success, verifier_passed) if v is not None]
        passed = all(verdicts) if verdicts else None
        score = env_weight * (env_r if has_env else 0.0) + (1.0 - env_weight) * float(verifier_score)
        return score, passed, "env+verifier"
    raise ValueError(f"unknown reward source {source!r}; choose one of {list(REWARD_SOURCES)}")


def last_assistant_text(messages: Sequence[Message]) -> str:
    """The content of the last assistant message (``""`` when there is none)."""
    turns = [m.content for m in messages if m.role == "assistant"]
    return turns[-1] if turns else ""


class CalculatorEnv:
    """A calculator tool. Each ``<calc>EXPR</calc>`` in a turn is evaluated and answered with
    ``<result>VALUE</result>`` (or ``<error>...</error>``); a turn without a call ends the episode.
    When the task has a gold ``answer``, the step that ends the episode also reports ``success``
    (:func:`judge_final_answer` on that turn); without one it reports nothing."""

    name = "calculator"
    TAG = re.compile(r"<calc>(.*?)</calc>", re.S)
    INSTRUCTION = "You can use a calculator: write <calc>EXPRESSION</calc> and the result is returned in <result>...</result>."

    def __init__(self, max_calls: int = 8):
        self.max_calls = max_calls
        self.calls = 0
        self.gold: str | None = None

    def reset(self, task: Prompt) -> str | None:
        self.calls = 0
        self.gold = getattr(task, "answer", None)
        return self.INSTRUCTION

    def step(self, action_text: str) -> tuple[str | None, bool, dict[str, Any]]:
        exprs = self.TAG.findall(action_text)
        if not exprs:
            return None, True, {"calls": 0} | judge_final_answer(action_text, self.gold)
        outs = []
        for x in exprs:
            self.calls += 1
            if self.calls > self.max_calls:
                return ("<error>too many calculator calls</error>", True,
                        {"calls": len(exprs), "limit": True} | judge_final_answer(action_text, self.gold))
            try:
                outs.append(f"<result>{_fmt(safe_eval(x))}</result>")
            except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as e:
                outs.append(f"<error>{type(e).__name__}: {e}</error>")
        return "\n".join(outs), False, {"calls": len(exprs)}


class PythonEnv:
    """A Python tool. The last ```python block of a turn is run (in ``gfcr.sandbox`` when
    it is installed, else in a subprocess with a timeout) and its stdout/stderr come back as
    ``<output>...</output>``; a turn without a code block ends the episode (and, when the task has a
    gold ``answer``, reports ``success`` like :class:`CalculatorEnv`)."""

    name = "python"
    BLOCK = re.compile(r"```python\n(.*?)```", re.S)
    INSTRUCTION = "You can run Python: write a ```python code block and its output is returned in <output>...</output>."

    def __init__(self, timeout_s: float = 10.0, max_output: int = 2000, sandbox: dict[str, Any] | None = None):
        self.timeout_s = timeout_s
        self.max_output = max_output
        self.sandbox = sandbox
        self.gold: str | None = None

    def reset(self, task: Prompt) -> str | None:
        self.gold = getattr(task, "answer", None)
        return self.INSTRUCTION

    def run(self, code: str) -> tuple[str, dict[str, Any]]:
        try:
            from gfcr.sandbox import SandboxConfig, run_python
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
            return None, True, {"ran": False} | judge_final_answer(action_text, self.gold)
        out, info = self.run(blocks[-1])
        if len(out) > self.max_output:
            out = out[: self.max_output] + "\n...[truncated]"
        return f"<output>\n{out}</output>", False, info | {"ran": True}


_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class RetryEnv:
    """A grader that lets the policy try again. Each turn's answer is checked against the task's gold
    ``answer``: right ends the episode with ``success``; wrong gets the observation ``feedback`` and
    another turn, until the episode's ``max_turns`` runs out (its last step reports ``success:
    False``). The answer read is :func:`final_answer` (``<answer>``, else an ``Answer:`` line); with
    ``lenient`` the turn's last number when it states none (the arithmetic runs' ``numeric`` verifier
    with ``lenient_fallback``). ``info`` also carries ``attempt`` (1, 2, ...) and the ``answer`` read.

    What it is for: episodes whose successes hold a *corrected mistake* the policy really sampled
    (a wrong attempt, the environment's "try again", a right one), the agentic case where ROSS's
    token mask excludes the failed attempts and keeps them as context (docs/ross.md, "Feedback
    episodes"). A task without a gold answer cannot be graded: the first turn ends the episode with
    no signal. Example: gold ``"50"``; ``"17 + 33 = 40."`` → (``feedback``, not done, ``success:
    False``); ``"17 + 33 = 50."`` → (None, done, ``success: True``, ``attempt: 2``).
    """

    name = "retry"
    FEEDBACK = "That is not correct. Try again."

    def __init__(self, feedback: str = FEEDBACK, lenient: bool = False, instruction: str | None = None):
        self.feedback, self.lenient, self.instruction = feedback, lenient, instruction
        self.gold: str | None = None
        self.attempt = 0

    def reset(self, task: Prompt) -> str | None:
        self.gold, self.attempt = getattr(task, "answer", None), 0
        return self.instruction

    def read(self, text: str) -> str | None:
        """The answer a turn states (``lenient``: else its last number)."""
        pred = final_answer(text)
        if pred is None and self.lenient:
            nums = _LAST_NUMBER.findall(text)
            pred = nums[-1] if nums else None
        return pred

    def step(self, action_text: str) -> tuple[str | None, bool, dict[str, Any]]:
        self.attempt += 1
        if self.gold is None:
            return None, True, {"attempt": self.attempt}
        pred = self.read(action_text)
        ok = pred is not None and answers_match(pred, self.gold)
        info = {"success": ok, "answer": pred, "attempt": self.attempt}
        return (None, True, info) if ok else (self.feedback, False, info)


ENVS: dict[str, type] = {"calculator": CalculatorEnv, "python": PythonEnv, "retry": RetryEnv}


def make_env(name: str, **kw: Any) -> Env:
    """A new env instance by name (``ENVS``) or import path ``pkg.mod:Class``."""
    from gfcr.config import resolve_object

    return resolve_object(name, ENVS, "env")(**kw)
