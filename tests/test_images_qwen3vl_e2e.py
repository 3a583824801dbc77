"""Qwen3-VL images end to end through every API surface on a live server: test_images_qwen25vl_e2e's checks (each
route's answer is Model.chat's greedy reply to the same canonical messages, and `llambda run --image`'s; the
reference's two-image prompt gives transformers' greedy tokens through the OpenAI route; token counts follow each
image's grid) on the tiny Qwen3-VL of tests/fixtures/reference/tiny/qwen3_vl_vision. The API and CLI layers are
generic: what differs is the positions after each image (interleaved M-RoPE, the scheduler's per-sequence delta)
and the image rows' DeepStack columns, which ride on the scheduler's sequences. The model's own tower runs
(llambda.vision's Qwen3-VL, found by llambda.load): nothing here is a double."""
from __future__ import annotations

import pytest

import llambda

import test_vlm_qwen3vl as q  # noqa: E402  (the fixture and its images)
from test_images_qwen25vl_e2e import (serve, test_every_surface_reaches_the_model,  # noqa: F401 (run here too)
                                      test_run_with_an_image_flag, test_streams_with_images,
                                      test_the_reference_prompt_through_the_openai_route,
                                      test_the_token_count_follows_each_image_grid)

WIDE, TALL = q.FIX_PNG["image_wide.png"], q.FIX_PNG["image_tall.png"]


def _load(**kw):
    """The fixture with its own tower, found by load() (llambda.vision's Qwen3-VL: resized, patched, encoded)."""
    return llambda.load(q.FOLDER, backend="native", activations="f32", **{"n_ctx": 128, **kw})


@pytest.fixture(scope="module")
def served():
    yield from serve(_load, q, (WIDE, TALL), (TALL, WIDE, 15 - 12))      # grids 3 x 4, 5 x 3
