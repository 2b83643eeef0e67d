#!/usr/bin/env python3
"""PyTorch's own process group on topoccl's libnccl.so.2: DDP on ranks sharing one GPU.

    LD_PRELOAD=$PWD/target/gpu-clients/lib/libnccl.so.2 \\
        python3 benches/gpu/ddp_check.py --backend nccl --expect-lib target/gpu-clients/lib/libnccl.so.2

Starts WORLD rank processes (this script again, with RANK and WORLD_SIZE set, the way torchrun
does; rendezvous through a file store), each running DistributedDataParallel over PyTorch's
``nccl`` process group on GPU 0 for STEPS steps of a small MLP on seeded random data (each
rank takes its slice of every global batch). Then, in this process, it trains the same model
on the full batches alone and checks:

* the parameters are bitwise equal on every rank (DDP keeps replicas identical only if every
  rank receives the same all-reduced gradients);
* they equal the single-process parameters within float tolerance (the averaged gradient of
  equal shards is the full-batch gradient);
* training moved them and lowered the loss (so the comparison is not vacuous);
* with ``--expect-lib``: in every rank, before and after training, that library is mapped
  (/proc/self/maps) and is where the global scope finds the NCCL functions PyTorch calls
  (dladdr), i.e. ``LD_PRELOAD`` took the place of the NCCL that PyTorch links through its
  RPATH. (PyTorch may map its own NCCL too, preloading the nvidia/* wheels by path; it then
  answers nothing.) Under ``NCCL_DEBUG=VERSION`` the library PyTorch calls prints its version
  line, ours with "+topoccl": benches/gpu/clients.sh requires that line.

Two ranks on one GPU: NVIDIA's NCCL refuses that at communicator init ("Duplicate GPU
detected", ncclInvalidUsage); PyTorch has no check of its own and passes NCCL's error on.
topoccl allows it.

``--backend gloo --device cpu`` runs the same on the CPU (no GPU, no NCCL calls: what CI can
run); ``--self-test`` then also feeds the checks altered results and requires them refused.
``--check-preload`` only checks, in this process, that the preloaded library is the one
mapped and answers ``ncclGetVersion`` (and PyTorch's ``torch.cuda.nccl.version()`` where it is
a CUDA build).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

FEATURES, HIDDEN, OUTPUTS = 32, 64, 8
NCCL_VERSION_CODE = 23007  # 2.30.7, the ABI topoccl implements


def mapped_nccl_libraries() -> set[str]:
    """Real paths of every libnccl* file mapped into this process."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libnccl"):
                found.add(os.path.realpath(parts[5].strip()))
    return found


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


# Functions PyTorch's NCCL process group calls; where the global scope finds them is where
# libtorch_cuda.so's references to them are bound (the global scope is searched first).
PROBE_SYMBOLS = ("ncclGetVersion", "ncclCommInitRankConfig", "ncclAllReduce", "ncclBroadcast", "ncclGroupEnd")


def defining_library(symbol: str) -> str | None:
    """The real path of the object whose definition of `symbol` the global scope finds first."""
    this = ctypes.CDLL(None)
    try:
        addr = ctypes.cast(getattr(this, symbol), ctypes.c_void_p).value
    except AttributeError:
        return None
    info = _DlInfo()
    if not this.dladdr(ctypes.c_void_p(addr), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(info.dli_fname.decode())


def check_loaded(expect: str) -> str:
    """Raises unless `expect` is mapped and defines, first in the global scope, the NCCL
    functions PyTorch calls (what LD_PRELOAD achieves); returns an account of it. PyTorch may
    also map its own NCCL (torch/__init__.py preloads the nvidia/* wheels' libraries by path),
    which then answers nothing."""
    want = os.path.realpath(expect)
    mapped = mapped_nccl_libraries()
    if want not in mapped:
        raise RuntimeError(f"{want} is not mapped in this process (libnccl* mapped: {sorted(mapped) or 'none'})")
    wrong = {s: d for s in PROBE_SYMBOLS if (d := defining_library(s)) != want}
    if wrong:
        raise RuntimeError(f"NCCL functions resolve elsewhere than {want}: {wrong}")
    others = sorted(mapped - {want})
    return f"{want} defines {', '.join(PROBE_SYMBOLS)}" + (
        f" (also mapped, answering none of them: {', '.join(others)})" if others else " (the only libnccl* mapped)"
    )


def make_model():
    import torch

    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUTPUTS)
    )


