"""The router's engine: admission, dispatch, placement, the workers and their liveness, the prefix
cache and its shared store, everything of a request that is not HTTP. The frontends use only what
this module exports: the Engine, the Request it runs, the Deltas it yields and its errors."""
from .copies import MAX_CHOICES
from .engine import Engine
from .errors import Busy, DispatchFailed, Drained, EngineError, GenerationError, NoWorkers, Stalled
from .generation import Delta
from .ledger import Entry
from .request import PromptImage, PromptImages, Request

__all__ = ["MAX_CHOICES", "Busy", "Delta", "DispatchFailed", "Drained", "Engine", "EngineError", "Entry",
           "GenerationError", "NoWorkers", "PromptImage", "PromptImages", "Request", "Stalled"]
