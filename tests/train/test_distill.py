"""On-policy distillation: the reverse-KL maths on hand-worked distributions, the sampled-token
advantage's expected gradient, teachers (same model → zero KL), per-task choice, tokenizer rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gfcr.filters.advantages import make_estimator, with_token_terms
from gfcr.filters.teacher import TeacherKL, discounted_future_sum, distill_token_advantages
from gfcr.generate.engines.base import GenRequest, SamplingParams
from gfcr.records import Rollout
from gfcr.testing import tiny_model, tiny_tokenizer
from gfcr.train.distill import (
    HFTeacher,
    TeacherError,
    TeacherSet,
    check_same_tokenizer,
    reverse_kl,
    score_rollouts,
)
from gfcr.train.losses import policy_gradient_loss


def test_reverse_kl_hand_worked_value_and_gradient():
    z = torch.log(torch.tensor([0.5, 0.5])).requires_grad_(True)
    q = torch.log(torch.tensor([0.25, 0.75]))
    kl = reverse_kl(z, q)
    expected = 0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)
    assert kl.item() == pytest.approx(expected, abs=1e-6)
    assert kl.item() == pytest.approx(0.1438, abs=1e-4)
    kl.backward()
    assert z.grad.tolist() == pytest.approx([0.2747, -0.2747], abs=1e-4)


def test_reverse_kl_zero_for_same_distribution_and_positive_otherwise():
    torch.manual_seed(0)
    a = torch.randn(3, 5, 11)
    assert torch.allclose(reverse_kl(a, a), torch.zeros(3, 5), atol=1e-6)
    assert bool((reverse_kl(a, torch.randn(3, 5, 11)) > 0).all())


def test_sampled_token_advantage_expected_gradient_is_minus_reverse_kl_gradient():
    """Enumerate every token of a 4-token vocabulary, weight each one-token 'rollout' by p(x):
    the policy-gradient loss with A = −(log p − log q) has the gradient of KL(p‖q)."""
    torch.manual_seed(1)
    z = torch.randn(4, requires_grad=True)
    q_logits = torch.randn(4)
    kl = reverse_kl(z, q_logits)
    (g_exact,) = torch.autograd.grad(kl, z)

    logp_all = torch.log_softmax(z, -1)
    q_all = torch.log_softmax(q_logits, -1)
    p = logp_all.exp().detach()
    total = torch.zeros(())
    for x in range(4):
        role = np.array([0, 1])
        adv = distill_token_advantages(np.array([0.0, logp_all[x].item()]), np.array([q_all[x].item()]), role)
        logp = torch.stack([torch.zeros(()), logp_all[x]])[None]
        out = policy_gradient_loss(logp, logp.detach(), torch.from_numpy(adv)[None], torch.tensor([[0, 1]]))
        total = total + p[x] * out.loss
    (g_pg,) = torch.autograd.grad(total, z)
    assert torch.allclose(g_pg, g_exact, atol=1e-6)


def test_distill_token_advantages_hand_worked():
    adv = distill_token_advantages(np.log([1.0, 0.5, 0.5]), np.log([0.25, 0.5]), np.array([0, 1, 1]))
    assert adv.tolist() == pytest.approx([0.0, -math.log(2), 0.0], abs=1e-6)
    assert discounted_future_sum(np.array([1.0, 1.0, 1.0]), 0.5).tolist() == [1.75, 1.5, 1.0]
    disc = distill_token_advantages(np.log([1.0, 0.5, 0.5]), np.log([0.25, 0.5]), np.array([0, 1, 1]), discount=1.0)
    assert disc.tolist() == pytest.approx([0.0, -math.log(2), 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="one per generated token"):
        distill_token_advantages(np.zeros(3), np.zeros(1), np.array([0, 1, 1]))


def test_teacher_term_joins_the_group_advantage_with_rl_coef():
    """Two rollouts, rewards [1, 0] → GRPO ±0.7071; teacher term on the generated tokens; rl_coef 0.5."""
    role = [0, 1, 1]
    a = Rollout(run_id="r", prompt_id="p", token_ids=[1, 2, 3], token_role=role, logprobs=np.log([1.0, 0.5, 0.25]),
                reward=1.0, meta={"teacher": {"name": "t", "logprobs": np.log([0.25, 0.25]).tolist()}})
    b = Rollout(run_id="r", prompt_id="p", token_ids=[1, 4, 5], token_role=role, logprobs=np.log([1.0, 0.5, 0.5]),
                reward=0.0, meta={"teacher": {"name": "t", "logprobs": np.log([0.5, 0.5]).tolist()}})
    est = with_token_terms(make_estimator("grpo"), [(2.0, TeacherKL())], base_coef=0.5)
    got_a, got_b = est([a, b])
    g = 1 / math.sqrt(2)  # (1 - 0.5) / unbiased std 0.7071
    assert got_a[1:].tolist() == pytest.approx([0.5 * g - 2 * math.log(2), 0.5 * g], abs=1e-5)
    assert got_b[1:].tolist() == pytest.approx([-0.5 * g, -0.5 * g], abs=1e-5)
    pure = with_token_terms(make_estimator("grpo"), [(1.0, TeacherKL())], base_coef=0.0)([a, b])
    assert pure[1][1:].tolist() == pytest.approx([0.0, 0.0], abs=1e-6)


def test_gfcr_train_with_a_teacher_scores_stores_and_refuses_a_foreign_tokenizer(tiny_dir, tmp_path):
    from gfcr.store import RolloutStore
    from gfcr.testing import save_tiny
    from gfcr.train.config import load_config
    from gfcr.train.loop import TrainError, train

    teacher_dir = save_tiny(str(tmp_path / "teacher"), seed=7)
    base = {"model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 2, "tensorboard": False,
            "tasks": [{"name": "arith", "n_train": 2, "n_eval": 0, "params": {"level": 1}}],
            "generate.topology.params.k": 2, "generate.prompts_per_step": 2, "generate.max_tokens": 4, "generate.temperature": 1.0,
            "signals.entropy": False,
            "distill": {"teachers": [{"name": "t7", "model": teacher_dir}], "rl_coef": 0.0, "coef": 1.0}}
    res = train(load_config(None, base), run_dir=tmp_path / "r", progress=False)
    assert res.steps_done == 2
    rs = RolloutStore.open(tmp_path / "r" / "store").rollouts()
    assert rs and all(r.meta["teacher"]["name"] == "t7" for r in rs)
    teacher = HFTeacher(teacher_dir, name="t7")
    for r in rs[:2]:
        P = int((r.token_role == 0).sum())
        want = teacher.score(r.token_ids[:P].tolist(), r.token_ids[P:].tolist())
        assert np.allclose(r.meta["teacher"]["logprobs"], want, atol=1e-4)
        assert r.signals["teacher_kl"] == pytest.approx(float(np.mean(r.logprobs[P:] - want)), abs=1e-4)
    import json as _json
    rows = [_json.loads(x) for x in res.metrics_path.read_text().splitlines()]
    assert all("seconds/teacher" in row and np.isfinite(row["teacher_kl"]) for row in rows)

    odd = tiny_tokenizer()
    odd.add_tokens(["<extra>"])
    odd_dir = tmp_path / "odd"
    from gfcr.testing import tiny_model as _tm
    _tm(odd).save_pretrained(odd_dir)
    odd.save_pretrained(odd_dir)
    bad = base | {"distill": {"teachers": [{"name": "odd", "model": str(odd_dir)}]}}
    with pytest.raises((TeacherError, TrainError), match="teacher 'odd' has a vocabulary"):
        train(load_config(None, bad), run_dir=tmp_path / "r2", progress=False)


def _sampled_rollouts(model, tok, n=4, task="arith"):
    from gfcr.generate.engines.hf import HFEngine

    eng = HFEngine(model, tokenizer=tok, max_batch=8)
    req = GenRequest(messages=[{"role": "user", "content": "What is 12 + 7?"}],
                     params=SamplingParams(n=n, temperature=1.0, max_tokens=12, seed=3))
    out = []
    for i, g in enumerate(eng.generate([req])[0]):
        ids = np.concatenate([g.prompt_ids, g.token_ids])
        role = np.array([0] * len(g.prompt_ids) + [1] * len(g.token_ids))
        lp = np.concatenate([np.zeros(len(g.prompt_ids), np.float32), g.logprobs])
        out.append(Rollout(run_id="r", prompt_id="p", token_ids=ids, token_role=role, logprobs=lp, task=task, sample_index=i))
    return out


def test_same_model_teacher_gives_zero_kl_and_zero_distill_advantage():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    rs = _sampled_rollouts(model, tok)
    score_rollouts(rs, TeacherSet({}, default=HFTeacher(model, tok, name="self")))
    for r in rs:
        assert r.meta["teacher"]["name"] == "self"
        assert len(r.meta["teacher"]["logprobs"]) == r.n_generated
        assert abs(r.signals["teacher_kl"]) < 1e-4
    for a in with_token_terms(lambda g: [0.0] * len(g), [(1.0, TeacherKL())], base_coef=0.0)(rs):
        assert np.abs(a).max() < 1e-4


def test_other_teacher_scores_match_a_teacher_forced_pass_and_multi_teacher_by_task():
    tok = tiny_tokenizer()
    student, t_math, t_code = tiny_model(tok, seed=0), tiny_model(tok, seed=1), tiny_model(tok, seed=2)
    rs = _sampled_rollouts(student, tok, n=2, task="math") + _sampled_rollouts(student, tok, n=2, task="code")
    teachers = TeacherSet({"math": HFTeacher(t_math, tok, name="m"), "code": HFTeacher(t_code, tok, name="c")})
    score_rollouts(rs, teachers)
    assert [r.meta["teacher"]["name"] for r in rs] == ["m", "m", "c", "c"]
    from gfcr.generate.engines.hf import teacher_forced_logprobs

    for r, m in zip(rs, [t_math, t_math, t_code, t_code], strict=True):
        P = int((r.token_role == 0).sum())
        ref = teacher_forced_logprobs(m, r.token_ids, P)
        assert np.allclose(r.meta["teacher"]["logprobs"], ref, atol=1e-4)
        assert r.signals["teacher_kl"] != 0.0
    with pytest.raises(TeacherError, match="no teacher for task 'chat'"):
        teachers.for_task("chat")


def test_tokenizer_mismatch_is_refused():
    a = tiny_tokenizer()
    check_same_tokenizer(a, tiny_tokenizer())
    b = tiny_tokenizer()
    b.add_tokens(["<tool_call>"])
    with pytest.raises(TeacherError, match="teacher 'big' has a vocabulary of"):
        check_same_tokenizer(a, b, "big")
    c = tiny_tokenizer()
    c.pad_token = "<|im_start|>"
    with pytest.raises(TeacherError, match="special tokens"):
        check_same_tokenizer(a, c, "padded")


def test_distill_config_rules_and_build_teachers(tmp_path):
    from pydantic import ValidationError

    from gfcr.testing import save_tiny
    from gfcr.train.distill import DistillConfig, build_teachers

    with pytest.raises(ValidationError, match="task 'math' has two teachers"):
        DistillConfig(teachers=[{"name": "a", "tasks": ["math"]}, {"name": "b", "tasks": ["math"]}])
    with pytest.raises(ValidationError, match="needs base_url"):
        DistillConfig(teachers=[{"name": "a", "engine": "openai"}])
    with pytest.raises(ValidationError, match="at most one teacher may have no tasks"):
        DistillConfig(teachers=[{"name": "a"}, {"name": "b"}])
    d = save_tiny(str(tmp_path / "t"), seed=1)
    cfg = DistillConfig(teachers=[{"name": "t", "model": d, "tasks": ["arith"]}, {"name": "u", "model": d}])
    ts = build_teachers(cfg, tiny_tokenizer(), temperature=0.7, top_p=0.9)
    assert ts.for_task("arith").name == "t" and ts.for_task("other").name == "u"
    assert (ts.for_task("arith").temperature, ts.for_task("arith").top_p) == (1.0, 1.0)  # the teacher itself
    keep = DistillConfig(teachers=[{"name": "t", "model": d, "temperature": "student"}])
    t = build_teachers(keep, tiny_tokenizer(), temperature=0.7, top_p=0.9).for_task("arith")
    assert (t.temperature, t.top_p) == (0.7, 0.9)  # the earlier rule, by name
    with pytest.raises(ValidationError, match="temperature must be in"):
        DistillConfig(teachers=[{"name": "a", "temperature": 0.0}])
    other = tiny_tokenizer()
    other.add_tokens(["<x>"])
    with pytest.raises(TeacherError, match="teacher 't' has a vocabulary of"):
        build_teachers(DistillConfig(teachers=[{"name": "t", "model": d}]), other)


def test_openai_teacher_through_gfcr_serve_equals_in_process_teacher():
    """A served teacher (prompt log-probs via echo) scores exactly like the same model in process."""
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.serve import serve_in_thread
    from gfcr.train.distill import OpenAITeacher

    tok = tiny_tokenizer()
    student, teacher_model = tiny_model(tok, seed=0), tiny_model(tok, seed=4)
    rs = _sampled_rollouts(student, tok, n=2)
    score_rollouts(rs, TeacherSet({}, HFTeacher(teacher_model, tok, name="t")))
    local = [list(r.meta["teacher"]["logprobs"]) for r in rs]
    with serve_in_thread(HFEngine(teacher_model, tokenizer=tok), model_name="teacher") as url:
        served = OpenAITeacher(url, model="teacher", name="t")
        score_rollouts(rs, TeacherSet({}, served))
        served.close()
    for r, want in zip(rs, local, strict=True):
        assert np.allclose(r.meta["teacher"]["logprobs"], want, atol=1e-4)


def test_the_loop_scores_the_teacher_at_temperature_1_not_the_students(tiny_dir, tmp_path):
    """The student samples at T = 0.7; the loop's teacher stage stores log q at T = 1 (log_softmax of the
    teacher's raw logits), not at 0.7: the target is the teacher's own distribution."""
    from transformers import AutoModelForCausalLM

    from gfcr.testing import save_tiny
    from gfcr.train.config import load_config
    from gfcr.train.loop import TrainingRun, prepare_run

    teacher_dir = save_tiny(str(tmp_path / "teacher"), seed=7)
    base = {"model": tiny_dir, "output_dir": str(tmp_path / "runs"), "steps": 1, "tensorboard": False,
            "tasks": [{"name": "arith", "n_train": 1, "n_eval": 0, "params": {"level": 1}}],
            "generate.topology.params.k": 2, "generate.prompts_per_step": 1, "generate.max_tokens": 4, "generate.temperature": 0.7,
            "signals.entropy": False, "distill": {"teachers": [{"name": "t7", "model": teacher_dir}]}}
    m = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()

    def log_q(r, temp):
        with torch.no_grad():
            logits = m(torch.as_tensor(r.token_ids[None].astype(np.int64))).logits[0] / temp
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.as_tensor(r.token_ids[1:, None].astype(np.int64)))[:, 0]
        P = int((r.token_role == 0).sum())
        return lp[P - 1:].numpy()

    for temp, want_t in ((None, 1.0), ("student", 0.7)):
        over = base if temp is None else base | {"distill": {"teachers": [{"name": "t7", "model": teacher_dir,
                                                                           "temperature": temp}]}}
        cfg = load_config(None, over)
        d, _ = prepare_run(cfg, run_dir=tmp_path / f"r{want_t}")
        t = TrainingRun(cfg, d, False, progress=False)
        t.setup()
        t._end = 1
        t.step(0)
        rs = t.store.rollouts()
        assert rs and all(r.sampling.get("temperature", 0.7) == 0.7 for r in rs)
        for r in rs:
            got = np.asarray(r.meta["teacher"]["logprobs"])
            assert np.allclose(got, log_q(r, want_t), atol=1e-4)
            assert not np.allclose(got, log_q(r, 1.7 - want_t), atol=1e-3)  # and not the other temperature
        t.close()
