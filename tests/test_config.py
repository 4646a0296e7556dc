import pytest
from pydantic import BaseModel, ConfigDict, Field

from gfcr.config import ConfigError, load_config_model, parse_sets, read_yaml_mapping


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(1e-5, gt=0)


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = 3
    optim: Inner = Field(default_factory=Inner)


def test_yaml_overrides_and_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 5\noptim: {lr: 0.1}\n")
    cfg = load_config_model(Outer, p, parse_sets(["optim.lr=2e-3"]))
    assert cfg.steps == 5 and cfg.optim.lr == pytest.approx(2e-3)
    assert load_config_model(Outer).steps == 3
    with pytest.raises(ConfigError, match=r"optim\.lrr: Extra inputs"):
        load_config_model(Outer, p, {"optim.lrr": 1})
    with pytest.raises(ConfigError, match=r"optim\.lr: Input should be greater than 0"):
        load_config_model(Outer, p, {"optim.lr": -1})
    with pytest.raises(ConfigError, match="not a section"):
        load_config_model(Outer, p, {"steps.x": 1})
    with pytest.raises(ConfigError, match="not found"):
        load_config_model(Outer, tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("steps: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config_model(Outer, tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config_model(Outer, tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_sets(["novalue"])


def test_a_key_given_twice_is_an_error_not_a_silent_override(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("a: 1\nb:\n  x: 1\n  y: 2\n  x: 3\n")
    with pytest.raises(ConfigError, match=r"'x' appears twice in one mapping \(lines 3 and 5\)"):
        read_yaml_mapping(p)
    p.write_text("a: 1\nb: {x: 1, y: 2}\n")
    assert read_yaml_mapping(p) == {"a": 1, "b": {"x": 1, "y": 2}}


def test_new_run_dir_never_reuses_a_folder(tmp_path):
    from gfcr.config import new_run_dir

    a, b = new_run_dir(tmp_path / "runs", "demo"), new_run_dir(tmp_path / "runs", "demo")
    assert a != b and a.is_dir() and b.is_dir() and not any(a.iterdir())
    assert a.name.startswith("demo-") and b.name.startswith(a.name[: len("demo-YYYYmmdd-HHMMSS") - 1])


def test_resolve_object_by_table_or_import_path():
    import math

    from gfcr.config import resolve_object

    assert resolve_object("sqrt", {"sqrt": "math:sqrt"}) is math.sqrt  # a lazy table entry
    assert resolve_object("one", {"one": 1}) == 1
    assert resolve_object("math:pi") == math.pi  # a user's import path
    with pytest.raises(ConfigError, match=r"unknown verifier 'nope'; choose one of \['a'\] or give 'pkg.module:name'"):
        resolve_object("nope", {"a": 1}, "verifier")
    with pytest.raises(ConfigError, match="cannot import env 'math:nothing'"):
        resolve_object("math:nothing", kind="env")
    with pytest.raises(ModuleNotFoundError):  # a table entry's missing optional dependency is not hidden
        resolve_object("x", {"x": "no_such_module_here:X"})
