"""Architectures: each module turns GGUF metadata / config.json into a TransformerConfig."""
from __future__ import annotations

from importlib import import_module

from ..errors import ModelFormatError

# GGUF `general.architecture` / HF `model_type` -> module name
ARCHITECTURES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2vl": "qwen2vl",          # llama.cpp's text GGUF of Qwen2-VL and Qwen2.5-VL
    "qwen25vl": "qwen2vl",         # Ollama's qwen2.5vl
    "qwen2_vl": "qwen2vl",
    "qwen2_vl_text": "qwen2vl",
    "qwen2_5_vl": "qwen2vl",
    "qwen2_5_vl_text": "qwen2vl",
    "qwen3vl": "qwen3vl",          # llama.cpp's text GGUF of Qwen3-VL
    "qwen3_vl": "qwen3vl",
    "qwen3_vl_text": "qwen3vl",
    "qwen3vlmoe": "qwen3vlmoe",    # llama.cpp's text GGUF of Qwen3-VL-MoE, Ollama's qwen3-vl MoE file
    "qwen3_vl_moe": "qwen3vlmoe",
    "qwen3_vl_moe_text": "qwen3vlmoe",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "gemma3n": "gemma3n",
    "gemma3n_text": "gemma3n",
    "phi3": "phi3",
    "qwen3moe": "qwen3moe",
    "qwen3_moe": "qwen3moe",
    "qwen2moe": "qwen2moe",
    "qwen2_moe": "qwen2moe",
    "mixtral": "mixtral",
    "gpt_oss": "gpt_oss",
    "gpt-oss": "gpt_oss",
    "gptoss": "gpt_oss",
    "smollm3": "smollm3",
    "granite": "granite",
    "granitemoe": "granitemoe",
    "granitemoeshared": "granitemoe",
    "granitemoehybrid": "granitehybrid",
    "granitehybrid": "granitehybrid",
    "olmo2": "olmo2",
    "lfm2": "lfm2",
    "lfm2moe": "lfm2moe",          # llama.cpp's name of LFM2-MoE
    "lfm2_moe": "lfm2moe",
    "qwen3_next": "qwen3next",
    "qwen3next": "qwen3next",
    "deepseek2": "deepseek2",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek2",
    "glm4": "glm4",
    "glm4v": "glm4v",              # GLM-4.1V / GLM-4.6V's text model (HF model_type glm4v, its text_config's glm4v_text)
    "glm4v_text": "glm4v",
    "glm4moe": "glm4moe",
    "glm4_moe": "glm4moe",
    "ernie4_5": "ernie4_5",
    "ernie4_5_moe": "ernie4_5_moe",
    "ernie4_5-moe": "ernie4_5_moe",
    "olmoe": "olmoe",
    "seed_oss": "seed_oss",
    "arcee": "arcee",
    "apertus": "apertus",
    "cohere": "cohere",
    "command-r": "cohere",         # llama.cpp's name of Cohere's Command-R / Aya
    "cohere2": "cohere2",
    "starcoder2": "starcoder2",
    "exaone4": "exaone4",
    "hunyuan_v1_dense": "hunyuan",
    "hunyuan-dense": "hunyuan",
    "ministral3": "ministral3",
    "mistral3": "ministral3",      # llama.cpp's name, and HF's Mistral 3 composite (its text model)
    "falcon_h1": "falcon_h1",
    "falcon-h1": "falcon_h1",
    "gemma": "gemma",
    "phi": "phi",
    "phi2": "phi",                 # llama.cpp's name of Phi-1 / 1.5 / 2
    "stablelm": "stablelm",
    "gpt_neox": "gpt_neox",
    "gptneox": "gpt_neox",         # llama.cpp's name
    "nemotron": "nemotron",
    "nemotron_h": "nemotron_h",    # HF's and llama.cpp's name alike
    "olmo": "olmo",
    "internlm3": "internlm3",      # its GGUF files are llama.cpp's `llama`
    "mamba2": "mamba2",            # HF's and llama.cpp's name alike
    "mamba": "mamba",
    "falcon_mamba": "mamba",       # Mamba 1 with RMS norms over dt, B and C (llama.cpp: `mamba` + ssm.dt_b_c_rms)
    "jamba": "jamba",              # HF's and llama.cpp's name alike
    "bamba": "bamba",              # its GGUF files are llama.cpp's `granitehybrid`
    "gpt2": "gpt2",
    "gpt_bigcode": "gpt_bigcode",
    "starcoder": "gpt_bigcode",    # llama.cpp's name of GPT-BigCode (StarCoder 1)
    "falcon": "falcon",
    "RefinedWeb": "falcon",        # the first Falcon checkpoints' model_type (their old key names are read)
    "RefinedWebModel": "falcon",
    "llava": "llava",              # LLaVA 1.5: its text_config's family; its GGUF files are llama.cpp's `llama`
    "llava_next": "llava",         # LLaVA-NeXT: the same
}

# Encoders (embedding models, cross-encoders): their own config and forward, not TransformerConfig
ENCODERS = {"bert": "bert", "xlm-roberta": "xlm_roberta", "roberta": "xlm_roberta", "nomic_bert": "nomic_bert",
            "nomic-bert": "nomic_bert", "gemma-embedding": "embeddinggemma",
            "modernbert": "modernbert", "modern-bert": "modernbert"}


def encoder_module(name: str):
    return import_module(f".{ENCODERS[name]}", __name__)


# Architectures refused with the reason (HF model_type or llama.cpp name -> why), not run approximately
REFUSED = {
    "bloom": "BLOOM's attention adds ALiBi position biases (a slope per head times the key's distance), which the "
             "attention op here does not take (it has RoPE or a learned position table)",
    "mpt": "MPT's attention adds ALiBi position biases (a slope per head times the key's distance), which the "
           "attention op here does not take (it has RoPE or a learned position table)",
    "phimoe": "Phi-3.5-MoE routes by sparsemixer (the top expert's weight a softmax over the experts whose "
              "logit is within 2 x router_jitter_noise of it, relatively; the second's the same with the first "
              "masked), which none of the MoE routings here computes; llama.cpp's phimoe runs a plain softmax "
              "top-2 (and RMSNorm for its LayerNorm) instead",
}


def arch_module(name: str, reader: str | None = None):
    """The module of architecture `name`; with `reader` ("config_from_gguf" or "config_from_hf"),
    one that has that reader (Mistral, say, has no GGUF reader: its GGUF files say `llama`)."""
    why = REFUSED.get(name) if isinstance(name, str) else None
    if why:
        raise ModelFormatError(f"architecture {name!r} is not supported: {why}")
    try:
        mod = import_module(f".{ARCHITECTURES[name]}", __name__)
    except (KeyError, TypeError):
        known = ", ".join(sorted(ARCHITECTURES))
        raise ModelFormatError(f"unsupported architecture {name!r} (supported: {known})") from None
    if reader is not None and not hasattr(mod, reader):
        fmt = "GGUF" if reader == "config_from_gguf" else "Hugging Face"
        raise ModelFormatError(f"architecture {name!r} has no {fmt} reader here")
    return mod
