"""Ring attention on a real distributed engine: torch.distributed, one process per device.

    torchrun --nproc-per-node 4 labs/lab-04-flash-decoding-partitions/ring_dist.py
    LAB_IMPL=starter torchrun --nproc-per-node 2 labs/lab-04-flash-decoding-partitions/ring_dist.py

Every rank builds the same random problem (same seed), keeps its contiguous chunk of the
sequence -- its Q shard and, to start with, its own K/V shard -- and then runs P steps:

    post isend(K/V in residence -> rank + 1) and irecv(K/V <- rank - 1)   (non-blocking)
    fold the K/V in residence into this rank's state with ring_step        (overlaps the transfer)
    wait for the transfer, swap buffers

The compute of a step is the lab's own ``ring_step`` (from ``solution.py`` or, with
``LAB_IMPL=starter``, from ``starter.py``), so this script runs the student's code. Rank 0
gathers every rank's ``(out, lse)``, checks them against the float64 dense reference, causal
and not, prints the errors and (``--save``) writes the gathered outputs, and only them, to an
``.npz``. The tests never read the problem or the expected answer from that file (the code
under test ran in this process and could have written anything): they draw the same problem
from the same arguments themselves and keep their own reference.

Backend: gloo on CPU; NCCL when CUDA is available (K/V then travel between GPUs, and each
step copies the block to the host for the lab's numpy ``ring_step``: a production
context-parallel kernel would call a FlashAttention kernel that returns its LSE instead).
The launcher environment is torchrun's: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import socket
import sys
import time
from multiprocessing import connection as mp_connection

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script (torchrun): make `common` importable
    sys.path.insert(0, str(ROOT))

from common.loader import load_impl  # noqa: E402

try:  # the grader's sandbox has no reference: there the test checks the gathered result
    from common.reference import prefix_mask, reference_attention  # noqa: E402
except ImportError:
    prefix_mask = reference_attention = None

impl = load_impl(__file__)  # LAB_IMPL=solution (default) or starter


def make_problem(seed: int, seq_len: int, heads: int, kv_heads: int, head_dim: int):
    """The same float64 ``q [L, H, d]``, ``k, v [L, KVH, d]`` on every rank (the lab's tests
    draw the same numbers from the same arguments, so change both together)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((seq_len, heads, head_dim))
    k = rng.standard_normal((seq_len, kv_heads, head_dim))
    v = rng.standard_normal((seq_len, kv_heads, head_dim))
    return q, k, v


