"""Fill-in-the-middle prompts for code models (/infill, and `suffix` on /v1/completions).

A FIM model is shown the text before and after a gap, then writes the gap:
`<prefix-token> before <suffix-token> after <middle-token>` -> the middle. Which
tokens those are comes from the GGUF metadata (`tokenizer.ggml.fim_pre_token_id`
and its siblings) when the file names them, else from the token strings the known
model families use (Qwen2.5-Coder: `<|fim_prefix|>`; StarCoder: `<fim_prefix>`;
CodeLlama: `<PRE>`; DeepSeek-Coder). Context files (/infill's `input_extra`) go in
front, each after a file-separator token where the model has one (Qwen's
repository format: `<|repo_name|>name`, then `<|file_sep|>path` and the file's text).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import bad_request

# role -> the GGUF metadata key naming its id, and the token strings known families use
ROLES = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", ("<|fim_prefix|>", "<fim_prefix>", "<fim-prefix>", "<PRE>", "▁<PRE>",
                                                "<｜fim▁begin｜>")),
    "suf": ("tokenizer.ggml.fim_suf_token_id", ("<|fim_suffix|>", "<fim_suffix>", "<fim-suffix>", "<SUF>", "▁<SUF>",
                                                "<｜fim▁hole｜>")),
    "mid": ("tokenizer.ggml.fim_mid_token_id", ("<|fim_middle|>", "<fim_middle>", "<fim-middle>", "<MID>", "▁<MID>",
                                                "<｜fim▁end｜>")),
    "pad": ("tokenizer.ggml.fim_pad_token_id", ("<|fim_pad|>", "<fim_pad>", "<fim-pad>")),
    "rep": ("tokenizer.ggml.fim_rep_token_id", ("<|repo_name|>", "<repo_name>", "<reponame>")),
    "sep": ("tokenizer.ggml.fim_sep_token_id", ("<|file_sep|>", "<file_sep>")),
}
REPO_NAME = "project"          # the repository format wants a name; editors send none
CURRENT_FILE = "current_file"  # the file being edited, named after the context files


@dataclass(frozen=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None

    @property
    def end_ids(self) -> frozenset[int]:
        """Tokens that end a middle besides the model's end-of-text: a model that starts another
        FIM block or another file has finished the gap (as llama.cpp treats them)."""
        return frozenset(t for t in (self.pre, self.suf, self.mid, self.pad, self.rep, self.sep) if t is not None)


def find_fim_tokens(tokenizer, metadata: dict | None) -> FimTokens | None:
    """The model's FIM tokens, or None when it lacks any of prefix/suffix/middle."""
    if tokenizer is None:
        return None
    n = tokenizer.vocab_size
    wanted = {s for _, names in ROLES.values() for s in names}
    by_text = {t: i for i, t in enumerate(tokenizer.vocab.tokens) if t in wanted}
    found = {}
    for role, (key, names) in ROLES.items():
        v = (metadata or {}).get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n:
            found[role] = v
            continue
        found[role] = next((by_text[s] for s in names if s in by_text), None)
    if None in (found["pre"], found["suf"], found["mid"]):
        return None
    return FimTokens(**found)


def fim_prompt_ids(tokenizer, fim: FimTokens, prefix: str, suffix: str,
                   files: list[tuple[str, str]] = ()) -> list[int]:
    """The token ids of a FIM prompt (prefix-suffix-middle order).

    User text is tokenized with special tokens spelled out: a file that contains
    "<|fim_middle|>" must not inject the control token.
    """
    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, parse_special=False) if text else []

    ids: list[int] = []
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        ids.append(tokenizer.bos_id)
    if files:
        if fim.rep is not None and fim.sep is not None:
            ids += [fim.rep] + enc(REPO_NAME + "\n")
        for name, text in files:
            if fim.sep is not None:
                ids += [fim.sep] + enc(name + "\n") + enc(text if text.endswith("\n") else text + "\n")
            else:       # no separator token: the files as plain text, a blank line apart
                ids += enc(text.rstrip("\n") + "\n\n")
        if fim.sep is not None:
            ids += [fim.sep] + enc(CURRENT_FILE + "\n")
    ids += [fim.pre] + enc(prefix) + [fim.suf] + enc(suffix) + [fim.mid]
    return ids


def require_fim(fim: FimTokens | None, model_id: str, param: str) -> FimTokens:
    if fim is None:
        raise bad_request(f"the model {model_id!r} has no fill-in-the-middle tokens (no FIM prefix/suffix/middle "
                          "token in its vocabulary or metadata); infilling needs a code model trained for it, "
                          "such as Qwen2.5-Coder", param=param, code="fim_not_supported")
    return fim
