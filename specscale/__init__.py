"""SpecScale harness: speculative PRM-guided beam search served on one GPU."""

from specscale.settings.resolvers import register as _register_resolvers

_register_resolvers()
