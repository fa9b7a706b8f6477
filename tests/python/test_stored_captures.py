"""Stored captures (kiln.stored_capture): a process that meets code another process compiled
installs the stored capture without tracing (no torch._dynamo import, no fake tensors), and
never a stale one: a changed model file, a changed global it read, another torch version, a
different input, a tampered record, objects that were one and are now two all capture again,
and every answer is eager's."""
import functools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kiln.daemon import protocol

if not protocol.available():
    pytest.skip("the kiln.v1 modules are not available", allow_module_level=True)

# The child: imports the model from MODEL_DIR/model.py, compiles it with kiln, checks the first
# call against eager, and prints what kiln did.
CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    if os.environ.get("FAKE_TORCH_VERSION"):
        torch.__version__ = os.environ["FAKE_TORCH_VERSION"]
    import kiln
    if os.environ.get("WARM_FAILS"):  # the first plan built refuses its warm-up's example sizes
        import kiln.backends.kiln_backend as kb
        build, built = kb.build_plan_for, []
        class Refusing:
            def __init__(self, plan):
                self.plan = plan
            def warm(self):
                raise RuntimeError("the example sizes are refused")
            def __call__(self, *args):
                return self.plan(*args)
            def __getattr__(self, name):
                return getattr(self.plan, name)
        def refusing(*args, **kwargs):
            plan = build(*args, **kwargs)
            built.append(plan)
            return Refusing(plan) if len(built) == 1 else plan
        kb.build_plan_for = refusing
    sys.path.insert(0, os.environ["MODEL_DIR"])
    import model
    torch.manual_seed(0)
    m = model.make().eval()
    x = model.example()
    compiled = kiln.compile(m)
    after = os.environ.get("MODEL_AFTER_COMPILE")
    with torch.no_grad():
        if after == "reload":  # new weights written into the same parameters
            m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()})
        elif after == "replace":  # a new parameter object where the old one was
            m.a.weight = torch.nn.Parameter(torch.randn_like(m.a.weight))
        got = compiled(x)
        want = m(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    entries = kiln.debug.cache_entries(type(m).forward.__code__)  # the frame compiled
    from kiln.state import STATE
    resumed = [e for c in list(STATE.compiled_codes) if c.co_name.startswith("__resume_at_")
               for e in kiln.debug.cache_entries(c)]
    report = {
        "stored": [e.info.extra.get("stored_capture") is not None for e in entries],
        "prepared": [e.info.extra.get("prepared_plan", False) for e in entries],
        "prepare_seconds": [sorted(e.info.extra.get("prepare_seconds", {})) for e in entries],
        "prologue_runs": [e.info.compiled_fn.prologue_runs for e in entries],
        "resumes_stored": [e.info.extra.get("stored_capture") is not None for e in resumed],
        "dynamo": "torch._dynamo" in sys.modules,
        "tracer": "kiln.convert_frame" in sys.modules,
        "grpc": "grpc" in sys.modules,
        "artifacts": len(kiln.debug.artifacts()),
        "miss": kiln.debug.explain_miss(m),
    }
    if after == "drop":  # the model dies: does the frame's next capture guard by structure?
        import gc
        code = type(m).forward.__code__
        del compiled, m, entries
        gc.collect()
        report["shared"] = code in STATE.shared_module_codes
    print(json.dumps(report))
""")

MODEL = textwrap.dedent("""
    import functools
    import os
    import torch

    SCALE = float(os.environ.get("MODEL_SCALE", "2.0"))
    WIDTH = int(os.environ.get("MODEL_WIDTH", "16"))
    BREAK = os.environ.get("MODEL_BREAK") == "1"
    SUPER = os.environ.get("MODEL_SUPER") == "1"
    WRAPPER_BREAK = os.environ.get("MODEL_WRAPPER_BREAK") == "1"
    READS_ENV = os.environ.get("MODEL_READS_ENV") == "1"

    def with_defaults(fn):  # a wrapper as transformers puts around forward: fn in a cell
        decorated = os.environ.get("MODEL_DECORATED")
        if decorated not in ("1", "code", "stacked"):
            return fn
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            if decorated == "code" and "x" in fn.__code__.co_varnames:  # as transformers' do
                kwargs = dict(kwargs)
            out = fn(self, *args, **kwargs)
            if WRAPPER_BREAK and out.sum() > 0:  # a break in the closure's own frame
                out = out * 0.5
            return out
        return wrapper

    def outermost(fn):  # a decorator over with_defaults, as torch.no_grad() over a wrapper
        if os.environ.get("MODEL_DECORATED") != "stacked":
            return fn
        @functools.wraps(fn)
        def outer(self, *args, **kwargs):
            return fn(self, *args, **kwargs)
        return outer

    class Settings:  # a config whose attribute lookup calls super(), as transformers' configs do
        aliases = {"factor": "scale"}

        def __init__(self):
            self.scale = SCALE

        def __getattribute__(self, key):
            if key != "aliases" and key in super().__getattribute__("aliases"):
                key = super().__getattribute__("aliases")[key]
            return super().__getattribute__(key)

    class Net(torch.nn.Module):
        def __init__(self, shared=False):
            super().__init__()
            self.a = torch.nn.Linear(WIDTH, WIDTH)
            self.b = self.a if shared else torch.nn.Linear(WIDTH, WIDTH)
            self.norm = torch.nn.LayerNorm(WIDTH)
            self.settings = Settings()

        @outermost
        @with_defaults
        def forward(self, x):
            y = torch.relu(self.a(x)) * SCALE
            if SUPER:  # an inlined method reads its __class__ cell
                y = y * self.settings.factor
            if READS_ENV and os.environ.get("MODEL_SWITCH") is not None:  # at each call
                y = y * float(os.environ["MODEL_SWITCH"])
            if BREAK and y.sum() > 0:  # data-dependent: a graph break, two resume functions
                y = y - 1
            return self.norm(self.b(y) + x)

    def make():
        return Net(shared=os.environ.get("MODEL_SHARED") == "1")

    def example():
        return torch.randn(int(os.environ.get("MODEL_BATCH", "4")), WIDTH)
""")


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path


def _report(script: str, model_dir, **env_extra) -> dict:
    """What `script`, run in a fresh process over MODEL_DIR and the session's kiln cache,
    printed last (one JSON line)."""
    env = dict(os.environ, MODEL_DIR=str(model_dir), PYTHONDONTWRITEBYTECODE="1")
    env.pop("KILN_STORED_CAPTURES", None)
    env.update(env_extra)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_child(model_dir, **env_extra):
    return _report(CHILD, model_dir, **env_extra)


def test_a_fresh_process_installs_the_stored_capture_without_tracing(kilnd_cache, model_dir):
    first = run_child(model_dir)
    assert first["stored"] == [False]  # captured, and stored
    assert first["dynamo"]             # the capture's fake tensors import torch._dynamo
    second = run_child(model_dir)
    assert second["stored"] == [True]
    assert not second["dynamo"]
    assert first["tracer"] and not second["tracer"]  # nor kiln's own tracer imported
    # The record and the artifact came from the cache directory: kilnd was not asked.
    assert not second["grpc"]
    assert second["artifacts"] == 1
    assert second["miss"] is None


# The child for symbolic sizes: calls the model with each batch of BATCHES, checks every answer
# against eager, and prints what kiln did.
CHILD_DYNAMIC = textwrap.dedent("""
    import json, os, sys
    import torch
    import kiln
    kiln.config.specialize_in_background = False
    sys.path.insert(0, os.environ["MODEL_DIR"])
    import model
    if os.environ.get("LOWERING_ASKS_BATCH"):  # as an attention kernel's choice on a GPU does
        from kiln.graph import lowering
        to_ir = lowering.to_ir
        def asking(aten_gm, *args, **kwargs):
            x = next((n.meta["val"] for n in aten_gm.graph.nodes if n.op == "placeholder"
                      and isinstance(getattr(n.meta.get("val"), "shape", [0])[0],
                                     torch.SymInt)), None)
            if x is not None:  # a symbolic graph's
                bool(x.shape[0] != 1)
            return to_ir(aten_gm, *args, **kwargs)
        lowering.to_ir = asking
    torch.manual_seed(0)
    m = model.make().eval()
    compiled = kiln.compile(m)
    with torch.no_grad():
        for b in map(int, os.environ["BATCHES"].split(",")):
            x = torch.randn(b, model.WIDTH)
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
    entries = kiln.debug.cache_entries(type(m).forward.__code__)
    print(json.dumps({
        "stored": [e.info.extra.get("stored_capture") is not None for e in entries],
        "prepared": [e.info.extra.get("prepared_plan", False) for e in entries],
        "symbolic": [bool(a.plan.symbolic) for a in kiln.debug.artifacts()],
        "tracer": "kiln.convert_frame" in sys.modules,
        "dynamo": "torch._dynamo" in sys.modules,
    }))
""")


def run_dynamic(model_dir, batches: str, **env_extra):
    return _report(CHILD_DYNAMIC, model_dir, BATCHES=batches, **env_extra)


def test_a_fresh_process_serves_every_size_from_the_stored_plan_for_every_size(kilnd_cache,
                                                                               model_dir):
    first = run_dynamic(model_dir, "4,6,9")
    assert first["tracer"] and first["symbolic"] == [False, True]  # static, then every size
    # Sizes the first process never saw: one installed entry, its symbolic guards and its plan
    # for every size, and no trace.
    second = run_dynamic(model_dir, "5,12,7,3")
    assert second["stored"] == [True] and second["symbolic"] == [True]
    assert second["prepared"] == [True]  # by kiln.compile, before the first call
    assert not second["tracer"] and not second["dynamo"]
    # A batch of 1 is in the stored symbol's range: the same plan serves it, without a trace.
    third = run_dynamic(model_dir, "1,8")
    assert third["stored"] == [True] and third["symbolic"] == [True]
    assert not third["tracer"]
    # An empty batch is not: captured again (static), answered as eager's.
    fourth = run_dynamic(model_dir, "0")
    assert fourth["tracer"] and not any(fourth["symbolic"])


def test_a_stored_plan_whose_lowering_took_the_batch_as_two_or_more_guards_it(kilnd_cache,
                                                                               model_dir):
    asks = dict(LOWERING_ASKS_BATCH="1")
    first = run_dynamic(model_dir, "4,6,9", **asks)
    assert first["tracer"] and first["symbolic"] == [False, True]
    second = run_dynamic(model_dir, "5,12,7", **asks)
    assert second["stored"] == [True] and not second["tracer"]
    # The plan is not for a batch of 1: the record's guard rejects it, and the call is captured
    # anew and answered as eager's (the child checks every answer).
    third = run_dynamic(model_dir, "1", **asks)
    assert third["tracer"] and third["stored"] == [False], third


# The child for an int input that changes: calls `sized_by(x, n)` with each (batch, n) of CALLS.
CHILD_INT = textwrap.dedent("""
    import json, os, sys
    import torch
    import kiln
    kiln.config.specialize_in_background = False
    sys.path.insert(0, os.environ["MODEL_DIR"])
    import sized
    compiled = kiln.compile(sized.sized_by)
    for call in os.environ["CALLS"].split(";"):
        b, n = map(int, call.split(","))
        x = torch.randn(b, 4, 3)
        torch.testing.assert_close(compiled(x, n), sized.sized_by(x, n))
    entries = kiln.debug.cache_entries(sized.sized_by.__code__)
    print(json.dumps({
        "stored": [e.info.extra.get("stored_capture") is not None for e in entries],
        "symbolic": [bool(a.plan.symbolic) for a in kiln.debug.artifacts()],
        "tracer": "kiln.convert_frame" in sys.modules,
    }))
""")

SIZED = textwrap.dedent("""
    import torch

    def sized_by(x, n):  # a tensor sized by an int argument, as a static cache's max_cache_len
        return x.sum(1, keepdim=True) + torch.zeros(x.shape[0], n, 3)
""")


def run_int(model_dir, calls: str):
    (model_dir / "sized.py").write_text(SIZED)
    return _report(CHILD_INT, model_dir, CALLS=calls)


def test_a_plan_that_takes_an_int_as_a_size_is_stored_and_serves_other_numbers(kilnd_cache,
                                                                              model_dir):
    first = run_int(model_dir, "2,5;3,7;4,9")
    assert first["tracer"] and first["symbolic"] == [False, True]
    # Numbers and batches the first process never saw: the stored plan for every size, its int
    # passed as a carrier's size as in the process that compiled it, and no trace.
    second = run_int(model_dir, "5,6;6,11;3,8")
    assert second["stored"] == [True] and second["symbolic"] == [True]
    assert not second["tracer"]
    # 0 is below the least number the plan was compiled for: the record's guard rejects it, so
    # the call is captured anew (the process that compiled it ran the graph as it is), and
    # answered as eager's.
    third = run_int(model_dir, "3,0")
    assert third["tracer"] and third["stored"] == [False], third


def test_an_installed_capture_watches_its_modules_as_a_traced_one_does(kilnd_cache, model_dir):
    # Whether a frame's next capture guards its modules by structure (its module died) must not
    # depend on how its entry came: processes of one fleet, some tracing and some installing,
    # would otherwise capture the next model through that code differently.
    traced = run_child(model_dir, MODEL_AFTER_COMPILE="drop")
    installed = run_child(model_dir, MODEL_AFTER_COMPILE="drop")
    assert traced["stored"] == [False] and installed["stored"] == [True]
    assert traced["shared"] and installed["shared"]


def test_compile_prepares_the_stored_plan_so_the_first_call_only_checks_guards(
        kilnd_cache, model_dir):
    run_child(model_dir)
    warm = run_child(model_dir)
    assert warm["stored"] == [True] and warm["prepared"] == [True]
    assert warm["prologue_runs"] == [1]  # run by kiln.compile; the first call did not again
    assert not warm["dynamo"]
    # Where the preparation went is kept with the entry (bench_gpu_models reports it).
    assert warm["prepare_seconds"] == [["artifact", "plan", "records", "warm"]]
    off = run_child(model_dir, KILN_PREPARE_STORED="0")
    assert off["stored"] == [True] and off["prepared"] == [False]
    assert off["prepare_seconds"] == [[]]


def test_a_stored_plan_whose_warm_up_fails_is_still_prepared_and_runs_right(kilnd_cache,
                                                                              model_dir):
    # A plan for every size warms up over example sizes its ops may refuse: the plan is built
    # afresh and installed prepared, its first run left to the call (which the child checks).
    run_child(model_dir)
    warm = run_child(model_dir, WARM_FAILS="1")
    assert warm["stored"] == [True] and warm["prepared"] == [True]
    assert not warm["tracer"]


def test_weights_loaded_after_compile_are_the_ones_the_prepared_plan_uses(kilnd_cache, model_dir):
    # The child checks the first call against eager with the new weights: the prepared plan's
    # prologue (bias folds, packed weights) ran on the old ones and must run again.
    run_child(model_dir)
    reloaded = run_child(model_dir, MODEL_AFTER_COMPILE="reload")
    assert reloaded["stored"] == [True] and reloaded["prepared"] == [True]
    assert reloaded["prologue_runs"] == [2]


def test_a_parameter_replaced_after_compile_is_not_served_by_the_prepared_plan(
        kilnd_cache, model_dir):
    run_child(model_dir)
    replaced = run_child(model_dir, MODEL_AFTER_COMPILE="replace")
    assert replaced["stored"] == [True] and replaced["prepared"] == [False]


# kiln.compile prepares over gRPC, then forks: the child inherits the prepared plan and opens a
# channel of its own for a graph it must compile; the parent goes on using kilnd too.
FORK_CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    import kiln
    sys.path.insert(0, os.environ["MODEL_DIR"])
    import model
    from kiln.state import STATE
    torch.manual_seed(0)
    m = model.make().eval()
    compiled = kiln.compile(m)
    assert not STATE.daemon.has_client(), "kiln.compile left a gRPC channel open"

    def run(batch):
        x = torch.randn(batch, model.WIDTH)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
        entries = kiln.debug.cache_entries(type(m).forward.__code__)
        return [bool(e.info.extra.get("prepared_plan")) for e in entries]

    pid = os.fork()
    if pid == 0:
        try:
            prepared = run(4)   # the prepared plan, inherited
            run(5)              # another shape: captured and compiled through kilnd, from here
            print(json.dumps({"child_prepared": prepared}), flush=True)
            os._exit(0)
        except BaseException as e:
            print("child failed:", repr(e), file=sys.stderr, flush=True)
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    run(6)  # the parent compiles through kilnd after the fork as well
    print(json.dumps({"child_status": status}))
""")


