"""`gfcr demo` plumbing: extensions are imported explicitly, a broken one is an error."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gfcr.train import demo


def test_every_listed_extension_imports_and_registers_a_stage(tmp_path):
    ctx = demo.run_demo(output_dir=str(tmp_path), only=["summary"], console=Console(file=io.StringIO()))
    names = [n for n, _ in demo.DEMO_STAGES]
    assert {"ross", "report"} <= set(names)
    assert names[0] == "model" and names[-1] == "summary" and names.index("ross") > names.index("train")
    assert list(ctx.seconds) == ["summary"]  # `only` ran nothing else


def test_missing_extension_is_an_error_not_a_skip(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "DEMO_EXTENSIONS", ["gfcr.no_such_demo_module"])
    out = io.StringIO()
    with pytest.raises(demo.DemoError, match="gfcr.no_such_demo_module.*DEMO_EXTENSIONS"):
        demo.run_demo(output_dir=str(tmp_path), console=Console(file=out))
    assert "demo:" not in out.getvalue()  # stopped before any stage ran
    assert not any(tmp_path.iterdir())


def test_broken_extension_names_the_cause(tmp_path, monkeypatch):
    pkg = tmp_path / "brokendemo_ext.py"
    pkg.write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(demo.DemoError, match="brokendemo_ext.*RuntimeError: boom at import"):
        demo.load_extensions(["brokendemo_ext"])


def test_demo_config_is_valid_and_small():
    cfg = demo.demo_config()
    full = demo.demo_config(full=True)
    assert cfg.steps < full.steps
    n_eval = sum(t.n_eval for t in cfg.tasks)
    assert n_eval <= sum(t.n_eval for t in full.tasks)
    # per-step generation budget of the CPU demo (prompts x K x tokens) stays within the 2-core sizing
    assert cfg.generate.prompts_per_step * cfg.generate.k * cfg.generate.max_tokens <= 4 * 4 * 64
