"""The vision tower in a load's memory plan (models/memory.py add_vision, api._plan_tower): its weights and
one image's activations counted before anything is read, a load too large with its tower refused naming it
and vision=False, and the sizes `llambda ps` / Ollama's /api/ps report holding it. The tiny Gemma 3 of the
gemma3_vision fixture (its own tower in its folder); the memory available is faked as test_memory.py does."""
from __future__ import annotations

import pytest

import llambda
from llambda.errors import InsufficientMemoryError
from llambda.models import base, memory
from llambda.vision import tower as vision_tower

import test_vlm as vlm


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return vlm.folder_with_tokenizer(tmp_path_factory.mktemp("vmem") / "gemma", vlm.TEMPLATE)


@pytest.mark.parametrize("backend,activations,per_weight", [("native", "q8", 2), ("native", "f32", 4),
                                                             ("numpy", None, 4)])
def test_the_plan_counts_the_towers_weights_and_workspace(folder, backend, activations, per_weight):
    kw = dict(backend=backend, n_ctx=128, **({"activations": activations} if activations else {}))
    with llambda.load(folder, **kw) as m, llambda.load(folder, vision=False, **kw) as text:
        p, c = m.memory_plan, m.vision.cfg
        assert p.vision == c.params() * per_weight and p.vision_workspace == c.workspace_bytes() > 0
        assert p.total == text.memory_plan.total + p.vision + p.vision_workspace
        assert text.memory_plan.vision_total == 0 and text.vision is None
        assert any(line.startswith("vision tower") for line in p.lines())
        assert not any(line.startswith("vision tower") for line in text.memory_plan.lines())
        if backend == "native":      # the backend's own count of its packed dense layers; the vectors beside
            got = m.vision.backend.memory_report()["weights"]      # them are float32 arrays it does not count
            assert got <= p.vision <= 1.25 * got, (got, p.vision)


def _no_reading(monkeypatch):
    monkeypatch.setattr(base.Transformer, "_load", lambda *a: pytest.fail("the text model's weights were read"))
    monkeypatch.setattr(vision_tower.VisionTower, "__init__", lambda *a, **k: pytest.fail("the tower was read"))


