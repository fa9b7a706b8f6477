"""The fleet benchmark's client processes (run by bench/fleet.py): a zygote imports torch,
torchvision and kiln once, then forks all N clients at the same moment, so that 64 processes fit
in memory (they share the imported modules copy-on-write) and start together. Client `slot` talks
to daemon `slot % len(daemons)` only (KILN_DAEMON=unix://<its socket>; KILN_CACHE_DIR=<that
daemon's cache directory>, as on a machine where the client started its own kilnd, so the client's
graph index and stored captures live beside it), builds each model with fixed seeds, compiles it
with kiln.compile(model, backend="kiln"), times its first call and checks it against eager with
torch.testing.assert_close.

  python bench/fleet_clients.py OUT_DIR CLIENTS TIMEOUT_S MODEL[,MODEL...]
  environment: FLEET_DAEMONS (JSON: [{"socket": ..., "cache_dir": ...}, ...]),
               KILN_MAC_KEY_FILE (the fleet's key)

Each client writes one JSON object on its stdout, which is OUT_DIR/client-<slot>.json (its stderr
is client-<slot>.log):
  {"slot", "pid", "daemon", "ok", "ready_s" (fork to done), "models": {name: {"first_call_s",
   "correct", "stored_capture" (installed without tracing), "artifacts": [{"key", "cache_hit",
   "index_hit", "compile_s"}]}}, "warnings", "errors"}
ok: every model ran kiln's artifacts (no eager fallback), correct results, no exception and no
warning from kiln. The zygote prints {"started", "finished", "exits": {slot: status}} (time.time()
of the fork and of the last client's end) once every client ended or TIMEOUT_S passed (then the
clients left are killed and have no record)."""
import json
import logging
import os
import signal
import sys
import time

import torch
import torchvision  # noqa: F401  (imported once here, shared by every client)

import kiln
from common import build_model


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def run_client(slot: int, models: list, daemons: list, started: float) -> dict:
    daemon = slot % len(daemons)
    os.environ["KILN_DAEMON"] = f"unix://{daemons[daemon]['socket']}"
    os.environ["KILN_CACHE_DIR"] = daemons[daemon]["cache_dir"]
    kiln.reset()  # the daemon settings are read from this environment on first use
    warnings = _Warnings()
    logging.getLogger("kiln").addHandler(warnings)
    record = {"slot": slot, "pid": os.getpid(), "daemon": daemons[daemon].get("index", daemon),
              "models": {}, "errors": []}
    for name in models:
        m, inputs = build_model(name)
        seen = len(kiln.debug.artifacts())
        result = {"first_call_s": None, "correct": False, "artifacts": []}
        record["models"][name] = result
        try:
            with torch.no_grad():
                expected = m(*inputs)
                compiled = kiln.compile(m, backend="kiln")
                t = time.perf_counter()
                out = compiled(*inputs)
                result["first_call_s"] = time.perf_counter() - t
            torch.testing.assert_close(out, expected)
            result["correct"] = True
        except Exception as e:  # a wrong result, or an error that reached the user
            record["errors"].append(f"{name}: {type(e).__name__}: {e}"[:2000])
        result["artifacts"] = [{"key": a.key, "cache_hit": a.cache_hit, "index_hit": a.index_hit,
                                "compile_s": a.compile_seconds}
                               for a in kiln.debug.artifacts()[seen:]]
        result["stored_capture"] = any(e.info.extra.get("stored_capture") for e in
                                       kiln.debug.cache_entries(type(m).forward.__code__))
    record["warnings"] = warnings.messages
    record["ok"] = (not record["errors"] and not warnings.messages and
                    all(r["correct"] and r["artifacts"] for r in record["models"].values()))
    record["ready_s"] = time.time() - started
    return record


def main() -> None:
    out, clients, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    models = sys.argv[4].split(",")
    daemons = json.loads(os.environ["FLEET_DAEMONS"])
    torch.set_num_threads(1)  # 2 cores for the whole fleet; and forking after this is safe
    from kiln.daemon import protocol
    from kiln.graph import lowering  # noqa: F401  (what every client imports on its first graph)

    protocol.messages()  # the kiln.v1 modules and grpc; no channel is opened before the fork
    started = time.time()
    pids = {}
    for slot in range(clients):
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                for fd, suffix in ((1, "json"), (2, "log")):
                    f = os.open(os.path.join(out, f"client-{slot}.{suffix}"),
                                os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    os.dup2(f, fd)
                    os.close(f)
                print(json.dumps(run_client(slot, models, daemons, started)), flush=True)
                status = 0
            finally:
                os._exit(status)
        pids[pid] = slot
    exits = {}
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        exits[pids.pop(pid)] = os.waitstatus_to_exitcode(status)
    finished = time.time()
    for pid, slot in pids.items():  # past the timeout: no record
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        exits[slot] = "killed at the timeout"
    print(json.dumps({"started": started, "finished": finished, "exits": exits}), flush=True)


if __name__ == "__main__":
    main()