def test_a_process_that_forks_after_compile_serves_from_both(kilnd_cache, model_dir):
    # Weights wide enough that the prologue's oneDNN weight reorders run in parallel (OpenMP) when
    # kiln.compile warms the prepared plan: the parent must not be left with a thread team that
    # the child inherits dead, where its first parallel region would wait forever.
    run_child(model_dir, MODEL_WIDTH="1024")  # the stored capture
    env = dict(os.environ, MODEL_DIR=str(model_dir), PYTHONDONTWRITEBYTECODE="1",
               MODEL_WIDTH="1024")
    env.pop("KILN_STORED_CAPTURES", None)
    done = subprocess.run([sys.executable, "-c", FORK_CHILD], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(l) for l in done.stdout.strip().splitlines()]
    assert lines[0] == {"child_prepared": [True]}
    assert lines[-1] == {"child_status": 0}


def test_a_wrapped_forward_is_stored_through_its_closure(kilnd_cache, model_dir):
    # The compiled frame is the wrapper; the forward it calls is reached through its closure
    # cell and has no importable name (Net.forward is the wrapper): bound by path and code.
    assert run_child(model_dir, MODEL_DECORATED="1")["stored"] == [False]
    assert run_child(model_dir, MODEL_DECORATED="1")["stored"] == [True]
    source = (model_dir / "model.py").read_text()
    (model_dir / "model.py").write_text(source.replace("* SCALE", "* SCALE + 1"))
    assert run_child(model_dir, MODEL_DECORATED="1")["stored"] == [False]


