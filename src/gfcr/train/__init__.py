"""Train: the RL loop (:func:`train`: select → generate → verify → control → replay → append → update,
one :class:`StepCollector` per run for the step's world), its typed config (:class:`TrainConfig`), the
losses as pure functions (policy gradient, masked NLL, reverse KL), masked SFT (ROSS trains through it),
on-policy distillation, checkpoints and data parallel."""

from gfcr.config import lazy_public

#: public name -> the module that defines it (imported on first use, so that importing one module of
#: this package loads none of the others: the loop and the losses load torch)
_PUBLIC = {
    "train": "gfcr.train.loop",
    "TrainingRun": "gfcr.train.loop",
    "RunResult": "gfcr.train.loop",
    "TrainConfig": "gfcr.train.config",
    "load_config": "gfcr.train.config",
    "dump_config": "gfcr.train.config",
    "StepCollector": "gfcr.train.collect",
    "policy_gradient_loss": "gfcr.train.losses",
    "masked_nll": "gfcr.train.losses",
    "token_logprobs": "gfcr.train.losses",
    "train_masked_sft": "gfcr.train.sft",
    "SFTResult": "gfcr.train.sft",
    "DistillConfig": "gfcr.train.distill",
    "reverse_kl": "gfcr.train.distill",
}
__all__ = sorted(_PUBLIC)

__getattr__ = lazy_public(__name__, _PUBLIC)
