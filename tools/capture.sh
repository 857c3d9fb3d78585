#!/usr/bin/env bash
# Run a command on the GPU machine and keep its output, with a provenance header, in
# captured_outputs/ (the only way files should get there).
#
#   tools/capture.sh NAME -- COMMAND [ARGS...]
#
#   tools/capture.sh bench-h100 -- make bench
#   tools/capture.sh gpu-tests-h100 -- .venv/bin/python -m pytest -m gpu -v
#
# writes captured_outputs/NAME.txt:
#   # command: make bench
#   # date: 2026-11-22T19:00:00+00:00
#   # gpu: NVIDIA H100 80GB HBM3
#   # driver: ...
#   # cuda: ...
#   # torch: ...
#   # triton: ...
#   # commit: <sha>[+dirty]
#   <blank line>
#   <stdout and stderr of the command, interleaved as they came>
#   # exit status: 0 (finished 2026-11-22T19:03:12+00:00)
#
# Options (before NAME): --out DIR writes there instead (no GPU required outside
# captured_outputs/, e.g. to try the script on a laptop); --force overwrites NAME.txt.
# Without a CUDA device it refuses to write into captured_outputs/: that folder holds
# output recorded on real hardware only. Exits with the command's own status.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi

OUT="$ROOT/captured_outputs"
FORCE=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$(mkdir -p "$2" && cd "$2" && pwd)"; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) break ;;
    esac
done
if [[ $# -lt 3 || "$2" != "--" ]]; then
    echo "usage: tools/capture.sh [--out DIR] [--force] NAME -- COMMAND [ARGS...]" >&2
    exit 2
fi
NAME="$1"; shift 2
if [[ ! "$NAME" =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "NAME may hold letters, digits, '.', '_' and '-' only, got '$NAME'" >&2
    exit 2
fi
FILE="$OUT/$NAME.txt"
if [[ -e "$FILE" && $FORCE -eq 0 ]]; then
    echo "$FILE exists; pass --force to overwrite it" >&2
    exit 2
fi
if [[ "$OUT" == "$ROOT/captured_outputs" ]]; then
    if ! "$PY" -m bench.provenance --require-cuda >/dev/null; then
        echo "refusing: no CUDA device, and captured_outputs/ holds real GPU output only" >&2
        echo "(use --out DIR to try the script elsewhere)" >&2
        exit 3
    fi
fi

mkdir -p "$OUT"
TMP="$(mktemp "$OUT/.$NAME.XXXXXX")"
trap 'rm -f "$TMP"' EXIT
printf -v COMMAND '%q ' "$@"
COMMAND="${COMMAND% }"
"$PY" -m bench.provenance --header --command "$COMMAND" >"$TMP"
echo >>"$TMP"
echo ">> capturing into $FILE: $COMMAND" >&2
set +e
"$@" 2>&1 | tee -a "$TMP"
STATUS=${PIPESTATUS[0]}
set -e
echo "# exit status: $STATUS (finished $(date -u +%Y-%m-%dT%H:%M:%S+00:00))" >>"$TMP"
chmod 644 "$TMP"
mv "$TMP" "$FILE"
trap - EXIT
echo ">> wrote $FILE (exit status $STATUS)" >&2
exit "$STATUS"
