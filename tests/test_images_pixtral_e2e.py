"""Mistral 3 (Pixtral) images end to end through every API surface on a live server: the tiny Mistral 3 of
tests/fixtures/reference/tiny/pixtral_vision (its chat template, each image's rows of [IMG] tokens); each route's
answer is Model.chat's greedy reply to the same canonical messages (and `llambda run`'s), as
tests/test_images_qwen25vl_e2e.py checks for Qwen2.5-VL, and the reference's two-image prompt gives transformers'
greedy tokens through the OpenAI route. The model's own tower runs (llambda.vision's Pixtral): nothing is a
double."""
from __future__ import annotations

import pytest

import llambda

import test_vlm_pixtral as p  # noqa: E402  (the fixture and its images)
import test_images_qwen25vl_e2e as grid_e2e  # noqa: E402  (the grid families' server checks, shared)
from test_images_e2e import every_surface, streamed  # noqa: E402

WIDE, TALL, FLAT = (p.FIX_PNG[n] for n in ("image_wide.png", "image_tall.png", "image_flat.png"))


def _load(**kw):
    return llambda.load(p.FOLDER, backend="native", activations="f32", **{"n_ctx": 128, **kw})


@pytest.fixture(scope="module")
def served():
    yield from grid_e2e.serve(_load, p, (WIDE, FLAT), (WIDE, TALL, (12 + 3) - (6 + 3)))


def test_every_surface_reaches_the_model(served):
    """OpenAI chat, Responses, Anthropic messages, Ollama chat and generate: Model.chat's greedy reply."""
    every_surface(served, served.images[0], list(served.images))


def test_the_reference_prompt_through_the_openai_route(served):
    grid_e2e.test_the_reference_prompt_through_the_openai_route(served)


def test_the_token_count_follows_each_image_size(served):
    grid_e2e.test_the_token_count_follows_each_image_grid(served)


def test_streams_with_images(served):
    got, want = streamed(served, served.images[1])
    assert got == want


def test_run_with_an_image_flag(served, tmp_path, monkeypatch, capsys):
    """`llambda run MODEL --image FILE PROMPT`: Model.chat's reply (the image's [IMG] rows before the text)."""
    grid_e2e.test_run_with_an_image_flag(served, tmp_path, monkeypatch, capsys)
