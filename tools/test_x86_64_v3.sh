#!/usr/bin/env bash
# tools/test_x86_64_v3.sh: the engine's extensions built for x86-64-v3 (AVX2 + FMA, no
# AVX-512) in a folder of their own, and the engine tests run against that build.
#
# The in-place build targets the machine it runs on (-march=native).  On an AVX-512
# machine that never compiles the AVX2 side of the compile-time choices (_ops: the
# attention dots, the A8 loops) and compiles the AVX2 kernels among AVX-512 code, so
# a CPU with AVX2 and no AVX-512 (Zen 3, most desktops) would run code that CI never
# ran.  This script builds _cq, _ops, _model and _parallel with
# NEEDLE_CY_ARCH_FLAGS=-march=x86-64-v3 into build/x86-64-v3/ (a copy of the package;
# the in-place build is left alone, and the extensions without arch-dependent code,
# _bpe, _roofline and grammar._runtime, are copied from it), then runs the engine
# tests from the copy.  The thread-identity and kernel tests there run every CQ
# kernel the CPU has: on an AVX-512 machine the AVX2 ones as well.
#
# Needs the in-place build (pip install -e . or setup.py build_ext --inplace) and
# Cython in the running Python.  On a CPU that cannot run x86-64-v3 code (or not
# x86-64 Linux) it says so and exits 0.
#
#   tools/test_x86_64_v3.sh [pytest args]        (CI: .ci/run, after the suite)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
if [ "$(uname -m)" != x86_64 ] || [ ! -r /proc/cpuinfo ]; then
    echo "x86-64-v3 build: skipped (not x86-64 Linux)"
    exit 0
fi
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
for f in avx avx2 bmi1 bmi2 f16c fma abm movbe xsave; do
    if [[ "$flags" != *" $f "* ]]; then
        echo "x86-64-v3 build: skipped (this CPU lacks $f, so it cannot run x86-64-v3 code)"
        exit 0
    fi
done
python -c "import Cython" 2>/dev/null || {
    echo "x86-64-v3 build: needs Cython in $(command -v python) (pip install 'cython>=3.0')" >&2
    exit 1
}
OUT=build/x86-64-v3
MODULES=_cq,_ops,_model,_parallel
rm -rf "$OUT/needle_cy" "$OUT/tests"
mkdir -p "$OUT"
cp -r needle_cy "$OUT/needle_cy"
cp -r tests "$OUT/tests"
find "$OUT/needle_cy" \( -name '*.so' -o -name '*.c' \) -delete
start=$(date +%s)
# (setup.py cythonizes the repository's .pyx, which the in-place build already did:
# only the C compiler runs here; --build-temp keeps its objects apart from the in-place ones)
NEEDLE_CY_ARCH_FLAGS=-march=x86-64-v3 NEEDLE_CY_BUILD_ONLY="$MODULES" \
    python setup.py build_ext --build-lib "$OUT" --build-temp "$OUT/tmp" -j 2 >"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log" >&2; echo "x86-64-v3 build failed (log: $OUT/build.log)" >&2; exit 1; }
grep -q -- "target flags -march=x86-64-v3" "$OUT/build.log" ||
    { echo "x86-64-v3 build: setup.py did not take the target flags (log: $OUT/build.log)" >&2; exit 1; }
shopt -s nullglob
for so in needle_cy/*.so needle_cy/*/*.so; do
    [ -e "$OUT/$so" ] || cp "$so" "$OUT/$so"
done
echo "x86-64-v3 build: $MODULES in $(( $(date +%s) - start )) s"
cd "$OUT"
python -c "import needle_cy, needle_cy._cq as cq, sys
assert needle_cy.__file__.startswith('$REPO/$OUT/'), needle_cy.__file__
print('x86-64-v3 build: kernels', ', '.join(cq.available_kernels()), '(auto: ' + cq.kernel_name() + ')')"
NEEDLE_CY_FIXTURES="${NEEDLE_CY_FIXTURES:-$REPO/../shared/fixtures}" \
    python -m pytest -q -p no:cacheprovider tests/test_model_cython.py tests/test_ops_cython.py \
    tests/test_cq_kernels.py tests/test_cq_int_kernels.py tests/test_cq_amx.py \
    tests/test_threads.py "$@"
