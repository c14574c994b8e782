from satseq.actors.engines.base import ENGINE_KINDS, Engine, EngineKind
from satseq.actors.engines.factory import make_engine

__all__ = ["ENGINE_KINDS", "Engine", "EngineKind", "make_engine"]