def test_a_forward_under_two_decorators_is_stored_through_the_outer_ones_wrapped(
        kilnd_cache, model_dir):
    # Both wrappers are named Net.forward (functools.wraps), a name only the outer one has: the
    # inner one's cell holding the forward is bound through Net.forward.__wrapped__, its code
    # checked (transformers' rotary embeddings: torch.no_grad() over dynamic_rope_update).
    assert run_child(model_dir, MODEL_DECORATED="stacked")["stored"] == [False]
    second = run_child(model_dir, MODEL_DECORATED="stacked")
    assert second["stored"] == [True] and not second["tracer"]
    source = (model_dir / "model.py").read_text()
    (model_dir / "model.py").write_text(source.replace(
        "out = fn(self, *args, **kwargs)", "out = fn(self, *args, **kwargs) * 1.0"))
    assert run_child(model_dir, MODEL_DECORATED="stacked")["stored"] == [False]


def test_a_wrapper_reading_its_functions_code_is_stored(kilnd_cache, model_dir):
    # The capture guards the code object the wrapper reads (func.__code__.co_varnames): named
    # by its path and digest, bound to the live one at installation.
    assert run_child(model_dir, MODEL_DECORATED="code")["stored"] == [False]
    second = run_child(model_dir, MODEL_DECORATED="code")
    assert second["stored"] == [True] and not second["tracer"]


