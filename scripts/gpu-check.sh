#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the chip conformance suite on cuda:0
# (STRATA_REQUIRE_CUDA=1: a missing GPU or library fails it rather than
# skipping), the cross-process tests of workers on the GPU (demo, faults,
# shared device memory between processes, a mixed node's placement), the
# Python package's GPU tests (with CuPy and PyTorch reading a shared
# array through DLPack, where installed), then the CUDA benchmarks (with
# PyTorch's or CuPy's dense Cholesky beside the tiled one), and one table
# of what was measured.
# Runs from prebuilt binaries (scripts/gpu-kit.sh builds them):
#
#   scripts/gpu-check.sh [--quick] [KIT]   (KIT by default: this script's
#                                   folder if it holds the binaries, else
#                                   target/gpu-kit)
#
# --quick runs every step on small sizes: a dry run of the kit (on the
# fake CUDA of scripts/fakecuda.sh, say), whose figures mean nothing.
# GPU_CHECK_LOG=DIR keeps every step's full log there (default: a fresh
# temporary folder, named at the end). Each step has a time limit, so a
# step that hangs costs its limit and the rest still run.
# GPU_CHECK_STEPS=a,b runs only those steps (default all: conformance,
# cross, python, bench, cholesky, demo), to finish a run cut short.
#
# Takes under 4 minutes on one H100/H200. Figures are medians of their
# runs; nothing is asserted about them here (the conformance suite
# asserts results).
set -uo pipefail
quick=0
if [ "${1:-}" = --quick ]; then quick=1; shift; export STRATA_BENCH_SMALL=1; fi
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -ge 1 ]; then kit=$1
elif [ -x "$here/strata" ]; then kit=$here
else kit=$here/../target/gpu-kit
fi
kit=$(cd "$kit" && pwd)
for bin in strata chip-tests cross-tests strata-test-worker gpu_bench cholesky gpu_dense.py py pytests; do
    [ -e "$kit/$bin" ] || { echo "gpu-check: $kit/$bin missing: run scripts/gpu-kit.sh first" >&2; exit 2; }
done
# The CUDA toolkit's libraries (NVRTC, cuBLAS, cuSOLVER) where a toolkit
# is installed, else where pip's nvidia-* packages put them (PyTorch
# brings those); the driver's libcuda.so.1 is on the default path.
pip_nvidia=$(python3 -c 'import glob, site
print(*[d for s in site.getsitepackages() for d in sorted(glob.glob(s + "/nvidia/*/lib"))])' 2>/dev/null)
for lib in libnvrtc.so.13 libcublas.so.13 libcusolver.so.12; do
    for d in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/targets/x86_64-linux/lib \
             /usr/local/cuda/lib64 $pip_nvidia; do
        if [ -e "$d/$lib" ]; then
            case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *)
                export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}";; esac
            break
        fi
    done
done
export STRATA_REQUIRE_CUDA=1 STRATA_REQUIRE_NVRTC=1 STRATA_BIN="$kit/strata"
export STRATA_PTX_CACHE=${STRATA_PTX_CACHE:-$(mktemp -d)/ptx}
steps=${GPU_CHECK_STEPS:-conformance,cross,python,bench,cholesky,demo}
for s in ${steps//,/ }; do
    case $s in conformance|cross|python|bench|cholesky|demo) ;;
        *) echo "gpu-check: unknown step $s in GPU_CHECK_STEPS (conformance, cross, python, bench, cholesky, demo)" >&2
           exit 2;;
    esac
done
want() { case ",$steps," in *",$1,"*) return 0;; esac; return 1; }
log=${GPU_CHECK_LOG:-$(mktemp -d)}
mkdir -p "$log"
: >"$log/bench"
: >"$log/cholesky"
: >"$log/demo"
start=$(date +%s)
# `limited SECONDS CMD...`: CMD, killed (with what it started in its
# process group) past SECONDS; its status, 124 when it ran out of time.
limited() {
    local t=$1; shift
    timeout -k 5 "$t" "$@"
    local rc=$?
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "gpu-check: $* ran past ${t} s and was stopped" >&2
    return $rc
}
command -v nvidia-smi >/dev/null &&
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
# What strata finds: the driver, each GPU, each library's version and file.
"$kit/strata" devices

conf=skipped cross=skipped pyrc=skipped
if want conformance; then
    echo "== conformance (chip tests on sim and cuda:0)"
    limited 180 "$kit/chip-tests" --test-threads 4 >"$log/conformance" 2>&1
    conf=$?
    grep -E "^test result|FAILED|panicked" "$log/conformance" | head -20
fi

if want cross; then
    echo "== worker processes on cuda:0 (cross tests chips:: and shared::)"
    STRATA_TEST_WORKER="$kit/strata-test-worker" limited 150 "$kit/cross-tests" --test-threads 2 \
        chips:: shared:: >"$log/cross" 2>&1
    cross=$?
    grep -E "^test result|FAILED|panicked|^a slow" "$log/cross" | head -20
fi

want python && echo "== python on cuda:0 (raw kernels, DLPack to CuPy and PyTorch)"
if ! want python; then
    :
elif ! command -v python3 >/dev/null; then
    echo "python: skipped: no python3 here"
    pyrc=0
elif ! python3 -c 'import numpy' 2>/dev/null; then
    echo "python: skipped: this python3 has no numpy"
    pyrc=0
