"""load_vision(source, backend, threads): the vision tower of a model's files, or None where they hold none.

`source` is a path (a Hugging Face directory, llama.cpp's mmproj GGUF, a model GGUF that holds the tower as
Ollama's gemma3 files do) or a ModelSource (its path is reopened). The tower gets a backend of its own
(`backend`: "numpy", "native" or None for the default, or a Backend whose kind, threads and precision are
copied), so its weights and buffers are its own and close() frees them.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from ..errors import InvalidInputError, LlambdaWarning, ModelFormatError, ModelNotFoundError
from ..formats.files import read_json
from ..formats.gguf import GGUFFile
from .config import VisionConfig
from .layouts import (HF_NAMES, IDEFICS3_TYPES, LLAMA_CPP, MMPROJ_NAMES, OLLAMA, OLLAMA_NAMES, Layout,
                      check_processor_size, gguf_lookup, has_ollama_tower, hf_fields, hf_lookup, idefics3_hf_fields,
                      image_processor_settings, mmproj_fields, ollama_fields)
from . import glm4v_layouts, glm4v_mmproj
from . import internvl_layouts, internvl_mmproj
from . import lfm2vl_layouts, lfm2vl_mmproj, llava_layouts
from . import pixtral_layouts, pixtral_mmproj, pixtral_ollama
from . import qwen2vl_layouts as qwen_layouts
from . import qwen3vl_ollama as qwen3_ollama
from .lfm2vl import Lfm2VlTower
from .lfm2vl_config import Lfm2VlVisionConfig
from .qwen2vl_config import QwenVisionConfig
from .tower import VisionTower


def _backend(backend, threads, activations):
    from ..backends import create_backend
    from ..backends.base import Backend
    if isinstance(backend, Backend):
        name = backend.name
        threads = threads or getattr(backend, "threads", None)
        if activations is None and name == "native":
            activations = "f32" if backend.exact else "q8"
        backend = name
    if backend is not None and not isinstance(backend, str):
        raise InvalidInputError(f"backend must be 'numpy', 'native', None or a Backend, got {type(backend).__name__}")
    return create_backend(backend, threads=threads, activations=activations)


def _check_all_named(tensors, wanted, source: str) -> None:
    """ModelFormatError naming a tower file's tensors that are not among `wanted` (the file names of every tensor the
    tower its keys describe reads): a block past block_count, or a bias or q/k norm in later blocks where block 0's
    tensors decided there are none, would be skipped, and the tower run without it is another model."""
    wanted = set(wanted)
    unread = [n for n in tensors if n not in wanted]
    if unread:
        raise ModelFormatError(f"{source}: {len(unread)} tensors are not part of the tower its metadata describes, "
                               f"e.g. {', '.join(map(repr, unread[:3]))}: the metadata and the tensors disagree")


def open_layout(path: Path) -> Layout | None:
    """The tower's layout in the files at `path`, None where they hold no vision tower."""
    path = Path(path)
    src = str(path)
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.exists():
            raise ModelFormatError(f"{path}: a Hugging Face model directory needs config.json")
        cfg = read_json(cfg_path, "config.json")
        if not isinstance(cfg, dict) or "vision_config" not in cfg:
            return None
        kind = cfg.get("model_type")
        if kind is not None and not isinstance(kind, str):
            raise ModelFormatError(f"{cfg_path}: model_type must be a string, got {type(kind).__name__}")
        if kind in qwen_layouts.HF_TYPES:
            return _qwen_hf_layout(path, cfg, src)
        if kind in lfm2vl_layouts.HF_TYPES:
            return _safetensors_layout(path, lfm2vl_layouts.hf_config(path, cfg, src, read_json), lfm2vl_layouts.hf_lookup,
                                       src)
        if kind in glm4v_layouts.HF_TYPES:
            return _glm4v_hf_layout(path, cfg, src)
        if pixtral_layouts.reads(cfg):         # Mistral 3's, or Pixtral-12B's LLaVA (before a LLaVA branch)
            return _safetensors_layout(path, pixtral_layouts.hf_config(path, cfg, src), pixtral_layouts.hf_lookup, src)
        if kind in internvl_layouts.HF_TYPES or kind in internvl_layouts.CHAT_TYPES:
            return _internvl_hf_layout(path, cfg, src)
        if kind in llava_layouts.HF_TYPES:
            return _safetensors_layout(path, llava_layouts.hf_config(path, cfg, src), llava_layouts.hf_lookup, src)
        if kind != "gemma3" and kind not in IDEFICS3_TYPES:
            warnings.warn(f"{path}: its vision tower ({str(kind)[:40]!r}) is not supported (Gemma 3's, Idefics3's, "
                          "Qwen2(.5)-VL's, Qwen3-VL's, LFM2-VL's, Mistral 3's and Pixtral's, InternVL's, LLaVA's, "
                          "GLM-4.1V's only): the model reads no images",
                          LlambdaWarning, stacklevel=3)
            return None
        pre, seq_len = image_processor_settings(path, read_json)
        fields = idefics3_hf_fields(cfg, pre, src, seq_len) if kind in IDEFICS3_TYPES else hf_fields(cfg, pre, src)
        vcfg = VisionConfig.from_fields(fields, HF_NAMES, src)
        check_processor_size(fields, vcfg, src)
        from ..formats.safetensors import open_safetensors_dir
        st = open_safetensors_dir(path)
        try:
            return Layout(vcfg, hf_lookup(st.tensors, src, vcfg.projector), 1.0, "hf", [st.close])
        except BaseException:
            st.close()
            raise
    f = GGUFFile(path)
    try:
        meta = f.metadata
        arch = meta.get("general.architecture")
        if arch == "clip" and not isinstance(meta.get("clip.projector_type", ""), str):
            raise ModelFormatError(f"{src}: GGUF metadata 'clip.projector_type' must be a string")
        if arch == "clip" and meta.get("clip.projector_type") in qwen_layouts.MMPROJ_TYPES:
            vcfg = QwenVisionConfig.from_fields(qwen_layouts.mmproj_fields(meta, src, f.tensors),
                                                qwen_layouts.MMPROJ_KEYS, src)
            return Layout(vcfg, qwen_layouts.mmproj_lookup(f, deepstack=vcfg.deepstack_visual_indexes), 0.0, "mmproj",
                          [f.close])
        if arch == "clip" and meta.get("clip.projector_type") == llava_layouts.MMPROJ_TYPE:
            return llava_layouts.mmproj_layout(f, src)
        if arch == "clip" and meta.get("clip.projector_type") == lfm2vl_mmproj.MMPROJ_TYPE:
            fields = lfm2vl_mmproj.mmproj_fields(meta, src)
            find = lfm2vl_mmproj.mmproj_lookup(f, fields, src)
            vcfg = Lfm2VlVisionConfig.from_fields(fields, lfm2vl_mmproj.MMPROJ_KEYS, src)
            # (no check that every tensor is read: llama.cpp's converter lowers block_count for a
            # vision_feature_layer below -1 and keeps the dropped blocks' tensors, which llama.cpp skips too)
            return Layout(vcfg, find, 0.0, "mmproj", [f.close])
        if arch == "clip" and meta.get("clip.projector_type") == pixtral_mmproj.MMPROJ_TYPE:
            vcfg = pixtral_mmproj.mmproj_config(meta, src, f.tensors)
            _check_all_named(f.tensors, [*map(pixtral_mmproj.gguf_name, pixtral_mmproj.canonical_names(vcfg)),
                                         pixtral_mmproj.IMG_BREAK_ROW], src)
            return Layout(vcfg, pixtral_mmproj.lookup(f, vcfg), 0.0, "mmproj", [f.close])
        if arch == "clip" and meta.get("clip.projector_type") == glm4v_mmproj.MMPROJ_TYPE:
            from .glm4v_config import Glm4vVisionConfig
            vcfg = Glm4vVisionConfig.from_fields(glm4v_mmproj.mmproj_fields(meta, f.tensors, src), glm4v_mmproj.KEYS,
                                                 src)
            return Layout(vcfg, glm4v_mmproj.lookup(f), 0.0, "mmproj", [f.close])
        if arch == "clip" and meta.get("clip.projector_type") == internvl_mmproj.PROJECTOR_TYPE:
            from .internvl_config import InternVLConfig
            vcfg = InternVLConfig.from_fields(internvl_mmproj.mmproj_fields(meta, f.tensors, src), internvl_mmproj.KEYS,
                                              src)
            _check_all_named(f.tensors, map(internvl_mmproj.gguf_name, internvl_mmproj.names(vcfg)), src)
            return Layout(vcfg, internvl_mmproj.lookup(f), 0.0, "mmproj", [f.close])
        if arch == "clip":
            vcfg = VisionConfig.from_fields(mmproj_fields(meta, src), MMPROJ_NAMES, src)
            return Layout(vcfg, gguf_lookup(f, LLAMA_CPP), 0.0, "mmproj", [f.close])
        if not has_ollama_tower(f):
            f.close()
            return None
        if arch == pixtral_ollama.ARCH:
            from .pixtral_config import PixtralConfig
            vcfg = PixtralConfig.from_fields(*pixtral_ollama.fields(meta, src), src)
            _check_all_named([n for n in f.tensors if n.startswith(("v.", "mm."))],       # the text model's apart
                             map(pixtral_ollama.ollama_name, pixtral_mmproj.canonical_names(vcfg)), src)
            return Layout(vcfg, pixtral_ollama.lookup(f), 0.0, "ollama", [f.close])
        if arch in qwen3_ollama.ARCHS:
            find = qwen3_ollama.lookup(f)
            vcfg = QwenVisionConfig.from_fields(qwen3_ollama.fields(meta, find, arch, src), qwen3_ollama.keys(arch), src)
            return Layout(vcfg, find, 0.0, "ollama", [f.close])
        if arch == qwen_layouts.OLLAMA_ARCH:
            lookup = qwen_layouts.mmproj_lookup(f, "ollama")
            vcfg = QwenVisionConfig.from_fields(qwen_layouts.ollama_fields(meta, lookup, src), qwen_layouts.OLLAMA_KEYS,
                                                src)
            return Layout(vcfg, lookup, 0.0, "ollama", [f.close])
        if arch != "gemma3":
            warnings.warn(f"{path}: its vision tower ({str(arch)[:40]!r}) is not supported (Gemma 3's, Qwen2.5-VL's, "
                          "Qwen3-VL's and Mistral 3's only): the model reads no images", LlambdaWarning, stacklevel=3)
            f.close()
            return None
        lookup = gguf_lookup(f, OLLAMA)
        vcfg = VisionConfig.from_fields(ollama_fields(meta, lookup, src), OLLAMA_NAMES, src)
        return Layout(vcfg, lookup, 0.0, "ollama", [f.close])
    except BaseException:
        f.close()
        raise


