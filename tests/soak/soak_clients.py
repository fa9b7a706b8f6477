"""The soak's client processes: a zygote that imports torch and kiln once, then forks one
process per client slot (and a new one whenever a client dies before the end), so that 64
processes fit in memory. Each client compiles graphs through kiln's "kiln" backend in a loop,
mixing graphs seen before (cache hits) with new shapes (misses), and checks every result
against eager. What it saw goes to <out>/client-<slot>.jsonl, one line per graph:
  {"t": seconds since the start, "slot", "pid", "fn", "rows", "outcome", "seconds", "detail"}
outcome: "compiled" (ran kiln's artifact), "eager" (kiln ran it eagerly: a warning, not an
error), "wrong" (a result that differs from eager) or "error" (an exception reached the user).

Run by soak.py: python soak_clients.py OUT_DIR CLIENTS END_TIME SEED (env: the groups' settings
as SOAK_GROUP<i>_<NAME>=value, applied to clients of group slot % groups)."""
import json
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path

import torch  # imported once, shared copy-on-write by every client

import kiln

FUNCTIONS = {
    "relu_affine": lambda x: torch.relu(x * 2.0 + 1.0),
    "sigmoid_gate": lambda x: torch.sigmoid(x) * x - 0.5,
    "centered": lambda x: (x - x.mean(dim=-1, keepdim=True)) * 3.0,
    "tanh_sum": lambda x: torch.tanh(x).sum(dim=-1),
}


def rows_now(rng: random.Random, elapsed: float) -> int:
    """Mostly shapes seen before, sometimes a new one: the pool grows by one every 6 s."""
    return 1 + rng.randrange(2 + int(elapsed / 6))


def run_client(slot: int, out: Path, end: float, seed: int, start: float) -> None:
    torch.set_num_threads(1)
    rng = random.Random(seed * 1000 + slot * 7 + os.getpid())
    handler = logging.FileHandler(out / f"client-{slot}.log")
    logging.getLogger("kiln").addHandler(handler)
    logging.getLogger("kiln").setLevel(logging.WARNING)
    logging.getLogger("kiln").propagate = False
    record = open(out / f"client-{slot}.jsonl", "a", buffering=1)
    while time.time() < end:
        name = rng.choice(sorted(FUNCTIONS))
        fn = FUNCTIONS[name]
        rows = rows_now(rng, time.time() - start)
        x = torch.randn(rows, 16)
        kiln.reset()  # a new capture: the backend asks kilnd (or its index) again
        began = time.perf_counter()
        detail = ""
        try:
            with torch.no_grad():
                out_ = kiln.compile(fn, backend="kiln")(x)
            outcome = "compiled" if kiln.debug.artifacts() else "eager"
        except Exception as e:  # a user-visible error: what the soak must never see
            outcome, detail = "error", f"{type(e).__name__}: {e}"
        else:
            expected = fn(x)
            if not torch.allclose(out_, expected, rtol=1e-5, atol=1e-5):
                outcome = "wrong"
                detail = f"max abs diff {(out_ - expected).abs().max().item():.3g}"
        record.write(json.dumps({"t": round(time.time() - start, 3), "slot": slot,
                                 "pid": os.getpid(), "fn": name, "rows": rows,
                                 "outcome": outcome,
                                 "seconds": round(time.perf_counter() - began, 4),
                                 "detail": detail}) + "\n")
        time.sleep(rng.uniform(0.0, 0.3))


def group_env(slot: int) -> None:
    groups = int(os.environ.get("SOAK_GROUPS", "1"))
    prefix = f"SOAK_GROUP{slot % groups}_"
    for key, value in list(os.environ.items()):
        if key.startswith(prefix):
            os.environ[key[len(prefix):]] = value


def warm_up() -> None:
    """What every client would otherwise import on its first graph (lowering, decompositions,
    grpc and the kiln.v1 messages), done once here and shared. No channel is opened, and torch
    runs on one thread, so forking afterwards is safe."""
    torch.set_num_threads(1)
    from kiln.daemon import protocol
    from kiln.graph import lowering  # noqa: F401

    protocol.messages()
    x = torch.randn(2, 16)
    for fn in FUNCTIONS.values():
        kiln.compile(fn, backend="eager")(x)
    kiln.reset()


def main() -> None:
    out, clients, end, seed = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), \
        int(sys.argv[4])
    warm_up()
    start = float(os.environ.get("SOAK_START", time.time()))
    pids = {}

    def spawn(slot: int) -> None:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                group_env(slot)
                run_client(slot, out, end, seed, start)
            finally:
                os._exit(0)
        pids[pid] = slot
        (out / f"client-{slot}.pid").write_text(str(pid))

    for slot in range(clients):
        spawn(slot)
    # Reap; replace a client that died before the end (the chaos kills them).
    while pids:
        pid, status = os.wait()
        slot = pids.pop(pid, None)
        if slot is not None and time.time() < end - 2:
            spawn(slot)


if __name__ == "__main__":
    main()
