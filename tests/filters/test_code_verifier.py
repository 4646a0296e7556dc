"""Code verifier: CodeRL/RLTF reward on correct / wrong / syntax / runtime / timeout programs."""

from __future__ import annotations

import pytest

from gfcr.filters.verifiers import CodeVerifier, coderl_reward, extract_code, normalize_tests
from gfcr.sandbox import (
    SandboxConfig,
    SandboxUnavailable,
    bwrap_available,
    resolve_isolation,
    unshare_available,
)

needs_iso = pytest.mark.skipif(not (bwrap_available() or unshare_available()),
                               reason="needs bubblewrap, or root and `unshare` (isolation)")

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]


def test_coderl_reward_numbers():
    assert coderl_reward("compile_error") == -1.0
    assert coderl_reward("runtime_error") == -0.6
    assert coderl_reward("failed", 0.0) == -0.3
    assert coderl_reward("failed", 0.5) == pytest.approx(0.35)  # -0.3 + 1.3 * 0.5
    assert coderl_reward("failed", 0.75) == pytest.approx(0.675)
    assert coderl_reward("passed", 1.0) == 1.0
    with pytest.raises(ValueError, match="unknown code status"):
        coderl_reward("weird")


def test_normalize_tests_shapes():
    assert normalize_tests(["assert 1"]) == ("assert", ["assert 1"])
    assert normalize_tests('{"asserts": ["assert 1"]}') == ("assert", ["assert 1"])
    assert normalize_tests({"inputs": ["1"], "outputs": ["2"]}) == ("stdio", [{"input": "1", "output": "2"}])
    with pytest.raises(ValueError, match="code tests must be"):
        normalize_tests({"foo": 1})
    assert extract_code("text\n```python\nx = 1\n```\nmore") == "x = 1\n"


@pytest.fixture(scope="module")
def codev():
    return CodeVerifier(timeout_per_test_s=1.0, sandbox=SandboxConfig(cpu_s=3, wall_s=15))


@needs_iso
def test_correct(codev):
    v = codev.verify("```python\ndef add(a, b):\n    return a + b\n```", tests=TESTS)
    assert v.passed is True and v.score == 1.0 and v.evidence["error_type"] is None
    assert v.evidence["results"] == ["pass"] * 4 and v.evidence["isolation"] in ("bwrap", "unshare")


@needs_iso
def test_wrong_partial(codev):
    v = codev.verify("def add(a, b):\n    return 3\n", tests=TESTS)
    assert v.passed is False and v.evidence["status"] == "failed"
    assert v.evidence["pass_ratio"] == 0.25 and v.score == pytest.approx(-0.3 + 1.3 * 0.25)
    assert v.evidence["first_failure"]["index"] == 1 and "add(-1, 1)" in v.evidence["first_failure"]["test"]


@needs_iso
def test_syntax_error(codev):
    v = codev.verify("def add(a, b)\n    return a + b\n", tests=TESTS)
    assert v.score == -1.0 and v.evidence["error_type"] == "compile_error" and "SyntaxError" in v.evidence["error"]


@needs_iso
def test_runtime_error(codev):
    v = codev.verify("def add(a, b):\n    return a / 0\n", tests=TESTS)
    assert v.score == -0.6 and v.evidence["error_type"] == "runtime_error"
    assert "ZeroDivisionError" in v.evidence["first_failure"]["error"]


@needs_iso
def test_timeout(codev):
    v = codev.verify("def add(a, b):\n    while True:\n        pass\n", tests=TESTS[:1])
    assert v.passed is False and v.score == -0.6
    assert v.evidence["results"] == ["timeout"] and "timed out" in v.evidence["first_failure"]["error"]


@needs_iso
def test_stdio_cases(codev):
    tests = {"cases": [{"input": "2 3\n", "output": "5\n"}, {"input": "10 5", "output": "15"}, {"input": "1 1", "output": "3"}]}
    v = codev.verify("a, b = map(int, input().split())\nprint(a + b)\n", tests=tests)
    assert v.evidence["results"] == ["pass", "pass", "fail"]
    assert v.score == pytest.approx(-0.3 + 1.3 * 2 / 3)
    ff = v.evidence["first_failure"]
    assert ff["expected"] == "3" and ff["got"].strip() == "2"


def test_no_tests_is_unjudged(codev):
    v = codev.verify("print(1)", tests=None)
    assert v.passed is None and "needs `tests`" in v.evidence["error"]


def test_isolation_refused_without_permission(monkeypatch):
    import gfcr.sandbox.process as sb

    monkeypatch.setattr(sb, "unshare_available", lambda: False)
    monkeypatch.setattr(sb, "bwrap_status", lambda: (False, "bubblewrap is not installed"))
    with pytest.raises(SandboxUnavailable, match="require_isolation=False"):
        resolve_isolation(SandboxConfig())
    assert resolve_isolation(SandboxConfig(require_isolation=False)) == "none"
    r = sb.run_python("print(6 * 7)", config=SandboxConfig(require_isolation=False))
    assert r.stdout.strip() == "42" and r.isolation == "none"


def test_auto_prefers_bwrap_then_unshare(monkeypatch):
    import gfcr.sandbox.process as sb

    monkeypatch.setattr(sb, "unshare_available", lambda: True)
    monkeypatch.setattr(sb, "bwrap_status", lambda: (True, "ok"))
    assert resolve_isolation(SandboxConfig()) == "bwrap"
    assert resolve_isolation(SandboxConfig(isolation="unshare")) == "unshare"
    monkeypatch.setattr(sb, "bwrap_status", lambda: (False, "bwrap: No permissions to create new namespace"))
    assert resolve_isolation(SandboxConfig()) == "unshare"
    with pytest.raises(SandboxUnavailable, match="No permissions to create new namespace"):
        resolve_isolation(SandboxConfig(isolation="bwrap"))
    monkeypatch.setattr(sb, "unshare_available", lambda: False)
    with pytest.raises(SandboxUnavailable, match="Install bubblewrap or run as root"):
        resolve_isolation(SandboxConfig())
