"""Typed component parameters: every ``params`` dict a config gives a named component (verifier,
selector, group policy, replay buffer, advantage estimator, token term, length reward, topology,
engine, task source) is checked against that component's parameters at config load; an unknown
key or a wrong type is one line naming the config path, the component and the allowed keys."""

from __future__ import annotations

import warnings

import pytest
import yaml
from pydantic import ValidationError

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
        {"verify.verifier": {"name": "numeric", "params": {"rel_tl": 0.1}}},
        "verify.verifier.params: unknown key 'rel_tl' for verifier 'numeric'; allowed: answer_format, "
        "lenient_fallback, allow_truncated, rel_tol, abs_tol",
        {"verify.verifier": {"name": "numeric", "params": {"rel_tol": "small"}}},
        "verify.verifier.params.rel_tol: input should be a valid number, unable to parse string as a number, got "
        "'small' for verifier 'numeric'"),
    "selector": (
        {"control.selector": {"name": "vcrl", "params": {"kapa": 0.3}}},
        "control.selector.params: unknown key 'kapa' for selector 'vcrl'; allowed: key, kappa, floor",
        {"control.selector": {"name": "vcrl", "params": {"floor": [0.1]}}},
        "control.selector.params.floor: input should be a valid number, got [0.1] for selector 'vcrl'"),
    "group policy": (
        {"control.group": {"name": "adaptive_k", "params": {"kmin": 2}}},
        "control.group.params: unknown key 'kmin' for group policy 'adaptive_k'; allowed: k_min, k_max",
        {"control.group": {"name": "adaptive_k", "params": {"k_max": "many"}}},
        "control.group.params.k_max: input should be a valid integer, unable to parse string as an integer, got "
        "'many' for group policy 'adaptive_k'"),
    "buffer": (
        {"replay.buffer": {"name": "repo", "params": {"num_replay": 2}}},
        "replay.buffer.params: unknown key 'num_replay' for buffer 'repo'; allowed: strategy, num_replays, "
        "max_cache_size, min_cache_to_replay, adv_norm_mode, off_policy_loss_coef, loss_sets",
        {"replay.buffer": {"name": "repo", "params": {"num_replays": "many"}}},
        "replay.buffer.params.num_replays: input should be a valid integer, unable to parse string as an integer, "
        "got 'many' for buffer 'repo'"),
    "advantage estimator": (
        {"signals.advantage": {"name": "seed_grpo", "params": {"alfa": 1.0}}},
        "signals.advantage.params: unknown key 'alfa' for advantage estimator 'seed_grpo'; allowed: alpha, form, "
        "estimator, likelihood",
        {"signals.advantage": {"name": "seed_grpo", "params": {"likelihood": "maybe"}}},
        "signals.advantage.params.likelihood: input should be a valid boolean, unable to interpret input, got "
        "'maybe' for advantage estimator 'seed_grpo'"),
    "token term": (
        {"signals.token_terms": [{"name": "teacher_kl", "params": {"discnt": 0.5}}]},
        "signals.token_terms[].params: unknown key 'discnt' for token term 'teacher_kl'; allowed: discount",
        {"signals.token_terms": [{"name": "teacher_kl", "params": {"discount": "half"}}]},
        "signals.token_terms[].params.discount: input should be a valid number, unable to parse string as a number, "
        "got 'half' for token term 'teacher_kl'"),
    "length reward": (
        {"signals.length_reward": {"name": "shorter_better", "params": {"gamma": 1.0}}},
        "signals.length_reward.params: unknown key 'gamma' for length reward 'shorter_better'; allowed: alpha, beta",
        {"signals.length_reward": {"name": "shorter_better", "params": {"beta": "tiny"}}},
        "signals.length_reward.params.beta: input should be a valid number, unable to parse string as a number, "
        "got 'tiny' for length reward 'shorter_better'"),
    "topology": (
        {"generate.topology": {"name": "tree", "params": {"mm": 2}}},
        "generate.topology.params: unknown key 'mm' for topology 'tree'; allowed: m, n, l, t, min_prefix_frac, "
        "no_fork_after",
        {"generate.topology": {"name": "tree", "params": {"m": "two"}}},
        "generate.topology.params.m: input should be a valid integer, unable to parse string as an integer, got "
        "'two' for topology 'tree'"),
    "engine": (
        {"generate.engine": {"name": "openai", "params": {"base_url": "http://127.0.0.1:1/v1", "timeout": 5}}},
        "generate.engine.params: unknown key 'timeout' for engine 'openai'; allowed: base_url, model, api_key, "
        "max_concurrency, max_retries, backoff_s, timeout_s, extra_body",
        {"generate.engine": {"name": "openai", "params": {"base_url": "http://127.0.0.1:1/v1", "timeout_s": "soon"}}},
        "generate.engine.params.timeout_s: input should be a valid number, unable to parse string as a number, got "
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
    cfg = load_config(None, {"replay.buffer": {"name": "repo", "params": {"num_replays": "3"}},
                             "control.selector": {"name": "greso", "params": {"p_min": "1e-2"}}})
    assert cfg.replay.buffer.params == {"num_replays": 3}  # only the keys given; the buffer keeps its defaults
    assert cfg.control.selector.params == {"p_min": 0.01}  # YAML reads 1e-2 as a string; the selector takes a float
    # the typed model of the method, looked up by name, has every default of the method's own class
    from gfcr.replay.buffers import RePO

    typed = cfg.replay.buffer.typed()
    assert typed.num_replays == 3 and typed.max_cache_size == RePO().max_cache_size
    # a component whose parameters go on to another library (vllm.LLM) takes any extra key
    cfg = load_config(None, {"generate.engine": {"name": "vllm", "params": {"enforce_eager": True}}})
    assert cfg.generate.engine.params == {"enforce_eager": True}


def test_a_method_named_alone_takes_params_from_set():
    """``--set control.selector.params.kappa=0.3`` over a file that says ``selector: vcrl`` opens the name."""
    cfg = load_config(None, {"control.selector": "vcrl", "control.selector.params.kappa": 0.3,
                             "generate.topology": "group", "generate.topology.params.k": 3})
    assert (cfg.control.selector.name, cfg.control.selector.params, cfg.generate.k) == ("vcrl", {"kappa": 0.3}, 3)
    line = _error_line({"control.selector": "gresso"})
    assert line == "control.selector 'gresso' does not exist; choose one of ['greso', 'sec', 'uniform', 'vade', 'vcrl']"


def test_the_run_supplies_its_own_engine_arguments():
    line = _error_line({"generate.engine": {"name": "hf", "params": {"max_batch": 8}}, "generate.sync": "copy"})
    assert line == "generate.engine.params: unknown key 'max_batch' for engine 'hf'; allowed: dtype"  # generate.max_batch
    line = _error_line({"generate.engine": {"name": "openai", "params": {"base_url": "u", "token_env": "T"}}})
    assert "'token_env' names no parameter of engine 'openai'" in line and "api_key_env" in line


def test_generate_has_one_shape_in_gfcr_generate_and_gfcr_train(tmp_path):
    """The engine and topology sections of a ``gfcr generate`` config are ``gfcr train``'s
    ``generate.engine`` and ``generate.topology`` as they are, and are written back the same way."""
    from gfcr.generate.config import EngineConfig, GenerateConfig, TopologyConfig

    sections = {"engine": {"name": "openai", "model": "m", "params": {"base_url": "u"}},
                "topology": {"name": "multi_turn", "params": {"k": 3, "env": "calculator", "max_turns": 2}}}
    gen = GenerateConfig.model_validate({"store": "s", **sections})
    train = load_config(None, {f"generate.{k}": v for k, v in sections.items()})
    g = train.generate
    assert isinstance(g.engine, EngineConfig) and isinstance(g.topology, TopologyConfig)
    resolved = sections | {"topology": {"name": "multi_turn", "params": sections["topology"]["params"] |
                                        {"obs_role": "user"}}}  # a topology's defaults are written out
    for key in sections:
        assert getattr(gen, key).model_dump() == getattr(g, key).model_dump() == resolved[key]
    assert (g.k, g.topology.typed().env, g.topology.kwargs()["obs_role"]) == (3, "calculator", "user")
    # the resolved config is written in the same shape and loads back to the same config
    dump_config(train, tmp_path / "config.yaml")
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())["generate"]
    assert {k: written[k] for k in sections} == resolved
    assert load_config(tmp_path / "config.yaml") == train
    # a run folder's config.yaml written before (topology keys flat, every default filled) is the same
    # config as the file it was resolved from, so --resume finds nothing changed
    assert load_config(None, {"generate": {"topology": {"name": "group", "k": 4}}}) == load_config(None, {})


