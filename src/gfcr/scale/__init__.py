"""gfcr.scale: scale out on Ray — generation actors and verification actors over one store.

- :func:`~gfcr.scale.generate.ray_generate`: shard prompts over N actors that each hold an engine
  (hf, openai, vllm or your own), run a topology, append each batch of shards as one store commit
- :class:`~gfcr.scale.engine.RayEngine`: an engine over N generation actors (``generate.engine: ray``
  in the training loop); weights synced to every actor through Ray's object store
- :func:`~gfcr.scale.verify.ray_verify`: re-verify a store's rollouts on N actors, one new version
- :func:`~gfcr.scale.cluster.ray_session` / :func:`~gfcr.scale.cluster.init_ray`: connect to a
  cluster (``address``) or start a loopback-only local one

Importing this package does not import Ray; the functions do, and say how to install it if missing.
"""

from .cluster import ScaleError, import_ray, init_ray, ray_session
from .engine import EngineWorker, RayEngine
from .generate import GenerateWorker, ray_generate, shard
from .verify import VerifyWorker, apply_verdicts, ray_verify

__all__ = [
    "EngineWorker",
    "GenerateWorker",
    "RayEngine",
    "ScaleError",
    "VerifyWorker",
    "apply_verdicts",
    "import_ray",
    "init_ray",
    "ray_generate",
    "ray_session",
    "ray_verify",
    "shard",
]
