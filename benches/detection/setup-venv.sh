#!/usr/bin/env bash
# Makes (idempotently) the Python environments in which
# benches/detection/changepoints.py runs Apache Otava and MongoDB's
# E-Divisive, and prints the Python to run it with:
#
#   PY=$(bash benches/detection/setup-venv.sh)
#   "$PY" benches/detection/changepoints.py request.json answer.json
#
# Two virtual environments, because the libraries cannot share one:
# apache-otava 0.8.0 pins numpy==2.2.0.*, signal-processing-algorithms 2.1.6
# requires numpy<2 (and Python >=3.11,<3.12):
#
#   $DETECTION_VENV            apache-otava       (its bin/python is printed)
#   $DETECTION_VENV/edivisive  signal-processing-algorithms
#
# changepoints.py, run by either Python, re-executes itself with the other
# when the requested library is not importable. DETECTION_VENV defaults to
# ~/.cache/vllm-sentinel-detection-venv. DETECTION_PYTHON picks the base
# interpreter (default: the first Python 3.11 found). Non-interactive; every
# version is pinned, transitive dependencies included. Progress goes to
# stderr; the only line on stdout is the Python path.
set -euo pipefail

V="${DETECTION_VENV:-$HOME/.cache/vllm-sentinel-detection-venv}"
E="$V/edivisive"
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive

log() { echo "setup-venv: $*" >&2; }

# The versions, resolved once with `pip install apache-otava==0.8.0` and
# `pip install signal-processing-algorithms==2.1.6` on Python 3.11.
OTAVA_PINS='apache-otava==0.8.0
numpy==2.2.0
scipy==1.16.3
asn1crypto==1.5.1
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
ConfigArgParse==1.9.0
cryptography==50.0.2
dateparser==1.5.0
google-api-core==2.44.0
google-auth==2.63.0
google-cloud-bigquery==3.47.0
google-cloud-core==2.8.0
google-crc32c==1.9.0
google-resumable-media==2.11.0
googleapis-common-protos==1.76.0
grpcio==1.85.3
grpcio-status==1.85.3
idna==3.20
opentelemetry-api==1.45.2
packaging==26.4
pg8000==1.31.6
proto-plus==1.29.0
protobuf==7.36.2
pyasn1==0.6.5
pyasn1_modules==0.4.2
pycparser==3.12
pystache==0.6.8
python-dateutil==2.9.0.post0
pytz==2026.6
regex==2026.11.19
requests==2.34.2
ruamel.yaml==0.18.16
ruamel.yaml.clib==0.2.15
scramp==1.5.0
six==1.17.0
slack_sdk==3.48.0
tabulate==0.10.0
typing_extensions==4.16.0
tzlocal==5.4.5
urllib3==2.8.0
validators==0.36.0'

EDIVISIVE_PINS='signal-processing-algorithms==2.1.6
numpy==1.26.4
scipy==1.17.1
gevent==24.11.1
greenlet==3.5.6
more-itertools==8.14.0
PyYAML==6.0.4
setuptools==70.3.0
structlog==24.4.0
typing_extensions==4.16.0
zope.event==6.2
zope.interface==8.7'

is311() { "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; }

pick_python() {
    if [[ -n "${DETECTION_PYTHON:-}" ]]; then
        echo "$DETECTION_PYTHON"
        return
    fi
    local c
    for c in python3.11 python3 /usr/bin/python3.11 /usr/bin/python3; do
        if command -v "$c" >/dev/null 2>&1 && is311 "$(command -v "$c")"; then
            # The interpreter itself, not a pyenv shim.
            "$(command -v "$c")" -c 'import sys; print(sys.executable)'
            return
        fi
    done
    log "no Python 3.11 found (signal-processing-algorithms 2.1.6 needs >=3.11,<3.12); set DETECTION_PYTHON"
    exit 1
}

make_venv() { # DIR
    local dir=$1
    if [[ -x "$dir/bin/python" ]] && "$dir/bin/python" -m pip --version >/dev/null 2>&1; then
        return
    fi
    log "creating $dir with $PY"
    if ! "$PY" -m venv "$dir" >&2; then
        # Debian's python3 lacks ensurepip without python3-venv.
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log "installing python3-venv"
            apt-get install -y python3-venv python3.11-venv >&2 \
                || { apt-get update >&2 && apt-get install -y python3-venv python3.11-venv >&2; }
            rm -rf "$dir"
            "$PY" -m venv "$dir" >&2
        else
            log "python -m venv failed; install python3-venv"
            exit 1
        fi
    fi
}

install_pins() { # DIR NAME PINS CHECK
    local dir=$1 name=$2 pins=$3 check=$4
    local want stamp="$dir/.detection-$name-stamp"
    want=$(printf '%s\n%s\n' "$("$dir/bin/python" -V 2>&1)" "$pins" | sha256sum | cut -d' ' -f1)
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
        log "$name: up to date in $dir"
        return
    fi
    log "$name: installing pinned packages into $dir"
    printf '%s\n' "$pins" >"$dir/requirements-$name.txt"
    "$dir/bin/python" -m pip install --no-input --quiet -r "$dir/requirements-$name.txt" >&2
    "$dir/bin/python" -c "$check" >&2
    echo "$want" >"$stamp"
}

mkdir -p "$(dirname "$V")"
# Two concurrent runs (CI jobs, two shells) must not install into one venv at once.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$V.lock"
    flock 9
fi

PY=$(pick_python)
make_venv "$V"
install_pins "$V" otava "$OTAVA_PINS" 'import otava.series, otava.analysis'
make_venv "$E"
install_pins "$E" edivisive "$EDIVISIVE_PINS" \
    'import signal_processing_algorithms.energy_statistics.energy_statistics'

if ! "$E/bin/python" -c 'from signal_processing_algorithms.energy_statistics import cext_calculator as c; import sys; sys.exit(0 if c.C_EXTENSION_LOADED else 1)' >/dev/null 2>&1; then
    log "warning: E-Divisive's C extension did not build (no C compiler?); it runs its numpy code, much slower"
fi
log "otava:     $V/bin/python"
log "edivisive: $E/bin/python"
echo "$V/bin/python"
