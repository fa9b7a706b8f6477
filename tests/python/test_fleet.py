"""A reduced fleet (bench/bench_fleet.py's, through bench/fleet.py): one private Redis, three
kilnd sharing it and one MAC key, and waves of 6 client processes started at once, round-robin
over the three, each compiling an MLP and a small conv net with the "kiln" backend and checking
them against eager: on a cold cache, on the warm cache, and after every kilnd was restarted.

What is asserted is what kiln guarantees. Every client gets kiln's artifacts (no eager fallback,
no warning) and right results, and no graph is compiled twice by one kilnd. Across kilnd, a graph
is compiled once only when one daemon's compile ends before another daemon misses the same key:
each kilnd knows only its own compiles in flight (Redis is read before a compile and written after
it), so two kilnd that miss a key at once both compile it; the cold wave's compiles are therefore
bounded by (daemons x graphs), not equal to the graphs. Once the cache is warm no wave compiles
anything, whether the daemons are the same processes or new ones."""
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
    assert wave["distinct_graphs"] == graphs, wave["keys"]
    for key in wave["keys"].values():
        assert key["served"] == CLIENTS  # every client ran this graph's artifact


@pytest.mark.skipif(KILND is None or not protocol.available(),
                    reason="kilnd is not built here (or the kiln.v1 modules are missing)")
@pytest.mark.skipif(not Fleet.redis_available(), reason="redis-server is not installed")
def test_fleet_of_three_kilnd_sharing_redis_compiles_each_graph_at_most_once_per_daemon():
    began = time.monotonic()
    with Fleet(KILND, daemons=DAEMONS) as fleet:
        cold = fleet.wave(CLIENTS, timeout=90)
        warm = fleet.wave(CLIENTS, timeout=60)
        fleet.restart_daemons()
        restarted = fleet.wave(CLIENTS, timeout=60)
    took = time.monotonic() - began
    print(f"\n[figure] cold: {cold['compiles']} compiles for {cold['distinct_graphs']} graphs "
          f"(by daemon: {[s['compiles'] for s in cold['daemon_stats']]}), {cold['wall_s']:.1f} s;"
          f" warm {warm['wall_s']:.1f} s; after a restart {restarted['wall_s']:.1f} s; "
          f"{took:.0f} s in all")

    graphs = len(MODELS)  # each model is one graph (no graph break)
    check_wave(cold, graphs)
    assert graphs <= cold["compiles"] <= DAEMONS * graphs
    for stats in cold["daemon_stats"]:  # one compile per key however many clients ask
        assert stats["compiles"] <= graphs
        assert stats["compile_errors"] == 0
    for key in cold["keys"].values():
        assert key["compiled_by"]  # some kilnd compiled it; the others were served a hit
    assert sum(len(k["compiled_by"]) for k in cold["keys"].values()) == cold["compiles"]

    for wave in (warm, restarted):
        check_wave(wave, graphs)
        assert wave["compiles"] == 0, wave["daemon_stats"]
        assert wave["artifacts_compiled"] == 0
        assert set(wave["keys"]) == set(cold["keys"])
    assert took < 120
