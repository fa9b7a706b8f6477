"""Variable trackers: what the symbolic executor knows about each Python value, one class per
kind of value."""
import importlib
import pkgutil


def __getattr__(name: str):
    """A tracker class by its name (`kiln.variables.ConstDictVariable`), from the module of this
    package that defines it. Found when first asked: the modules import each other, so this
    package imports none of them itself."""
    if name.endswith("Variable") and not name.startswith("_"):
        for info in pkgutil.iter_modules(__path__):
            module = importlib.import_module(f"{__name__}.{info.name}")
            found = module.__dict__.get(name)
            if isinstance(found, type) and found.__module__ == module.__name__:
                globals()[name] = found
                return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
