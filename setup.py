"""Build script for needle_cy's Cython extensions.

The extensions are listed in ``EXTENSIONS`` below, each with its ``.pyx`` and the C
headers under ``needle_cy/csrc/`` that it includes (directly, through a ``.pxd`` it
cimports, or through another header), so that editing a header rebuilds exactly the
extensions that compile it.  OpenMP is used where a test compile
shows the compiler supports it; otherwise the extensions build single-threaded
(``prange`` then runs serially).  By default the code is tuned for the local CPU
(``-march=native`` or ``-mcpu=native``); set ``NEEDLE_CY_PORTABLE=1`` for a
build that runs on any CPU of the same architecture (the compiler's default
target), or ``NEEDLE_CY_ARCH_FLAGS`` to name the target flags outright
(``-march=armv8-a``, ``-mcpu=cortex-a76``...; they replace both).

``NEEDLE_CY_BUILD_ONLY=_cq,_ops,grammar._runtime`` restricts the build to the named modules
(the name below ``needle_cy``, or just the file's stem; useful while developing one extension).  ``NEEDLE_CY_SANITIZE=1`` builds with
AddressSanitizer and UndefinedBehaviorSanitizer at -O1 (used by tests/sanitize.sh).
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent

# Every extension: module name -> its source and the csrc headers and .pxi files it
# compiles.  A plain literal, so that tests/test_build_layout.py can read it without
# running this script and check each list against the #include, include and cdef extern
# lines it stands for.
# (_parallel.pxd includes the OpenMP team shim, the barrier and the prefetch streams, so
# every module that cimports it compiles them; cq_dispatch.h includes every CQ kernel.)
EXTENSIONS = {
    "needle_cy._bpe": {"sources": ["needle_cy/_bpe.pyx"], "depends": []},
    "needle_cy._cq": {
        "sources": ["needle_cy/_cq.pyx"],
        "depends": [
            "needle_cy/csrc/cpu_features.h",
            "needle_cy/csrc/cq_amx.h",
            "needle_cy/csrc/cq_avx2.h",
            "needle_cy/csrc/cq_avx2int.h",
            "needle_cy/csrc/cq_avx512.h",
            "needle_cy/csrc/cq_dispatch.h",
            "needle_cy/csrc/cq_int_avx2_tmpl.h",
            "needle_cy/csrc/cq_int_avx512_tmpl.h",
            "needle_cy/csrc/cq_lut.h",
            "needle_cy/csrc/cq_lut_avx2.h",
            "needle_cy/csrc/cq_lut_bytes_tmpl.h",
            "needle_cy/csrc/cq_lut_rows_tmpl.h",
            "needle_cy/csrc/cq_neon.h",
            "needle_cy/csrc/cq_neon_tmpl.h",
            "needle_cy/csrc/omp_team.h",
            "needle_cy/csrc/parallel_barrier.h",
            "needle_cy/csrc/prefetch_stream.h",
            "needle_cy/csrc/wht.h",
        ],
    },
    "needle_cy._model": {
        "sources": ["needle_cy/_model.pyx"],
        "depends": [
            "needle_cy/_engine_buffers.pxi",
            "needle_cy/_engine_schedule.pxi",
            "needle_cy/csrc/model_avx2.h",
            "needle_cy/csrc/omp_team.h",
            "needle_cy/csrc/parallel_barrier.h",
            "needle_cy/csrc/prefetch_stream.h",
        ],
    },
    "needle_cy._ops": {
        "sources": ["needle_cy/_ops.pyx"],
        "depends": [
            "needle_cy/csrc/cpu_features.h",
            "needle_cy/csrc/omp_team.h",
            "needle_cy/csrc/ops_float.h",
            "needle_cy/csrc/ops_kv_int8.h",
            "needle_cy/csrc/parallel_barrier.h",
            "needle_cy/csrc/prefetch_stream.h",
            "needle_cy/csrc/wht.h",
        ],
    },
    "needle_cy._parallel": {
        "sources": ["needle_cy/_parallel.pyx"],
        "depends": [
            "needle_cy/csrc/omp_team.h",
            "needle_cy/csrc/parallel_barrier.h",
            "needle_cy/csrc/prefetch_stream.h",
        ],
    },
    "needle_cy._roofline": {
        "sources": ["needle_cy/_roofline.pyx"],
        "depends": [
            "needle_cy/csrc/roofline_probes.h",
        ],
    },
    "needle_cy.grammar._runtime": {
        "sources": ["needle_cy/grammar/_runtime.pyx"],
        "depends": [
            "needle_cy/csrc/mulmod.h",
        ],
    },
}


def _compiler():
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return cc.split()


def _try_compile(flags, link_flags=(), source="int main(void){return 0;}\n"):
    """True when the C compiler accepts ``flags`` for a small program."""
    cc = _compiler()
    if shutil.which(cc[0]) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(source)
        cmd = cc + list(flags) + [str(src), "-o", str(Path(tmp) / "probe")] + list(link_flags)
        try:
            res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return res.returncode == 0


OMP_PROBE = "#include <omp.h>\nint main(void){int n=0;\n#pragma omp parallel\n{n=omp_get_num_threads();}\nreturn n<1;}\n"


def _openmp_flags():
    if os.environ.get("NEEDLE_CY_NO_OPENMP"):
        return [], []
    candidates = [(["-fopenmp"], ["-fopenmp"])]
    if sys.platform == "darwin":
        candidates.append((["-Xpreprocessor", "-fopenmp"], ["-lomp"]))
    for cflags, lflags in candidates:
        if _try_compile(cflags, lflags, OMP_PROBE):
            return cflags, lflags
    print("needle_cy: OpenMP not available, building single-threaded", file=sys.stderr)
    return [], []


def _arch_flags():
    explicit = os.environ.get("NEEDLE_CY_ARCH_FLAGS")
    if explicit is not None:
        # an explicit target, for a build on another machine than the one it runs
        # on (tools/test_aarch64.sh: -march=armv8-a under emulation)
        return explicit.split()
    if os.environ.get("NEEDLE_CY_PORTABLE"):
        return []
    for flag in ("-march=native", "-mcpu=native"):
        if _try_compile([flag]):
            return [flag]
    return []


def _extensions():
    if sys.platform == "win32":
        base_c, omp_c, omp_l, arch = ["/O2"], ["/openmp"], [], []
    else:
        base_c = ["-O3", "-fno-strict-aliasing", "-Wno-unused-function", "-Wno-unreachable-code"]
        omp_c, omp_l = _openmp_flags()
        arch = _arch_flags()
        print(f"needle_cy: target flags {' '.join(arch) or '(compiler default)'}", file=sys.stderr)
        if os.environ.get("NEEDLE_CY_SANITIZE"):
            # tests/sanitize.sh: ASan + UBSan at -O1 (a practical build time on 2 cores)
            san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
            base_c = ["-O1", "-g", "-fno-strict-aliasing", "-Wno-unused-function"] + san
            omp_l = omp_l + san
    only = {m.strip() for m in os.environ.get("NEEDLE_CY_BUILD_ONLY", "").split(",") if m.strip()}
    exts = []
    for name, spec in EXTENSIONS.items():
        short = name[len("needle_cy."):]
        stem = short.rsplit(".", 1)[-1]
        if only and short not in only and stem not in only:
            continue
        exts.append(
            Extension(
                name,
                list(spec["sources"]),
                include_dirs=[np.get_include(), str(HERE / "needle_cy")],
                extra_compile_args=base_c + omp_c + arch,
                extra_link_args=omp_l,
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                depends=list(spec["depends"]),
            )
        )
    return cythonize(
        exts,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
            "nonecheck": False,
        },
        quiet=True,
    )


setup(ext_modules=_extensions())
