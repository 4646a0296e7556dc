"""Each detector fires on a constructed pathological run and stays quiet on a healthy one."""

from __future__ import annotations

import pytest
from diag_helpers import PATHOLOGIES, simulate_run, simulate_shaped_run
from pydantic import ValidationError

from gfcr.diagnose.detectors import DETECTORS, DetectorConfig, detect
from gfcr.diagnose.metrics import step_metrics
from gfcr.store import RolloutStore


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    store = RolloutStore.open(tmp_path_factory.mktemp("d") / "store", create=True)
    rows = []
    for kind in ("healthy", *PATHOLOGIES):
        rows += simulate_run(kind)
    rows += simulate_shaped_run("code") + simulate_shaped_run("length")
    store.append(rows)
    metrics = step_metrics(store)
    return metrics, detect(metrics)


def test_every_pathology_has_a_detector():
    assert set(DETECTORS) == set(PATHOLOGIES)


def test_healthy_run_is_quiet(findings):
    _, fs = findings
    assert [f.detector for f in fs if f.run_id == "healthy"] == []


@pytest.mark.parametrize("run", ["shaped_code", "shaped_length"])
def test_healthy_shaped_runs_are_quiet(findings, run):
    """Partial credit (RLTF), format bonus, overlong and ShorterBetter length shaping are designed:
    no detector may fire on them, and the metrics that used to misread them stay low."""
    metrics, fs = findings
    assert [f.detector for f in fs if f.run_id == run] == []
    rows = [r for r in metrics.to_pylist() if r["run_id"] == run]
    assert all(r["hack_rate"] == 0.0 and r["adv_disagreement"] == 0.0 and r["low_std_share"] == 0.0 for r in rows)


def test_shaped_code_run_is_the_case_the_sign_rules_misread():
    """Guard that the quiet shaped run really is the false-alarm case: under the earlier rules
    (failing with reward >= 0.5 = hack; advantage sign against the verdict = noise) it fires both."""
    fresh = [r for r in simulate_shaped_run("code") if not r.signals.get("replayed")]
    hack = sum(r.verified is False and r.reward >= 0.5 for r in fresh) / len(fresh)
    sign = sum((r.signals["advantage"] > 0) != bool(r.verified) for r in fresh) / len(fresh)
    cfg = DetectorConfig()
    assert hack >= cfg.reward_hacking.max_disagreement and sign >= cfg.signal_noise.max_adv_disagreement


@pytest.mark.parametrize("kind", PATHOLOGIES)
def test_detector_fires_on_its_pathology(findings, kind):
    _, fs = findings
    hits = [f for f in fs if f.run_id == kind and f.detector == kind]
    assert len(hits) == 1, [f.detector for f in fs if f.run_id == kind]
    f = hits[0]
    assert f.module and len(f.levers) >= 2 and f.message
    assert f.severity in ("warning", "critical")


def test_expected_levers_are_named(findings):
    _, fs = findings
    levers = {f.detector: " ".join(f.levers) for f in fs}
    assert "GRESO" in levers["compute_waste"] and "VADE" in levers["compute_waste"]
    assert "AR3PO" in levers["zero_reward"]
    assert "ShorterBetter" in levers["length_inflation"] and "GFPO" in levers["length_inflation"]
    assert "overlong" in levers["length_inflation"]
    for name in ("max_tokens", "early exit", "partial rollouts", "ReSpec", "EARL", "Seer"):
        assert name in levers["long_tail"]


def test_thresholds_come_from_config(findings):
    metrics, _ = findings
    lax = DetectorConfig.model_validate({"compute_waste": {"max_waste": 0.9}, "entropy_collapse": {"enabled": False}})
    fs = detect(metrics, lax)
    assert not [f for f in fs if f.run_id == f.detector and f.detector in ("compute_waste", "entropy_collapse")]
    assert [f for f in fs if f.run_id == "zero_reward" and f.detector == "compute_waste"]  # 100% waste there
    strict = DetectorConfig.model_validate({"length_inflation": {"max_growth": 0.01}})
    # the healthy run's lengths are flat: even a strict growth threshold stays quiet there
    assert not [f for f in detect(metrics, strict) if f.run_id == "healthy" and f.detector == "length_inflation"]


def test_config_rejects_unknown_keys_and_bad_bounds():
    with pytest.raises(ValidationError):
        DetectorConfig.model_validate({"compute_waste": {"max_wast": 0.5}})
    with pytest.raises(ValidationError):
        DetectorConfig.model_validate({"reward_hacking": {"max_disagreement": 2.0}})


def test_short_runs_do_not_judge_trends(tmp_path):
    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append([r for r in simulate_run("entropy_collapse", steps=2)])
    fs = detect(step_metrics(store))
    assert not [f for f in fs if f.detector in ("entropy_collapse", "length_inflation")]
