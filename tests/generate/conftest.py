import pytest


@pytest.fixture(scope="session")
def tiny():
    from gfcr.testing import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    return tiny_model(tok, seed=0), tok


@pytest.fixture(scope="session")
def engine(tiny):
    from gfcr.generate.engines.hf import HFEngine

    model, tok = tiny
    return HFEngine(model, tok, policy_version="tiny-0")
