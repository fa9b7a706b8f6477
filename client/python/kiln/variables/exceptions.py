"""Exceptions the traced code makes and raises: an exception object made at trace time from its
class and constant arguments (ExceptionVariable), and raising one (kiln.exc.TracedException),
which the executor hands to the handler the raising frame's exception table names."""
import inspect
from typing import List

from kiln.exc import TracedException, Unsupported
from kiln.variables.base import VariableTracker
from kiln.variables.constant import ConstantVariable

# Classes whose construction is more than storing the arguments: OSError(errno, ...) makes one of
# its subclasses, an exception group checks and wraps what it is given.
_REFUSED_BASES = (OSError, BaseExceptionGroup)


class ExceptionVariable(VariableTracker):
    """An exception object the frame made, `cls(*args)` with constant arguments, for a class
    whose construction kiln knows (can_construct). Raised, it is what `except E as e` binds.
    After the graph it is made again by calling the class with the arguments, where it was
    never raised: a raised one carries eager's traceback and context, which no call remakes."""

    fresh_object = True  # made in the frame: the tracker is its identity

    def __init__(self, cls: type, args: List[VariableTracker]):
        super().__init__(None)
        self.cls = cls
        self.args = list(args)
        self.raised = False
        self.cause = ConstantVariable(None)  # `raise ... from cause`
        self.suppress_context = False
        self.where = ""  # the user's line that first raised it, for the message

    @staticmethod
    def can_construct(cls) -> bool:
        """Whether `cls(*args)` is an exception of exactly that class holding `args` and nothing
        else: Python's own exception classes, and subclasses that add no __new__, __init__ or
        metaclass of their own."""
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            return False
        if issubclass(cls, _REFUSED_BASES):
            return False
        for klass in cls.__mro__:
            if type(klass) is not type:
                return False
            if klass.__module__ == "builtins":
                return True  # from here on, the exception's own construction
            if "__new__" in vars(klass) or "__init__" in vars(klass):
                return False
        return True

    @classmethod
    def make(cls, exc_cls: type, args: List[VariableTracker]) -> "ExceptionVariable":
        """`exc_cls(*args)`, or Unsupported where kiln cannot make it at trace time."""
        if not cls.can_construct(exc_cls):
            raise Unsupported(f"making a {getattr(exc_cls, '__qualname__', exc_cls)} exception "
                              "at trace time")
        values = []
        for a in args:
            if not a.is_python_constant():
                raise Unsupported(f"a {exc_cls.__qualname__} made from values that are not "
                                  "constants")
            values.append(a.as_python_constant())
        try:
            exc_cls(*values)  # what eager's call would reject (a UnicodeError's arguments)
        except Exception as e:
            raise Unsupported(f"{exc_cls.__qualname__}() raised {type(e).__name__}: {e}") from None
        return cls(exc_cls, [ConstantVariable(v) for v in values])

    def python_type(self):
        return self.cls

    def identity(self, tx):
        return self

    def describe(self) -> str:
        """What the exception is, as kiln's messages say it: `KeyError 'k'`."""
        values = tuple(a.as_python_constant() for a in self.args)
        if not values:
            return self.cls.__name__
        return f"{self.cls.__name__} {values[0]!r}" if len(values) == 1 else \
            f"{self.cls.__name__} {values!r}"

    def traced(self) -> TracedException:
        """Raising this exception inside the trace (RAISE_VARARGS, RERAISE, a tracker's own
        raise): the message keeps the line that first raised it."""
        self.raised = True
        return TracedException(self, f"{self.describe()} while tracing", source_line=self.where)

    def var_getattr(self, tx, name):
        if name == "args":
            return ConstantVariable(tuple(a.as_python_constant() for a in self.args))
        if name == "__class__":
            return tx.wrap(self.cls, None)
        if name == "__cause__":
            return self.cause
        if name == "__suppress_context__":
            return ConstantVariable(self.suppress_context)
        raise Unsupported(f"attribute {name!r} of a {self.cls.__qualname__} the frame made")

    def reconstruct(self, codegen) -> str:
        if self.raised:
            raise Unsupported(f"kiln cannot rebuild a {self.cls.__qualname__} the trace raised "
                              "(eager's has a traceback and a context)")
        return codegen.temp(self, lambda: codegen.constant(self.cls) + "(" + "".join(
            codegen(a) + ", " for a in self.args) + ")")

    def __repr__(self):
        return f"ExceptionVariable({self.describe()})"


def traced_exception(exc_cls: type, *args) -> TracedException:
    """What a tracker raises where the traced code raises `exc_cls(*args)` (constants) and the
    guards make that certain: a KeyError of a dict whose keys are known, say."""
    return ExceptionVariable.make(exc_cls, [ConstantVariable(a) for a in args]).traced()


_NO_CAUSE = object()


def raise_exception(tx, value: VariableTracker, cause=_NO_CAUSE):
    """RAISE_VARARGS: `raise value` (`raise value from cause`), where `value` is an exception
    the frame made or a class to call with no arguments. Raises its TracedException, or
    Unsupported where kiln cannot make the exception."""
    exc = _exception_of(value)
    if cause is not _NO_CAUSE:
        if cause.is_python_constant() and cause.as_python_constant() is None:
            exc.cause = cause
        else:
            exc.cause = _exception_of(cause)
        exc.suppress_context = True
    raise exc.traced()


def _exception_of(value: VariableTracker) -> ExceptionVariable:
    if isinstance(value, ExceptionVariable):
        return value
    cls = value.as_python_constant() if value.is_python_constant() else None
    if inspect.isclass(cls) and issubclass(cls, BaseException):
        return ExceptionVariable.make(cls, [])
    raise Unsupported(f"raise of {value} at trace time")


def check_attribute_error(obj: VariableTracker, traced: TracedException):
    """An exception out of `obj.name` (LOAD_ATTR) as eager raises it. CPython calls the class's
    __getattr__ after any AttributeError of the lookup (a property's, a __getattribute__'s),
    which the trackers do not model there: such an AttributeError is Unsupported, not an
    exception the program may catch. Anything else passes."""
    if not issubclass(traced.value.python_type(), AttributeError):
        return
    try:
        cls = obj.python_type()
    except Unsupported:
        cls = None
    if cls is None or inspect.getattr_static(cls, "__getattr__", None) is not None:
        raise Unsupported(f"{traced.reason} out of an attribute of {obj}, whose class may "
                          "have a __getattr__") from None
