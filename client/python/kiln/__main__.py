"""kiln's command line:
  python -m kiln demo                     compile resnet18, compare with eager
  python -m kiln warm [--cpu-isa ISA | --cuda-arch SM] [--export BUNDLE] SCRIPT [ARGS...]
                                          run SCRIPT so that its captures and artifacts are
                                          stored (for another CPU ISA, or with its CPU tensors
                                          captured as a GPU's: compiled, not run here)
  python -m kiln cache export BUNDLE      the stored captures and their artifacts, signed
  python -m kiln cache import BUNDLE      checked and added to this machine's cache"""
import argparse
import statistics
import sys
import time


def _median_ms(fn, iters):
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def demo(args):
    import torch
    import torchvision

    import kiln

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(args.batch, 3, 128, 128)
    backend = args.backend or kiln.config.default_backend
    print(f"kiln demo: torchvision resnet18, random weights, input {tuple(x.shape)}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, backend "
          f"{backend!r}{' (the default)' if args.backend is None else ''}")
    compiled = kiln.compile(model, backend=args.backend)  # None: kiln.config.default_backend
    with torch.no_grad():
        t = time.perf_counter()
        out = compiled(x)
        first_s = time.perf_counter() - t
        ref = model(x)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        eager_ms = _median_ms(lambda: model(x), args.iters)
        kiln_ms = _median_ms(lambda: compiled(x), args.iters)
    entries = kiln.debug.cache_entries(model)
    print(f"  first call (capture + compile): {first_s * 1e3:8.1f} ms")
    print(f"  eager:                          {eager_ms:8.2f} ms")
    print(f"  kiln:                           {kiln_ms:8.2f} ms   ({eager_ms / kiln_ms:.2f}x)")
    print("  result matches eager (rtol 1e-4)")
    for e in entries:
        info = e.info
        print(f"  entry {info.name}: {info.op_count} ops, {len(e.guards)} guards, capture "
              f"{info.capture_seconds * 1e3:.1f} ms, backend {info.backend_seconds * 1e3:.1f} ms")
        for g in e.guards[:3]:
            print(f"    guard: {g}")
        if len(e.guards) > 3:
            print(f"    ... {len(e.guards) - 3} more guards")
    if not entries:
        print("  no entries: the model ran eagerly (see KILN_LOG=all)")
        return 1
    for a in kiln.debug.artifacts(model):
        where = ("hit in the client's index and kilnd's cache: nothing lowered or compiled"
                 if a.index_hit else "kilnd cache hit" if a.cache_hit
                 else f"compiled by kilnd in {a.compile_seconds:.2f} s")
        print(f"  artifact {a.key[:16]}: {a.plan.num_kernels} fused kernels, "
              f"{a.plan.num_library_calls} library calls; {where}; loaded in "
              f"{a.client_seconds * 1e3:.1f} ms")
    if backend == "kiln" and not kiln.debug.artifacts(model):
        print("  the kiln backend ran the graph eagerly (see the warning above)")
    return 0


