"""torch.compile(model, backend="kiln"): torch's own Dynamo capture, kiln's compiler and cache.
Fresh interpreters that never import kiln find the backend through the package's metadata (the
entry point scripts/venv.sh writes); the graphs are compiled by a real kilnd, and a second
process is served from its cache. Behaviour of the backend callable itself (training, in-place
updates, dynamic sizes, fallback) is checked in this process."""
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kiln
from kiln.backends import torch_compile
from kiln.state import STATE

REPO = Path(__file__).resolve().parents[2]


def write_dist_info(site: Path) -> None:
    """What scripts/venv.sh writes into every environment it sets up (kiln_dist_info)."""
    subprocess.run(["bash", "-c", '. scripts/venv.sh && kiln_dist_info "$1"', "_", str(site)],
                   cwd=REPO, env={**os.environ, "root": str(REPO)}, check=True, timeout=60)


@pytest.fixture(scope="module")
def dist_info(tmp_path_factory) -> Path:
    """A folder with kiln's metadata: on a fresh interpreter's path beside this tree's package,
    kiln is found as an installed one is."""
    site = tmp_path_factory.mktemp("site")
    write_dist_info(site)
    return site


def run_fresh(dist_info: Path, script: str) -> dict:
    """Runs `script` in a new interpreter with this process's environment (its kilnd settings
    included) and `dist_info` on the path; the JSON object of its last line of output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "client" / "python"), str(dist_info)] +
        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_torch_lists_kiln_among_its_backends_without_importing_it(dist_info):
    result = run_fresh(dist_info, """
        import json, sys
        import torch
        print(json.dumps({"backends": torch._dynamo.list_backends(),
                          "imported": "kiln" in sys.modules}))
    """)
    assert "kiln" in result["backends"]
    assert not result["imported"]  # listing reads metadata only


def test_setup_writes_the_entry_point_into_the_tree_environments():
    """What setup leaves in the tree's environments (.venv, .venv312, .venv-latest), run from
    one of them as `make test` does."""
    if Path(sys.prefix).resolve().parent != REPO.resolve():
        pytest.skip(f"not one of this tree's environments ({sys.prefix})")
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")}
    assert found.get("kiln") == "kiln.backends.torch_compile:backend"


# An MLP, a small conv net and a function with a data-dependent branch (a graph break), with
# sizes no other test compiles, so that kilnd's counters are this file's own.
PROGRAMS = """
    import json, sys
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(24, 40)
            self.l2 = torch.nn.Linear(40, 12)

        def forward(self, x):
            return self.l2(torch.nn.functional.gelu(self.l1(x)))

    class ConvNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 6, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(6)
            self.c2 = torch.nn.Conv2d(6, 10, 3)
            self.fc = torch.nn.Linear(10, 7)

        def forward(self, x):
            x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
            return self.fc(torch.relu(self.c2(x)).mean(dim=(2, 3)))

    def with_graph_break(x):
        y = torch.tanh(x) * 3
        if y.sum() > 0:  # data-dependent: Dynamo breaks the graph here
            return torch.sigmoid(y) + x
        return torch.relu(y) - x

    torch.manual_seed(0)
    mlp, conv = Mlp().eval(), ConvNet().eval()
    conv.bn.running_mean.uniform_(-1, 1)
    conv.bn.running_var.uniform_(0.5, 2)
    programs = {"mlp": (mlp, (5, 24)), "conv": (conv, (2, 3, 14, 14)),
                "graph_break": (with_graph_break, (6, 11))}
    imported_before = "kiln" in sys.modules
    graphs = {}
    for name, (fn, shape) in programs.items():
        compiled = torch.compile(fn, backend="kiln")  # torch imports kiln here
        artifacts = sys.modules["kiln"].debug.artifacts
        before = len(artifacts())
        with torch.no_grad():
            for _ in range(4):
                x = torch.randn(*shape)
                torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-4)
        graphs[name] = len(artifacts()) - before
    arts = artifacts()
    print(json.dumps({"imported_before": imported_before, "graphs": graphs,
                      "keys": sorted(a.key for a in arts),
                      "compiled": sorted(a.key for a in arts if not a.cache_hit)}))
