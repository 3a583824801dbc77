"""GLM-4.1V images end to end on a live server: the tiny GLM-4.1V of tests/fixtures/reference/tiny/glm4v_vision
with its own tower (found by llambda.load); every API surface answers Model.chat's greedy reply, and the
reference's two-image prompt gives transformers' greedy tokens through the OpenAI route (test_images_qwen25vl_e2e's
checks on this fixture)."""
from __future__ import annotations

import pytest

import llambda

import test_images_qwen25vl_e2e as qe2e  # noqa: E402  (the grid families' server checks)
import test_vlm_glm4v as g  # noqa: E402  (the fixture and its images)
from test_images_e2e import every_surface  # noqa: E402

WIDE, BIG, THIN = (g.FIX_PNG[n] for n in ("image_wide.png", "image_big.png", "image_thin.png"))


def _load(**kw):
    return llambda.load(g.FOLDER, backend="native", activations="f32", **{"n_ctx": 128, **kw})


@pytest.fixture(scope="module")
def served():
    yield from qe2e.serve(_load, g, (WIDE, BIG), (WIDE, THIN, 15 - 6))     # grids 3 x 5, 3 x 2


def test_every_surface_reaches_the_model(served):
    every_surface(served, served.images[0], list(served.images))


def test_the_reference_prompt_through_the_openai_route(served):
    qe2e.test_the_reference_prompt_through_the_openai_route(served)


def test_the_token_count_follows_each_image_grid(served):
    qe2e.test_the_token_count_follows_each_image_grid(served)
