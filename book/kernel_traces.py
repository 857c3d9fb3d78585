"""Traces of the learner's Triton kernels, run through the interpreter (``make trace LAB=09``,
``make trace LAB=00 KERNEL=1``): which program loaded and stored which element, and what it
stored, beside the reference's run on the same inputs.

The recorder is lab 09's ``provided.record_memory()`` (it wraps the interpreter's masked
load and store, so it sees every kernel of the course). Element indices count from the
buffer's first element, so ``i * stride(0) + j`` is element ``(i, j)`` of a 2-D buffer.
A step is one puzzle (lab 09) or one program of the kernel's grid (lab 00); the first
difference names the program, the access (``loads of k``, ``stores of out``) or the value
(``out``, ``lse``, each on its own) that differs first.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from common.tracing import rounded

REPO = pathlib.Path(__file__).resolve().parent.parent
LAB09 = REPO / "labs" / "lab-09-triton-primer"
SENTINEL = -7777.0


def _recorder() -> Any:
    from common.loader import load_lab_module

    return load_lab_module(str(LAB09 / "provided.py"), "provided").record_memory


def _r(x: Any) -> Any:
    return rounded(x, 5)


def _programs(trace: Any, named: dict[str, Any]) -> dict[str, dict[str, list[int]]]:
    """``{"(p0, p1, p2)": {"loads of x": [elements], "stores of out": [...]}}``."""
    out: dict[tuple[int, ...], dict[str, list[int]]] = {}
    for name, t in named.items():
        for kind in ("load", "store"):
            for pid, ix in trace.touched(t, kind).items():
                if ix.size:
                    out.setdefault(tuple(pid), {})[f"{kind}s of {name}"] = ix.tolist()
    return {str(pid): accesses for pid, accesses in sorted(out.items())}


def _calls(trace: Any, named: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """``{"(p0, p1, p2)": [[access, elements], ...]}``: each program's loads and stores in the
    order they ran (one entry per ``tl.load`` / ``tl.store`` that touched a named tensor), so
    the n-th load of ``k`` is the n-th tile of the program's key loop."""
    spans = [(name, t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()
              - t.storage_offset() * t.element_size(), t.element_size())
             for name, t in named.items()]
    out: dict[tuple[int, ...], list[list[Any]]] = {}
    for a in trace.accesses:
        addr = a.addresses[a.mask].astype(np.int64)
        for name, base, end, item in spans:
            hit = addr[(addr >= base) & (addr < end)]
            if hit.size:
                out.setdefault(tuple(a.program), []).append(
                    [f"{a.kind}s of {name}", np.unique((hit - base) // item).tolist()])
    return {str(pid): calls for pid, calls in sorted(out.items())}


def _first_call(mine: list | None, ref: list | None, access: str) -> int | None:
    """The index (from 0) of the first ``access`` call of a program that differs."""
    a = [ix for name, ix in mine or [] if name == access]
    b = [ix for name, ix in ref or [] if name == access]
    return next((i for i in range(max(len(a), len(b)))
                 if (a[i] if i < len(a) else None) != (b[i] if i < len(b) else None)), None)


def _pid(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.strip("()").split(","))


def _run(errors: list[str], record: Any, fn: Any, named: dict[str, Any], label: str,
         ) -> tuple[dict[str, dict[str, list[int]]] | None, dict[str, list[list[Any]]]]:
    try:
        with record() as trace, np.errstate(all="ignore"):  # padded rows: -inf - -inf
            fn()
    except Exception as e:  # noqa: BLE001 - the learner's code may raise anything
        errors.append(f"{label}: {type(e).__name__}: {e}"[:300])
        return None, {}
    return _programs(trace, named), _calls(trace, named)


# ---- lab 09: the nine puzzles, on the README's worked examples -------------------------------


def _buffers(seed: int) -> Any:
    import torch

    from common.triton_env import DEVICE

    gen = torch.Generator().manual_seed(seed)

    def vec(n: int, margin: int = 8) -> Any:
        return torch.randn(n + margin, generator=gen).to(DEVICE)

    def mat(rows: int, cols: int, pad: int = 5) -> Any:
        return torch.randn(rows + 3, cols + pad, generator=gen).to(DEVICE)

    def out(rows: int, cols: int | None = None) -> Any:
        shape = (rows + 8,) if cols is None else (rows + 3, cols + 5)
        return torch.full(shape, SENTINEL, device=DEVICE)

    return vec, mat, out


def trace_lab09(impl: Any) -> dict:
    """Per puzzle: the programs' loads and stores, and the output buffer (sentinel -7777
    where nothing was stored)."""
    record = _recorder()
    vec, mat, out = _buffers(9)
    errors: list[str] = []
    puzzles: list[dict] = []

    def puzzle(n: int, name: str, outputs: dict[str, Any], named: dict[str, Any],
               call: Any) -> None:
        programs, calls = _run(errors, record, call, {**named, **outputs}, name)
        puzzles.append({"puzzle": n, "name": name, "programs": programs, "calls": calls,
                        "outputs": {k: _r(v.cpu().double().numpy()) for k, v in outputs.items()}})

    x, o = vec(13), out(13)
    puzzle(1, "add_constant", {"out": o}, {"x": x},
           lambda: impl.add_constant(x, o, 13, 2.0, block=16))
    x, y, o = vec(37), vec(37), out(37)
    puzzle(2, "add_vectors", {"out": o}, {"x": x, "y": y},
           lambda: impl.add_vectors(x, y, o, 37, block=16))
    x, o = mat(21, 35), out(35, 21)
    puzzle(3, "transpose", {"out": o}, {"x": x},
           lambda: impl.transpose(x, o, 21, 35, block_m=16, block_n=16))
    x, sums, maxes = mat(5, 13) - 3.0, out(5), out(5)
    puzzle(4, "row_sum_max", {"sums": sums, "maxes": maxes}, {"x": x},
           lambda: impl.row_sum_max(x, sums, maxes, 5, 13, block_n=16))
    x, o = mat(5, 13), out(5, 13)
    puzzle(5, "softmax_rows", {"out": o}, {"x": x},
           lambda: impl.softmax_rows(x, o, 5, 13, block_n=16))
    a, b, o = mat(5, 7), mat(7, 3), out(5, 3)
    puzzle(6, "small_matmul", {"out": o}, {"a": a, "b": b},
           lambda: impl.small_matmul(a, b, o, 5, 3, 7))
    a, b, o = mat(21, 5), mat(5, 19), out(21, 19)
    puzzle(7, "outer_accumulate", {"out": o}, {"a": a, "b": b},
           lambda: impl.outer_accumulate(a, b, o, 21, 19, 5, block_m=16, block_n=16))
    a, b, o = mat(37, 45), mat(45, 29), out(37, 29)
    puzzle(8, "matmul", {"out": o}, {"a": a, "b": b},
           lambda: impl.matmul(a, b, o, 37, 29, 45, block_m=16, block_n=16, block_k=16))
    s, v, o, lse = mat(21, 37) * 3.0, mat(37, 3), out(21, 3), out(21)
    puzzle(9, "online_softmax", {"out": o, "lse": lse}, {"s": s, "v": v},
           lambda: impl.online_softmax(s, v, o, lse, 21, 37, 3, block_m=16, block_n=16))
    return {"lab": "09", "puzzles": puzzles, "errors": errors}


def _first_value(a: Any, b: Any, tol: float = 1e-4) -> tuple[int, Any, Any] | None:
    fa, fb = np.asarray(a, dtype=object).ravel(), np.asarray(b, dtype=object).ravel()
    for i, (x, y) in enumerate(zip(fa, fb)):
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                return i, x, y
        elif abs(float(x) - float(y)) > tol * (1 + abs(float(y))):
            return i, x, y
    return None


def _diff_programs(mine: dict | None, ref: dict) -> tuple[str, str, Any, Any] | None:
    """(program, access, yours, reference) of the first program whose accesses differ."""
    mine = mine or {}
    for pid in sorted(set(ref) | set(mine), key=_pid):
        a, b = mine.get(pid, {}), ref.get(pid, {})
        for access in sorted(set(a) | set(b), key=lambda s: (not s.startswith("store"), s)):
            if a.get(access) != b.get(access):
                return pid, access, _span(a.get(access)), _span(b.get(access))
    return None


def _span(ix: list[int] | None) -> Any:
    """A short description of a set of element indices: a range, or the list."""
    if not ix:
        return "none"
    if ix == list(range(ix[0], ix[-1] + 1)):
        return f"elements {ix[0]}..{ix[-1]} ({len(ix)})"
    return f"{len(ix)} elements: " + ", ".join(map(str, ix[:12])) + (" …" if len(ix) > 12 else "")


def diff_lab09(mine: dict, ref: dict) -> dict | None:
    for n, (a, b) in enumerate(zip(mine["puzzles"], ref["puzzles"])):
        where = f"puzzle {b['puzzle']} ({b['name']})"
        if a["programs"] is None:
            err = next((e for e in mine["errors"] if e.startswith(b["name"])), "raised")
            return {"step": n, "where": where, "field": "raised", "yours": err,
                    "reference": "ran"}
        found = _diff_programs(a["programs"], b["programs"])
        if found:
            pid, access, yours, reference = found
            call = _first_call(a["calls"].get(pid), b["calls"].get(pid), access)
            return {"step": n, "where": f"{where}, program {pid}", "field": access,
                    "yours": yours, "reference": reference, "program": pid, "call": call}
        for name in b["outputs"]:
            value = _first_value(a["outputs"][name], b["outputs"][name])
            if value:
                return {"step": n, "where": f"{where}, flat element {value[0]} of {name}",
                        "field": name, "yours": value[1], "reference": value[2]}
    return None


# ---- lab 00: the FlashAttention kernel, program by program ------------------------------------

FA_KERNEL = {"B": 1, "H": 2, "Lq": 20, "Lk": 20, "d": 4, "dv": 3, "block": 16, "causal": True,
             "seed": 0}


def trace_lab00_kernel(impl: Any) -> dict:
    """``flash_attention_triton`` on a causal ``[1, 2, 20, 4]`` problem in 16 x 16 tiles (a
    grid of 2 query tiles x 2 heads): per program, the elements of q, k, v it loaded and of
    out, lse it stored; the outputs, per row (``out`` and ``lse`` compared on their own)."""
    import torch

    from common.triton_env import DEVICE

    p = FA_KERNEL
    gen = torch.Generator().manual_seed(p["seed"])
    q = torch.randn(p["B"], p["H"], p["Lq"], p["d"], generator=gen).to(DEVICE)
    k = torch.randn(p["B"], p["H"], p["Lk"], p["d"], generator=gen).to(DEVICE)
    v = torch.randn(p["B"], p["H"], p["Lk"], p["dv"], generator=gen).to(DEVICE)
    record = _recorder()
    errors: list[str] = []
    result: dict[str, Any] = {}

    def call() -> None:
        out, lse = impl.flash_attention_triton(q, k, v, causal=p["causal"], block_m=p["block"],
                                               block_n=p["block"])
        result.update(out=out, lse=lse)
        named["out"], named["lse"] = out, lse

    named: dict[str, Any] = {"q": q, "k": k, "v": v}
    calls: dict[str, list[list[Any]]] = {}
    try:
        with record() as trace, np.errstate(all="ignore"):
            call()
        programs, calls = _programs(trace, named), _calls(trace, named)
    except Exception as e:  # noqa: BLE001
        errors.append(f"flash_attention_triton: {type(e).__name__}: {e}"[:300])
        programs = None
    steps = []
    for pid, accesses in (programs or {}).items():
        steps.append({"program": pid, **{a: _span(ix) for a, ix in accesses.items()},
                      "accesses": accesses})
    outputs = {name: _r(result[name].detach().cpu().double().numpy()) for name in ("out", "lse")
               if name in result}
    tiles = _key_tiles(calls, q.cpu().double().numpy(), k.cpu().double().numpy(), p)
    return {"lab": "00-kernel", "inputs": p, "programs": programs, "steps": steps,
            "outputs": outputs, "errors": errors, "calls": calls, "tiles": tiles}


def _key_tiles(calls: dict[str, list[list[Any]]], q: Any, k: Any, p: dict) -> dict[str, dict]:
    """Per program: its query rows and head (from its loads of q), and per tile of its key
    loop (its n-th load of k) the keys it loaded, and the running ``(m, l)`` of each row
    over the keys loaded so far (causal, natural log): the state those loads give a kernel
    that masks and rescales as the reference does. A kernel's registers are not memory, so
    this is what its loads imply; what it computed shows in what it stored (``out``,
    ``lse``)."""
    lq, lk, d = p["Lq"], p["Lk"], p["d"]
    scale = 1.0 / np.sqrt(d)
    out: dict[str, dict] = {}
    for pid, program in calls.items():
        q_ix = sorted({i for name, ix in program if name == "loads of q" for i in ix})
        rows = sorted({(i % (lq * d)) // d for i in q_ix})
        head = q_ix[0] // (lq * d) if q_ix else 0
        seen: set[int] = set()
        steps = []
        for name, ix in program:
            if name != "loads of k":
                continue
            keys = sorted({(i % (lk * d)) // d for i in ix})
            seen |= set(keys)
            m, l_ = [], []
            for r in rows:
                cols = [j for j in sorted(seen) if not p["causal"] or j <= r]
                s_row = q[0, head, r] @ k[0, head, cols].T * scale if cols else np.zeros(0)
                top = float(s_row.max()) if cols else float("-inf")
                m.append(top)
                l_.append(float(np.exp(s_row - top).sum()) if cols else 0.0)
            steps.append({"keys": _span(keys).replace("elements", "keys"), "m": _r(m),
                          "l": _r(l_)})
        width = {"stores of out": p["dv"], "stores of lse": 1}  # elements per query row
        stores = {name: _span(sorted({(i % (lq * width[name])) // width[name] for i in ix}))
                  .replace("elements", "rows") for name, ix in program if name in width}
        out[pid] = {"rows": rows, "head": head, "tiles": steps, "stores": stores}
    return out


def diff_lab00_kernel(mine: dict, ref: dict) -> dict | None:
    if mine["programs"] is None:
        return {"step": 0, "where": "the launch", "field": "raised",
                "yours": (mine["errors"] or ["raised"])[0], "reference": "ran"}
    found = _diff_programs(mine["programs"], ref["programs"])
    if found:
        pid, access, yours, reference = found
        order = list(ref["programs"])
        tile = _first_call(mine.get("calls", {}).get(pid), ref.get("calls", {}).get(pid),
                           "loads of k") if access in ("loads of k", "loads of v") else None
        where = f"program {pid}" + (f", key tile {tile + 1}" if tile is not None else "")
        return {"step": order.index(pid) if pid in order else len(order), "program": pid,
                "where": where, "field": access, "yours": yours, "reference": reference,
                "tile": tile}
    for name in ("out", "lse"):  # each on its own: a wrong lse is not an out bug
        value = _first_value(mine["outputs"].get(name), ref["outputs"][name])
        if value:
            return {"step": len(ref["programs"]) - 1, "where": f"flat element {value[0]} of "
                    f"{name}", "field": name, "yours": value[1], "reference": value[2]}
    return None
