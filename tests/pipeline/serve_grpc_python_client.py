"""The official Python gRPC client (grpcio, stubs generated from runtime/serve/strata.proto)
against strata-serve --grpc-port; run by serve_grpc_python_test.sh, which starts the pipelines
and the servers and passes what it knows in the environment.

  golden: Generate with a golden case's prompt ids streams transformers' ids; Chat past the
          model's vocabulary is INVALID_ARGUMENT; Health and Info (the stages' layer ranges,
          roles and devices as they describe themselves).
  text:   on a real-vocabulary checkpoint, what the openai / curl tests do over HTTP: Chat's
          streamed text == the HTTP front's non-streamed text == the detokenised ids of a
          direct strata-client run; 16 concurrent streams == their solo runs; a cancelled or
          disconnected stream frees its KV slot on every stage (Info's describe); malformed
          requests get INVALID_ARGUMENT / UNIMPLEMENTED and the server keeps serving.
"""
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import strata_pb2 as pb
import strata_pb2_grpc as pbg

E = os.environ


def ids_of(name):
    return [int(x) for x in E[name].split(",") if x]


def golden(stub):
    prompt, want = ids_of("STRATA_PROMPT"), ids_of("STRATA_WANT")
    params = pb.GenerationParams(max_tokens=len(want), temperature=0.0, ignore_eos=True)
    msgs = list(stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=params)))
    got = [t for m in msgs for t in m.token_ids]
    assert got == want, (got, want)
    assert len(msgs) >= 2, len(msgs)
    assert msgs[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert msgs[-1].usage.prompt_tokens == len(prompt)
    assert msgs[-1].usage.completion_tokens == len(want)
    text = "".join(m.text for m in msgs)
    assert text == E["STRATA_C_TEXT"], (text, E["STRATA_C_TEXT"])
    print(f"Generate: golden ids in {len(msgs)} messages, text equals strata-grpc-client's")
    # Speculative decoding: the golden ids again, with n-gram drafts checked by the model.
    params = pb.GenerationParams(max_tokens=len(want), temperature=0.0, ignore_eos=True,
                                 speculate=pb.SPECULATE_NGRAM, speculate_k=6)
    msgs = list(stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=params)))
    got = [t for m in msgs for t in m.token_ids]
    assert got == want, ("speculate", got, want)
    totals = [s for s in stub.Info(pb.InfoRequest()).stages if s.stage_index == 0][0]
    assert totals.spec_drafted >= totals.spec_accepted > 0, totals
    print(f"Generate with n-gram drafts: golden ids; {totals.spec_accepted} of "
          f"{totals.spec_drafted} drafts accepted (StageInfo)")

    chat = pb.ChatRequest(messages=[pb.ChatMessage(role="user", content="Hello")],
                          params=pb.GenerationParams(max_tokens=16, temperature=0.0))
    expect_error(lambda: list(stub.Chat(chat)), grpc.StatusCode.INVALID_ARGUMENT, "vocabulary",
                 "Chat past the model's vocabulary")

    assert stub.Health(pb.HealthRequest()).status == pb.HealthResponse.SERVING
    info = stub.Info(pb.InfoRequest())
    assert info.model == "golden" and info.max_seq == 256 and info.chat_template, info
    # The stages as they describe themselves round the ring: the even split of 4 layers.
    assert info.stages_error == "" and len(info.stages) == 2, info
    for i, (a, b) in enumerate([(0, 2), (2, 4)]):
        s = info.stages[i]
        assert (s.stage_index, s.num_stages, s.layer_start, s.layer_end) == (i, 2, a, b), s
        assert (s.embed, s.head, s.vision) == (i == 0, i == 1, False), s
        assert s.device.startswith("cpu, ") and s.tp == 1 and s.kvp == 1 and s.threads >= 1, s
        assert s.weights_dtype == "bf16" and s.version == "strata " + info.strata_version, s
        assert s.max_seq == 256 and 0 <= s.kv_slots_in_use <= s.max_batch and s.queue_depth >= 0, s
    print("Health SERVING; Info:", info.model, info.max_seq, info.vocab_size, "stages",
          [(s.layer_start, s.layer_end, s.device) for s in info.stages])


def expect_error(call, code, needle, what):
    try:
        call()
    except grpc.RpcError as e:
        assert e.code() == code and needle in e.details(), (what, e.code(), e.details())
        print(f"{what}: {code.name}: {e.details()}")
        return
    raise SystemExit(f"{what} was accepted")


