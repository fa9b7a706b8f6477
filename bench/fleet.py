"""A fleet on this machine's loopback, for bench_fleet.py and tests/python/test_fleet.py: one
private Redis (tests/python/kilnd_harness.Redis: a Unix socket in a temporary folder, no
persistence), several kilnd in the foreground (each its own cache directory and socket, all with
--redis on that Redis and one shared MAC key file, mode 0600), and waves of client processes
(fleet_clients.py) started at once against them.

    with Fleet(KILND, daemons=3) as fleet:
        cold = fleet.wave(64)          # a cold cache
        warm = fleet.wave(64)          # the same daemons, warm
        fleet.restart_daemons()
        again = fleet.wave(64)         # new daemon processes on the same cache folders and Redis

A wave's summary (Fleet.wave) has the clients' records, the daemons' counters for that wave (the
Stats RPC: compiles, hits, misses, remote hits, ...; kilnd counts since its start, so a wave's
figures are differences), each artifact key with the daemons that compiled it (those that answered
a client with a compiled, not cached, artifact: the fleet compiles a key once, the daemons that
miss it while another compiles it waiting for that one's artifact), and the wall time from the
fork of the clients until the last one finished.
Everything the fleet started is stopped, and its folder removed, by close() (also on an exception,
Ctrl-C or SIGTERM when used as a context manager)."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "python"))

import kilnd_harness as harness  # noqa: E402

CLIENTS = HERE / "fleet_clients.py"
MODELS = ("small_mlp", "small_cnn")
STATS = ("compiles", "compile_errors", "hits", "misses", "remote_hits", "remote_writes",
         "remote_errors", "remote_skipped", "rejected", "shared_compile_waits",
         "shared_compile_wait_hits")


def percentile(values: List[float], q: float) -> Optional[float]:
    """The q-quantile (nearest rank) of `values`; None when there are none."""
    values = sorted(values)
    if not values:
        return None
    return values[max(0, math.ceil(q * len(values)) - 1)]


class FleetDaemon:
    """One kilnd in the foreground (its stderr in <cache dir>.log), started by start(), which
    returns once it answers Health."""

    def __init__(self, binary: str, root: Path, name: str, redis: str, key: Path,
                 workers: Optional[int]):
        self.binary = binary
        self.cache_dir = root / name
        self.socket = self.cache_dir / "kilnd.sock"
        self.log = root / f"{name}.log"
        self.args = [binary, "--foreground", "--socket", str(self.socket), "--cache-dir",
                     str(self.cache_dir), "--mac-key-file", str(key), "--redis", redis,
                     "--idle-exit", "3600"]  # a safety net: an orphan exits on its own
        if workers:
            self.args += ["--workers", str(workers)]
        self.proc: Optional[subprocess.Popen] = None

    def client(self):
        from kiln.daemon.client import DaemonClient

        return DaemonClient(f"unix://{self.socket}", autostart=False)

    def start(self, timeout: float = 60.0) -> None:
        with open(self.log, "ab") as log:
            # A session of its own: a Ctrl-C reaches the benchmark, which stops kilnd in order.
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kilnd exited with {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            client = self.client()
            try:
                client.health(timeout=1.0)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"kilnd did not answer within {timeout:.0f} s")
                time.sleep(0.1)
            finally:
                client.close()

    def stats(self) -> dict:
        client = self.client()
        try:
            s = client.stats(timeout=30.0)
        finally:
            client.close()
        return {k: getattr(s, k) for k in STATS}

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (kilnd drains), then SIGKILL if it has not exited within `timeout`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Fleet:
    def __init__(self, kilnd: str, daemons: int = 3, workers: Optional[int] = None,
                 client_nice: int = 5, models=MODELS, keep: bool = False):
        self.client_nice = client_nice
        self.models = list(models)
        self.keep = keep
        self.root = harness.short_tmpdir("fleet-")
        self.daemons: List[FleetDaemon] = []
        self.redis = None
        self.waves = 0
        self._zygote: Optional[subprocess.Popen] = None
        try:
            (self.root / "redis").mkdir()
            self.redis = harness.Redis(self.root / "redis")
            self.key = self.root / "fleet.key"
            fd = os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, os.urandom(32))
            os.close(fd)
            self.daemons = [FleetDaemon(kilnd, self.root, f"kilnd{i}", self.redis.address,
                                        self.key, workers) for i in range(daemons)]
            for d in self.daemons:
                d.start()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def redis_available() -> bool:
        return harness.REDIS_SERVER is not None

    def __enter__(self) -> "Fleet":
        self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        signal.signal(signal.SIGTERM, self._previous_sigterm)

    def stats(self) -> List[dict]:
        return [d.stats() for d in self.daemons]

    def add_daemon(self, workers: Optional[int] = None) -> int:
        """Starts one more kilnd on a new, empty cache directory sharing the fleet's Redis and
        key (a new host joining the fleet); returns its index."""
        d = FleetDaemon(self.daemons[0].binary, self.root, f"kilnd{len(self.daemons)}",
                        self.redis.address, self.key, workers)
        d.start()
        self.daemons.append(d)
        return len(self.daemons) - 1

    def restart_daemons(self) -> None:
        for d in self.daemons:
            d.stop()
        for d in self.daemons:
            d.start()

    def wave(self, clients: int, timeout: float = 1800.0,
             daemons: Optional[List[int]] = None) -> dict:
        """Starts `clients` client processes at once, round-robin over the daemons with these
        indices (all by default), waits (at most `timeout` s) for all of them, and returns the
        wave's summary (its daemon_stats: every daemon's)."""
        chosen = [self.daemons[i] for i in daemons] if daemons is not None else self.daemons
        out = self.root / f"wave{self.waves}"
        self.waves += 1
        out.mkdir()
        env = {k: v for k, v in os.environ.items()
               if k not in ("KILN_DAEMON", "KILN_CACHE_DIR", "XDG_RUNTIME_DIR")}
        env["KILN_MAC_KEY_FILE"] = str(self.key)
        env["FLEET_DAEMONS"] = json.dumps([{"socket": str(d.socket),
                                            "cache_dir": str(d.cache_dir),
                                            "index": self.daemons.index(d)}
                                           for d in chosen])
        before = self.stats()
        nice = self.client_nice
        with open(out / "zygote.log", "wb") as log:
            self._zygote = subprocess.Popen(
                [sys.executable, str(CLIENTS), str(out), str(clients), str(timeout),
                 ",".join(self.models)], env=env, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True, preexec_fn=(lambda: os.nice(nice)) if nice else None)
        try:
            stdout, _ = self._zygote.communicate(timeout=timeout + 300)
            status = self._zygote.returncode
        finally:
            self._stop_clients()
        if status != 0:
            raise RuntimeError(f"the client zygote exited with {status}: "
                               f"{(out / 'zygote.log').read_text()[-3000:]}")
        zygote = json.loads(stdout.decode().strip().splitlines()[-1])
        after = self.stats()
        records = [_read_record(out, slot, zygote["exits"].get(str(slot)))
                   for slot in range(clients)]
        return summarize(records, [{k: a[k] - b[k] for k in STATS}
                                   for a, b in zip(after, before)],
                         zygote["finished"] - zygote["started"], self.models)

    def _stop_clients(self) -> None:
        """Kills the zygote and the clients it forked (its process group) unless it ended well,
        which it does only once every client ended."""
        zygote, self._zygote = self._zygote, None
        if zygote is None:
            return
        if zygote.poll() is None or zygote.returncode != 0:
            try:
                os.killpg(zygote.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        zygote.wait()

    def close(self) -> None:
        self._stop_clients()
        for d in self.daemons:
            d.stop()
        if self.redis is not None:
            self.redis.stop()
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _read_record(out: Path, slot: int, exit_status) -> dict:
    try:
        return json.loads((out / f"client-{slot}.json").read_text())
    except (OSError, ValueError):
        try:
            log = (out / f"client-{slot}.log").read_text()[-1500:]
        except OSError:
            log = ""
        return {"slot": slot, "ok": False, "models": {}, "warnings": [],
                "errors": [f"no result (exit status {exit_status}): {log}"]}


def summarize(records: List[dict], stats: List[dict], wall_s: float, models: List[str]) -> dict:
    # artifact key -> {"model", "compiled_by": daemons, "served": clients, the clients' slots
    # and how many of them installed the frame from a stored capture}
    keys = {}
    for r in records:
        for name, m in r["models"].items():
            for a in m["artifacts"]:
                k = keys.setdefault(a["key"], {"model": name, "compiled_by": set(), "served": 0,
                                               "served_compiled": 0, "index_hits": 0,
                                               "slots": [], "from_stored_capture": 0})
                k["served"] += 1
                k["slots"].append(r["slot"])
                k["from_stored_capture"] += bool(m.get("stored_capture"))
                k["index_hits"] += a["index_hit"]
                if not a["cache_hit"]:
                    k["compiled_by"].add(r["daemon"])
                    k["served_compiled"] += 1
    for k in keys.values():
        k["compiled_by"] = sorted(k["compiled_by"])
    first = {name: [r["models"][name]["first_call_s"] for r in records
                    if r["models"].get(name, {}).get("first_call_s") is not None]
             for name in models}
    totals = [sum(r["models"][n]["first_call_s"] for n in models) for r in records
              if all(r["models"].get(n, {}).get("first_call_s") is not None for n in models)]
    compiles = sum(s["compiles"] for s in stats)
    failed = [r for r in records if not r["ok"]]
    return {
        "clients": len(records), "ok": len(records) - len(failed), "failed": len(failed),
        "failures": [{k: r.get(k) for k in ("slot", "daemon", "errors", "warnings")}
                     | {"incorrect": [n for n, m in r["models"].items() if not m["correct"]],
                        "eager": [n for n, m in r["models"].items() if not m["artifacts"]]}
                     for r in failed],
        "correct": sum(all(m["correct"] for m in r["models"].values()) and
                       len(r["models"]) == len(models) for r in records),
        "wall_s": wall_s,
        "distinct_graphs": len(keys), "compiles": compiles,
        "compiles_per_graph": compiles / len(keys) if keys else None,
        "keys": keys, "daemon_stats": stats,
        "first_call_s": {"p50": percentile(totals, 0.5), "p95": percentile(totals, 0.95),
                         **{name: {"p50": percentile(v, 0.5), "p95": percentile(v, 0.95)}
                            for name, v in first.items()}},
        "ready_s": {"p50": percentile([r["ready_s"] for r in records if "ready_s" in r], 0.5),
                    "p95": percentile([r["ready_s"] for r in records if "ready_s" in r], 0.95)},
        "artifacts_compiled": sum(k["served_compiled"] for k in keys.values()),
        "artifacts_cache_hits": sum(k["served"] - k["served_compiled"] for k in keys.values()),
        "artifacts_index_hits": sum(k["index_hits"] for k in keys.values()),
        # (client, model) pairs whose frame was installed from a stored capture, not traced.
        "stored_captures": sum(bool(m.get("stored_capture")) for r in records
                               for m in r["models"].values()),
    }
