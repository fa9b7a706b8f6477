"""A fleet on this machine's loopback: one private Redis, three kilnd sharing it (and one MAC key
file), and N client processes started at once, round-robin over the three, each compiling the
same small models (an MLP and a small conv net, torchvision's building blocks, fixed seeds, CPU)
with kiln.compile(model, backend="kiln") and checking them against eager.

    python bench/bench_fleet.py [--clients 64] [--daemons 3] [--no-restart] [--timeout S]
                                [--client-nice N] [--workers N] [--keep] [--out F]

Waves of N clients: on a cold cache; again on the warm cache (same daemons); again after
every kilnd was restarted (new processes on the same cache folders and Redis; --no-restart skips
it); and on a new host: one more kilnd on an empty cache directory joins the Redis tier, and all N
clients use it, with an empty client cache directory. For each wave it reports:
  compiles      the compiles the three kilnd ran (their Stats counters, summed), per distinct
                graph: the target is 1.0, each graph compiled once across the fleet
  waits         keys a kilnd left to another that held their compile lease in Redis, and the
                wait hits, those served the other's artifact (Stats: shared_compile_wait*)
  wall          from the fork of the N clients until the last one finished: time to a warm fleet
  stored        (client, model) pairs installed from a stored capture (no tracing): all of them,
                2 per client, once the fleet is warm, on the new host too (through Redis)
  failed        clients that saw an error, a wrong result, a kiln warning or an eager fallback
  first call    p50/p95 over the clients of the first calls of both models (capture or stored
                capture, lowering, compile or cache hit, loading, one run)
  ready         p50/p95 from the fork until the client had built, compiled and checked both
The clients are forked from one process that imported torch, torchvision and kiln (fleet_clients
.py: 64 separate interpreters would not fit in memory here) and run at nice 5 (--client-nice),
so that on a machine of few cores the clients' tracing does not starve the daemons, which stand
in for other machines' kilnd. Exit status 1 when a client failed.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, emit, environment  # noqa: E402
from fleet import MODELS, Fleet  # noqa: E402


COLUMNS = (("wall s", 8), ("ok", 5), ("failed", 7), ("compiles", 9), ("graphs", 7),
           ("per graph", 10), ("hits", 6), ("remote hits", 12), ("waits", 6), ("wait hits", 10),
           ("stored", 7), ("first p50", 10), ("first p95", 10), ("ready p50", 10),
           ("ready p95", 10))


def row(label: str, w: dict) -> str:
    f, r = w["first_call_s"], w["ready_s"]
    cells = (f"{w['wall_s']:.1f}", w["ok"], w["failed"], w["compiles"], w["distinct_graphs"],
             _f(w["compiles_per_graph"]), sum(s["hits"] for s in w["daemon_stats"]),
             sum(s["remote_hits"] for s in w["daemon_stats"]),
             sum(s["shared_compile_waits"] for s in w["daemon_stats"]),
             sum(s["shared_compile_wait_hits"] for s in w["daemon_stats"]),
             w["stored_captures"], _f(f["p50"]), _f(f["p95"]), _f(r["p50"]), _f(r["p95"]))
    return f"  {label:24}" + "".join(f"{c:>{width}}" for c, (_, width) in zip(cells, COLUMNS))


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def report(args, waves: dict) -> None:
    print(f"command: {command_line()}")
    print(f"fleet: {args.daemons} kilnd sharing one Redis, {args.clients} clients started at "
          f"once (round-robin), models {', '.join(MODELS)}")
    print(f"  {'wave':24}" + "".join(f"{name:>{width}}" for name, width in COLUMNS))
    for label, w in waves.items():
        print(row(label, w))
    for label, w in waves.items():
        per_daemon = ", ".join(f"kilnd{i} {s['compiles']}" for i, s in enumerate(
            w["daemon_stats"]))
        by_model = ", ".join(f"{m} {_f(w['first_call_s'][m]['p50'])}/"
                             f"{_f(w['first_call_s'][m]['p95'])} s" for m in MODELS)
        print(f"  {label}: compiles by daemon: {per_daemon}; first call p50/p95: {by_model}")
        for key, k in w["keys"].items():
            if k["compiled_by"]:
                print(f"    {k['model']:10} {key[:16]}  compiled by kilnd "
                      f"{', '.join(map(str, k['compiled_by']))}")
        for f in w["failures"][:10]:
            print(f"    FAILED: {json.dumps(f)[:600]}")
    cold = waves["cold"]
    once = cold["compiles"] == cold["distinct_graphs"]
    print(f"each graph compiled once across the fleet: "
          f"{'yes' if once else 'NO'} ({cold['compiles']} compiles for "
          f"{cold['distinct_graphs']} graphs)")
    if not once:
        print("  (a kilnd that finds a key's lease taken waits for the holder's artifact; it "
              "compiles the key itself only when Redis does not answer, the lease goes without "
              "an artifact, or --redis-lease-wait-ms passes: see the kilnd logs)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--daemons", type=int, default=3)
    p.add_argument("--no-restart", action="store_true",
                   help="skip the wave after restarting the daemons")
    p.add_argument("--timeout", type=float, default=1800,
                   help="longest wait for one wave's clients, seconds")
    p.add_argument("--client-nice", type=int, default=5)
    p.add_argument("--workers", type=int, default=None, help="each kilnd's --workers")
    p.add_argument("--keep", action="store_true", help="keep the fleet's folder (logs)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from kiln.state import STATE

    kilnd = STATE.daemon.settings.kilnd
    if kilnd is None or not Fleet.redis_available():
        print("bench_fleet: needs kilnd (build it) and redis-server", file=sys.stderr)
        return 2
    waves = {}
    with Fleet(kilnd, daemons=args.daemons, workers=args.workers,
               client_nice=args.client_nice, keep=args.keep) as fleet:
        waves["cold"] = fleet.wave(args.clients, args.timeout)
        waves["warm"] = fleet.wave(args.clients, args.timeout)
        if not args.no_restart:
            fleet.restart_daemons()
            waves["warm, kilnd restarted"] = fleet.wave(args.clients, args.timeout)
        waves["new host"] = fleet.wave(args.clients, args.timeout, daemons=[fleet.add_daemon()])
        if args.keep:
            print(f"fleet folder kept: {fleet.root}")
    report(args, waves)
    emit({"bench": "fleet", "command": command_line(), "clients": args.clients,
          "daemons": args.daemons, "models": list(MODELS),
          "waves": {label: {k: v for k, v in w.items() if k != "failures"}
                    | {"failures": w["failures"][:10]} for label, w in waves.items()},
          **environment()}, args.out)
    return 1 if any(w["failed"] for w in waves.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
