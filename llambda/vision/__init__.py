"""Images in: a vision tower turns an image into the soft-token rows a language model reads in its place.

    tower = load_vision("path/to/gemma-3-4b-it")      # or SmolVLM's, Qwen2.5-VL's, Qwen3-VL's directory, an mmproj GGUF
    rows = tower.encode(tower.pixels(load_image(png_bytes)))   # [n_crops, tokens_per_image, hidden]

Modules: image.py (bytes -> RGB image, limits), records.py (a bound on a file's header records),
base64_text.py (an image sent as base64 text -> its bytes), preprocess.py (the image processors), config.py (the
hyper-parameters, HF names, range-checked), siglip.py (the encoder), gemma3.py (Gemma 3's projector),
idefics3.py (Idefics3's connector), layouts.py (names and keys of each file shape), load.py (load_vision),
tower.py (VisionTower), mmproj.py (writing llama.cpp's mmproj GGUF); Qwen2.5-VL's and Qwen2-VL's tower:
qwen2vl_config.py, qwen2vl_pixels.py (its image processor), qwen2vl.py (the windowed tower and merger),
qwen2vl_layouts.py, qwen2vl_mmproj.py; what Qwen3-VL's adds (learned positions, DeepStack): qwen3vl.py,
qwen3vl_layouts.py, qwen3vl_ollama.py (Ollama's qwen3vl file). docs/VISION.md describes them.
LFM2-VL's tower (SigLIP2 NaFlex, tiles and a thumbnail): lfm2vl_config.py, lfm2vl_pixels.py, lfm2vl.py,
lfm2vl_layouts.py, lfm2vl_mmproj.py (its lfm2 mmproj). InternVL's: internvl_config.py, internvl_pixels.py,
internvl.py, internvl_layouts.py, internvl_mmproj.py.
"""
from .image import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, check_image, load_image
from .load import load_vision
from .tower import VisionTower

__all__ = ["check_image", "load_image", "load_vision", "VisionTower", "MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS"]
