#!/usr/bin/env bash
# The GPU check: the verifier on one GPU, measured in one command that fits a short lease (<= 8 minutes
# on an H200; sections and their budget in sim/bench/gpu_check.py). Writes OUT_DIR/gpu_check.json.
#
#   scripts/gpu_check.sh prepare        # here, once: the wheels a bare GPU image lacks (.whl/) and the tiny
#                                       # target for the service section (.gpu/tiny-target), neither committed
#   scripts/gpu_check.sh                # there: cuda, bfloat16, every section
#   DEVICE=cpu scripts/gpu_check.sh --dry-run    # the CPU dry run at tiny shapes (the test suite runs it)
#
# Extra arguments go to `splitspec bench gpu-check` (--sections, --budget-s, --repeats; --help), which runs
# here as `python -m sim.cli bench gpu-check`.
# On the GPU machine the repo is not installed: it runs from the checkout (PYTHONPATH), with the wheels in
# .whl/ installed under /tmp/site first where they travelled and the image lacks them. Exit status: 0 when every section ran and
# every service session was identical to target-only decoding.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
OUT_DIR=${OUT_DIR:-${OUT:-$ROOT/gpu-check-out}}
# What the GPU image lacks (its torch, transformers, numpy, safetensors, prometheus-client are used as they
# are), at the versions this repo's lock tested: the protocol's generated code checks its protobuf runtime.
WHEELS=(grpcio==1.85.3 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.2
        tenacity==9.2.1 zstandard==0.25.0)

if [[ "${1:-}" == "prepare" ]]; then
    cd "$ROOT"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${WHEELS[@]}"
    "$PYTHON" -c "from sim.fixtures.tiny_models import write_tiny_models; print(write_tiny_models('.gpu', seed=0)['target'])"
    echo "prepared: .whl/ ($(du -sh .whl | cut -f1)) and .gpu/target; carry both (run's carry: [\".whl\", \".gpu\"])"
    exit 0
fi

cd "$ROOT"
if ! "$PYTHON" -c "import grpc_health, grpc_reflection, tenacity, zstandard" 2> /dev/null \
        && compgen -G ".whl/*.whl" > /dev/null; then  # a bare GPU image: the wheels that travelled
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT" PYTHONUNBUFFERED=1
TINY=()
if [[ -d .gpu/target ]]; then TINY=(--tiny-target .gpu/target); fi
exec "$PYTHON" -m sim.cli bench gpu-check --out "$OUT_DIR" --device "$DEVICE" "${TINY[@]}" "$@"
