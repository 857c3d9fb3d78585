"""Extract vLLM 0.33.0's attention-backend facts from the wheel's source into a JSON file.

The lab grades against vLLM 0.33.0. Rather than typing its backend tables by hand, this
script reads the *source* of the published wheel with ``ast`` (it imports nothing from
vLLM, so it needs neither a GPU nor vLLM's dependencies) and writes lab 02's
``labs/lab-02-backend-selection/vllm_0_33_facts.json``. Every fact carries a citation: the
file inside the wheel, the line, and the class / function it was read from.

An instructor's tool, not part of the lab or of ``make test``: the committed facts file is
its output. Get the source and run it from the repository root (about a minute, most of it
the 336 MB download)::

    pip download --no-deps --only-binary :all: vllm==0.33.0 -d /tmp/vllm-wheel
    .venv/bin/python tools/extract_vllm_facts.py \
        --wheel /tmp/vllm-wheel/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl

or point ``--source`` at a directory that holds an unpacked ``vllm/`` tree; ``--out`` writes
elsewhere. ``make vllm-check`` runs it on the installed wheel and fails if the committed
file differs (``test_vllm_conformance.py``).

What it cannot read as data (a rule that asks the GPU which FlashAttention version
loads, for instance) it records as a ``rule`` with the source text and its line, and
the lab's selector implements that rule by hand with the same citation. Each backend's
``combination_reasons`` lists every string its ``supports_combination`` can return, in
the order the method tries them, with ``when`` (the source text of the tests around that
``return``); a string a helper returns (FlashMLA's ``is_flashmla_dense_supported()[1]``)
is followed into the helper and carries ``via`` and the helper's ``cite``. The README's
"Reference" section says the same conditions in plain words. The layout of
``_get_backend_priorities`` is checked against the structure this lab expects: if a new
vLLM version reshapes it, the script stops instead of writing wrong facts.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import re
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "labs" / "lab-02-backend-selection" / "vllm_0_33_facts.json"
VERSION = "0.33.0"

# The backends the lab models: every backend that _get_backend_priorities can return for a
# layer without a multimodal prefix (TRITON_FLASHINFER and TRITON_FLASH_ATTN appear only
# with use_mm_prefix, which this lab does not model).
BACKENDS = [
    "FLASH_ATTN",
    "FLASHINFER",
    "TRITON_ATTN",
    "FLEX_ATTENTION",
    "TURBOQUANT",
    "FLASHINFER_MLA",
    "TOKENSPEED_MLA",
    "CUTLASS_MLA",
    "FLASH_ATTN_MLA",
    "FLASHMLA",
    "TRITON_MLA",
    "FLASHMLA_SPARSE",
    "FLASH_ATTN_MLA_SPARSE",
    "FLASH_ATTN_MLA_SPARSE_FA4",
    "FLASHINFER_MLA_SPARSE",
    "FLASHINFER_MLA_SPARSE_SM90",
    "FLASHINFER_MLA_SPARSE_SM120",
]
TORCH_DTYPES = {"float16", "bfloat16", "float32"}
# Which return of get_supported_kernel_block_sizes is the usual answer (default: the last).
# FlashInfer returns [16, 32, 64] first and advertises pages up to 1024 only for GQA on
# Blackwell with the TRTLLM kernels; either way any multiple of 16 is accepted.
DEFAULT_BLOCK_RETURN = {"FLASHINFER": 0}
# Methods whose answer is either a constant (a fact) or a rule that needs the platform.
FLAGS = {
    "is_mla": "is_mla",
    "is_sparse": "is_sparse",
    "supports_sink": "supports_sink",
    "supports_sliding_window": "supports_sliding_window",
}


class Source:
    """The unpacked ``vllm/`` tree: parsed modules, classes, citations."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self._trees: dict[str, ast.Module] = {}
        self._texts: dict[str, str] = {}

    def rel(self, module: str) -> str:
        return module.replace(".", "/") + ".py"

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            path = self.root / self.rel(module)
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: is --source an unpacked vLLM?")
            self._texts[module] = path.read_text()
            self._trees[module] = ast.parse(self._texts[module])
        return self._trees[module]

    def text(self, module: str) -> str:
        self.tree(module)
        return self._texts[module]

    def cite(self, module: str, node: ast.AST, what: str) -> str:
        return f"vllm/{self.rel(module)[5:]}:{node.lineno} {what}"

    def find_class(self, module: str, name: str) -> tuple[str, ast.ClassDef]:
        """The class ``name`` as seen from ``module`` (following ``from x import name``)."""
        tree = self.tree(module)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.find_class(node.module, alias.name)
        raise LookupError(f"class {name} not found from {module}")

    def mro(self, module: str, name: str) -> list[tuple[str, ast.ClassDef]]:
        """The single-inheritance chain from the class up to ``AttentionBackend``."""
        chain = [self.find_class(module, name)]
        while True:
            mod, cls = chain[-1]
            bases = [b for b in cls.bases if isinstance(b, ast.Name)]
            if not bases or cls.name == "AttentionBackend":
                return chain
            chain.append(self.find_class(mod, bases[0].id))


