"""Continuous batching: one thread owns the model and advances every sequence together.

Each step builds one batch: the next token of every decoding sequence plus a
bounded chunk of prompt tokens of sequences still prefilling, runs one forward
pass over it (one GEMM per weight for the whole batch), and samples one token
per sequence whose logits were asked for. Requests join between steps; a long
prompt is spread over several steps so running streams keep flowing. Finished,
cancelled or disconnected sequences give their KV slot back before the next
step, and the slot's KV stays cached for a later request with the same prefix.

Per-sequence state lives in `engine.Sequence`, the same object the single-stream
API uses, so batched and sequential generation sample identically.

Events go to each request's `Channel` (an asyncio queue on the server's event
loop). A step's events for every channel of one loop go over in a single
`call_soon_threadsafe`: each such call writes the loop's wake-up pipe, and one
per stream per step cost the scheduler thread ~40 us each at 8 streams.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..constraints import ConstraintError, bounds
from ..engine import Sequence
from ..errors import ModelBusyError, ModelClosedError
from ..models.images import BatchImages, chunk_end, rope_rows
from ..sampling import top_k_indices
from .metrics import Metrics
from .prefix_cache import SlotTable

_CLAIMS = threading.Lock()      # a scheduler's check that no other owns its models, and its claim of them

log = logging.getLogger("llambda.server")

WAITING, PREFILL, DECODE, DONE = "waiting", "prefill", "decode", "done"


@dataclass
class JobFailure:
    """A sequence ended without finishing: the server is shutting down or a step failed."""
    status: int
    message: str
    kind: str = "server_error"


@dataclass
class PromptLogprobs:
    """Logprobs of a sequence's prompt tokens (echo with logprobs), sent before its first token.

    entries: (token, logprob, top) per prompt token; the first has no context: logprob and top None.
    """
    entries: list


class Channel:
    """Where one HTTP request's events arrive: lists of (choice index, TokenEvent | PromptLogprobs | JobFailure)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    async def get(self) -> list:
        """Every list pushed so far, flattened (waits for at least one)."""
        items = list(await self.queue.get())
        while not self.queue.empty():
            items.extend(self.queue.get_nowait())
        return items


def _deliver(batch: list) -> None:
    for channel, items in batch:
        channel.queue.put_nowait(items)


def push_all(batch: list) -> None:
    """Hand (channel, items) pairs to their event loops: one wake-up per loop (any thread)."""
    by_loop: dict = {}
    for channel, items in batch:
        by_loop.setdefault(channel.loop, []).append((channel, items))
    for loop, part in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, part)
        except RuntimeError:   # the loop is closed: nobody listens any more
            pass


class Job:
    """One sequence (one choice of one request) as the scheduler sees it."""

    def __init__(self, seq: Sequence, channel: Channel, index: int, after: "Job | None" = None,
                 prompt_logprobs: int | None = None, speculation=None):
        self.seq = seq
        self.speculation = speculation     # a speculative.Speculation, or None: plain decoding
        self.channel = channel
        self.index = index                 # the choice index in the request
        self.after = after                 # admit only once this sibling has prefilled (shares its KV)
        self.prompt = seq.prompt_ids
        self.state = WAITING
        self.slot = -1
        self.n_computed = 0                # positions 0..n_computed-1 of the slot hold this job's KV
        self.n_cached = 0                  # prompt tokens reused from the prefix cache
        self.cancelled = False
        self.t_submit = time.monotonic()
        self.t_first: float | None = None
        # top alternatives per prompt token when the prompt's own logprobs are wanted, else None
        self.prompt_logprobs = prompt_logprobs
        self.plp_entries: list = []
        # (drafts, logit rows) of a step whose grammar budget was spent before its turn: sampled first
        # in the next step, which does not feed it (bounds.StepMasks)
        self.held: tuple[list, np.ndarray] | None = None
        # called once when the job no longer reads its prompt's image rows (server/image_rows: the request's
        # lease on the rows' memory), or None
        self.images_done = None

    def drop_images(self) -> None:
        """Its prompt's image rows are read no more (prefilled, or the job ended): the sequence keeps their keys
        only, and `images_done` is called, once. Scheduler thread (or before the job was queued)."""
        self.seq.drop_image_rows()
        done, self.images_done = self.images_done, None
        if done is not None:
            done()

    def cancel(self) -> None:
        """Safe from any thread; the scheduler frees the slot before its next step."""
        self.cancelled = True

    @property
    def finished(self) -> bool:
        return self.state == DONE


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


