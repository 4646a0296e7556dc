"""Rollout topologies: how task prompts become token-faithful :class:`gfcr.records.Rollout` s.

==============  ==============================================================================
name            class
==============  ==============================================================================
``group``       :class:`Group`: K independent samples per prompt (GRPO groups)
``tree``        :class:`EPTree`: TreeRL's entropy-guided tree (arXiv 2506.11902)
``multi_turn``  :class:`MultiTurn`: policy ↔ :class:`gfcr.generate.envs.Env` episodes
==============  ==============================================================================

Every rollout stores ``token_ids`` = prompt + generated tokens exactly as the policy saw them,
``token_role`` (0 context, 1 generated), the behaviour ``logprobs`` (0 on context), messages
decoded from the tokens, ``group_id`` (one per prompt and step), ``sample_index``,
``policy_version``, the ``sampling`` params and the ``cost``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from gfcr.generate.engines.base import Engine, GenRequest, GenResult, SamplingParams
from gfcr.generate.rollouts import (  # noqa: F401 - re-exported: the record-building names topologies use
    decode_completion,
    derive_seed,
    encode_prompt,
    engine_tokenizer,
    group_id_of,
    mean_generated_entropy,
    prompt_messages,
    rollout_from_result,
    token_entropies,
)
from gfcr.generate.tree_forks import (  # noqa: F401 - the accounting names are re-exported
    TokenAccounting,
    choose_forks,
    fork_end,
    sampled_tokens,
    token_accounting,
    tree_token_saving,
)
from gfcr.records import CONTEXT, GENERATED, Cost, Prompt, Rollout, json_safe


class Topology(Protocol):
    """Turns prompts into rollouts with an engine."""

    name: str

    def generate(
        self, engine: Engine, prompts: Sequence[Prompt], run_id: str, step: int = 0
    ) -> list[Rollout]: ...


class Group:
    """K independent samples per prompt (the GRPO group; arXiv 2402.03300, Sec. 4.1).

    Rule: for each prompt sample ``k`` completions with the same sampling params; they share a
    ``group_id`` and carry ``sample_index`` 0..k-1. All prompts of a call go to the engine at once.
    """

    name = "group"

    def __init__(self, k: int = 8, params: SamplingParams | None = None, seed: int | None = 0):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = int(k)
        self.params = params or SamplingParams()
        self.seed = seed

    def generate(self, engine: Engine, prompts: Sequence[Prompt], run_id: str, step: int = 0) -> list[Rollout]:
        reqs, pids = [], []
        for p in prompts:
            params = self.params.model_copy(update={"n": self.k, "seed": derive_seed(self.seed, p.prompt_id, step, "group")})
            ids = encode_prompt(engine, p)
            pids.append(ids)
            reqs.append(GenRequest(prompt_ids=ids, params=params) if ids is not None else GenRequest(messages=prompt_messages(p), params=params))
        results = engine.generate(reqs)
        version = engine.policy_version
        out = []
        for p, ids, req, res in zip(prompts, pids, reqs, results, strict=True):
            gid = group_id_of(p.prompt_id, step, run_id)
            for i, r in enumerate(res):
                out.append(rollout_from_result(engine, p, r, ids, req.params, run_id, step, i, gid, version))
        return out


# ---------------------------------------------------------------------------------------------
# tree (EPTree)
# ---------------------------------------------------------------------------------------------


# TreeRL advantages of these trees: gfcr.filters.treerl (a Filter signal). The forking rule and the
# token accounting: gfcr.generate.tree_forks.


class EPTree:
    """Entropy-guided Parallel Tree search, EPTree (TreeRL, arXiv 2506.11902).

    Rule: sample ``m`` root paths per prompt; then ``t`` rounds: in each root's tree take the ``n``
    generated tokens with the highest entropy proxy ``-log pi(token)`` (each path scores only its
    own segment, from its branch point on) and from each sample ``l`` new continuations. Every
    path is a leaf (a rollout); a child records ``parent_id`` and ``branch_pos`` and shares the
    parent's tokens ``[0, branch_pos)`` token for token. Advantages: :func:`tree_advantages`.

    Departures:

    * **Minimum prefix** (``min_prefix_frac``, default 0.5): forking points are taken among the
      tokens at offset ``>= ceil(min_prefix_frac * G)`` of the path's ``G`` generated tokens, and
      only if there are fewer than ``n`` such candidates from earlier ones (:func:`choose_forks`).
      Why: with plain top-``n`` (TreeRL) the saving depends on where the ``-log p`` peaks fall; a
      fork on an answer's opening word re-generates almost the whole answer. With the window each
      branch samples at most ``(1 - f)·G`` tokens, so at TreeRL's shape (``t·n·l = 4`` branches per
      root) the tree samples at least ``0.8·f`` fewer tokens per leaf than a group whatever the
      entropy profile: 40% at ``f = 0.5``, with margin over a 30% target, while every branch still
      re-writes the second half of the answer (where the computation and the final answer are).
      Measured with SmolLM2-135M on arithmetic (docs/generate.md): 43% saving with ``f = 0``,
      57% with ``f = 0.5``. ``min_prefix_frac=0`` restores TreeRL's rule.
    * TreeRL's code also stops forking after a token that contains "answer" or "conclusion"; here
      that mask is opt-in (``no_fork_after=("answer", "conclusion")``) because small models often
      open with "To answer…", which would put the whole answer off limits.
    * A branch resamples the forking token itself (the fork is *at* the uncertain token, as in
      TreeRL's code); a branch's ``max_tokens`` is what is left of the budget, so no leaf is longer
      than a plain sample. Defaults follow TreeRL's script (m=6, n=2, l=1, t=2).
    * Decoding (hf engine): one growing batch in which a root's branches start as soon as the
      paths they fork from are done (:mod:`gfcr.generate.tree_growing`), instead of TreeRL's
      round-synchronous rounds; same rule, same tree shape, less wall time.

    Cost accounting: a child's ``cost.gen_tokens`` counts only the tokens sampled after its branch
    point; :func:`token_accounting` and :func:`tree_token_saving` compare trees and groups per leaf.
    """

    name = "tree"

    def __init__(self, m: int = 6, n: int = 2, l: int = 1, t: int = 2, params: SamplingParams | None = None,  # noqa: E741
                 seed: int | None = 0, min_prefix_frac: float = 0.5, no_fork_after: Sequence[str] = ()):
        if min(m, l) < 1 or min(n, t) < 0:
            raise ValueError(f"need m, l >= 1 and n, t >= 0; got m={m} n={n} l={l} t={t}")
        if not 0.0 <= float(min_prefix_frac) < 1.0:
            raise ValueError(f"min_prefix_frac must be in [0, 1) (a fraction of the path's generated length), got {min_prefix_frac}")
        self.m, self.n, self.l, self.t = int(m), int(n), int(l), int(t)
        self.params = params or SamplingParams()
        self.seed = seed
        self.min_prefix_frac = float(min_prefix_frac)
        self.no_fork_after = tuple(no_fork_after)

    @property
    def leaves_per_prompt(self) -> int:
        return self.m * (1 + self.t * self.n * self.l)

    def _fork_ends(self, engine: Engine, paths: Sequence[Rollout]) -> list[int | None]:
        if not self.no_fork_after:
            return [None] * len(paths)
        tok = engine_tokenizer(engine)
        return [fork_end(tok.convert_ids_to_tokens(r.generated_ids.tolist()), self.no_fork_after) for r in paths]

    def generate(self, engine: Engine, prompts: Sequence[Prompt], run_id: str, step: int = 0) -> list[Rollout]:
        """The trees' rollouts. With an engine that batches continuously (``generate_growing``: hf)
        every root tree advances on its own inside one growing batch (:mod:`gfcr.generate.tree_growing`);
        otherwise the rounds run one engine call after another."""
        if engine_tokenizer(engine) is None:
            raise ValueError("the tree topology continues token prefixes: use an engine with a local tokenizer (hf, vllm)")
        out = None
        if hasattr(engine, "generate_growing"):
            from gfcr.generate.engines.growing import GrowingUnsupported
            from gfcr.generate.tree_growing import grow_trees

            try:
                out = grow_trees(self, engine, prompts, run_id, step)
            except GrowingUnsupported:
                out = None
        if out is None:
            out = self._generate_rounds(engine, prompts, run_id, step)
        shape = {"m": self.m, "n": self.n, "l": self.l, "t": self.t, "min_prefix_frac": self.min_prefix_frac,
                 "no_fork_after": list(self.no_fork_after)}
        for r in out:
            r.sampling = self.params.to_record(engine) | {"tree": shape}
        return out

    def _generate_rounds(self, engine: Engine, prompts: Sequence[Prompt], run_id: str, step: int) -> list[Rollout]:
        version = engine.policy_version
        prompt_ids = [encode_prompt(engine, p) for p in prompts]
        reqs = [
            GenRequest(prompt_ids=ids, params=self.params.model_copy(update={"n": self.m, "seed": derive_seed(self.seed, p.prompt_id, step, "root")}))
            for p, ids in zip(prompts, prompt_ids, strict=True)
        ]
        trees: list[list[Rollout]] = []
        roots_of: list[list[int]] = []  # per prompt: root index of each path
        tok_ents: list[list[np.ndarray | None]] = []  # per prompt: per-token entropies of each path (nan on context)
        for pi, (p, ids, req, res) in enumerate(zip(prompts, prompt_ids, reqs, engine.generate(reqs), strict=True)):
            gid = group_id_of(p.prompt_id, step, run_id)
            paths = [
                rollout_from_result(engine, p, r, ids, req.params, run_id, step, i, gid, version,
                                    meta={"tree": {"root": i, "round": 0, "prompt_index": pi}})
                for i, r in enumerate(res)
            ]
            trees.append(paths)
            roots_of.append(list(range(len(paths))))
            tok_ents.append([token_entropies(r, len(ids), None, continued=False) for r in res])
        P = [len(ids) for ids in prompt_ids]
        used: set[tuple[int, int, int]] = set()  # (prompt idx, path idx, token position)
        ends_of: list[list[int | None]] = [self._fork_ends(engine, paths) for paths in trees]
        for rnd in range(1, self.t + 1):
            forks: list[tuple[int, int, int]] = []  # (prompt idx, path idx, position)
            for pi, paths in enumerate(trees):
                for root in range(self.m):
                    members = [ai for ai in range(len(paths)) if roots_of[pi][ai] == root]
                    ents = [-paths[ai].logprobs[P[pi]:].astype(np.float64) for ai in members]
                    starts = [(paths[ai].branch_pos - P[pi]) if paths[ai].parent_id is not None else 0 for ai in members]
                    done = [(k, pos - P[pi]) for k, ai in enumerate(members) for (q, b, pos) in used if q == pi and b == ai]
                    picks = choose_forks(ents, starts, self.n, self.min_prefix_frac,
                                         ends=[ends_of[pi][ai] for ai in members], used=done)
                    for k, off in picks:
                        fork = (pi, members[k], P[pi] + off)
                        used.add(fork)
                        forks.append(fork)
            if not forks:
                break
            freqs = []
            for pi, ai, pos in forks:
                a = trees[pi][ai]
                params = self.params.model_copy(update={
                    "n": self.l, "max_tokens": self.params.max_tokens - (pos - P[pi]),
                    "seed": derive_seed(self.seed, prompts[pi].prompt_id, step, "branch", rnd, ai, pos),
                })
                freqs.append(GenRequest(prompt_ids=a.token_ids[:pos].tolist(), params=params))
            new: list[tuple[int, Rollout]] = []
            for (pi, ai, pos), req, res in zip(forks, freqs, engine.generate(freqs), strict=True):
                a = trees[pi][ai]
                parent_ent = tok_ents[pi][ai]
                for r in res:
                    prefix_ent = None if parent_ent is None else parent_ent[:pos]
                    tok_ents[pi].append(token_entropies(r, pos, prefix_ent, continued=True))
                    child = rollout_from_result(
                        engine, prompts[pi], r, None, req.params, run_id, step, len(trees[pi]), a.group_id, version,
                        parent_id=a.rollout_id, branch_pos=pos, prefix_entropies=prefix_ent,
                        prefix_ids=a.token_ids[:pos], prefix_role=a.token_role[:pos], prefix_logprobs=a.logprobs[:pos],
                        meta={"tree": {"root": roots_of[pi][ai], "round": rnd, "prompt_index": pi,
                                       "fork_entropy_proxy": -float(a.logprobs[pos]),
                                       "fork_offset": pos - P[pi], "parent_gen_tokens": a.n_generated}},
                    )
                    trees[pi].append(child)
                    roots_of[pi].append(roots_of[pi][ai])
                    new.append((pi, len(trees[pi]) - 1))
            for pi, idx in new:
                ends_of[pi].append(self._fork_ends(engine, [trees[pi][idx]])[0])
        return [r for paths in trees for r in paths]


# ---------------------------------------------------------------------------------------------
# multi-turn
# ---------------------------------------------------------------------------------------------


class MultiTurn:
    """Policy ↔ environment episodes, one rollout per episode (the RAGEN/StarPO loop, arXiv 2504.20073).

    Rule: the policy answers; :meth:`Env.step` turns the answer into an observation that is appended
    as a new chat turn (role ``obs_role``) and tokenized as context (``token_role = 0``); repeat until
    the env says done, a turn hits ``max_tokens`` or ``max_turns`` is reached. The chat template is
    applied so the stored ``token_ids`` decode exactly to ``apply_chat_template(messages)``: each new
    context span is the template text of the grown conversation minus the decoded tokens so far,
    and the episode closes with the template's end-of-turn text (context). A last observation sent
    with ``done``, or after the last of ``max_turns``, is never seen by the policy: it goes to
    ``meta["final_observation"]``, not into the conversation.

    An env that judges the episode (``info["success"]`` / ``info["reward"]`` from ``step``, see
    :mod:`gfcr.generate.envs`) gets its latest values stored as ``signals["env_reward"]`` and
    ``meta["env_success"]``; an env that reports neither leaves both out.

    Departure: episodes are run one turn at a time for all prompts together (one engine call per
    turn); the group of ``k`` episodes per prompt shares a ``group_id``.
    """

    name = "multi_turn"

    def __init__(self, env: Any, k: int = 1, max_turns: int = 4, params: SamplingParams | None = None,
                 seed: int | None = 0, obs_role: str = "user"):
        from gfcr.generate.envs import make_env

        self.env_factory = (lambda: make_env(env)) if isinstance(env, str) else env
        self.k, self.max_turns = int(k), int(max_turns)
        self.params = params or SamplingParams()
        self.seed = seed
        self.obs_role = obs_role

    def generate(self, engine: Engine, prompts: Sequence[Prompt], run_id: str, step: int = 0) -> list[Rollout]:
        """``k`` episodes per prompt, advanced together: each turn is one engine call over the live
        episodes; an episode ends when the env says done, the policy stops early or ``max_turns`` runs out."""
        tok = engine_tokenizer(engine)
        if tok is None:
            raise ValueError("multi_turn needs an engine with a local tokenizer (hf, vllm) to keep tokens exact")
        version = engine.policy_version
        eps = [self._start(tok, p, i) for p in prompts for i in range(self.k)]
        env_name = getattr(eps[0]["env"], "name", "env") if eps else "env"
        for turn in range(self.max_turns):
            live = [e for e in eps if not e["done"]]
            if not live:
                break
            reqs = [GenRequest(prompt_ids=list(e["ids"]), params=self.params.model_copy(update={
                "n": 1, "seed": derive_seed(self.seed, e["prompt"].prompt_id, step, "turn", turn, e["i"])}))
                for e in live]
            for e, res in zip(live, engine.generate(reqs), strict=True):
                self._take_turn(engine, tok, e, res[0])
        return [self._rollout(engine, tok, e, env_name, run_id, step, version) for e in eps]

    def _start(self, tok: Any, p: Prompt, i: int) -> dict[str, Any]:
        """Episode ``i`` of prompt ``p``: a fresh env, its first observation folded into the system
        message, the templated prompt as context tokens."""
        env = self.env_factory()
        msgs = prompt_messages(p)
        first = env.reset(p)
        if first:
            if msgs and msgs[0]["role"] == "system":
                msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + first}
            else:
                msgs.insert(0, {"role": "system", "content": first})
        ids = _template_ids(tok, msgs, True)
        return {
            "prompt": p, "i": i, "env": env, "msgs": msgs, "ids": ids, "role": [CONTEXT] * len(ids),
            "lps": [0.0] * len(ids), "ents": [], "done": False, "finish": None, "latency": 0.0, "turns": 0,
            "info": [], "meta": {}, "n_prompt": len(ids),
        }

    def _take_turn(self, engine: Engine, tok: Any, e: dict[str, Any], r: GenResult) -> None:
        """Append the policy's turn ``r`` to episode ``e``, step its env, and append the observation."""
        e["turns"] += 1
        e["latency"] += r.latency_s
        gen = [int(t) for t in r.token_ids]
        e["ids"] += gen
        e["role"] += [GENERATED] * len(gen)
        e["lps"] += [float(x) for x in r.logprobs]
        if e["ents"] is not None:
            has = r.entropies is not None and len(r.entropies) == len(gen)
            e["ents"] = e["ents"] + [float(x) for x in r.entropies] if has else None
        body = gen[:-1] if r.finish_reason == "stop" and gen and gen[-1] in getattr(engine, "eos_ids", {tok.eos_token_id}) else gen
        text = tok.decode(body, skip_special_tokens=False)
        e["msgs"].append({"role": "assistant", "content": text})
        if r.finish_reason != "stop":
            e["done"], e["finish"] = True, r.finish_reason
            return
        obs, done, info = e["env"].step(text)
        e["info"].append(info)
        if done:
            e["done"], e["finish"] = True, "env_done"
        if done or e["turns"] >= self.max_turns:  # no turn is left to read the observation: kept aside
            if obs:
                e["meta"]["final_observation"] = obs
            return
        e["msgs"].append({"role": self.obs_role, "content": obs or ""})
        if not _extend_context(tok, e, add_generation_prompt=True):
            e["done"], e["finish"] = True, "error"

    def _rollout(self, engine: Engine, tok: Any, e: dict[str, Any], env_name: str, run_id: str, step: int,
                 version: str) -> Rollout:
        """The finished episode ``e`` as one rollout (an episode still running ran out of turns)."""
        from gfcr.generate.envs import env_signal

        if not e["done"]:
            e["finish"] = "length"
            e["meta"]["max_turns_reached"] = True
        _extend_context(tok, e, add_generation_prompt=False)
        p = e["prompt"]
        n_gen = sum(1 for x in e["role"] if x == GENERATED)
        env_reward, env_success = env_signal(e["info"], env_name)
        signals = {} if env_reward is None else {"env_reward": env_reward}
        if e["ents"]:  # every policy token's entropy (turns in order), when the engine reported them
            signals["entropy"] = float(np.mean(e["ents"]))
        if env_success is not None:
            e["meta"]["env_success"] = env_success
        return Rollout(
            run_id=run_id, prompt_id=p.prompt_id, token_ids=e["ids"], token_role=e["role"], logprobs=e["lps"],
            messages=e["msgs"], task=p.task,
            step=step, policy_version=version, group_id=group_id_of(p.prompt_id, step, run_id),
            sample_index=e["i"], finish_reason=e["finish"],
            sampling=self.params.to_record(engine) | {"max_turns": self.max_turns, "env": env_name},
            cost=Cost(prompt_tokens=e["n_prompt"], gen_tokens=n_gen, latency_s=e["latency"]), signals=signals,
            meta=e["meta"] | {"turns": e["turns"], "env": env_name, "env_info": json_safe(e["info"])},
        )


def _template_ids(tok: Any, msgs: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _extend_context(tok: Any, e: dict[str, Any], add_generation_prompt: bool) -> bool:
    """Append, as context tokens, the template text of the conversation beyond the decoded tokens."""
    full = tok.apply_chat_template(e["msgs"], tokenize=False, add_generation_prompt=add_generation_prompt)
    have = tok.decode(e["ids"], skip_special_tokens=False)
    if not full.startswith(have):
        e["meta"]["template_mismatch"] = {"decoded_tail": have[-80:], "template_tail": full[len(have) - 80 : len(have) + 80]}
        return False
    rest = full[len(have):]
    if rest:
        ext = list(tok(rest, add_special_tokens=False)["input_ids"])
        e["ids"] += ext
        e["role"] += [CONTEXT] * len(ext)
        e["lps"] += [0.0] * len(ext)
    return True


TOPOLOGIES: dict[str, type] = {"group": Group, "tree": EPTree, "multi_turn": MultiTurn}


def make_topology(name: str, **kw: Any) -> Topology:
    """Build a topology by name (``group``, ``tree``, ``multi_turn``); ``k`` is ignored for ``tree``."""
    if name not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r}; choose one of {sorted(TOPOLOGIES)}")
    if name == "tree":
        kw.pop("k", None)  # a tree's leaf count is m * (1 + t * n * l), not k
    return TOPOLOGIES[name](**kw)
