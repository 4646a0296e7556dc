"""bench/opd_bench.py --make-teacher: the gold-SFT teacher's rows supervise exactly the gold solution."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("opd_bench", Path(__file__).parents[1] / "bench" / "opd_bench.py")
ob = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ob)


def test_gold_rows_supervise_the_gold_answer_and_its_stop_only(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    prompts = ob.gold_prompts(n=6, n_one_digit=2)
    assert len(prompts) == 8 and {p.split for p in prompts} == {"train"}  # never the held-out split
    rows = ob.gold_rows(tok, prompts)
    assert len(rows) == 8
    for p, r in zip(prompts, rows, strict=True):
        target = [t for t, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m]
        assert tok.decode(target) == f"{p.meta['expression']} = {p.answer}\nAnswer: {p.answer}<|im_end|>"
        context = tok.decode(r["input_ids"][: r["loss_mask"].index(1)])
        assert p.messages[-1].content in context and f"Answer: {p.answer}" not in context  # only the question


def test_make_gold_teacher_saves_a_loadable_model(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    res = ob.make_gold_teacher(str(tmp_path / "t"), n=4, n_one_digit=0, epochs=1, model=tiny_dir, batch_size=2)
    assert res["rows"] == 4 and res["steps"] == 2
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "t")) is not None
    assert (tmp_path / "t" / "sft.json").exists()
