"""gfcr prompt selectors as TRL's training sampler (a drop-in for ``RepeatSampler``).

See :class:`GfcrSampler`; the wiring into ``GRPOTrainer`` is described in :mod:`gfcr.integrations.trl`.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from gfcr.control.selectors import SELECTORS, make_selector
from gfcr.records import Prompt

from .trl_data import Columns, prompt_record

# ---------------------------------------------------------------------------------------------
# Sampler
# ---------------------------------------------------------------------------------------------


class GfcrSampler(Sampler):
    """A gfcr prompt selector as TRL's training sampler (drop-in for ``RepeatSampler``).

    ``dataset``: the trainer's (map-style) train dataset; ``selector``: a name in
    :data:`gfcr.control.selectors.SELECTORS` or a built selector over this dataset's prompt ids;
    ``batch_size``: distinct prompts per generation batch; ``num_generations`` (G): repeats of each
    index in a row; ``repeat_count``: repeats of each chunk (``num_iterations * steps_per_generation``);
    ``batches``: generation batches per pass (default ``len(pool) // batch_size``, one epoch of
    the pool). The selector state lives in ``store`` (``prompts.control[<key>]`` and
    ``state['control.<key>']``): it is loaded when the sampler is built and saved by
    :meth:`save` after each recorded step.
    """

    def __init__(self, dataset: Any, selector: str | Any = "greso", *, num_generations: int, batch_size: int,
                 repeat_count: int = 1, seed: int = 0, store: Any = None, batches: int | None = None,
                 columns: Columns = Columns(), observe: str = "verified", **selector_params: Any):
        if num_generations < 1 or batch_size < 1 or repeat_count < 1:
            raise ValueError("num_generations, batch_size and repeat_count must be >= 1")
        if observe not in ("verified", "reward"):
            raise ValueError(f"observe must be 'verified' or 'reward', got {observe!r}")
        self.dataset = dataset
        self.columns = columns
        rows = _dataset_rows(dataset, columns)
        self.prompts = [prompt_record(r, columns) for r in rows]
        pids = [p.prompt_id for p in self.prompts]
        self.index_of: dict[str, int] = {}
        for i, pid in enumerate(pids):
            self.index_of.setdefault(pid, i)  # duplicates of a prompt share its first row
        unique = list(self.index_of)
        cats = [self.prompts[self.index_of[p]].category for p in unique]
        if isinstance(selector, str):
            if selector.lower() not in SELECTORS:
                raise ValueError(f"unknown prompt selector {selector!r}; choose one of {sorted(SELECTORS)}")
            selector = make_selector(selector, unique, cats, **selector_params)
        if batch_size > len(unique):
            raise ValueError(f"batch_size {batch_size} > {len(unique)} distinct prompts in the dataset")
        self.selector = selector
        self.G, self.batch_size, self.repeat_count = int(num_generations), int(batch_size), int(repeat_count)
        self.batches = int(batches) if batches is not None else max(len(unique) // self.batch_size, 1)
        self.seed = int(seed)
        self.observe_what = observe
        self.store = store
        self.lock = threading.Lock()
        self._epoch = 0
        self.selected: deque[list[str]] = deque(maxlen=1024)  # prompt ids of the latest generation batches
        if store is not None:
            _register_prompts(store, self.prompts)
            self.selector.load(store)

    @classmethod
    def install(cls, trainer: Any, store: Any, selector: str | Any = "greso", **kw: Any) -> GfcrSampler:
        """Build the sampler from a ``GRPOTrainer``'s settings and make the trainer use it (call before
        ``trainer.train()``)."""
        args = trainer.args
        G = int(trainer.num_generations)
        s = cls(trainer.train_dataset, selector, num_generations=G, batch_size=args.generation_batch_size // G,
                repeat_count=int(trainer.num_iterations) * int(args.steps_per_generation), seed=int(args.seed),
                store=store, **kw)
        trainer._get_train_sampler = lambda dataset=None: s
        return s

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def __len__(self) -> int:
        return self.batches * self.batch_size * self.G * self.repeat_count

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self._epoch])
        self._epoch += 1
        for _ in range(self.batches):
            with self.lock:
                pids = self.selector.select(self.batch_size, rng)
            self.selected.append(list(pids))
            chunk = [self.index_of[p] for p in pids]
            for _ in range(self.repeat_count):
                for j in chunk:
                    for _ in range(self.G):
                        yield j

    def observe(self, groups: Sequence[tuple[str, Sequence[float]]], step: int) -> None:
        """Feed each group's outcomes (prompt id, values) to the selector (training thread)."""
        with self.lock:
            for pid, values in groups:
                if pid in self.selector.index:
                    self.selector.observe(pid, values, step)

    def snapshot(self) -> Any:
        with self.lock:
            return copy.deepcopy(self.selector)

    def save(self, store: Any | None = None) -> None:
        """Write the selector's state to the store (per-prompt and global)."""
        target = store if store is not None else self.store
        if target is not None:
            self.snapshot().save(target)


def _dataset_rows(dataset: Any, cols: Columns) -> list[dict[str, Any]]:
    names = getattr(dataset, "column_names", None)
    if names is not None:  # datasets.Dataset: column access is much faster than row access
        keep = [c for c in ("prompt", "task", cols.prompt_id, cols.answer, cols.tests, cols.category) if c in names]
        data = {c: dataset[c] for c in keep}
        return [{c: data[c][i] for c in keep} for i in range(len(dataset))]
    return [dict(dataset[i]) for i in range(len(dataset))]


def _register_prompts(store: Any, prompts: Sequence[Prompt]) -> None:
    uniq = {p.prompt_id: p for p in prompts}
    have = store.existing_ids(list(uniq), table="prompts", column="prompt_id")
    new = [p for pid, p in uniq.items() if pid not in have]
    if new:
        store.upsert_prompts(new)
