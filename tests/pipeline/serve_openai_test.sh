#!/usr/bin/env bash
# Integration, optional: the official `openai` Python client against strata-serve before a
# 2-stage pipeline on the tiny random real-vocabulary checkpoint: chat completion whole and
# streamed (the same text, the usage in the final chunk, the usage-only chunk with
# include_usage), a completion whole and streamed, models.list, and an APIError for a bad request.
# Runs only when a Python with `openai` exists ($STRATA_OPENAI_PYTHON, else the venv at
# ${STRATA_VENV:-$HOME/.cache/strata/venv}); otherwise prints "skipped: <reason>" and passes.
# Never installs anything.
set -u
py="${STRATA_OPENAI_PYTHON:-${STRATA_VENV:-${HOME:-/nonexistent}/.cache/strata/venv}/bin/python}"
if ! [ -x "$py" ]; then
    echo "skipped: no Python at $py (set STRATA_OPENAI_PYTHON to one with the openai package)"
    exit 0
fi
if ! "$py" -c 'import openai' 2>/dev/null; then
    echo "skipped: $py has no openai package"
    exit 0
fi
. "$(dirname "$0")/pipeline_lib.sh"
pl_init
model="$PL_WORK/model"
"$PL_BIN/strata-stage-bench" make-model --out "$model" --vocab 151936 --hidden 64 --layers 2 \
    --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --seed 11 >"$PL_WORK/make.log" 2>&1 ||
    pl_fail "make-model failed"
cp "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer.json" \
    "$PL_ROOT/tests/runtime/text/testdata/qwen3-tokenizer/tokenizer_config.json" "$model/"
pl_start_pipeline o 2 "$model" --max-seq 256
"$PL_BIN/strata-serve" --model "$model" --stage0-port-file "$PL_WORK/o.0.port" \
    --port-file "$PL_WORK/http.port" --max-seq 256 $(pl_security_default) 2>>"$PL_WORK/serve.log" &
PL_PIDS="$PL_PIDS $!"
pl_wait_file "$PL_WORK/http.port" 20 || pl_fail "strata-serve did not start"
STRATA_URL="http://127.0.0.1:$(cat "$PL_WORK/http.port")/v1" "$py" - <<'PY' || pl_fail "openai client checks failed"
import os
import openai
c = openai.OpenAI(base_url=os.environ["STRATA_URL"], api_key="none")
assert [m.id for m in c.models.list()] == ["model"]
msgs = [{"role": "user", "content": "Hello"}]
whole = c.chat.completions.create(model="model", messages=msgs, max_tokens=16, seed=3)
text = whole.choices[0].message.content
parts = list(c.chat.completions.create(model="model", messages=msgs, max_tokens=16, seed=3,
                                       stream=True))
streamed = "".join(ch.choices[0].delta.content or "" for ch in parts if ch.choices)
assert text == streamed, (text, streamed)
assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
# The final chunk (the one with finish_reason) carries the usage, parsed by the client.
assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason, parts[-1]
assert parts[-1].usage == whole.usage and all(p.usage is None for p in parts[:-1]), parts
# include_usage: OpenAI's usage-only chunk (no choices) comes after it.
parts = list(c.chat.completions.create(model="model", messages=msgs, max_tokens=16, seed=3,
                                       stream=True, stream_options={"include_usage": True}))
assert parts[-1].choices == [] and parts[-1].usage == whole.usage, parts[-1]
assert parts[-2].choices[0].finish_reason and parts[-2].usage == whole.usage, parts[-2]
comp = c.completions.create(model="model", prompt="Once upon", max_tokens=4, seed=5)
assert comp.choices[0].finish_reason in ("stop", "length")
parts = list(c.completions.create(model="model", prompt="Once upon", max_tokens=4, seed=5,
                                  stream=True))
assert "".join(p.choices[0].text for p in parts) == comp.choices[0].text, parts
assert parts[-1].choices[0].finish_reason == comp.choices[0].finish_reason, parts[-1]
assert parts[-1].usage == comp.usage, (parts[-1].usage, comp.usage)
try:
    c.chat.completions.create(model="model", messages=msgs, temperature=5)
    raise SystemExit("temperature 5 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
# Speculative decoding (the extension field, through the client's extra_body): the same
# answer as without drafts, greedy and sampled, and /metrics counts the accepted drafts.
import re, urllib.request
for extra in ({"temperature": 0}, {"temperature": 1, "seed": 9}):
    plain = c.chat.completions.create(model="model", messages=msgs, max_tokens=48, **extra)
    spec = c.chat.completions.create(model="model", messages=msgs, max_tokens=48, **extra,
                                     extra_body={"speculate": "ngram", "speculate_k": 6})
    assert spec.choices[0].message.content == plain.choices[0].message.content, (spec, plain)
    assert (spec.usage.prompt_tokens, spec.usage.completion_tokens) == \
        (plain.usage.prompt_tokens, plain.usage.completion_tokens), (spec.usage, plain.usage)
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0, plain.usage
    predicted = spec.usage.completion_tokens_details
metrics = urllib.request.urlopen(os.environ["STRATA_URL"][:-3] + "/metrics").read().decode()
accepted = re.search(r'^strata_stage_spec_decode_accepted_tokens_total\{stage="0"\} (\d+)$',
                     metrics, re.M)
assert accepted and int(accepted.group(1)) > 0, metrics
# The last answer's usage counts its drafts as OpenAI counts predicted tokens.
assert predicted.accepted_prediction_tokens + predicted.rejected_prediction_tokens > 0, predicted
try:
    c.chat.completions.create(model="model", messages=msgs, extra_body={"speculate": "eagle"})
    raise SystemExit("speculate eagle was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "speculate" in str(e), e
print("openai client: models, chat whole == streamed, usage in the final chunk, completion,"
      " 400 error, speculation (%s drafts accepted) as without: ok" % accepted.group(1))
PY
