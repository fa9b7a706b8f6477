"""torch.compile(model, backend="kiln"): the graphs torch's own Dynamo captures, compiled by kilnd
through kiln's "kiln" backend (kiln.backends.kiln_backend) and served from its shared cache.

Torch finds `backend` through the `torch_dynamo_backends` entry point of the kiln distribution
(written by scripts/venv.sh), without the program importing kiln. Each graph goes through torch's
AOT autograd first (kiln.backends.aot), as kiln's own graphs that need autograd do.
"""
import functools
from typing import Callable, Optional

import torch

from kiln.backends import kiln_backend
from kiln.backends.aot import through_aot_autograd


def backend(gm: torch.fx.GraphModule, example_inputs: list, mode: Optional[str] = None,
            options: Optional[dict] = None) -> Callable:
    """torch.compile's backend "kiln": Dynamo's graph and example inputs -> the callable Dynamo
    runs in its place. `mode` and `options` are torch.compile's (kiln reads their CUDA-graph
    settings, see kiln_backend.cuda_graphs_wanted)."""
    return through_aot_autograd(
        gm, example_inputs, functools.partial(kiln_backend.kiln, mode=mode, options=options),
        functools.partial(kiln_backend.kiln, mode=mode, options=options, own_graph_memory=True))
