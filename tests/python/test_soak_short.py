"""A short run of the kilnd soak (tests/soak/soak.py): client processes compiling through two
kilnd that share a Redis while kilnd, Redis and clients are killed and stopped at random. The
soak checks, and this test requires, zero wrong results, zero user-visible errors, every fault
recovered, memory and disk bounded. The 10-minute, 64-client run is the same script without
arguments."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.daemon import protocol
from kiln.state import STATE

import kilnd_harness as harness

SOAK = harness.REPO / "tests" / "soak" / "soak.py"


@pytest.mark.skipif(STATE.daemon.settings.kilnd is None or harness.REDIS_SERVER is None
                    or not protocol.available(), reason="kilnd or redis-server missing")
def test_short_soak_under_random_kills_and_stops_gives_no_wrong_result_and_no_error(tmp_path):
    done = subprocess.run([sys.executable, str(SOAK), "--duration", "40", "--clients", "8",
                           "--fault-every", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    report_file = Path(tmp_path) / "report.json"
    assert report_file.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_file.read_text())
    print(done.stdout[-2500:])
    assert report["checks"]["zero wrong results"], report["bad"]
    assert report["checks"]["zero user-visible errors"], report["bad"]
    assert report["checks"]["every fault recovered"], report["unrecovered"]
    assert report["faults"] >= 5  # gaps of at most 4 s from 5 s to 8 s before the end
    assert report["ok"], report["checks"]
    assert done.returncode == 0