else
    pyrc=0
    site=$(mktemp -d)
    python3 - "$kit/py" "$site" <<'PY' || pyrc=$?
import glob, sys, zipfile
for w in glob.glob(sys.argv[1] + "/*.whl"):
    zipfile.ZipFile(w).extractall(sys.argv[2])
PY
    for lib in cupy torch; do
        v=$(python3 -c "import $lib; print($lib.__version__)" 2>/dev/null) && echo "$lib $v here" ||
            echo "$lib: not installed here (its DLPack test skips)"
    done
    (cd "$kit/pytests" && PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" \
        limited 120 python3 -m pytest -q -rs -p no:cacheprovider . >"$log/python" 2>&1) || pyrc=$?
    grep -E "passed|failed|SKIPPED|FAILED|Error" "$log/python" | head -20
    dense=()
    [ $quick = 1 ] && dense=(--quick)
    PYTHONPATH="$site" limited 120 python3 "$kit/gpu_dense.py" "${dense[@]}" >"$log/dense" 2>&1
    grep -v '^RESULT' "$log/dense"
    grep '^RESULT' "$log/dense" >>"$log/bench"
fi

want bench || want cholesky || want demo && echo "== benchmarks"
if want bench; then
    STRATA_DEVICE=cuda:0 limited 200 "$kit/gpu_bench" >"$log/gpu_bench" 2>&1 ||
        { echo "gpu_bench failed:"; tail -5 "$log/gpu_bench"; }
    cat "$log/gpu_bench" >>"$log/bench"
fi
# The matrix in device memory, as cuSOLVER's is (loaded before each run
# and read back after it); with HOME `host` in a host buffer, its tiles
# copied to the GPU and each written one back inside the run.
cholesky() { # N TILE DTYPE [STREAMS|-] [HOME]: on cuda:0 (with that many streams)
    local spec=cuda:0 tag= home=${5:-device}
    [ -n "${4:-}" ] && [ "$4" != - ] && { spec=cuda:0,streams=$4; tag=_streams$4; }
    [ "$home" = host ] && tag=${tag}_host
    STRATA_DEVICE=$spec limited 90 "$kit/cholesky" "$1" "$2" 1 "$3" 3 "$home" 2>&1 | tee -a "$log/cholesky" |
        awk -v n="$1" -v t="$2$tag" -v d="$3" '
            /GFlop\/s/ { for (i = 1; i <= NF; i++) if ($i == "GFlop/s,") g = $(i-1); if (g > best) best = g }
            /WRONG|rror/ { print "CHECK tiled_cholesky " n " " d " tile " t ": " $0 }
            END { if (best == "") printf "RESULT tiled_cholesky_%s_%s_tile%s n/a TFLOP/s\n", n, d, t;
                  else printf "RESULT tiled_cholesky_%s_%s_tile%s %.3f TFLOP/s\n", n, d, t, best / 1000 }'
}
want cholesky && {
    if [ $quick = 1 ]; then
        cholesky 1024 256 f32; cholesky 1024 256 f64; cholesky 1024 128 f32 8
        cholesky 1024 256 f32 - host
    else
        for t in 512 1024 2048; do cholesky 16384 $t f32; cholesky 16384 $t f64; done
        cholesky 32768 2048 f32
        # Small tiles are many short tasks: twice the default streams
        # (4), to see whether more launches in flight pay.
        cholesky 16384 512 f32 8; cholesky 16384 1024 f32 8
        # What a host buffer's traffic costs (each written tile goes back).
        cholesky 16384 2048 f32 - host; cholesky 16384 1024 f32 - host
    fi
} >>"$log/bench" 2>&1
size=()
[ $quick = 1 ] && size=(--size 256)
demo() { # SPEC
    limited 90 "$kit/strata" demo --device "$1" "${size[@]}" 2>&1 | tee -a "$log/demo" | awk -v s="$1" '
        /wall/ { for (i = 1; i <= NF; i++) if ($i == "wall") w = $(i+1) }
        /host->device/ { h = $3 }
        END { if (w == "") w = "n/a"; if (h == "") h = "n/a";
              printf "RESULT demo_wall_%s %s ms\nRESULT demo_to_device_%s %s B\n", s, w, s, h }'
}
want demo && { demo sim; demo cuda:0,mem=8GiB; } >>"$log/bench" 2>&1

echo "== results ($(($(date +%s) - start)) s)"
printf '%-44s %14s  %s\n' figure value unit
grep '^RESULT' "$log/bench" | while read -r _ name value unit; do
    printf '%-44s %14s  %s\n' "$name" "$value" "$unit"
done
grep -v '^RESULT' "$log/bench" | grep -iE "^CHECK|error|fail|panic" | head -10
# `verdict NAME STATUS LOG`: one line saying how a step went.
verdict() {
    case $2 in
        skipped) echo "$1: not run (GPU_CHECK_STEPS)";;
        0) echo "$1: passed";;
        *) echo "$1: FAILED (log: $log/$3)";;
    esac
}
verdict conformance "$conf" conformance
verdict "cross tests" "$cross" cross
verdict "python tests (passed or skipped)" "$pyrc" python
echo "logs: $log"
for rc in "$conf" "$cross" "$pyrc"; do
    [ "$rc" = skipped ] || [ "$rc" = 0 ] || exit 1
done