def _member(chain, name):
    """First definition of ``name`` (method or class attribute) along the chain."""
    for module, cls in chain:
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return module, cls, node
            if isinstance(node, ast.AnnAssign | ast.Assign):
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return module, cls, node
    raise LookupError(name)


def _returns(fn: ast.FunctionDef) -> list[ast.Return]:
    rets = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
    return sorted(rets, key=lambda n: n.lineno)


def _literal_list(node: ast.AST) -> list:
    """``[torch.float16, "auto", MultipleOf(16)]`` -> ``["float16", "auto", "MultipleOf(16)"]``."""
    if not isinstance(node, ast.List):
        raise ValueError(f"expected a list literal, got {ast.unparse(node)}")
    out = []
    for elt in node.elts:
        if isinstance(elt, ast.Constant):
            out.append(elt.value)
        elif isinstance(elt, ast.Attribute) and elt.attr in TORCH_DTYPES:
            out.append(elt.attr)
        elif isinstance(elt, ast.Call) and ast.unparse(elt.func) == "MultipleOf":
            out.append(ast.unparse(elt))
        else:
            raise ValueError(f"unexpected list element {ast.unparse(elt)}")
    return out


def _capability_rule(expr: ast.AST) -> dict:
    """Turn a ``supports_compute_capability`` return expression into data."""
    text = ast.unparse(expr)
    if text == "True":
        return {}
    rule: dict = {}
    parts = expr.values if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.And) else [expr]
    for part in parts:
        t = ast.unparse(part)
        if m := re.fullmatch(r"capability >= DeviceCapability\((\d+), (\d+)\)", t):
            rule["min"] = [int(m[1]), int(m[2])]
        elif m := re.fullmatch(r"capability <= DeviceCapability\((\d+), (\d+)\)", t):
            rule["max"] = [int(m[1]), int(m[2])]
        elif m := re.fullmatch(r"capability\.major == (\d+)", t):
            rule["majors"] = [int(m[1])]
        elif m := re.fullmatch(r"capability\.major in \[([\d, ]+)\]", t):
            rule["majors"] = [int(x) for x in m[1].split(",")]
        else:
            raise ValueError(f"unknown compute-capability rule: {text}")
    return rule


def _resolve_function(src: Source, module: str, fn: ast.FunctionDef, name: str):
    """``(module, def)`` of the function ``name`` called inside ``fn`` (or None).

    Looks where Python would: an import inside ``fn``, a function of ``module``, an
    import at the top of ``module``.
    """
    imports = [n for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)]
    imports += [n for n in src.tree(module).body if isinstance(n, ast.ImportFrom)]
    for node in src.tree(module).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return module, node
    for node in imports:
        for alias in node.names:
            if (alias.asname or alias.name) == name and node.module:
                target = src.tree(node.module)
                for d in target.body:
                    if isinstance(d, ast.FunctionDef) and d.name == alias.name:
                        return node.module, d
    return None


