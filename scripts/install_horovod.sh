#!/usr/bin/env bash
# Build and install Horovod 0.28.1 into the given Python environment, with TensorFlow + Gloo
# (and NCCL where TensorFlow is a CUDA build: scripts/gpu_build.py).
#
# Why this script exists: `pip install horovod==0.28.1` (the last release) does not build against
# TensorFlow >= 2.16 wheels. horovod/tensorflow/xla_mpi_ops.cc includes XLA headers that TensorFlow's
# wheel no longer ships (highwayhash/arch_specific.h, farmhash.h, and
# tensorflow/compiler/xla/client/xla_builder.h, which moved). That one source only provides Horovod's
# XLA custom calls for `jit_compile=True` graphs, which hvdkeras never uses (it keeps every collective
# outside XLA-compiled code), so we drop it from the TensorFlow source list and build the rest.
#
# The built wheel is cached (key: Horovod version, TensorFlow version, Python tag, GPU ops and NCCL version), so a second
# install of a fresh venv takes seconds instead of minutes.
#
# Usage: scripts/install_horovod.sh PYTHON
# Environment:
#   HVDKERAS_CACHE_DIR      wheel cache (default: ${XDG_CACHE_HOME:-$HOME/.cache}/hvdkeras)
#   HOROVOD_GPU_OPERATIONS  force NCCL (or empty to force CPU-only); detected when unset (scripts/gpu_build.py)
#   HOROVOD_NCCL_HOME, HOROVOD_CUDA_HOME, CUDA_HOME   a system NCCL / CUDA toolkit, taking precedence
#   HVDKERAS_HOROVOD_PLAN_ONLY=1   print the build's GPU variables and cache tag, then stop (builds nothing)
set -euo pipefail

PY=${1:?usage: install_horovod.sh PYTHON}
HVD_VERSION=0.28.1
# Bumped whenever the patches below change, so neither an installed build nor a cached wheel made with
# other patches is reused. The built package records it as horovod._hvdkeras_patches.
PATCHES="no-xla-mpi-ops,gloo-process-set-iface,gloo-recv-before-send,gloo-controller-ranks,torch-not-built"
PATCH_TAG=p5
CACHE_DIR=${HVDKERAS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdkeras}

die() { echo "install_horovod.sh: error: $*" >&2; exit 1; }

command -v cmake >/dev/null || die "cmake is required to build Horovod (apt-get install cmake)"
command -v g++ >/dev/null || die "g++ is required to build Horovod (apt-get install g++)"

