#!/usr/bin/env bash
# make vllm-check: compare lab-02's selector with the real vLLM 0.33.0 package.
#
# Builds .venv-vllm (once): CPU torch 2.13.0, the vllm==0.33.0 wheel WITHOUT its
# dependencies (they pin a CUDA torch 2.14.0 and ~2 GB of GPU kernels), then only the
# packages that importing vLLM's attention backends needs, pinned as vLLM's METADATA pins
# them where it does. Then runs the tests marked `vllm` in labs/lab-02-backend-selection.
# A second run installs nothing. Set VLLM_WHEEL=/path/to/vllm-0.33.0-...whl to install
# from a wheel you already downloaded (pip download --no-deps vllm==0.33.0).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-vllm
PY="$VENV/bin/python"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.lab02-vllm-check"
LAB=labs/lab-02-backend-selection

# Everything `import vllm.v1.attention.backends.*` touches on a CPU-only machine.
RUNTIME_PACKAGES=(
  "numpy" "pytest" "pytest-timeout" "hypothesis"
  "regex" "psutil" "pyzmq" "pydantic>=2.12.0" "cachetools" "msgspec" "cloudpickle" "pyyaml"
  "cbor2" "requests" "transformers>=5.16.1,<5.21.0" "aiohttp" "openai>=2.25.0"
  "openai-harmony" "pillow" "pybase64" "uvloop" "py-cpuinfo" "prometheus_client"
  "xgrammar==0.2.8" "fastapi>=0.133.0,<0.137.0" "partial-json-parser" "einops"
  "llguidance>=1.7.0,<1.8.0" "nvidia-ml-py" "apache-tvm-ffi==0.1.11"
)
WANT="torch==2.13.0 vllm==0.33.0 flashinfer-python==0.7.2.post1 ${RUNTIME_PACKAGES[*]}"

pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
  | grep -vE "is ignored: it is neither a file|dependency conflicts|^vllm 0.33.0 requires|^flashinfer-python .* requires" || true; }

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && "$PY" -c "import vllm" 2>/dev/null; then
  echo ">> $VENV already has vllm 0.33.0 and its import-time packages: installing nothing"
else
  if [[ ! -x "$PY" ]]; then
    echo ">> creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
  fi
  echo ">> installing torch==2.13.0 (CPU) into $VENV"
  pip_install "torch==2.13.0"
  echo ">> installing vllm==0.33.0 with --no-deps (the wheel is 336 MB)"
  pip_install --no-deps "${VLLM_WHEEL:-vllm==0.33.0}"
  echo ">> installing flashinfer-python==0.7.2.post1 with --no-deps (vLLM's pin)"
  pip_install --no-deps "flashinfer-python==0.7.2.post1"
  echo ">> installing the packages vLLM's import needs (not its CUDA stack)"
  pip_install "torch==2.13.0" "${RUNTIME_PACKAGES[@]}"
  for extra in torchvision torchcodec torchaudio; do
    if "$PY" -m pip show -q "$extra" >/dev/null 2>&1; then
      echo ">> removing $extra (pulled in by a dependency; it does not match the CPU torch)"
      "$PY" -m pip uninstall --quiet -y "$extra"
    fi
  done
  "$PY" -c "import torch, vllm; assert vllm.__version__ == '0.33.0', vllm.__version__; \
assert torch.__version__.startswith('2.13.0'), torch.__version__"
  echo "$WANT" > "$STAMP"
fi

echo ">> $("$PY" -c 'import vllm, torch; print(f"vllm {vllm.__version__}, torch {torch.__version__}")')"
echo ">> running the conformance tests of ${LAB_IMPL:-solution}.py (pytest -m vllm $LAB)"
SUMMARY="$(mktemp)"
trap 'rm -f "$SUMMARY"' EXIT
status=0
LAB_IMPL="${LAB_IMPL:-solution}" LAB02_CONFORMANCE_SUMMARY="$SUMMARY" "$PY" -m pytest -m vllm "$LAB" -q \
  -p no:cacheprovider -W ignore::DeprecationWarning || status=$?
echo ">> conformance summary:"
sed 's/^/   /' "$SUMMARY"
exit "$status"
