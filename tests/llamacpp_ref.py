"""llama.cpp as an independent reference, through llama-cpp-python's bundled libraries (optional):
its quantizers (ggml_quantize_chunk in libggml-base) and its model runner."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np


def ggml_base():
    """libggml-base from llama-cpp-python, or None when the package is absent."""
    try:
        import llama_cpp
    except ImportError:
        return None
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    return lib


def ggml_quantize(lib, x: np.ndarray, qtype: int, row_bytes: int) -> np.ndarray:
    """x (rows, cols) float32 -> the bytes llama.cpp's quantizer writes (no importance matrix)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], row_bytes), np.uint8)
    lib.ggml_quantize_init(qtype)
    n = lib.ggml_quantize_chunk(qtype, x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None)
    assert n == out.size, (n, out.size)
    return out


# a child's start: llama.cpp quiet but for warnings, the model of argv[1] loaded, argv[2] as `given` (JSON)
_CHILD_LOAD = """
import json, sys
import numpy as np
import llama_cpp as L
quiet = L.llama_log_callback(lambda level, text, user: sys.stderr.write(text.decode(errors="replace"))
                             if level >= 3 else None)     # warnings and errors only
L.llama_log_set(quiet, None)
path, given = sys.argv[1], json.loads(sys.argv[2])
L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
if not model:
    sys.exit("llama.cpp could not load the file")
"""

_LOGITS_CHILD = _CHILD_LOAD + """
ids = given
n = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
cp = L.llama_context_default_params()
cp.n_ctx, cp.n_threads, cp.n_threads_batch = 64, 1, 1
ctx = L.llama_init_from_model(model, cp)
arr = (L.llama_token * len(ids))(*ids)
if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids))) != 0:
    sys.exit("llama_decode failed")
print(json.dumps(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n,)).tolist()))
"""


def llama_cpp_logits(path, ids: list[int], timeout: float = 300.0) -> np.ndarray:
    """llama.cpp's logits after `ids` on the GGUF at `path`, run in a child process (a file llama.cpp
    asserts on aborts that process, not the tests'). AssertionError with llama.cpp's words if it fails."""
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _LOGITS_CHILD, str(path), json.dumps(list(ids))],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"llama.cpp failed on {Path(path).name} (exit {r.returncode}): {r.stderr[-600:]}"
    return np.array(json.loads(r.stdout.strip().splitlines()[-1]), dtype=np.float32)


_MTMD_CHILD = r"""
import ctypes, sys
import numpy as np
import llama_cpp
from llama_cpp import mtmd_cpp as M
text_path, mmproj_path, rgb_path, w, h, out_path = sys.argv[1:7]
w, h = int(w), int(h)
llama_cpp.llama_backend_init()
model = llama_cpp.llama_model_load_from_file(text_path.encode(), llama_cpp.llama_model_default_params())
assert model
params = M.mtmd_context_params_default()
params.use_gpu, params.n_threads, params.warmup = False, 1, False
ctx = M.mtmd_init_from_file(mmproj_path.encode(), model, params)
assert ctx, "llama.cpp refused the mmproj"
rgb = np.fromfile(rgb_path, dtype=np.uint8)
bmp = M.mtmd_bitmap_init(w, h, (ctypes.c_ubyte * rgb.size).from_buffer_copy(rgb.tobytes()))
chunks = M.mtmd_input_chunks_init()
text = M.mtmd_input_text()
text.text = b"x " + M.mtmd_default_marker() + b" y"
text.text_len, text.add_special, text.parse_special = len(text.text), False, True
assert M.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (M.mtmd_bitmap_p_ctypes * 1)(bmp), 1) == 0
out = {}
for i in range(M.mtmd_input_chunks_size(chunks)):
    ch = M.mtmd_input_chunks_get(chunks, i)
    if M.mtmd_input_chunk_get_type(ch) == 1:
        n, d = M.mtmd_input_chunk_get_n_tokens(ch), llama_cpp.llama_model_n_embd(model)
        assert M.mtmd_encode_chunk(ctx, ch) == 0
        rows = np.ctypeslib.as_array(M.mtmd_get_output_embd(ctx), shape=(n * d,))
        out[f"chunk{len(out):03d}"] = rows.reshape(n, d).copy()       # the buffer is the next encode's
np.savez(out_path, **out)
"""


def mtmd_image_rows(text_gguf, mmproj, rgb: np.ndarray, tmp: Path, timeout: float = 300.0) -> list:
    """llama.cpp's (llama-cpp-python's libmtmd) rows of an RGB image [h, w, 3] uint8 given with `mmproj` beside
    the text model `text_gguf`: one array [n_tokens, width] per image chunk, in prompt order (an image cut into
    slices gives several). Run in a child process; AssertionError with its words if it fails."""
    import subprocess
    import sys
    rgb = np.ascontiguousarray(rgb, np.uint8)
    (tmp / "image.rgb").write_bytes(rgb.tobytes())
    r = subprocess.run([sys.executable, "-c", _MTMD_CHILD, str(text_gguf), str(mmproj), str(tmp / "image.rgb"),
                        str(rgb.shape[1]), str(rgb.shape[0]), str(tmp / "rows.npz")],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    with np.load(tmp / "rows.npz") as z:
        return [z[k] for k in sorted(z.files)]


_EMBED_CHILD = _CHILD_LOAD + """
texts = given
vocab = L.llama_model_get_vocab(model)
cp = L.llama_context_default_params()
cp.n_ctx = cp.n_batch = cp.n_ubatch = 512
cp.n_threads, cp.n_threads_batch, cp.embeddings = 1, 1, True
ctx = L.llama_init_from_model(model, cp)
n_embd = L.llama_model_n_embd(model)
out = []
rank = L.llama_pooling_type(ctx) == L.LLAMA_POOLING_TYPE_RANK
n_out = L.llama_model_n_cls_out(model) if rank else n_embd
for text in texts:
    if isinstance(text, list):
        ids = text
    else:
        raw = text.encode()
        buf = (L.llama_token * (len(raw) + 8))()
        n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, True)
        if n < 0:
            sys.exit("llama_tokenize failed")
        ids = list(buf[:n])
    n = len(ids)
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    arr = (L.llama_token * n)(*ids)       # kept alive: the batch points into it
    if L.llama_decode(ctx, L.llama_batch_get_one(arr, n)) != 0:
        sys.exit("llama_decode failed")
    v = np.ctypeslib.as_array(L.llama_get_embeddings_seq(ctx, 0), shape=(n_out,)).astype(np.float64)
    out.append({"ids": ids, "embedding": (v if rank else v / np.linalg.norm(v)).tolist()})
print(json.dumps(out))
"""


def llama_cpp_embeddings(path, texts: list, timeout: float = 300.0) -> list[dict]:
    """llama.cpp's tokens (its special tokens added; a list of ids is taken as given) and pooled embedding
    (L2-normalized; a rank model's: its classifier outputs, as they are) of each text on the encoder GGUF at
    `path`, one text a decode, in a child process; AssertionError with llama.cpp's words if it fails."""
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _EMBED_CHILD, str(path), json.dumps(list(texts))],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"llama.cpp failed on {Path(path).name} (exit {r.returncode}): {r.stderr[-600:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])