def _binding(fn: ast.FunctionDef, name: str) -> tuple[ast.Call, int | None] | None:
    """The call whose result ``name`` holds in ``fn``: ``x := f()`` or ``a, x = f()``."""
    for node in ast.walk(fn):
        if isinstance(node, ast.NamedExpr) and node.target.id == name:
            if isinstance(node.value, ast.Call):
                return node.value, None
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == name:
                return node.value, None
            if isinstance(target, ast.Tuple):
                for i, elt in enumerate(target.elts):
                    if isinstance(elt, ast.Name) and elt.id == name:
                        return node.value, i
    return None


class _ReasonTemplates:
    """Every string ``supports_combination`` can return, in source order, with its condition.

    ``when`` is the source text of the ``if`` (or ``except``) tests around the ``return``;
    a reason fires only when its ``when`` holds *and no earlier reason fired* (the method
    returns one string, the first that applies). A string that a helper returns
    (``return is_flashmla_dense_supported()[1]``, ``return reason`` after
    ``reason := helper()``) is followed into the helper: it gets ``via`` (the call) and
    ``cite`` (the helper's file and line), and its ``when`` joins both conditions.
    ``index`` picks one element of a helper's ``return flag, reason`` tuples.
    """

    def __init__(self, src: Source, module: str, fn: ast.FunctionDef, index: int | None,
                 depth: int) -> None:
        self.src, self.module, self.fn, self.index, self.depth = src, module, fn, index, depth
        self.out: list[dict] = []

    def walk(self, stmts: list[ast.stmt], conditions: list[str]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                test = ast.unparse(stmt.test)
                self.walk(stmt.body, [*conditions, test])
                self.walk(stmt.orelse, [*conditions, f"not ({test})"])
            elif isinstance(stmt, ast.Try):
                self.walk(stmt.body, conditions)
                for handler in stmt.handlers:
                    caught = ast.unparse(handler.type) if handler.type else "any exception"
                    self.walk(handler.body, [*conditions, f"the try block raised {caught}"])
            elif isinstance(stmt, ast.With | ast.For | ast.While):
                self.walk(stmt.body, conditions)
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                self.add(stmt.value, conditions, stmt.lineno)

    def add(self, value: ast.AST, conditions: list[str], line: int) -> None:
        """The string(s) one ``return value`` can give under ``conditions``."""
        if self.index is not None and isinstance(value, ast.Tuple):
            value = value.elts[self.index]
        when = " and ".join(f"({c})" if len(conditions) > 1 else c for c in conditions)
        entry = {"when": when or "always"}
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            self.out.append({"text": value.value, "line": line, **entry})
        elif isinstance(value, ast.JoinedStr):
            self.out.append({"text": ast.unparse(value), "line": line, "f_string": True,
                             **entry})
        else:
            self.follow(value, entry["when"], line)

    def follow(self, value: ast.AST, outer: str, line: int) -> None:
        """A returned helper call (or a name bound to one): the helper's strings."""
        call, pick = value, None
        if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
            call, pick = value.value, value.slice.value
        elif isinstance(value, ast.Name) and (bound := _binding(self.fn, value.id)):
            call, pick = bound
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            return  # None, a flag, or super().supports_combination(...)
        found = _resolve_function(self.src, self.module, self.fn, call.func.id)
        if found is None or self.depth > 3:
            raise ValueError(f"cannot follow {ast.unparse(value)} at line {line}")
        helper_module, helper = found
        for r in _reason_templates(self.src, helper_module, helper, pick, self.depth + 1):
            inner = r["when"]
            if outer != "always":
                r["when"] = outer if inner == "always" else f"({outer}) and ({inner})"
            r["via"] = ast.unparse(value) + (f" -> {r['via']}" if "via" in r else "")
            r.setdefault("cite", self.src.cite(helper_module, helper, helper.name))
            self.out.append(r)


def _reason_templates(
    src: Source, module: str, fn: ast.FunctionDef, index: int | None = None, depth: int = 0
) -> list[dict]:
    """``_ReasonTemplates``: every string ``fn`` can return, with its condition."""
    templates = _ReasonTemplates(src, module, fn, index, depth)
    templates.walk(fn.body, [])
    return templates.out


def backend_facts(src: Source, enum_paths: dict[str, str], name: str) -> dict:
    """What ``name``'s class (and the classes it inherits from) says, each fact cited."""
    module, cls_name = enum_paths[name].rsplit(".", 1)
    chain = src.mro(module, cls_name)
    mod0, cls0 = chain[0]
    facts: dict = {
        "class": cls_name,
        "file": f"vllm/{src.rel(mod0)[5:]}",
        "line": cls0.lineno,
        "inherits": [c.name for _, c in chain[1:]],
        "cite": {},
        "rules": {},
    }
    reader = _FactReader(src, chain, facts)
    for key, attr in (
        ("dtypes", "supported_dtypes"),
        ("kv_cache_dtypes", "supported_kv_cache_dtypes"),
    ):
        module, cls, node = reader.member(attr)
        facts[key] = _literal_list(node.value)
        facts["cite"][key] = src.cite(module, node, f"{cls.name}.{attr}")
    _head_size_facts(reader)
    _block_size_facts(reader, name)
    reader.rule_if_overridden("supports_kv_cache_dtype")
    module, cls, fn = reader.member("supports_compute_capability")
    facts["compute_capability"] = _capability_rule(_returns(fn)[-1].value)
    reader.cite("compute_capability", module, cls, fn)
    for key, method in FLAGS.items():
        _flag_fact(reader, key, method)
    _combination_facts(reader)
    return facts


class _FactReader:
    """Reads members along one backend's class chain into its ``facts`` dict."""

    def __init__(self, src: Source, chain: list, facts: dict) -> None:
        self.src, self.chain, self.facts = src, chain, facts

    def member(self, attr: str) -> tuple[str, ast.ClassDef, ast.AST]:
        return _member(self.chain, attr)

    def cite(self, key: str, module: str, cls: ast.ClassDef, node: ast.AST) -> None:
        member = node.name if isinstance(node, ast.FunctionDef) else key
        self.facts["cite"][key] = self.src.cite(module, node, f"{cls.name}.{member}")

    def rule(
        self, method: str, module: str, cls: ast.ClassDef, fn: ast.FunctionDef,
        source: str | None = None, **extra: str,
    ) -> None:
        """Record ``method`` as a rule: its source (default: all of ``fn``), its citation."""
        self.facts["rules"][method] = {
            "source": source if source is not None else ast.unparse(fn),
            "cite": self.src.cite(module, fn, f"{cls.name}.{method}"),
            **extra,
        }

    def rule_if_overridden(self, method: str) -> None:
        """A rule for ``method`` unless the backend keeps ``AttentionBackend``'s default."""
        module, cls, fn = self.member(method)
        if cls.name != "AttentionBackend":
            self.rule(method, module, cls, fn)


def _head_size_facts(reader: _FactReader) -> None:
    module, cls, fn = reader.member("get_supported_head_sizes")
    reader.facts["head_sizes"] = _literal_list(_returns(fn)[-1].value)
    reader.cite("head_sizes", module, cls, fn)
    module, cls, fn = reader.member("supports_head_size")
    if cls.name != "AttentionBackend":
        source = ast.unparse(fn.body[-1]) if len(fn.body) == 1 else ast.unparse(fn)
        reader.rule("supports_head_size", module, cls, fn, source=source)


def _block_size_facts(reader: _FactReader, name: str) -> None:
    module, cls, fn = reader.member("get_supported_kernel_block_sizes")
    rets = _returns(fn)
    default = rets[DEFAULT_BLOCK_RETURN.get(name, -1)]
    reader.facts["kernel_block_sizes"] = _literal_list(default.value)
    reader.cite("kernel_block_sizes", module, cls, fn)
    if len(rets) > 1:
        reader.rule(
            "get_supported_kernel_block_sizes", module, cls, fn,
            note=f"the listed value is the usual return (line {default.lineno}); the other "
            "returns are special cases, implemented by the lab's selector where they change a "
            "verdict",
        )  # fmt: skip
    reader.rule_if_overridden("supports_block_size")


def _flag_fact(reader: _FactReader, key: str, method: str) -> None:
    """A flag such as ``is_mla``: a constant ``return`` is a fact, anything else a rule."""
    module, cls, fn = reader.member(method)
    body = [
        s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    if (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Constant)
    ):
        reader.facts[key] = bool(body[0].value.value)
    else:
        reader.facts[key] = "rule"
        reader.rule(method, module, cls, fn)
    reader.cite(key, module, cls, fn)


def _combination_facts(reader: _FactReader) -> None:
    """``supports_combination``'s reasons, then its parent's when it calls ``super()``."""
    src, chain, facts = reader.src, reader.chain, reader.facts
    module, cls, fn = reader.member("supports_combination")
    facts["combination_reasons"] = _reason_templates(src, module, fn)
    if not facts["combination_reasons"] and cls.name == "AttentionBackend":
        return
    facts["cite"]["combination_reasons"] = src.cite(
        module, fn, f"{cls.name}.supports_combination"
    )
    if "super().supports_combination" not in ast.unparse(fn):
        return
    parent_chain = chain[[c.name for _, c in chain].index(cls.name) + 1 :]
    p_module, p_cls, p_fn = _member(parent_chain, "supports_combination")
    facts["combination_reasons_then"] = _reason_templates(src, p_module, p_fn)
    facts["cite"]["combination_reasons_then"] = src.cite(
        p_module, p_fn, f"{p_cls.name}.supports_combination"
    )


def enum_paths(src: Source) -> tuple[dict[str, str], ast.ClassDef]:
    module = "vllm.v1.attention.backends.registry"
    _, enum = src.find_class(module, "AttentionBackendEnum")
    paths = {}
    for node in enum.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                paths[node.targets[0].id] = value.value
    return paths, enum


def base_reasons(src: Source) -> list[dict]:
    """The reasons of ``AttentionBackend.validate_configuration``, in append order."""
    module = "vllm.v1.attention.backend"
    _, cls = src.find_class(module, "AttentionBackend")
    fn = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "validate_configuration"
    )
    out = []

    def walk(stmts, conditions):
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                test = ast.unparse(stmt.test)
                walk(stmt.body, [*conditions, test])
                walk(stmt.orelse, [*conditions, f"not ({test})"])
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                call = stmt.value
                if ast.unparse(call.func) == "invalid_reasons.append" and conditions:
                    arg = call.args[0]
                    text = arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg)
                    when = " and ".join(f"({c})" if len(conditions) > 1 else c for c in conditions)
                    out.append({"reason": text, "when": when, "line": stmt.lineno})

    walk(fn.body, [])
    out.sort(key=lambda r: r["line"])
    for r in out:
        r["cite"] = (
            f"vllm/v1/attention/backend.py:{r['line']} AttentionBackend.validate_configuration"
        )
    return out


