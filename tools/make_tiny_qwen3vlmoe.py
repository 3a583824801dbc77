"""A tiny random Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration: Qwen3-VL's tower, a Qwen3-MoE text decoder with
interleaved M-RoPE and DeepStack), its tokenizer and processor, and transformers reference outputs, in the format
of tools/make_tiny_qwen3vl.py's folder (whose tokenizer, chat template, processor settings, images and tower sizes
it takes).

    python tools/make_tiny_qwen3vlmoe.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.

The experts are saved as transformers 5 saves them (output-major: gate_up_proj (E, 2I, d), down_proj (E, d, I));
the Hub's checkpoints hold their transposes, which tests/test_vlm_qwen3vlmoe.py writes from these. moe_intermediate
24 (2I = 48) so that neither tensor is square and the two layouts cannot be mistaken for each other.
"""
from __future__ import annotations

from pathlib import Path

import make_tiny_gemma3_vision as gemma3_vision
import make_tiny_hybrid as tiny
import make_tiny_qwen25vl as qwen25vl
import make_tiny_qwen3vl as qwen3vl
from make_tiny_qwen25vl import npy

FOLDER = "qwen3_vl_moe_vision"
SEED = int(__import__("os").environ.get("QWEN3VLMOE_SEED", 83))
EXPERTS, USED, EXPERT_FFN = 4, 2, 24
NOTES = [
    "Qwen3VLMoeForConditionalGeneration (model_type qwen3_vl_moe): tools/make_tiny_qwen3vl.py's model with every "
    f"decoder layer's MLP a mixture of {EXPERTS} experts (moe_intermediate_size {EXPERT_FFN}, SwiGLU), {USED} a "
    "token: softmax over the router's logits, the top 2, divided by their sum (always: Qwen3VLMoeTextTopKRouter), "
    "the chosen experts' outputs weighted and summed; no shared expert.",
    "Experts as transformers 5 saves them: mlp.experts.gate_up_proj (E, 2I, d), expert e's gate rows then up rows "
    "(F.linear), mlp.experts.down_proj (E, d, I); mlp.gate.weight (E, d) the router.",
] + qwen3vl.NOTES[1:]


def config(vocab: int):
    from transformers import Qwen3VLMoeConfig
    base = qwen3vl.config(vocab)
    text = {k: v for k, v in base.text_config.to_dict().items() if k not in ("model_type", "transformers_version")}
    text.update(num_experts=EXPERTS, num_experts_per_tok=USED, moe_intermediate_size=EXPERT_FFN, decoder_sparse_step=1,
                mlp_only_layers=[])
    vision = {k: v for k, v in base.vision_config.to_dict().items() if k not in ("model_type", "transformers_version")}
    return Qwen3VLMoeConfig(text_config=text, vision_config=vision, **qwen25vl.TOKEN_IDS, tie_word_embeddings=False)


def make(out: Path) -> None:
    import transformers
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    tokenizer = qwen3vl.make_tokenizer()
    scales = {"pos_embed.weight": 0.5, "experts.gate_up_proj": 64 ** -0.5, "experts.down_proj": EXPERT_FFN ** -0.5}
    model = qwen25vl.tiny_model(transformers.Qwen3VLMoeForConditionalGeneration, config(len(tokenizer)), SEED, scales)
    dest = out / FOLDER
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.npy"):
        old.unlink()
    model.save_pretrained(dest, safe_serialization=True)
    size = {"shortest_edge": qwen3vl.MIN_PIXELS, "longest_edge": qwen3vl.MAX_PIXELS}
    ip = Qwen2VLImageProcessorPil(size=size, patch_size=qwen3vl.PATCH, temporal_patch_size=qwen3vl.TEMPORAL,
                                  merge_size=qwen3vl.MERGE, image_mean=qwen3vl.MEAN, image_std=qwen3vl.STD)
    processor, cfg_json = qwen25vl.processor_files(Qwen3VLProcessor, ip, tokenizer, dest, qwen3vl.CHAT_TEMPLATE)
    files = gemma3_vision.make_images(dest, qwen3vl.IMAGES)
    images = {}
    for name, pv, thw, o in qwen25vl.tower_outputs(processor, model.model.visual, files):
        stem = name.rsplit(".", 1)[0]
        images[name] = qwen25vl.image_record(dest, stem, qwen3vl.IMAGES[name], thw, pv, o.last_hidden_state,
                                             o.pooler_output, qwen3vl.PROCESSOR, {})
        images[name]["deepstack_rows"] = [npy(dest, f"{stem}_deepstack{j}.npy", f.numpy())
                                          for j, f in enumerate(o.deepstack_features)]
    prompt, text_prompt = qwen25vl.prompts(model, processor, files, list(qwen3vl.IMAGES), dest, qwen3vl.N_NEW)
    qwen25vl.write_reference(
        dest, FOLDER, "Qwen3VLMoeForConditionalGeneration", SEED,
        "tools/make_tiny_qwen25vl.py: redraw() (tools/make_tiny_qwen3vl.py's scales), the experts N(0, 1) / "
        "sqrt(fan-in)", NOTES, cfg_json, qwen3vl.PROCESSOR,
        {"image_token_id": model.config.image_token_id, "deepstack_visual_indexes": qwen3vl.DEEPSTACK},
        processor, images, prompt, text_prompt)


if __name__ == "__main__":
    tiny.main_one(make, __doc__)
