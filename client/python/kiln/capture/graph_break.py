"""What the executor (kiln._C.Translator, client/capture/executor.cpp) hands convert_frame when
the root frame breaks its graph."""


class Checkpoint:
    """The executor's state before the instruction the graph breaks at: the value stack and the
    locals (trackers), pending keyword names of a CALL, and the graph's and the attribute
    mutations' checkpoints to roll back to."""

    __slots__ = ("stack", "locals", "kw_names", "graph")

    @property
    def grad_enabled(self) -> bool:
        """The grad mode the trace had there (see OutputGraph.checkpoint)."""
        return self.graph[0][3]

    def __init__(self, stack, locals, kw_names, graph):
        self.stack = stack
        self.locals = locals
        self.kw_names = kw_names
        self.graph = graph


class GraphBreak(Exception):
    """Raised out of the root frame's run: compile the graph up to `inst` (a kiln._C.Instruction),
    run `inst` in Python, resume after it."""

    def __init__(self, checkpoint: Checkpoint, inst, reason: str, where: str):
        super().__init__(reason)
        self.checkpoint = checkpoint
        self.inst = inst
        self.reason = reason
        self.where = where