def test_a_method_calling_super_through_its_class_cell_is_stored(kilnd_cache, model_dir):
    # The forward reads an attribute through a __getattribute__ that calls super(): the capture
    # reads that method's __class__ cell (CPython 3.12's super()), which no pinned function holds;
    # it is named as the cell of the method, found by its qualified name at load.
    assert run_child(model_dir, MODEL_SUPER="1")["stored"] == [False]
    assert run_child(model_dir, MODEL_SUPER="1")["stored"] == [True]


def test_a_capture_reading_the_environment_is_installed_where_only_other_variables_differ(
        kilnd_cache, model_dir):
    # The capture guards the variable it read (absent), not the whole environment's keys: a
    # process started with other variables set installs it.
    assert run_child(model_dir, MODEL_READS_ENV="1")["stored"] == [False]
    again = run_child(model_dir, MODEL_READS_ENV="1", SOME_OTHER_SETTING="1")
    assert again["stored"] == [True] and not again["tracer"]
    switched = run_child(model_dir, MODEL_READS_ENV="1", MODEL_SWITCH="3")  # checked vs eager
    assert switched["stored"] == [False]
    assert "MODEL_SWITCH" in switched["miss"]


def test_a_changed_model_file_is_captured_again(kilnd_cache, model_dir):
    run_child(model_dir)
    assert run_child(model_dir)["stored"] == [True]
    source = (model_dir / "model.py").read_text()
    (model_dir / "model.py").write_text(source.replace("torch.relu(", "torch.sigmoid("))
    after = run_child(model_dir)  # the child compares with eager: sigmoid, not relu
    assert after["stored"] == [False]
    assert "no capture stored" in after["miss"]


