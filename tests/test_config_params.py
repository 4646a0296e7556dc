"""Typed component parameters: every ``params`` dict a config gives a named component (verifier,
selector, group policy, replay buffer, advantage estimator, token term, length reward, topology,
engine, task source) is checked against that component's parameters at config load; an unknown
key or a wrong type is one line naming the config path, the component and the allowed keys."""

from __future__ import annotations

import pytest
import yaml

from gfcr.config import ConfigError, check_params, params_model
from gfcr.train.config import dump_config, load_config


def _error_line(overrides: dict, loader=load_config) -> str:
    with pytest.raises(ConfigError) as e:
        loader(None, overrides)
    lines = [ln.strip() for ln in str(e.value).splitlines()[1:]]
    assert len(lines) == 1, str(e.value)  # one line for the one mistake
    return lines[0]


# (overrides, the wrong key's line, the wrong type's overrides, its line) per component kind of gfcr train
TRAIN_CASES = {
    "verifier": (
        {"verify.verifier": "numeric", "verify.params": {"rel_tl": 0.1}},
        "verify.params: unknown key 'rel_tl' for verifier 'numeric'; allowed: answer_format, lenient_fallback, "
        "allow_truncated, rel_tol, abs_tol",
        {"verify.verifier": "numeric", "verify.params": {"rel_tol": "small"}},
        "verify.params.rel_tol: input should be a valid number, unable to parse string as a number, got 'small' "
        "for verifier 'numeric'"),
    "selector": (
        {"control.selector": "vcrl", "control.selector_params": {"kapa": 0.3}},
        "control.selector_params: unknown key 'kapa' for selector 'vcrl'; allowed: key, kappa, floor",
        {"control.selector": "vcrl", "control.selector_params": {"floor": [0.1]}},
        "control.selector_params.floor: input should be a valid number, got [0.1] for selector 'vcrl'"),
    "group policy": (
        {"control.group": "adaptive_k", "control.group_params": {"kmin": 2}},
        "control.group_params: unknown key 'kmin' for group policy 'adaptive_k'; allowed: k_min, k_max",
        {"control.group": "adaptive_k", "control.group_params": {"k_max": "many"}},
        "control.group_params.k_max: input should be a valid integer, unable to parse string as an integer, got "
        "'many' for group policy 'adaptive_k'"),
    "buffer": (
        {"replay.buffer": "repo", "replay.params": {"num_replay": 2}},
        "replay.params: unknown key 'num_replay' for buffer 'repo'; allowed: strategy, num_replays, max_cache_size, "
        "min_cache_to_replay, adv_norm_mode, off_policy_loss_coef, loss_sets",
        {"replay.buffer": "repo", "replay.params": {"num_replays": "many"}},
        "replay.params.num_replays: input should be a valid integer, unable to parse string as an integer, got "
        "'many' for buffer 'repo'"),
    "advantage estimator": (
        {"signals.advantage": "seed_grpo", "signals.advantage_params": {"alfa": 1.0}},
        "signals.advantage_params: unknown key 'alfa' for advantage estimator 'seed_grpo'; allowed: alpha, form, "
        "estimator, likelihood",
        {"signals.advantage": "seed_grpo", "signals.advantage_params": {"likelihood": "maybe"}},
        "signals.advantage_params.likelihood: input should be a valid boolean, unable to interpret input, got "
        "'maybe' for advantage estimator 'seed_grpo'"),
    "token term": (
        {"signals.token_terms": [{"name": "teacher_kl", "params": {"discnt": 0.5}}]},
        "signals.token_terms[].params: unknown key 'discnt' for token term 'teacher_kl'; allowed: discount",
        {"signals.token_terms": [{"name": "teacher_kl", "params": {"discount": "half"}}]},
        "signals.token_terms[].params.discount: input should be a valid number, unable to parse string as a number, "
        "got 'half' for token term 'teacher_kl'"),
    "length reward": (
        {"signals.length_reward": "shorter_better", "signals.length_params": {"gamma": 1.0}},
        "signals.length_params: unknown key 'gamma' for length reward 'shorter_better'; allowed: alpha, beta",
        {"signals.length_reward": "shorter_better", "signals.length_params": {"beta": "tiny"}},
        "signals.length_params.beta: input should be a valid number, unable to parse string as a number, got "
        "'tiny' for length reward 'shorter_better'"),
    "topology": (
        {"generate.topology": "tree", "generate.params": {"mm": 2}},
        "generate.params: unknown key 'mm' for topology 'tree'; allowed: m, n, l, t, min_prefix_frac, no_fork_after",
        {"generate.topology": "tree", "generate.params": {"m": "two"}},
        "generate.topology.m: Input should be a valid integer, unable to parse string as an integer [int_parsing]"),
    "engine": (
        {"generate.engine": "openai", "generate.engine_params": {"base_url": "http://127.0.0.1:1/v1", "timeout": 5}},
        "generate.engine_params: unknown key 'timeout' for engine 'openai'; allowed: base_url, model, api_key, "
        "max_concurrency, max_retries, backoff_s, timeout_s, extra_body",
        {"generate.engine": "openai", "generate.engine_params": {"base_url": "http://127.0.0.1:1/v1", "timeout_s": "soon"}},
        "generate.engine_params.timeout_s: input should be a valid number, unable to parse string as a number, got "
        "'soon' for engine 'openai'"),
    "task source": (
        {"tasks": [{"name": "arith", "params": {"lvl": 2}}]},
        "tasks[].params: unknown key 'lvl' for task source 'arith'; allowed: n, level, digits, terms, ops, seed, "
        "split, system",
        {"tasks": [{"name": "arith", "eval_params": {"level": "hard"}}]},
        "tasks[].eval_params.level: input should be a valid integer, unable to parse string as an integer, got "
        "'hard' for task source 'arith'"),
}


