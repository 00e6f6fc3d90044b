#!/bin/sh
# Runs the tests whose results depend on the order of the matrix products' sums under every
# OpenBLAS kernel this CPU can execute (OPENBLAS_CORETYPE), so that a tolerance fitted to one
# kernel's summation order shows up here and not on a learner's machine.
#
#   tools/blas_kernel_sweep.sh BUILD_DIR
#
# For each kernel: the library tests whose results move with the summation order (ctest -L
# summation-order: all but the slow finite-difference checks, see
# tests/summation_order_labels.cmake.in; SWEEP_LIBRARY_LABEL=library runs them all), the
# solutions' checks (ctest -R ' solution/') and the lessons' quick runs (ctest -L
# lessons-quick, but for the runs on a 3 KB text, which test a refusal), two at a time. One line per kernel, "OpenBLAS kernel X: N passed, M failed (T s)", with each part's
# time after it; a kernel the CPU cannot execute (its instructions would stop the process
# with SIGILL) is skipped with its reason. Exits non-zero when a test fails under any kernel,
# or when OpenBLAS does not switch to the kernel asked for.
#
# The tests must be built first (cmake --build BUILD_DIR). SWEEP_KERNELS="Haswell Zen" limits
# the sweep to some kernels; SWEEP_PARTS="library solutions lessons" to some parts.
set -u

if [ $# -ne 1 ] || [ ! -f "$1/CTestTestfile.cmake" ]; then
    echo "usage: $0 BUILD_DIR (a configured and built build folder)" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
kernels=${SWEEP_KERNELS:-"Prescott Sandybridge Haswell Zen SkylakeX Cooperlake"}
parts=${SWEEP_PARTS:-"library solutions lessons"}
jobs=${SWEEP_JOBS:-2}
library_label=${SWEEP_LIBRARY_LABEL:-summation-order}
# The lessons' runs on a 3 KB text test that a too-short text is refused in one line, not
# numbers: left out unless SWEEP_LESSONS_ALL=1.
lesson_filter="-E 3.KB"
[ "${SWEEP_LESSONS_ALL:-0}" = 1 ] && lesson_filter=

# The CPU's flags, from the first processor's entry.
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { case "$flags" in *" $1 "*) return 0 ;; esac; return 1; }

# The instruction sets each kernel needs (OpenBLAS's dynamic-arch checks).
needs() {
    case "$1" in
        Prescott) echo "pni" ;;  # SSE3, named pni in /proc/cpuinfo
        Sandybridge) echo "avx" ;;
        Haswell | Zen) echo "avx2 fma" ;;
        SkylakeX) echo "avx512f avx512bw avx512vl avx512dq avx512cd" ;;
        Cooperlake) echo "avx512f avx512bw avx512vl avx512dq avx512cd avx512_bf16" ;;
        *) echo "unknown" ;;
    esac
}

# A program linked with OpenBLAS that starts and exits at once, to ask which kernel it loads.
probe="$build/tests/library_tests"
if [ ! -x "$probe" ]; then
    echo "$0: $probe is missing: build the tests first (cmake --build $1)" >&2
    exit 2
fi

# ctest's summary line "NN% tests passed, F tests failed out of N" as "passed failed".
counts() {
    sed -n 's/^[0-9]*% tests passed, \([0-9]*\) tests* failed out of \([0-9]*\).*/\1 \2/p' "$1" |
        tail -n 1 | { read -r failed total && echo "$((total - failed)) $failed" || echo "0 0"; }
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

status=0
log_dir=$(mktemp -d "${TMPDIR:-/tmp}/blas_kernel_sweep.XXXXXX")
for kernel in $kernels; do
    missing=""
    for f in $(needs "$kernel"); do has "$f" || missing="$missing $f"; done
    if [ -n "$missing" ]; then
        echo "OpenBLAS kernel $kernel: skipped, this CPU lacks$missing"
        continue
    fi
    # The kernel really loaded? OpenBLAS names it on stderr at load with OPENBLAS_VERBOSE=2.
    core=$(OPENBLAS_VERBOSE=2 OPENBLAS_CORETYPE=$kernel "$probe" --count 2>&1 >/dev/null |
               sed -n 's/^Core: *//p' | head -n 1)
    if [ "$core" != "$kernel" ]; then
        echo "OpenBLAS kernel $kernel: not loaded (OpenBLAS reports core '${core:-nothing}'; an OpenBLAS built without DYNAMIC_ARCH cannot switch)"
        status=1
        continue
    fi
    passed=0
    failed=0
    times=""
    start=$(now)
    for part in $parts; do
        case "$part" in
            library) select="-L $library_label" ;;
            solutions) select="" ;;
            lessons) select="-L lessons-quick $lesson_filter" ;;
            *) echo "$0: unknown part $part (library, solutions, lessons)" >&2; exit 2 ;;
        esac
        log="$log_dir/$kernel.$part.log"
        part_start=$(now)
        if [ "$part" = solutions ]; then
            (cd "$build" && OPENBLAS_CORETYPE=$kernel ctest -R ' solution/' -j "$jobs" \
                 --output-on-failure) >"$log" 2>&1
        else
            # shellcheck disable=SC2086
            (cd "$build" && OPENBLAS_CORETYPE=$kernel ctest $select -j "$jobs" \
                 --output-on-failure) >"$log" 2>&1
        fi
        set -- $(counts "$log")
        passed=$((passed + $1))
        failed=$((failed + $2))
        times="$times, $part $(elapsed "$part_start" "$(now)") s"
        if [ "$2" -ne 0 ]; then
            echo "  $kernel, $part: failed:" >&2
            grep -E '^[[:space:]]*[0-9]+ - .*\((Failed|SEGFAULT|Timeout|Child aborted|Exception|ILLEGAL|Subprocess)' "$log" >&2
            echo "  (log: $log)" >&2
        fi
    done
    echo "OpenBLAS kernel $kernel: $passed passed, $failed failed ($(elapsed "$start" "$(now)") s:${times#,})"
    [ "$failed" -eq 0 ] || status=1
done
[ "$status" -ne 0 ] || rm -rf "$log_dir"
exit "$status"