def _qwen_hf_layout(path: Path, cfg: dict, src: str) -> Layout:
    pre, _ = image_processor_settings(path, read_json)     # preprocessor_config.json, or transformers 5's save
    vcfg = QwenVisionConfig.from_fields(qwen_layouts.hf_fields(cfg, pre, src), qwen_layouts.HF_NAMES, src)
    return _safetensors_layout(path, vcfg, qwen_layouts.hf_lookup, src)


def _glm4v_hf_layout(path: Path, cfg: dict, src: str) -> Layout:
    from .glm4v_config import Glm4vVisionConfig
    pre, _ = image_processor_settings(path, read_json)
    vcfg = Glm4vVisionConfig.from_fields(glm4v_layouts.hf_fields(cfg, pre, src), glm4v_layouts.HF_NAMES, src)
    return _safetensors_layout(path, vcfg, glm4v_layouts.hf_lookup, src)


def _safetensors_layout(path: Path, vcfg, make_lookup, src: str) -> Layout:
    """The Layout of a HF directory's tower: its safetensors open, `make_lookup(tensors, src)` over them."""
    from ..formats.safetensors import open_safetensors_dir
    st = open_safetensors_dir(path)
    try:
        return Layout(vcfg, make_lookup(st.tensors, src), 0.0, "hf", [st.close])
    except BaseException:
        st.close()
        raise


