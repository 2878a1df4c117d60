#!/usr/bin/env bash
# tools/test_aarch64.sh: build needle_cy for aarch64 (the Raspberry Pi's
# architecture) and run the whole test suite under qemu-user emulation.
#
# What it does, each step skipped when a previous run already did it:
#   1. host tools: qemu-user-static, binfmt-support, debootstrap, rsync (apt-get)
#      and the kernel's binfmt_misc entry for aarch64 ELF files;
#   2. a Debian arm64 chroot (debootstrap --foreign, then the second stage
#      through qemu) with Debian's python3, gcc and the Python packages whose
#      Debian versions satisfy pyproject.toml (numpy 1.24, threadpoolctl 3.1),
#      and a venv on top of them (--system-site-packages) that pip fills from
#      PyPI's aarch64 wheels with the rest of the build-system requirements and
#      the [test] extra (Cython>=3, pytest-benchmark>=4 and so pytest,
#      jsonschema, sentencepiece, tokenizers, pydantic, huggingface_hub);
#   3. copies the working tree (git ls-files: tracked and untracked-not-ignored
#      files, never the host's compiled .so) to /build/needle_cy in the chroot
#      and ../shared (the fixtures, eval and data folders) to /build/shared;
#   4. python setup.py build_ext --inplace inside the chroot, with an explicit
#      target (-march=armv8-a, the Raspberry Pi 3/4/5 baseline, through
#      NEEDLE_CY_ARCH_FLAGS: -mcpu=native means nothing under emulation), and
#      checks every extension is an aarch64 ELF shared object;
#   5. pytest -q (the command CI runs) with CI=true and NEEDLE_CY_THREADS=1,
#      under nice -n 19; arguments to this script go to pytest.
#
# Needs: root on a Debian-like x86-64 host (apt-get, chroot, mount) with
# python3 >= 3.11 (tomllib reads pyproject.toml), git, Debian's apt mirror and
# PyPI reachable, ~1 GB under the cache directory (800 MB here), and a
# kernel whose binfmt_misc can be mounted (the script mounts it and registers
# qemu-aarch64 when missing; without it the chroot cannot run gcc or pip,
# since qemu-user alone does not follow execve into other aarch64 programs).
#
# Time on the 2-vCPU Zen 4 development machine (shared, noisy): setup once
# ~26 min (debootstrap 24, pip 2), build ~20 min (a rebuild with nothing
# changed 20 s), test suite ~21 min (see docs/aarch64.md).
#
# Environment:
#   NEEDLE_CY_AARCH64_ROOT    cache directory (default /var/cache/needle_cy_aarch64)
#   NEEDLE_CY_AARCH64_SUITE   Debian suite (default bookworm, as Raspberry Pi OS 12)
#   NEEDLE_CY_AARCH64_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   NEEDLE_CY_AARCH64_FLAGS   target flags for the build (default -march=armv8-a;
#                             "portable" builds with NEEDLE_CY_PORTABLE=1 instead)
#   NEEDLE_CY_AARCH64_STEPS   steps to run (default "setup build test")
#   NEEDLE_CY_FIXTURES        host fixtures folder (default <repo>/../shared/fixtures);
#                             its parent folder is copied as the chroot's shared/
#
# Usage: sudo tools/test_aarch64.sh [pytest arguments]
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${NEEDLE_CY_AARCH64_ROOT:-/var/cache/needle_cy_aarch64}
SUITE=${NEEDLE_CY_AARCH64_SUITE:-bookworm}
MIRROR=${NEEDLE_CY_AARCH64_MIRROR:-http://deb.debian.org/debian}
ARCH_FLAGS=${NEEDLE_CY_AARCH64_FLAGS:--march=armv8-a}
STEPS=${NEEDLE_CY_AARCH64_STEPS:-setup build test}
FIXTURES=${NEEDLE_CY_FIXTURES:-$REPO/../shared/fixtures}
SHARED=$(cd "$(dirname "$FIXTURES")" && pwd)
CHROOT=$CACHE/$SUITE-arm64
LOGS=$CACHE/logs
# Debian arm64 packages used as they are (their bookworm versions satisfy
# pyproject.toml; bookworm's Cython 0.29, pytest-benchmark 3.2, jsonschema 4.10
# and pydantic 1.10 do not, so those come from PyPI)
DEB_PACKAGES=python3,python3-dev,python3-venv,python3-pip,python3-numpy,python3-threadpoolctl,gcc,libc6-dev,ca-certificates

log() { printf '[aarch64 %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
has_step() { [[ " $STEPS " == *" $1 "* ]]; }
elapsed() { local s=$(( $(date +%s) - $1 )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# Everything here (the emulated dpkg, gcc and pytest above all) yields to other work.
renice -n 19 -p $$ >/dev/null
[ "$(id -u)" = 0 ] || die "needs root (chroot, mount, debootstrap): sudo $0"
mkdir -p "$CACHE" "$LOGS"
exec 9>"$CACHE/.lock"
flock -n 9 || die "another run holds $CACHE/.lock"

# ---- step 1: host tools and binfmt_misc -----------------------------------
host_tools() {
    local missing=()
    command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
    command -v update-binfmts >/dev/null || missing+=(binfmt-support)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v rsync >/dev/null || missing+=(rsync)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing host packages: ${missing[*]}"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    fi
    local bm=/proc/sys/fs/binfmt_misc
    if [ ! -e "$bm/register" ]; then
        mount -t binfmt_misc binfmt_misc "$bm" 2>/dev/null ||
            die "binfmt_misc cannot be mounted here; the chroot needs it (gcc and pip exec aarch64 programs)"
    fi
    if [ ! -e "$bm/qemu-aarch64" ]; then
        update-binfmts --enable qemu-aarch64 || die "could not register qemu-aarch64 with binfmt_misc"
    fi
    grep -qx enabled "$bm/qemu-aarch64" || die "binfmt_misc entry qemu-aarch64 is disabled"
}

# ---- mounts (proc and a tmpfs /dev/shm), undone on exit --------------------
MOUNTED=()
unmount_all() {
    local i
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
        umount "${MOUNTED[i]}" 2>/dev/null || umount -l "${MOUNTED[i]}" || true
    done
    MOUNTED=()
}
trap unmount_all EXIT
trap 'exit 130' INT TERM
mount_chroot() {
    if ! mountpoint -q "$CHROOT/proc"; then
        mount -t proc proc "$CHROOT/proc" && MOUNTED+=("$CHROOT/proc")
    fi
    mkdir -p "$CHROOT/dev/shm"
    if ! mountpoint -q "$CHROOT/dev/shm"; then
        mount -t tmpfs -o mode=1777,size=512m shm "$CHROOT/dev/shm" && MOUNTED+=("$CHROOT/dev/shm")
    fi
    [ -c "$CHROOT/dev/null" ] || die "$CHROOT/dev/null is not a device node (debootstrap could not mknod?)"
}
# Run a shell command inside the chroot with a clean environment (the host's
# pip settings point at x86 wheel folders that do not exist there).
in_chroot() {
    chroot "$CHROOT" /usr/bin/env -i PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin HOME=/root \
        LANG=C.UTF-8 TERM=dumb "${CHROOT_ENV[@]}" /bin/bash -c "$1"
}
CHROOT_ENV=()

# ---- step 2: the Debian arm64 chroot and its venv -------------------------
make_chroot() {
    if [ ! -e "$CHROOT/.needle_cy_debootstrap_done" ]; then
        if [ -e "$CHROOT" ]; then
            findmnt -rn -o TARGET | grep -q "^$CHROOT/" && die "$CHROOT has mounts, refusing to remove it"
            log "removing an unfinished chroot at $CHROOT"
            rm -rf --one-file-system "$CHROOT"
        fi
        local t0; t0=$(date +%s)
        log "debootstrap $SUITE arm64, first stage -> $CHROOT"
        debootstrap --arch=arm64 --foreign --variant=minbase --include="$DEB_PACKAGES" \
            "$SUITE" "$CHROOT" "$MIRROR" >"$LOGS/debootstrap1.log" 2>&1 ||
            die "debootstrap first stage failed, see $LOGS/debootstrap1.log"
        # With binfmt's F flag the kernel already holds the interpreter; a copy
        # inside the chroot serves entries without it and explicit calls.
        install -m 0755 "$(command -v qemu-aarch64-static)" "$CHROOT/usr/bin/qemu-aarch64-static"
        local interp; interp=$(sed -n 's/^interpreter //p' /proc/sys/fs/binfmt_misc/qemu-aarch64)
        if [ -n "$interp" ] && [ ! -e "$CHROOT$interp" ]; then
            mkdir -p "$CHROOT$(dirname "$interp")"
            install -m 0755 "$(command -v qemu-aarch64-static)" "$CHROOT$interp"
        fi
        log "debootstrap second stage (emulated)"
        chroot "$CHROOT" /debootstrap/debootstrap --second-stage >"$LOGS/debootstrap2.log" 2>&1 ||
            die "debootstrap second stage failed, see $LOGS/debootstrap2.log"
        touch "$CHROOT/.needle_cy_debootstrap_done"
        log "debootstrap done in $(elapsed "$t0")"
    fi
    cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
    mount_chroot
    # The venv's requirements come from pyproject.toml: build-system requires,
    # dependencies and the [test] extra; pip leaves the ones Debian satisfies.
    local reqs; reqs=$(python3 - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))
reqs = p["build-system"]["requires"] + p["project"]["dependencies"] + p["project"]["optional-dependencies"]["test"]
print("\n".join(reqs))
EOF
    )
    local stamp="$CHROOT/opt/venv/.needle_cy_requirements"
    if [ ! -e "$stamp" ] || [ "$(cat "$stamp")" != "$reqs" ]; then
        local t0; t0=$(date +%s)
        log "venv (--system-site-packages) and pip install from PyPI:" $reqs
        printf '%s\n' "$reqs" >"$CHROOT/tmp/requirements.txt"
        # pip trusts the host's CA bundle (a network that re-signs TLS adds its
        # CA there) and uses the host's proxy settings, if any.
        local ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
        CHROOT_ENV=()
        if [ -f "$ca" ]; then
            install -m 0644 "$ca" "$CHROOT/etc/ssl/certs/needle_cy_host_ca.crt"
            CHROOT_ENV+=(PIP_CERT=/etc/ssl/certs/needle_cy_host_ca.crt)
        fi
        local v
        for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
            if [ -n "${!v:-}" ]; then CHROOT_ENV+=("$v=${!v}"); fi
        done
        in_chroot "set -e
            [ -x /opt/venv/bin/python ] || python3 -m venv --system-site-packages /opt/venv
            /opt/venv/bin/python -m pip install -q --disable-pip-version-check --only-binary=:all: -r /tmp/requirements.txt" \
            >"$LOGS/pip.log" 2>&1 || die "pip install failed, see $LOGS/pip.log"
        CHROOT_ENV=()
        printf '%s' "$reqs" >"$stamp"
        log "venv done in $(elapsed "$t0")"
    fi
    in_chroot "python -c 'import platform, sys, numpy, Cython, pytest; print(\"chroot:\", platform.machine(), \"python\", sys.version.split()[0], \"numpy\", numpy.__version__, \"Cython\", Cython.__version__, \"pytest\", pytest.__version__)'; gcc --version | head -1" >&2
}

# ---- step 3: copy the working tree and shared/ ----------------------------
sync_tree() {
    local dest=$CHROOT/build/needle_cy list=$CACHE/files.txt
    mkdir -p "$dest" "$CHROOT/build/shared"
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done) >"$list"
    # rsync keeps modification times, so an unchanged source keeps its build.
    rsync -a --from0 --files-from="$list" "$REPO/" "$dest/"
    # Drop copied files no longer in the tree; keep the chroot's build outputs.
    (cd "$dest" && find . -type f ! -path './build/*' ! -path '*/__pycache__/*' ! -path './.pytest_cache/*' \
        ! -name '*.so' ! -path './needle_cy/_*.c' -printf '%P\0') |
        sort -z | comm -z -23 - <(sort -z "$list") | (cd "$dest" && xargs -0 -r rm -f --)
    rsync -a --delete "$SHARED/" "$CHROOT/build/shared/"
    log "copied $(tr -cd '\0' <"$list" | wc -c) files to /build/needle_cy, $SHARED to /build/shared"
}

# ---- step 4: build inside the chroot ---------------------------------------
build() {
    local t0; t0=$(date +%s)
    if [ "$ARCH_FLAGS" = portable ]; then
        CHROOT_ENV=(NEEDLE_CY_PORTABLE=1)
    else
        CHROOT_ENV=("NEEDLE_CY_ARCH_FLAGS=$ARCH_FLAGS")
    fi
    log "build_ext --inplace (${CHROOT_ENV[*]}), log in $LOGS/build.log"
    in_chroot "cd /build/needle_cy && nice -n 19 python setup.py build_ext --inplace -j 2" \
        >"$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log" >&2; die "build failed"; }
    CHROOT_ENV=()
    grep -h "needle_cy: target flags" "$LOGS/build.log" | sort -u >&2 || true
    local so n=0
    for so in "$CHROOT"/build/needle_cy/needle_cy/*.so; do
        [ -e "$so" ] || die "no extension was built"
        # ELF header: class 2 (64-bit) at byte 4, e_machine 183 (EM_AARCH64) at bytes 18-19 (little endian)
        [ "$(od -An -tu1 -j4 -N1 "$so" | tr -d ' ')" = 2 ] &&
            [ "$(od -An -tu2 -j18 -N2 --endian=little "$so" | tr -d ' ')" = 183 ] ||
            die "$(basename "$so") is not an aarch64 ELF: $(file -b "$so")"
        n=$((n + 1))
    done
    log "$n extensions are aarch64 ELF shared objects; build took $(elapsed "$t0")"
    in_chroot "cd /build/needle_cy && python -c 'import needle_cy.threads as t; print(\"openmp:\", t.openmp_enabled(), \"threads:\", t.get_num_threads())'" >&2
}

# ---- step 5: the test suite -------------------------------------------------
run_tests() {
    local t0 rc=0 args=""; t0=$(date +%s)
    [ $# -gt 0 ] && args=$(printf ' %q' "$@")
    log "pytest -q$args (emulated; log in $LOGS/pytest.log)"
    CHROOT_ENV=(CI=true NEEDLE_CY_THREADS=1 NEEDLE_CY_FIXTURES=/build/shared/fixtures)
    set +e
    nice -n 19 chroot "$CHROOT" /usr/bin/env -i PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
        TERM=dumb "${CHROOT_ENV[@]}" /bin/bash -c "cd /build/needle_cy && python -m pytest -q -p no:cacheprovider$args" \
        2>&1 | tee "$LOGS/pytest.log"
    rc=${PIPESTATUS[0]}
    set -e
    log "tests took $(elapsed "$t0"), pytest exit status $rc"
    return "$rc"
}

main() {
    local t0 rc=0; t0=$(date +%s)
    host_tools
    [ -e "$CHROOT/.needle_cy_debootstrap_done" ] || has_step setup || die "no chroot yet: run the setup step"
    make_chroot
    if has_step build || has_step test; then sync_tree; fi
    if has_step build; then build; fi
    if has_step test; then run_tests "$@" || rc=$?; fi
    log "all steps took $(elapsed "$t0")"
    return "$rc"
}
# One line, parsed whole before it runs: editing this file during a run is safe.
main "$@"; exit $?
