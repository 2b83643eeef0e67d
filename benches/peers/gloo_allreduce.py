"""PyTorch's Gloo all-reduce (CPU), swept like examples/allreduce_sweep.rs (same sizes,
iterations, timing and output) so benches/peers/run.sh can compare them line by line.
Launched with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set."""
import sys, time
import torch
import torch.distributed as dist

def iterations(nbytes):
    return min(500, max(5, (64 << 20) // max(nbytes, 1)))

def main():
    lo, hi, factor = (int(a) for a in (sys.argv[1:4] + ["8", str(64 << 20), "4"][len(sys.argv[1:4]):]))
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    # Warm up for 300 ms (rank 0 decides; an all-reduce waits for every rank), as the other
    # programs do.
    t0 = time.perf_counter()
    go = torch.ones(1, dtype=torch.int32)
    while go[0].item():
        go[0] = int(rank == 0 and time.perf_counter() - t0 < 0.3)
        dist.all_reduce(go, op=dist.ReduceOp.MAX)
    size = lo
    while size <= hi:
        count = max(size // 4, 1)
        send = torch.ones(count, dtype=torch.float32)
        iters = iterations(count * 4)
        for _ in range(max(iters // 10, 2)):
            buf = send.clone(); dist.all_reduce(buf)
        dist.barrier()
        buf = send.clone()
        t = time.perf_counter()
        for _ in range(iters):
            buf.copy_(send)  # out of place, as the others: a fresh input each time
            dist.all_reduce(buf)
        us = (time.perf_counter() - t) * 1e6 / iters
        assert buf[0].item() == n
        if rank == 0:
            algbw = count * 4 / us / 1e3
            print(f"{count * 4} {us:.2f} {algbw:.3f} {algbw * 2 * (n - 1) / n:.3f}", flush=True)
        size *= factor
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