def test_the_old_flat_shape_loads_with_one_note_per_key(tmp_path):
    """A config (or a run folder's config.yaml, for --resume) written in the flat shape loads to the
    same config; each old key is said in one line with what to write instead."""
    import warnings

    new = {"generate": {"engine": {"name": "openai", "params": {"base_url": "u", "model": "m"}},
                        "topology": {"name": "multi_turn", "params": {"k": 3, "env": "calculator"}}},
           "verify": {"verifier": {"name": "numeric", "params": {"lenient_fallback": True}}},
           "signals": {"advantage": {"name": "seed_grpo", "params": {"alpha": 0.5}},
                       "length_reward": {"name": "shorter_better", "params": {"beta": 0.01}}},
           "control": {"selector": {"name": "vcrl", "params": {"kappa": 0.3}},
                       "group": {"name": "adaptive_k", "params": {"k_max": 6}}},
           "replay": {"buffer": {"name": "repo", "params": {"num_replays": 2}}}}
    old = {"generate": {"engine": "openai", "engine_params": {"base_url": "u", "model": "m"}, "topology": "multi_turn",
                        "k": 3, "params": {"env": "calculator"}},
           "verify": {"params": {"lenient_fallback": True}},  # the default verifier, numeric
           "signals": {"advantage": "seed_grpo", "advantage_params": {"alpha": 0.5},
                       "length_reward": "shorter_better", "length_params": {"beta": 0.01}},
           "control": {"selector": "vcrl", "selector_params": {"kappa": 0.3},
                       "group": "adaptive_k", "group_params": {"k_max": 6}},
           "replay": {"buffer": "repo", "params": {"num_replays": 2}}}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = load_config(tmp_path / "old.yaml")
    assert got == load_config(None, new)
    notes = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert len(notes) == 9 and all(n.count("\n") == 0 for n in notes)
    assert "control.selector_params is the old config shape: write control.selector: {name: vcrl, params: " \
           "{kappa: 0.3}} (read that way for now; `gfcr config migrate FILE` rewrites a file)" in notes
    assert any(n.startswith("generate.k is the old config shape: write generate.topology: {name: multi_turn, "
                            "params: {k: 3}}") for n in notes)
    # a --set in the old spelling over a file in the new shape wins (the flat key was the override)
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(new))
    over = load_config(tmp_path / "new.yaml", {"generate.k": 5, "generate.engine_params.model": "n"})
    assert (over.generate.k, over.generate.engine.params) == (5, {"base_url": "u", "model": "n"})
    # parameters of a method that is off by default, with no method named, are refused in one line
    assert _error_line({"replay.params": {"num_replays": 2}}) == (
        "replay.params is set but replay.buffer is not (name the buffer the parameters are for: replay.buffer: "
        "{name: NAME, params: {...}})")
    # a tree's size is its shape: the old generate.k never applied to it and is dropped
    tree = load_config(None, {"generate.k": 4, "generate.topology": "tree", "generate.params": {"m": 2}})
    assert tree.generate.topology.params["m"] == 2 and "k" not in tree.generate.topology.params


