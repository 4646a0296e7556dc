"""On-policy distillation (OPD): the student samples, a teacher scores every sampled token, and the
student learns to lower the per-token reverse KL to the teacher on its own samples.

Notation: ``p`` the student (the policy being trained), ``q`` the teacher, ``x_t`` the token the
student sampled at position ``t``. The objective is the reverse KL on student samples,
``E_{x~p}[Σ_t KL(p(·|x_<t) ‖ q(·|x_<t))]`` (GKD with only on-policy data and β = 1, Agarwal et al.,
arXiv 2306.13649; the on-policy distillation stage of Qwen3, arXiv 2505.09388).

Two forms:

* :func:`reverse_kl` — the exact per-position KL over the vocabulary, for a teacher whose logits are
  in the same process. Used in tests as ground truth and available to custom losses.
* :func:`gfcr.filters.teacher.distill_token_advantages` — the sampled-token form the loop trains
  with (the ``teacher_kl`` token term of :mod:`gfcr.filters.advantages`). Each generated
  token gets the advantage ``A_t = −coef · (log p(x_t) − log q(x_t))``, and the ordinary
  policy-gradient loss (:func:`gfcr.train.losses.policy_gradient_loss`, which takes per-token
  advantages) does the rest: ``E_{x~p}[∇log p(x)·(log q(x) − log p(x))] = −∇KL(p‖q)`` per position,
  so the policy-gradient step descends the reverse KL (checked exactly in the tests by enumerating a
  small vocabulary). This needs only the teacher's log-prob of each *sampled* token, which any
  engine that can score a sequence provides (an in-process HF model, or an OpenAI-compatible server
  through prompt log-probs with ``echo``). Reference code: ``incorporate_kl_penalty`` in
  thinking-machines-lab/tinker-cookbook ``tinker_cookbook/distillation/train_on_policy.py``
  (advantages += −kl_penalty_coef · mask · (sampled_logprobs − teacher_logprobs), optional
  discounted future sum with ``kl_discount_factor``, default 0; one teacher per dataset).

Mixing with RL: the RL advantage of the rollout (a float per rollout, or TreeRL's per-token array)
is multiplied by ``rl_coef`` and the teacher term added
(:func:`gfcr.filters.advantages.with_token_terms`); ``rl_coef = 0`` is pure OPD.

Multi-teacher (MOPD, the upstream of the ROSS paper's main single-turn result): each prompt's task
picks its teacher (:class:`TeacherSet`); a teacher with no task list is the default.

The tokenizer rule: the sampled-token form compares log-probs of the *same token ids* under both
models, so student and teacher must share the tokenizer (same vocabulary, same ids, same special
tokens). A different tokenizer would score other tokens under the same ids; :func:`check_same_tokenizer`
refuses the run in one line instead of training on garbage. (Cross-tokenizer distillation needs a
token alignment, which this module does not do.)

Departures:

* The behaviour log-probs ``log p(x_t)`` are those stored with the rollout (the sampling policy
  after temperature and top-p). The teacher is scored at temperature 1 with top-p 1 by default,
  its own distribution, as the reference code (``incorporate_kl_penalty`` takes the teacher's
  log-probs of the sampled tokens as the teacher model gives them), so the target is the teacher
  itself whatever the student's sampling temperature; at a student temperature ≠ 1 the student
  side is its tempered sampling distribution (what it sampled from). ``temperature: student``
  (per teacher) keeps the earlier rule: the teacher scored at the student's temperature and
  top-p, i.e. the KL between the two tempered distributions.
* Per-token teacher log-probs are stored on the rollout as ``meta["teacher"] = {"name", "logprobs"}``
  (one float per *generated* token, in order) with the scalar signals ``teacher_kl`` (mean of
  ``log p − log q`` over generated tokens) and ``teacher_logp`` (mean ``log q``), so ROSS and Diagnose
  can read them without a schema change.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import Field, model_validator

from gfcr.config import StrictModel
from gfcr.records import GENERATED, Rollout

# --------------------------------------------------------------------------------------------
# Pure maths
# --------------------------------------------------------------------------------------------


def reverse_kl(student_logits: Any, teacher_logits: Any) -> Any:
    """Exact per-position reverse KL ``KL(p ‖ q) = Σ_v p(v)(log p(v) − log q(v))``.

    ``student_logits``, ``teacher_logits`` ``[..., V]`` (torch) → ``[...]``, computed in fp32, with
    gradient flowing into the student only if the teacher logits are detached by the caller.

    Worked example: ``p = [0.5, 0.5]``, ``q = [0.25, 0.75]`` gives
    ``0.5·ln 2 + 0.5·ln(2/3) = 0.3466 − 0.2027 = 0.1438``; the gradient with respect to the student
    logits is ``p ⊙ (log p − log q − KL) = [0.2747, −0.2747]``.
    """
    import torch

    lp = torch.log_softmax(student_logits.float(), dim=-1)
    lq = torch.log_softmax(teacher_logits.float(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1)


# --------------------------------------------------------------------------------------------
# Teachers
# --------------------------------------------------------------------------------------------


class TeacherError(ValueError):
    """A teacher that cannot be used (different tokenizer, no prompt log-probs...)."""


@runtime_checkable
class Teacher(Protocol):
    """Scores token sequences: per-token log-probs of ``completion_ids`` given ``prompt_ids``."""

    name: str

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> np.ndarray: ...


def _vocab_fingerprint(tok: Any) -> tuple[int, dict[str, int], tuple]:
    specials = tuple(sorted((k, str(v)) for k, v in (getattr(tok, "special_tokens_map", {}) or {}).items()))
    return len(tok), dict(tok.get_vocab()), specials


def check_same_tokenizer(student: Any, teacher: Any, teacher_name: str = "teacher") -> None:
    """Refuse a teacher whose tokenizer differs from the student's (see the module docstring).

    Compares vocabulary size, every token → id entry and the special tokens; raises
    :class:`TeacherError` naming the first difference.
    """
    n_s, v_s, sp_s = _vocab_fingerprint(student)
    n_t, v_t, sp_t = _vocab_fingerprint(teacher)
    if n_s != n_t:
        raise TeacherError(f"teacher {teacher_name!r} has a vocabulary of {n_t} tokens, the student {n_s}: "
                           "on-policy distillation needs the same tokenizer (token ids are compared one to one)")
    if v_s != v_t:
        diff = next(k for k in sorted(set(v_s) | set(v_t)) if v_s.get(k) != v_t.get(k))
        raise TeacherError(f"teacher {teacher_name!r} maps token {diff!r} to id {v_t.get(diff)}, the student to "
                           f"{v_s.get(diff)}: on-policy distillation needs the same tokenizer")
    if sp_s != sp_t:
        raise TeacherError(f"teacher {teacher_name!r} has special tokens {dict(sp_t)}, the student {dict(sp_s)}: "
                           "on-policy distillation needs the same tokenizer")


class HFTeacher:
    """A transformers model in this process, scored with the hf engine's batched teacher-forced
    forwards (:meth:`gfcr.generate.engines.hf.HFEngine.score_batch`).

    Args:
        model: a loaded causal LM or a model directory (``"default"`` = the default model).
        tokenizer: its tokenizer (object or path; default: the model's directory).
        name: the name recorded with the scores.
        temperature, top_p: scored like the student sampled (see the module docstring).
        max_batch: sequences per forward.
    """

    def __init__(self, model: Any, tokenizer: Any = None, name: str = "teacher", temperature: float = 1.0,
                 top_p: float = 1.0, max_batch: int = 16, device: str = "cpu", dtype: str = "float32"):
        from gfcr.generate.engines.hf import HFEngine

        self.engine = HFEngine(model, tokenizer=tokenizer, device=device, max_batch=max_batch, dtype=dtype,
                               policy_version=f"teacher:{name}")
        self.tokenizer = self.engine.tokenizer
        self.name = name
        self.temperature = float(temperature)
        self.top_p = float(top_p)

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> np.ndarray:
        return self.score_many([(prompt_ids, completion_ids)])[0]

    def score_many(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[np.ndarray]:
        """Log-probs of each completion given its prompt, ``[len(completion)]`` float32 each."""
        lists = [([int(t) for t in p], [int(t) for t in c]) for p, c in pairs]
        return [np.asarray(s.logprobs, np.float32) for s in self.engine.score_batch(lists, self.temperature, self.top_p)]


class OpenAITeacher:
    """A teacher behind an OpenAI-compatible completions endpoint that returns prompt log-probs.

    Sends the whole sequence as token ids with ``echo=true, logprobs=1, max_tokens=1, temperature=0``
    and reads ``choices[0].logprobs.token_logprobs`` of the echoed prompt (vLLM's and ``gfcr serve``'s
    behaviour). A server that does not echo prompt log-probs is refused with a clear error.
    The tokenizer rule cannot be checked through the API: give the teacher's ``tokenizer`` (a path)
    so :func:`check_same_tokenizer` can compare it with the student's.
    """

    def __init__(self, base_url: str, model: str = "default", name: str = "teacher", api_key: str | None = None,
                 tokenizer: Any = None, timeout_s: float = 300.0):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> np.ndarray:
        seq = [int(t) for t in prompt_ids] + [int(t) for t in completion_ids]
        body = {"model": self.model, "prompt": seq, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0.0}
        resp = self._client.post(f"{self.base_url}/completions", json=body)
        if resp.status_code != 200:
            raise TeacherError(f"teacher {self.name!r} at {self.base_url}: HTTP {resp.status_code}: {resp.text[:300]}")
        choice = (resp.json().get("choices") or [{}])[0]
        lps = (choice.get("logprobs") or {}).get("token_logprobs")
        if not lps or len(lps) < len(seq):
            raise TeacherError(f"teacher {self.name!r} at {self.base_url} returned no prompt log-probs for echo=true: "
                               "the server must support echo with logprobs (vLLM, gfcr serve)")
        got = lps[len(prompt_ids) : len(seq)]
        if any(v is None for v in got):
            raise TeacherError(f"teacher {self.name!r} returned null log-probs inside the completion")
        return np.asarray(got, dtype=np.float32)

    def close(self) -> None:
        self._client.close()


@dataclass
class TeacherSet:
    """Teachers by task (MOPD): ``for_task(task)`` gives the teacher of that task, else the default.

    Example: ``TeacherSet({"math": a, "code": b}, default=None).for_task("code") is b``; an unknown
    task with no default raises :class:`TeacherError`.
    """

    by_task: dict[str, Teacher]
    default: Teacher | None = None

    def for_task(self, task: str) -> Teacher:
        t = self.by_task.get(task, self.default)
        if t is None:
            raise TeacherError(f"no teacher for task {task!r} (teachers cover {sorted(self.by_task)}; add one with no tasks as the default)")
        return t



def score_rollouts(rollouts: Sequence[Rollout], teachers: TeacherSet) -> None:
    """Score each rollout's generated tokens under its task's teacher; store them on the rollout.

    Writes ``meta["teacher"] = {"name", "logprobs"}`` (one float per generated token) and the
    signals ``teacher_kl`` (mean ``log p − log q`` over generated tokens, the sampled-token
    reverse-KL estimate) and ``teacher_logp`` (mean teacher log-prob). Rollouts are grouped by
    teacher, so an in-process teacher runs batched forwards. Multi-turn rollouts (context tokens
    between generated ones) are scored one teacher-forced sequence at a time: every generated token
    is predicted from all tokens before it.
    """
    by_teacher: dict[int, tuple[Teacher, list[Rollout]]] = {}
    for r in rollouts:
        t = teachers.for_task(r.task)
        by_teacher.setdefault(id(t), (t, []))[1].append(r)
    for teacher, rs in by_teacher.values():
        pairs, spans = [], []
        for r in rs:
            gen = np.flatnonzero(np.asarray(r.token_role) == GENERATED)
            if len(gen) == 0:
                pairs.append(([], []))
                spans.append(gen)
                continue
            first = int(gen[0])
            pairs.append((r.token_ids[:first].tolist(), r.token_ids[first:].tolist()))
            spans.append(gen - first)
        score_many = getattr(teacher, "score_many", None)
        scores = score_many(pairs) if score_many is not None else [teacher.score(p, c) for p, c in pairs]
        for r, s, idx in zip(rs, scores, spans, strict=True):
            q = np.asarray(s, dtype=np.float32)[idx] if len(idx) else np.zeros(0, np.float32)
            b = np.asarray(r.logprobs, dtype=np.float32)[np.asarray(r.token_role) == GENERATED]
            r.meta["teacher"] = {"name": teacher.name, "logprobs": [float(v) for v in q]}
            if len(q):
                r.signals["teacher_kl"] = float(np.mean(b - q))
                r.signals["teacher_logp"] = float(np.mean(q))


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


class TeacherConfig(StrictModel):
    """One teacher: where it runs and which tasks it teaches."""

    name: str = Field(..., min_length=1, description="Name recorded with every score (meta.teacher.name).")
    engine: Literal["hf", "openai"] = Field("hf", description=(
        "'hf': a transformers model in this process (scored with batched teacher-forced forwards); 'openai': "
        "an OpenAI-compatible server that echoes prompt log-probs (gfcr serve, vLLM)."))
    model: str = Field("default", description=(
        "hf: a model directory or 'default'; openai: the served model name."))
    base_url: str | None = Field(None, description=(
        "openai: the server's /v1 URL (e.g. http://127.0.0.1:8000/v1)."))
    tokenizer: str | None = Field(None, description=(
        "openai: a local path to the teacher's tokenizer, checked against the student's (the API cannot show "
        "it). hf: defaults to the model's."))
    tasks: list[str] = Field(default_factory=list, description=(
        "Tasks this teacher scores (MOPD). Empty: the default teacher for every task no other teacher "
        "claims."))
    temperature: float | Literal["student"] = Field(1.0, description=(
        "Temperature the teacher is scored at (top-p 1): 1.0, the default, is the teacher's own distribution "
        "(the reference code's target); 'student' scores it at the student's sampling temperature and top-p "
        "(the KL between two tempered distributions, gfcr's earlier default)."))
    dtype: str = Field("float32", description="hf: weights dtype of the teacher.")

    @model_validator(mode="after")
    def _check(self) -> TeacherConfig:
        if self.temperature != "student" and not 0.0 < float(self.temperature) <= 5.0:
            raise ValueError(f"teacher {self.name!r}: temperature must be in (0, 5] or 'student', got {self.temperature}")
        if self.engine == "openai" and not self.base_url:
            raise ValueError(f"teacher {self.name!r}: engine 'openai' needs base_url")
        return self


class DistillConfig(StrictModel):
    """On-policy distillation in ``gfcr train`` (see :mod:`gfcr.train.distill`)."""

    teachers: list[TeacherConfig] = Field(..., min_length=1, description=(
        "One or more teachers; with several, each prompt's task picks its teacher (MOPD)."))
    coef: float = Field(1.0, ge=0.0, description=(
        "Reverse-KL coefficient: each generated token's advantage gets "
        "-coef*(log p_student - log p_teacher)."))
    rl_coef: float = Field(0.0, ge=0.0, description=(
        "Weight of the RL (group) advantage added to the distillation advantage; 0 = pure on-policy "
        "distillation, 1 = RL plus the teacher term."))
    discount: float = Field(0.0, ge=0.0, le=1.0, description=(
        "Discount of the future reverse-KL sum per token (0 = each token its own term, as the reference "
        "code's default)."))

    @model_validator(mode="after")
    def _check(self) -> DistillConfig:
        names = [t.name for t in self.teachers]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must be unique, got {names}")
        claimed: dict[str, str] = {}
        for t in self.teachers:
            for task in t.tasks:
                if task in claimed:
                    raise ValueError(f"task {task!r} has two teachers: {claimed[task]!r} and {t.name!r}")
                claimed[task] = t.name
        if sum(1 for t in self.teachers if not t.tasks) > 1:
            raise ValueError("at most one teacher may have no tasks (the default teacher)")
        return self


def teacher_missing(cfg: DistillConfig, probe: Any = None) -> str | None:
    """Why a configured hf teacher cannot be loaded here, in one line, or None when all can.

    A local directory or ``default`` is left to :func:`gfcr.models.resolve_model`. A hub name
    (``org/name``) is fine when the local Hugging Face cache holds its ``config.json``; otherwise,
    offline (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``) it is missing, and online one hub lookup
    (``probe(name)``, default ``huggingface_hub.model_info`` with a 10 s timeout) must answer. Checked
    before the run folder is written, so a missing teacher fails at once, not after the student loads
    and the hub client's retries.
    Example: ``HuggingFaceTB/SmolLM2-360M-Instruct``, not cached, offline → ``"distill teacher
    'smollm2-360m' (distill.teachers.0.model): ... download it on a machine with network ..."``.
    """
    from gfcr.models import is_default

    for i, tc in enumerate(cfg.teachers):
        name = tc.model
        if tc.engine != "hf" or is_default(name) or Path(name).expanduser().exists() or name.count("/") != 1 \
                or name.startswith(("/", ".", "~")):
            continue
        try:
            from huggingface_hub import try_to_load_from_cache

            if isinstance(try_to_load_from_cache(name, "config.json"), str):
                continue
        except Exception:  # noqa: BLE001  (a malformed name: the hub lookup below says why)
            pass
        offline = any(os.environ.get(v, "") not in ("", "0", "false", "False") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
        why = "the Hugging Face hub is switched off (HF_HUB_OFFLINE)" if offline else None
        if why is None:
            try:
                if probe is None:
                    from huggingface_hub import model_info

                    model_info(name, timeout=10)
                else:
                    probe(name)
            except Exception as e:  # noqa: BLE001  (no network, unknown repo, gated repo: all say the same)
                why = f"the hub did not answer ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
        if why is not None:
            return (f"distill teacher {tc.name!r} (distill.teachers.{i}.model): {name} is not in the local Hugging Face "
                    f"cache and {why}; download it on a machine with network (huggingface-cli download {name} "
                    f"--local-dir DIR), copy DIR here and pass --set distill.teachers.{i}.model=DIR")
    return None


def build_teachers(cfg: DistillConfig, student_tokenizer: Any, *, temperature: float = 1.0, top_p: float = 1.0,
                   device: str = "cpu") -> TeacherSet:
    """Load the configured teachers (each its own frozen copy, so training never moves a teacher,
    even one loaded from the student's own path) and check each tokenizer against the student's.
    ``temperature`` / ``top_p`` are the student's sampling ones, used by a teacher whose
    ``temperature`` is ``student``; the others are scored at their own temperature and top-p 1."""
    by_task: dict[str, Teacher] = {}
    default: Teacher | None = None
    for tc in cfg.teachers:
        student = tc.temperature == "student"
        t_temp, t_top_p = (temperature, top_p) if student else (float(tc.temperature), 1.0)
        if tc.engine == "hf":
            teacher: Any = HFTeacher(tc.model, tc.tokenizer, name=tc.name, temperature=t_temp, top_p=t_top_p,
                                     device=device, dtype=tc.dtype)
        else:
            teacher = OpenAITeacher(str(tc.base_url), model=tc.model, name=tc.name, tokenizer=tc.tokenizer)
        if teacher.tokenizer is not None:
            check_same_tokenizer(student_tokenizer, teacher.tokenizer, tc.name)
        elif tc.engine == "openai":
            raise TeacherError(f"teacher {tc.name!r}: give tokenizer: <path> so the tokenizer rule can be checked "
                               "(on-policy distillation compares token ids one to one)")
        for task in tc.tasks:
            by_task[task] = teacher
        if not tc.tasks:
            default = teacher
    return TeacherSet(by_task, default)
