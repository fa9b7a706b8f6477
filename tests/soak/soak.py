"""The kilnd soak: client processes (soak_clients.py) compiling through two kilnd that share one
Redis, for a fixed time of mixed cache hits and misses, while a chaos loop kills (SIGKILL) and
stops (SIGSTOP, then SIGCONT a few seconds later) kilnd, Redis and clients at random. The clients
start kilnd themselves, as in production (through a wrapper that adds the cluster's flags), and
start it again when it dies; Redis is restarted after a kill, as a service manager would.

At the end it checks, and prints with the figures: zero wrong results, zero user-visible
errors, every fault recovered (and how long each took), memory and disk bounded. Exit status 0
when every check holds; <out>/report.json has the numbers.

  .venv/bin/python tests/soak/soak.py                               # 10 minutes, 64 clients
  .venv/bin/python tests/soak/soak.py --duration 40 --clients 8     # the short run CI makes
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE.parents[1] / "client" / "python"))

import kilnd_harness as harness  # noqa: E402

FAULTS = ("kill kilnd", "stop kilnd", "kill redis", "stop redis", "kill client", "stop client")


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cont(pid: int, marker: str) -> None:
    try:
        harness.signal_ours(pid, signal.SIGCONT, marker)
    except ProcessLookupError:
        pass  # killed meanwhile


def redis_answers(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            s.connect(str(path))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Cluster:
    """Redis, the cluster key, the kilnd wrapper and the two kilnd's folders."""

    def __init__(self, root: Path, kilnd: str, cache_max_bytes: int):
        self.root = root
        (root / "redis").mkdir()
        self.redis = harness.Redis(root / "redis")
        self.key = root / "cluster.key"
        self.key.write_bytes(os.urandom(32))
        self.key.chmod(0o600)
        self.wrapper = root / "kilnd"
        self.wrapper.write_text(
            "#!/bin/sh\n# kilnd with the cluster's settings, as the clients start it\n"
            f'exec {kilnd} "$@" --redis {self.redis.address} --mac-key-file {self.key} '
            f"--cache-max-bytes {cache_max_bytes} --redis-timeout-ms 500 --log-level info\n")
        self.wrapper.chmod(0o700)
        self.kilnd = kilnd
        self.caches = [root / "a", root / "b"]
        self.lock = threading.Lock()

    def socket(self, i: int) -> Path:
        return self.caches[i] / "kilnd.sock"

    def redis_running(self) -> bool:
        """Whether Redis runs now (a killed one waiting for its restart does not)."""
        with self.lock:
            return self.redis.proc.poll() is None

    def restart_redis(self) -> None:
        with self.lock:
            if self.redis.proc.poll() is None:
                return
            self.redis = harness.Redis(self.root / "redis")


