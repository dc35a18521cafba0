#!/bin/sh
# Make SimGrid's Python module importable from a virtual environment (the step simulator, simulator/, runs on it).
# Debian/Ubuntu: installs python3-simgrid (SimGrid 3.32 on Debian 12) when run as root, then puts a folder that
# holds only a link to its module on the venv's path (a .pth file), so none of the system's other packages
# shadow the venv's. Elsewhere: install SimGrid's Python bindings yourself (conda: `conda install -c conda-forge
# simgrid`; pip: `pip install simgrid` builds it from source, needs cmake, a C++17 compiler and boost) and
# this script finds them. Usage: scripts/setup_simgrid.sh VENV_PYTHON
set -eu
PY="$1"
if "$PY" -c "import simgrid" 2>/dev/null; then exit 0; fi
suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
module="/usr/lib/python3/dist-packages/simgrid$suffix"
if [ ! -f "$module" ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get install -y -q python3-simgrid >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q python3-simgrid >/dev/null; }
fi
if [ ! -f "$module" ]; then
    echo "setup_simgrid: no SimGrid Python module for $("$PY" -V) ($module is missing)." >&2
    echo "  Debian/Ubuntu as root: apt-get install python3-simgrid (its module must match the venv's Python);" >&2
    echo "  conda: conda install -c conda-forge simgrid; pip: pip install simgrid (a source build: cmake, boost)." >&2
    exit 1
fi
venv=$("$PY" -c "import sys; print(sys.prefix)")
site=$("$PY" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
mkdir -p "$venv/simgrid-module"
ln -sf "$module" "$venv/simgrid-module/simgrid$suffix"
echo "$venv/simgrid-module" > "$site/zen-simgrid.pth"
"$PY" -c "import simgrid" >/dev/null 2>&1 || { echo "setup_simgrid: the module is linked but does not import" >&2; exit 1; }