@pytest.mark.parametrize("kind", sorted(TRAIN_CASES))
def test_a_wrong_key_and_a_wrong_type_fail_at_train_config_load(kind):
    bad_key, key_line, bad_type, type_line = TRAIN_CASES[kind]
    assert _error_line(bad_key) == key_line
    assert _error_line(bad_type) == type_line


def test_params_are_coerced_to_the_declared_types_and_kept_as_given():
    cfg = load_config(None, {"replay.buffer": "repo", "replay.params": {"num_replays": "3"},
                             "control.selector": "greso", "control.selector_params": {"p_min": "1e-2"}})
    assert cfg.replay.params == {"num_replays": 3}  # only the keys given; the buffer keeps its defaults
    assert cfg.control.selector_params == {"p_min": 0.01}  # YAML reads 1e-2 as a string; the selector takes a float
    # a component whose parameters go on to another library (vllm.LLM) takes any extra key
    cfg = load_config(None, {"generate.engine": "vllm", "generate.engine_params": {"enforce_eager": True}})
    assert cfg.generate.engine.params == {"enforce_eager": True}


def test_the_run_supplies_its_own_engine_arguments():
    line = _error_line({"generate.engine": "hf", "generate.sync": "copy", "generate.engine_params": {"max_batch": 8}})
    assert line == "generate.engine_params: unknown key 'max_batch' for engine 'hf'; allowed: dtype"  # generate.max_batch
    line = _error_line({"generate.engine": "openai", "generate.engine_params": {"base_url": "u", "token_env": "T"}})
    assert "'token_env' names no parameter of engine 'openai'" in line and "api_key_env" in line


