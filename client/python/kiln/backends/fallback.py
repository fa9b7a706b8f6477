"""How the "kiln" backend gives up on a graph: it runs eagerly, with one warning per kind of
failure in a process (debug output for the next ones of that kind)."""
import logging

from kiln.state import STATE

log = logging.getLogger("kiln")


def warn_eager_once(kind: str, message: str) -> None:
    """Logs that a graph runs eagerly because of `message`: a warning the first time a failure
    of `kind` happens in this process, debug output after."""
    if not STATE.first_warning(f"kiln backend: {kind}"):
        log.debug("kiln: %s", message)
        return
    log.warning("kiln: %s; running the graph eagerly", message)
