#!/bin/sh
# Make SimGrid's Python module importable from a virtual environment (the step simulator, simulator/, runs on it).
# SimGrid is optional: without it `make` and `make test` still run, the simulator's tests skip (saying why) and
# the report's simulated column reads "not run here". Debian/Ubuntu as root: installs python3-simgrid (SimGrid
# 3.32 on Debian 12) and puts a folder that holds only a link to its module on the venv's path (a .pth file),
# so none of the system's other packages shadow the venv's. Elsewhere install SimGrid's Python bindings
# yourself (conda: `conda install -c conda-forge simgrid`; pip: `pip install simgrid` builds it from source,
# needs cmake, a C++17 compiler and boost) and this script finds them.
# Usage: scripts/setup_simgrid.sh VENV_PYTHON [SYSTEM_MODULE_DIR]   (the folder defaults to Debian's)
set -eu
PY="$1"
DIST="${2:-/usr/lib/python3/dist-packages}"
if "$PY" -c "import simgrid" 2>/dev/null; then exit 0; fi
suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
module="$DIST/simgrid$suffix"
if [ ! -f "$module" ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get install -y -q python3-simgrid >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q python3-simgrid >/dev/null 2>&1; } || true
fi
if [ ! -f "$module" ]; then
    echo "setup: SimGrid's Python module for $("$PY" -V) is missing (optional: the simulator's tests skip, the report's simulated column reads 'not run here'); get it with 'conda install -c conda-forge simgrid', as root on Debian/Ubuntu 'apt-get install python3-simgrid', or a source build 'pip install simgrid' (cmake, boost), then rerun make setup" >&2
    exit 0
fi
venv=$("$PY" -c "import sys; print(sys.prefix)")
site=$("$PY" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
mkdir -p "$venv/simgrid-module"
ln -sf "$module" "$venv/simgrid-module/simgrid$suffix"
echo "$venv/simgrid-module" > "$site/zen-simgrid.pth"
"$PY" -c "import simgrid" >/dev/null 2>&1 || { echo "setup_simgrid: $module is linked but does not import" >&2; exit 1; }
