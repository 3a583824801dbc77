"""Tiny random Mamba models (Mamba2, Mamba 1 and FalconMamba: every layer a state-space mixer) with transformers
reference outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py, whose generator and weight
scheme this reuses; the exact math is in tests/fixtures/reference/tiny/README_mamba.md).

    python tools/make_tiny_mamba.py [--out tests/fixtures/reference/tiny] [mamba2 mamba falcon_mamba]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import make_tiny_hybrid as tiny

SHAPE = dict(vocab_size=tiny.VOCAB, hidden_size=64, state_size=16, conv_kernel=4, expand=2, layer_norm_epsilon=1e-5,
             use_bias=False, use_conv_bias=True, hidden_act="silu", bos_token_id=1, eos_token_id=2, pad_token_id=0)

MAMBA2 = [
    "Every layer (Mamba2Block): x += mixer(norm(x)), norm an RMSNorm x / sqrt(mean(x^2) + 1e-5) * w; no attention, "
    "no MLP; norm_f, then the untied lm_head.",
    "Mixer: in_proj(h) rows z (H P = 128), xBC (128 + 2 G N), dt (H = 8); xBC through a causal depthwise conv of "
    "width 4 plus its bias, then SiLU; x (8 heads of P = 16), B and C (G = 2 groups of N = 16, head h reads group "
    "h // 4); d = softplus(dt + dt_bias); per head the N x P state S = exp(d A) S + d B x^T (A = -exp(A_log)); "
    "y = S^T C + D x; then y * silu(z) RMS-normed (eps 1e-5) in 2 groups of 64, times mixer.norm.weight; out_proj.",
    "chunk_size 16: transformers' prefill runs its chunked scan over blocks of 16 tokens (the 40- and 100-token "
    "inputs cross blocks); time_step_limit (0, inf): no clamp. 3 layers.",
]
MAMBA = [
    "Every layer (MambaBlock): x += mixer(norm(x)), norm an RMSNorm (eps 1e-5); no attention, no MLP; norm_f, then "
    "the lm_head tied to the embeddings. 3 layers.",
    "Mixer: in_proj(h) rows x (d_inner 128), z (128); x through a causal depthwise conv of width 4 plus its bias, "
    "then SiLU; x_proj(x) rows dt_low (time_step_rank 'auto' = ceil(64 / 16) = 4), B (16), C (16); "
    "dt = softplus(dt_proj(dt_low), with dt_proj's bias); per channel c the 16-value state "
    "S_c = exp(dt_c A_c) * S_c + dt_c B x_c (A = -exp(A_log), (128, 16)); y_c = S_c . C + D_c x_c; "
    "out_proj(y * silu(z)).",
]
FALCON = [
    "As the mamba folder (MambaBlock's layout, FalconMambaMixer), plus RMS norms WITHOUT weights (eps "
    "mixer_rms_eps 1e-6) over dt_low (4 values), B and C (16 each) after x_proj, before dt_proj; 2 layers; the "
    "lm_head untied.",
]


def mamba2():
    from transformers import Mamba2Config
    return Mamba2Config(**SHAPE, num_hidden_layers=3, num_heads=8, head_dim=16, n_groups=2, chunk_size=16,
                        tie_word_embeddings=False)


def mamba():
    from transformers import MambaConfig
    return MambaConfig(**SHAPE, num_hidden_layers=3, tie_word_embeddings=True)


def falcon_mamba():
    from transformers import FalconMambaConfig
    return FalconMambaConfig(**SHAPE, num_hidden_layers=2, mixer_rms_eps=1e-6, tie_word_embeddings=False)


def final_norm(model, seed: int) -> None:
    """norm_f drawn as the other folders' final norms (2.5 + 0.1 N(0, 1)): the scheme's rule names the model.* one."""
    import torch
    g = torch.Generator().manual_seed(seed + 1)
    w = model.backbone.norm_f.weight
    with torch.no_grad():
        w.copy_(2.5 + 0.1 * torch.randn(w.shape, generator=g))


SPECS = {
    "mamba2": {"class": "Mamba2ForCausalLM", "config": mamba2, "seed": 801, "notes": MAMBA2, "legacy_rope_keys": {},
               "base": "backbone", "post": final_norm},
    "mamba": {"class": "MambaForCausalLM", "config": mamba, "seed": 813, "notes": MAMBA, "legacy_rope_keys": {},
              "base": "backbone", "post": final_norm},
    "falcon_mamba": {"class": "FalconMambaForCausalLM", "config": falcon_mamba, "seed": 824, "notes": FALCON,
                     "legacy_rope_keys": {}, "base": "backbone", "post": final_norm},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)