def _enum_names(node: ast.AST) -> list:
    """Elements of a priority list: names, guarded names, or splices of another list."""
    out = []
    for elt in node.elts:
        if isinstance(elt, ast.Attribute):
            out.append(elt.attr)
        elif isinstance(elt, ast.Starred) and isinstance(elt.value, ast.Name):
            out.append({"splice": elt.value.id})
        elif isinstance(elt, ast.Starred) and isinstance(elt.value, ast.IfExp):
            names = [e.attr for e in elt.value.body.elts]
            out.append({"only_if": ast.unparse(elt.value.test), "backends": names})
        else:
            raise ValueError(f"unexpected priority element {ast.unparse(elt)}")
    return out


# The lists of _get_backend_priorities, in source order, with the names this lab gives them.
PRIORITY_LAYOUT = [
    "mla_sm10_sparse_quantized_kv",
    "mla_sm10_sparse_bf16_few_heads",
    "mla_sm10_sparse_bf16",
    "mla_major_10",
    "mla_major_12",
    "mla_other_sparse_tail",
    "mla_other",
    "non_mla_major_10_causal",
    "non_mla_other",
]


def priorities(src: Source) -> dict:
    module = "vllm.platforms.cuda"
    tree = src.tree(module)
    fn = next(
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "_get_backend_priorities"
    )
    lists = sorted(
        (
            n
            for n in ast.walk(fn)
            if isinstance(n, ast.List)
            and n.elts
            and any(
                isinstance(e, ast.Attribute) and ast.unparse(e).startswith("AttentionBackendEnum.")
                for e in n.elts
            )
            and len(n.elts) > 1
        ),
        key=lambda n: n.lineno,
    )
    if len(lists) != len(PRIORITY_LAYOUT):
        raise SystemExit(
            f"_get_backend_priorities has {len(lists)} priority lists, this lab expects "
            f"{len(PRIORITY_LAYOUT)}: re-read vllm/platforms/cuda.py and update the lab"
        )
    out: dict = {"cite": src.cite(module, fn, "_get_backend_priorities"), "lists": {}}
    for label, node in zip(PRIORITY_LAYOUT, lists):
        out["lists"][label] = {"backends": _enum_names(node), "line": node.lineno}
    # The one element that moves: FLASHINFER_MLA_SPARSE_SM90 goes first in the sparse tail
    # when head_size == 512, last otherwise.
    text = ast.unparse(fn)
    if "flashinfer_sparse = AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM90" not in text or (
        "if head_size == 512:\n                sparse_tail.insert(0, flashinfer_sparse)" not in text
    ):
        raise SystemExit("the SM90 sparse-tail rule of _get_backend_priorities changed")
    out["mla_other_sparse_tail_flashinfer"] = {
        "backend": "FLASHINFER_MLA_SPARSE_SM90",
        "first_if": "head_size == 512",
        "else": "last",
        "cite": out["cite"],
    }
    return out


