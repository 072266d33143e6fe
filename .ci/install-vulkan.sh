#!/usr/bin/env bash
# Installs Mesa's software Vulkan driver (lavapipe) so the wgpu backend's tests run on a
# machine without a GPU. Idempotent: nothing is installed when the packages are present.
set -euo pipefail

pkgs="mesa-vulkan-drivers libvulkan1"
if dpkg -s $pkgs >/dev/null 2>&1; then
  echo "install-vulkan: $pkgs already installed"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-vulkan: apt-get not found; install a Vulkan driver (e.g. Mesa lavapipe) by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
echo "install-vulkan: installed $pkgs"