def test_train_composes_generates_engine_and_topology_sub_configs(tmp_path):
    from gfcr.generate.config import EngineConfig, TopologyConfig

    flat = load_config(None, {"generate.engine": "openai", "generate.engine_params": {"base_url": "u", "model": "m"},
                              "generate.topology": "multi_turn", "generate.k": 3,
                              "generate.params": {"env": "calculator", "max_turns": 2}})
    g = flat.generate
    assert isinstance(g.engine, EngineConfig) and isinstance(g.topology, TopologyConfig)
    assert (g.engine.name, g.engine.params, g.topology.name, g.k, g.topology.env, g.topology.max_turns) == \
        ("openai", {"base_url": "u", "model": "m"}, "multi_turn", 3, "calculator", 2)
    nested = load_config(None, {"generate.engine": {"name": "openai", "params": {"base_url": "u", "model": "m"}},
                                "generate.topology": {"name": "multi_turn", "k": 3, "env": "calculator", "max_turns": 2}})
    assert nested.generate == g
    # the resolved config keeps only the topology's own keys and loads back to the same config
    dump_config(flat, tmp_path / "config.yaml")
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())["generate"]
    assert written["topology"] == {"name": "multi_turn", "k": 3, "env": "calculator", "max_turns": 2, "obs_role": "user"}
    assert load_config(tmp_path / "config.yaml") == flat
    # a run folder written before the composition (flat keys) still loads (resume)
    old = yaml.safe_load((tmp_path / "config.yaml").read_text())
    old["generate"] |= {"engine": "openai", "engine_params": {"base_url": "u", "model": "m"}, "topology": "multi_turn",
                        "k": 3, "params": {"env": "calculator", "max_turns": 2}}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    assert load_config(tmp_path / "old.yaml") == flat
    # a --set in the flat spelling over a config written nested (a run's config.yaml) wins
    over = load_config(tmp_path / "config.yaml", {"generate.k": 5, "generate.engine_params.model": "n"})
    assert (over.generate.k, over.generate.engine.params) == (5, {"base_url": "u", "model": "n"})


def test_gfcr_generate_checks_the_same_sub_configs():
    from pydantic import ValidationError

    from gfcr.generate.config import GenerateConfig

    with pytest.raises(ValidationError, match="engine.params: unknown key 'max_bach' for engine 'hf'; allowed: model, "
                                              "tokenizer, device, max_batch, policy_version, dtype"):
        GenerateConfig(store="s", engine={"name": "hf", "params": {"max_bach": 4}})
    with pytest.raises(ValidationError, match="topology: unknown key 'm' for topology 'group'; allowed: k"):
        GenerateConfig(store="s", topology={"name": "group", "m": 2})
    with pytest.raises(ValidationError, match="tasks.params.level: input should be a valid integer"):
        GenerateConfig(store="s", tasks={"name": "arith", "params": {"level": "x"}})
    cfg = GenerateConfig(store="s", engine={"name": "pkg.mod:Mine", "params": {"anything": 1}})  # a user's own engine
    assert cfg.engine.params == {"anything": 1}  # is not imported at config load; its own signature checks the call


def test_ross_checks_verifier_and_task_params_and_composes_the_judge_config():
    from gfcr.filters.judge import JudgeConfig
    from gfcr.ross.config import load_config as load_ross

    base = {"store": "s", "upstream_model": "m"}

    def line(over):
        return _error_line(base | over, lambda _p, o: load_ross(None, o))

    assert line({"window.reverify": "numeric", "window.reverify_params": {"strict": True}}).startswith(
        "window.reverify_params: unknown key 'strict' for verifier 'numeric'; allowed: answer_format")
    assert line({"evaluate.verifier_params": {"lenient_fallback": "perhaps"}}) == (
        "evaluate.verifier_params.lenient_fallback: input should be a valid boolean, unable to interpret input, got "
        "'perhaps' for verifier 'numeric'")
    assert line({"evaluate.benchmarks": [{"name": "b", "source": "arith", "params": {"levl": 2}}]}).startswith(
        "evaluate.benchmarks[].params: unknown key 'levl' for task source 'arith'")
    # the llm judge's endpoint is the Filter room's JudgeConfig; the flat keys users write still work
    cfg = load_ross(None, base | {"judge": {"name": "llm", "base_url": "http://127.0.0.1:1/v1", "model": "j",
                                            "api_key_env": "K", "retries": 3}})
    assert isinstance(cfg.judge.llm, JudgeConfig) and cfg.judge.retries == 3
    assert (cfg.judge.llm.base_url, cfg.judge.llm.model, cfg.judge.llm.api_key_env, cfg.judge.llm.max_tokens) == \
        ("http://127.0.0.1:1/v1", "j", "K", 1024)
    assert "judge.llm.temprature: Extra inputs are not permitted" in line(
        {"judge": {"name": "llm", "llm": {"base_url": "u", "model": "j", "temprature": 0}}})
    assert "the llm judge needs base_url and model" in line({"judge": {"name": "llm"}})