def test_gfcr_config_migrate_rewrites_an_old_file(tmp_path):
    from typer.testing import CliRunner

    from gfcr.cli import app

    old = {"steps": 2, "generate": {"k": 2, "engine_params": {"dtype": "bfloat16"}, "sync": "copy"},
           "control": {"selector": "vcrl", "selector_params": {"kappa": 0.3}}}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    res = CliRunner().invoke(app, ["config", "migrate", str(path)])
    assert res.exit_code == 0, res.output
    printed = yaml.safe_load(res.stdout)
    assert printed["generate"]["topology"] == {"name": "group", "params": {"k": 2}}
    assert printed["generate"]["engine"] == {"name": "hf", "params": {"dtype": "bfloat16"}}
    assert printed["control"]["selector"] == {"name": "vcrl", "params": {"kappa": 0.3}}
    assert "moved: control.selector_params" in res.stderr
    assert load_config(None, printed) == load_config(path)  # the same config, now in the current shape
    res = CliRunner().invoke(app, ["config", "migrate", str(path), "--write"])
    assert res.exit_code == 0 and yaml.safe_load(path.read_text()) == printed
    res = CliRunner().invoke(app, ["config", "migrate", str(path), "--write"])  # already current: left alone
    assert res.exit_code == 0 and "already in the current shape" in res.stderr
    gen = tmp_path / "gen.yaml"
    gen.write_text(yaml.safe_dump({"sampling": {"max_tokens": 8}, "topology": {"name": "tree", "m": 2}}))
    res = CliRunner().invoke(app, ["config", "migrate", str(gen)])
    assert res.exit_code == 0 and yaml.safe_load(res.stdout)["topology"] == {"name": "tree", "params": {"m": 2}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"control": {"group_params": {"k_max": 3}}}))
    res = CliRunner().invoke(app, ["config", "migrate", str(bad)])
    assert res.exit_code == 2 and "control.group_params is set but control.group is not" in res.stderr