def messages(src: Source) -> dict:
    """The selector's error messages and the override facts, with citations."""
    cuda = "vllm.platforms.cuda"
    text = src.text(cuda)
    found = {}
    for key, needle in {
        "override_invalid": 'f"Selected backend {selected_backend} is not valid for "',
        "none_valid": 'f"No valid attention backend found for {cls.device_name} "',
        "block_size_precluded": '"--block-size %d precluded higher-priority backend(s) "',
        "chosen": '"Using %s attention backend out of potential backends: %s."',
    }.items():
        line = next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)
        found[key] = f"vllm/platforms/cuda.py:{line} CudaPlatformBase.get_attn_backend_cls"
    tree = src.tree(cuda)
    strings = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            s = ast.unparse(node)
            if "is not valid for" in s or "No valid attention backend" in s:
                strings.setdefault("override_invalid" if "is not valid" in s else "none_valid", s)
    envs_text = src.text("vllm.envs")
    arg_text = src.text("vllm.engine.arg_utils")
    attn_text = src.text("vllm.config.attention")
    iface_text = src.text("vllm.platforms.interface")

    def line_of(t, needle):
        return next(i for i, ln in enumerate(t.splitlines(), 1) if needle in ln)

    cli = line_of(arg_text, '"--attention-backend"')
    field = line_of(attn_text, "backend: AttentionBackendEnum | None = None")
    exclusive = line_of(arg_text, "attention_backend and attention_config.backend")
    fa_version = line_of(attn_text, "flash_attn_version: Literal[2, 3, 4] | None = None")
    unknown_env = line_of(iface_text, "Unknown vLLM environment variable detected: %s")
    return {
        "override_invalid_template": "Selected backend {selected_backend} is not valid for "
        "this configuration. Reason: {invalid_reasons}",
        "none_valid_template": "No valid attention backend found for {device_name} with "
        "{config_str}. Reasons: {reasons_str}.",
        "f_strings_in_source": strings,
        "cite": found,
        "override": {
            "cli_flag": "--attention-backend",
            "cli_cite": f"vllm/engine/arg_utils.py:{cli}",
            "config_field": "attention_config.backend",
            "config_cite": f"vllm/config/attention.py:{field} AttentionConfig.backend",
            "mutually_exclusive_cite": f"vllm/engine/arg_utils.py:{exclusive}",
            "flash_attn_version_cite": f"vllm/config/attention.py:{fa_version}",
            "VLLM_ATTENTION_BACKEND_in_envs": "VLLM_ATTENTION_BACKEND" in envs_text,
            "unknown_env_warning_cite": (
                f"vllm/platforms/interface.py:{unknown_env} Platform.validate_environ"
            ),
        },
    }


