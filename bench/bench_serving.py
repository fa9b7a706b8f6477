"""Serving with changing shapes: eager vs torch.compile vs kiln, side by side in one process, on
the shapes a server meets rather than one fixed input.

    python bench/bench_serving.py [--workloads bert llm_dynamic llm_static]
        [--compilers eager torch torch_ro kiln] [--device cpu|cuda] [--dtype fp32|bf16]
        [--requests N] [--prompts N] [--max-new-tokens T] [--layers L] [--seed S]
        [--json F] [--csv F]

Workloads (random weights from transformers configs, nothing downloaded; torch.manual_seed):

- bert: a BertModel in eval mode (bert-base on a GPU; 4 layers, hidden 256 on the CPU) serving
  --requests requests of random (batch, sequence) in --batch-range x --seq-range (1..32 x
  16..512), each padded as a tokenizer pads a batch (its attention mask zero past each row's
  random length, one row full).
- llm_dynamic, llm_static: a Llama-style LlamaForCausalLM (8 layers, hidden 1024, bf16 on a GPU;
  2 layers, hidden 256, vocab 1024 on the CPU) decoding greedily with model.generate()
  (--max-new-tokens, no EOS: every request makes them all) over --prompts prompts of random
  length and batch size, with transformers' default dynamic KV cache and with
  cache_implementation="static"; model.forward = compiler(model.forward), as torch.compile users
  do (transformers' own compile of generate is turned off, disable_compile=True, so "eager" is
  eager).

Compilers: eager; torch.compile(model) (dynamic=None, default mode: "torch"); torch.compile
with mode="reduce-overhead" ("torch_ro", on cuda by default; with transformers' static cache,
torch 2.11's dies of a segmentation fault in its cudagraph_trees, and the process with it: run
llm_static there with --compilers eager torch kiln); kiln.compile(model) (the "kiln" backend).
Each has its own copy of the model (same weights). The request list is run twice, and in each
pass every request goes through every compiler before the next request, the compilers'
order rotating from one request to the next: a machine that slows down for a while slows all of
them. Caches start cold (fresh KILN_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR for
the run; each workload starts with kiln.reset() and torch._dynamo.reset()).

Per (workload, compiler), one JSON line and a table row:
- compiles: graphs compiled over the first pass (torch: dynamo's counters["stats"]
  ["unique_graphs"]; kiln: kiln.state.counters["frames"]["ok"], the entries it made), each
  counted in the call that made it; compiles_warm: those made in the second pass (shapes seen
  already); requests_compiling: the first-pass requests that compiled anything.
- eager fallbacks: cache_limit (frames that reached the compiler's cache_size_limit /
  recompile_limit and run eagerly from then on, from its warnings; kiln: also
  kiln.state.STATE.warned_limit), eager_frames (kiln: frames run eagerly for an unsupported
  construct, an internal error or a backend failure, from its log), graph_breaks (torch:
  counters["graph_break"]); kiln: the cache entries of its codes with the most
  (kiln._C.cache_entries), the artifacts kilnd built, and for each plan with size symbols on a
  GPU its CUDA graphs per shape (cuda_graph_shapes: gate, graphs, captures, evictions, bytes).
- total_s: wall time of the first pass's calls, compiles included (first_s: its first request);
  warm_*: the second pass's per-request times (median, p90, sum); llm: tokens_per_s over the
  second pass (tokens = batch x max_new_tokens per request). With --static-baseline N (bert):
  kiln's plan compiled for one shape (dynamic=False) at the first N distinct shapes, beside the
  kiln lane's second-pass time there (static_baseline; warm_vs_static_median, 1.0 = as fast).
- With --warm-process N: a second process on the same kiln cache (its kilnd, stored captures
  and artifacts filled by the first) serves N requests drawn with another seed (shapes the
  first process did not see, as a restarted or scaled-out server meets), each through kiln and
  eager in turn, the order alternating; warm_process: per request kiln's and eager's ms (kiln's
  first call of every shape: guard checks, a stored capture installed, a CUDA graph recorded),
  kiln.compile's own ms (the plan prepared before the first request), and whether kiln traced
  anything; warm_first_excess_ms: kiln's first request over eager's, warm_max_excess_ms: the
  largest such excess. --warm-stance compile_in_background runs that process as a server would
  that must never stall a request: under kiln.set_stance("compile_in_background"), a shape its
  entries do not cover yet installs its stored capture at once where one holds, and otherwise
  runs eagerly at once and is captured on kiln's worker (the default stance, "default",
  captures in the request); given both, one such process runs for each, the second's figures
  under names ending in _compile_in_background. --warm-log FILE appends their stderr there
  (with KILN_LOG=cache: what each installed, and why not).
- correctness, every request of both passes against eager's output for the same request in the
  same pass: bert: largest absolute difference of last_hidden_state and the requests outside the
  tolerance (bench_models.compare: 1e-3 relative and of the largest magnitude in float32, 3e-2
  in bfloat16); llm: requests whose generated token ids differ from eager's (greedy decoding
  turns a rounding difference into a different token now and then: counted, not hidden).
- error: a compiler that raised is reported with the request it failed on and left out of the
  rest of the workload; the other compilers go on. (A crash of the process itself, a signal,
  cannot be contained in one process.)

Ratios: "x eager" and "x torch" are eager's (torch.compile's) time over the compiler's: above 1 is
faster.
"""
import argparse
import copy
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (command_line, emit, environment, first_tensor, stop_kilnd,  # noqa: E402
                    write_csv)

