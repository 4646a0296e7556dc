"""gfcr inside TRL's ``GRPOTrainer``: a live rollout recorder, verifier rewards, a prompt sampler.

Three pieces, usable together or alone (read against TRL 1.16.0, ``trl/trainer/grpo_trainer.py``
and ``trl/trainer/utils.py``)::

    store = RolloutStore.open("rollouts", create=True)
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=ds,
                          reward_funcs=[reward_function("math"), reward_function("format", pattern=r"Answer:")])
    sampler = GfcrSampler.install(trainer, store, selector="greso")   # before train()
    recorder = TRLRecorder(store, run_id="grpo-1", sampler=sampler).attach(trainer)
    trainer.train()                                                   # recorder closes at train end

**Recorder** (:class:`TRLRecorder`). ``attach`` wraps two methods of the trainer *instance*:
``_calculate_rewards`` (to keep each reward function's values, the prompts and completion texts it
was given) and ``_generate_and_score_completions`` (whose output dict holds exactly the tensors TRL
trains on: ``prompt_ids``/``prompt_mask`` (left-padded), ``completion_ids``/``completion_mask``
(right-padded), ``advantages``, and when TRL has them ``sampling_per_token_logps`` (vLLM's
behaviour log-probs), ``old_per_token_logps`` (TRL's recomputation, computed only when generation
and optimisation are misaligned or under vLLM importance sampling) and ``tool_mask``). On the
training thread it only copies those tensors and queues them; a background
:class:`~gfcr.integrations.writer.StepWriter` builds the records and commits one store version per
generation batch. Mapping, per row ``i`` of the generation batch:

- ``token_ids`` = ``prompt_ids[i][prompt_mask[i] == 1]`` + ``completion_ids[i][:n_i]`` where ``n_i`` is
  the completion's length before padding (TRL's ``completion_ids`` list; ``completion_mask`` is not
  used because ``mask_truncated_completions`` zeroes it for truncated rows);
- ``token_role`` = 0 on the prompt, ``tool_mask`` (1 model, 0 tool output) on the completion;
- ``logprobs`` = ``sampling_per_token_logps`` if present, else ``old_per_token_logps``, on role-1
  tokens; when TRL has neither (HF generation with aligned steps: TRL then uses the loss's own
  detached log-probs) they are stored as 0.0 and ``meta["logprobs_from"] = None`` says they are
  unknown;
- ``reward`` = TRL's weighted reward ``nansum_f(w_f * r_f)``; each function's value in
  ``signals["reward/<name>"]`` (absent when the function returned None); ``signals["advantage"]``;
  a row every function declined (TRL: unscorable, advantage 0) stores reward 0.0 with
  ``meta["unscorable"] = True``;
- ``verified``/``verifier`` from the gfcr reward functions' verdicts (the first one built with
  ``outcome=True``, the default for ``math`` and ``code``; every gfcr function's verdict and
  evidence under ``verifier["parts"]``);
- ``step`` = ``trainer.state.global_step`` when the batch was generated (optimizer steps done),
  ``policy_version`` = ``"step-<step>"``, ``group_id`` = one id per group of ``num_generations``
  consecutive rows, ``finish_reason`` = ``stop`` when the completion ends in EOS/pad else ``length``,
  ``messages`` = prompt messages + completion messages (tool turns included),
  ``meta["tool_calls"]`` = number of tool calls in the completion.

Multi-process runs: every rank records its own rows (rank in ``meta``); rewards are TRL's gathered
values sliced to the rank, as TRL slices its advantages.

**Reward functions** (:func:`reward_function`): a gfcr verifier (``math``, ``code`` in the sandbox,
``format``, or any name in :data:`gfcr.filters.verifiers.VERIFIERS`) as a TRL reward callable
``(prompts, completions, **kw) -> list[float | None]``; the gold answer / tests come from the
dataset columns ``answer`` / ``tests`` (configurable). A verdict that cannot judge (no gold answer)
returns None, which TRL treats as "not applicable". The verdicts of the last call are kept for the
recorder.

**Sampler** (:class:`GfcrSampler`): a gfcr prompt selector (GRESO, VADE, VCRL, SEC, uniform) in
place of TRL's ``RepeatSampler``, with the same layout: each generation batch is ``B`` distinct
prompts (``B = generation_batch_size // num_generations``), each index repeated ``num_generations``
times in a row, the whole chunk repeated ``num_iterations * steps_per_generation`` times. The
selector is restored from the store's prompts/state tables when the sampler is built, observes
each group's accuracy (verified, else reward) as the recorder sees it, and its state is saved to
the store after each step's commit.
Departure (forced by accelerate): the training dataloader fetches one batch ahead, so the prompts
of generation batch ``t + 1`` are chosen before batch ``t`` is scored; a group's outcome first
steers the choice of batch ``t + 2``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gfcr.filters.apply import verdict_record
from gfcr.filters.verifiers import Verdict, get_verifier
from gfcr.records import Cost, Rollout, new_id

from .trl_data import Columns, completion_text, messages_of, prompt_id_of, prompt_record
from .trl_sampler import GfcrSampler
from .writer import StepBatch, StepWriter

TESTED_TRL = "1.16.0"


# ---------------------------------------------------------------------------------------------
# Reward functions
# ---------------------------------------------------------------------------------------------


class GfcrReward:
    """A gfcr verifier as a TRL reward function; see :func:`reward_function`."""

    def __init__(self, verifier: Any, name: str, outcome: bool, answer_column: str = "answer",
                 tests_column: str = "tests", workers: int = 1):
        self.verifier = verifier
        self.__name__ = name
        self.outcome = outcome
        self.answer_column, self.tests_column = answer_column, tests_column
        self.workers = workers
        self.last_verdicts: list[Verdict] | None = None

    def __call__(self, prompts: list[Any], completions: list[Any], **kw: Any) -> list[float | None]:
        n = len(completions)
        answers = kw.get(self.answer_column) or [None] * n
        tests = kw.get(self.tests_column) or [None] * n

        def one(i: int) -> Verdict:
            a = answers[i]
            return self.verifier.verify(completion_text(completions[i]), answer=None if a is None else str(a),
                                        tests=tests[i])

        if self.workers > 1 and n > 1:
            if hasattr(self.verifier, "prepare"):
                self.verifier.prepare(self.workers)
            with ThreadPoolExecutor(self.workers) as ex:
                verdicts = list(ex.map(one, range(n)))
        else:
            verdicts = [one(i) for i in range(n)]
        self.last_verdicts = verdicts
        return [None if v.passed is None else float(v.score) for v in verdicts]

    def __repr__(self) -> str:
        return f"GfcrReward({self.__name__!r}, verifier={self.verifier.name!r}, outcome={self.outcome})"


def reward_function(name: str, *, outcome: bool | None = None, answer_column: str = "answer",
                    tests_column: str = "tests", workers: int = 1, func_name: str | None = None,
                    **config: Any) -> GfcrReward:
    """A gfcr verifier as a TRL reward function ``(prompts, completions, **kw) -> list[float | None]``.

    ``name`` is a verifier in :data:`gfcr.filters.verifiers.VERIFIERS` (``math``, ``code``,
    ``format``, ``numeric``, ``exact`` …) and ``config`` its keyword config (e.g.
    ``reward_function("format", pattern=r"Answer:")``). ``outcome`` marks the verifier whose verdict
    is the rollout's ``verified`` (default: True for ``math``/``code``/``numeric``/``exact``).
    TRL logs it under ``func_name`` (default ``gfcr_<name>``). ``workers`` > 1 verifies a batch in
    that many threads (each driving a math-verify process or a sandboxed run).
    """
    v = get_verifier(name, **config)
    if outcome is None:
        outcome = name in ("math", "code", "numeric", "exact")
    return GfcrReward(v, func_name or f"gfcr_{name}", outcome, answer_column, tests_column, workers)


# ---------------------------------------------------------------------------------------------
# Captured step -> rollouts (pure; runs on the writer thread)
# ---------------------------------------------------------------------------------------------


@dataclass
class Capture:
    """One generation batch as TRL handed it to training, copied off the training tensors.

    Shapes: ``prompt_ids``/``prompt_mask`` (B, P); ``completion_ids`` (B, C); ``tool_mask`` (B, C) or
    None; ``logps`` (B, C) or None; ``advantages`` (B,); ``rewards`` (B, F) (NaN = the function
    returned None); ``weights`` (F,). Arrays may be torch tensors until :meth:`numpy` is called.
    """

    run_id: str
    step: int
    batch_index: int
    rank: int
    row_offset: int  # global row index of local row 0
    num_generations: int
    prompt_ids: Any
    prompt_mask: Any
    completion_ids: Any
    completion_lens: list[int]
    advantages: Any
    rewards: Any
    weights: Any
    reward_names: list[str]
    prompts: list[Any]
    completions: list[Any]
    prompt_ids_str: list[str]
    tool_mask: Any = None
    logps: Any = None
    logps_from: str | None = None
    verdicts: dict[str, list[Verdict]] = field(default_factory=dict)
    verifier_ids: dict[str, tuple[str, str]] = field(default_factory=dict)  # func name -> (verifier, version)
    outcome: str | None = None
    eos_ids: list[int] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    latency_s: float = 0.0
    task: str = "trl"

    def numpy(self) -> Capture:
        def cv(x: Any) -> Any:
            if x is None or isinstance(x, np.ndarray):
                return x
            return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)

        for k in ("prompt_ids", "prompt_mask", "completion_ids", "tool_mask", "logps", "advantages",
                  "rewards", "weights"):
            setattr(self, k, cv(getattr(self, k)))
        return self


def _nan_to_none(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def capture_to_rollouts(cap: Capture) -> list[Rollout]:
    """Build the step's :class:`~gfcr.records.Rollout` rows from a :class:`Capture` (see the module
    docstring for the mapping)."""
    cap.numpy()
    out = []
    G = cap.num_generations
    eos = set(int(t) for t in cap.eos_ids)
    for i in range(len(cap.completion_lens)):
        p_ids = cap.prompt_ids[i][cap.prompt_mask[i] == 1].astype(np.int32)
        n = int(cap.completion_lens[i])
        c_ids = cap.completion_ids[i, :n].astype(np.int32)
        c_role = (cap.tool_mask[i, :n] != 0).astype(np.int8) if cap.tool_mask is not None else np.ones(n, np.int8)
        lp = np.zeros(n, np.float32)
        meta: dict[str, Any] = {"source": "trl-live", "rank": cap.rank, "batch": cap.batch_index,
                                "row": cap.row_offset + i, "logprobs_from": cap.logps_from}
        if cap.logps is not None:
            raw = cap.logps[i, :n].astype(np.float32)
            bad = ~np.isfinite(raw)
            if bad.any():
                meta["logprobs_missing"] = int(bad.sum())
            lp = np.where((c_role == 1) & ~bad, np.minimum(raw, 0.0), 0.0).astype(np.float32)
        rr = cap.rewards[i].astype(np.float64)
        signals = {f"reward/{name}": float(v) for name, v in zip(cap.reward_names, rr, strict=True) if np.isfinite(v)}
        signals["advantage"] = float(cap.advantages[i])
        if np.isnan(rr).all():
            reward = 0.0
            meta["unscorable"] = True
        else:
            reward = float(np.nansum(rr * cap.weights.astype(np.float64)))
        parts = {}
        for name, vs in cap.verdicts.items():
            vname, version = cap.verifier_ids.get(name, (name, "unknown"))
            parts[name] = verdict_record(_Named(vname, version), vs[i])
        verified = None
        if cap.outcome is not None and cap.outcome in parts:
            verifier = dict(parts[cap.outcome])
            verified = verifier["passed"]
        else:
            verifier = {"name": "trl"}
        verifier.update(reward_functions=list(cap.reward_names), reward_weights=[float(w) for w in cap.weights],
                        parts=parts)
        msgs = messages_of(cap.prompts[i], "user") + messages_of(cap.completions[i], "assistant")
        meta["tool_calls"] = sum(len(json.loads(m.tool_calls)) if m.tool_calls else 0 for m in msgs
                                 if m.role == "assistant")
        g = (cap.row_offset + i) // G
        out.append(Rollout(
            rollout_id=new_id(), run_id=cap.run_id, step=cap.step, policy_version=f"step-{cap.step}",
            prompt_id=cap.prompt_ids_str[i], group_id=f"{cap.run_id}/b{cap.batch_index}/g{g}",
            sample_index=(cap.row_offset + i) % G, task=cap.task, messages=msgs,
            token_ids=np.concatenate([p_ids, c_ids]),
            token_role=np.concatenate([np.zeros(len(p_ids), np.int8), c_role]),
            logprobs=np.concatenate([np.zeros(len(p_ids), np.float32), lp]),
            finish_reason="stop" if n and int(c_ids[-1]) in eos else "length",
            reward=reward, verified=verified, verifier=verifier, signals=signals,
            sampling=cap.sampling, cost=Cost(prompt_tokens=len(p_ids), gen_tokens=int(c_role.sum()),
                                             latency_s=cap.latency_s),
            tokens_source="engine", meta=meta,
        ))
    return out


@dataclass
class _Named:
    """The name/version pair :func:`~gfcr.filters.apply.verdict_record` reads from a verifier."""

    name: str
    version: str


# ---------------------------------------------------------------------------------------------
# Recorder
# ---------------------------------------------------------------------------------------------


class TRLRecorder:
    """Writes every rollout a ``GRPOTrainer`` trains on into a gfcr store; see the module docstring.

    ``store``: an open :class:`~gfcr.store.RolloutStore`; ``run_id``: the run's id in the store;
    ``sampler``: a :class:`GfcrSampler` to feed group outcomes to (optional); ``max_pending``:
    steps that may wait for the writer before training blocks; ``columns``: dataset column names;
    ``tracker``: pushes each committed step to an experiment tracker
    (:class:`~gfcr.integrations.trackers.TrackerHook`).
    """

    def __init__(self, store: Any, run_id: str, *, sampler: GfcrSampler | None = None, max_pending: int = 4,
                 columns: Columns = Columns(), task: str = "trl", tracker: Callable[[int, list[Any]], None] | None = None):
        if not run_id:
            raise ValueError("run_id must be a non-empty string")
        self.store = store
        self.run_id = run_id
        self.sampler = sampler
        self.columns = columns
        self.task = task
        self.writer = StepWriter(store, max_pending=max_pending, tracker=tracker)
        self.batches = 0
        self.capture_s = 0.0  # training-thread wall seconds spent in the recorder
        self.capture_cpu_s = 0.0  # and its CPU seconds
        self._last: dict[str, Any] | None = None
        self.trainer: Any = None

    # --- wiring -------------------------------------------------------------------------------
    def attach(self, trainer: Any) -> TRLRecorder:
        """Hook into ``trainer`` (a TRL ``GRPOTrainer``) and close at the end of training."""
        if self.trainer is not None:
            raise RuntimeError("this recorder is already attached to a trainer")
        from transformers import TrainerCallback

        self.trainer = trainer
        calc, gen = trainer._calculate_rewards, trainer._generate_and_score_completions

        def _calculate_rewards(inputs, prompts, completions, completion_ids_list):
            out = calc(inputs, prompts, completions, completion_ids_list)
            self._last = {"prompts": prompts, "completions": completions,
                          "lens": [len(c) for c in completion_ids_list], "rewards": out.detach().clone()}
            return out

        def _generate_and_score_completions(inputs):
            t0 = time.perf_counter()
            out = gen(inputs)
            if trainer.model.training:
                c0, k0 = time.perf_counter(), time.thread_time()
                self._capture(trainer, inputs, out, c0 - t0)
                self.capture_s += time.perf_counter() - c0
                self.capture_cpu_s += time.thread_time() - k0
            return out

        trainer._calculate_rewards = _calculate_rewards
        trainer._generate_and_score_completions = _generate_and_score_completions
        rec = self

        class _Close(TrainerCallback):
            def on_train_end(self, args, state, control, **kw):  # noqa: ANN001 - TRL's signature
                rec.close()

        trainer.add_callback(_Close())
        return self

    def flush(self) -> None:
        """Wait until every captured step is committed."""
        self.writer.flush()

    def close(self) -> None:
        """Commit what is queued and stop the writer (raises if a step failed to write)."""
        self.writer.close()

    # --- capture (training thread) ---------------------------------------------------------
    def _capture(self, trainer: Any, inputs: list[dict[str, Any]], out: dict[str, Any], latency: float) -> None:
        last, self._last = self._last, None
        if last is None:
            raise RuntimeError("the recorder saw a generation batch without its rewards; was "
                               "_calculate_rewards replaced after attach()?")
        acc = trainer.accelerator
        B = out["completion_ids"].shape[0]
        rank, world = int(acc.process_index), int(acc.num_processes)
        rows = slice(rank * B, (rank + 1) * B)  # TRL gathers rewards over ranks and slices the same way
        rewards = last["rewards"][rows]
        pids = [prompt_id_of(x.get("prompt"), x.get(self.columns.prompt_id)) for x in inputs]
        keep = ("prompt", "task", self.columns.prompt_id, self.columns.answer, self.columns.tests, self.columns.category)
        rows_in = [{k: x[k] for k in keep if k in x} for x in inputs]  # prompt records are built off-thread
        names = list(trainer.reward_func_names)
        verdicts: dict[str, list[Verdict]] = {}
        versions: dict[str, tuple[str, str]] = {}
        outcome = None
        for f, name in zip(trainer.reward_funcs, names, strict=False):
            if isinstance(f, GfcrReward) and f.last_verdicts is not None:
                verdicts[name] = f.last_verdicts
                versions[name] = (f.verifier.name, f.verifier.version)
                f.last_verdicts = None
                if f.outcome and outcome is None:
                    outcome = name
        if "sampling_per_token_logps" in out:
            logps, lp_from = out["sampling_per_token_logps"], "sampling"
        elif out.get("old_per_token_logps") is not None:
            logps, lp_from = out["old_per_token_logps"], "old"
        else:
            logps, lp_from = None, None
        step = int(trainer.state.global_step)
        G = int(trainer.num_generations)
        tok = getattr(trainer, "_tokenizer", None) or trainer.processing_class
        cap = Capture(
            run_id=self.run_id, step=step, batch_index=self.batches, rank=rank, row_offset=rank * B,
            num_generations=G, prompt_ids=out["prompt_ids"].detach().clone(),
            prompt_mask=out["prompt_mask"].detach().clone(), completion_ids=out["completion_ids"].detach().clone(),
            completion_lens=list(last["lens"]), advantages=out["advantages"].detach().clone(), rewards=rewards,
            weights=trainer.reward_weights.detach().clone(), reward_names=names, prompts=last["prompts"],
            completions=last["completions"], prompt_ids_str=pids,
            tool_mask=None if out.get("tool_mask") is None else out["tool_mask"].detach().clone(),
            logps=None if logps is None else logps.detach().clone(), logps_from=lp_from, verdicts=verdicts,
            outcome=outcome, eos_ids=[*getattr(trainer, "eos_token_ids", []), tok.pad_token_id],
            verifier_ids=versions, sampling=_sampling(trainer), latency_s=latency, task=self.task,
        )
        after = None
        if self.sampler is not None:
            self.sampler.observe(self._group_outcomes(cap, acc, world), step)
            if rank == 0:
                snap = self.sampler.snapshot()
                after = snap.save
        self.batches += 1

        def job() -> StepBatch:
            prompts = [prompt_record(x, self.columns, self.task) for x in rows_in]
            return StepBatch(step=step, rollouts=capture_to_rollouts(cap), prompts=prompts, after=after)

        self.writer.submit(step, job)

    def _group_outcomes(self, cap: Capture, acc: Any, world: int) -> list[tuple[str, list[float]]]:
        """(prompt id, outcomes) per group: the outcome verifier's verdicts if every row of the
        batch has one, else the weighted rewards (the selector's ``observe`` setting decides)."""
        r = cap.rewards.detach().cpu().numpy().astype(np.float64) if hasattr(cap.rewards, "detach") else cap.rewards
        w = cap.weights.detach().cpu().numpy().astype(np.float64) if hasattr(cap.weights, "detach") else cap.weights
        vals = np.nansum(r * w, axis=1)
        vs = cap.verdicts.get(cap.outcome) if cap.outcome else None
        if self.sampler.observe_what == "verified" and vs is not None and all(v.passed is not None for v in vs):
            vals = np.array([float(v.passed) for v in vs])
        local = list(zip(cap.prompt_ids_str, vals.tolist(), strict=True))
        if world > 1:
            from accelerate.utils import gather_object

            local = gather_object(local)
        G = cap.num_generations
        groups = []
        for g in range(0, len(local) - G + 1, G):
            chunk = local[g: g + G]
            groups.append((chunk[0][0], [v for _, v in chunk]))
        return groups


def _sampling(trainer: Any) -> dict[str, Any]:
    a = trainer.args
    engine = "vllm" if getattr(trainer, "use_vllm", False) else "transformers"
    return {"engine": f"trl-{engine}", "temperature": getattr(a, "temperature", None), "top_p": getattr(a, "top_p", None),
            "top_k": getattr(a, "top_k", None), "max_tokens": getattr(a, "max_completion_length", None),
            "n": int(trainer.num_generations), "seed": getattr(a, "seed", None)}


def attach(trainer: Any, store: Any, run_id: str, *, selector: str | None = None, max_pending: int = 4,
           columns: Columns = Columns(), tracker: Callable[[int, list[Any]], None] | None = None,
           **selector_params: Any) -> TRLRecorder:
    """One call: install a :class:`GfcrSampler` (when ``selector`` is given) and attach a
    :class:`TRLRecorder` to ``trainer``. Returns the recorder (``recorder.sampler`` is the sampler)."""
    sampler = GfcrSampler.install(trainer, store, selector, columns=columns, **selector_params) if selector else None
    return TRLRecorder(store, run_id, sampler=sampler, max_pending=max_pending, columns=columns,
                       tracker=tracker).attach(trainer)


__all__ = ["Capture", "Columns", "GfcrReward", "GfcrSampler", "TRLRecorder", "attach", "capture_to_rollouts",
           "completion_text", "prompt_id_of", "prompt_record", "reward_function", "TESTED_TRL"]