def test_a_machine_too_small_for_the_tower_is_refused_before_loading(folder, monkeypatch):
    with llambda.load(folder, backend="native", n_ctx=128) as m:
        p = m.memory_plan
    text_only = p.total - p.vision_total
    with monkeypatch.context() as mp:
        _no_reading(mp)
        mp.setattr(memory, "mem_available", lambda: text_only + p.vision_total // 2)
        with pytest.raises(InsufficientMemoryError, match=r"for its vision tower .*\(vision=False") as e:
            llambda.load(folder, backend="native", n_ctx=128)
        assert "takes no images" in str(e.value)
    # the way out it names: the same memory holds the text model alone
    monkeypatch.setattr(memory, "mem_available", lambda: text_only + p.vision_total // 2)
    with llambda.load(folder, backend="native", n_ctx=128, vision=False) as m:
        assert m.vision is None and m.memory_plan.total == text_only
    # check_memory=False loads it all the same
    with llambda.load(folder, backend="native", n_ctx=128, check_memory=False) as m:
        assert m.accepts_images


def test_a_machine_too_small_for_the_text_model_says_what_the_tower_adds(folder, monkeypatch):
    with llambda.load(folder, backend="native", n_ctx=128) as m:
        p = m.memory_plan
    _no_reading(monkeypatch)
    monkeypatch.setattr(memory, "mem_available", lambda: p.weights // 2)
    with pytest.raises(InsufficientMemoryError, match=r"for its vision tower.*alone do not fit.*vision=False"):
        llambda.load(folder, backend="native", n_ctx=128)


def test_ps_and_api_ps_sizes_hold_the_tower(folder):
    from serverkit import LiveServer
    from llambda.commands.ps import running_models
    from llambda.server import ServerConfig, create_app
    sizes = {}
    for vision in (True, False):
        with llambda.load(folder, backend="numpy", n_ctx=128, vision=vision) as m, \
                LiveServer(create_app(m, ServerConfig(model_id="vis", parallel=1))) as srv:
            (entry,) = running_models(srv.url, None)
            assert entry["size"] == m.memory_plan.total
            sizes[vision] = entry["size"]
    with llambda.load(folder, backend="numpy", n_ctx=128) as m:
        tower = m.memory_plan.vision_total
    assert sizes[True] - sizes[False] == tower > 0


def test_show_verbose_prints_the_towers_share(folder, capsys):
    """`llambda show -v` prints the plan `llambda run -m` would make: the tower the folder holds included."""
    from llambda.cli import main
    assert main(["show", "-v", "-c", "128", str(folder)]) == 0
    printed = capsys.readouterr().out.split("memory plan (native backend):\n", 1)[1].splitlines()
    with llambda.load(folder, n_ctx=128) as m:
        assert m.backend.name == "native" and m.accepts_images
        want = m.memory_plan.lines()
    assert [line.strip() for line in printed[:len(want) - 1]] == want[:-1]   # (the total says MemAvailable now)
    assert any(line.startswith("vision tower") for line in want)


@pytest.mark.parametrize("cmd", [["run", "hi"], ["chat"], ["serve"]])
def test_no_mmproj_is_the_command_lines_way_out(folder, monkeypatch, capsys, cmd):
    """`--no-mmproj` (llama.cpp's flag) on run, chat and serve loads with vision=False; with --mmproj it is an
    error before anything loads. A load refused for its tower names the flag."""
    import llambda.api
    from llambda.cli import main
    from llambda.errors import LlambdaError
    seen = []

    def refuse(name, **kw):
        seen.append(kw)
        raise LlambdaError("stop here")

    monkeypatch.setattr(llambda.api, "load", refuse)
    assert main([cmd[0], "-m", str(folder), "--no-mmproj", *cmd[1:]]) == 1
    assert seen and seen[0]["vision"] is False and "mmproj" not in seen[0]
    assert main([cmd[0], "-m", str(folder), "--no-mmproj", "--mmproj", str(folder), *cmd[1:]]) == 1
    assert "--mmproj and --no-mmproj" in capsys.readouterr().err and len(seen) == 1
    monkeypatch.undo()
    with llambda.load(folder, backend="native", n_ctx=128) as m:
        p = m.memory_plan
    _no_reading(monkeypatch)
    monkeypatch.setattr(memory, "mem_available", lambda: p.total - p.vision_total // 2)
    with pytest.raises(InsufficientMemoryError, match="--no-mmproj"):
        llambda.load(folder, backend="native", n_ctx=128)


@pytest.mark.parametrize("family", ["gemma3_vision", "idefics3_vision"])
@pytest.mark.parametrize("activations,per_weight", [("q8", 2), ("f32", 4)])
def test_the_towers_share_is_what_each_familys_tower_allocates(family, activations, per_weight):
    """add_vision from the config read off the files' headers (as load() plans it, before any weight is read)
    against the tower load_vision builds: Gemma 3's SigLIP + projector and Idefics3's SigLIP + connector."""
    from pathlib import Path

    from llambda.vision import load_vision
    from llambda.vision.load import open_layout
    path = Path(__file__).parent / "fixtures" / "reference" / "tiny" / family
    layout = open_layout(path)
    for close in layout.closers:
        close()
    p = memory.MemoryPlan(0, 0, 0, 0, 0, 0, 1, 1, "f32", None)
    memory.add_vision(p, layout.cfg, per_weight)
    tower = load_vision(path, backend="native", activations=activations)
    try:
        got = tower.backend.memory_report()["weights"]    # its packed dense layers; float32 vectors beside them
        assert got <= p.vision <= 1.25 * got, (got, p.vision)
        assert p.vision_workspace == tower.cfg.workspace_bytes() and p.total == p.vision + p.vision_workspace
    finally:
        tower.close()
