"""Generate: engines (hf, openai-compatible, vllm; :func:`make_engine`), rollout topologies (groups,
TreeRL's entropy-guided trees, multi-turn env episodes; :func:`make_topology`), envs, weight sync, and
``gfcr generate``'s job (:func:`run_generate` over a :class:`GenerateConfig`). Every rollout keeps the
token ids the policy sampled, their roles and behaviour log-probs."""

from gfcr.config import lazy_public

#: public name -> the module that defines it (imported on first use, so that importing one module of
#: this package loads none of the others: an engine may load torch)
_PUBLIC = {
    "run_generate": "gfcr.generate.run",
    "build_engine": "gfcr.generate.run",
    "build_topology": "gfcr.generate.run",
    "GenerateConfig": "gfcr.generate.config",
    "EngineConfig": "gfcr.generate.config",
    "TopologyConfig": "gfcr.generate.config",
    "make_engine": "gfcr.generate.engines",
    "Engine": "gfcr.generate.engines.base",
    "GenRequest": "gfcr.generate.engines.base",
    "GenResult": "gfcr.generate.engines.base",
    "SamplingParams": "gfcr.generate.engines.base",
    "make_topology": "gfcr.generate.topologies",
    "Group": "gfcr.generate.topologies",
    "EPTree": "gfcr.generate.topologies",
    "MultiTurn": "gfcr.generate.topologies",
    "make_env": "gfcr.generate.envs",
    "rollout_from_result": "gfcr.generate.rollouts",
}
__all__ = sorted(_PUBLIC)

__getattr__ = lazy_public(__name__, _PUBLIC)
