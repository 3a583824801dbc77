"""The q8_0 KV cache (kv_type="q8_0") on real models: about half of f16's memory, logits within the
fast mode's budget against the FP32 reference, and a model whose keys carry huge channels
(Qwen2.5's k_proj bias) stays within it (plain Q8_0 blocks moved its logits by 10: see the C core's
q8_0_row). The kernels themselves are tested against NumPy in test_native_ops.py, batch invariance
in test_batch_invariance.py.

Exact activations isolate what the cache costs: measured worst top-20 deviations from the reference
were 0.22 (SmolLM2), 0.21 (Qwen2.5-Coder-0.5B), 0.13 (Gemma-3-270M), against 0.01 with f16.
"""
import pytest

import llambda
from conftest import load_reference
from refcheck import check_greedy, check_top20

FAST_BUDGET, FAST_GAP = 0.5, 0.5  # the native fast mode's budget (test_real_models.py)


@pytest.mark.model  # reaches its model through getfixturevalue
@pytest.mark.parametrize("fixture,ref", [("smollm2_gguf", "smollm2_logits.json"), ("qwen05_gguf", "qwen05_logits.json")])
def test_q8_0_cache_within_the_fast_budget(request, fixture, ref):
    path = request.getfixturevalue(fixture)
    prompts = load_reference(ref)["prompts"]
    with llambda.load(path, n_ctx=256, activations="f32", kv_type="q8_0") as m:
        for case in prompts:
            check_top20(m.logits(case["prompt_ids"]), case, FAST_BUDGET)
            ours = list(m.generate(case["prompt_ids"], max_tokens=32, temperature=0, ignore_eos=True))
            check_greedy(ours, case, FAST_GAP)


def test_q8_0_cache_is_about_half_of_f16(smollm2_gguf):
    sizes = {}
    for kv in ("f16", "q8_0"):
        with llambda.load(smollm2_gguf, n_ctx=512, kv_type=kv) as m:
            cache = m.transformer.cache
            sizes[kv] = sum(a.nbytes for a in cache.k + cache.v) + sum(b.nbytes for b in cache.kbase if b is not None)
    # 34 bytes per 32 values against 64, plus one f32 key row per slot and layer
    assert sizes["q8_0"] <= 0.55 * sizes["f16"], sizes


def test_q8_0_needs_whole_blocks_per_head():
    from llambda.backends.native import NativeBackend
    from llambda.errors import InvalidInputError

    be = NativeBackend(kv_type="q8_0")
    with pytest.raises(InvalidInputError, match="multiple of 32"):
        be.create_kv_cache(2, 1, 16, 2, 48)
    cache = be.create_kv_cache(2, 1, 16, 2, 64)
    assert cache.k[0].nbytes == 16 * 2 * 64 // 32 * 34 and cache.kbase[0].shape == (1, 128)


def test_cli_takes_kv_type_q8_0():
    from llambda.cli import build_parser

    for cmd in (["run", "hi"], ["serve"], ["bench"]):
        assert build_parser().parse_args(cmd + ["--kv-type", "q8_0"]).kv_type == "q8_0"
