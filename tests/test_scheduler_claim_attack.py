"""Two schedulers started at once on one model (the attack round): exactly one may own it. The check that
no running scheduler owns the model and the claim were two steps, so two threads starting servers of the
same model at once could both pass the check, and two loops then ran forwards on its buffers and slots.
"""
import threading
from pathlib import Path

import pytest

import llambda
from llambda.errors import ModelBusyError
from llambda.models import base
from llambda.server.metrics import Metrics
from llambda.server.scheduler import Scheduler

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"


def test_two_schedulers_started_at_once_claim_the_model_once(monkeypatch):
    both_checked = threading.Barrier(2, timeout=2)
    real = base.live_server

    def slow_check(model):        # both starters inside the check at once (or the barrier gives up)
        seen = real(model)
        try:
            both_checked.wait()
        except threading.BrokenBarrierError:
            pass
        return seen
    monkeypatch.setattr(base, "live_server", slow_check)
    with llambda.load(TINY, n_ctx=64, n_slots=2) as m:
        scheds = [Scheduler(m.transformer, Metrics(), n_slots=2) for _ in range(2)]
        outcome = {}

        def start(i):
            try:
                scheds[i].start()
                outcome[i] = "started"
            except ModelBusyError:
                outcome[i] = "busy"
        threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        try:
            assert sorted(outcome.values()) == ["busy", "started"], outcome
        finally:
            for s in scheds:
                s.stop()
