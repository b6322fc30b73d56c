# shellcheck shell=bash
# bench_build TARGET...: sets STRATA_BIN_DIR (exported) to where the benchmarks' binaries are:
# $STRATA_PREBUILT when set (a directory laid out as bazel-bin: the GPU bundle's prebuilt/,
# on a machine without Bazel), else bazel-bin after building TARGETs (with
# $STRATA_BAZEL_FLAGS; the build's output is shown only when it fails, then exit 1).
bench_build() {
    if [ -n "${STRATA_PREBUILT:-}" ]; then
        STRATA_BIN_DIR=$STRATA_PREBUILT
    else
        bazel build ${STRATA_BAZEL_FLAGS:-} "$@" >/dev/null 2>&1 ||
            { bazel build ${STRATA_BAZEL_FLAGS:-} "$@"; exit 1; }
        STRATA_BIN_DIR="$(bazel info ${STRATA_BAZEL_FLAGS:-} bazel-bin 2>/dev/null)"
    fi
    export STRATA_BIN_DIR
}
