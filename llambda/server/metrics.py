"""Server counters, rendered in the Prometheus text exposition format.

The scheduler thread and the HTTP event loop both write here, so every update
takes one small lock; reads for /metrics take it once and format a snapshot.
"""
from __future__ import annotations

import threading
import time
from collections import deque

# Upper bounds (seconds) of the time-to-first-token histogram buckets.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_WINDOW = 10.0   # tokens/s is averaged over this many seconds


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}     # (endpoint, status) -> count
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0                      # prompt tokens whose KV came from the prefix cache
        self.generated_tokens = 0
        self.sequences_finished: dict[str, int] = {}       # finish reason ("stop", "length", "cancelled", ...)
        self.steps = 0
        self.step_tokens = 0                               # tokens evaluated by all forward steps
        self.forward_seconds = 0.0                         # time in the model's forward pass
        self.step_seconds = 0.0                            # forward + sampling + bookkeeping
        self.in_flight = 0                                 # HTTP requests being served
        self.connections_dropped: dict[str, int] = {}      # closed by the server: "cap", "timeout", "fds", "stalled"
        self.draft_tokens = 0                              # speculative decoding: tokens drafted and verified
        self.draft_accepted = 0                            # ... and of those, accepted
        self.images = 0                                    # images through the image worker's vision tower
        self.image_seconds = 0.0                           # ... and the time it took (decoding, encoding)
        self.image_refusals: dict[str, int] = {}           # "queue_full" (429), "invalid_image", "rows_memory" (400)
        self.image_rows_waits = 0                          # requests that waited for room for their images' rows
        self.ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0
        self._recent: deque[tuple[float, int]] = deque()   # (time, tokens generated) per step
        self.started = time.time()

    # -- writers -------------------------------------------------------------
    def request_done(self, endpoint: str, status: int) -> None:
        with self._lock:
            key = (endpoint, status)
            self.requests[key] = self.requests.get(key, 0) + 1

    def request_started(self, delta: int) -> None:
        with self._lock:
            self.in_flight += delta

    def connection_dropped(self, reason: str) -> None:
        with self._lock:
            self.connections_dropped[reason] = self.connections_dropped.get(reason, 0) + 1

    def prompt(self, n_tokens: int, n_cached: int) -> None:
        with self._lock:
            self.prompt_tokens += n_tokens
            self.cached_prompt_tokens += n_cached

    def step(self, n_evaluated: int, n_generated: int, forward_s: float = 0.0, step_s: float = 0.0) -> None:
        now = time.monotonic()
        with self._lock:
            self.steps += 1
            self.forward_seconds += forward_s
            self.step_seconds += step_s
            self.step_tokens += n_evaluated
            self.generated_tokens += n_generated
            if n_generated:
                self._recent.append((now, n_generated))
            self._trim(now)

    def speculation(self, drafted: int, accepted: int) -> None:
        with self._lock:
            self.draft_tokens += drafted
            self.draft_accepted += accepted

    def images_encoded(self, n: int, seconds: float) -> None:
        with self._lock:
            self.images += n
            self.image_seconds += seconds

    def image_refused(self, reason: str) -> None:
        with self._lock:
            self.image_refusals[reason] = self.image_refusals.get(reason, 0) + 1

    def image_rows_waited(self) -> None:
        with self._lock:
            self.image_rows_waits += 1

    def first_token(self, seconds: float) -> None:
        with self._lock:
            i = 0
            while i < len(TTFT_BUCKETS) and seconds > TTFT_BUCKETS[i]:
                i += 1
            self.ttft_counts[i] += 1
            self.ttft_sum += seconds

    def finished(self, reason: str) -> None:
        with self._lock:
            self.sequences_finished[reason] = self.sequences_finished.get(reason, 0) + 1

    def _trim(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] > RATE_WINDOW:
            self._recent.popleft()

    # -- readers ---------------------------------------------------------------
    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            if not self._recent:
                return 0.0
            total = sum(n for _, n in self._recent)
            span = max(now - self._recent[0][0], 1.0)
        return total / span

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        """Prometheus text; `gauges` adds live values (name -> (help, value)) from the scheduler."""
        tps = self.tokens_per_second()
        with self._lock:
            lines: list[str] = []

            def metric(name, kind, help_text, samples):
                lines.append(f"# HELP llambda_{name} {help_text}")
                lines.append(f"# TYPE llambda_{name} {kind}")
                for labels, value in samples:
                    lines.append(f"llambda_{name}{labels} {_num(value)}")

            metric("requests_total", "counter", "HTTP requests by endpoint and status code",
                   [(f'{{endpoint="{e}",status="{s}"}}', n) for (e, s), n in sorted(self.requests.items())]
                   or [("", 0)])
            metric("requests_in_flight", "gauge", "HTTP requests being served", [("", self.in_flight)])
            metric("connections_dropped_total", "counter",
                   "connections the server closed unserved: over --max-connections, too slow to send a "
                   "request, while out of file descriptors, or reading none of a response (--send-timeout)",
                   [(f'{{reason="{r}"}}', n) for r, n in sorted(self.connections_dropped.items())] or [("", 0)])
            metric("prompt_tokens_total", "counter", "prompt tokens received (tokens in)", [("", self.prompt_tokens)])
            metric("prompt_tokens_cached_total", "counter", "prompt tokens whose KV was reused from the prefix cache",
                   [("", self.cached_prompt_tokens)])
            metric("generated_tokens_total", "counter", "tokens generated (tokens out)", [("", self.generated_tokens)])
            metric("sequences_finished_total", "counter", "sequences ended, by reason",
                   [(f'{{reason="{r}"}}', n) for r, n in sorted(self.sequences_finished.items())] or [("", 0)])
            metric("steps_total", "counter", "batched forward steps", [("", self.steps)])
            metric("step_tokens_total", "counter", "tokens evaluated by forward steps (decode + prefill)",
                   [("", self.step_tokens)])
            metric("forward_seconds_total", "counter", "seconds spent in batched forward passes",
                   [("", self.forward_seconds)])
            metric("step_seconds_total", "counter", "seconds spent in steps (forward, sampling, bookkeeping)",
                   [("", self.step_seconds)])
            metric("draft_tokens_total", "counter", "tokens drafted by speculative decoding and verified",
                   [("", self.draft_tokens)])
            metric("draft_tokens_accepted_total", "counter", "drafted tokens the model accepted (its own choice)",
                   [("", self.draft_accepted)])
            metric("tokens_per_second", "gauge", f"generated tokens per second over the last {RATE_WINDOW:g} s",
                   [("", tps)])
            metric("images_encoded_total", "counter", "images a request's chat held, through the vision tower "
                   "(an image sent again takes the rows encoded lately)", [("", self.images)])
            metric("image_encode_seconds_total", "counter", "seconds the image worker spent on them (decoding and "
                   "encoding)", [("", self.image_seconds)])
            metric("image_refusals_total", "counter", "requests with images refused by the image worker: its "
                   "queue full (429), an image the decoder refuses (400) or rows past --image-rows-memory (400)",
                   [(f'{{reason="{r}"}}', n) for r, n in sorted(self.image_refusals.items())] or [("", 0)])
            metric("image_rows_waits_total", "counter", "requests whose images waited for room in "
                   "--image-rows-memory before their encoding", [("", self.image_rows_waits)])
            for name, (help_text, value) in gauges.items():
                metric(name, "gauge", help_text, [("", value)])
            lines.append("# HELP llambda_time_to_first_token_seconds time from arrival to first generated token")
            lines.append("# TYPE llambda_time_to_first_token_seconds histogram")
            cumulative = 0
            for bound, count in zip(TTFT_BUCKETS, self.ttft_counts):
                cumulative += count
                lines.append(f'llambda_time_to_first_token_seconds_bucket{{le="{bound:g}"}} {cumulative}')
            cumulative += self.ttft_counts[-1]
            lines.append(f'llambda_time_to_first_token_seconds_bucket{{le="+Inf"}} {cumulative}')
            lines.append(f"llambda_time_to_first_token_seconds_sum {_num(self.ttft_sum)}")
            lines.append(f"llambda_time_to_first_token_seconds_count {cumulative}")
        return "\n".join(lines) + "\n"


def _num(v) -> str:
    if isinstance(v, float):
        return repr(round(v, 6))
    return str(v)