def test_gfcr_generate_checks_the_same_sub_configs():
    from pydantic import ValidationError

    from gfcr.generate.config import GenerateConfig

    with pytest.raises(ValidationError, match="engine.params: unknown key 'max_bach' for engine 'hf'; allowed: model, "
                                              "tokenizer, device, max_batch, policy_version, dtype"):
        GenerateConfig(store="s", engine={"name": "hf", "params": {"max_bach": 4}})
    with pytest.raises(ValidationError, match="topology.params: unknown key 'm' for topology 'group'; allowed: k"):
        GenerateConfig(store="s", topology={"name": "group", "params": {"m": 2}})
    with pytest.warns(FutureWarning, match=r"topology: \{name: tree, m: 2\} is the old config shape: write "
                                           r"topology: \{name: tree, params: \{m: 2\}\}"):
        assert GenerateConfig(store="s", topology={"name": "tree", "m": 2}).topology.params["m"] == 2
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

    assert line({"window.reverify": {"name": "numeric", "params": {"strict": True}}}).startswith(
        "window.reverify.params: unknown key 'strict' for verifier 'numeric'; allowed: answer_format")
    assert line({"evaluate.verifier": {"name": "numeric", "params": {"lenient_fallback": "perhaps"}}}) == (
        "evaluate.verifier.params.lenient_fallback: input should be a valid boolean, unable to interpret input, got "
        "'perhaps' for verifier 'numeric'")
    assert line({"evaluate.benchmarks": [{"name": "b", "verifier": {"name": "math", "params": {"x": 1}}}]}).startswith(
        "evaluate.benchmarks[].verifier.params: unknown key 'x' for verifier 'math'")
    assert line({"evaluate.verifier": "numerc"}).startswith("evaluate.verifier 'numerc' does not exist; choose one of")
    assert line({"evaluate.engine": {"name": "hf", "params": {"max_bach": 2}}}).startswith(
        "evaluate.engine.params: unknown key 'max_bach' for engine 'hf'")
    # typed per method: the verifier's own Config, with its defaults
    cfg = load_ross(None, base | {"evaluate.verifier": {"name": "numeric", "params": {"lenient_fallback": True}}})
    assert cfg.evaluate.verifier.typed().lenient_fallback is True and cfg.evaluate.verifier.params == {
        "lenient_fallback": True}
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

    with pytest.raises(ValidationError, match="strategies\\[\\].selector.params: unknown key 'lr_' for selector 'sec'"):
        StrategyConfig(name="s", selector={"name": "sec", "params": {"lr_": 0.5}})
    with pytest.raises(ValidationError, match="strategies\\[\\].buffer.params.mix_ratio: input should be a valid number"):
        StrategyConfig(name="e", control="exgrpo", buffer={"name": "exgrpo", "params": {"mix_ratio": "half"}})
    with pytest.raises(ValidationError, match="strategies\\[\\].group 'dapo' does not exist; choose one of"):
        StrategyConfig(name="g", group="dapo")
    assert StrategyConfig(name="v", selector="vcrl").selector.typed().kappa > 0  # the method's own default