def chat_req(seed, max_tokens, model="", **kw):
    return pb.ChatRequest(model=model, messages=[pb.ChatMessage(role="user", content="Hello")],
                          params=pb.GenerationParams(max_tokens=max_tokens, temperature=1.0,
                                                     seed=seed, **kw))


def answer(stream):
    """(ids, text, messages) of a whole stream."""
    msgs = list(stream)
    return [t for m in msgs for t in m.token_ids], "".join(m.text for m in msgs), msgs


def decode(ids):
    """The ids as text by strata-tokenize --decode (the C tokenizer, tested against HF)."""
    cmd = [E["STRATA_TOKENIZE"], "--model", E["STRATA_MODEL"], "--jsonl", "--decode"]
    out = subprocess.run(cmd, input=json.dumps(ids) + "\n", capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def http_chat(seed, max_tokens):
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": max_tokens,
            "temperature": 1.0, "seed": seed}
    req = urllib.request.Request(E["STRATA_URL"] + "/v1/chat/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def slots(stub):
    """Each stage's KV slots in use, from a describe round the ring."""
    info = stub.Info(pb.InfoRequest())
    assert info.stages_error == "" and len(info.stages) == 2, info
    return [s.kv_slots_in_use for s in info.stages]


def wait_freed(stub, what):
    """Waits (10 s at most) until no stage holds a KV slot."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10:
        if slots(stub) == [0, 0]:
            print(f"{what}: every stage's KV slots in use back to 0 in "
                  f"{(time.monotonic() - t0) * 1000:.0f} ms")
            return
        time.sleep(0.02)
    raise SystemExit(f"{what}: KV slots still in use {slots(stub)}")


def same_text(stub):
    """Chat streamed == HTTP whole == detokenised direct-run ids, and the usage."""
    ids, text, msgs = answer(stub.Chat(chat_req(777, 24)))
    assert sum(1 for m in msgs if m.token_ids) >= 2, msgs  # streamed, not one message
    assert all(m.finish_reason == pb.FINISH_REASON_UNSPECIFIED for m in msgs[:-1]), msgs
    last = msgs[-1]
    direct_prompt, direct = ids_of("STRATA_DIRECT_PROMPT"), ids_of("STRATA_DIRECT_IDS")
    assert ids == direct, (ids, direct)
    # The direct run's ids as text, less an end-of-sequence id (the answer's end, not text).
    eos = set(stub.Info(pb.InfoRequest()).eos_ids)
    assert text == decode(direct[:-1] if direct and direct[-1] in eos else direct), text
    assert text == E["STRATA_DIRECT_TEXT"], (text, E["STRATA_DIRECT_TEXT"])
    whole = http_chat(777, 24)
    assert whole["choices"][0]["message"]["content"] == text, (whole, text)
    finish = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}[last.finish_reason]
    assert whole["choices"][0]["finish_reason"] == finish, (whole, finish)
    usage = whole["usage"]
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        len(direct_prompt), len(ids)) == (usage["prompt_tokens"], usage["completion_tokens"]), usage
    print(f"Chat: streamed ({len(msgs)} messages) == HTTP whole == detokenised direct-run ids "
          f"({len(ids)} tokens, {len(text)} chars, finish {finish}), usage equal")


def concurrent(stub):
    info = stub.Info(pb.InfoRequest())
    assert [s.max_batch for s in info.stages] == [16, 16], info
    solo = [answer(stub.Chat(chat_req(i, 32)))[:2] for i in range(1, 17)]
    with ThreadPoolExecutor(16) as ex:
        futs = [ex.submit(lambda i=i: answer(stub.Chat(chat_req(i, 32)))[:2]) for i in range(1, 17)]
        peak = 0
        while not all(f.done() for f in futs):
            peak = max([peak] + slots(stub))
            time.sleep(0.01)
        conc = [f.result() for f in futs]
    for i, (a, b) in enumerate(zip(solo, conc), 1):
        assert a == b, (i, a, b)
    assert len({t for _, t in solo}) > 1, solo  # the seeds gave different answers
    assert peak >= 2, peak  # they ran together
    print(f"16 concurrent Chat streams == their solo runs (at most {peak} KV slots in use at once)")
    wait_freed(stub, "16 streams done")


def cancel(stub, channel_for):
    """A stream cancelled, and a channel closed, mid-stream: every stage frees the KV."""
    for how in ("cancel", "disconnect"):
        ch = channel_for()
        stream = pbg.StrataStub(ch).Chat(chat_req(3, 200, ignore_eos=True))
        while not next(stream).token_ids:
            pass
        held = slots(stub)
        assert held == [1, 1], held  # the live stream holds a slot on each stage
        if how == "cancel":
            stream.cancel()
            try:
                list(stream)
                raise SystemExit("a cancelled stream ended normally")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.CANCELLED, e
        else:
            ch.close()
        wait_freed(stub, f"{how} mid-stream (slots held {held})")
        ch.close()


def malformed(stub, ch):
    """Each malformed request gets its status and message; the server keeps serving."""
    bad, P = grpc.StatusCode.INVALID_ARGUMENT, pb.GenerationParams

    def gen(**kw):
        return lambda: list(stub.Generate(pb.GenerateRequest(**kw)))

    def chat(**kw):
        return lambda: list(stub.Chat(pb.ChatRequest(**kw)))

    def raw(method, data):  # bytes as they are, no stub's serializer
        return lambda: list(ch.unary_stream(method)(data))

    robot = [pb.ChatMessage(role="robot", content="hi")]
    cases = [  # what, call, status, a part of the message
        ("garbage bytes", raw("/strata.v1.Strata/Generate", b"\xff\xff\xff\xff"), bad,
         "not a valid strata.v1.GenerateRequest"),
        ("truncated bytes", raw("/strata.v1.Strata/Chat", b"\x0a\x05ab"), bad,
         "not a valid strata.v1.ChatRequest"),
        ("unknown method", raw("/strata.v1.Strata/Nope", b""), grpc.StatusCode.UNIMPLEMENTED,
         "unknown method /strata.v1.Strata/Nope"),
        ("no prompt", gen(), bad, "'text' or 'token_ids' is required"),
        ("no messages", chat(), bad, "'messages' must not be empty"),
        ("unknown model", lambda: list(stub.Chat(chat_req(1, 4, model="gpt-4"))), bad,
         "the model 'gpt-4' does not exist"),
        ("empty text", gen(text=""), bad, "'text' must not be empty"),
        ("temperature 3", gen(text="hi", params=P(temperature=3.0)), bad, "'temperature' is 3"),
        ("temperature -0.5", gen(text="hi", params=P(temperature=-0.5)), bad,
         "'temperature' is -0.5"),
        ("top_p 0", gen(text="hi", params=P(top_p=0.0)), bad, "'top_p' is 0"),
        ("top_p 1.5", gen(text="hi", params=P(top_p=1.5)), bad, "'top_p' is 1.5"),
        ("max_tokens 100000", gen(text="hi", params=P(max_tokens=100000)), bad,
         "'max_tokens' is 100000"),
        ("300-token prompt", gen(token_ids=pb.TokenIds(ids=range(1, 301))), bad,
         "the prompt has 300 tokens"),
        ("id 151669", gen(token_ids=pb.TokenIds(ids=[1, 151669])), bad,
         "outside the vocabulary [0, 151669)"),
        ("id -3", gen(token_ids=pb.TokenIds(ids=[1, -3])), bad, "outside the vocabulary"),
        ("5 stop strings", gen(text="hi", params=P(stop=list("abcde"))), bad,
         "at most 4 stop strings"),
        ("role robot", chat(messages=robot), bad, "role 'robot' is not supported"),
    ]
    for what, call, code, needle in cases:
        expect_error(call, code, needle, what)
    assert stub.Health(pb.HealthRequest()).status == pb.HealthResponse.SERVING
    print(f"{len(cases)} malformed requests refused; still SERVING")


def main():
    addr = E["STRATA_ADDR"]
    ch = grpc.insecure_channel(addr)
    stub = pbg.StrataStub(ch)
    if sys.argv[1] == "golden":
        golden(stub)
        return
    same_text(stub)
    concurrent(stub)
    cancel(stub, lambda: grpc.insecure_channel(addr))
    malformed(stub, ch)
    # Still serving after the cancels and the malformed requests: the same answer again.
    assert answer(stub.Chat(chat_req(777, 24)))[0] == ids_of("STRATA_DIRECT_IDS")
    assert slots(stub) == [0, 0]
    print("after all that: the same answer, no KV slot held")


if __name__ == "__main__":
    main()