def kv_cache_dtypes(src: Source) -> dict:
    module = "vllm.config.cache"
    tree = src.tree(module)
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "CacheDType":
            values = [e.value for e in node.value.slice.elts]
            return {"values": values, "cite": src.cite(module, node, "CacheDType")}
    raise SystemExit("CacheDType not found in vllm/config/cache.py")


def fa_facts(src: Source) -> dict:
    """Where the FlashAttention version rules live (the lab: provided.flash_attn_version)."""
    fa = "vllm.v1.attention.backends.fa_utils"
    iface = "vllm.vllm_flash_attn.flash_attn_interface"
    out = {}
    for name in (
        "get_flash_attn_version",
        "flash_attn_supports_kv_cache_dtype",
        "flash_attn_supports_sinks",
        "flash_attn_supports_mla",
        "uses_fa4_hd256_kernel",
        "_fa4_hd256_fallback_reason",
    ):
        fn = next(n for n in src.tree(fa).body if isinstance(n, ast.FunctionDef) and n.name == name)
        out[name] = src.cite(fa, fn, name)
    for name in ("_is_fa2_supported", "_is_fa3_supported", "_is_fa4_supported"):
        fn = next(
            n for n in src.tree(iface).body if isinstance(n, ast.FunctionDef) and n.name == name
        )
        reasons = [
            c.value
            for c in ast.walk(fn)
            if isinstance(c, ast.Constant)
            and isinstance(c.value, str)
            and "only supported" in c.value
        ]
        out[name] = {"cite": src.cite(iface, fn, name), "unsupported_reason": reasons[0]}
    text = src.text(fa)
    m = re.search(r"FA4_HD256_PAGE_SIZE = (\d+)", text)
    out["FA4_HD256_PAGE_SIZE"] = int(m[1])
    return out