WORKLOADS = ["bert", "llm_dynamic", "llm_static"]
COMPILERS = ["eager", "torch", "torch_ro", "kiln"]
LABELS = {"eager": "eager", "torch": "torch.compile", "torch_ro": "torch.compile(r-o)",
          "kiln": "kiln"}
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


# ---- the workloads: models and their requests ------------------------------------------------


def bert_model(device, dtype, layers):
    from transformers import BertConfig, BertModel

    if device == "cuda":  # bert-base
        config = BertConfig(attn_implementation="sdpa")
    else:
        config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                            intermediate_size=1024, attn_implementation="sdpa")
    if layers:
        config.num_hidden_layers = layers
    return BertModel(config).eval().to(device=device, dtype=dtype), config


def bert_requests(n, batch_range, seq_range, vocab, seed):
    """(input_ids, attention_mask) of `n` requests, on the CPU: random batch and sequence, each
    row's own random length padded to the longest (mask 0 and token 0 past it)."""
    import torch

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        b, s = rng.randint(*batch_range), rng.randint(*seq_range)
        lengths = [s] + [rng.randint(1, s) for _ in range(b - 1)]
        rng.shuffle(lengths)
        mask = (torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]).long()
        ids = torch.randint(1, vocab, (b, s), generator=gen) * mask
        out.append((ids, mask))
    return out


def llama_model(device, dtype, layers):
    from transformers import LlamaConfig, LlamaForCausalLM

    if device == "cuda":
        config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                             num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                             max_position_embeddings=2048)
    else:
        config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                             max_position_embeddings=1024)
    if layers:
        config.num_hidden_layers = layers
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, None, 0
    model = LlamaForCausalLM(config).eval().to(device=device, dtype=dtype)
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = 1, None, 0  # no EOS: every token made
    return model, config


def llm_requests(n, batch_range, prompt_range, vocab, seed):
    """(input_ids, attention_mask) of `n` prompts on the CPU: random batch and length (the rows
    of a batch as long as each other: no padding)."""
    import torch

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        b, s = rng.randint(*batch_range), rng.randint(*prompt_range)
        out.append((torch.randint(2, vocab, (b, s), generator=gen),
                    torch.ones(b, s, dtype=torch.long)))
    return out


# ---- the compilers ----------------------------------------------------------------------------


class Lane:
    """One compiler on one workload: its callable and what it measured."""

    def __init__(self, name):
        self.name = name
        self.run = None  # request -> output (on the device, synchronized by the caller)
        self.error = None
        self.times = {1: [], 2: []}  # pass -> seconds per request
        self.compiles = {1: 0, 2: 0}
        self.traced = {1: 0, 2: 0}  # frames the compiler traced (compiled or not)
        self.requests_compiling = 0
        self.graph_breaks = 0
        self.logs = []  # log records of its calls (kiln's, torch._dynamo's)
        self.max_err = 0.0
        self.mismatches = 0
        self.first_mismatch = None
        self.compared = 0


def compile_counts(name) -> tuple:
    """(graphs compiled, frames traced, graph breaks) so far by `name`'s compiler, from its own
    counters."""
    if name == "kiln":
        from kiln.state import counters

        return counters["frames"]["ok"], counters["frames"]["total"], 0
    if name.startswith("torch"):
        from torch._dynamo.utils import counters

        return (counters["stats"]["unique_graphs"], counters["frames"]["total"],
                sum(counters["graph_break"].values()))
    return 0, 0, 0


