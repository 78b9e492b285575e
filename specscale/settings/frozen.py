"""A deep read-only copy of a resolved config, and back.

The cell spec holds the resolved config for the parts only one builder reads (a model's
dimensions, an engine's internals). Freezing it all the way down means no layer can
change what another layer (the hash, the summary, W&B) reads later; ``thaw`` gives the
plain dicts and lists that JSON, YAML and OmegaConf expect.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping


def freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain dicts and lists again (the resolved config as Hydra gave it)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value
