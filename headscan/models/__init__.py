"""Models: loading a spec into a hooked model, reading its attention by either path or in chunks, its weights.

All that is specific to an architecture lives here. Checking a spec (`check_spec`, `headscan.models.specs`) and
the embedded aliases need no torch: each name below is imported on first use, so that the command line checks
``--model`` before torch loads.
"""

from ..lazy import lazy_names

__all__ = ["HookedModel", "PatternSite", "ALIASES", "DEFAULT_MODELS", "DEVICES", "DTYPES", "PATHS", "load_model",
           "pattern_forward", "chunked_refusal", "check_spec", "describe_spec", "alias_status", "resolve_device"]

_LAZY = {"pattern_forward": "forward", "chunked_refusal": "forward", "ALIASES": "aliases", "DEFAULT_MODELS": "aliases",
         "alias_status": "aliases", "check_spec": "specs", "describe_spec": "specs", "DEVICES": "load",
         "DTYPES": "load", "PATHS": "load", "HookedModel": "load", "PatternSite": "load", "load_model": "load",
         "resolve_device": "load"}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__)