def test_a_changed_global_fails_a_guard_and_is_captured_again(kilnd_cache, model_dir):
    run_child(model_dir)
    after = run_child(model_dir, MODEL_SCALE="3.0")
    assert after["stored"] == [False]
    assert "SCALE" in after["miss"]


def test_another_torch_version_never_uses_the_stored_capture(kilnd_cache, model_dir):
    run_child(model_dir)
    after = run_child(model_dir, FAKE_TORCH_VERSION="9.9.9")
    assert after["stored"] == [False]


def test_another_input_shape_is_captured_again(kilnd_cache, model_dir):
    run_child(model_dir)
    after = run_child(model_dir, MODEL_BATCH="7")
    assert after["stored"] == [False]
    assert "a guard fails" in after["miss"] or "differs" in after["miss"]
    # Both entries are stored now: either batch installs without tracing. kiln.compile prepares
    # both plans (a generate()'s prefill and decode step are two records of one code); a call
    # of batch 4 fails the newest's guards and installs the other, its plan prepared too, and
    # every answer is eager's.
    seven = run_child(model_dir, MODEL_BATCH="7")
    assert seven["stored"] == [True] and seven["prepared"] == [True]
    four = run_child(model_dir)
    assert four["stored"] == [True] and four["prepared"] == [True]


def test_objects_that_were_one_and_are_now_two_are_captured_again(kilnd_cache, model_dir):
    run_child(model_dir, MODEL_SHARED="1")
    after = run_child(model_dir)  # self.b is no longer self.a
    assert after["stored"] == [False]


def test_a_tampered_record_is_never_installed(kilnd_cache, model_dir):
    run_child(model_dir)
    records = [p for p in (kilnd_cache / "captures").glob("??/*") if p.is_file()]
    tampered = 0
    for path in records:
        tag, _, payload = path.read_bytes().partition(b"\n")
        if b'{"float":"2.0"}' in payload:  # the guard on SCALE, made to accept 3.0
            path.write_bytes(tag + b"\n" + payload.replace(b'{"float":"2.0"}',
                                                           b'{"float":"3.0"}'))
            tampered += 1
    assert tampered
    # The altered file is refused; the genuine record kilnd keeps guards SCALE == 2.0, which
    # fails here: captured again.
    assert run_child(model_dir, MODEL_SCALE="3.0")["stored"] == [False]
    # With SCALE 2.0 the genuine record (kilnd's, written back over the altered file) holds.
    assert run_child(model_dir)["stored"] == [True]


