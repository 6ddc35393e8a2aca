#!/usr/bin/env bash
# The GPU check: batch invariance and capacity of the verifier on one GPU, in under 10 minutes.
#
#   scripts/gpu_check.sh                    # cuda, bfloat16, the default Gemma pair
#   DEVICE=cpu DTYPE=float32 TINY=1 SESSIONS="1 2" scripts/gpu_check.sh   # the CPU variant (the test suite runs it)
#
# 1. identity: a row's logits alone (one token per forward) against the same rows in blocks beside
#    batch-mates, bit for bit (`splitspec bench invariance`); on a GPU the kernels may choose by batch
#    shape, and the report says by how much rows then differ.
# 2. capacity: N concurrent sessions against one verifier on the device, cloud-only and split,
#    printed as a table with every output checked against target-only decoding (`splitspec bench capacity`).
# Exit status: 0 when every capacity run was token-identical (step 1 is reported, not required on a GPU).
set -euo pipefail

DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
SESSIONS=${SESSIONS:-"1 2 4 8 16 32 64"}
TOKENS=${TOKENS:-32}
SPLITSPEC=${SPLITSPEC:-splitspec}
MODELS=()
if [[ -n "${TINY:-}" ]]; then MODELS=(--tiny); fi

echo "== batch invariance on $DEVICE/$DTYPE"
"$SPLITSPEC" bench invariance "${MODELS[@]}" --device "$DEVICE" --dtype "$DTYPE" --trials 3 \
    || echo "(rows were not bit-identical on $DEVICE/$DTYPE: see max_abs_diff)"

echo "== capacity on $DEVICE/$DTYPE, sessions: $SESSIONS"
# shellcheck disable=SC2086  # SESSIONS is a list of counts
"$SPLITSPEC" bench capacity "${MODELS[@]}" --device "$DEVICE" --dtype "$DTYPE" --unpinned \
    --sessions $SESSIONS --max-new-tokens "$TOKENS"
