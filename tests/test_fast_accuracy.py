"""The fast mode (8-bit activations) against the FP32 oracle (the NumPy backend on the same file), with
llama.cpp's own error on the same file and prompts as the budget.

The error is the worst |difference| over the oracle's top-20 logits at a position, taken at every
position of six prompts (thirty for the per-type test; none from the fixtures). llama.cpp quantizes activations to
8 bits with one scale per 32 values for the 32-block types and more coarsely for the K-quants (one per
256), so its error is the yardstick. Before the outlier blocks' residual codes (LLB_OUTLIER in
csrc/matmul/kernels/kernels.h), measured where each source of error was switched to FP32 one at a
time (SmolLM2 Q4_1, mean over positions 0.368): the Q/K/V input alone gave 0.271, each other matmul
0.34-0.38; the f16 KV cache and every other op ~0 (f32 activations match the oracle to 1e-3).
"""
import sys
from pathlib import Path

import numpy as np
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


# More prompts for the per-type comparison. A type's worst over the six prompts alone is one position's draw:
# on AVX2, SmolLM2 Q4_1's worst, the third token of the quicksort prompt, came out anywhere from 0.28 to 1.80
# when any single matmul of the model ran in FP32 instead, 1.04 on the scalar path and 1.63 on AVX2, against
# llama.cpp's 0.89 there (its worst elsewhere 1.38-1.61), while the mean was 0.17 against 0.39 and the 99th
# percentile under half of llama.cpp's. Over 30 prompts each engine's tail is sampled, not one position, and
# the test holds the mean and the 99th percentile of the positions' errors to llama.cpp's: the single worst
# position stays a draw (ours against llama.cpp's over these prompts, AVX2: Q4_1 1.63 / 1.69, IQ4_XS
# 2.14 / 2.08, the other types 0.22-0.68 of it), which bench/bench_accuracy.py reports beside the rest.
MORE_PROMPTS = [
    "Once upon a time, in a small village at the edge of a forest, there lived",
    "import numpy as np\n\ndef softmax(x):\n    e = np.exp(x - x.max())\n    return",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nExplain recursion to a child."
    "<|im_end|>\n<|im_start|>assistant\n",
    "The capital of Australia is Canberra, which was chosen as a compromise between",
    "SELECT name, COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id GROUP BY",
    "Der schnelle braune Fuchs springt über den faulen Hund, und dann",
    "1, 1, 2, 3, 5, 8, 13, 21, 34, 55,",
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer",
    "#include <stdio.h>\nint main(void) {\n    for (int i = 0; i < 10; i++)",
    "Water boils at 100 degrees Celsius at sea level, but at higher altitudes",
    "<|im_start|>user\nWrite a haiku about autumn leaves.<|im_end|>\n<|im_start|>assistant\n",
    "The mitochondria is often called the powerhouse of the cell because",
    "El sol brillaba sobre la playa mientras los niños construían",
    "Step 1: Preheat the oven to 180°C. Step 2: Mix the flour and sugar. Step 3:",
    "In 1969, Neil Armstrong became the first person to walk on the Moon, saying",
    "function fibonacci(n) {\n  if (n < 2) return n;\n  return",
    "The stock market fell sharply on Monday as investors worried about",
    "Dear hiring manager, I am writing to apply for the position of",
    "The theorem states that for any right triangle, the square of the hypotenuse",
    "Q: What is the largest planet in our solar system?\nA:",
    "<|im_start|>user\nTranslate 'good morning' into Japanese.<|im_end|>\n<|im_start|>assistant\n",
    "Machine learning models are trained by minimizing a loss function, usually with",
    "She opened the letter slowly, her hands trembling, and read the first line:",
    "git commit -m \"Fix the bug in the parser\" && git push origin",
]

# llama.cpp's pure requantizations of SmolLM2 (its F16 export, every matrix in the type: bench/llamacpp_files.py).
# The budget is llama.cpp's own mean and 99th percentile on the same file and the 30 prompts, measured in the test
# (llama-cpp-python, logits_all). Ours / llama.cpp's mean and 99th percentile on AVX2 (Zen 3, 2026-12-07):
# Q4_0 0.177 / 0.414 and 0.485 / 1.329, Q4_1 0.169 / 0.397 and 0.535 / 1.189, Q5_0 0.169 / 0.398 and 0.440 / 1.132,
# Q5_1 0.195 / 0.432 and 0.636 / 1.273, Q8_0 0.173 / 0.392 and 0.584 / 1.096, IQ4_NL 0.175 / 0.393 and 0.489 / 1.179,
# MXFP4 0.180 / 0.425 and 0.479 / 1.292, Q4_K_S 0.249 / 0.600 and 0.657 / 1.894, Q6_K 0.225 / 0.565 and 0.602 / 1.836,
# IQ4_XS 0.239 / 0.567 and 0.719 / 1.619.
# K-quants: SmolLM2's 576-wide rows are not whole 256-blocks, so llama.cpp gives those matrices a 32-block
# type (Q4_K -> Q5_0, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL): only ffn_down is in the K-quant.
TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "mxfp4_moe", "q4_k_s", "q6_k", "iq4_xs"]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("ftype", TYPES)
def test_fast_mode_per_type_no_less_accurate_than_llama_cpp(ftype, smollm2_gguf):
    if "native" not in available_backends():
        pytest.skip("the C core is not built: no fast mode")
    pytest.importorskip("llama_cpp", reason="llama.cpp's quantizer makes the files (the bench extra)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from llamacpp_files import f16_source, llama_file
    path = llama_file(f16_source(str(smollm2_gguf)), ftype, pure=True)
    ids, refs = oracle(path, PROMPTS + MORE_PROMPTS)
    fast = errors(path, ids, refs, backend="native")
    theirs = llama_cpp_errors(path, ids, refs)
    ours_p99, their_p99 = np.quantile(fast, 0.99), np.quantile(theirs, 0.99)
    print(f"{ftype}: mean / p99 / worst ours {fast.mean():.3f} / {ours_p99:.3f} / {fast.max():.3f}, "
          f"llama.cpp {theirs.mean():.3f} / {their_p99:.3f} / {theirs.max():.3f}")
    assert fast.mean() <= theirs.mean() and ours_p99 <= their_p99, (fast.mean(), ours_p99, theirs.mean(), their_p99)
