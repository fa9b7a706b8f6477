"""A reduced fleet (bench/bench_fleet.py's, through bench/fleet.py): one private Redis, three
kilnd sharing it and one MAC key, and waves of 6 client processes started at once, round-robin
over the three, each compiling an MLP and a small conv net with the "kiln" backend and checking
them against eager: on a cold cache, on the warm cache, and after every kilnd was restarted.

What is asserted is what kiln guarantees. Every client gets kiln's artifacts (no eager fallback,
no warning) and right results, and each graph is compiled exactly once across the fleet: the
kilnd that misses a key first takes its compile lease in Redis, and the others, missing it while
it compiles, wait for its artifact instead of compiling it too (their clients get a hit). Once
the cache is warm no wave compiles anything, whether the daemons are the same processes or new
ones; and on a new host joining the fleet (its kilnd and its clients' cache directory empty),
every frame is installed from the stored captures the fleet keeps in Redis, without tracing."""
import sys
import time

import pytest

from kiln.daemon import protocol
from kiln.state import STATE

import kilnd_harness as harness

sys.path.insert(0, str(harness.REPO / "bench"))
from fleet import MODELS, Fleet  # noqa: E402

KILND = STATE.daemon.settings.kilnd
DAEMONS, CLIENTS = 3, 6


def check_wave(wave: dict, graphs: int) -> None:
    assert wave["failed"] == 0, wave["failures"]
    assert wave["correct"] == CLIENTS
    assert wave["distinct_graphs"] == graphs, "; ".join(
        f"{k[:12]}: {v['model']} for clients {v['slots']} ({v['from_stored_capture']} from "
        f"stored captures), compiled by {v['compiled_by']}" for k, v in wave["keys"].items())
    for key in wave["keys"].values():
        assert key["served"] == CLIENTS  # every client ran this graph's artifact


@pytest.mark.skipif(KILND is None or not protocol.available(),
                    reason="kilnd is not built here (or the kiln.v1 modules are missing)")
@pytest.mark.skipif(not Fleet.redis_available(), reason="redis-server is not installed")
def test_fleet_of_three_kilnd_sharing_redis_compiles_each_graph_exactly_once():
    began = time.monotonic()
    with Fleet(KILND, daemons=DAEMONS) as fleet:
        cold = fleet.wave(CLIENTS, timeout=90)
        warm = fleet.wave(CLIENTS, timeout=60)
        fleet.restart_daemons()
        restarted = fleet.wave(CLIENTS, timeout=60)
        # A new host joins: its kilnd and its clients' cache directory are empty; what the
        # fleet stored (artifacts and stored captures) reaches it through Redis.
        new_host = fleet.wave(CLIENTS, timeout=60, daemons=[fleet.add_daemon()])
    took = time.monotonic() - began
    print(f"\n[figure] cold: {cold['compiles']} compiles for {cold['distinct_graphs']} graphs "
          f"(by daemon: {[s['compiles'] for s in cold['daemon_stats']]}; waits for another's "
          f"compile: {[s['shared_compile_waits'] for s in cold['daemon_stats']]}), "
          f"{cold['wall_s']:.1f} s;"
          f" warm {warm['wall_s']:.1f} s; after a restart {restarted['wall_s']:.1f} s; "
          f"{took:.0f} s in all")

    graphs = len(MODELS)  # each model is one graph (no graph break)
    check_wave(cold, graphs)
    assert cold["compiles"] == graphs, cold["daemon_stats"]  # once across the fleet
    for stats in cold["daemon_stats"]:
        assert stats["compile_errors"] == 0
        # A wait for another kilnd's compile ends with its artifact, never a compile here.
        assert stats["shared_compile_wait_hits"] == stats["shared_compile_waits"]
    for key in cold["keys"].values():
        assert len(key["compiled_by"]) == 1  # one kilnd compiled it; the others served a hit

    for wave in (warm, restarted, new_host):
        check_wave(wave, graphs)
        assert wave["compiles"] == 0, wave["daemon_stats"]
        assert wave["artifacts_compiled"] == 0
        assert set(wave["keys"]) == set(cold["keys"])
        # Every client of a warm fleet installs its frames from stored captures: no tracing.
        assert wave["stored_captures"] == CLIENTS * graphs
    new_kilnd = new_host["daemon_stats"][-1]
    assert new_kilnd["remote_hits"] == graphs  # the artifacts came from the shared tier
    assert took < 150