def make_data(steps: int, batch: int):
    """The same inputs and targets in every process (CPU tensors, seeded generator)."""
    import torch

    g = torch.Generator().manual_seed(4321)
    x = torch.randn(steps, batch, FEATURES, generator=g)
    w = torch.randn(FEATURES, OUTPUTS, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(steps, batch, OUTPUTS, generator=g)
    return x, y


def train(model, x, y, device, lr: float):
    """Plain training loop over all steps; returns the per-step losses."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(x.shape[0]):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x[step].to(device)), y[step].to(device))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def exact_numerics():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def compare(ranks, reference, initial, rtol: float, atol: float):
    """Problems found (empty: the run is right) and a one-line account of the distances.

    ranks: per rank, its list of parameter tensors (CPU); reference: the single process's;
    initial: the parameters before training.
    """
    import torch

    problems = []
    shapes = [tuple(p.shape) for p in reference]
    for r, params in enumerate(ranks):
        if [tuple(p.shape) for p in params] != shapes:
            problems.append(f"rank {r}: parameter shapes {[tuple(p.shape) for p in params]} != {shapes}")
    if problems:
        return problems, "shapes differ"
    rank_diff = 0.0
    for r, params in enumerate(ranks[1:], start=1):
        d = max(float((a - b).abs().max()) for a, b in zip(params, ranks[0]))
        rank_diff = max(rank_diff, d)
        if not all(torch.equal(a, b) for a, b in zip(params, ranks[0])):
            problems.append(f"rank {r}'s parameters differ from rank 0's (max |diff| {d:.3g}): replicas diverged")
    ref_diff = max(float((a - b).abs().max()) for a, b in zip(ranks[0], reference))
    for i, (a, b) in enumerate(zip(ranks[0], reference)):
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            problems.append(
                f"parameter {i} {tuple(a.shape)} differs from single-process training "
                f"(max |diff| {float((a - b).abs().max()):.3g}; rtol {rtol}, atol {atol})"
            )
    moved = max(float((a - b).abs().max()) for a, b in zip(reference, initial))
    if moved < 1e-3:
        problems.append(f"training barely moved the parameters (max change {moved:.3g}): the check would be vacuous")
    account = (
        f"max |rank r - rank 0| = {rank_diff:.3g}, max |DDP - single process| = {ref_diff:.3g} "
        f"(rtol {rtol}, atol {atol}), max change from init = {moved:.3g}"
    )
    return problems, account


def rank_main(args) -> int:
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    exact_numerics()
    loaded = check_loaded(args.expect_lib) if args.expect_lib else None
    if args.device == "cuda":
        device = torch.device("cuda", args.gpu)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    extra = {"device_id": device} if args.backend == "nccl" else {}
    dist.init_process_group(
        args.backend,
        init_method="file://" + os.path.join(args.workdir, "rendezvous"),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=args.timeout),
        **extra,
    )
    model = make_model().to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    x, y = make_data(args.steps, args.batch)
    shard = args.batch // world
    part = slice(rank * shard, (rank + 1) * shard)
    losses = train(ddp, x[:, part], y[:, part], device, args.lr)
    if device.type == "cuda":
        torch.cuda.synchronize()
    if loaded:
        loaded = check_loaded(args.expect_lib)  # still ours once the communicator exists
    version = None
    if args.backend == "nccl":
        version = ".".join(map(str, torch.cuda.nccl.version()))
    torch.save(
        {
            "params": [p.detach().cpu().clone() for p in model.parameters()],
            "losses": losses,
            "version": version,
            "loaded": loaded,
        },
        os.path.join(args.workdir, f"rank{rank}.pt"),
    )
    dist.destroy_process_group()
    return 0


def launch_ranks(args, workdir: str):
    """Runs the ranks; returns (exit statuses, log paths); kills them all at the deadline."""
    procs, logs = [], []
    for r in range(args.world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.world), LOCAL_RANK=str(r), PYTHONUNBUFFERED="1")
        log = os.path.join(workdir, f"rank{r}.log")
        cmd = [sys.executable, os.path.abspath(__file__), "--rank-worker", "--workdir", workdir] + args.passthrough
        with open(log, "w") as out:
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
        logs.append(log)
    deadline = time.monotonic() + args.timeout + 30
    codes = [None] * len(procs)
    while any(c is None for c in codes):
        for i, p in enumerate(procs):
            if codes[i] is None:
                codes[i] = p.poll()
        if time.monotonic() > deadline:
            for i, p in enumerate(procs):
                if codes[i] is None:
                    p.kill()
                    p.wait()
                    codes[i] = "killed at the deadline"
            break
        time.sleep(0.1)
    return codes, logs


def tail(path: str, n: int = 25) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def self_test(ranks, reference, initial, rtol, atol, expect_lib) -> list[str]:
    """Feeds the checks altered results; returns the alterations they failed to refuse."""
    missed = []

    def bumped(params, i, delta):
        out = [p.clone() for p in params]
        out[i].view(-1)[0] += delta
        return out

    cases = {
        "rank 1 off by 1e-3 in one element": ([ranks[0], bumped(ranks[0], 0, 1e-3)] + ranks[2:], reference),
        "ranks equal, reference off by 1e-2": (ranks, bumped(reference, 2, 1e-2)),
        "training did nothing": ([initial] * len(ranks), initial),
        "a rank with a missing parameter": ([ranks[0], ranks[0][:-1]] + ranks[2:], reference),
    }
    for name, (rs, ref) in cases.items():
        problems, _ = compare(rs, ref, initial, rtol, atol)
        print(f"   self-test: {name}: {'refused' if problems else 'NOT REFUSED'}" + (f" ({problems[0]})" if problems else ""))
        if not problems:
            missed.append(name)
    # The library check must refuse one that is not mapped.
    try:
        check_loaded(os.path.join(tempfile.gettempdir(), "no-such-dir", "libnccl.so.2"))
        missed.append("an unmapped library accepted by check_loaded")
        print("   self-test: an unmapped library: NOT REFUSED")
    except RuntimeError as e:
        print(f"   self-test: an unmapped library: refused ({e})")
    # ... and one that is mapped but answers nothing (PyTorch's own, where it maps it).
    if expect_lib:
        for other in sorted(mapped_nccl_libraries() - {os.path.realpath(expect_lib)}):
            try:
                check_loaded(other)
                missed.append(f"{other}, mapped but answering nothing, accepted by check_loaded")
                print(f"   self-test: {other} (mapped, not first): NOT REFUSED")
            except RuntimeError as e:
                print(f"   self-test: a mapped library the functions do not resolve to: refused ({e})")
    return missed


def check_preload(expect: str) -> int:
    import torch

    said = [f"torch {torch.__version__}"]
    if torch.version.cuda and hasattr(torch.cuda, "nccl"):
        # Through libtorch_cuda.so's own import of ncclGetVersion (under NCCL_DEBUG=VERSION
        # the library that answers prints its version line: ours says "+topoccl").
        v = tuple(torch.cuda.nccl.version())
        said.append(f"torch.cuda.nccl.version() = {v}")
        if v != (2, 30, 7):
            print(f"check-preload: torch.cuda.nccl.version() is {v}, not (2, 30, 7)")
            return 1
    try:
        said.append(check_loaded(expect))
    except RuntimeError as e:
        print(f"check-preload: FAIL: {e}")
        return 1
    # The global scope's ncclGetVersion (the one just checked to be ours), called from here.
    code = ctypes.c_int(0)
    rc = ctypes.CDLL(None).ncclGetVersion(ctypes.byref(code))
    said.append(f"ncclGetVersion -> {rc}, {code.value}")
    if rc != 0 or code.value != NCCL_VERSION_CODE:
        print(f"check-preload: ncclGetVersion returned {rc} and {code.value}, expected 0 and {NCCL_VERSION_CODE}")
        return 1
    print("check-preload: OK: " + "; ".join(said))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda for nccl, cpu for gloo")
    ap.add_argument("--gpu", type=int, default=0, help="the GPU every rank uses (default 0)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16, help="global batch (split evenly over the ranks)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--timeout", type=int, default=150, help="seconds for the ranks (and the process group)")
    ap.add_argument("--expect-lib", help="the libnccl.so.2 that must answer PyTorch's NCCL calls in every rank")
    ap.add_argument("--self-test", action="store_true", help="also require altered results to be refused")
    ap.add_argument("--check-preload", action="store_true", help="only check the preloaded library here")
    ap.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.device = args.device or ("cuda" if args.backend == "nccl" else "cpu")
    if args.batch % args.world:
        ap.error(f"--batch {args.batch} is not divisible by --world {args.world}")
    if args.check_preload:
        if not args.expect_lib:
            ap.error("--check-preload needs --expect-lib")
        return check_preload(args.expect_lib)
    if args.rank_worker:
        return rank_main(args)

    args.passthrough = [
        "--backend", args.backend, "--device", args.device, "--gpu", str(args.gpu), "--world", str(args.world),
        "--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr),
        "--timeout", str(args.timeout),
    ] + (["--expect-lib", args.expect_lib] if args.expect_lib else [])
    import torch

    what = (
        f"DDP, {args.world} ranks, backend {args.backend} on "
        + (f"cuda:{args.gpu} (every rank)" if args.device == "cuda" else "cpu")
        + f", {args.steps} steps, global batch {args.batch}, torch {torch.__version__}"
    )
    print(f"ddp_check: {what}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("ddp_check: FAIL: torch sees no CUDA device")
        return 1
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ddp-check-") as workdir:
        codes, logs = launch_ranks(args, workdir)
        if any(c != 0 for c in codes):
            for r, (c, log) in enumerate(zip(codes, logs)):
                print(f"--- rank {r}: exit {c}; last lines of its output ---\n{tail(log)}")
            print(f"ddp_check: FAIL: rank exit statuses {codes}")
            return 1
        results = [torch.load(os.path.join(workdir, f"rank{r}.pt")) for r in range(args.world)]
        for r, log in enumerate(logs):  # whatever the ranks printed (warnings, NCCL_DEBUG lines)
            lines = open(log, errors="replace").read().strip().splitlines()
            if len(lines) > 60:
                lines = [l for l in lines[:-40] if "NCCL version" in l] + ["..."] + lines[-40:]
            print("".join(f"   rank {r}| {line}\n" for line in lines), end="")
    took = time.monotonic() - t0

    # The same training in this one process, on the full batches.
    exact_numerics()
    device = torch.device("cuda", args.gpu) if args.device == "cuda" else torch.device("cpu")
    initial = [p.detach().cpu().clone() for p in make_model().parameters()]
    model = make_model().to(device)
    x, y = make_data(args.steps, args.batch)
    ref_losses = train(model, x, y, device, args.lr)
    reference = [p.detach().cpu().clone() for p in model.parameters()]
    ranks = [r["params"] for r in results]
    problems, account = compare(ranks, reference, initial, args.rtol, args.atol)
    if not ref_losses[-1] < 0.9 * ref_losses[0]:
        problems.append(f"the loss did not fall ({ref_losses[0]:.4g} -> {ref_losses[-1]:.4g})")
    print(f"   {account}")
    print(f"   loss (single process, full batch) {ref_losses[0]:.4g} -> {ref_losses[-1]:.4g}; ranks took {took:.1f} s")
    if args.expect_lib:
        print(f"   in every rank, before and after training: {results[0]['loaded']}")
    if results[0]["version"]:
        print(f"   torch.cuda.nccl.version() in the ranks: {results[0]['version']}")
    if args.self_test:
        missed = self_test(ranks, reference, initial, args.rtol, args.atol, args.expect_lib)
        problems += [f"self-test: the checks accepted: {m}" for m in missed]
    for p in problems:
        print(f"   PROBLEM: {p}")
    print(f"ddp_check: {'FAIL' if problems else 'PASS'}: {what}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