def shard_starts(seq_len: int, world: int) -> list[int]:
    """Contiguous, nearly equal chunks: rank r holds positions ``starts[r] .. starts[r+1]-1``."""
    return [(r * seq_len) // world for r in range(world + 1)]


def ring_pass(q_local, k_local, v_local, starts, causal, device):
    """P ring steps on this rank; returns its ``(out [L_r, H, dv], lse [L_r, H])``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    send_to, recv_from = (rank + 1) % world, (rank - 1) % world
    num_heads, dv = q_local.shape[1], v_local.shape[2]
    state = impl.empty_state((q_local.shape[0], num_heads), dv)

    k_cur = torch.from_numpy(k_local).to(device)
    v_cur = torch.from_numpy(v_local).to(device)
    owner = rank  # whose shard is in residence
    for step in range(world):
        requests = []
        if step < world - 1:  # start moving the block on before computing with it
            incoming = (owner - 1) % world
            rows = starts[incoming + 1] - starts[incoming]
            k_next = torch.empty((rows, *k_cur.shape[1:]), dtype=k_cur.dtype, device=device)
            v_next = torch.empty((rows, *v_cur.shape[1:]), dtype=v_cur.dtype, device=device)
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k_cur, send_to, tag=2 * step),
                dist.P2POp(dist.isend, v_cur, send_to, tag=2 * step + 1),
                dist.P2POp(dist.irecv, k_next, recv_from, tag=2 * step),
                dist.P2POp(dist.irecv, v_next, recv_from, tag=2 * step + 1),
            ])
        state = impl.ring_step(  # the compute that hides the transfer
            state, q_local, k_cur.cpu().numpy(), v_cur.cpu().numpy(),
            starts[rank], starts[owner], causal,
        )
        for request in requests:
            request.wait()
        if step < world - 1:
            k_cur, v_cur, owner = k_next, v_next, incoming
    return impl.finalize(state)


def gather_to_rank0(out, lse, starts, device):
    """Rank 0 receives every rank's shard (shapes are known from ``starts``)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out_t = torch.from_numpy(np.ascontiguousarray(out)).to(device)
    lse_t = torch.from_numpy(np.ascontiguousarray(lse)).to(device)
    if rank != 0:
        dist.send(out_t, 0)
        dist.send(lse_t, 0)
        return None
    outs, lses = [out_t.cpu()], [lse_t.cpu()]
    for src in range(1, world):
        rows = starts[src + 1] - starts[src]
        o = torch.empty((rows, *out_t.shape[1:]), dtype=out_t.dtype, device=device)
        s = torch.empty((rows, *lse_t.shape[1:]), dtype=lse_t.dtype, device=device)
        dist.recv(o, src)
        dist.recv(s, src)
        outs.append(o.cpu())
        lses.append(s.cpu())
    return torch.cat(outs).numpy(), torch.cat(lses).numpy()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the rendezvous never leaves this machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _local_worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    """One rank of a local launch: torchrun's environment, then the same ``run``."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
    )
    sys.exit(run(args))


def launch_local(args: argparse.Namespace) -> int:
    """Start a ring for every P in ``args.local``, all at once, on this machine.

    The ranks are forked from this process (torch is imported once, not once per rank),
    each group rendezvouses on its own free port of 127.0.0.1, and every rank still alive
    after ``args.timeout`` seconds is killed. Returns 0 when every rank of every group exits 0.
    """
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    procs = []
    for world in args.local:
        port = free_port()
        save = args.save_dir / f"ring_{world}.npz" if args.save_dir else None
        rank_args = argparse.Namespace(**{**vars(args), "local": None, "save": save})
        for rank in range(world):
            proc = ctx.Process(target=_local_worker, args=(rank, world, port, rank_args))
            proc.start()
            procs.append((world, rank, proc))
    deadline = time.monotonic() + args.timeout
    status = 0
    try:
        running = [proc for _, _, proc in procs]
        while running and time.monotonic() < deadline:
            mp_connection.wait([p.sentinel for p in running], deadline - time.monotonic())
            failed = {world for world, _, p in procs if p.exitcode not in (None, 0)}
            for world, _, proc in procs:  # a ring with a dead rank can never finish
                if world in failed and proc.is_alive():
                    proc.kill()
                    proc.join(5)
            running = [p for p in running if p.exitcode is None]
        for world, rank, proc in procs:
            if proc.exitcode is None:
                print(f"ring of {world}: rank {rank} still running after {args.timeout:.0f} s: "
                      "killing it",
                      file=sys.stderr, flush=True)
                status = 1
            elif proc.exitcode != 0:
                print(f"ring of {world}: rank {rank} exited with {proc.exitcode}",
                      file=sys.stderr, flush=True)
                status = 1
    finally:
        for _, _, proc in procs:  # never leave a rank behind, whatever happened above
            if proc.is_alive():
                proc.kill()
            proc.join(5)
    return status


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=24)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds before a hung rank (or a local launch) gives up")
    parser.add_argument("--save", type=pathlib.Path, help="rank 0 writes the gathered outputs")
    parser.add_argument("--local", type=int, nargs="+", metavar="P",
                        help="without torchrun: fork P ranks here (several P run at once)")
    parser.add_argument("--save-dir", type=pathlib.Path,
                        help="with --local: rank 0 of each ring writes ring_<P>.npz here")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    """One rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torchrun or --local)."""
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.seq_len < world:
            raise SystemExit(f"--seq-len {args.seq_len} must be >= the number of ranks {world}")
        q, k, v = make_problem(args.seed, args.seq_len, args.heads, args.kv_heads, args.head_dim)
        starts = shard_starts(args.seq_len, world)
        mine = slice(starts[rank], starts[rank + 1])

        results = {}
        for causal in (False, True):
            out, lse = ring_pass(q[mine], k[mine], v[mine], starts, causal, device)
            results[causal] = gather_to_rank0(out, lse, starts, device)
        if rank != 0:
            return 0

        worst = 0.0
        for causal, (out, lse) in results.items() if reference_attention is not None else ():
            mask = prefix_mask(np.arange(args.seq_len), args.seq_len) if causal else None
            ref_out, ref_lse = reference_attention(q, k, v, mask=mask)
            err = max(float(np.abs(out - ref_out).max()), float(np.abs(lse - ref_lse).max()))
            worst = max(worst, err)
            print(f"ring attention on {world} ranks ({backend}), causal={causal}: "
                  f"max |error| vs dense = {err:.2e}", flush=True)
        if args.save:
            np.savez(  # the answers only: the tests make the problem and its reference
                args.save, world=world,
                out_full=results[False][0], lse_full=results[False][1],
                out_causal=results[True][0], lse_causal=results[True][1],
            )
        return 0 if worst <= 1e-10 else 1
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.local and "RANK" not in os.environ:
        return launch_local(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
