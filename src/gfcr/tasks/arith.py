"""``arith``: a procedural arithmetic task generator (own code; seeded; disjoint splits).

Each problem is an integer expression over ``terms`` operands of ``digits`` digits with operators
from ``ops``, evaluated left to right with the usual precedence (``*`` before ``+``/``-``; Python
semantics, integers only). The prompt asks for step-by-step work and a final ``Answer: N`` line;
the gold answer is the integer value as a string. The stated answer format goes into
``meta["answer_format"] = "answer_line"``: verifiers read the last ``Answer:`` line and nothing
else unless their config enables the lenient fallback.

Splits never overlap: a problem's split is a fixed function of its canonical expression
(``blake2b(expr) mod 10 == 0`` → ``test``, else ``train``), and the generator rejects expressions
of the other split. So ``train`` and ``test`` sets drawn with any seeds are disjoint.
"""

from __future__ import annotations

import hashlib
import random

from gfcr.records import Message, Prompt
from gfcr.tasks import ListSource, PoolTooSmall

#: difficulty level -> (digits, terms, ops)
LEVELS: dict[int, tuple[int, int, str]] = {
    1: (1, 2, "+"),
    2: (2, 2, "+"),
    3: (2, 2, "+-"),
    4: (3, 2, "+-"),
    5: (2, 3, "+-"),
    6: (2, 2, "*"),
    7: (2, 3, "+-*"),
    8: (3, 3, "+-*"),
}

INSTRUCTION = (
    "Compute {expr}. Work it out step by step, writing each intermediate result, "
    "then finish with a final line of the form 'Answer: N'."
)
#: the answer format the instruction states (verifiers read this and nothing else by default)
ANSWER_FORMAT = "answer_line"
SPLITS = ("train", "test")


def split_of(expr: str, test_mod: int = 10) -> str:
    """The split an expression belongs to (a pure function of the text)."""
    h = int.from_bytes(hashlib.blake2b(expr.encode(), digest_size=8).digest(), "big")
    return "test" if h % test_mod == 0 else "train"


def prompt_id_of(expr: str) -> str:
    return "arith-" + hashlib.blake2b(expr.encode(), digest_size=8).hexdigest()


def _operand(rng: random.Random, digits: int) -> int:
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(lo, 10**digits - 1)


def make_expression(rng: random.Random, digits: int, terms: int, ops: str) -> str:
    parts = [str(_operand(rng, digits))]
    for _ in range(terms - 1):
        parts += [rng.choice(ops), str(_operand(rng, digits))]
    return " ".join(parts)


def evaluate(expr: str) -> int:
    """Value of an expression of non-negative integers joined by ``+ - *`` (precedence respected)."""
    toks = expr.split()
    if len(toks) % 2 == 0 or any(not t.isdigit() for t in toks[::2]) or any(t not in "+-*" for t in toks[1::2]):
        raise ValueError(f"not an arith expression: {expr!r}")
    # fold products first, then sums
    total, sign, prod = 0, 1, int(toks[0])
    for op, num in zip(toks[1::2], toks[2::2], strict=True):
        if op == "*":
            prod *= int(num)
        else:
            total += sign * prod
            sign, prod = (1 if op == "+" else -1), int(num)
    return total + sign * prod


def make_arith(
    n: int = 64,
    level: int | None = None,
    digits: int | None = None,
    terms: int = 2,
    ops: str = "+",
    seed: int = 0,
    split: str = "train",
    system: str | None = None,
) -> ListSource:
    """``n`` distinct arithmetic prompts of one split.

    Args:
        n: how many (distinct) prompts.
        level: a difficulty level of :data:`LEVELS` (sets digits, terms, ops); or give ``digits``.
        digits, terms, ops: operand digits, operand count, operator alphabet (``"+-*"``).
        seed: RNG seed; the same arguments give the same prompts.
        split: ``"train"`` or ``"test"`` (held out; never overlaps ``train``).
        system: optional system message.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if level is not None:
        if level not in LEVELS:
            raise ValueError(f"level must be one of {sorted(LEVELS)}, got {level}")
        digits, terms, ops = LEVELS[level]
    digits = 1 if digits is None else int(digits)
    if digits < 1 or terms < 2 or not ops or any(o not in "+-*" for o in ops):
        raise ValueError(f"need digits >= 1, terms >= 2 and ops from '+-*'; got {digits}, {terms}, {ops!r}")
    difficulty = float(level) if level is not None else float(digits * (terms - 1) + ("*" in ops))
    rng = random.Random(f"arith|{seed}|{split}|{digits}|{terms}|{ops}")
    seen: set[str] = set()
    out: list[Prompt] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n + 1000:
            raise PoolTooSmall(
                f"could only make {len(out)} distinct {split} problems with digits={digits}, terms={terms}, "
                f"ops={ops!r}; ask for fewer or a harder level", out
            )
        expr = make_expression(rng, digits, terms, ops)
        if expr in seen or split_of(expr) != split:
            continue
        seen.add(expr)
        msgs = ([Message("system", system)] if system else []) + [Message("user", INSTRUCTION.format(expr=expr))]
        out.append(
            Prompt(
                prompt_id=prompt_id_of(expr),
                task="arith",
                messages=msgs,
                answer=str(evaluate(expr)),
                category=f"arith/{digits}d{terms}t{ops}",
                difficulty=difficulty,
                split=split,
                meta={"expression": expr, "digits": digits, "terms": terms, "ops": ops, "seed": seed,
                      "answer_format": ANSWER_FORMAT},
            )
        )
    return ListSource("arith", out)
