"""Client side of `./strata bench serve` (tools/bench_serve.sh): drives an OpenAI-compatible
server (strata-serve or llama.cpp's llama-server) and prints one JSON object per measurement.

  chat URL MODEL TURNS WORDS   a multi-turn chat, each turn adding a user message of about
                               WORDS words and keeping the (greedy, 32-token) answers in the
                               history: time to first token per turn, the prompt tokens and
                               the tokens the server says it took from its cache
  burst URL MODEL N            N requests at once (max_tokens 32, ignore_eos: every answer
                               32 tokens on both servers): answered, failed, wall
                               time, aggregate completion tokens/s, p50 / p99 time to first
                               token
  table FILE                   the side-by-side table of the JSON lines in FILE

Streamed chat completions over plain HTTP (urllib; the wire protocol the `openai` client
speaks), so the bench needs no venv. Every request asks for Qwen3's template with thinking on
(`chat_template_kwargs`), the template's default and llama-server's, so that both servers run
the same prompt tokens. `cache_prompt` is sent for llama-server (on unless the
driver asks for a cold run); strata-serve ignores unknown fields.
"""
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

# A fixed, varied text: the same words for every engine and run (no randomness).
WORDS = ("the pipeline carries hidden states between machines while each stage keeps its own "
         "layers and its own cache of keys and values so that a request crosses every stage "
         "once for each token it generates and the first token waits for the whole prompt to "
         "be read by every layer before the answer can begin to stream back to the person who "
         "asked a question about rivers mountains harbours and the weather of the coast in "
         "autumn when the light is low and the boats come home late").split()


def user_text(turn, words):
    out = [f"Turn {turn}:"]
    for i in range(words):
        out.append(WORDS[(i * 7 + turn * 13) % len(WORDS)])
    return " ".join(out) + "."


def stream_chat(url, model, messages, max_tokens, cache_prompt, ignore_eos=False):
    """Returns (ttft_s, total_s, text, completion_tokens, prompt_tokens, cached_tokens)."""
    # Qwen3's template with thinking on, its own default and llama-server's: both servers then
    # run the same tokens (strata-serve's default, off, adds an empty think block), and an
    # earlier answer renders as it was generated, so both can reuse it from the cache.
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": True}}
    if ignore_eos:  # both servers' extension: every answer exactly max_tokens long
        body["ignore_eos"] = True
    if cache_prompt is not None:  # llama-server's own field (strata-serve ignores it)
        body["cache_prompt"] = cache_prompt
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, text, usage, pieces = None, [], None, 0
    try:
        resp = urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"HTTP {e.code}: {e.read().decode(errors='replace')[:300]}") from None
    with resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    text.append(piece)
                    pieces += 1
    total = time.monotonic() - t0
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return (ttft if ttft is not None else total, total, "".join(text),
            usage.get("completion_tokens", pieces), usage.get("prompt_tokens"), cached)


def cmd_chat(url, model, turns, words, engine, cache_prompt):
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for t in range(1, turns + 1):
        messages.append({"role": "user", "content": user_text(t, words)})
        ttft, total, text, _, prompt, cached = stream_chat(url, model, messages, 32, cache_prompt)
        messages.append({"role": "assistant", "content": text})
        print(json.dumps({"kind": "chat", "engine": engine, "turn": t, "ttft_s": round(ttft, 3),
                          "total_s": round(total, 3), "prompt_tokens": prompt,
                          "cached_tokens": cached}), flush=True)


def cmd_burst(url, model, n, engine):
    results = [None] * n
    llama = True if engine.startswith("llama") else None

    def one(i):
        msgs = [{"role": "user", "content": user_text(100 + i, 40)}]
        try:
            ttft, total, _, done, _, _ = stream_chat(url, model, msgs, 32, llama, True)
            results[i] = ("ok", ttft, done)
        except Exception as e:  # noqa: BLE001 (an HTTP error is a measured failure)
            results[i] = ("failed", str(e), 0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.monotonic() - t0
    ok = [r for r in results if r and r[0] == "ok"]
    ttfts = sorted(r[1] for r in ok)
    tokens = sum(r[2] for r in ok)

    def pct(p):
        return round(ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))], 3) if ttfts else None

    print(json.dumps({"kind": "burst", "engine": engine, "n": n, "answered": len(ok),
                      "failed": n - len(ok), "wall_s": round(wall, 3),
                      "tok_s": round(tokens / wall, 2), "ttft_p50_s": pct(0.5),
                      "ttft_p99_s": pct(0.99),
                      "errors": sorted({r[1][:120] for r in results if r and r[0] != "ok"})}),
          flush=True)


def cmd_table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    engines = []
    for r in rows:
        if r["engine"] not in engines:
            engines.append(r["engine"])
    chats = [r for r in rows if r["kind"] == "chat"]
    if chats:
        turns = sorted({r["turn"] for r in chats})
        print("time to first token per turn of one chat, seconds (cached prompt tokens / prompt tokens)")
        print("%-28s" % "engine" + "".join("%18s" % f"turn {t}" for t in turns))
        for e in engines:
            cells = []
            for t in turns:
                m = [r for r in chats if r["engine"] == e and r["turn"] == t]
                if not m:
                    cells.append("%18s" % "-")
                    continue
                r = m[0]
                c = "" if r["cached_tokens"] is None else f" ({r['cached_tokens']}/{r['prompt_tokens']})"
                cells.append("%18s" % (f"{r['ttft_s']:.2f}{c}"))
            if any(c.strip() != "-" for c in cells):
                print("%-28s" % e + "".join(cells))
    bursts = [r for r in rows if r["kind"] == "burst"]
    if bursts:
        print("\nconcurrent requests (max_tokens 32)")
        print("%-28s %5s %9s %7s %8s %8s %10s %10s" % ("engine", "n", "answered", "failed",
                                                       "wall_s", "tok/s", "ttft p50", "ttft p99"))
        for r in bursts:
            print("%-28s %5d %9d %7d %8.2f %8.2f %10s %10s" % (
                r["engine"], r["n"], r["answered"], r["failed"], r["wall_s"], r["tok_s"],
                r["ttft_p50_s"], r["ttft_p99_s"]))
            for e in r["errors"]:
                print("%-28s   error: %s" % ("", e))
    other = [r for r in rows if r["kind"] == "kv"]
    for r in other:
        print(f"\nKV per cached token: {r['f32_bytes']} bytes f32, {r['f16_bytes']} bytes f16/bf16; "
              f"4k-token conversations in 4 GiB: {r['f32_convs']} (f32), {r['f16_convs']} (f16/bf16)")


def main(argv):
    if len(argv) >= 5 and argv[0] == "chat":
        engine = argv[5] if len(argv) > 5 else "?"
        cold = len(argv) > 6 and argv[6] == "cold"
        cmd_chat(argv[1], argv[2], int(argv[3]), int(argv[4]), engine,
                 (not cold) if engine.startswith("llama") else None)
    elif len(argv) >= 4 and argv[0] == "burst":
        cmd_burst(argv[1], argv[2], int(argv[3]), argv[4] if len(argv) > 4 else "?")
    elif len(argv) == 2 and argv[0] == "table":
        cmd_table(argv[1])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
