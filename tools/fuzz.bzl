"""libFuzzer targets that also run as plain regression tests.

strata_fuzz_target(name, srcs, deps, corpus) declares:
  <name>             a libFuzzer binary (build with --config=fuzz, which instruments every
                     library it links; tagged manual);
  <name>_corpus_test a cc_test that replays every file of the committed seed corpus
                     through LLVMFuzzerTestOneInput with the standalone driver, so the
                     default and sanitizer passes of `bazel test //...` cover the corpus.
"""

def strata_fuzz_target(name, srcs, corpus, deps = [], **kwargs):
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual", "fuzz"],
        **kwargs
    )
    native.cc_test(
        name = name + "_corpus_test",
        srcs = srcs,
        deps = deps + ["//tests:fuzz_driver"],
        data = corpus,
        args = ["$(locations %s)" % c for c in corpus],
        **kwargs
    )
