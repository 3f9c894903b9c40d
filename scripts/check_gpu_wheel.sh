#!/usr/bin/env bash
# Checks an MXNet 1.9.1 CUDA wheel for mxnet-cpsgd and prints "admitted" or "refused"
# with the reason. Runs on any x86-64 Linux machine, with or without a GPU:
#
#   bash scripts/check_gpu_wheel.sh mxnet-cu112 [extra arguments for the main job]
#
# 1. a fresh venv with the GPU install (CPSGD_MXNET=<wheel> pip install '.[test]'):
#    the wheel, NVIDIA's CUDA 11 libraries, no CPU wheel; pip check;
# 2. the NVIDIA driver's libcuda.so.1: the system's, or (no driver) Debian's non-free
#    libcuda1 package fetched with apt-get download and unpacked into the work folder
#    (private apt lists; nothing is installed or configured system-wide);
# 3. import mxnet_cpsgd; the compression switch's self-check;
# 4. tests/test_compression_switch.py;
# 5. the README's main job (2 workers, 1 server, cpsgd on mnist-5k);
# 6. the switch's functions in the wheel's libmxnet.so against the CPU wheel's, by
#    disassembly (scripts/compare_switch_code.py).
# Work folder: $CHECK_DIR (default: a new folder under /var/tmp), removed at the end
# unless KEEP_CHECK_DIR=1 (about 3 GB while it runs). Downloads run at nice 19.
# PIP_FIND_LINKS etc. are honoured by pip as usual.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SPEC=${1:?usage: check_gpu_wheel.sh WHEEL-SPEC [main job arguments]}
shift
NAME=${SPEC%%[=<>!~ ]*}
PYTHON=${PYTHON:-python3}
WORK=${CHECK_DIR:-$(mktemp -d /var/tmp/check-gpu-wheel.XXXXXX)}
mkdir -p "$WORK"
cleanup() { [ "${KEEP_CHECK_DIR:-0}" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT
refuse() { echo "check_gpu_wheel: refused: $NAME: $*"; exit 1; }
step() { echo "check_gpu_wheel: == $*"; }
NICE="nice -n 19"

step "venv and GPU install of mxnet-cpsgd with $NAME"
"$PYTHON" -m venv "$WORK/venv" || refuse "cannot create a venv"
V=$WORK/venv/bin
$NICE "$V/pip" install -q --upgrade pip wheel setuptools || refuse "pip upgrade failed"
reason=$(CPSGD_MXNET=$NAME "$V/python" -c "import runpy; runpy.run_path('kvstore_ext/builds.py')['requirements']('$NAME')" 2>&1) \
    || refuse "not installable: ${reason##*ValueError: }"
plan=$(CPSGD_MXNET=$NAME $NICE "$V/pip" install --dry-run --no-cache-dir "$SPEC" '.[test]' 2>&1 | grep '^Would install') \
    || refuse "pip cannot resolve the GPU install"
echo "$plan"
echo "$plan" | grep -Eq ' mxnet-1\.' && refuse "the install would pull the CPU wheel mxnet"
CPSGD_MXNET=$NAME $NICE "$V/pip" install -q "$SPEC" '.[test]' || refuse "pip install failed"
"$V/pip" check || refuse "pip check reports conflicts"

step "driver library libcuda.so.1"
if "$V/python" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then
    echo "the system's (NVIDIA driver installed)"
else
    apt="$WORK/apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/root"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main non-free" > "$apt/sources.list"
    opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
          -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
    ( cd "$apt" && $NICE apt-get "${opts[@]}" update -qq && $NICE apt-get "${opts[@]}" download libcuda1 ) >"$apt/log" 2>&1 \
        || refuse "no driver here and Debian's libcuda1 could not be fetched ($(tail -1 "$apt/log"))"
    dpkg-deb -x "$apt"/libcuda1_*.deb "$apt/root" || refuse "cannot unpack libcuda1"
    export LD_LIBRARY_PATH="$apt/root/usr/lib/x86_64-linux-gnu/nvidia/current${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "no driver here: $(basename "$apt"/libcuda1_*.deb), unpacked privately"
fi

step "import and the compression switch's self-check"
export CPSGD_CHECK_WHEEL=$NAME  # lets the switch run on the wheel under check
"$V/python" -c 'import mxnet_cpsgd, mxnet; print("import mxnet_cpsgd: ok; mxnet from", mxnet.__file__)' \
    || refuse "import mxnet_cpsgd failed"
"$V/python" -c 'import kvstore_ext.compression_switch as s; raise SystemExit(s.self_check())' \
    || refuse "the compression switch's self-check failed"
"$V/python" -c 'import mxnet as mx; assert mx.runtime.Features().is_enabled("CUDA")' \
    || refuse "not a CUDA build"

step "tests/test_compression_switch.py"
$NICE "$V/python" -m pytest -q -p no:cacheprovider -p no:warnings tests/test_compression_switch.py \
    || refuse "tests/test_compression_switch.py failed"

step "the main job (scripts/main_job.sh's command)"
log=$WORK/main_job.log
$NICE "$V/python" -m mxnet_cpsgd.launch -n 2 -s 1 -- "$V/python" scripts/train_mnist.py \
    --algorithm cpsgd --dataset mnist-5k --local-momentum 0.9 "$@" 2>&1 | tee "$log" | tail -4
[ "${PIPESTATUS[0]}" = 0 ] || refuse "the main job failed (see above)"

step "the switch's instructions against the CPU wheel's"
lib=$("$V/python" -c 'import mxnet, os; print(os.path.join(os.path.dirname(mxnet.__file__), "libmxnet.so"))' 2>/dev/null)
cpu_lib=${CPU_LIBMXNET:-}
if [ -z "$cpu_lib" ]; then
    $NICE "$V/pip" download -q --no-deps -d "$WORK/cpu" mxnet==1.9.1 || refuse "cannot download the CPU wheel"
    (cd "$WORK/cpu" && unzip -q -o mxnet-1.9.1-*.whl mxnet/libmxnet.so) || refuse "no libmxnet.so in the CPU wheel"
    cpu_lib=$WORK/cpu/mxnet/libmxnet.so
fi
compare=$($NICE "$V/python" scripts/compare_switch_code.py "$cpu_lib" "$lib")
status=$?
echo "$compare"
[ "$status" = 0 ] || refuse "${compare##*$'\n'}"

acc=$(grep -Eo 'val=[0-9.]+' "$log" | tail -1)
echo "check_gpu_wheel: admitted: $NAME: installs without the CPU wheel, pip check clean," \
     "switch self-check and test passed, main job passed (${acc:-see log})," \
     "switch instructions identical to the CPU wheel's"
