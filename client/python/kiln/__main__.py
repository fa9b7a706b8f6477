"""`python -m kiln demo`: compiles torchvision's resnet18 (random weights) with kiln and prints
eager vs compiled time and what was captured."""
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kiln")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="compile resnet18 and compare with eager")
    d.add_argument("--batch", type=int, default=8)
    d.add_argument("--iters", type=int, default=10)
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--backend", default=None, help="default: kiln.config.default_backend")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
