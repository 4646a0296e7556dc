"""Retrieval of similar solved cases (Replay): nearest solved prompts, and nearest solution
steps (segments), by embedding, through Lance vector tables kept next to the store
(``<store>/retrieval.lance`` for prompts, ``<store>/retrieval_segments.lance`` for segments).

The embedder is pluggable (:mod:`gfcr.replay.embeddings`): any callable
``(texts) -> (n, dim) float32``, or a name (``"hash"``, ``"minilm"``, ``"pkg.mod:obj"``).
The default :class:`HashEmbedding` needs no model (surface overlap only); ``"minilm"``
(:class:`MiniLMEmbedding`, all-MiniLM-L6-v2) finds paraphrases. A table records the ``name`` of
the embedder that built it and refuses vectors from another one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gfcr.records import Rollout
from gfcr.replay.buffers import is_correct
from gfcr.replay.embeddings import Embedder, HashEmbedding, MiniLMEmbedding, make_embedding

__all__ = ["Embedder", "HashEmbedding", "MiniLMEmbedding", "Neighbour", "Retrieval", "SegmentNeighbour",
           "prompt_text", "split_steps"]

EMBEDDER_KEY = b"gfcr.embedder"


def prompt_text(r: Rollout) -> str:
    """The text a rollout is indexed by: its user turns (the prompt), joined."""
    return "\n".join(m.content for m in r.messages if m.role == "user")


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_steps(text: str, max_chars: int = 300) -> list[tuple[int, int]]:
    """Split a solution into steps: char spans ``(start, end)`` of its non-empty lines (stripped),
    a line longer than ``max_chars`` cut further at sentence ends (``. ! ?`` + whitespace) into
    pieces of at most ``max_chars`` where the sentences allow.

    Shapes: str -> list of (start, end), ``text[start:end]`` is the step. Example:
    ``"3 + 4 = 7\\n\\n  7 * 2 = 14\\nAnswer: 14"`` -> ``[(0, 9), (13, 23), (24, 34)]``.
    """
    if max_chars < 1:
        raise ValueError("split_steps: max_chars must be >= 1")
    spans: list[tuple[int, int]] = []
    for m in re.finditer(r"[^\n]+", text):
        line = m.group()
        a = m.start() + (len(line) - len(line.lstrip()))
        b = m.start() + len(line.rstrip())
        if a >= b:
            continue
        if b - a <= max_chars:
            spans.append((a, b))
            continue
        cuts = [a] + [a + s.end() for s in _SENTENCE_END.finditer(text[a:b])] + [b]
        start = a
        for i in range(1, len(cuts)):
            # close the piece at the previous cut when adding this sentence would overflow
            if cuts[i] - start > max_chars and cuts[i - 1] > start:
                spans.append((start, len(text[:cuts[i - 1]].rstrip())))
                start = cuts[i - 1]
        spans.append((start, b))
    return spans


@dataclass
class Neighbour:
    """A solved prompt near the query."""

    rollout_id: str
    prompt_id: str
    text: str
    distance: float
    step: int


@dataclass
class SegmentNeighbour:
    """A solution step near the query: ``text`` is ``completion[start:end]`` of the rollout."""

    rollout_id: str
    prompt_id: str
    segment: int  # index of the step within its rollout's solution
    start: int
    end: int
    text: str
    distance: float
    step: int


class _VectorTable:
    """One Lance table of (payload columns, ``vector``), tagged with the embedder's name."""

    def __init__(self, path: Path):
        self.path = path
        self.dim: int | None = None
        self.embedder: str = ""
        if self.exists():
            import lance

            schema = lance.dataset(str(path)).schema
            self.dim = schema.field("vector").type.list_size
            self.embedder = (schema.metadata or {}).get(EMBEDDER_KEY, b"").decode()

    def exists(self) -> bool:
        return (self.path / "_versions").exists()

    def count(self) -> int:
        if not self.exists():
            return 0
        import lance

        return lance.dataset(str(self.path)).count_rows()

    def check(self, embed: Embedder, dim: int | None = None) -> None:
        name = getattr(embed, "name", "")
        if self.embedder and name and name != self.embedder:
            raise ValueError(f"{self.path.name} was built with embedder {self.embedder!r}, not {name!r}; "
                             "open it with the same embedder (or index into a new store)")
        if dim is not None and self.dim is not None and dim != self.dim:
            raise ValueError(f"embedding dim {dim} differs from the indexed dim {self.dim} of {self.path.name}; "
                             "use the same embedder")

    def have(self, ids: Sequence[str]) -> set[str]:
        if not self.exists() or not ids:
            return set()
        import lance

        t = lance.dataset(str(self.path)).to_table(columns=["rollout_id"], filter=_in("rollout_id", ids))
        return set(t.column("rollout_id").to_pylist())

    def append(self, columns: dict[str, pa.Array], vec: np.ndarray, embed: Embedder) -> None:
        import lance

        self.check(embed, vec.shape[1])
        dim = vec.shape[1]
        table = pa.table({**columns, "vector": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel(), pa.float32()), dim)})
        if not self.exists():
            self.embedder = getattr(embed, "name", "") or ""
            table = table.replace_schema_metadata({EMBEDDER_KEY: self.embedder.encode()})
        lance.write_dataset(table, str(self.path), mode="append" if self.exists() else "create")
        self.dim = dim

    def search(self, q: np.ndarray, k: int, flt: str | None, columns: list[str]) -> list[dict[str, Any]]:
        """The ``k`` rows nearest ``q`` that pass ``flt`` (cosine), closest first. Rows at an equal
        distance (the same prompt solved twice, a tie of the embedding) come in the order they were
        added, and every row tied with the k-th is fetched before the cut, so the answer is the same
        for the same rows added in the same order: it depends neither on how Lance breaks ties nor
        on the rollouts' random ids (a training run with ``retrieve:`` repeats with its seed)."""
        import lance

        ds = lance.dataset(str(self.path))
        n = ds.count_rows()
        want = min(n, k)
        if want <= 0:
            return []
        fetch = min(n, 2 * want + 1)  # more than wanted, so that a tie at the k-th rarely costs a second scan
        while True:
            t = ds.to_table(nearest={"column": "vector", "q": q, "k": fetch, "metric": "cosine"}, filter=flt,
                            prefilter=True, columns=[*columns, "_distance"], with_row_id=True)
            rows = sorted(t.to_pylist(), key=lambda d: (d["_distance"], d["_rowid"]))
            if len(rows) < fetch or fetch >= n or rows[-1]["_distance"] > rows[want - 1]["_distance"]:
                break  # all rows seen, or the last fetched lies beyond the k-th: no tie was cut
            fetch = min(n, 4 * fetch)
        return [{c: v for c, v in d.items() if c != "_rowid"} for d in rows[:want]]

    def build_index(self, num_partitions: int | None, num_sub_vectors: int | None) -> None:
        import lance

        ds = lance.dataset(str(self.path)) if self.exists() else None
        n = ds.count_rows() if ds is not None else 0
        if ds is None or n < 256:
            raise ValueError(f"build_index needs at least 256 indexed rows in {self.path.name}, have {n}; "
                             "exact search is used below that")
        ds.create_index("vector", index_type="IVF_PQ", metric="cosine",
                        num_partitions=num_partitions or max(1, int(np.sqrt(n))),
                        num_sub_vectors=num_sub_vectors or max(1, (self.dim or 16) // 16), replace=True)


class Retrieval:
    """Nearest solved prompts, and nearest solution steps, by embedding over Lance vector tables.

    Rule: index the prompt text of correct rollouts (verified, or reward >= threshold when there
    is no verdict); ``nearest(text, k)`` returns the k closest entries (cosine distance), one per
    prompt unless ``per_prompt`` is False. With ``segments=True``, ``add`` also indexes each
    solved rollout's assistant text split into steps (:func:`split_steps`, or ``split``) in a
    second table; ``nearest_segments(text, k)`` returns the closest steps with their char spans.
    ``build_index()`` adds an IVF-PQ index once a table is large; below that Lance searches
    exhaustively (exact). This is similarity retrieval of cases in the sense of the rollout
    survey's Replay stage; no single paper's retrieval rule is implemented.
    """

    def __init__(self, path: str | os.PathLike[str], embed: Embedder | str | None = None,
                 success_threshold: float = 0.5, segments: bool = False,
                 split: Callable[[str], list[tuple[int, int]]] | None = None):
        self.path = Path(path)
        self.embed: Embedder = make_embedding(embed) if isinstance(embed, str) else (embed or HashEmbedding())
        self.success_threshold = success_threshold
        self.segments = segments
        self.split = split or split_steps
        stem = self.path.name[:-len(".lance")] if self.path.name.endswith(".lance") else self.path.name
        self.segments_path = self.path.with_name(f"{stem}_segments.lance")
        self._prompts = _VectorTable(self.path)
        self._segments = _VectorTable(self.segments_path)
        self._prompts.check(self.embed)
        self._segments.check(self.embed)

    @classmethod
    def for_store(cls, store: Any, **kw: Any) -> Retrieval:
        """The retrieval tables of a store: ``<store.path>/retrieval.lance`` (+ ``_segments``). A store on
        object storage (``s3://…``) cannot hold them yet: refused in one line (nothing is created locally)."""
        if not getattr(store, "local", True):
            raise ValueError(f"retrieval tables are kept in a local store folder only; {store.path} is on object "
                             "storage (use a local store for retrieval)")
        return cls(Path(store.path) / "retrieval.lance", **kw)

    @property
    def dim(self) -> int | None:
        return self._prompts.dim

    def __len__(self) -> int:
        return self._prompts.count()

    def n_segments(self) -> int:
        """Number of indexed solution steps."""
        return self._segments.count()

    def _embed(self, texts: list[str]) -> np.ndarray:
        vec = np.asarray(self.embed(texts), dtype=np.float32)
        if vec.ndim != 2 or vec.shape[0] != len(texts):
            raise ValueError(f"embedding function returned shape {vec.shape}, expected ({len(texts)}, dim)")
        return vec

    def _solved(self, rollouts: Iterable[Rollout]) -> list[Rollout]:
        return [r for r in rollouts if is_correct(r, self.success_threshold)]

    def add(self, rollouts: Iterable[Rollout]) -> int:
        """Index the correct rollouts among ``rollouts`` (already indexed ids are skipped); with
        ``segments=True`` their steps too. Returns the number of prompt rows added."""
        rs = self._solved(rollouts)
        if self.segments:
            self.add_segments(rs)
        have = self._prompts.have([r.rollout_id for r in rs])
        rs = [r for r in rs if r.rollout_id not in have]
        if not rs:
            return 0
        texts = [prompt_text(r) for r in rs]
        self._prompts.append({
            "rollout_id": pa.array([r.rollout_id for r in rs], pa.string()),
            "prompt_id": pa.array([r.prompt_id for r in rs], pa.string()),
            "text": pa.array(texts, pa.string()),
            "step": pa.array([int(r.step) for r in rs], pa.int64()),
        }, self._embed(texts), self.embed)
        return len(rs)

    def add_segments(self, rollouts: Iterable[Rollout]) -> int:
        """Index the steps of the correct rollouts' assistant text (``Rollout.completion``);
        rollouts whose steps are already indexed are skipped. Returns the number of steps added."""
        rs = self._solved(rollouts)
        have = self._segments.have([r.rollout_id for r in rs])
        rows: dict[str, list[Any]] = {k: [] for k in ("rollout_id", "prompt_id", "segment", "start", "end", "text", "step")}
        for r in rs:
            if r.rollout_id in have:
                continue
            comp = r.completion
            for j, (a, b) in enumerate(self.split(comp)):
                for k, v in zip(rows, (r.rollout_id, r.prompt_id, j, a, b, comp[a:b], int(r.step)), strict=True):
                    rows[k].append(v)
        if not rows["text"]:
            return 0
        types = {"rollout_id": pa.string(), "prompt_id": pa.string(), "segment": pa.int32(), "start": pa.int32(),
                 "end": pa.int32(), "text": pa.string(), "step": pa.int64()}
        self._segments.append({k: pa.array(v, types[k]) for k, v in rows.items()}, self._embed(rows["text"]), self.embed)
        return len(rows["text"])

    def build_index(self, num_partitions: int | None = None, num_sub_vectors: int | None = None,
                    segments: bool = False) -> None:
        """Create an IVF-PQ cosine index on the prompt table (or the segment table) (worth it from
        ~10k rows; needs at least 256 rows)."""
        (self._segments if segments else self._prompts).build_index(num_partitions, num_sub_vectors)

    def _query(self, table: _VectorTable, text: str) -> np.ndarray:
        q = self._embed([text])[0]
        table.check(self.embed, q.shape[0])
        return q

    def nearest(self, text: str, k: int = 4, exclude_prompt: str | None = None, per_prompt: bool = True) -> list[Neighbour]:
        """The k nearest indexed solved prompts to ``text`` (closest first)."""
        if not self._prompts.exists() or k <= 0:
            return []
        q = self._query(self._prompts, text)
        flt = None if exclude_prompt is None else f"prompt_id != {_lit(exclude_prompt)}"
        rows = self._prompts.search(q, max(k * 4, k + 8), flt, ["rollout_id", "prompt_id", "text", "step"])
        out: list[Neighbour] = []
        seen: set[str] = set()
        for d in rows:
            if per_prompt and d["prompt_id"] in seen:
                continue
            seen.add(d["prompt_id"])
            out.append(Neighbour(d["rollout_id"], d["prompt_id"], d["text"], float(d["_distance"]), int(d["step"])))
            if len(out) >= k:
                break
        return out

    def nearest_segments(self, text: str, k: int = 4, exclude_prompt: str | None = None,
                         per_rollout: bool = False) -> list[SegmentNeighbour]:
        """The k indexed solution steps nearest to ``text`` (closest first); ``per_rollout`` keeps
        at most one step per rollout. Empty when no segments were indexed."""
        if not self._segments.exists() or k <= 0:
            return []
        q = self._query(self._segments, text)
        flt = None if exclude_prompt is None else f"prompt_id != {_lit(exclude_prompt)}"
        cols = ["rollout_id", "prompt_id", "segment", "start", "end", "text", "step"]
        rows = self._segments.search(q, max(k * 4, k + 8) if per_rollout else k, flt, cols)
        out: list[SegmentNeighbour] = []
        seen: set[str] = set()
        for d in rows:
            if per_rollout and d["rollout_id"] in seen:
                continue
            seen.add(d["rollout_id"])
            out.append(SegmentNeighbour(d["rollout_id"], d["prompt_id"], int(d["segment"]), int(d["start"]),
                                        int(d["end"]), d["text"], float(d["_distance"]), int(d["step"])))
            if len(out) >= k:
                break
        return out


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _in(col: str, values: Sequence[str]) -> str:
    return f"{col} IN ({', '.join(_lit(v) for v in values)})"


def seeded_prompt(prompt: Any, seeds: Sequence[tuple[str, str]], ids: Sequence[str] = ()) -> Any:
    """``prompt`` with solved cases as earlier turns: ``[user q_1, assistant a_1, ..., <its own messages>]``.

    ``seeds``: ``(question, solution)`` pairs, nearest first (they are placed nearest *last*, next to
    the question); ``ids``: the seeds' rollout ids, recorded in ``meta["retrieved"]``. The prompt id,
    answer and tests stay, so verification and the store's prompt table are unchanged.
    Example: seeds ``[("q 2 + 2", "Answer: 4")]`` before ``user "q 3 + 4"`` → three messages.
    """
    from dataclasses import replace

    from gfcr.records import Message

    turns = [m for q, a in reversed(list(seeds)) for m in (Message("user", q), Message("assistant", a))]
    return replace(prompt, messages=turns + list(prompt.messages), meta=dict(prompt.meta) | {"retrieved": list(ids)})


class RetrievalSeeder:
    """Retrieval-guided generation (Generate's ``retrieve`` option): the survey's most direct use of
    a rollout store. For each prompt, the ``k`` nearest *solved* prompts of ``store`` (by embedding of
    the prompt text, :class:`Retrieval`; the prompt itself excluded) and one verified solution of
    each become in-context examples before the question (:func:`seeded_prompt`).

    The index (``<store>/retrieval.lance``) is brought up to date with the store's solved rollouts
    on construction (already indexed ids are skipped). ``max_distance`` drops neighbours farther
    than that cosine distance (None: keep the k nearest). A seed's question is its rollout's last
    user turn and its solution the final assistant turn, so seeds of seeded rollouts do not nest.
    No single paper's rule: the survey names "retrieved solved cases as in-context seeds or
    prefixes"; this is the in-context form.
    """

    def __init__(self, store: Any, k: int = 2, embed: Embedder | str | None = None, max_distance: float | None = None,
                 where: str | None = None):
        if k < 1:
            raise ValueError(f"retrieve: k must be >= 1, got {k}")
        self.store, self.k, self.max_distance = store, k, max_distance
        self.index = Retrieval.for_store(store, embed=embed)
        self.index.add(store.rollouts(where=where) if where else store.rollouts())

    def seeds(self, prompt: Any) -> list[tuple[str, str, str]]:
        """``(rollout_id, question, solution)`` of the prompt's nearest solved cases, nearest first."""
        from gfcr.records import table_to_rollouts

        text = "\n".join(m.content for m in prompt.messages if m.role == "user")
        near = [n for n in self.index.nearest(text, self.k, exclude_prompt=prompt.prompt_id)
                if self.max_distance is None or n.distance <= self.max_distance]
        if not near:
            return []
        by_id = {r.rollout_id: r for r in table_to_rollouts(self.store.get([n.rollout_id for n in near]))}
        out = []
        for n in near:
            r = by_id[n.rollout_id]
            users = [m.content for m in r.messages if m.role == "user"]
            answers = [m.content for m in r.messages if m.role == "assistant"]
            if users and answers:
                out.append((n.rollout_id, users[-1], answers[-1]))
        return out

    def seed(self, prompts: Sequence[Any]) -> list[Any]:
        """Every prompt with its seeds (a prompt with no solved neighbour is returned as it is)."""
        out = []
        for p in prompts:
            s = self.seeds(p)
            out.append(seeded_prompt(p, [(q, a) for _, q, a in s], [i for i, _, _ in s]) if s else p)
        return out
