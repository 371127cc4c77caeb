#!/bin/bash
# Gate 3 (SGLang 0.5.11) on the lent H200, profile h200-ep1 (issue 28): scripts/device/gate_vllm_h200.sh with
# ENGINE=sglang, after `seed_engine.sh split sglang` here and one `seed_engine.sh receive` call per part there.
exec env ENGINE=sglang bash "$(dirname "$0")/gate_vllm_h200.sh" "$@"
