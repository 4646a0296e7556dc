"""Weight sync (gfcr.generate.sync): checked all-or-nothing loads, the copy and http syncs, gfcr serve's
weights route, and the vLLM engine's side of the contract (on a stand-in object graph; the real vLLM
run is tests/generate/test_vllm_engine.py, in .venv-vllm: make test-vllm)."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch

from gfcr.generate.engines import GenRequest, SamplingParams
from gfcr.generate.engines.hf import HFEngine, teacher_forced_logprobs
from gfcr.generate.sync import (
    WEIGHTS_ROUTE,
    HTTPSync,
    StateDictSync,
    WeightSyncError,
    check_state_dict,
    make_sync,
    read_safetensors,
    write_safetensors,
)
from gfcr.models import model_hash
from gfcr.serve import serve_in_thread
from gfcr.testing import tiny_model, tiny_tokenizer

MSGS = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture()
def tok():
    return tiny_tokenizer()


def _perturbed(tok, seed=1):
    """A policy with different weights from tiny_model(seed=0): what a trainer holds after an update."""
    return tiny_model(tok, seed=seed)


def _greedy(engine, n=10):
    ids = engine.encode_messages(MSGS)
    r = engine.generate([GenRequest(prompt_ids=ids, params=SamplingParams(temperature=1.0, max_tokens=n, seed=5))])
    return r[0][0]


def _same_params(a, b, atol=0.0):
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for k in sa:
        torch.testing.assert_close(sa[k].float(), sb[k].float(), atol=atol, rtol=0)


# --- checked loading ------------------------------------------------------------------------


def test_check_state_dict_names_every_problem_and_loads_nothing(tok):
    engine = HFEngine(tiny_model(tok, seed=0), tok, policy_version="v0")
    before = model_hash(engine.model)
    good = _perturbed(tok).state_dict()
    bad = dict(good)
    bad["model.extra.weight"] = torch.zeros(2)
    del bad["model.norm.weight"]
    k = "model.layers.0.mlp.up_proj.weight"
    bad[k] = torch.zeros(3, 3)
    with pytest.raises(WeightSyncError) as e:
        engine.load_weights(bad, policy_version="v1")
    msg = str(e.value)
    assert "model.extra.weight" in msg and "model.norm.weight" in msg and "up_proj" in msg and "nothing was loaded" in msg
    assert model_hash(engine.model) == before and engine.policy_version == "v0"


def test_tied_embedding_stored_once_loads_back(tok, tmp_path):
    src = _perturbed(tok)
    assert src.lm_head.weight.data_ptr() == src.model.embed_tokens.weight.data_ptr()  # tied
    write_safetensors(src, tmp_path / "w.safetensors")
    sd = read_safetensors(tmp_path / "w.safetensors")
    tied = {"lm_head.weight", "model.embed_tokens.weight"}
    assert len(tied & set(sd)) == 1  # safetensors keeps a tied tensor once
    dst = tiny_model(tok, seed=0)
    assert check_state_dict(dst, sd) == sorted(tied - set(sd))
    HFEngine(dst, tok).load_weights(sd)
    _same_params(dst, src)
    assert dst.lm_head.weight.data_ptr() == dst.model.embed_tokens.weight.data_ptr()  # still tied


def test_read_safetensors_refuses_pickles_missing_and_corrupt_files(tmp_path):
    p = tmp_path / "w.pt"
    torch.save({"a": torch.zeros(1)}, p)
    with pytest.raises(WeightSyncError, match="never loaded"):
        read_safetensors(p)
    with pytest.raises(WeightSyncError, match="does not exist"):
        read_safetensors(tmp_path / "nope.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(WeightSyncError, match="not a readable safetensors"):
        read_safetensors(tmp_path / "bad.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightSyncError, match="no \\*.safetensors"):
        read_safetensors(tmp_path / "empty")


# --- copy sync --------------------------------------------------------------------------------


def test_copy_sync_makes_a_bf16_engine_sample_like_the_trainer(tok):
    trainer = _perturbed(tok)
    copy = HFEngine(tiny_model(tok, seed=0), tok, policy_version="old", dtype="bfloat16")
    copy.model.to(torch.bfloat16)
    rep = StateDictSync(copy).push(trainer, "s1-abc")
    assert rep.policy_version == copy.policy_version == "s1-abc" and rep.bytes > 0
    assert next(copy.model.parameters()).dtype == torch.bfloat16  # the copy keeps its own dtype
    _same_params(copy.model, trainer.to(torch.bfloat16).float(), atol=0)
    trainer.float()
    r = _greedy(copy)
    ref = teacher_forced_logprobs(trainer, np.concatenate([r.prompt_ids, r.token_ids]), len(r.prompt_ids), 1.0)
    np.testing.assert_allclose(r.logprobs, ref, atol=0.1)  # bf16 sampler vs fp32 trainer


def test_make_sync_rejects_unknown_and_mismatched_engines(tok):
    eng = HFEngine(tiny_model(tok), tok)
    with pytest.raises(WeightSyncError, match="unknown weight sync"):
        make_sync("nccl", eng)
    with pytest.raises(WeightSyncError, match="training module itself"):
        make_sync("in_place", eng).push(tiny_model(tok), "v")
    with pytest.raises(WeightSyncError, match="openai engine"):
        make_sync("http", eng, folder="x")


# --- http sync through gfcr serve -----------------------------------------------------------------


def test_http_sync_swaps_the_served_weights(tok, tmp_path):
    from gfcr.generate.engines.openai import OpenAIEngine

    served = HFEngine(tiny_model(tok, seed=0), tok, policy_version="base")
    trainer = _perturbed(tok)
    with serve_in_thread(served, model_name="tiny", allow_weight_updates=True) as url:
        client = OpenAIEngine(url, "tiny", tokenizer=tok, policy_version="unsynced")
        rep = HTTPSync(client, tmp_path / "sync").push(trainer, "s1-xyz")
        assert rep.method == "http" and rep.bytes > 0
        assert client.policy_version == "s1-xyz"
        assert httpx.get(f"{url}/models").json()["data"][0]["policy_version"] == "s1-xyz"
        _same_params(served.model, trainer)
        ids = served.encode_messages(MSGS)
        got = client.generate([GenRequest(prompt_ids=ids, params=SamplingParams(temperature=1.0, max_tokens=8, seed=2))])
        r = got[0][0]
        ref = teacher_forced_logprobs(trainer, np.concatenate([ids, r.token_ids]), len(ids), 1.0)
        np.testing.assert_allclose(r.logprobs, ref, atol=1e-4)  # the server now samples from the trainer's weights


def test_vllm_reload_sync_against_a_server_without_vllms_dev_routes_fails_clearly(tok, tmp_path):
    """``vllm_reload`` needs vLLM's dev-mode routes; gfcr serve has none: one clear error, version kept.
    (Against a real vLLM server: tests/generate/test_vllm_engine.py.)"""
    from gfcr.generate.engines.openai import OpenAIEngine

    served = HFEngine(tiny_model(tok, seed=0), tok, policy_version="base")
    with serve_in_thread(served, model_name="tiny") as url:
        client = OpenAIEngine(url, "tiny", tokenizer=tok, policy_version="unsynced")
        with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
            make_sync("vllm_reload", client, folder=tmp_path / "sync").push(_perturbed(tok), "s1-xyz")
        assert client.policy_version == "unsynced"
    with pytest.raises(WeightSyncError, match="openai engine"):
        make_sync("vllm_reload", served, folder=tmp_path / "sync")


def test_weights_route_is_off_by_default_and_guarded(tok, tmp_path):
    from gfcr.generate.engines.openai import OpenAIEngine

    served = HFEngine(tiny_model(tok, seed=0), tok, policy_version="base")
    before = model_hash(served.model)
    trainer = _perturbed(tok)
    with serve_in_thread(served, model_name="tiny") as url:
        with pytest.raises(WeightSyncError, match="--allow-weight-updates"):
            HTTPSync(OpenAIEngine(url, "tiny"), tmp_path / "a").push(trainer, "v1")
    with serve_in_thread(served, model_name="tiny", allow_weight_updates=True, admin_token="s3cret") as url:
        root = url.removesuffix("/v1")
        with pytest.raises(WeightSyncError, match="HTTP 401"):
            HTTPSync(OpenAIEngine(url, "tiny"), tmp_path / "b", admin_token="wrong").push(trainer, "v1")
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(b"junk" * 10)
        r = httpx.post(root + WEIGHTS_ROUTE, json={"path": str(bad)}, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 400 and "not a readable safetensors" in r.json()["error"]["message"]
        other = tiny_model(tiny_tokenizer(vocab_size=300))  # another vocabulary: wrong shapes
        write_safetensors(other, tmp_path / "other.safetensors")
        r = httpx.post(root + WEIGHTS_ROUTE, json={"path": str(tmp_path / "other.safetensors")},
                       headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 400 and "wrong shapes" in r.json()["error"]["message"]
        assert model_hash(served.model) == before and served.policy_version == "base"  # nothing changed
        rep = HTTPSync(OpenAIEngine(url, "tiny"), tmp_path / "c", admin_token="s3cret").push(trainer, "v2")
        assert rep.policy_version == "v2" and model_hash(served.model) == model_hash(trainer)


# --- the vllm engine's side (stand-in object graph) -------------------------------------------------


class _StandInVLLMModel(torch.nn.Module):
    """Mimics what vLLM's model classes offer RL frameworks: load_weights(iterable of (HF name, tensor))."""

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model
        self.calls = 0

    def load_weights(self, weights):
        self.calls += 1
        sd = dict(weights)
        self.hf.load_state_dict(sd, strict=False)
        return set(sd)


