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
