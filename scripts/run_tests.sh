#!/usr/bin/env bash
# Creates .venv, installs the project with its test extra (and the Horovod extra,
# which must be built without build isolation), and runs the test suite.
# Arguments go to pytest; --fast runs only the fast tier (tests/tiers.py: every test
# module's unit tests and one real 2-worker job per transport) instead of every test.
# The 15 slowest tests are listed at the end of each lane (where to look when the suite
# grows).
set -euo pipefail
args=()
for arg in "$@"; do
    if [ "$arg" = --fast ]; then
        args+=(-m fast)
    else
        args+=("$arg")
    fi
done
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv .venv
.venv/bin/pip install -q --upgrade pip wheel setuptools
.venv/bin/pip install -q '.[test]'
# Fashion-MNIST for the real-data tests (Debian package; tests skip without it)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ ! -d /usr/share/datasets/fashion-mnist ]; then
    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
        || echo "note: dataset-fashion-mnist not installed; its tests will be skipped"
fi
# sshd for the multi-host launcher tests: tests/test_cluster.py starts one per emulated
# host and stops it again; the package's own service is kept from starting (policy-rc.d)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ ! -x /usr/sbin/sshd ]; then
    policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        policy=/usr/sbin/policy-rc.d
    fi
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        openssh-server openssh-client) >/dev/null 2>&1 \
        || echo "note: openssh-server not installed; the multi-host tests will be skipped"
    [ -z "$policy" ] || rm -f "$policy"
fi
# Slurm (slurmctld, slurmd, munge) and Open MPI for the cluster-engine tests
# (tests/test_slurm.py starts its own daemons on emulated hosts; test_mpi.py runs
# mpirun); the packages' own services are kept from starting (policy-rc.d)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
        && { [ ! -x /usr/sbin/slurmd ] || ! command -v mpirun >/dev/null; }; then
    policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        policy=/usr/sbin/policy-rc.d
    fi
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        slurm-wlm munge openmpi-bin) >/dev/null 2>&1 \
        || echo "note: slurm-wlm/munge/openmpi-bin not installed; their tests will be skipped"
    [ -z "$policy" ] || rm -f "$policy"
fi
if [ "${SKIP_HOROVOD:-0}" != 1 ] && ! .venv/bin/python -c 'import horovod.mxnet' 2>/dev/null; then
    # Horovod's build imports mxnet, so it cannot use an isolated build environment
    .venv/bin/pip install -q cmake
    HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        .venv/bin/pip install -q --no-build-isolation --no-cache-dir '.[horovod]'
fi
# The whole suite (or the fast tier) runs in two lanes side by side: the tests that
# build emulated hosts, one at a time, beside every other test (scripts/test_lanes.py).
# Any other pytest argument, or CPSGD_TEST_LANES=1, runs one pytest as given.
if [ "${CPSGD_TEST_LANES:-2}" != 1 ] && { [ ${#args[@]} -eq 0 ] || [ "${args[*]}" = "-m fast" ]; }; then
    exec .venv/bin/python scripts/test_lanes.py .venv/bin/python ${args[1]:+"${args[1]}"}
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 tests ${args[@]+"${args[@]}"}
