"""Context managers the executor models: torch.no_grad() and torch.enable_grad().

Entering and leaving record torch._C._set_grad_enabled into the graph, so the compiled graph
switches grad mode exactly where the program did, and switch it during capture too, so fake
values get the requires_grad eager would give them."""
import torch

from kiln.variables.base import VariableTracker
from kiln.variables.constant import ConstantVariable


class GradModeVariable(VariableTracker):
    def __init__(self, enabled: bool):
        super().__init__(None)
        self.enabled = enabled

    def python_type(self):
        return torch.no_grad if not self.enabled else torch.enable_grad

    def enter(self, tx):
        prior = torch.is_grad_enabled()
        _set_grad(tx, self.enabled)
        return GradModeExitVariable(prior)


class GradModeExitVariable(VariableTracker):
    """The bound __exit__ that BEFORE_WITH leaves on the stack."""

    def __init__(self, prior: bool):
        super().__init__(None)
        self.prior = prior

    def call_function(self, tx, args, kwargs):
        _set_grad(tx, self.prior)
        return ConstantVariable(None)


def _set_grad(tx, enabled: bool):
    tx.output.call("call_function", torch._C._set_grad_enabled, (ConstantVariable(enabled),), {})
