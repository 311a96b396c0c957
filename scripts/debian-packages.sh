#!/usr/bin/env bash
# Install the Debian packages the project runs for real, only those missing.
# Usage: scripts/debian-packages.sh COMMAND=PACKAGE ...   (e.g. promtool=prometheus)
# Running it twice is harmless: a command already on PATH installs nothing.
set -euo pipefail

missing=()
for pair in "$@"; do
  command="${pair%%=*}" package="${pair#*=}"
  command -v "$command" >/dev/null 2>&1 || missing+=("$package")
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
