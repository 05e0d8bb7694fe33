#!/usr/bin/env bash
# Keep Debian 12's own lavapipe (Mesa 22.3) beside the system's newer one, for regression checks, without
# touching the system: the package is downloaded and unpacked into .mesa22/ (git-ignored), and a copy of
# its ICD file points the Vulkan loader at the unpacked driver.
#
#   tools/mesa22.sh                                   # once: fetch and unpack; prints the variable to set
#   VK_DRIVER_FILES=$PWD/.mesa22/lvp_icd.json make test
#   VK_DRIVER_FILES=$PWD/.mesa22/lvp_icd.json .venv/bin/python -m helios info    # "Mesa 22.3.6"
set -euo pipefail
cd "$(dirname "$0")/.."
version="${MESA22_VERSION:-22.3.6-1+deb12u2}"
dest=.mesa22
if [ ! -f "$dest/lvp_icd.json" ]; then
    mkdir -p "$dest/pkg"
    (cd "$dest/pkg" && apt-get download "mesa-vulkan-drivers=$version" >/dev/null)
    dpkg -x "$dest"/pkg/mesa-vulkan-drivers_*.deb "$dest/root"
    lib=$(find "$PWD/$dest/root" -name 'libvulkan_lvp.so' | head -n1)
    [ -n "$lib" ] || { echo "mesa22: libvulkan_lvp.so not found in the package" >&2; exit 2; }
    icd=$(find "$dest/root" -name 'lvp_icd*.json' | head -n1)
    sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$lib\"#" "$icd" > "$dest/lvp_icd.json"
fi
echo "export VK_DRIVER_FILES=$PWD/$dest/lvp_icd.json"
