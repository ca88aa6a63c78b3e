"""Models: loading a spec into a hooked model, reading its attention by either path or in chunks, its weights.

All that is specific to an architecture lives here.
"""

from .forward import chunked_refusal, pattern_forward
from .load import (
    ALIASES,
    DEFAULT_MODELS,
    DEVICES,
    DTYPES,
    PATHS,
    HookedModel,
    PatternSite,
    alias_status,
    check_spec,
    describe_spec,
    load_model,
    resolve_device,
)

__all__ = ["HookedModel", "PatternSite", "ALIASES", "DEFAULT_MODELS", "DEVICES", "DTYPES", "PATHS", "load_model",
           "pattern_forward", "chunked_refusal", "check_spec", "describe_spec", "alias_status", "resolve_device"]
