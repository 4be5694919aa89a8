#!/usr/bin/env bash
# Makes the two Python virtual environments the XGBoost interop tests use:
#   $DIR/xgb17 : xgboost==1.7.6 (classic rabit protocol)
#   $DIR/xgb3  : the newest xgboost 3.x pip offers for this Python (JSON protocol)
# DIR defaults to target/xgboost-venvs. Idempotent: an environment that imports its
# xgboost is kept. Prints the two interpreters' paths as shell assignments on stdout.
# --no-deps for xgboost: 3.x declares the NCCL wheel (hundreds of MB) that CPU
# training never loads; numpy and scipy are installed explicitly.
set -euo pipefail
DIR="${1:-target/xgboost-venvs}"
mkdir -p "$DIR"
PY="${PYTHON:-python3}"

make_venv() {
    local name="$1" spec="$2" check="$3"
    local venv="$DIR/$name"
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
        return 0
    fi
    rm -rf "$venv"
    if ! "$PY" -m venv "$venv" >/dev/null 2>&1; then
        # Debian's python3 lacks ensurepip until python3-venv is installed.
        echo "installing python3-venv" >&2
        apt-get update -qq >&2 && apt-get install -y -qq python3-venv >&2
        rm -rf "$venv"
        "$PY" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$spec" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy scipy >&2
    "$venv/bin/python" -c "$check"
}

make_venv xgb17 "xgboost==1.7.6" "import xgboost; assert xgboost.__version__ == '1.7.6'"
make_venv xgb3 "xgboost>=3,<4" "import xgboost; assert xgboost.__version__.startswith('3.')"
echo "SWITCHYARD_XGB17_PYTHON=$(cd "$DIR/xgb17/bin" && pwd)/python"
echo "SWITCHYARD_XGB3_PYTHON=$(cd "$DIR/xgb3/bin" && pwd)/python"
