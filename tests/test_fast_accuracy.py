"""The fast mode (8-bit activations) against the FP32 oracle (the NumPy backend on the same file), with
llama.cpp's own error on the same file and prompts as the budget.

The error is the worst |difference| over the oracle's top-20 logits at a position, taken at every
position of six prompts (not from this repository's fixtures). llama.cpp quantizes activations to
8 bits with one scale per 32 values for the 32-block types and more coarsely for the K-quants (one per
256), so its error is the yardstick. Before the outlier blocks' residual codes (LLB_OUTLIER in
csrc/matmul/kernels/kernels.h), measured where each source of error was switched to FP32 one at a
time (SmolLM2 Q4_1, mean over positions 0.368): the Q/K/V input alone gave 0.271, each other matmul
0.34-0.38; the f16 KV cache and every other op ~0 (f32 activations match the oracle to 1e-3).
"""
import sys
from pathlib import Path

import pytest

from llambda.backends import available_backends
from llambda.tools.logit_error import errors, llama_cpp_errors, oracle

PROMPTS = [
    "The history of the Roman Empire spans more than a thousand years, beginning with",
    "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot =",
    "<|im_start|>user\nWhat are three tips for staying healthy?<|im_end|>\n<|im_start|>assistant\n",
    "Le chat noir dort sur le canapé pendant que la pluie tombe. Demain, nous irons",
    "Q: If a train travels 60 miles per hour for 2.5 hours, how far does it go?\nA:",
    "Photosynthesis is the process by which green plants convert light energy into chemical energy. "
    "The main steps are",
]

# llama.cpp's (llama-cpp-python 0.3.36, logits_all) error on these prompts: mean and worst over all positions.
LLAMA_CPP_ERROR = {
    "smollm2_gguf": (0.391, 1.587),      # SmolLM2-135M-Instruct Q4_1 (ours measured 0.368, 0.909)
    "qwen05_gguf": (0.195, 0.989),       # Qwen2.5-Coder-0.5B-Instruct Q4_K_M (ours 0.141, 0.848)
}


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("fixture", list(LLAMA_CPP_ERROR))
def test_fast_mode_is_no_less_accurate_than_llama_cpp(fixture, request):
    if "native" not in available_backends():
        pytest.skip("the C core is not built: no fast mode")
    path = request.getfixturevalue(fixture)
    ids, refs = oracle(path, PROMPTS)
    assert errors(path, ids, refs, backend="native", activations="f32").max() < 2e-3
    fast = errors(path, ids, refs, backend="native")
    mean, worst = LLAMA_CPP_ERROR[fixture]
    assert fast.mean() <= mean and fast.max() <= worst, (fast.mean(), fast.max())
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return          # the written figures stand for llama.cpp
    theirs = llama_cpp_errors(path, ids, refs)
    assert fast.mean() <= theirs.mean() * 1.05, (fast.mean(), theirs.mean())


# llama.cpp's pure requantizations of SmolLM2 (its F16 export, every matrix in the type: bench/llamacpp_files.py),
# llama.cpp's (llama-cpp-python 0.3.36, logits_all) mean and worst error on PROMPTS: the budget of each type.
# Measured with `python bench/bench_accuracy.py --prompts-file PROMPTS.json` (2026-12-02).
LLAMA_CPP_ERROR_BY_TYPE = {
    "q4_0": (0.397, 1.704),       # ours 0.164, 0.568
    "q4_1": (0.399, 1.612),       # ours 0.174, 0.483
    "q5_0": (0.377, 1.390),       # ours 0.162, 1.026
    "q5_1": (0.419, 0.982),       # ours 0.168, 0.677
    "q8_0": (0.398, 1.539),       # ours 0.161, 1.067
    "iq4_nl": (0.417, 1.663),     # ours 0.146, 0.336
    "mxfp4_moe": (0.413, 1.669),  # ours 0.152, 0.719
    # K-quants: SmolLM2's 576-wide rows are not whole 256-blocks, so llama.cpp gives those matrices a
    # 32-block type (Q4_K -> Q5_0, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL): only ffn_down is in the K-quant.
    "q4_k_s": (0.634, 2.711),     # ours 0.233, 0.985
    "q6_k": (0.567, 2.077),       # ours 0.216, 0.715
    "iq4_xs": (0.571, 1.846),     # ours 0.195, 0.621
}


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("ftype", list(LLAMA_CPP_ERROR_BY_TYPE))
def test_fast_mode_per_type_no_less_accurate_than_llama_cpp(ftype, smollm2_gguf):
    if "native" not in available_backends():
        pytest.skip("the C core is not built: no fast mode")
    pytest.importorskip("llama_cpp", reason="llama.cpp's quantizer makes the files (the bench extra)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from llamacpp_files import f16_source, llama_file
    path = llama_file(f16_source(str(smollm2_gguf)), ftype, pure=True)
    ids, refs = oracle(path, PROMPTS)
    fast = errors(path, ids, refs, backend="native")
    mean, worst = LLAMA_CPP_ERROR_BY_TYPE[ftype]
    assert fast.mean() <= mean and fast.max() <= worst, (fast.mean(), fast.max())