def compile_with(name, fn):
    """`fn` (a module or a bound method) compiled by `name`'s compiler."""
    import torch

    if name == "eager":
        return fn
    if name == "torch":
        return torch.compile(fn)
    if name == "torch_ro":
        return _cudagraph_steps(torch.compile(fn, mode="reduce-overhead"))
    if name == "kiln":
        import kiln

        return kiln.compile(fn)
    if name == "kiln_static":  # one shape's plan: the static baseline (--static-baseline)
        import kiln

        return kiln.compile(fn, dynamic=False)
    raise SystemExit(f"unknown compiler {name}")


def _cudagraph_steps(compiled):
    """`compiled` (mode="reduce-overhead") called as torch.compile's documentation tells a loop
    that keeps outputs across calls (generate() keeps the cache and the logits of a step while
    it runs the next): each call a new CUDA graph step, its tensor outputs cloned before the
    next replay overwrites them."""
    import torch

    def clone(value):
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, dict):  # a ModelOutput too: its fields, in place
            for k, v in list(value.items()):
                value[k] = clone(v)
            return value
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(clone(v) for v in value))
        if isinstance(value, (tuple, list)):
            return type(value)(clone(v) for v in value)
        return value

    def step(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        return clone(compiled(*args, **kwargs))

    return step


class Logs(logging.Handler):
    """Every record of kiln's (from INFO: the frames it runs eagerly) and torch._dynamo's (from
    WARNING: the recompile limit) loggers while installed; each call takes its own slice."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []
        self.installed = []

    def emit(self, record):
        if record.name.startswith("kiln") and record.levelno >= logging.INFO or \
                record.levelno >= logging.WARNING:
            self.records.append(record)

    def __enter__(self):
        for name, level in (("kiln", logging.INFO), ("torch._dynamo", logging.WARNING)):
            logger = logging.getLogger(name)
            self.installed.append((logger, logger.level))
            if not logger.isEnabledFor(level):
                logger.setLevel(level)
            logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        for logger, level in self.installed:
            logger.removeHandler(self)
            logger.setLevel(level)


def _sync(device):
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _fx_tracing_per_thread() -> bool:
    """Whether torch.fx's "is tracing" flag is per thread (torch >= 2.12; an older one's is one
    for the process)."""
    from torch.fx import _symbolic_trace

    return hasattr(_symbolic_trace, "_is_fx_tracing_tls")


def run_pass(lanes, requests, device, logs, check, reference, n_pass):
    """Every request through every live lane, the lanes' order rotating by one each request;
    `check(out, ref, lane)` compares a lane's output with eager's for the same request (the eager
    lane's, else `reference(request)`'s)."""
    from bench_models import _error

    live = [l for l in lanes if l.run is not None]
    for i, req in enumerate(requests):
        k = i % len(live) if live else 0
        outs = {}
        for lane in live[k:] + live[:k]:
            if lane.error:
                continue
            before = compile_counts(lane.name)
            mark = len(logs.records)
            try:
                _sync(device)
                t = time.perf_counter()
                outs[lane.name] = lane.run(req)
                if lane.name == "kiln" and not _fx_tracing_per_thread():
                    # This torch's FX tracing flag is one for the process: kiln's background
                    # lowering (make_fx) would make the torch.compile lane's next call refuse
                    # to run ("FX to symbolically trace a dynamo-optimized function"). Its
                    # compiles finish inside kiln's own request instead, and count there.
                    import kiln

                    kiln.wait_for_compiles()
                _sync(device)
                lane.times[n_pass].append(time.perf_counter() - t)
            except Exception as e:
                lane.error = f"pass {n_pass}, request {i}: {_error(e)}"
            compiled, traced, breaks = (y - x for x, y in zip(before, compile_counts(lane.name)))
            lane.compiles[n_pass] += compiled
            lane.traced[n_pass] += traced
            lane.graph_breaks += breaks
            lane.requests_compiling += n_pass == 1 and compiled > 0
            lane.logs += logs.records[mark:]
        compiled = [l for l in live if l.name != "eager" and l.name in outs]
        if not compiled:
            continue
        ref = outs["eager"] if "eager" in outs else reference(req)
        for lane in compiled:
            lane.compared += 1
            why = check(outs[lane.name], ref, lane)
            if why:
                lane.mismatches += 1
                lane.first_mismatch = lane.first_mismatch or f"pass {n_pass}, request {i}: {why}"
        del outs, ref


# ---- one workload -----------------------------------------------------------------------------


def bert_workload(a, dtype):
    import torch

    from bench_models import compare, tolerance

    dt = getattr(torch, DTYPES[dtype])
    torch.manual_seed(a.seed)
    model, config = bert_model(a.device, dt, a.layers)
    reqs = bert_requests(a.requests, a.batch_range, a.seq_range, config.vocab_size, a.seed)
    tol = tolerance(dtype, a.device)

    def runner(m):
        def run(req):
            ids, mask = req
            with torch.no_grad():
                return first_tensor(m(input_ids=ids.to(a.device),
                                      attention_mask=mask.to(a.device)))

        return run

    def make(name):
        return runner(compile_with(name, model if name == "eager" else copy.deepcopy(model)))

    def check(out, ref, lane):
        ok, err, why = compare(out, ref, tol)
        lane.max_err = max(lane.max_err, err or 0.0)
        return why

    shape = {"layers": config.num_hidden_layers, "hidden": config.hidden_size,
             "requests": len(reqs), "batch_range": list(a.batch_range),
             "seq_range": list(a.seq_range),
             "distinct_shapes": len({tuple(ids.shape) for ids, _ in reqs})}
    return make, reqs, check, runner(model), shape


def check_generation(out, ref, tol: float):
    """None when greedy generation `out` = (tokens, per-step logits) agrees with eager's `ref`:
    each row's logits match eager's within `tol` (relative to their largest magnitude) up to the
    first token the two chose differently, and that token was a near tie in eager's own logits
    (within `tol` of its best), which is as far as a rounding difference can change a greedy
    choice; past it the texts differ legitimately and are not compared. Else why not."""
    import torch

    tokens, logits = out
    ref_tokens, ref_logits = ref
    if tokens.shape != ref_tokens.shape or len(logits) != len(ref_logits):
        return f"generated {list(tokens.shape)}, eager {list(ref_tokens.shape)}"
    for row in range(tokens.shape[0]):
        for step in range(tokens.shape[1]):
            got, want = logits[step][row].float(), ref_logits[step][row].float()
            scale = max(want.abs().max().item(), 1.0)
            if tokens[row, step] != ref_tokens[row, step]:
                chosen = want[tokens[row, step]].item()
                if chosen < want.max().item() - tol * scale:
                    return (f"row {row}, new token {step}: chose {tokens[row, step].item()} "
                            f"(eager's logit {chosen:.4g}), eager chose "
                            f"{ref_tokens[row, step].item()} ({want.max().item():.4g})")
                break  # a near tie: the texts part here
            err = (got - want).abs().max().item()
            if not err <= tol * scale:  # also NaN
                return f"row {row}, new token {step}: logits differ by {err:.3g} (scale {scale:.3g})"
    return None


def llm_workload(a, dtype, cache):
    import torch

    from bench_models import tolerance

    dt = getattr(torch, DTYPES[dtype])
    torch.manual_seed(a.seed)
    model, config = llama_model(a.device, dt, a.layers)
    reqs = llm_requests(a.prompts, a.llm_batch_range, a.prompt_range, config.vocab_size, a.seed)
    kwargs = dict(max_new_tokens=a.max_new_tokens, do_sample=False, disable_compile=True)
    if cache == "static":
        kwargs["cache_implementation"] = "static"

    def runner(m):
        def run(req):
            ids, mask = req
            with torch.no_grad():
                out = m.generate(input_ids=ids.to(a.device), attention_mask=mask.to(a.device),
                                 return_dict_in_generate=True, output_logits=True, **kwargs)
            return out.sequences[:, ids.shape[1]:], out.logits

        return run

    def make(name):
        m = model if name == "eager" else copy.deepcopy(model)
        if name != "eager":
            m.forward = compile_with(name, m.forward)
        return runner(m)

    tol = tolerance(dtype, a.device)

    def check(out, ref, lane):
        return check_generation(out, ref, tol)

    shape = {"layers": config.num_hidden_layers, "hidden": config.hidden_size,
             "vocab": config.vocab_size, "requests": len(reqs), "cache": cache,
             "max_new_tokens": a.max_new_tokens, "batch_range": list(a.llm_batch_range),
             "prompt_range": list(a.prompt_range),
             "distinct_shapes": len({tuple(ids.shape) for ids, _ in reqs}),
             "tokens": sum(ids.shape[0] for ids, _ in reqs) * a.max_new_tokens}
    return make, reqs, check, runner(model), shape


def run_workload(a, workload, compilers) -> list:
    import torch

    from bench_models import _error, kiln_log_events

    dtype = a.dtype or ("bf16" if a.device == "cuda" and workload != "bert" else "fp32")
    torch._dynamo.reset()
    if "kiln" in compilers:
        import kiln

        kiln.reset()
    if workload == "bert":
        make, reqs, check, reference, shape = bert_workload(a, dtype)
    else:
        make, reqs, check, reference, shape = llm_workload(a, dtype, workload.split("_")[1])
    print(f"# {workload} ({dtype}): {shape}", flush=True)
    lanes = []
    for name in compilers:
        lane = Lane(name)
        try:
            lane.run = make(name)
        except Exception as e:
            lane.error = f"compile call: {_error(e)}"
        lanes.append(lane)
    with Logs() as logs:
        for n_pass in (1, 2):
            t = time.perf_counter()
            run_pass(lanes, reqs, a.device, logs, check, reference, n_pass)
            print(f"# {workload}: pass {n_pass} took {time.perf_counter() - t:.1f} s", flush=True)
    kiln_codes = kiln_entries() if "kiln" in compilers else None
    baseline = (static_baseline(a, workload, make, reqs, lanes)
                if a.static_baseline and "kiln" in compilers else None)
    tokens_per_request = ([ids.shape[0] * a.max_new_tokens for ids, _ in reqs]
                          if workload != "bert" else None)
    records = []
    for lane in lanes:
        rec = {"bench": "serving", "workload": workload, "compiler": lane.name,
               "label": LABELS[lane.name], "device": a.device, "dtype": dtype, **shape}
        cold, warm = lane.times[1], lane.times[2]
        rec.update(compiles=lane.compiles[1], compiles_warm=lane.compiles[2],
                   traced=lane.traced[1], traced_warm=lane.traced[2],
                   requests_compiling=lane.requests_compiling,
                   requests_done=len(cold), requests_done_warm=len(warm))
        rec.update(times_ms=[round(t * 1e3, 3) for t in cold],
                   warm_times_ms=[round(t * 1e3, 3) for t in warm])
        if cold:
            rec.update(total_s=sum(cold), first_s=cold[0])
        if warm:
            rec.update(warm_total_s=sum(warm), warm_median_ms=statistics.median(warm) * 1e3,
                       warm_p90_ms=p90(warm) * 1e3)
            if tokens_per_request and len(warm) == len(reqs):
                rec["tokens_per_s"] = sum(tokens_per_request) / sum(warm)
        if lane.name != "eager":
            rec.update(compared=lane.compared, mismatches=lane.mismatches,
                       passes=lane.compared > 0 and lane.mismatches == 0 and not lane.error)
            if workload == "bert" and lane.compared:
                rec["max_abs_err"] = lane.max_err
            if lane.first_mismatch:
                rec["first_mismatch"] = lane.first_mismatch
        if lane.name.startswith("torch"):
            limit = [r.getMessage().splitlines() for r in lane.logs
                     if "recompile_limit" in str(r.msg) or "hit config." in str(r.msg)]
            rec.update(graph_breaks=lane.graph_breaks, cache_limit=len(limit),
                       cache_limit_frames=[" ".join(l[:2])[:300] for l in limit][:10])
        if lane.name == "kiln" and not lane.error and a.warm_process:
            for i, stance in enumerate(a.warm_stance):  # the first one's under the plain names
                tail = "" if i == 0 else f"_{stance}"
                rec["warm_process" + tail] = warmed = warm_process(a, workload, stance)
                if warmed.get("requests"):
                    excess = [r["kiln_ms"] - r["eager_ms"] for r in warmed["requests"]]
                    rec.update({f"warm_first_excess_ms{tail}": excess[0],
                                f"warm_max_excess_ms{tail}": max(excess)})
        if lane.name == "kiln" and baseline:
            rec["static_baseline"] = baseline
            rec["warm_vs_static_median"] = statistics.median(
                b["warm_ms"] / b["static_ms"] for b in baseline)
        if lane.name == "kiln":
            events = kiln_log_events(lane.logs)
            rec.update(cache_limit=len(events["cache_limit"]),
                       cache_limit_frames=[e["frame"] for e in events["cache_limit"]][:10],
                       eager_frames=len(events["eager_frames"]),
                       eager_frame_reasons=[f"{e['frame']}: {e['kind']}: {e['reason']}"[:300]
                                            for e in events["eager_frames"]][:10],
                       **kiln_codes)
            if events["warnings"]:  # each once, in the order first said
                rec["warnings"] = list(dict.fromkeys(w[:300] for w in events["warnings"]))[:20]
        if lane.error:
            rec["error"] = lane.error
        records.append(rec)
    add_ratios(records)
    return records


def warm_process(a, workload, stance) -> dict:
    """What a second process on this run's kiln cache measured (--warm-process; the docstring
    says what): its JSON, or {"error": ...}."""
    import json
    import subprocess

    argv = [sys.executable, os.path.abspath(__file__), "--warm-child", workload,
            "--device", a.device, "--seed", str(a.seed + 1), "--requests", str(a.warm_process),
            "--prompts", str(a.warm_process),
            "--batch-range", f"{a.batch_range[0]}..{a.batch_range[1]}",
            "--seq-range", f"{a.seq_range[0]}..{a.seq_range[1]}",
            "--llm-batch-range", f"{a.llm_batch_range[0]}..{a.llm_batch_range[1]}",
            "--prompt-range", f"{a.prompt_range[0]}..{a.prompt_range[1]}",
            "--max-new-tokens", str(a.max_new_tokens), "--warm-stance", stance]
    for flag, value in (("--dtype", a.dtype), ("--layers", a.layers), ("--threads", a.threads)):
        if value:
            argv += [flag, str(value)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "the warm process did not finish in 900 s"}
    if a.warm_log:  # what kiln said in the warm process (KILN_LOG=cache: what it installed)
        with open(a.warm_log, "a") as f:
            f.write(f"# warm process, {workload}, stance {stance}\n{done.stderr}\n")
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"the warm process failed ({done.returncode}): {done.stderr[-500:]}"}
    return json.loads(lines[-1])


def warm_child(a, workload) -> None:
    """--warm-child: kiln and eager side by side on requests this process has not seen, on the
    kiln cache its parent filled; prints one JSON line."""
    import json

    import torch

    import kiln

    dtype = a.dtype or ("bf16" if a.device == "cuda" and workload != "bert" else "fp32")
    background = a.warm_stance != "default"
    if workload == "bert":
        make, reqs, check, _, _ = bert_workload(a, dtype)
    else:
        make, reqs, check, _, _ = llm_workload(a, dtype, workload.split("_")[1])
    # The process's own first use of the device and its BLAS, which neither compiler owes.
    dt = getattr(torch, DTYPES[dtype])
    x = torch.ones(8, 8, device=a.device, dtype=dt)
    (x @ x).sum().item()
    eager = make("eager")
    if background:
        kiln.set_stance(a.warm_stance)
    t = time.perf_counter()
    kiln_run = make("kiln")
    compile_ms = (time.perf_counter() - t) * 1e3
    lane = Lane("kiln")
    out = []
    for i, req in enumerate(reqs):
        ms, results = {}, {}
        for name in (("kiln", "eager") if i % 2 == 0 else ("eager", "kiln")):
            fn = kiln_run if name == "kiln" else eager
            if name == "eager" and background:
                # eager's time is not to share the machine with kiln's worker (kiln's does)
                kiln.wait_for_compiles()
            _sync(a.device)
            t = time.perf_counter()
            results[name] = fn(req)
            _sync(a.device)
            ms[name] = round((time.perf_counter() - t) * 1e3, 3)
        why = check(results["kiln"], results["eager"], lane)
        shape = list(req[0].shape)
        out.append({"shape": shape, "kiln_ms": ms["kiln"], "eager_ms": ms["eager"],
                    **({"mismatch": why} if why else {})})
    from kiln.state import counters

    if background:  # what the worker captured meanwhile is counted too
        kiln.wait_for_compiles()
    print(json.dumps({"requests": out, "compile_ms": round(compile_ms, 3),
                      "stance": a.warm_stance, "traced": counters["frames"]["total"],
                      "tracer": "kiln.convert_frame" in sys.modules}))


def static_baseline(a, workload, make, requests, lanes) -> list:
    """kiln's plan for one shape beside what the kiln lane's second pass took at that shape: for
    the first --static-baseline requests of distinct shapes (BERT), a model compiled with
    dynamic=False, its first call (the compile) untimed, then the median of three calls."""
    import kiln

    if workload != "bert":
        return []
    kiln_lane = next(l for l in lanes if l.name == "kiln")
    out, seen = [], set()
    for i, req in enumerate(requests):
        shape = tuple(req[0].shape)
        if shape in seen or i >= len(kiln_lane.times[2]):
            continue
        seen.add(shape)
        kiln.reset()
        run = make("kiln_static")
        run(req)
        kiln.wait_for_compiles()
        times = []
        for _ in range(3):
            _sync(a.device)
            t = time.perf_counter()
            run(req)
            _sync(a.device)
            times.append(time.perf_counter() - t)
        out.append({"shape": list(shape), "static_ms": statistics.median(times) * 1e3,
                    "warm_ms": kiln_lane.times[2][i] * 1e3})
        if len(out) >= a.static_baseline:
            break
    return out


def kiln_entries() -> dict:
    """kiln's cache entries per code object (the codes with the most first), the codes at
    cache_size_limit (kiln.state.STATE.warned_limit), and what kilnd built."""
    import kiln
    from kiln import _C, config
    from kiln.state import STATE

    per_code = sorted(((len(_C.cache_entries(c)), f"{c.co_qualname}:{c.co_firstlineno}")
                       for c in list(STATE.compiled_codes)), reverse=True)
    arts = kiln.debug.artifacts()
    # Plans with size symbols on a GPU: their graphs per shape (runtime/cuda_graph_shapes.h).
    shapes = [a.plan.cuda_graph_shapes for a in arts
              if getattr(a.plan, "cuda_graph_shapes", None) is not None]
    return {"entries": sum(n for n, _ in per_code),
            "entries_per_code": {name: n for n, name in per_code[:8] if n},
            "cuda_graph_shapes": shapes,
            "cache_size_limit": config.cache_size_limit,
            "cache_limit_codes": len(list(STATE.warned_limit)),
            "artifacts": len(arts), "kilnd_compile_s": sum(x.compile_seconds for x in arts)}


def p90(xs):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def add_ratios(records):
    """Eager's and torch.compile's times over each compiler's (above 1: faster), for the first
    pass's total and the second pass's median; only where both ran every request."""
    by = {r["compiler"]: r for r in records}
    for r in records:
        for base in ("eager", "torch"):
            b = by.get(base)
            if not b or b is r:
                continue
            for key, field in (("total_s", "total"), ("warm_median_ms", "warm_median"),
                               ("warm_total_s", "warm_total")):
                if complete(r) and complete(b) and r.get(key) and b.get(key):
                    r[f"{field}_vs_{base}"] = b[key] / r[key]


def complete(r) -> bool:
    return r.get("requests_done_warm") == r["requests"] and not r.get("error")


# ---- the report -------------------------------------------------------------------------------


def _v(v, width, fmt="x"):
    """A cell: `fmt` a float's format, "x" a ratio's (two significant digits below 1, two
    decimals below 100, none above)."""
    if v is None:
        return f"{'-':>{width}s}"
    if isinstance(v, float):
        if fmt == "x":
            fmt = ".2g" if v < 1 else ".2f" if v < 100 else ".0f"
        return f"{v:>{width}{fmt}}"
    return f"{v!s:>{width}s}"


def print_table(records):
    head = (f"{'workload':12s} {'compiler':18s} {'compiles':>8s} {'warm':>4s} {'limit':>5s}"
            f" {'eagerfr':>7s} {'total s':>8s} {'x eager':>7s} {'x torch':>7s} {'med ms':>8s}"
            f" {'p90 ms':>8s} {'x eager':>7s} {'x torch':>7s} {'tok/s':>8s} {'correct':>9s}")
    print("\n" + head)
    print(f"{'':59s} {'- pass 1, compiles in -':^24s}"
          f" {'------ pass 2, every shape seen ------':^42s}")
    for r in records:
        correct = ("-" if r["compiler"] == "eager" else
                   f"{r['compared'] - r['mismatches']}/{r['compared']}")
        line = (f"{r['workload']:12s} {r['label']:18s} {_v(r['compiles'], 8)}"
                f" {_v(r['compiles_warm'], 4)} {_v(r.get('cache_limit'), 5)}"
                f" {_v(r.get('eager_frames'), 7)} {_v(r.get('total_s'), 8, '.1f')}"
                f" {_v(r.get('total_vs_eager'), 7)} {_v(r.get('total_vs_torch'), 7)}"
                f" {_v(r.get('warm_median_ms'), 8, '.1f')} {_v(r.get('warm_p90_ms'), 8, '.1f')}"
                f" {_v(r.get('warm_median_vs_eager'), 7)} {_v(r.get('warm_median_vs_torch'), 7)}"
                f" {_v(r.get('tokens_per_s'), 8, '.0f')} {correct:>9s}")
        notes = []
        if r.get("error"):
            notes.append(f"error: {r['error'][:200]}")
        if r.get("first_mismatch"):
            notes.append(f"first mismatch: {r['first_mismatch'][:160]}")
        if r.get("cache_limit_frames"):
            notes.append(f"at the limit: {', '.join(r['cache_limit_frames'])[:160]}")
        if r.get("max_abs_err") is not None:
            notes.append(f"max abs err {r['max_abs_err']:.2g}")
        for tail in ("", "_compile_in_background"):
            what = "warm process" + (" (in background)" if tail else "")
            if r.get(f"warm_first_excess_ms{tail}") is not None:
                notes.append(f"{what}: first request {r[f'warm_first_excess_ms{tail}']:+.1f} "
                             f"ms vs eager, worst {r[f'warm_max_excess_ms{tail}']:+.1f} ms")
            elif (r.get(f"warm_process{tail}") or {}).get("error"):
                notes.append(f"{what}: {r[f'warm_process{tail}']['error'][:160]}")
        if r.get("warm_vs_static_median") is not None:
            notes.append(f"{r['warm_vs_static_median']:.2f}x the time of its static plan "
                         f"(median of {len(r['static_baseline'])} shapes)")
        print(line + (f"  [{'; '.join(notes)}]" if notes else ""))
    print("compiles: graphs compiled in pass 1 (warm: in pass 2); limit: frames that reached the "
          "cache size / recompile limit and run eagerly since; eagerfr: kiln's frames run eagerly "
          "otherwise; x eager, x torch: eager's (torch.compile's) time over the compiler's; "
          "correct: requests (both passes) matching eager")


def int_range(text):
    lo, _, hi = text.partition("..")
    lo, hi = int(lo), int(hi or lo)
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{text}: want LO..HI with 1 <= LO <= HI")
    return lo, hi


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=WORKLOADS)
    p.add_argument("--compilers", nargs="+", choices=COMPILERS, default=None,
                   help="default: eager torch kiln, and torch_ro on cuda")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="default: fp32, except bf16 for the LLM on cuda")
    p.add_argument("--layers", type=int, default=None, help="both models' layers (a smaller run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--requests", type=int, default=None, help="BERT requests (200 cuda, 24 cpu)")
    p.add_argument("--batch-range", type=int_range, default=(1, 32), metavar="LO..HI")
    p.add_argument("--seq-range", type=int_range, default=(16, 512), metavar="LO..HI")
    p.add_argument("--prompts", type=int, default=None, help="LLM prompts (16 cuda, 6 cpu)")
    p.add_argument("--llm-batch-range", type=int_range, default=None, metavar="LO..HI",
                   help="default 1..8 cuda, 1..4 cpu")
    p.add_argument("--prompt-range", type=int_range, default=None, metavar="LO..HI",
                   help="default 8..256 cuda, 4..64 cpu")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 64 cuda, 16 cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--static-baseline", type=int, default=0, metavar="N",
                   help="BERT: kiln's static plan for the first N distinct shapes beside the "
                        "kiln lane's second pass at them (warm_vs_static_median)")
    p.add_argument("--warm-process", type=int, default=0, metavar="N",
                   help="a second process on the kiln cache serves N new requests, kiln beside "
                        "eager (warm_process)")
    p.add_argument("--warm-log", metavar="FILE",
                   help="the --warm-process processes' stderr appended here")
    p.add_argument("--warm-stance", nargs="+", choices=("default", "compile_in_background"),
                   default=["default"], help="the kiln stance of the --warm-process process "
                   "(one such process for each; the first one's figures under the plain names, "
                   "the others' with _STANCE appended)")
    p.add_argument("--warm-child", choices=WORKLOADS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help="append each record (JSON lines) here")
    p.add_argument("--csv", default=None)
    a = p.parse_args()
    gpu = a.device == "cuda"
    a.compilers = a.compilers or (["eager", "torch", "torch_ro", "kiln"] if gpu
                                  else ["eager", "torch", "kiln"])
    a.requests = a.requests or (200 if gpu else 24)
    a.prompts = a.prompts or (16 if gpu else 6)
    a.llm_batch_range = a.llm_batch_range or ((1, 8) if gpu else (1, 4))
    a.prompt_range = a.prompt_range or ((8, 256) if gpu else (4, 64))
    a.max_new_tokens = a.max_new_tokens or (64 if gpu else 16)
    if a.warm_child:  # on the parent's cache (KILN_CACHE_DIR) and kilnd
        a.warm_stance = a.warm_stance[0]
        os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if a.threads:
            import torch

            torch.set_num_threads(a.threads)
        warm_child(a, a.warm_child)
        return
    print(f"# {command_line()}", flush=True)

    cache_root = tempfile.mkdtemp(prefix="kiln-bench-serving-")
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                      KILN_CACHE_DIR=os.path.join(cache_root, "kiln"),
                      TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_root, "inductor"),
                      TRITON_CACHE_DIR=os.path.join(cache_root, "triton"))
    os.environ.pop("XDG_RUNTIME_DIR", None)  # kilnd's socket in the fresh cache directory
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    env = environment()
    print(f"# {env}", flush=True)
    records = []
    try:
        for workload in a.workloads:
            for rec in run_workload(a, workload, a.compilers):
                rec.update(command=command_line(), **env)
                emit(rec, a.json)
                records.append(rec)
    finally:
        stop_kilnd(os.path.join(cache_root, "kiln"))
        shutil.rmtree(cache_root, ignore_errors=True)
    print_table(records)
    if a.csv:
        write_csv(records, a.csv)
        print(f"# csv {a.csv}")


if __name__ == "__main__":
    main()