class Observer(threading.Thread):
    """Every second: which kilnd answer (and their pids, RSS, whether Redis is down for them),
    whether Redis answers, and the disk each cache folder takes. Keeps maxima and a timeline."""

    def __init__(self, cluster: Cluster):
        super().__init__(daemon=True)
        from kiln.daemon.client import DaemonClient

        self.cluster = cluster
        self.make_client = lambda i: DaemonClient(f"unix://{cluster.socket(i)}", autostart=False)
        self.timeline = []  # (t, [pid or None per kilnd], [remote_down per kilnd], redis_ok)
        self.max_rss = {"kilnd": 0, "redis": 0}
        self.max_disk = [0, 0]
        self.stats = [None, None]
        self.stopping = False

    def sample(self):
        pids, downs = [], []
        for i in range(2):
            client = None
            try:
                client = self.make_client(i)
                health = client.health(timeout=1.0)
                stats = client.stats(timeout=1.0)
                pids.append(health.pid)
                downs.append(stats.remote_down)
                self.stats[i] = stats
                self.max_rss["kilnd"] = max(self.max_rss["kilnd"], rss_bytes(health.pid))
            except Exception:
                pids.append(None)
                downs.append(None)
            finally:
                if client is not None:
                    client.close()
            if self.cluster.caches[i].exists():
                self.max_disk[i] = max(self.max_disk[i],
                                       harness.folder_bytes(self.cluster.caches[i]))
        with self.cluster.lock:
            redis = self.cluster.redis
        self.max_rss["redis"] = max(self.max_rss["redis"], rss_bytes(redis.proc.pid))
        self.timeline.append((time.time(), pids, downs, redis_answers(redis.socket)))

    def run(self):
        while not self.stopping:
            self.sample()
            time.sleep(1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--fault-every", type=float, default=6.0,
                        help="mean seconds between faults")
    parser.add_argument("--cache-max-bytes", type=int, default=4_000_000,
                        help="each kilnd's local limit: small, so that eviction runs too")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="where logs and report.json go")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's folders")
    args = parser.parse_args()

    from kiln.state import STATE

    kilnd = STATE.daemon.settings.kilnd
    if kilnd is None or harness.REDIS_SERVER is None:
        print("soak: needs kilnd (build it) and redis-server", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    root = harness.short_tmpdir("soak-")
    out = args.out or root / "out"
    out.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(root, kilnd, args.cache_max_bytes)
    start = time.time()
    end = start + args.duration

    env = {k: v for k, v in os.environ.items()
           if k not in ("KILN_DAEMON", "XDG_RUNTIME_DIR", "KILN_CACHE_DIR", "KILN_MAC_KEY_FILE")}
    env.update({"KILN_KILND": str(cluster.wrapper), "KILN_MAC_KEY_FILE": str(cluster.key),
                "SOAK_GROUPS": "2", "SOAK_START": str(start),
                "SOAK_GROUP0_KILN_CACHE_DIR": str(cluster.caches[0]),
                "SOAK_GROUP1_KILN_CACHE_DIR": str(cluster.caches[1]),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parents[1] / "client" /
                                                                "python"),
                                                            env.get("PYTHONPATH")]))})
    zygote = subprocess.Popen(
        [sys.executable, str(HERE / "soak_clients.py"), str(out), str(args.clients), str(end),
         str(args.seed)], env=env, preexec_fn=lambda: os.nice(5))
    observer = Observer(cluster)
    observer.start()

    def gap() -> float:
        # Exponential gaps (faults at random moments), capped at twice their mean so that a short
        # run is sure to inject a known minimum of faults.
        return min(rng.expovariate(1 / args.fault_every), 2 * args.fault_every)

    faults = []   # {"t", "kind", "target", "until"}: what was done, and when it ended
    pending = []  # (when, action): SIGCONTs and Redis restarts to come
    next_fault = start + 5 + gap()
    kinds = []
    while time.time() < end:
        now = time.time()
        for when, action in [p for p in pending if p[0] <= now]:
            pending.remove((when, action))
            action()
        if now >= next_fault and now < end - 8:
            if not kinds:  # every kind once per round, in a random order
                kinds = rng.sample(FAULTS, len(FAULTS))
            kind = kinds.pop()
            fault = {"t": now - start, "kind": kind, "until": now - start}
            if kind.endswith("kilnd"):
                i = rng.randrange(2)
                pid = observer.timeline[-1][1][i] if observer.timeline else None
                if pid is None:
                    next_fault = now + 1
                    kinds.append(kind)  # try this kind again
                    continue
                fault["target"] = f"kilnd {'ab'[i]} (pid {pid})"
                fault["kilnd"] = i
                marker = str(cluster.socket(i))
            elif kind.endswith("redis"):
                if not cluster.redis_running():
                    next_fault = now + 1
                    kinds.append(kind)  # try this kind again
                    continue
                pid = cluster.redis.proc.pid
                fault["target"] = f"redis (pid {pid})"
                marker = str(cluster.redis.socket)
            else:
                slot = rng.randrange(args.clients)
                try:
                    pid = int((out / f"client-{slot}.pid").read_text())
                except (OSError, ValueError):
                    next_fault = now + 1
                    kinds.append(kind)  # try this kind again
                    continue
                fault["target"] = f"client {slot} (pid {pid})"
                fault["slot"] = slot
                marker = str(out)
            try:
                if kind.startswith("kill"):
                    harness.signal_ours(pid, signal.SIGKILL, marker)
                    if kind == "kill redis":
                        delay = rng.uniform(1, 4)
                        fault["until"] += delay
                        pending.append((now + delay, cluster.restart_redis))
                else:
                    harness.signal_ours(pid, signal.SIGSTOP, marker)
                    delay = rng.uniform(2, 6)
                    fault["until"] += delay
                    pending.append((now + delay,
                                    lambda pid=pid, marker=marker: cont(pid, marker)))
            except ProcessLookupError:
                next_fault = now + 1
                kinds.append(kind)  # try this kind again
                continue
            faults.append(fault)
            print(f"[soak {now - start:6.1f} s] {kind}: {fault['target']}", flush=True)
            next_fault = now + gap()
        time.sleep(0.1)
    for _, action in pending:
        action()

    try:
        zygote.wait(timeout=120)
    except subprocess.TimeoutExpired:
        zygote.kill()
    # Everything must answer again: wait (bounded) for the last faults to heal.
    deadline = time.time() + 30
    while time.time() < deadline:
        last = observer.timeline[-1]
        if all(p is not None for p in last[1]) and last[2] == [False, False] and last[3]:
            break
        time.sleep(1)
    observer.stopping = True
    observer.join()

    report = summarize(args, out, faults, observer, start)
    for i in range(2):
        harness.stop_any_kilnd(kilnd, cluster.socket(i))
    cluster.redis.stop()
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print_report(report, out)
    if not args.keep and args.out is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if report["ok"] else 1