def test_stored_captures_can_be_turned_off(kilnd_cache, model_dir):
    run_child(model_dir)
    assert run_child(model_dir, KILN_STORED_CAPTURES="0")["stored"] == [False]


def test_names_of_objects_resolve_to_the_same_object():
    import torch

    from kiln import stored_capture as sc

    for obj in (torch.relu, torch.nn.Linear, object.__getattribute__, torch.float16,
                torch.nn.functional.linear, sc.capture_key):
        assert sc.decode(sc.encode(obj)) is obj or sc.decode(sc.encode(obj)) == obj
    local_class = type("Local", (), {})
    with pytest.raises(sc.NotStorable):
        sc.encode(local_class())
    for value in (1, -2.5, float("inf"), "s", b"\x00", (1, (2.0, None)), torch.channels_last,
                  torch.device("cpu"), True, None):
        assert sc.decode(sc.encode(value)) == value or value != value


class _Base:
    def method(self):
        return 0


class _Derived(_Base):
    def method(self):  # super(): a __class__ cell holding _Derived
        return super().method() + 1

    @staticmethod
    def helper():
        return 2


def test_a_class_cell_is_found_in_its_class_without_walking_the_heap(monkeypatch):
    import gc

    from kiln import stored_capture as sc

    cell = _Derived.method.__closure__[0]
    assert cell.cell_contents is _Derived
    walked = []
    real = gc.get_referrers
    monkeypatch.setattr(sc.gc, "get_referrers", lambda *a: walked.append(a) or real(*a))
    assert sc._cell_owner(cell) == (_Derived.method, 0)
    assert walked == []

    def outer():
        value = object()

        def inner():
            return value
        return inner

    # Another cell (of a function without an importable name): the heap is searched, no owner.
    assert sc._cell_owner(outer().__closure__[0]) is None
    assert walked


def _outer_decorator(fn):
    @functools.wraps(fn)
    def outer(*args):
        return fn(*args)
    return outer


def _inner_decorator(fn):
    @functools.wraps(fn)
    def inner(*args):
        return fn(*args)
    return inner


@_outer_decorator
@_inner_decorator
def _stacked(x):
    return x + 1


def test_functions_under_an_importable_decorator_are_named_through_wrapped():
    from kiln import stored_capture as sc

    inner, original = _stacked.__wrapped__, _stacked.__wrapped__.__wrapped__
    module = _stacked.__module__
    # Both carry the name _stacked (functools.wraps), which is the outer wrapper's.
    assert sc.name_of(inner) == ["wrapped", module, "_stacked", 1,
                                 sc.code_digest(inner.__code__)]
    assert sc.name_of(original) == ["wrapped", module, "_stacked", 2,
                                    sc.code_digest(original.__code__)]
    assert sc.decode(sc.encode(original)) is original
    assert sc._cell_owner(inner.__closure__[0]) == (inner, 0)  # the cell holding `original`
    # Another function at that place (another decorator, other code) is not the one named.
    name = sc.name_of(inner)
    with pytest.raises(sc.NotInstallable, match="is not the function captured"):
        sc.decode({"object": name[:4] + ["0" * len(name[4])]})
    with pytest.raises(sc.NotInstallable, match="malformed"):
        sc.decode({"object": name[:3] + [99, name[4]]})


def test_a_function_whose_code_changed_is_not_the_function_named():
    from kiln import stored_capture as sc

    def f():
        return 1

    named = ["function", __name__, "helper_function", sc.code_digest(f.__code__)]
    with pytest.raises(sc.NotInstallable):
        sc.decode({"object": named})


def helper_function():
    return 2


# The child under the "compile_in_background" stance: the first call installs the stored
# capture (its plan prepared by kiln.compile) and runs it; nothing is left for the worker.
CHILD_BACKGROUND = textwrap.dedent("""
    import json, os, sys
    import torch
    import kiln
    sys.path.insert(0, os.environ["MODEL_DIR"])
    import model
    torch.manual_seed(0)
    m = model.make().eval()
    compiled = kiln.compile(m)
    code = type(m).forward.__code__
    kiln.set_stance("compile_in_background")
    with torch.no_grad():
        x = model.example()
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
        entries_after_first = len(kiln.debug.cache_entries(code))
        assert kiln.wait_for_compiles(120)
        plans = [a.plan for a in kiln.debug.artifacts()]
        runs_before = [p.prologue_runs for p in plans]
        x = model.example()
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
    entries = kiln.debug.cache_entries(code)
    print(json.dumps({
        "entries_after_first": entries_after_first,
        "stored": [e.info.extra.get("stored_capture") is not None for e in entries],
        "prepared": [e.info.extra.get("prepared_plan", False) for e in entries],
        "prologue_runs": [e.info.compiled_fn.prologue_runs for e in entries],
        "prologue_runs_before_second": runs_before,
        "prologue_runs_after_second": [p.prologue_runs for p in plans],
        "dynamo": "torch._dynamo" in sys.modules,
    }))
""")