class Scheduler:
    def __init__(self, transformer, metrics: Metrics | None = None, n_slots: int | None = None,
                 prefill_chunk: int = 256, queue_size: int = 64, min_prefix_reuse: int = 4,
                 spec_rows: int = 16):
        self.model = transformer
        # M-RoPE (Qwen2-VL): rows' RoPE positions apart from their cache positions after an image
        self.mrope = bool(getattr(getattr(transformer, "cfg", None), "rope_sections", None))
        # Batched greedy output must equal one-at-a-time output bit for bit: every matmul row
        # and attention row is summed in an order that does not depend on the batch.
        backend = getattr(transformer, "backend", None)
        if hasattr(backend, "set_batch_invariant"):
            backend.set_batch_invariant(True)
        self.metrics = metrics or Metrics()
        self.n_slots = int(n_slots or transformer.n_slots)
        if not 1 <= self.n_slots <= transformer.n_slots:
            raise ValueError(f"n_slots must be in 1..{transformer.n_slots}")
        self.max_batch = transformer.ws.max_tokens
        # logit rows one step may ask for without a fresh (rows x vocab) array: bounds prompt-logprob chunks
        self.max_rows = max(self.n_slots, int(getattr(transformer.ws, "max_logit_rows", 16)))
        if self.n_slots > self.max_batch:
            raise ValueError(f"{self.n_slots} slots do not fit a batch of {self.max_batch} tokens")
        # every slot's KV pages in memory now, not in the middle of other users' steps
        commit = getattr(transformer.cache, "commit", None)
        if commit is not None:
            commit()
        self.prefill_chunk = max(1, int(prefill_chunk))
        # decode rows (each stream's token plus its drafts) a step may hold before speculation steps
        # aside: past it, verifying drafts would slow the other streams more than it gains
        self.spec_rows = min(int(spec_rows), self.max_rows, self.max_batch)
        self.queue_size = int(queue_size)
        self.slots = SlotTable(self.n_slots, min_reuse=min_prefix_reuse)
        self.recurrent = bool(getattr(getattr(transformer, "cfg", None), "recurrent", False))
        self._waiting: deque[Job] = deque()
        self._active: list[Job] = []           # in admission order (prefill fairness: first come first)
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._drain_deadline: float | None = None
        self._outbox: dict[Channel, list] = {}
        self._calls: deque = deque()           # (fn, Future): work run on this thread between steps
        # for health(): when the loop last finished a round, and since when work has been waiting
        self._progress = time.monotonic()
        self._busy_since: float | None = None

    # -- control (any thread) ------------------------------------------------
    def start(self, also=()) -> None:
        """Start the loop; it owns the model's forward passes and slots until stop(), and those of the
        transformers in `also` (a draft model's, which its steps run too); ModelBusyError when another
        running scheduler owns one of them."""
        if self._thread is not None:
            return
        from ..models.base import live_server
        owned = [self.model, *also]
        with _CLAIMS:       # checked and claimed in one step: two starting at once had both passed the check
            for t in owned:
                if live_server(t) is not None:
                    raise ModelBusyError("this model is already served by another running scheduler: two would "
                                         "overwrite each other's buffers and KV-cache slots; load it again for a "
                                         "second")
            self._thread = threading.Thread(target=self._run, name="llambda-scheduler", daemon=True)
            # claimed before the loop runs: a library call from here on is refused, not interleaved (the
            # thread stays there once stopped: the library then knows slot 0 no longer holds its prefix)
            for t in owned:
                t.served_by = self._thread
            self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Cancel everything still running (their streams get a 503 failure) and join the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def drain(self, grace: float) -> None:
        """Stop taking requests; let running ones finish for `grace` seconds, then cancel them."""
        with self._cv:
            if self._drain_deadline is None:
                self._drain_deadline = time.monotonic() + max(0.0, grace)
            self._cv.notify_all()

    @property
    def draining(self) -> bool:
        return self._drain_deadline is not None or self._stopping

    def capacity(self) -> int:
        """Sequences the scheduler holds at once: running in slots plus waiting in the queue."""
        return self.n_slots + self.queue_size

    def submit(self, jobs: list[Job]) -> None:
        """Queue a request's sequences, all or none. Raises QueueFull or ShuttingDown."""
        with self._cv:
            if self.draining:
                raise ShuttingDown("the server is shutting down")
            # cancelled jobs (clients gone) leave at the next step: they do not count against newcomers
            held = sum(not j.cancelled for j in self._waiting) + sum(not j.cancelled for j in self._active)
            if held + len(jobs) > self.capacity():
                raise QueueFull(f"the server is busy ({len(self._active)} running, {len(self._waiting)} queued)")
            if not self._has_work_locked():
                self._busy_since = time.monotonic()
            self._waiting.extend(jobs)
            self._cv.notify_all()

    def call(self, fn):
        """Run fn() on the scheduler thread between two steps (so it may use the model's buffers)
        and return its result; from any other thread. Raises ShuttingDown when stopping."""
        fut = concurrent.futures.Future()
        with self._cv:
            if self.draining or self._thread is None:
                raise ShuttingDown("the server is shutting down")
            self._calls.append((fn, fut))
            self._cv.notify_all()
        return fut.result()

    def _run_calls(self) -> None:
        with self._cv:
            calls, self._calls = list(self._calls), deque()
        for fn, fut in calls:
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

    def wake(self) -> None:
        """Have the loop look at cancellations now (it also does so before each step)."""
        with self._cv:
            self._cv.notify_all()

    def stats(self) -> dict[str, int]:
        with self._cv:
            return {"waiting": len(self._waiting), "active": len(self._active),
                    "busy_slots": self.n_slots - self.slots.n_free(), "slots": self.n_slots}

    def health(self, stall_after: float) -> str | None:
        """Why completions cannot be served now, or None: the thread is not running, or it has not
        finished a round in `stall_after` seconds while work waits (a step stuck or looping)."""
        if self._stopping or self._drain_deadline is not None:
            return "the server is shutting down"
        thread = self._thread
        if thread is None or not thread.is_alive():
            return "the scheduler thread is not running"
        with self._cv:
            if not self._has_work_locked() or self._busy_since is None:
                return None
            quiet = time.monotonic() - max(self._progress, self._busy_since)
        if quiet > stall_after:
            return f"the scheduler has made no progress for {quiet:.0f} s with work waiting"
        return None

    def idle(self) -> bool:
        s = self.stats()
        return s["waiting"] == 0 and s["active"] == 0

    # -- the loop (scheduler thread) -----------------------------------------
    def _run(self) -> None:
        failures = 0
        while True:
            try:
                if not self._iterate():
                    return
                failures = 0
            except Exception as e:   # a bug outside the model step: fail what runs, keep serving
                log.exception("scheduler iteration failed")
                self._fail_active(JobFailure(500, f"internal scheduler error: {type(e).__name__}: {e}"))
                self._flush()
                failures += 1        # failing every round (out of memory, say): do not spin
                time.sleep(min(1.0, 0.01 * 2 ** min(failures, 7)))

    def _iterate(self) -> bool:
        """One round: admissions, one step, event delivery. False when stopped."""
        with self._cv:
            while not self._stopping and not self._has_work_locked():
                self._busy_since = None
                self._cv.wait(timeout=self._wait_timeout())
                self._check_drain_locked()
            if self._stopping:
                self._cancel_all_locked(JobFailure(503, "the server is shutting down"))
                for _, fut in self._calls:
                    fut.set_exception(ShuttingDown("the server is shutting down"))
                self._calls.clear()
                self._flush()
                return False
            self._check_drain_locked()
            self._drop_cancelled_locked()
            self._admit_locked()
        if self._calls:
            self._run_calls()
        if self._active:
            try:
                self._step()
            except ModelClosedError:    # the program serving the model closed it: no fault of the step's
                self._fail_active(JobFailure(503, "the model was closed (Model.close()) while this request ran; "
                                                  "this server can no longer generate"))
            except Exception as e:  # never let a bad step kill the server
                log.exception("forward step failed")
                # the step may have written part of the slots' KV: cache nothing from them
                self._fail_active(JobFailure(500, f"internal error in the model step: {type(e).__name__}: {e}"))
        self._flush()
        self._progress = time.monotonic()
        return True

    def _has_work_locked(self) -> bool:
        return bool(self._active or self._waiting or self._calls)

    def _wait_timeout(self) -> float | None:
        if self._drain_deadline is None:
            return None
        return max(0.01, self._drain_deadline - time.monotonic())

    def _check_drain_locked(self) -> None:
        if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
            if self._active or self._waiting:
                self._cancel_all_locked(JobFailure(503, "the server is shutting down; the request was cancelled"))

    def _cancel_all_locked(self, failure: JobFailure) -> None:
        for j in list(self._waiting) + self._active:
            self._emit(j, failure)
            self._end(j, "cancelled")
        self._waiting.clear()

    def _drop_cancelled_locked(self) -> None:
        if any(j.cancelled for j in self._waiting):
            kept = deque()
            for j in self._waiting:
                if j.cancelled:
                    j.state = DONE
                    j.drop_images()
                    self.metrics.finished("cancelled")
                else:
                    kept.append(j)
            self._waiting = kept
        for j in [j for j in self._active if j.cancelled]:
            self._end(j, "cancelled")

    def _admit_locked(self) -> None:
        if not self._waiting or self.slots.n_free() == 0:
            return
        kept = deque()
        while self._waiting:
            j = self._waiting.popleft()
            if self.slots.n_free() == 0 or (j.after is not None and j.after.state in (WAITING, PREFILL)):
                kept.append(j)
                continue
            self._place(j)
        self._waiting = kept

    def _place(self, j: Job) -> None:
        # prompt logprobs need the logits of every prompt position: no prefix reuse; nor in a hybrid
        # model, whose recurrent state holds where its slot's sequence ended, not the shared prefix
        p = self.slots.place(j.prompt, reuse=j.prompt_logprobs is None and not self.recurrent, images=j.seq.images)
        if p.copy_from >= 0:
            try:
                self.model.cache.copy_prefix(p.copy_from, p.slot, p.reuse)
            except Exception:   # a failed copy costs only the reuse: compute the prompt instead
                log.exception("prefix copy failed")
                p.reuse = 0
        j.slot = j.seq.slot = p.slot
        j.n_computed = j.n_cached = p.reuse
        j.state = PREFILL
        self.slots.acquire(p.slot, j.seq.tokens, p.reuse, j.seq.images)
        self._active.append(j)
        self.metrics.prompt(len(j.prompt), p.reuse)

    def _step(self) -> None:
        tokens: list[int] = []
        slots: list[int] = []
        pos: list[int] = []
        # M-RoPE (Qwen2-VL): each part's RoPE positions where a sequence's images moved them off its cache
        # positions ((k,) after its images, (k, 3) over an image's tokens), by the part's first batch row
        mrope = self.mrope
        rope: list[tuple[int, np.ndarray]] = []
        rows: list[int] = []                       # batch rows whose logits the forward returns
        samples: list[tuple[int, Job, list]] = []   # (index into those logits, job to sample, its drafts)
        scored: list[tuple[Job, int, int, int]] = []   # prompt logprobs: (job, first position, first logit, count)
        held = [j for j in self._active if j.held is not None]
        decoding = [j for j in self._active if j.state == DECODE and j.held is None]
        # rows left for drafts after every stream's own row and a row kept for each prompt being
        # prefilled (its last token's logits, or its prompt logprobs): drafts filling every row starved those
        room = self.spec_rows - len(self._active)
        for j in decoding:
            drafts = []
            if j.speculation is not None and room > 0:
                drafts = self._propose(j, room)
                room -= len(drafts)
            p0 = j.seq.next_pos
            if mrope and j.seq.rope_delta:
                rope.append((len(tokens), np.arange(p0, p0 + len(drafts) + 1) + j.seq.rope_delta))
            tokens.append(j.seq.tokens[-1])
            tokens.extend(drafts)
            slots.extend([j.slot] * (len(drafts) + 1))
            pos.extend(range(p0, p0 + len(drafts) + 1))
            samples.append((len(rows), j, drafts))
            rows.extend(range(len(tokens) - len(drafts) - 1, len(tokens)))
        budget = min(self.prefill_chunk, self.max_batch - len(tokens))
        chunks: list[tuple[Job, int]] = []
        images = BatchImages()
        for j in self._active:
            if budget <= 0:
                break
            if j.state != PREFILL or j.held is not None:
                continue
            start = j.n_computed
            take = min(budget, len(j.prompt) - start)
            room = self.max_batch - len(tokens)
            if j.prompt_logprobs is not None:
                take = min(take, self.max_rows - len(rows))
                room = min(room, self.max_rows - len(rows))
            elif start + take == len(j.prompt) and len(rows) >= self.max_rows:
                take -= 1                  # its last token needs a row: it goes in the next step
            if j.seq.images and take > 0:
                # never ending inside an image block (its rows need all its keys): cut back to the block, or
                # carried to its end, past prefill_chunk if need be (a block waits for a step with room)
                take = chunk_end(j.seq.images, start, start + take, start + room) - start
            if take <= 0:
                continue                   # no logit rows left in this step; the next one has room
            first = len(tokens)
            images.add(first, j.seq.images, start, start + take)
            r = rope_rows(j.seq.images, start, start + take) if mrope and j.seq.images else None
            if r is not None:
                rope.append((first, r))
            tokens.extend(j.prompt[start:start + take])
            slots.extend([j.slot] * take)
            pos.extend(range(start, start + take))
            budget -= take
            chunks.append((j, take))
            if j.prompt_logprobs is not None:
                scored.append((j, start, len(rows), take))
                rows.extend(range(first, first + take))
                if start + take == len(j.prompt):
                    samples.append((len(rows) - 1, j, []))
            elif start + take == len(j.prompt):
                rows.append(len(tokens) - 1)
                samples.append((len(rows) - 1, j, []))
        n = len(tokens)
        t0 = time.perf_counter()
        logits = None                     # no forward when every running sequence holds its logits
        if n:
            extra = {"images": images} if images else {}      # a text-only step: forward as it always was
            if rope:
                extra["rope"] = _rope_positions(pos, rope)
            logits = self.model.forward(np.asarray(tokens, np.int32), np.asarray(slots, np.int32),
                                        np.asarray(pos, np.int32), rows, **extra)
        t_forward = time.perf_counter() - t0
        images = extra = None             # (the batch's rows: the forward is done with them)
        for j, take in chunks:
            j.n_computed += take
            self.slots.set_valid(j.slot, j.n_computed)
            if j.n_computed >= len(j.prompt):
                j.drop_images()           # the prompt is in the cache: nothing reads its image rows again
        for j in decoding:
            j.n_computed = j.seq.next_pos + 1
            self.slots.set_valid(j.slot, j.n_computed)
        for j, start, r0, count in scored:
            try:
                j.plp_entries.extend(score_prompt(logits[r0:r0 + count], j.prompt, start, j.prompt_logprobs))
            except Exception as e:
                log.exception("prompt logprobs failed")
                self._emit(j, JobFailure(500, f"prompt logprobs failed: {type(e).__name__}: {e}"))
                with self._cv:
                    self._end(j, "error")
        work = [(j, *j.held) for j in held] + [(j, drafts, logits[r:r + len(drafts) + 1]) for r, j, drafts in samples]
        generated = self._sample_all(work)
        self.metrics.step(n, generated, t_forward, time.perf_counter() - t0)

    def _sample_all(self, work: list) -> int:
        """Sample every (job, drafts, logit rows) in order, the grammars' CPU within the step's budget
        (bounds.StepMasks): past it the rest wait for the next step and the dearest requests fail.
        The tokens generated."""
        generated = 0
        now = time.monotonic()
        # a format waiting for a thought to close asks for no mask: it raises no one's budget
        masks = bounds.StepMasks(sum(j.seq.live_constraint is not None for j, _, _ in work if j.state != DONE))
        for j, drafts, rows_j in work:
            if j.state == DONE:
                continue
            c = j.seq.constraint
            if c is not None and masks.hold():     # no more masks this step: the next one samples it first
                j.held = (drafts, np.array(rows_j))      # a copy: the forward's rows are the workspace's
                continue
            j.held = None
            try:
                events = self._sample(j, drafts, rows_j, self._budget_left(masks, c))
            except ConstraintError as e:   # the request's grammar cannot go on (its fault, not a 500)
                self._emit(j, JobFailure(400, f"the output constraint failed: {e}", "invalid_request_error"))
                with self._cv:
                    self._end(j, "error")
                continue
            except Exception as e:   # e.g. NaN logits: this sequence fails, the others go on
                log.exception("sampling failed")
                self._emit(j, JobFailure(500, f"sampling failed: {type(e).__name__}: {e}"))
                with self._cv:
                    self._end(j, "error")
                continue
            finally:
                self._charge(masks, j)
            if j.state == PREFILL:
                j.state = DECODE
                if j.prompt_logprobs is not None:
                    self._emit(j, PromptLogprobs(j.plp_entries))
                    j.plp_entries = []
            if j.t_first is None:
                j.t_first = now
                self.metrics.first_token(now - j.t_submit)
            for ev in events:
                generated += ev.token >= 0
                self._emit(j, ev)
            if j.seq.finished:
                with self._cv:
                    self._end(j, j.seq.finish_reason or "stop")
        self._refuse_dearest_masks(masks)
        return generated

    @staticmethod
    def _budget_left(masks, c):
        """verify's go_on for a sequence with grammar `c`: its next row's mask still fits the step."""
        return None if c is None else lambda: not masks.past(c.cpu_seconds)

    @staticmethod
    def _charge(masks, j: Job) -> None:
        """Add the CPU of a sampled sequence's grammar to the step; charged to its request while it
        runs (a sequence that ended costs no more: only the rest count)."""
        c = j.seq.constraint
        if c is not None:
            running = j.state != DONE and not j.seq.finished
            masks.add(c.take_cpu_seconds(), j.channel if running else None)

    def _refuse_dearest_masks(self, masks) -> None:
        """Past the step's mask budget, the dearest requests fail (a 400 in their own streams) so that
        the next steps' masks fit it; the others go on unchanged (bounds.py)."""
        refused = masks.to_refuse()
        if not refused:
            return
        total = sum(masks.charged.values())
        with self._cv:
            for channel in refused:
                failure = JobFailure(400, "the output constraint failed: "
                                     + bounds.step_budget_exceeded(masks.charged[channel], total, masks.sequences),
                                     "invalid_request_error")
                for j in [j for j in self._active if j.channel is channel]:
                    self._emit(j, failure)
                    self._end(j, "error")
                for j in self._waiting:      # its choices still queued: they leave before the next step
                    if j.channel is channel:
                        self._emit(j, failure)
                        j.cancel()

    def _propose(self, j: Job, room: int) -> list[int]:
        """Drafts for a decoding job (at most `room`); a drafter that fails costs only the speculation."""
        try:
            return j.speculation.propose(j.seq, room, j.slot)
        except Exception:
            log.exception("drafting failed; the sequence decodes without speculation")
            j.speculation = None
            return []

    def _sample(self, j: Job, drafts: list, logits, go_on=None) -> list:
        """The events of a job's step: one token, or with drafts the verified ones (the cache then
        holds the accepted drafts too: positions past them are overwritten by later steps).
        go_on: Speculation.settle's."""
        if not drafts:
            return [j.seq.step(logits[0])]
        events, kept = j.speculation.settle(j.seq, drafts, logits, go_on)
        self.metrics.speculation(len(drafts), kept)
        j.n_computed += kept
        self.slots.set_valid(j.slot, j.n_computed)
        return events

    def _fail_active(self, failure: JobFailure, forget: bool = True) -> None:
        with self._cv:
            for j in list(self._active):
                self._emit(j, failure)
                self._end(j, "error", forget=forget)

    def _end(self, j: Job, reason: str, forget: bool = False) -> None:
        """Take a job out of the running set and free its slot at once (caller holds the lock)."""
        if j.state == DONE:
            return
        if j.slot >= 0 and j.state != WAITING:
            if forget:
                self.slots.forget(j.slot)
            else:
                self.slots.release(j.slot)
        if j in self._active:
            self._active.remove(j)
        j.state = DONE
        j.drop_images()
        self.metrics.finished(reason)

    def _emit(self, j: Job, item) -> None:
        self._outbox.setdefault(j.channel, []).append((j.index, item))

    def _flush(self) -> None:
        box, self._outbox = self._outbox, {}
        if box:
            push_all(list(box.items()))