def warm(args):
    """Runs SCRIPT as __main__ with kiln's stored captures on: every frame it compiles with the
    "kiln" backend leaves a stored capture and an artifact in kilnd's cache. With --cpu-isa
    other than this machine's, kilnd builds for that ISA and the graphs run eagerly here. With
    --cuda-arch, SCRIPT runs its model on the CPU and kiln captures the CPU tensors as tensors
    of GPU 0 of that architecture (kiln.graph.stand_in): the records and artifacts are a GPU
    process's, and the frames run eagerly here."""
    import os
    import re
    import runpy

    from kiln.daemon.artifact import cpu_isa

    if args.cuda_arch and args.cpu_isa:
        print("kiln warm: --cuda-arch and --cpu-isa name two targets: give one",
              file=sys.stderr)
        return 2
    if args.cuda_arch:
        if not re.fullmatch(r"sm_[0-9]{2,3}[a-z]?", args.cuda_arch):
            print(f"kiln warm: --cuda-arch {args.cuda_arch!r} is not an architecture such as "
                  "sm_90", file=sys.stderr)
            return 2
        os.environ["KILN_CAPTURE_CPU_AS"] = "cuda:0"
        os.environ["KILN_CUDA_ARCH"] = args.cuda_arch
        os.environ["KILN_COMPILE_ONLY"] = "1"
    elif args.cpu_isa:
        native = cpu_isa()
        os.environ["KILN_CPU_ISA"] = args.cpu_isa
        if args.cpu_isa != native:
            os.environ["KILN_COMPILE_ONLY"] = "1"
        cpu_isa.cache_clear()  # read again, with the override
    os.environ.pop("KILN_STORED_CAPTURES", None)
    import kiln

    kiln.config.stored_captures = True
    kiln.config.compile_only = os.environ.get("KILN_COMPILE_ONLY") == "1"
    kiln.config.capture_cpu_as = os.environ.get("KILN_CAPTURE_CPU_AS") or None
    kiln.config.cuda_arch = os.environ.get("KILN_CUDA_ARCH") or None
    sys.argv = [args.script, *args.args]
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            print(f"kiln warm: {args.script} exited with {e.code}", file=sys.stderr)
            return 1
    kiln.wait_for_compiles()
    arts = kiln.debug.artifacts()
    target = args.cuda_arch or os.environ.get("KILN_CPU_ISA") or cpu_isa()
    print(f"kiln warm: {len(arts)} graphs in kilnd's cache for {target}"
          f"{' (compiled only: not runnable here)' if kiln.config.compile_only else ''}")
    if args.export:
        return cache(argparse.Namespace(action="export", bundle=args.export))
    return 0


def cache(args):
    from kiln.cache_bundle import BundleError, export_bundle, import_bundle
    from kiln.daemon.client import DaemonUnavailable
    from kiln.state import STATE

    settings = STATE.daemon.settings
    try:
        if args.action == "export":
            counts = export_bundle(settings, args.bundle)
            print(f"kiln cache export: {counts['captures']} stored captures, "
                  f"{counts['artifacts']} artifacts -> {args.bundle}")
            if counts["missing_artifacts"]:
                print(f"  {len(counts['missing_artifacts'])} artifacts named by captures were "
                      "not in kilnd's cache (those captures will load nothing)", file=sys.stderr)
        else:
            counts = import_bundle(settings, args.bundle)
            print(f"kiln cache import: {counts['captures']} stored captures, "
                  f"{counts['artifacts']} artifacts into {settings.cache_dir}")
    except (BundleError, DaemonUnavailable, OSError) as e:
        print(f"kiln cache {args.action}: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kiln")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="compile resnet18 and compare with eager")
    d.add_argument("--batch", type=int, default=8)
    d.add_argument("--iters", type=int, default=10)
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--backend", default=None, help="default: kiln.config.default_backend")
    w = sub.add_parser("warm", help="run a script to store its captures and artifacts")
    w.add_argument("--cpu-isa", default=None,
                   help="x86-64 level to build for (x86-64, x86-64-v2/v3/v4); default: this CPU's")
    w.add_argument("--cuda-arch", default=None, metavar="SM",
                   help="capture for GPU 0 of this architecture (sm_90), the model's tensors "
                        "on this machine's CPU standing for its own")
    w.add_argument("--export", default=None, metavar="BUNDLE",
                   help="then write the cache bundle (as `cache export`)")
    w.add_argument("script")
    w.add_argument("args", nargs=argparse.REMAINDER)
    c = sub.add_parser("cache", help="export or import a signed cache bundle")
    c.add_argument("action", choices=("export", "import"))
    c.add_argument("bundle")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args)
    if args.command == "warm":
        return warm(args)
    if args.command == "cache":
        return cache(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