def version(src: Source) -> dict:
    text = (src.root / "vllm" / "_version.py").read_text()
    ver = re.search(r"__version__ = version = '([^']+)'", text)[1]
    commit = re.search(r"__commit_id__ = commit_id = '([^']+)'", text)
    if ver != VERSION:
        raise SystemExit(f"this source is vLLM {ver}, the lab is pinned to {VERSION}")
    return {"version": ver, "commit_id": commit[1] if commit else None}


def extract(root: pathlib.Path) -> dict:
    src = Source(root)
    paths, _ = enum_paths(src)
    return {
        "vllm": version(src),
        "generated_by": "tools/extract_vllm_facts.py (ast, wheel source)",
        "wheel": "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl (PyPI)",
        "base_reasons": base_reasons(src),
        "priorities": priorities(src),
        "kv_cache_dtypes": kv_cache_dtypes(src),
        "flash_attention": fa_facts(src),
        "selector": messages(src),
        "enum_names": sorted(paths),
        "backends": {name: backend_facts(src, paths, name) for name in BACKENDS},
    }


def unpack(wheel: pathlib.Path, into: pathlib.Path) -> pathlib.Path:
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.startswith("vllm/") and member.endswith(".py"):
                zf.extract(member, into)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--wheel", type=pathlib.Path, help="the vllm-0.33.0 wheel file")
    group.add_argument("--source", type=pathlib.Path, help="a directory holding vllm/")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = unpack(args.wheel, pathlib.Path(tmp)) if args.wheel else args.source
        facts = extract(root)
    args.out.write_text(json.dumps(facts, indent=1, sort_keys=False) + "\n")
    n = len(facts["backends"])
    print(f"wrote {args.out} ({n} backends, vLLM {facts['vllm']['version']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