def test_in_the_background_stance_a_miss_installs_the_stored_capture_at_once(
        kilnd_cache, model_dir):
    assert run_child(model_dir)["stored"] == [False]  # captured and stored
    got = _report(CHILD_BACKGROUND, model_dir)
    # The first call ran the stored capture (the worker would read the call's arguments only
    # after the call: a decoder's cache has grown by then, and the stored guards fail there).
    assert got["entries_after_first"] == 1
    assert got["stored"] == [True] and got["prepared"] == [True]
    # kiln.compile ran the plan (its prologue included) before any call; no call ran it again.
    assert got["prologue_runs_before_second"] == [1]
    assert got["prologue_runs_after_second"] == [1]
    assert not got["dynamo"]


def test_a_frame_with_a_graph_break_is_stored_with_its_resume_function(kilnd_cache, model_dir):
    first = run_child(model_dir, MODEL_BREAK="1")
    assert first["stored"] == [False] and first["resumes_stored"] == [False]
    second = run_child(model_dir, MODEL_BREAK="1")
    # Both the frame up to the break and the resume function it calls were installed: nothing
    # traced, no torch._dynamo import, and the answers were eager's (checked in the child).
    assert second["stored"] == [True]
    assert second["resumes_stored"] == [True]
    assert not second["dynamo"]
    assert second["miss"] is None
    # The model file changed after the break: the frame's code is another, captured again.
    source = (model_dir / "model.py").read_text()
    (model_dir / "model.py").write_text(source.replace("y = y - 1", "y = y - 2"))
    third = run_child(model_dir, MODEL_BREAK="1")
    assert third["stored"] == [False] and third["resumes_stored"] == [False]


def test_a_closure_with_a_graph_break_is_stored_with_its_resume_function(kilnd_cache,
                                                                         model_dir):
    # The wrapper's frame has a free variable (fn): its resume function runs over the frame's
    # own cell, and is made again from the code by its recipe in the next process.
    env = dict(MODEL_DECORATED="1", MODEL_WRAPPER_BREAK="1")
    first = run_child(model_dir, **env)
    assert first["stored"] == [False] and first["resumes_stored"] == [False]
    second = run_child(model_dir, **env)
    assert second["stored"] == [True] and second["resumes_stored"] == [True]
    assert not second["dynamo"] and second["miss"] is None


def test_a_record_only_kilnd_keeps_is_installed_and_kept_again(kilnd_cache, model_dir):
    """A capture is stored in kilnd too (PutCaptures): a machine whose directory has none (a new
    host of a fleet whose kilnd shares a Redis tier) installs it from kilnd (GetCaptures)."""
    import shutil

    assert run_child(model_dir)["stored"] == [False]
    shutil.rmtree(kilnd_cache / "captures")
    second = run_child(model_dir)
    assert second["stored"] == [True]
    assert not second["dynamo"]
    assert any((kilnd_cache / "captures").glob("??/*"))  # kept in the directory again
    from kiln.state import STATE

    stats = STATE.daemon.client().stats()
    assert stats.capture_records >= 1 and stats.capture_hits >= 1


def test_the_path_table_gives_remembered_paths_the_rows_a_walk_to_the_root_gives():
    # Sources keep their path tuple, so the table knows a shared parent by identity: the rows and
    # indexes are the ones a table that walks every path gets, for paths under shared parents,
    # distinct parents with equal paths, and an item key that is equal to another of other type.
    from kiln.guards.source import AttrSource, ItemSource, LocalSource, ModuleMemberSource
    from kiln.stored_capture import _PathTable

    root = LocalSource(0, "self")
    layer = ModuleMemberSource(ModuleMemberSource(root, "layers", "_modules"), "0", "_modules")
    paths = [AttrSource(layer, "weight"), AttrSource(layer, "bias"),
             ItemSource(AttrSource(LocalSource(0, "self"), "table"), 1),
             ItemSource(AttrSource(LocalSource(0, "self"), "table"), 1.0),
             ItemSource(AttrSource(LocalSource(0, "self"), "table"), True), layer, root]
    assert layer.guard_path() is layer.guard_path()
    walked, remembered = _PathTable(), _PathTable()
    remembered.remember_paths()
    for table in (walked, remembered):
        indexes = [table.add(s.guard_path()) for s in paths + paths]
        assert indexes[:len(paths)] == indexes[len(paths):]
    assert remembered.rows == walked.rows
    assert [remembered.add(s.guard_path()) for s in paths] == \
        [walked.add(s.guard_path()) for s in paths]
    assert len({tuple(map(str, r)) for r in walked.rows}) == len(walked.rows)