"""


def test_fresh_processes_compile_through_kilnd_then_hit_its_cache(kilnd_cache, dist_info):
    client = STATE.daemon.client()
    client.ensure_running()
    before = client.stats()
    first = run_fresh(dist_info, PROGRAMS)
    after_first = client.stats()
    second = run_fresh(dist_info, PROGRAMS)
    after_second = client.stats()

    assert not first["imported_before"]  # torch imported kiln through the entry point
    # Every program ran compiled plans (the graph break: the graph before it and a branch's).
    assert first["graphs"]["mlp"] >= 1 and first["graphs"]["conv"] >= 1, first
    assert first["graphs"]["graph_break"] >= 2, first
    assert first["compiled"], "kilnd compiled nothing: the graphs were served from elsewhere"
    assert after_first.compiles - before.compiles == len(set(first["compiled"]))
    # A new process gets the same artifacts without a compile (from kilnd's cache, or from the
    # cache directory, where the client keeps what the kilnd it started built).
    assert second["keys"] == first["keys"]
    assert second["compiled"] == []
    assert after_second.compiles == after_first.compiles
    assert after_second.misses == after_first.misses


# -- the backend callable, in this process ------------------------------------------------------

@pytest.fixture
def fresh_torch(kilnd_cache):
    torch._dynamo.reset()
    kiln.reset()
    yield
    torch._dynamo.reset()


def compile_with_kiln(fn, **kwargs):
    return torch.compile(fn, backend=torch_compile.backend, **kwargs)


@torch.library.custom_op("kiln_tests::running_product", mutates_args=())
def _running_product(x: torch.Tensor) -> torch.Tensor:
    return torch.cumprod(x, dim=0)


@_running_product.register_fake
def _running_product_fake(x):
    return torch.empty_like(x)


def test_graph_kiln_cannot_compile_runs_eagerly_with_one_warning(fresh_torch, caplog):
    def running_product(x):
        # kilnd admits aten ops only (any functional one is a library call): a custom op's
        # graph is refused.
        return _running_product(x) * 2

    compiled = compile_with_kiln(running_product)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(3):
            x = torch.randn(9)
            torch.testing.assert_close(compiled(x), running_product(x))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "eagerly" in warnings[0], warnings
    assert kiln.debug.artifacts() == []


def test_training_graph_compiles_forward_and_backward_and_gradients_match_eager(fresh_torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 18), torch.nn.LayerNorm(18),
                                torch.nn.GELU(), torch.nn.Linear(18, 3))
    x = torch.randn(4, 10)
    loss = compile_with_kiln(model)(x).square().sum()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(x).square().sum()
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-4)
    for got, p in zip(grads, model.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-4)
    assert len(kiln.debug.artifacts()) == 2  # the forward graph and the backward graph


def test_in_place_update_of_an_input_is_applied_and_the_graph_compiles(fresh_torch):
    def running_mean(x, mean):
        mean.mul_(0.9).add_(x, alpha=0.1)
        return torch.relu(mean) * 2

    x, mean = torch.randn(5, 7), torch.randn(5, 7)
    mean_eager = mean.clone()
    out = compile_with_kiln(running_mean)(x, mean)
    torch.testing.assert_close(out, running_mean(x, mean_eager))
    torch.testing.assert_close(mean, mean_eager)
    assert len(kiln.debug.artifacts()) == 1


def test_dynamic_graph_is_specialised_for_each_size_it_is_called_again_with(fresh_torch,
                                                                            monkeypatch):
    monkeypatch.setattr(kiln.config, "specialize_after", 2)

    def f(x):
        return torch.softmax(x * x.shape[0], dim=-1)

    compiled = compile_with_kiln(f, dynamic=True)
    for rows in (3, 5, 3, 8, 5, 3):
        x = torch.randn(rows, 6)
        torch.testing.assert_close(compiled(x), f(x))
    assert kiln.wait_for_compiles(timeout=120)
    # 3 and 5 on their second call; 8, called once, ran with PyTorch's kernels
    assert len(kiln.debug.artifacts()) == 2


def test_dynamic_graph_specialised_on_first_sight_when_asked(fresh_torch, monkeypatch):
    monkeypatch.setattr(kiln.config, "specialize_after", 1)

    def f(x):
        return torch.softmax(x * x.shape[0], dim=-1)

    compiled = compile_with_kiln(f, dynamic=True)
    for rows in (3, 5, 3, 8):
        x = torch.randn(rows, 6)
        torch.testing.assert_close(compiled(x), f(x))
    assert kiln.wait_for_compiles(timeout=120)
    assert len(kiln.debug.artifacts()) == 3  # one per size; the second call of 3 reuses its own


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_inference_graph_is_compiled_for_the_gpu(fresh_torch):
    from kiln.daemon import protocol

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.ReLU(),
                                torch.nn.Linear(48, 8)).cuda().eval()
    compiled = compile_with_kiln(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 16, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)
    cuda = STATE.daemon.client().compiler_version_for(protocol.messages().graph.DEVICE_KIND_CUDA)
    if "no-nvrtc" not in (cuda or "no-nvrtc"):  # a kilnd that builds CUDA kernels: compiled
        assert kiln.debug.artifacts(), "kilnd builds CUDA kernels, yet the graph ran eagerly"


def test_metadata_is_rewritten_in_place_and_replaces_older_kiln_metadata(tmp_path):
    (tmp_path / "kiln-0.1.dist-info").mkdir()
    (tmp_path / "kiln_extra-1.0.dist-info").mkdir()  # another distribution: left alone
    for _ in range(2):
        write_dist_info(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kiln-0+dev.dist-info",
                                                           "kiln_extra-1.0.dist-info"]
    info = tmp_path / "kiln-0+dev.dist-info"
    assert "kiln = kiln.backends.torch_compile:backend" in (info / "entry_points.txt").read_text()
    assert json.loads((info / "direct_url.json").read_text()) == {
        "url": f"file://{REPO}/client/python", "dir_info": {"editable": True}}
