"""Filling a fleet's cache before it starts: `python -m kiln warm` runs a script so that its
captures and artifacts are stored (for another CPU ISA: built, not run), `python -m kiln cache
export` writes them into one signed bundle, and `cache import` on a machine that reaches no
kilnd gives a fresh process the stored capture and its artifact: no tracing, no compile. A
tampered bundle, or one signed with another fleet's key, is refused whole."""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest

from kiln.daemon import protocol

if not protocol.available():
    pytest.skip("the kiln.v1 modules are not available", allow_module_level=True)

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import kiln

    class Net(torch.nn.Module):  # its code is this script's: records of its own
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.b(torch.nn.functional.gelu(self.a(x)))

    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        got = kiln.compile(m)(x)
        torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)
    entries = kiln.debug.cache_entries(m)
    print("RESULT " + json.dumps({
        "stored": [e.info.extra.get("stored_capture") is not None for e in entries],
        "artifacts": len(kiln.debug.artifacts()),
        "dynamo": "torch._dynamo" in sys.modules}))
""")


def run(args, env, check=True):
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=300)
    if check:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def result(done):
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture
def fleet(kilnd_cache, tmp_path):
    """The build machine's environment (the kilnd_cache daemon) and a serving machine's: its own
    cache directory, the fleet's MAC key, and no kilnd it could reach."""
    script = tmp_path / "serve.py"
    script.write_text(SCRIPT)
    build = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    build.pop("KILN_STORED_CAPTURES", None)
    serving_dir = tmp_path / "serving"
    serving_dir.mkdir(mode=0o700)
    from kiln.state import STATE

    STATE.daemon.client().ensure_running()  # kilnd makes the (fleet's) MAC key on first start
    key = tmp_path / "fleet.key"
    shutil.copy(kilnd_cache / "mac.key", key)
    key.chmod(0o600)
    serving = dict(build, KILN_CACHE_DIR=str(serving_dir), KILN_MAC_KEY_FILE=str(key),
                   KILN_DAEMON=f"unix://{tmp_path}/no-kilnd-here.sock")
    return script, build, serving, tmp_path


def test_warm_export_import_serves_without_kilnd(fleet):
    script, build, serving, tmp = fleet
    warmed = run(["-m", "kiln", "warm", str(script)], build)
    assert result(warmed)["artifacts"] == 1 and "1 graphs in kilnd's cache" in warmed.stdout
    bundle = tmp / "fleet.bundle"
    exported = run(["-m", "kiln", "cache", "export", str(bundle)], build)
    counts = re.search(r"(\d+) stored captures, (\d+) artifacts", exported.stdout).groups()
    assert int(counts[0]) >= 1 and int(counts[1]) >= 1  # with every other capture of the cache
    # Before the import, the serving machine has nothing and no kilnd: eager, with a warning.
    before = result(run([str(script)], serving))
    assert before["stored"] == [False] and before["artifacts"] == 0
    imported = run(["-m", "kiln", "cache", "import", str(bundle)], serving)
    assert f"{counts[0]} stored captures, {counts[1]} artifacts" in imported.stdout
    after = result(run([str(script)], serving))
    assert after == {"stored": [True], "artifacts": 1, "dynamo": False}


def test_a_tampered_bundle_is_refused_whole(fleet):
    script, build, serving, tmp = fleet
    run(["-m", "kiln", "warm", str(script)], build)
    bundle = tmp / "fleet.bundle"
    run(["-m", "kiln", "cache", "export", str(bundle)], build)
    with tarfile.open(bundle) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar]
    forged = tmp / "forged.bundle"
    with tarfile.open(forged, "w") as tar:
        for info, data in members:
            if info.name.startswith("artifacts/"):
                data = data[:-1] + bytes([data[-1] ^ 1])
            import io
            tar.addfile(info, io.BytesIO(data))
    refused = run(["-m", "kiln", "cache", "import", str(forged)], serving, check=False)
    assert refused.returncode == 1 and "damaged" in refused.stderr
    assert not (tmp / "serving" / "captures").exists() or not any(
        (tmp / "serving" / "captures").glob("??/*"))
    other_key = tmp / "other.key"
    other_key.write_bytes(os.urandom(32))
    other_key.chmod(0o600)
    refused = run(["-m", "kiln", "cache", "import", str(bundle)],
                  dict(serving, KILN_MAC_KEY_FILE=str(other_key)), check=False)
    assert refused.returncode == 1 and "not signed with this fleet's MAC key" in refused.stderr


def test_warm_for_another_cpu_isa_builds_without_running_it(fleet):
    script, build, serving, tmp = fleet
    from kiln.daemon.artifact import cpu_isa

    if cpu_isa() in ("", "x86-64"):
        pytest.skip("needs a CPU above the x86-64 baseline to name another ISA")
    warmed = run(["-m", "kiln", "warm", "--cpu-isa", "x86-64", str(script)], build)
    assert "compiled only" in warmed.stdout
    # A machine of that ISA (this one, told so) installs the capture and runs the artifact.
    fleet_machine = dict(build, KILN_CPU_ISA="x86-64")
    got = result(run([str(script)], fleet_machine))
    assert got["stored"] == [True] and got["artifacts"] == 1
    # On this machine's own ISA that artifact does not load: captured and compiled as usual.
    native = run([str(script)], dict(build, KILN_LOG="cache"))
    assert result(native)["stored"] == [False], native.stderr
