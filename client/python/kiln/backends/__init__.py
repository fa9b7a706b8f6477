"""Backends: callables (gm: torch.fx.GraphModule, example_inputs: list) -> callable."""
from kiln.backends.registry import list_backends, lookup_backend, register_backend
from kiln.backends import kiln_backend  # noqa: F401  (registers "kiln")

__all__ = ["list_backends", "lookup_backend", "register_backend"]