def _internvl_hf_layout(path: Path, cfg: dict, src: str) -> Layout:
    from .internvl_config import InternVLConfig
    if cfg.get("model_type") in internvl_layouts.CHAT_TYPES:      # OpenGVLab's own layout
        vcfg = InternVLConfig.from_fields(internvl_layouts.chat_fields(cfg, src), internvl_layouts.CHAT_NAMES, src)
        return _safetensors_layout(path, vcfg, internvl_layouts.chat_lookup, src)
    pre, _ = image_processor_settings(path, read_json)
    fields = internvl_layouts.hf_fields(cfg, pre, internvl_layouts.processor_seq_len(path, read_json), src)
    vcfg = InternVLConfig.from_fields(fields, internvl_layouts.HF_NAMES, src)
    return _safetensors_layout(path, vcfg, internvl_layouts.hf_lookup, src)


def load_vision(source, backend=None, threads: int | None = None, activations: str | None = None) -> VisionTower | None:
    """The vision tower of `source` on a backend of its own, or None where the source holds none.
    activations: "f32" (exact: float32 weights and products) or "q8" (the native default: bfloat16 products)."""
    path = getattr(source, "path", source)
    if not isinstance(path, (str, Path)):
        raise InvalidInputError(f"source must be a path or a ModelSource, got {type(source).__name__}")
    if not Path(path).exists():
        raise ModelNotFoundError(f"{path}: no such file or directory (a vision tower's files)")
    layout = open_layout(Path(path))
    if layout is None:
        return None
    try:
        be = _backend(backend, threads, activations)
        if isinstance(layout.cfg, Lfm2VlVisionConfig):
            return Lfm2VlTower(layout.cfg, layout.lookup, be, name=str(path))
        if layout.cfg.projector == "glm4v":
            from .glm4v import Glm4vTower
            return Glm4vTower(layout.cfg, layout.lookup, be, name=str(path))
        if layout.cfg.projector == "pixtral":
            from .pixtral_tower import PixtralTower
            return PixtralTower(layout.cfg, layout.lookup, be, name=str(path))
        return VisionTower(layout.cfg, layout.lookup, be, layout.soft_norm_offset, name=str(path))
    finally:
        for close in layout.closers:      # the weights were copied into the backend's own arrays
            close()