TF_VERSION=$("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) \
  || die "TensorFlow must be installed in $PY before Horovod is built"
PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

# GPU operations (NCCL) when TensorFlow is a CUDA build: scripts/gpu_build.py finds NCCL and nvcc (system-wide
# first, then TensorFlow's own CUDA wheels in the venv), prints the build's variables and the cache tag, or
# fails naming what is missing. HOROVOD_GPU_OPERATIONS= (empty) forces a CPU-only build.
gpu_work=$(mktemp -d)
trap 'rm -rf "$gpu_work"' EXIT
gpu_plan=$("$PY" "$(dirname "$0")/gpu_build.py" "$gpu_work") || die "cannot build Horovod's GPU operations (above)"
eval "$gpu_plan"
# GPU builds carry one more patch (its code is compiled only with HAVE_GPU), under a tag of their own, so CPU
# builds and their cached wheels are unchanged.
if [ "$GPU_TAG" != cpu ]; then
  PATCHES="$PATCHES,tf-gpu-stream${HVDKERAS_HOROVOD_RPATH:+,nccl-rpath}"
  PATCH_TAG="$PATCH_TAG-g2"
fi
if [ "${HVDKERAS_HOROVOD_PLAN_ONLY:-}" = 1 ]; then
  env | grep -E '^HOROVOD_(GPU_OPERATIONS|NCCL_|CUDA_HOME|BUILD_CUDA_CC_LIST)' | sort || true
  echo "GPU_TAG=$GPU_TAG"
  echo "PATCHES=$PATCHES"
  echo "HVDKERAS_HOROVOD_RPATH=$HVDKERAS_HOROVOD_RPATH"
  exit 0
fi

already=$("$PY" - <<PYEOF 2>/dev/null || true
import importlib.metadata as m
try:
    v = m.version("horovod")
except m.PackageNotFoundError:
    v = ""
if v.startswith("$HVD_VERSION"):
    import horovod
    import horovod.tensorflow as hvd  # fails if built for another TF
    # An installed build is reused only with the GPU operations this TensorFlow needs.
    if getattr(horovod, "_hvdkeras_patches", "") == "$PATCHES" and bool(hvd.nccl_built()) == ("$GPU_TAG" != "cpu"):
        print("yes")
PYEOF
)
if [ "$already" = yes ]; then
  echo "install_horovod.sh: horovod $HVD_VERSION already installed and importable"
  exit 0
fi

WHEEL_DIR="$CACHE_DIR/horovod-$HVD_VERSION-$PATCH_TAG-tf$TF_VERSION-$PY_TAG-$GPU_TAG"
wheel=$(ls "$WHEEL_DIR"/horovod-*.whl 2>/dev/null | head -n 1 || true)

if [ -z "$wheel" ]; then
  echo "install_horovod.sh: building horovod $HVD_VERSION for TensorFlow $TF_VERSION (gpu ops: $GPU_TAG); takes a few minutes"
  work=$(mktemp -d)
  trap 'rm -rf "$work" "$gpu_work"' EXIT
  "$PY" -m pip download --quiet --no-deps --no-binary :all: -d "$work" "horovod==$HVD_VERSION"
  tar -xzf "$work/horovod-$HVD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HVD_VERSION"
  cml="$src/horovod/tensorflow/CMakeLists.txt"
  grep -q 'xla_mpi_ops.cc' "$cml" || die "expected xla_mpi_ops.cc in $cml; the Horovod source changed"
  sed -i '/xla_mpi_ops\.cc/d' "$cml"
  # NCCL from the venv's wheel is in no system library path: Horovod's library finds it relative to itself,
  # and only there (not in the build's temporary NCCL home, which CMake would add to a build's RPATH).
  if [ -n "$HVDKERAS_HOROVOD_RPATH" ]; then
    printf '\nset_target_properties(${TF_TARGET_LIB} PROPERTIES BUILD_WITH_INSTALL_RPATH TRUE INSTALL_RPATH "%s")\n' \
      "$HVDKERAS_HOROVOD_RPATH" >> "$cml"
  fi
  # Horovod 0.28.1 bug: GlooContext::InitializeForProcessSet creates its Gloo device from the new
  # context's own gloo_iface_, which is always empty, instead of the global context's. Every process set
  # (the global one included) then ignores HOROVOD_GLOO_IFACE and binds to whatever the hostname resolves
  # to; where that is a loopback address (containers, network namespaces, many /etc/hosts) a multi-host
  # job dies right after init with "connect [127.0.0.1]:PORT: Connection refused". Take the interface
  # of the global context, as Initialize() does. tests/multiworker/test_hosts_2w.py fails without this.
  gcc_src="$src/horovod/common/gloo/gloo_context.cc"
  fn_line=$(grep -n 'void GlooContext::InitializeForProcessSet' "$gcc_src" | cut -d: -f1)
  [ -n "$fn_line" ] || die "expected InitializeForProcessSet in $gcc_src; the Horovod source changed"
  iface_line=$(awk -v start="$fn_line" 'NR > start && /device_attr\.iface = gloo_iface_;/ {print NR; exit}' "$gcc_src")
  [ -n "$iface_line" ] || die "expected 'device_attr.iface = gloo_iface_;' in InitializeForProcessSet"
  sed -i "${iface_line}s/device_attr\.iface = gloo_iface_;/gloo_iface_ = global_context.gloo_iface_;\n  device_attr.iface = gloo_iface_;/" "$gcc_src"
  grep -q 'gloo_iface_ = global_context.gloo_iface_;' "$gcc_src" || die "patching $gcc_src failed"
  # Horovod 0.28.1 bug: GlooController::DoInitialization gathers the process set's global ranks into
  # global_ranks_ after only reserving it, so its size stays 0. The stall inspector counts the ranks a
  # collective waits for over that size, so under Gloo it never names a missing rank and never shuts a stalled
  # job down (HOROVOD_STALL_CHECK_TIME_SECONDS / _SHUTDOWN_TIME_SECONDS do nothing), and a rank that stops
  # submitting hangs the job for ever. Size the vector. tests/multiworker/test_faults_2w.py (hang) fails without it.
  gctl_src="$src/horovod/common/gloo/gloo_controller.cc"
  grep -q 'global_ranks_\.reserve(size_);' "$gctl_src" || die "expected 'global_ranks_.reserve(size_);' in $gctl_src"
  sed -i 's/global_ranks_\.reserve(size_);/global_ranks_.resize(size_);/' "$gctl_src"
  grep -q 'global_ranks_\.resize(size_);' "$gctl_src" || die "patching $gctl_src failed"
  # Gloo's alltoallv and allgatherv post each send before its receive, so two workers take turns on the link
  # instead of sending both ways at once (scripts/patch_gloo.py says why). Post the receives first.
  "$PY" "$(dirname "$0")/patch_gloo.py" "$src/third_party/gloo/gloo" || die "patching Gloo failed (above)"
  # Built without PyTorch (below), horovod.torch still imports, so `horovodrun --check-build` would list
  # "[X] PyTorch" wherever torch is installed (scripts/patch_torch_init.py says why). Make its import fail.
  "$PY" "$(dirname "$0")/patch_torch_init.py" "$src/horovod/torch/__init__.py" \
    || die "patching horovod/torch/__init__.py failed (above)"
  # TensorFlow 2.21 no longer exports the function Horovod's GPU ops get their CUDA stream from
  # (scripts/patch_gpu_stream.py says why); without this a CUDA build links but does not load.
  if [ "$GPU_TAG" != cpu ]; then
    "$PY" "$(dirname "$0")/patch_gpu_stream.py" "$src/horovod/tensorflow/mpi_ops.cc" \
      || die "patching Horovod's GPU stream lookup failed (above)"
  fi
  printf '\n_hvdkeras_patches = "%s"\n' "$PATCHES" >> "$src/horovod/__init__.py"
  # Build requirements of Horovod's setup.py itself (no build isolation: it must see the installed TF).
  "$PY" -m pip install --quiet setuptools wheel packaging
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
         HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo
  export MAKEFLAGS="-j$(nproc)"
  "$PY" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src"
  wheel=$(ls "$work"/dist/horovod-*.whl | head -n 1)
  built=1
fi

echo "install_horovod.sh: installing $wheel"
"$PY" -m pip install --quiet --force-reinstall --no-deps "$wheel"
"$PY" -m pip install --quiet cloudpickle psutil pyyaml packaging
"$PY" -c 'import horovod.tensorflow' || die "the installed Horovod does not import"
# Cached only once it imports: a wheel that links but does not load is never reused.
if [ "${built:-}" = 1 ]; then
  mkdir -p "$WHEEL_DIR"
  cp "$wheel" "$WHEEL_DIR/"
fi
