#!/usr/bin/env bash
# Builds the GPU bundle here, where nvcc and the CUDA libraries are, so that a lent device
# (bare: a driver, no toolkit, no Bazel, no packages) only runs it: .gpu-bundle/ (ignored by
# git; the device tool's `carry` names it) holds
#   bin/   the GPU tests and the op harness, and
#   prebuilt/   laid out as bazel-bin: strata-stage, strata-client, the GPU bench and the CPU
#          benches' binaries (STRATA_PREBUILT for tools/bench_{pipeline,predict,tp,kvp}.sh), built
#          with the CUDA runtime linked in (--define=strata_cudart=static) and Strata's own
#          libraries static (--dynamic_mode=off); NCCL is opened at run time where present;
#   lib/   the shared libraries they need that a bare machine may lack (libstdc++, OpenSSL,
#          cJSON, cmocka, iproute2's), found with ldd;
#   sbin/  iproute2's ip and tc from this machine (the network-namespace benches);
#   strata/tests/golden/   the golden cases (the tests read them through TEST_SRCDIR);
#   gpu_run.sh   tools/gpu_run.sh: the device run, every step under a time limit;
#   gpu_run_cpu.sh   tools/gpu_run_cpu.sh: a second call's CPU benches on the device's cores;
#   ncu_summary.py   tools/ncu_summary.py: gpu_run.sh's profile step's reader.
# and packs it into .gpu-pack/bundle.tgz (ignored by git), which is what travels: the device
# tool carries at most 64 MiB with the tracked tree (23 MiB), and the bundle itself is 59 (of 60).
# Then checks it on this machine: gpu_run.sh must get through every step (each says "skipped"
# without a CUDA device; nothing may fail for a missing library or file). Prints the sizes
# and the check's summary.
# Usage: tools/gpu_bundle.sh [--no-check]. On the device (carry .gpu-pack):
#   tar xzf .gpu-pack/bundle.tgz && .gpu-bundle/gpu_run.sh "$OUT"
set -u
cd "$(dirname "$0")/.."
B=.gpu-bundle
FLAGS=(--dynamic_mode=off --define=strata_cudart=static --platform_suffix=gpubundle)
[ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu_bundle: no nvcc at /usr/local/cuda/bin" >&2; exit 1; }
tests=$(bazel query 'attr(tags, "gpu", tests(//...))' 2>/dev/null) ||
    { echo "gpu_bundle: bazel query failed" >&2; exit 1; }
tools=(//runtime:strata-stage //runtime:strata-client //runtime:strata-bench-backend
    //runtime:strata-stage-bench //runtime:strata-bench-kvp //reference/tools:strata-bench-decode
    //runtime:strata-plan //tests/pipeline:tun_link //kernels:strata-bench-matmul)
targets=($tests "${tools[@]}")
bazel build "${FLAGS[@]}" "${targets[@]}" >/tmp/gpu_bundle.build.log 2>&1 ||
    { tail -n 30 /tmp/gpu_bundle.build.log; exit 1; }
bin=$(bazel info "${FLAGS[@]}" bazel-bin 2>/dev/null)
rm -rf "$B"
mkdir -p "$B/bin" "$B/lib" "$B/strata/tests"
for t in "${tools[@]}"; do
    pkg=${t#//}
    mkdir -p "$B/prebuilt/${pkg%%:*}"
    cp "$bin/${pkg%%:*}/${t##*:}" "$B/prebuilt/${pkg%%:*}/" ||
        { echo "gpu_bundle: $t not built" >&2; exit 1; }
done
for t in $tests; do
    pkg=${t#//}
    pkg=${pkg%%:*}
    name=${t##*:}
    case "$pkg" in # one flat directory: the kernel tests get a prefix
        tests/kernels) dest="kernels_$name" ;;
        *) dest="$name" ;;
    esac
    # The grid and nographs targets are the same binary with other arguments (gpu_run.sh).
    [ -f "$bin/$pkg/$name" ] || { echo "gpu_bundle: $bin/$pkg/$name not built" >&2; exit 1; }
    cp "$bin/$pkg/$name" "$B/bin/$dest"
done
rm -f "$B"/bin/golden_backends_cuda_{nographs,grid,grid4}_test
cp -r tests/golden "$B/strata/tests/"
rm -f "$B/strata/tests/golden/BUILD.bazel"
cp tools/gpu_run.sh tools/gpu_run_cpu.sh tools/ncu_summary.py "$B/"
# iproute2's ip and tc, where this machine has them: the device image has no iproute2, and
# bench predict / tp's network-namespace hosts need them (gpu_run_cpu.sh puts sbin/ first).
mkdir -p "$B/sbin"
for t in ip tc; do
    p=$(command -v "$t" || true)
    [ -n "$p" ] && cp -L "$p" "$B/sbin/"
done
# Shared libraries beyond glibc's own and the driver's.
for f in "$B"/bin/* "$B"/sbin/* $(find "$B/prebuilt" -type f); do
    ldd "$f" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libcuda.so*) ;;
        *) cp -L "$lib" "$B/lib/" ;;
    esac
done
mkdir -p .gpu-pack
tar czf .gpu-pack/bundle.tgz "$B" || { echo "gpu_bundle: cannot pack $B" >&2; exit 1; }
size=$(du -sm "$B" | cut -f1)
packed=$(($(stat -c %s .gpu-pack/bundle.tgz) >> 20))
tree=$(($(git ls-files -z | xargs -0 stat -c %s | awk '{ s += $1 } END { print s + 0 }') >> 20))
echo "bundle: $B, $(ls "$B/bin" | wc -l) tests, $(find "$B/prebuilt" -type f | wc -l) tools," \
    "libraries: $(ls "$B/lib" | tr '\n' ' ')"
echo "size: ${size} MiB, packed ${packed} MiB (.gpu-pack/bundle.tgz); with the tracked tree" \
    "$((packed + tree)) MiB (the carry limit is 64)"
[ $((packed + tree)) -lt 62 ] || { echo "gpu_bundle: over the carry limit" >&2; exit 1; }
# Unpacked it lands on the device's disk and in its page cache beside an 8B checkpoint: the
# bundle's own budget is 60 MiB (what a new variant or test binary must fit in).
[ "$size" -le 60 ] || { echo "gpu_bundle: the bundle is ${size} MiB unpacked (at most 60)" >&2; exit 1; }
[ "${1:-}" = --no-check ] && exit 0
# The check here: every step must run; without a device each one says "skipped".
out=$(mktemp -d /tmp/gpu-bundle-check.XXXXXX)
env -i PATH="$PATH" HOME="$HOME" "$B/gpu_run.sh" "$out" >/dev/null 2>&1
cat "$out/summary.txt"
if grep -qE '^(FAILED|TIMEOUT)' "$out/summary.txt"; then
    if nvidia-smi >/dev/null 2>&1; then
        echo "gpu_bundle: a step failed on this machine's GPU (logs in $out/gpu_logs.tgz)"
    else
        echo "gpu_bundle: a step failed without a GPU (logs in $out/gpu_logs.tgz): the bundle is broken"
    fi
    exit 1
fi
echo "check: every step ran (logs in $out/gpu_logs.tgz)"
echo "device: run with carry [\".gpu-pack\"]: tar xzf .gpu-pack/bundle.tgz && .gpu-bundle/gpu_run.sh \"\$OUT\""
