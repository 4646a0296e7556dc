"""``GET /metrics`` of ``gfcr serve``: counters and histograms in Prometheus's text format
(requests, tokens, engine calls, batch rows, queue time)."""

from __future__ import annotations

from collections.abc import Sequence

_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets, self.counts, self.sum, self.n = tuple(buckets), [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        self.n += 1
        self.sum += float(v)
        for k, b in enumerate(self.buckets):
            if v <= b:
                self.counts[k] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{_num(b)}"}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {_num(self.sum)}", f"{name}_count {self.n}"]


def _num(x: float) -> str:
    return repr(float(x)) if not float(x).is_integer() else f"{float(x):.1f}"


class ServeMetrics:
    """Counters behind ``GET /metrics``, rendered in Prometheus' text format (version 0.0.4): requests by
    route and status, prompt and generated tokens, requests running, engine calls, the rows of each
    engine call (histogram) and each job's time in the batcher's queue (histogram). vLLM names its own
    ``vllm:*`` (``vllm/v1/metrics/loggers.py``); these are gfcr's, prefixed ``gfcr_``. Thread-safe."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.running = 0
        self.engine_calls = 0
        self.rows = _Histogram(_ROWS_BUCKETS)
        self.queue = _Histogram(_WAIT_BUCKETS)

    def request(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1

    def tokens(self, prompt: int, generated: int) -> None:
        with self._lock:
            self.prompt_tokens += int(prompt)
            self.generation_tokens += int(generated)

    def batch(self, rows: int, waits: Sequence[float]) -> None:
        """One engine call of ``rows`` rows, whose jobs waited ``waits`` seconds in the queue."""
        with self._lock:
            self.engine_calls += 1
            self.rows.observe(rows)
            for w in waits:
                self.queue.observe(w)

    def render(self) -> str:
        with self._lock:
            out = ["# HELP gfcr_requests_total HTTP requests answered, by route and status code.",
                   "# TYPE gfcr_requests_total counter"]
            out += [f'gfcr_requests_total{{route="{r}",code="{c}"}} {n}' for (r, c), n in sorted(self.requests.items())]
            for name, kind, help_, v in (
                ("gfcr_prompt_tokens_total", "counter", "Prompt tokens of the generation requests served.", self.prompt_tokens),
                ("gfcr_generation_tokens_total", "counter", "Tokens generated.", self.generation_tokens),
                ("gfcr_requests_running", "gauge", "Generation requests in progress (queued or decoding).", self.running),
                ("gfcr_engine_calls_total", "counter", "engine.generate calls made by the batcher.", self.engine_calls)):
                out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {v}"]
            out += ["# HELP gfcr_batch_rows Rows (samples) per engine call.", "# TYPE gfcr_batch_rows histogram",
                    *self.rows.lines("gfcr_batch_rows"),
                    "# HELP gfcr_queue_time_seconds Time a request waited in the batcher's queue before its engine call.",
                    "# TYPE gfcr_queue_time_seconds histogram", *self.queue.lines("gfcr_queue_time_seconds")]
        return "\n".join(out) + "\n"