STORE_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from kiln.daemon.capture_store import CaptureStore

    root, who, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    store = CaptureStore(root, b"k" * 32)
    for i in range(n):
        store.put("ab" * 32, {"id": f"{who}-{i % 3}", "who": who})
""")


def test_processes_storing_captures_of_one_code_at_once_keep_each_others(tmp_path):
    # Two models whose forward is nn.Sequential's store under one key: each process reads the
    # list, puts its entry first and writes it back, under the directory's lock.
    procs = [subprocess.Popen([sys.executable, "-c", STORE_CHILD, str(tmp_path), who, "60"])
             for who in ("mlp", "cnn")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    from kiln.daemon.capture_store import CaptureStore

    ids = {e["id"] for e in CaptureStore(tmp_path, b"k" * 32).get("ab" * 32)}
    assert ids == {f"{who}-{i}" for who in ("mlp", "cnn") for i in range(3)}


def test_the_same_capture_made_by_two_processes_is_one_record(kilnd_cache, model_dir):
    # Guard texts name objects by address; the record's id leaves addresses out, so a fleet's
    # processes storing one capture replace each other's record instead of filling the list.
    run_child(model_dir, KILN_STORED_CAPTURES="1")
    from kiln.daemon.capture_store import CaptureStore
    from kiln.daemon.client import read_mac_key
    from kiln.stored_capture import _ADDRESS, record_id

    store = CaptureStore(kilnd_cache / "captures", read_mac_key(kilnd_cache / "mac.key"))
    records = [e for k in store.keys() for e in store.get(k) if e.get("graph")]
    entry = {k: v for k, v in records[0].items() if k not in ("id", "made")}
    assert record_id(entry) == records[0]["id"]
    assert any(_ADDRESS.search(g["text"]) for g in entry["guards"])
    elsewhere = dict(entry, guards=[dict(g, text=_ADDRESS.sub(" at 0xdeadbeef", g["text"]))
                                    for g in entry["guards"]])
    assert record_id(elsewhere) == record_id(entry)
    tensor = next(i for i, g in enumerate(entry["guards"]) if g["kind"] == "TENSOR_MATCH")
    other = dict(entry, guards=list(entry["guards"]))
    other["guards"][tensor] = dict(other["guards"][tensor],
                                   value=dict(other["guards"][tensor]["value"], size=[99]))
    assert record_id(other) != record_id(entry)


SEQUENTIALS = textwrap.dedent("""
    import json, sys
    import torch
    import kiln

    torch.manual_seed(0)
    models = {"wide": torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).eval(),
              "narrow": torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()}
    inputs = {"wide": torch.randn(2, 8), "narrow": torch.randn(5, 4)}
    out = {}
    for name in sys.argv[1].split(","):
        m = models[name]
        compiled = kiln.compile(m)
        with torch.no_grad():
            torch.testing.assert_close(compiled(inputs[name]), m(inputs[name]))
        (entry,) = kiln.debug.cache_entries(type(m).forward.__code__)[-1:]
        out[name] = {"stored": entry.info.extra.get("stored_capture") is not None,
                     "prepared": bool(entry.info.extra.get("prepared_plan"))}
    print(json.dumps(out))
""")


def test_compile_prepares_the_record_of_its_own_module_among_others_of_the_same_code(
        kilnd_cache):
    # Both models' forward is nn.Sequential's: one capture key, two records, the newest the
    # narrow one's. kiln.compile of the wide model prepares the wide one's plan.
    def run(order):
        done = subprocess.run([sys.executable, "-c", SEQUENTIALS, order], capture_output=True,
                              text=True, timeout=300,
                              env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run("wide,narrow")
    assert not first["wide"]["stored"] and not first["narrow"]["stored"]
    again = run("wide")
    assert again["wide"] == {"stored": True, "prepared": True}


def _doubled_relu(x):
    return torch.relu(x) * 2


def test_a_capture_that_fails_to_be_stored_warns_and_runs(kilnd_cache, monkeypatch, caplog):
    import logging

    import kiln
    from kiln import stored_capture

    def broken(**kwargs):
        raise RuntimeError("no record today")

    kiln.reset()
    monkeypatch.setattr(kiln.config, "stored_captures", True)
    monkeypatch.setattr(stored_capture, "describe_entry", broken)
    compiled = kiln.compile(_doubled_relu)
    x = torch.randn(4, 3)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        torch.testing.assert_close(compiled(x), _doubled_relu(x))
    assert any("capture not stored (RuntimeError: no record today)" in r.getMessage()
               for r in caplog.records)
    assert len(kiln.debug.cache_entries(_doubled_relu.__code__)) == 1  # compiled all the same
    kiln.reset()