def score_prompt(logits: np.ndarray, prompt: list[int], start: int, top: int) -> list:
    """Logprob entries of the prompt tokens that rows for positions start.. predict.

    Row i holds the logits after position start+i, i.e. of prompt token start+i+1; position 0's
    own token has no context (None). Logprobs are log_softmax of the raw logits, as for sampling.
    """
    entries: list = []
    if start == 0:
        entries.append((int(prompt[0]), None, None))
    count = min(len(logits), len(prompt) - 1 - start)
    if count <= 0:
        return entries
    x = np.asarray(logits[:count], np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    if not np.all(np.isfinite(lse)):
        raise ValueError("logits are not finite")
    targets = np.asarray(prompt[start + 1:start + 1 + count])
    chosen = x[np.arange(count), targets] - lse
    for i in range(count):
        alts = []
        if top:
            best = top_k_indices(x[i], top)
            alts = [(int(t), float(x[i, t] - lse[i])) for t in best]
        entries.append((int(targets[i]), float(chosen[i]), alts))
    return entries


def _rope_positions(pos: list[int], parts: list) -> np.ndarray | list[int]:
    """A step's RoPE positions: its cache positions with each part's own written over them; one a row while
    every part gives one (a decode step's: its recorded plan takes them), else (n, 3)."""
    if all(r.ndim == 1 for _, r in parts):
        out = list(pos)
        for first, r in parts:
            out[first:first + len(r)] = r.tolist()
        return out
    out = np.repeat(np.asarray(pos, np.int64)[:, None], 3, axis=1)
    for first, r in parts:
        out[first:first + len(r)] = r if r.ndim == 2 else r[:, None]
    return out
