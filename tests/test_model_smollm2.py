"""SmolLM2-135M (llama architecture, Q4_1) against the independent reference."""
import pytest

import llambda
from conftest import load_reference
from refcheck import check_greedy, check_top20

REF = load_reference("smollm2_logits.json")["prompts"]


@pytest.fixture(scope="module")
def numpy_model(smollm2_gguf):
    with llambda.load(smollm2_gguf, backend="numpy", n_ctx=256) as m:
        yield m


@pytest.mark.parametrize("case", REF, ids=[c["prompt"][:24] for c in REF])
def test_numpy_backend_matches_reference(numpy_model, case):
    logits = numpy_model.logits(case["prompt_ids"])
    check_top20(logits, case, 1e-2)
    ours = list(numpy_model.generate(case["prompt_ids"], max_tokens=32, temperature=0, ignore_eos=True))
    check_greedy(ours, case, 0.05)


def test_tokenizer_gives_reference_prompt_ids(numpy_model):
    for case in REF:
        assert numpy_model.tokenize(case["prompt"]) == case["prompt_ids"]
