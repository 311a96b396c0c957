#!/usr/bin/env bash
# Install the Debian packages the project runs for real, only those missing.
# Usage: scripts/debian-packages.sh CHECK=PACKAGE ...
#   CHECK is a command that must be on PATH (promtool=prometheus), py:MODULE, a
#   module python3 must import (py:ensurepip=python3-venv), or include:HEADER, a C
#   header python3's own include directory must hold (include:Python.h=python3-dev).
# Running it twice is harmless: what is already there installs nothing.
set -euo pipefail

missing=()
for pair in "$@"; do
  check="${pair%%=*}" package="${pair#*=}"
  case "$check" in
    py:*) "${PYTHON:-python3}" -c "import ${check#py:}" >/dev/null 2>&1 || missing+=("$package") ;;
    include:*)
      include=$("${PYTHON:-python3}" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
      [ -f "$include/${check#include:}" ] || missing+=("$package") ;;
    *) command -v "$check" >/dev/null 2>&1 || missing+=("$package") ;;
  esac
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
