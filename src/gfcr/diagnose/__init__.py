"""Diagnose: per-step metrics derived from the store's rows (:func:`step_metrics`, one implementation in
:mod:`gfcr.store.stepstats`), detectors of training pathologies (:func:`detect`), rollout health checks,
the self-contained HTML report (:func:`write_report`) and the browser viewer (:func:`create_app`). It
reads the store only."""

from gfcr.config import lazy_public

#: public name -> the module that defines it (imported on first use, so that importing one module of
#: this package loads none of the others: the viewer loads FastAPI)
_PUBLIC = {
    "build_report": "gfcr.diagnose.report",
    "write_report": "gfcr.diagnose.report",
    "create_app": "gfcr.diagnose.viewer",
    "step_metrics": "gfcr.diagnose.metrics",
    "detect": "gfcr.diagnose.detectors",
    "DetectorConfig": "gfcr.diagnose.detectors",
    "Finding": "gfcr.diagnose.detectors",
    "run_health_checks": "gfcr.diagnose.health",
    "resolve_tokenizer": "gfcr.diagnose.tokenizer",
}
__all__ = sorted(_PUBLIC)

__getattr__ = lazy_public(__name__, _PUBLIC)
