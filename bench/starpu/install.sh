#!/usr/bin/env bash
# Install StarPU (development files) + pkg-config from the distribution (Debian/Ubuntu).
# Idempotent: does nothing if a StarPU pkg-config module is already usable.
set -euo pipefail

detect() {
    command -v pkg-config >/dev/null 2>&1 || return 1
    for m in starpu-1.4 starpu-1.3; do
        if pkg-config --exists "$m"; then echo "$m"; return 0; fi
    done
    return 1
}

if mod=$(detect); then
    echo "install.sh: StarPU already installed ($mod $(pkg-config --modversion "$mod")), nothing to do"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: ERROR: StarPU not found and apt-get is unavailable; install StarPU >= 1.3 manually (pkg-config module starpu-1.3 or starpu-1.4)" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install.sh: ERROR: need root (or sudo) to apt-get install libstarpu-dev" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update; then
    echo "install.sh: ERROR: apt-get update failed" >&2
    exit 1
fi
if ! $SUDO apt-get install -y libstarpu-dev pkg-config; then
    echo "install.sh: ERROR: apt-get install libstarpu-dev pkg-config failed (package missing on this distribution?)" >&2
    exit 1
fi

if mod=$(detect); then
    echo "install.sh: installed StarPU ($mod $(pkg-config --modversion "$mod"))"
else
    echo "install.sh: ERROR: libstarpu-dev installed but no pkg-config module starpu-1.4/starpu-1.3 found" >&2
    exit 1
fi
