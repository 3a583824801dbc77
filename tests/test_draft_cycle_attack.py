"""Two threads giving two models each other as draft at once (the attack round): one of them must be
refused. set_draft checked for a cycle of drafts, then built the drafter, then set it: both calls passed
the check, a drafted with b and b with a, and their speculative rounds from two threads (each holding its
own lock, then wanting the other's) could deadlock.
"""
import threading
from pathlib import Path

import llambda
from llambda import speculative
from llambda.errors import InvalidInputError

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"


def test_two_models_made_each_others_draft_at_once_make_no_cycle(monkeypatch):
    both_building = threading.Barrier(2, timeout=2)
    real = speculative.DraftModel

    def slow_draft_model(*a, **kw):         # both calls past the cycle check at once (or the barrier gives up)
        try:
            both_building.wait()
        except threading.BrokenBarrierError:
            pass
        return real(*a, **kw)
    monkeypatch.setattr(speculative, "DraftModel", slow_draft_model)
    with llambda.load(TINY, n_ctx=64) as a, llambda.load(TINY, n_ctx=64) as b:
        refused = []

        def give(x, y):
            try:
                x.set_draft(y)
            except InvalidInputError as e:
                refused.append(str(e))
        threads = [threading.Thread(target=give, args=(a, b)), threading.Thread(target=give, args=(b, a))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not (a.draft is b and b.draft is a)
        assert len(refused) == 1 and "cycle" in refused[0]
