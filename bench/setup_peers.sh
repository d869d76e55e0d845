#!/usr/bin/env bash
# Create the peers' virtual environments under bench/.envs/ (git-ignored). Idempotent.
#   bench/setup_peers.sh            # both peers
#   bench/setup_peers.sh flower     # only Flower
#   bench/setup_peers.sh pfl        # only pfl
# torch is pinned in every install: any spec that admits a newer torch pulls a multi-GB CUDA build.
# fedrun itself is NOT installed into these environments: the peer scripts put the repo root on
# sys.path and import only fedrun.models (which needs torch alone).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ENVS="$HERE/.envs"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
FLWR_PIN="flwr[simulation]==1.42.0"
PFL_PIN="pfl[pytorch]==0.6.0"

export FLWR_HOME="$ENVS/flwr_home"
mkdir -p "$ENVS" "$FLWR_HOME"

make_env() {  # name, marker-spec, pip args...
    local name="$1" marker="$2"; shift 2
    local env="$ENVS/$name"
    if [[ -f "$env/.installed" ]] && [[ "$(cat "$env/.installed")" == "$marker" ]]; then
        echo "[setup_peers] $name: up to date ($marker)"
        return
    fi
    echo "[setup_peers] $name: creating $env"
    [[ -x "$env/bin/python" ]] || "$PYTHON" -m venv "$env"
    "$env/bin/python" -m pip install --quiet --upgrade pip
    "$env/bin/python" -m pip install --quiet "$@" numpy
    "$env/bin/python" - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert torch.version.cuda is None, f"CUDA build of torch installed: {torch.version.cuda}"
PY
    echo "$marker" > "$env/.installed"
    echo "[setup_peers] $name: done"
}

stop_superlinks() {
    # `flwr run` (not used by bench/peer_flower.py, which uses run_simulation) leaves a
    # flower-superlink daemon running. Stop any started from these environments, by PID.
    local pid
    for pid in $(pgrep -f "$ENVS/flower/bin/flower-superlink" || true); do
        echo "[setup_peers] stopping flower-superlink pid $pid"
        kill "$pid" 2>/dev/null || true
    done
}

want="${1:-all}"
if [[ "$want" == all || "$want" == flower ]]; then
    make_env flower "$FLWR_PIN $TORCH_PIN" "$FLWR_PIN" "$TORCH_PIN"
    stop_superlinks
fi
if [[ "$want" == all || "$want" == pfl ]]; then
    make_env pfl "$PFL_PIN $TORCH_PIN" "$PFL_PIN" "$TORCH_PIN"
fi
