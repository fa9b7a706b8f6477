"""Everything the symbolic executor (kiln._C.Translator, client/capture/executor.cpp) uses of
kiln's Python side, in one object handed to it when a capture starts: the errors it raises,
the trackers it makes itself (constants, containers, NULL, cells, nested functions, raised
exceptions), how `with` enters a value, the tracker factory for values read from outside the
frame, the operator semantics, the sources it builds for guards, the mutation bookkeeping of
graph-break checkpoints, and which files it may inline. The executor imports nothing of kiln's
by name: this module is where the ties show.

Everything else it asks of a value goes through the tracker protocol (kiln.variables.base)."""
import torch

from kiln.capture.code_layout import can_split
from kiln.capture.graph_break import Checkpoint, GraphBreak
from kiln.capture.skip_files import is_torch_file, traces_into
from kiln.exc import TracedException, Unsupported
from kiln.guards import source
from kiln.variables.base import LazyLocal, NullVariable, VariableTracker
from kiln.variables.builder import wrap
from kiln.variables.builtins import apply_operator
from kiln.variables.constant import ConstantVariable
from kiln.variables.containers import (ConstDictVariable, ListIteratorVariable, ListVariable,
                                       SetVariable, SliceVariable, TupleVariable,
                                       mark_checkpoint, mutation_count)
from kiln.variables.ctx_manager import enter_context
from kiln.variables.exceptions import (ExceptionVariable, check_attribute_error,
                                       raise_exception)
from kiln.variables.functions import CellVariable, NestedFunctionVariable
from kiln.variables.objects import SuperVariable
from kiln.variables.side_effects import mutations_of


class CaptureHost:
    """The executor reads these attributes once per host (see Host in capture/translator.h)."""

    def __init__(self):
        # Errors.
        self.Unsupported = Unsupported
        self.TracedException = TracedException
        self.GraphBreak = GraphBreak
        self.Checkpoint = Checkpoint
        # Trackers the executor makes or recognizes.
        self.VariableTracker = VariableTracker
        self.NullVariable = NullVariable
        self.LazyLocal = LazyLocal
        # Arguments wrapped when the frame starts, not on their first read (an nn.Module: see
        # Translator::Root).
        self.wrapped_first = lambda value: isinstance(value, torch.nn.Module)
        self.ConstantVariable = ConstantVariable
        self.TupleVariable = TupleVariable
        self.ListVariable = ListVariable
        self.SetVariable = SetVariable
        self.ConstDictVariable = ConstDictVariable
        self.SliceVariable = SliceVariable
        self.ListIteratorVariable = ListIteratorVariable
        self.CellVariable = CellVariable
        self.NestedFunctionVariable = NestedFunctionVariable
        self.SuperVariable = SuperVariable
        self.ExceptionVariable = ExceptionVariable
        # Values from outside the frame, and operators on trackers.
        self.wrap = wrap
        self.apply_operator = apply_operator
        self.raise_exception = raise_exception
        self.check_attribute_error = check_attribute_error
        self.enter_context = enter_context
        # Graph-break checkpoints: container mutations and held attribute stores.
        self.mark_checkpoint = mark_checkpoint
        self.mutation_count = mutation_count
        self.mutations_of = mutations_of
        # Which code is inlined, which is taken as fixed (torch's own), and which a root frame
        # may break its graph in.
        self.traces_into = traces_into
        self.is_torch_file = is_torch_file
        self.can_split = can_split
        # Sources, for guards.
        self.LocalSource = source.LocalSource
        self.GlobalSource = source.GlobalSource
        self.ClosureSource = source.ClosureSource
        self.FrameCellSource = source.FrameCellSource
        self.ObjectSource = source.ObjectSource
        self.AttrSource = source.AttrSource
        self.ItemSource = source.ItemSource


HOST = CaptureHost()