def test_simulate_checks_selector_and_buffer_params():
    from pydantic import ValidationError

    from gfcr.sim.simulator import StrategyConfig

    with pytest.raises(ValidationError, match="strategies\\[\\].selector_params: unknown key 'lr_' for selector 'sec'"):
        StrategyConfig(name="s", selector="sec", selector_params={"lr_": 0.5})
    with pytest.raises(ValidationError, match="strategies\\[\\].buffer_params.mix_ratio: input should be a valid number"):
        StrategyConfig(name="e", control="exgrpo", buffer_params={"mix_ratio": "half"})


def test_params_model_reads_a_declared_config_or_the_signature():
    from gfcr.filters.verifiers import NumericVerifier

    assert params_model(NumericVerifier) is NumericVerifier.Config

    def factory(a: int, b: float = 0.5, **rest):
        return a, b, rest

    model = params_model(factory)
    assert set(model.model_fields) == {"a", "b"} and model.model_config["extra"] == "allow"
    assert check_params("x", "thing", "f", factory, {"b": "2", "c": 1}) == {"b": 2.0, "c": 1}
    assert check_params("x", "thing", "f", factory, {}) == {}  # a missing required `a` is the caller's to give
    with pytest.raises(ConfigError, match="x.a: input should be a valid integer"):
        check_params("x", "thing", "f", factory, {"a": "one"})


def test_engine_args_is_read_as_params_with_a_one_line_deprecation_note(tmp_path):
    """Issue 46 part 4: one word, ``params``, for a component's keyword arguments. ``engine.args``
    (gfcr generate) and ``generate.engine.args`` (gfcr train) still load, each with one note."""
    import warnings

    from gfcr.generate.config import GenerateConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = GenerateConfig(store="s", engine={"name": "hf", "args": {"device": "cpu"}})
    assert old == GenerateConfig(store="s", engine={"name": "hf", "params": {"device": "cpu"}})
    notes = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert notes == ["engine.args is deprecated: write engine.params (read as engine.params for now)"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = load_config(None, {"generate.engine": {"name": "openai", "args": {"base_url": "u"}},
                               "generate.engine_params": {"model": "m"}})
    assert t.generate.engine.params == {"base_url": "u", "model": "m"}  # the flat key still merges in
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == [
        "generate.engine.args is deprecated: write generate.engine.params (read as generate.engine.params for now)"]
    assert "args" not in yaml.safe_load(yaml.safe_dump(t.model_dump(mode="json")))["generate"]["engine"]


def test_composite_options_is_read_as_params_with_a_note():
    import warnings

    from gfcr.filters.verifiers import get_verifier

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = get_verifier("composite", parts=[{"name": "format", "options": {"pattern": "^A"}}])
    new = get_verifier("composite", parts=[{"name": "format", "params": {"pattern": "^A"}}])
    assert old.config == new.config and old.verify("A: 1").score == new.verify("A: 1").score == 1.0
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == [
        "composite.parts[].options is deprecated: write composite.parts[].params (read as composite.parts[].params for now)"]