#: a ROSS config in the older flat shape, one key of each kind, and the same config written now
ROSS_OLD = {"store": "s", "upstream_model": "m",
            "window": {"reverify": "numeric", "reverify_params": {"lenient_fallback": True}},
            "evaluate": {"verifier_params": {"lenient_fallback": True}, "engine": "vllm",
                         "engine_params": {"enforce_eager": True},
                         "benchmarks": [{"name": "a", "source": "arith", "verifier_params": {"lenient_fallback": False}},
                                        {"name": "b", "source": "arith", "verifier": "math",
                                         "verifier_params": {}}, {"name": "c", "source": "arith"}]}}
ROSS_NEW = {"store": "s", "upstream_model": "m",
            "window": {"reverify": {"name": "numeric", "params": {"lenient_fallback": True}}},
            "evaluate": {"verifier": {"name": "numeric", "params": {"lenient_fallback": True}},
                         "engine": {"name": "vllm", "params": {"enforce_eager": True}},
                         "benchmarks": [{"name": "a", "source": "arith", "verifier": {
                             "name": "numeric", "params": {"lenient_fallback": False}}},
                                        {"name": "b", "source": "arith", "verifier": "math"},
                                        {"name": "c", "source": "arith"}]}}


def test_ross_old_flat_keys_load_to_the_same_config_with_one_note_each():
    from gfcr.ross.config import RossConfig

    with pytest.warns(FutureWarning) as caught:
        old = RossConfig.model_validate(ROSS_OLD)
    notes = [str(w.message) for w in caught if "old config shape" in str(w.message)]
    assert [n.split(" is the old")[0] for n in notes] == [
        "window.reverify_params", "evaluate.verifier_params", "evaluate.engine_params",
        "evaluate.benchmarks[0].verifier_params", "evaluate.benchmarks[1].verifier_params"]
    assert "write evaluate.engine: {name: vllm, params: {enforce_eager: true}}" in notes[2]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        new = RossConfig.model_validate(ROSS_NEW)
    assert old == new
    assert old.evaluate.benchmarks[0].verifier.params == {"lenient_fallback": False}
    assert old.evaluate.benchmarks[2].verifier is None  # evaluate.verifier, name and params
    # a --set in the old spelling over a file in the new one: the old key wins
    over = RossConfig.model_validate(ROSS_NEW | {"evaluate": {**ROSS_NEW["evaluate"], "verifier_params": {
        "lenient_fallback": False}}})
    assert over.evaluate.verifier.params == {"lenient_fallback": False}
    with pytest.raises(ValidationError, match="window.reverify_params is set but window.reverify is not"):
        RossConfig.model_validate({"store": "s", "window": {"reverify_params": {"lenient_fallback": True}}})


