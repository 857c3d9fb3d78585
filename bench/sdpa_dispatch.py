"""Which PyTorch SDPA backends run on this machine, and why the others refuse.

    python -m bench.sdpa_dispatch            # the table on stdout
    python -m bench.sdpa_dispatch --json build/bench/sdpa-dispatch.json

For a grid of inputs (dtype, head dim, MHA or GQA 32/8, prefill or decode, no mask / causal
/ boolean mask) every backend is forced in turn with ``torch.nn.attention.sdpa_kernel``;
a refusal prints torch's own reason (its UserWarnings). Where lab-02's
``sdpa_backends_that_run`` is importable, its answer is printed beside the real one, so a
GPU run checks the lab against the machine. On a machine without CUDA this shows the CPU's
dispatch (flash and math only), which is real, but says nothing about a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys
import warnings
from typing import Any

from bench.workloads import SDPA_BACKENDS, sdpa_backend

ROOT = pathlib.Path(__file__).resolve().parent.parent


def try_backend(backend: str, q: Any, k: Any, v: Any, kwargs: dict[str, Any]) -> tuple[bool, str]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([sdpa_backend(backend)]):
                F.scaled_dot_product_attention(q, k, v, **kwargs)
            if q.is_cuda:
                torch.cuda.synchronize()
            return True, ""
        except Exception as exc:
            reasons = [
                str(w.message).strip().splitlines()[0]
                for w in caught
                if str(w.message).strip() and "not used because" not in str(w.message)
            ]
            text = "; ".join(dict.fromkeys(reasons)) or f"{type(exc).__name__}: {exc}"
            return False, text.splitlines()[0][:200]


def lab02_answer() -> Any:
    """lab-02's ``sdpa_backends_that_run`` if the lab exists, else None."""
    from common.loader import load_impl

    try:
        module = load_impl(ROOT / "labs" / "lab-02-backend-selection", "solution")
    except Exception:
        return None
    return getattr(module, "sdpa_backends_that_run", None)


DTYPES = ("bfloat16", "float16", "float32")


LAB02_NAMES = {
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "efficient",
    "CUDNN_ATTENTION": "cudnn",
    "MATH": "math",
}


def lab02_row(lab02: Any, q: Any, k: Any, v: Any, kwargs: dict[str, Any], ran: list[str]) -> str:
    """lab-02's answer for the same inputs, and whether it agrees with what really ran."""
    if "enable_gqa" in kwargs:
        return "n/a (its contract has no enable_gqa)"
    try:
        names = list(lab02(q, k, v, attn_mask=kwargs.get("attn_mask"),
                           is_causal=kwargs.get("is_causal", False)))  # fmt: skip
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"[:120]
    said = sorted(LAB02_NAMES.get(n, n.lower()) for n in names if n != "OVERRIDEABLE")
    verdict = "agrees" if said == sorted(ran) else "DISAGREES"
    return f"{verdict}: {', '.join(names) or 'none'}"


def grid(dtypes: tuple[str, ...] = DTYPES) -> list[dict[str, Any]]:
    configs = []
    for dtype, d, heads, phase, mask in itertools.product(
        dtypes, (64, 128, 256), ((32, 32), (32, 8)), ("prefill", "decode"),
        ("none", "causal", "bool mask"),
    ):  # fmt: skip
        if phase == "decode" and mask == "causal":
            continue  # one query: causal is the same as no mask
        configs.append(
            {"dtype": dtype, "head_dim": d, "heads": heads[0], "kv_heads": heads[1],
             "phase": phase, "mask": mask}
        )  # fmt: skip
    return configs


def build(cfg: dict[str, Any], device: str) -> tuple[Any, Any, Any, dict[str, Any]]:
    import torch

    dtype = getattr(torch, cfg["dtype"])
    lk = 1024 if device.startswith("cuda") else 64
    lq = lk if cfg["phase"] == "prefill" else 1
    b, h, kvh, d = 2, cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    q = torch.randn(b, h, lq, d, dtype=dtype, device=device)
    k = torch.randn(b, kvh, lk, d, dtype=dtype, device=device)
    v = torch.randn(b, kvh, lk, d, dtype=dtype, device=device)
    kwargs: dict[str, Any] = {"enable_gqa": True} if kvh != h else {}
    if cfg["mask"] == "causal":
        kwargs["is_causal"] = True
    elif cfg["mask"] == "bool mask":
        ones = torch.ones(b, 1, lq, lk, dtype=torch.bool, device=device)
        kwargs["attn_mask"] = ones.tril(lk - lq)  # bottom-right causal, as a boolean mask
    return q, k, v, kwargs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sdpa_dispatch", description=__doc__)
    parser.add_argument("--json", type=pathlib.Path, help="also write the table as JSON")
    parser.add_argument(
        "--dtypes", default=",".join(DTYPES), help=f"comma-separated (default {','.join(DTYPES)})"
    )
    args = parser.parse_args(argv)

    from bench import provenance
    from common.device import has_cuda

    device = "cuda" if has_cuda() else "cpu"
    info = provenance.collect(" ".join(["python -m bench.sdpa_dispatch", *(argv or [])]))
    print(f"SDPA dispatch · {info['date']} · commit {info['commit']}")
    print(f"device: {info['gpu']} · torch {info['torch']} · CUDA {info['cuda']} · cuDNN "
          f"{info.get('cudnn', '-')}")  # fmt: skip
    if device == "cpu":
        print("no CUDA device: this is the CPU's dispatch, not a GPU's")
    import torch

    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # tiny tensors: extra threads only add overhead
    try:
        rows = dispatch_table(device, tuple(args.dtypes.split(",")))
    finally:
        torch.set_num_threads(threads)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"provenance": info, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def dispatch_table(device: str, dtypes: tuple[str, ...]) -> list[dict[str, Any]]:
    """Try every backend on every input of the grid; print and return the rows."""
    lab02 = lab02_answer()
    print("lab-02 sdpa_backends_that_run: " + ("shown as 'lab-02:'" if lab02 else "not available"))
    rows = []
    for cfg in grid(dtypes):
        q, k, v, kwargs = build(cfg, device)
        ran, refused = [], {}
        for backend in SDPA_BACKENDS:
            ok, why = try_backend(backend, q, k, v, kwargs)
            if ok:
                ran.append(backend)
            else:
                refused[backend] = why
        row = {**cfg, "ran": ran, "refused": refused}
        if lab02 is not None:
            row["lab02"] = lab02_row(lab02, q, k, v, kwargs, ran)
        rows.append(row)
        label = (
            f"{cfg['dtype']:8s} d{cfg['head_dim']:<3d} "
            f"{'mha' if cfg['heads'] == cfg['kv_heads'] else 'gqa32/8':7s} "
            f"{cfg['phase']:7s} {cfg['mask']:9s}"
        )
        print(f"{label} runs: {', '.join(ran) or 'none'}")
        for backend, why in refused.items():
            print(f"{'':42s} {backend:9s} refused: {why}")
        if "lab02" in row:
            print(f"{'':42s} lab-02: {row['lab02']}")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