def summarize(args, out: Path, faults, observer: Observer, start: float) -> dict:
    rows = []
    for f in sorted(out.glob("client-*.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    outcomes = {}
    for r in rows:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    bad = [r for r in rows if r["outcome"] in ("wrong", "error")]

    timeline = [(t - start, pids, downs, redis_ok) for t, pids, downs, redis_ok
                in observer.timeline]
    for fault in faults:
        fault["recovered_after"] = recovery_time(fault, timeline, rows)
    unrecovered = [f for f in faults if f["recovered_after"] is None]
    final = observer.timeline[-1]
    disk_bound = 3 * args.cache_max_bytes + (24 << 20)  # the store + log files (4 MiB x 4)
    checks = {
        "zero wrong results": outcomes.get("wrong", 0) == 0,
        "zero user-visible errors": outcomes.get("error", 0) == 0,
        "every fault recovered": not unrecovered,
        "both kilnd and redis answer at the end": all(p is not None for p in final[1])
        and final[3] and final[2] == [False, False],
        "kilnd memory bounded (< 1 GiB)": observer.max_rss["kilnd"] < 1 << 30,
        "disk bounded": max(observer.max_disk) < disk_bound,
        "graphs compiled, not only run eagerly": outcomes.get("compiled", 0) > 0,
    }
    stats = [{field: getattr(s, field) for field in (
        "hits", "misses", "compiles", "remote_hits", "evictions", "corrupt_records",
        "compactions", "remote_errors", "remote_skipped", "remote_writes",
        "remote_writes_dropped", "entries", "bytes_stored")} if s is not None else None
        for s in observer.stats]
    by_kind = {}
    for f in faults:
        k = by_kind.setdefault(f["kind"], {"count": 0, "recovered": 0, "max_recovery_s": 0.0})
        k["count"] += 1
        if f["recovered_after"] is not None:
            k["recovered"] += 1
            k["max_recovery_s"] = round(max(k["max_recovery_s"], f["recovered_after"]), 2)
    graph_seconds = sorted(r["seconds"] for r in rows)
    return {
        "ok": all(checks.values()), "checks": checks,
        "command": " ".join([sys.executable, *sys.argv]),
        "duration_s": args.duration, "clients": args.clients, "graphs": len(rows),
        "outcomes": outcomes, "bad": bad[:20], "faults": len(faults), "faults_by_kind": by_kind,
        "unrecovered": unrecovered,
        "graph_seconds_p50": graph_seconds[len(graph_seconds) // 2] if rows else None,
        "graph_seconds_p99": graph_seconds[int(len(graph_seconds) * 0.99)] if rows else None,
        "graph_seconds_max": graph_seconds[-1] if rows else None,
        "max_rss_bytes": observer.max_rss, "max_cache_dir_bytes": observer.max_disk,
        "disk_bound_bytes": disk_bound, "kilnd_stats_at_end": stats,
    }


def recovery_time(fault, timeline, rows):
    """Seconds from the end of the fault (the kill, or the SIGCONT) until what it hit works
    again: that kilnd answers; Redis answers and neither kilnd considers it down; that client
    slot finishes a graph. None if it never did."""
    until = fault["until"]
    if "kilnd" in fault:
        for t, pids, _, _ in timeline:
            if t > until and pids[fault["kilnd"]] is not None:
                return round(t - until, 2)
    elif fault["kind"].endswith("redis"):
        for t, pids, downs, redis_ok in timeline:
            if t > until and redis_ok and downs == [False, False]:
                return round(t - until, 2)
    else:
        done = [r["t"] for r in rows if r["slot"] == fault["slot"] and r["t"] > until]
        if done:
            return round(min(done) - until, 2)
    return None


def print_report(report: dict, out: Path) -> None:
    print(f"\nsoak: {report['duration_s']:.0f} s, {report['clients']} clients, "
          f"{report['graphs']} graphs: {report['outcomes']}")
    print(f"  graph time p50 {report['graph_seconds_p50']} s, p99 {report['graph_seconds_p99']}"
          f" s, max {report['graph_seconds_max']} s")
    print(f"  {report['faults']} faults: " + ", ".join(
        f"{k} x{v['count']} ({v['recovered']} recovered, <= {v['max_recovery_s']} s)"
        for k, v in sorted(report["faults_by_kind"].items())))
    print(f"  max RSS: kilnd {report['max_rss_bytes']['kilnd'] / 2**20:.0f} MiB, redis "
          f"{report['max_rss_bytes']['redis'] / 2**20:.0f} MiB; max cache folder "
          f"{max(report['max_cache_dir_bytes']) / 2**20:.1f} MiB "
          f"(bound {report['disk_bound_bytes'] / 2**20:.0f} MiB)")
    print(f"  kilnd stats at end: {report['kilnd_stats_at_end']}")
    for name, held in report["checks"].items():
        print(f"  [{'ok' if held else 'FAILED'}] {name}")
    for r in report["bad"]:
        print(f"  bad: {r}")
    for f in report["unrecovered"]:
        print(f"  unrecovered: {f}")
    print(f"  report: {out / 'report.json'}")


if __name__ == "__main__":
    sys.exit(main())
