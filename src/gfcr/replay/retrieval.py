"""Retrieval of similar solved cases (Replay): nearest solved prompts by embedding, through a
Lance vector index kept next to the store (``<store>/retrieval.lance``).

The embedding function is pluggable: any callable ``(texts: list[str]) -> (n, dim) float32``.
The default :class:`HashEmbedding` needs no model: hashed character n-grams, L2-normalised, so
cosine similarity reflects shared surface text (good for near-duplicate or templated prompts,
not for paraphrases).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gfcr.records import Rollout
from gfcr.replay.buffers import is_correct

Embedder = Callable[[Sequence[str]], np.ndarray]


class HashEmbedding:
    """Hashed character n-gram embedding (feature hashing with signs), L2-normalised.

    ``embed(texts) -> (n, dim) float32``. Deterministic across processes (crc32, not ``hash``).
    """

    def __init__(self, dim: int = 256, ngram: int = 3):
        if dim < 8 or ngram < 1:
            raise ValueError("HashEmbedding: dim must be >= 8 and ngram >= 1")
        self.dim, self.ngram = dim, ngram

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            s = " ".join(str(t).lower().split())
            s = f" {s} "
            for j in range(max(len(s) - self.ngram + 1, 1)):
                h = zlib.crc32(s[j : j + self.ngram].encode())
                out[i, h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
        norm = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norm > 0, norm, 1.0)


def prompt_text(r: Rollout) -> str:
    """The text a rollout is indexed by: its user turns (the prompt), joined."""
    return "\n".join(m.content for m in r.messages if m.role == "user")


@dataclass
class Neighbour:
    rollout_id: str
    prompt_id: str
    text: str
    distance: float
    step: int


class Retrieval:
    """Nearest solved prompts by embedding, over a Lance dataset of vectors.

    Rule: index the prompt text of correct rollouts (verified, or reward >= threshold when there
    is no verdict); ``nearest(text, k)`` returns the k closest entries (cosine distance), one per
    prompt unless ``per_prompt`` is False. ``build_index()`` adds an IVF-PQ index once the table is
    large; below that Lance searches exhaustively (exact).
    Not implemented: segment-level retrieval (whole prompts only), and a bundled neural
    embedder (pass any ``embed`` callable, e.g. a sentence-transformer's ``encode``).
    """

    def __init__(self, path: str | os.PathLike[str], embed: Embedder | None = None, success_threshold: float = 0.5):
        self.path = Path(path)
        self.embed = embed or HashEmbedding()
        self.success_threshold = success_threshold
        self.dim: int | None = None
        if self._exists():
            import lance

            self.dim = lance.dataset(str(self.path)).schema.field("vector").type.list_size

    @classmethod
    def for_store(cls, store: Any, **kw: Any) -> Retrieval:
        """The retrieval table of a store: ``<store.path>/retrieval.lance``."""
        return cls(Path(store.path) / "retrieval.lance", **kw)

    def _exists(self) -> bool:
        return (self.path / "_versions").exists()

    def __len__(self) -> int:
        if not self._exists():
            return 0
        import lance

        return lance.dataset(str(self.path)).count_rows()

    def add(self, rollouts: Iterable[Rollout]) -> int:
        """Index the correct rollouts among ``rollouts`` (already indexed ids are skipped)."""
        import lance

        rs = [r for r in rollouts if is_correct(r, self.success_threshold)]
        if not rs:
            return 0
        if self._exists():
            ds = lance.dataset(str(self.path))
            ids = [r.rollout_id for r in rs]
            have = set(ds.to_table(columns=["rollout_id"], filter=_in("rollout_id", ids)).column("rollout_id").to_pylist())
            rs = [r for r in rs if r.rollout_id not in have]
            if not rs:
                return 0
        texts = [prompt_text(r) for r in rs]
        vec = np.asarray(self.embed(texts), dtype=np.float32)
        if vec.ndim != 2 or vec.shape[0] != len(rs):
            raise ValueError(f"embedding function returned shape {vec.shape}, expected ({len(rs)}, dim)")
        if self.dim is not None and vec.shape[1] != self.dim:
            raise ValueError(f"embedding dim {vec.shape[1]} differs from the indexed dim {self.dim}; use the same embedder")
        self.dim = vec.shape[1]
        table = pa.table({
            "rollout_id": pa.array([r.rollout_id for r in rs], pa.string()),
            "prompt_id": pa.array([r.prompt_id for r in rs], pa.string()),
            "text": pa.array(texts, pa.string()),
            "step": pa.array([int(r.step) for r in rs], pa.int64()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel(), pa.float32()), self.dim),
        })
        lance.write_dataset(table, str(self.path), mode="append" if self._exists() else "create")
        return len(rs)

    def build_index(self, num_partitions: int | None = None, num_sub_vectors: int | None = None) -> None:
        """Create an IVF-PQ cosine index (worth it from ~10k rows; needs at least 256 rows)."""
        import lance

        ds = lance.dataset(str(self.path))
        n = ds.count_rows()
        if n < 256:
            raise ValueError(f"build_index needs at least 256 indexed rows, have {n}; exact search is used below that")
        ds.create_index("vector", index_type="IVF_PQ", metric="cosine",
                        num_partitions=num_partitions or max(1, int(np.sqrt(n))),
                        num_sub_vectors=num_sub_vectors or max(1, (self.dim or 16) // 16), replace=True)

    def nearest(self, text: str, k: int = 4, exclude_prompt: str | None = None, per_prompt: bool = True) -> list[Neighbour]:
        """The k nearest indexed solved prompts to ``text`` (closest first)."""
        import lance

        if not self._exists() or k <= 0:
            return []
        q = np.asarray(self.embed([text]), dtype=np.float32)[0]
        ds = lance.dataset(str(self.path))
        fetch = min(ds.count_rows(), max(k * 4, k + 8))
        flt = None if exclude_prompt is None else f"prompt_id != {_lit(exclude_prompt)}"
        t = ds.to_table(nearest={"column": "vector", "q": q, "k": fetch, "metric": "cosine"}, filter=flt,
                        columns=["rollout_id", "prompt_id", "text", "step"])
        rows = sorted(t.to_pylist(), key=lambda d: (d["_distance"], d["rollout_id"]))
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


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _in(col: str, values: Sequence[str]) -> str:
    return f"{col} IN ({', '.join(_lit(v) for v in values)})"
