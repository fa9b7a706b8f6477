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
import torch

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


# The model on the GPU when there is one, else on the CPU: run by `kiln warm --cuda-arch` on a
# machine without a GPU (or with it hidden), then by a process on the GPU. With "ask" its
# forward asks torch.cuda a question whose answer differs between the two machines.
DEVICE_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import kiln

    ASK = "ask" in sys.argv[1:]
    ASK_CUDNN = "ask-cudnn" in sys.argv[1:]
    BREAK = "break" in sys.argv[1:]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.a(x))
            if BREAK:
                print("between the graphs")  # a graph break: two graphs, a resume function
            y = self.b(h)
            if ASK and torch.cuda.is_available():
                y = y + 1
            if ASK_CUDNN and torch.backends.cudnn.is_available():
                y = y + 1
            return y

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    m = Net().to(device).eval()
    x = torch.randn(3, 16, device=device)
    compiled = kiln.compile(m)
    with torch.no_grad():
        for _ in range(3):
            got = compiled(x)
            torch.testing.assert_close(got, m(x), rtol=1e-4, atol=1e-4)
    entries = kiln.debug.cache_entries(m)
    print("RESULT " + json.dumps({
        "device": device,
        "stored": [e.info.extra.get("stored_capture") is not None for e in entries],
        "artifacts": len(kiln.debug.artifacts()),
        "dynamo": "torch._dynamo" in sys.modules}))
""")


def stored_records(cache_dir):
    from kiln.daemon.capture_store import CaptureStore
    from kiln.daemon.client import read_mac_key

    store = CaptureStore(cache_dir / "captures", read_mac_key(cache_dir / "mac.key"))
    return [entry for key in store.keys() for entry in store.get(key)]


def warm_for_sm_90(fleet, *script_args):
    """`kiln warm --cuda-arch sm_90` of DEVICE_SCRIPT with every GPU hidden: (its RESULT, the
    records it stored)."""
    _, build, _, tmp = fleet
    script = tmp / "device_serve.py"
    script.write_text(DEVICE_SCRIPT)
    no_gpu = dict(build, CUDA_VISIBLE_DEVICES="")
    warmed = run(["-m", "kiln", "warm", "--cuda-arch", "sm_90", str(script), *script_args],
                 no_gpu, check=False)
    if "builds no CUDA kernels" in warmed.stdout + warmed.stderr:
        pytest.skip("kilnd has no NVRTC here")
    assert warmed.returncode == 0, warmed.stdout[-2000:] + warmed.stderr[-3000:]
    got = result(warmed)
    assert got["device"] == "cpu"  # the script ran on the CPU, eagerly, and right (it asserts)
    return warmed, got, script


def test_warm_for_a_gpu_on_a_machine_without_one_stores_that_gpu_s_capture(fleet, kilnd_cache):
    warmed, got, _ = warm_for_sm_90(fleet)
    # Three calls, one capture: later calls whose guards hold run eagerly without capturing.
    assert got["artifacts"] == 1 and got["stored"] == []
    assert "1 graphs in kilnd's cache for sm_90 (compiled only" in warmed.stdout
    (record,) = [r for r in stored_records(kilnd_cache) if r["graph"] is not None and
                 r["graph"]["device"] == "cuda:0"]
    (x_guard,) = [g for g in record["guards"] if g["kind"] == "TENSOR_MATCH"]
    assert x_guard["value"]["device"] == "cuda:0" and " cuda:0 size=(3, 16)" in x_guard["text"]
    assert x_guard["value"]["keys"] == ("DispatchKeySet(CUDA, ADInplaceOrView, AutogradCUDA, "
                                        "AutocastCUDA)")
    from kiln.daemon import artifact as art
    from kiln.daemon.client import read_mac_key
    from kiln.state import STATE

    found = STATE.daemon.client().lookup_key(record["graph"]["artifact"])
    assert found.found
    body = art.verify(found.artifact, read_mac_key(kilnd_cache / "mac.key"),
                      record["graph"]["artifact"])
    assert body.target.cuda_arch == "sm_90" and body.kernel_binary  # a cubin for that GPU


def test_a_process_on_the_cpu_does_not_take_a_capture_made_for_a_gpu(fleet):
    _, build, _, _ = fleet
    _, _, script = warm_for_sm_90(fleet)
    on_cpu = run([str(script)], dict(build, CUDA_VISIBLE_DEVICES="", KILN_LOG="cache"))
    got = result(on_cpu)
    assert got["device"] == "cpu" and got["stored"] == [False] and got["artifacts"] == 1
    assert "device cuda:0 captured, cpu now" in on_cpu.stderr


@pytest.mark.parametrize("question", ["ask", "ask-cudnn"])
def test_a_frame_that_asks_torch_cuda_is_not_captured_for_a_gpu(question, fleet, kilnd_cache):
    before = {r["id"] for r in stored_records(kilnd_cache)}
    warm_for_sm_90(fleet, question)
    # The question's answer here (False) is not the GPU's (True): no record of Net.forward
    # (whose argument is x) answers it. Either the frame is not captured at all (its callees,
    # nn.Linear's forward, whose argument is input, are), or the capture ends before the
    # question, in a resume function that the GPU process captures itself.
    new = [r for r in stored_records(kilnd_cache) if r["id"] not in before]
    assert new
    for r in new:
        tensors = {g["text"].split(" TENSOR_MATCH")[0] for g in r["guards"]
                   if g["kind"] == "TENSOR_MATCH"}
        resumes = [c for c in r["consts"] if isinstance(c, dict) and c.get("resume")]
        assert tensors == {"L['input']"} or (tensors == {"L['x']"} and len(resumes) == 1), r


def test_a_frame_with_a_graph_break_is_stored_for_a_gpu_with_its_resume_function(fleet,
                                                                                 kilnd_cache):
    before = {r["id"] for r in stored_records(kilnd_cache)}
    warmed, got, _ = warm_for_sm_90(fleet, "break")
    assert "between the graphs" in warmed.stdout  # the frame ran here, eagerly, as written
    new = [r for r in stored_records(kilnd_cache) if r["id"] not in before]
    (forward,) = [r for r in new if any(c.get("resume") for c in r["consts"]
                                        if isinstance(c, dict))]
    assert forward["graph"]["device"] == "cuda:0"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_process_installs_the_capture_warmed_without_a_gpu(fleet):
    _, build, _, _ = fleet
    _, _, script = warm_for_sm_90(fleet)
    on_gpu = run([str(script)], dict(build, KILN_LOG="cache"))
    got = result(on_gpu)
    assert got == {"device": "cuda", "stored": [True], "artifacts": 1, "dynamo": False}, \
        on_gpu.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("make", [lambda d: torch.randn(3, 16, device=d),
                                  lambda d: torch.randn(2, 4, device=d, dtype=torch.bfloat16),
                                  lambda d: torch.nn.Parameter(torch.randn(5, device=d))])
def test_a_cpu_tensor_s_stored_metadata_as_the_gpu_s_is_the_gpu_tensor_s(make, monkeypatch):
    from kiln import config
    from kiln.graph import stand_in
    from kiln.stored_capture import _tensor_meta

    monkeypatch.setattr(config, "capture_cpu_as", "cuda:0")
    torch.manual_seed(0)
    cpu = make("cpu")
    torch.manual_seed(0)
    gpu = make("cuda")
    assert stand_in.stored_meta(_tensor_meta(cpu)) == _tensor_meta(gpu)
