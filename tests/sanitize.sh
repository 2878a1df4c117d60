#!/usr/bin/env bash
# ASan + UBSan run of the Cython-facing tests.
#
#   NEEDLE_CY_THREADS=1 nice -n 19 tests/sanitize.sh [modules] [-- pytest args]
#
# Builds the named extensions (default: grammar._runtime and _bpe, the modules the grammar and
# tokenizer tests drive) at -O1 with -fsanitize=address,undefined into build/sanitize/ --
# a copy of the package, so the in-place build is untouched -- then runs their tests with
# the ASan runtime preloaded.  Any sanitizer report fails the run (halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
MODULES="${1:-grammar._runtime,_bpe}"
shift || true
[ "${1:-}" = "--" ] && shift
OUT=build/sanitize
rm -rf "$OUT"
mkdir -p "$OUT"
cp -r needle_cy "$OUT/needle_cy"
cp -r tests "$OUT/tests"
REPO="$PWD"
find "$OUT/needle_cy" -name '*.so' -delete
NEEDLE_CY_SANITIZE=1 NEEDLE_CY_BUILD_ONLY="$MODULES" \
    python setup.py build_ext --build-lib "$OUT" --build-temp "$OUT/tmp" -j 2 > "$OUT/build.log" 2>&1
# extensions that were not rebuilt come from the normal in-place build
shopt -s nullglob
for so in needle_cy/*.so needle_cy/*/*.so; do
    [ -e "$OUT/$so" ] || cp "$so" "$OUT/$so"
done
ASAN_LIB="$(${CC:-gcc} -print-file-name=libasan.so)"
UBSAN_LIB="$(${CC:-gcc} -print-file-name=libubsan.so)"
TESTS=(tests/test_grammar.py tests/test_grammar_exactness.py tests/test_grammar_compile.py
       tests/test_grammar_numbers.py tests/test_tokenizer.py tests/test_tokenizer_fuzz.py tests/test_fuzz.py)
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# run from the copy, so `import needle_cy` is the sanitized build
cd "$OUT"
NEEDLE_CY_FIXTURES="${NEEDLE_CY_FIXTURES:-$REPO/../shared/fixtures}" LD_PRELOAD="$ASAN_LIB:$UBSAN_LIB" \
    python -m pytest -q -p no:cacheprovider "${TESTS[@]}" "$@"