def _stand_in_vllm(hf_model, nested_worker: bool):
    model = _StandInVLLMModel(hf_model)
    runner = SimpleNamespace(model=model)
    worker = SimpleNamespace(worker=SimpleNamespace(model_runner=runner)) if nested_worker else SimpleNamespace(model_runner=runner)
    resets = []
    llm = SimpleNamespace(llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker)),
                          reset_prefix_cache=lambda: resets.append(1))
    return llm, model, resets


@pytest.mark.parametrize("nested", [False, True])
def test_vllm_engine_load_weights_reaches_the_in_process_model(tok, nested):
    from gfcr.generate.engines.vllm import VLLMEngine

    target = tiny_model(tok, seed=0)
    llm, model, resets = _stand_in_vllm(target, nested)
    eng = VLLMEngine.__new__(VLLMEngine)  # no vllm here: the object graph stands in for vllm.LLM
    eng.llm, eng.policy_version = llm, "old"
    trainer = _perturbed(tok)
    StateDictSync(eng).push(trainer, "s3-abc")
    assert model.calls == 1 and resets == [1] and eng.policy_version == "s3-abc"
    _same_params(target, trainer)


def test_vllm_engine_without_an_in_process_model_says_how_to_fix_it(tok):
    from gfcr.generate.engines.vllm import VLLMEngine

    eng = VLLMEngine.__new__(VLLMEngine)
    eng.llm, eng.policy_version = SimpleNamespace(llm_engine=SimpleNamespace(model_executor=None)), "old"
    with pytest.raises(WeightSyncError, match="weight_sync=True"):
        eng.load_weights(tiny_model(tok).state_dict(), "new")
    assert eng.policy_version == "old"


def test_cli_refuses_weight_updates_on_a_public_address_without_a_token(monkeypatch):
    from typer.testing import CliRunner

    import gfcr.serve as serve_mod
    from gfcr.cli import app

    seen = {}
    monkeypatch.setattr(serve_mod, "serve", lambda model, **kw: seen.update(kw))  # nothing binds
    monkeypatch.delenv("GFCR_SERVE_ADMIN_TOKEN", raising=False)
    r = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--allow-weight-updates"])
    assert r.exit_code == 2 and "--admin-token" in r.output and not seen
    r = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--allow-weight-updates"],
                           env={"GFCR_SERVE_ADMIN_TOKEN": "t0k"})
    assert r.exit_code == 0, r.output
    assert seen["allow_weight_updates"] is True and seen["admin_token"] == "t0k" and seen["host"] == "0.0.0.0"
    seen.clear()
    r = CliRunner().invoke(app, ["serve", "--allow-weight-updates"])  # loopback: no token needed
    assert r.exit_code == 0 and seen["host"] == "127.0.0.1" and seen["admin_token"] is None
