#!/usr/bin/env bash
# Prepare a bare NVIDIA benchmark machine for helios in one command.
#
# Such a machine has the NVIDIA driver, python3 with PyTorch (CUDA) and most scientific wheels, but no
# Vulkan loader, no `vulkan`/`cffi`/`pycparser` wheels, and no network. Everything it lacks is brought
# along in two ignored folders of the checkout, filled beforehand on a machine that has the package
# registries:
#
#   tools/gpu_env.sh bundle      # here: .gl/ <- Debian loader packages, .whl/ <- cp312 manylinux wheels
#
# and then, on the GPU machine, in the repository root (carry .gl and .whl along):
#
#   source tools/gpu_env.sh      # unpacks the loader, installs the wheels, exports the env, prints `helios info`
#   python3 -m helios.bench matmul attention --json
#
# Sourcing keeps PYTHONPATH and VK_DRIVER_FILES in the calling shell. Running it (not sourcing) only
# checks that the set-up works. It never touches the network on the GPU machine.

_helios_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_helios_debs="libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2"
# The GPU image lacks only these of helios's runtime dependencies (numpy, tokenizers, safetensors, rich,
# matplotlib and mpi4py are there); pinned to what pyproject.toml and the binding's cffi need.
_helios_wheels="vulkan==1.3.275.1 cffi==1.17.1 pycparser==2.22"
_helios_nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
_helios_nvidia_egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json

_helios_bundle() {
    set -e
    cd "$_helios_root"
    mkdir -p .gl .whl /tmp/helios-amd64-lists/partial
    local o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/helios-amd64-lists"
    # shellcheck disable=SC2086
    apt-get $o update -qq
    # shellcheck disable=SC2086
    (cd .gl && apt-get $o download $_helios_debs)
    local pip="${PYTHON:-python3} -m pip"
    # shellcheck disable=SC2086
    $pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl $_helios_wheels
    echo "bundled: $(ls .gl | wc -l) Debian packages in .gl/, $(ls .whl | wc -l) wheels in .whl/"
    echo "carry [\".gl\", \".whl\"] to the GPU machine and run: source tools/gpu_env.sh"
}

_helios_setup() {
    cd "$_helios_root" || return 2
    if ! ls .gl/*.deb >/dev/null 2>&1 || ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "gpu_env: .gl/*.deb or .whl/*.whl is missing: run 'tools/gpu_env.sh bundle' on a machine with" \
             "the package registries, then carry .gl and .whl here" >&2
        return 2
    fi
    if ! ldconfig -p | grep -q 'libvulkan.so.1 '; then
        for f in .gl/*.deb; do dpkg -x "$f" /; done
        ldconfig
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/helios-site .whl/*.whl || return 2
    export PYTHONPATH="$_helios_root:/tmp/helios-site${PYTHONPATH:+:$PYTHONPATH}"
    if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$_helios_nvidia_icd" ]; then
        export VK_DRIVER_FILES="$_helios_nvidia_icd"
        export __EGL_VENDOR_LIBRARY_FILENAMES="$_helios_nvidia_egl"
    fi
    export PYTHONUNBUFFERED=1
    python3 -m helios info || return 2
}

if [ "${1:-}" = bundle ]; then
    (_helios_bundle)
    exit $?
fi
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    _helios_setup
    exit $?
fi
_helios_setup
