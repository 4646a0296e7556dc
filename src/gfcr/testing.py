"""Test helpers: hand-built records, and tiny, randomly initialised models for tests and examples (no download, builds in < 1 s).

``tiny_tokenizer()`` trains a byte-level BPE tokenizer on a small built-in corpus and gives it a
ChatML chat template (the template family SmolLM2 uses), so chat templating, offsets and decoding
behave like a real tokenizer. ``tiny_model()`` is a 2-layer Llama over that vocabulary.
Both are deterministic for a given seed.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from gfcr.records import Message, Prompt, Rollout

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "What is 12 + 7? Let's think step by step. 12 + 7 = 19. Answer: 19",
    "Compute 3 * 4 - 5. First 3 * 4 = 12, then 12 - 5 = 7. Answer: 7",
    "The quick brown fox jumps over the lazy dog. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000",
    "def add(a, b):\n    return a + b\n\nassert add(2, 3) == 5\nprint(add(1, 1))",
    "<tool>calculator: 6 * 7</tool> <result>42</result> So the answer is 42.",
    "Héllo wörld — naïve café, 数学 题目, emoji 🙂 and symbols: = + - * / ( ) [ ] { } \\boxed{3}",
    "You are a helpful assistant. Solve the problem and end with a line 'Answer: N'.",
]


@lru_cache(maxsize=4)
def _tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok.to_str()


def tiny_tokenizer(vocab_size: int = 512) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with a ChatML template; eos = ``<|im_end|>``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size)),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = CHATML_TEMPLATE
    tok.padding_side = "left"
    return tok


def tiny_model(tokenizer: Any | None = None, seed: int = 0, hidden: int = 64, layers: int = 2) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` (fp32, eval mode) over ``tokenizer``'s vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer if tokenizer is not None else tiny_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.eval()
    return model


def save_tiny(path: str, seed: int = 0) -> str:
    """Write a tiny model + tokenizer to ``path`` (an HF directory any gfcr command accepts as a model)."""
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_rollout(i: int = 0, *, run: str = "run-a", step: int = 0, prompt: str = "p0", n_ctx: int = 4, n_gen: int = 6,
                 reward: float = 1.0, verified: bool | None = True, seed: int = 0, **kw) -> Rollout:
    rng = np.random.default_rng(seed * 1000 + i)
    ids = rng.integers(0, 50000, n_ctx + n_gen).astype(np.int32)
    role = np.array([0] * n_ctx + [1] * n_gen, np.int8)
    lp = np.where(role == 1, -rng.random(n_ctx + n_gen).astype(np.float32) * 3, 0).astype(np.float32)
    base = dict(
        run_id=run, step=step, prompt_id=prompt, token_ids=ids, token_role=role, logprobs=lp,
        messages=[Message("user", f"question {prompt}"), Message("assistant", f"answer {i} é 数")],
        task="arith", policy_version=f"v{step}", sample_index=i, reward=reward, verified=verified,
        verifier={"name": "math", "parsed": str(i)}, signals={"entropy": 0.5 + i, "advantage": -0.25},
        sampling={"temperature": 0.7, "seed": i}, meta={"k": [1, 2]},
    )
    base.update(kw)
    return Rollout(**base)


def make_prompt(pid: str = "p0", answer: str = "7", **kw) -> Prompt:
    return Prompt(prompt_id=pid, task="arith", messages=[Message("user", f"q {pid}")], answer=answer, **kw)


class ScriptedWorld:
    """A world whose per-prompt success probabilities are given: the simulator's world interface
    (``prompt_ids``, ``cat_names``, ``p``, ``generate``, ``update``) with draws keyed on (prompt, step,
    round, sample), so ``gfcr train``'s scripted engine (:meth:`draw`) and ``gfcr simulate`` see the
    same verdicts and lengths whatever order they ask in. The learner does nothing (``p`` is fixed).

    Example: ``ScriptedWorld(["a", "b"], [1.0, 0.0]).draw("a", 0, 0, 3)`` → ``([True] * 3, lengths)``.
    """

    def __init__(self, prompt_ids: list[str], p: list[float], seed: int = 0, max_len: int = 6):
        self.prompt_ids, self.p, self.seed, self.max_len = list(prompt_ids), np.asarray(p, dtype=np.float64), seed, max_len
        self.cat_names = ["c0"] * len(self.prompt_ids)

    def draw(self, prompt_id: str, step: int, rnd: int, k: int) -> tuple[list[bool], list[int]]:
        """Verdicts and generated lengths (1..max_len) of samples ``0..k-1`` of one prompt's round."""
        import zlib

        rng = np.random.default_rng([self.seed, zlib.crc32(prompt_id.encode()), step, rnd])
        u, ln = rng.random(64), rng.integers(1, self.max_len + 1, 64)
        p = float(self.p[self.prompt_ids.index(prompt_id)])
        return [bool(x < p) for x in u[:k]], [int(n) for n in ln[:k]]

    def generate(self, idx: np.ndarray, k: int, rng: Any = None, step: int = 0, rnd: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Rewards (n, k) in {0, 1} and lengths (n, k) for prompt indices ``idx`` (``rng`` unused)."""
        draws = [self.draw(self.prompt_ids[i], step, rnd, k) for i in np.asarray(idx).tolist()]
        return (np.array([d[0] for d in draws], dtype=np.float64).reshape(len(draws), k),
                np.array([d[1] for d in draws], dtype=np.int64).reshape(len(draws), k))

    def update(self, trained_idx: np.ndarray, q: np.ndarray, weight: np.ndarray | None = None) -> None:
        return None


class S3Server:
    """moto's S3 server (the S3 HTTP API) on 127.0.0.1 in a thread, recording every request it answers
    as ``(method, path, response bytes)`` in :attr:`log` (and one line each in ``log_file`` if given),
    with bucket ``bucket`` created. :meth:`count` counts them, e.g. the data-file GETs of one table:
    ``srv.count("GET", "/rollouts.lance/data/")``. For the tests' and benches' request counts.

    Conditional writes are atomic, as on S3: a ``PUT`` with ``If-None-Match`` or ``If-Match`` is answered
    under one lock. moto checks the condition and then writes, with no lock between (moto 5.2), so two
    racing ``If-None-Match: *`` PUTs of one key can both succeed; eight threads racing on each of 200 keys
    did so for 3 keys here, and one suite run lost a writer's commit that way (1,596 of 1,600 rows in
    ``test_eight_writer_processes_lose_and_double_nothing``). Lance's commits on S3 rely on that refusal.
    """

    def __init__(self, port: int, bucket: str, log_file: str | None = None):
        import threading

        import boto3
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        self.log: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        self._file = open(log_file, "a", buffering=1) if log_file else None  # noqa: SIM115
        app = DomainDispatcherApplication(create_backend_app)

        self._active = 0  # requests being answered

        self._conditional = threading.Lock()  # one conditional PUT at a time: check and write as one step

        def counted(environ: dict[str, Any], start_response: Any) -> Any:
            with self._lock:
                self._active += 1
            n = 0
            try:
                if environ["REQUEST_METHOD"] == "PUT" and ("HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ):
                    with self._conditional:
                        body = list(app(environ, start_response))
                else:
                    body = app(environ, start_response)
                for chunk in body:
                    n += len(chunk)
                    yield chunk
            finally:
                rec = (environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), n)
                with self._lock:
                    self._active -= 1
                    self.log.append(rec)
                    if self._file:
                        self._file.write(" ".join(map(str, rec)) + "\n")

        self.endpoint = f"http://127.0.0.1:{port}"
        self._srv = make_server("127.0.0.1", port, counted, threaded=True, request_handler=MotoRequestHandler)
        threading.Thread(target=self._srv.serve_forever, daemon=True).start()
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="x",
                     aws_secret_access_key="x").create_bucket(Bucket=bucket)

    def count(self, method: str | None = None, path_part: str = "") -> tuple[int, int]:
        """``(requests, response bytes)`` answered so far with ``method`` (any: None) whose path contains
        ``path_part`` (after the requests being answered, if any, finish: up to 5 s)."""
        import time

        deadline = time.monotonic() + 5
        while self._active and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            hits = [b for m, p, b in self.log if (method is None or m == method) and path_part in p]
        return len(hits), sum(hits)

    def stop(self) -> None:
        self._srv.shutdown()
        if self._file:
            self._file.close()