def test_simulate_old_flat_keys_load_to_the_same_config_with_one_note_each():
    from gfcr.sim.simulator import SimConfig, StrategyConfig

    old = [{"name": "g", "selector": "greso", "selector_params": {"p_min": 0.01}, "control": "dynamic_sampling",
            "group_params": {"max_num_gen_batches": 3}},
           {"name": "r", "control": "repo", "buffer_params": {"strategy": "highest"}},
           {"name": "k", "group": "adaptive_k", "group_params": {"k_max": 6}}]
    new = [{"name": "g", "selector": {"name": "greso", "params": {"p_min": 0.01}}, "control": "dynamic_sampling",
            "group": {"name": "dynamic_sampling", "params": {"max_num_gen_batches": 3}}},
           {"name": "r", "control": "repo", "buffer": {"name": "repo", "params": {"strategy": "highest"}}},
           {"name": "k", "group": {"name": "adaptive_k", "params": {"k_max": 6}}}]
    with pytest.warns(FutureWarning) as caught:
        a = SimConfig(strategies=old)
    assert [str(w.message).split(" is the old")[0] for w in caught if "old config shape" in str(w.message)] == [
        "strategies[g].selector_params", "strategies[g].group_params", "strategies[r].buffer_params",
        "strategies[k].group_params"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        b = SimConfig(strategies=new)
    assert a == b
    # the control shorthand still fills the implied policy, the policy's own params over it
    group, params, buffer = b.strategies[0].resolved(train_prompts=10)
    assert (group, params["gen_prompts"], params["max_num_gen_batches"], buffer) == ("dynamic_sampling", 30, 3, None)
    assert b.strategies[1].resolved(10) == ("single", {}, "repo")
    with pytest.raises(ValidationError, match=r"strategies\[n\].buffer_params is set but strategies\[n\].buffer is not"):
        StrategyConfig(name="n", buffer_params={"strategy": "highest"})
    with pytest.raises(ValidationError, match="give either group .'single'. or control .'ar3po'., not both"):
        StrategyConfig(name="x", control="ar3po", group="single")


def test_gfcr_config_migrate_rewrites_ross_and_simulate_files(tmp_path):
    from typer.testing import CliRunner

    from gfcr.cli import app
    from gfcr.ross.config import RossConfig
    from gfcr.sim.simulator import load_config as load_sim

    ross = tmp_path / "ross.yaml"
    ross.write_text(yaml.safe_dump(ROSS_OLD))
    res = CliRunner().invoke(app, ["config", "migrate", str(ross)])
    assert res.exit_code == 0, res.output
    assert "moved: evaluate.engine_params" in res.stderr and "moved: window.reverify_params" in res.stderr
    printed = yaml.safe_load(res.stdout)
    assert printed["evaluate"]["engine"] == {"name": "vllm", "params": {"enforce_eager": True}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert RossConfig.model_validate(printed) == RossConfig.model_validate(ROSS_NEW)
    sim = tmp_path / "sim.yaml"
    sim.write_text(yaml.safe_dump({"n_prompts": 20, "strategies": [
        {"name": "e", "control": "exgrpo", "buffer_params": {"mix_ratio": 0.25}}]}))
    res = CliRunner().invoke(app, ["config", "migrate", str(sim), "--write"])
    assert res.exit_code == 0 and "1 key(s) moved" in res.stderr, res.output
    assert yaml.safe_load(sim.read_text())["strategies"][0]["buffer"] == {"name": "exgrpo", "params": {"mix_ratio": 0.25}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert load_sim(sim).strategies[0].buffer.params == {"mix_ratio": 0.25}


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
        t = load_config(None, {"generate.engine": {"name": "openai", "args": {"base_url": "u", "model": "m"}}})
    assert t.generate.engine.params == {"base_url": "u", "model": "m"}
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == [
        "generate.engine.args is the old config shape: write generate.engine.params (read that way for now; "
        "`gfcr config migrate FILE` rewrites a file)"]
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
