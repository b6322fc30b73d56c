#!/usr/bin/env python3
"""Attacks on a running strata-serve's HTTP and gRPC ports, each followed by a normal request
that must give the same answer as before any attack (stdlib only; run by hand, not a test):

    python3 tools/serve_attack.py --http-port P --grpc-port G --pid SERVE_PID

Rows: 100 idle + 10 slow-loris connections beside a real request; a 100 MB body; malformed
JSON (truncated, 100k-deep nesting, huge numbers, wrong types, invalid UTF-8, NUL bytes); 64
concurrent streams with half the clients leaving mid-stream, then every KV slot free
(/v1/stages); garbage, an HTTP/1.1 request and an HTTP/2 preface + garbage on the gRPC port;
100 gRPC streams that open and never send their message, beside a real gRPC request.
The model should answer "hi" with max_tokens 8 (any small model with a tokenizer)."""
import argparse, socket, time, json, threading, sys, http.client
from collections import Counter
ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--http-port", type=int, required=True)
ap.add_argument("--grpc-port", type=int, required=True)
ap.add_argument("--pid", type=int, required=True, help="strata-serve's pid (its RSS is printed)")
ap.add_argument("--grpc-client", default="bazel-bin/runtime/strata-grpc-client",
                help="strata-grpc-client, for a real gRPC request beside stalled streams")
args = ap.parse_args()
HP, GP, SPID = args.http_port, args.grpc_port, args.pid
def rss():
    for l in open(f'/proc/{SPID}/status'):
        if l.startswith('VmRSS'): return int(l.split()[1])//1024
def req(body=None, path='/v1/chat/completions', timeout=30):
    c = http.client.HTTPConnection('127.0.0.1', HP, timeout=timeout)
    b = body if body is not None else json.dumps({"model":"model","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"temperature":0})
    t=time.time(); c.request('POST', path, b, {'Content-Type':'application/json'}); r=c.getresponse(); d=r.read(); c.close()
    return r.status, d, time.time()-t
st, base, _ = req(); want = json.loads(base)['choices'][0]['message']['content']
def normal(label):
    st, d, t = req()
    ok = st == 200 and json.loads(d)['choices'][0]['message']['content'] == want
    print(f"  after {label}: normal request {'OK' if ok else 'FAILED '+str(st)} in {t:.3f}s; serve RSS {rss()} MB", flush=True)
    return ok
print("baseline", st, "rss", rss())
# 1. 100 idle + 10 slow-loris
idle=[socket.create_connection(('127.0.0.1',HP)) for _ in range(100)]
slow=[socket.create_connection(('127.0.0.1',HP)) for _ in range(10)]
stop=False
def loris():
    head=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    i=0
    while not stop and i < len(head):
        for s in slow:
            try: s.send(head[i:i+1])
            except Exception: pass
        i+=1; time.sleep(1)
th=threading.Thread(target=loris); th.start(); time.sleep(2)
st,d,t=req(); print(f"1. 100 idle + 10 slow-loris: real request {st} in {t:.3f}s", flush=True)
stop=True; th.join(); [s.close() for s in idle+slow]
normal("idle/slowloris")
# 2. 100 MB body
s=socket.create_connection(('127.0.0.1',HP)); s.settimeout(10)
s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n")
t=time.time(); sent=0; resp=b''
try:
    chunk=b'{'*65536
    while sent < 104857600:
        s.send(chunk); sent+=len(chunk)
        if time.time()-t > 20: break
except Exception as e: pass
try: resp=s.recv(200)
except Exception as e: resp=repr(e).encode()
print(f"2. 100 MB body: sent {sent//(1<<20)} MB before the server answered/closed in {time.time()-t:.2f}s: {resp[:60]!r}", flush=True)
s.close(); normal("100MB body")
# 3. malformed JSON
cases = {
 'truncated': '{"model":"model","messages":[{"role":"user","content":"hi"',
 'deep nesting 100k': '['*100000 + ']'*100000,
 'deep nesting in messages': '{"model":"model","messages":' + '['*100000 + ']'*100000 + '}',
 'huge number max_tokens': '{"model":"model","messages":[{"role":"user","content":"hi"}],"max_tokens":' + '9'*400 + '}',
 '1e999999 temperature': '{"model":"model","messages":[{"role":"user","content":"hi"}],"temperature":1e999999}',
 'messages a number': '{"model":"model","messages":5}',
 'max_tokens a string': '{"model":"model","messages":[{"role":"user","content":"hi"}],"max_tokens":"8"}',
 'temperature an object': '{"model":"model","messages":[{"role":"user","content":"hi"}],"temperature":{}}',
 'invalid utf8': b'{"model":"model","messages":[{"role":"user","content":"\xff\xfe\xc0"}]}',
 'NUL in string': '{"model":"model","messages":[{"role":"user","content":"a\\u0000b"}]}',
 'raw NUL': b'{"model":"model",\x00"messages":[]}',
 'empty body': '',
}
for k,v in cases.items():
    try:
        st,d,t = req(v if isinstance(v,bytes) else v.encode())
        print(f"3. {k}: {st} in {t:.3f}s {d[:90]!r}", flush=True)
    except Exception as e:
        print(f"3. {k}: EXC {e!r}", flush=True)
normal("malformed JSON")
def get(path):
    c=http.client.HTTPConnection('127.0.0.1',HP,timeout=10); c.request('GET',path); r=c.getresponse(); d=r.read(); c.close(); return r.status,d
st,d=get('/v1/stages'); print("stages before:", d[:400])
body=json.dumps({"model":"model","messages":[{"role":"user","content":"tell me a story"}],"max_tokens":200,"temperature":0,"stream":True}).encode()
results=[None]*64
def client(i):
    try:
        s=socket.create_connection(('127.0.0.1',HP),timeout=60)
        s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"%len(body)+body)
        got=b''
        while True:
            b=s.recv(4096)
            if not b: break
            got+=b
            if i%2==1 and got.count(b'data:')>=3:
                s.close(); results[i]='cut'; return
            if b'[DONE]' in got or got.endswith(b'\r\n0\r\n\r\n'): break
        results[i]='done' if b'[DONE]' in got else ('error event: '+got.split(b'"message":"')[1][:60].decode(errors='replace') if b'"error"' in got else 'other '+got[:60].decode(errors='replace'))
        s.close()
    except Exception as e: results[i]='exc '+repr(e)
ts=[threading.Thread(target=client,args=(i,)) for i in range(64)]
t=time.time(); [x.start() for x in ts]; [x.join() for x in ts]
from collections import Counter
print("64 streams:", Counter(r if r in ('done','cut') else r[:60] for r in results), f"in {time.time()-t:.1f}s")
for k in range(20):
    st,d=get('/v1/stages'); j=json.loads(d)
    busy=[s.get('kv_slots_in_use') for s in j.get('stages',j.get('data',[]))] if isinstance(j,dict) else None
    if busy is not None and all(b==0 for b in busy): break
    time.sleep(0.5)
print("stages after:", d[:400])
# gRPC
def raw(data, label, wait=3):
    s=socket.create_connection(('127.0.0.1',GP),timeout=wait); t=time.time()
    try:
        s.send(data); r=s.recv(300)
        more=b''
        try:
            while True:
                x=s.recv(4096)
                if not x: break
                more+=x
        except socket.timeout: more+=b'<still open>'
        print(f"6. {label}: got {r[:50]!r}... then closed/timeout {more[-20:]!r} after {time.time()-t:.2f}s")
    except Exception as e: print(f"6. {label}: {e!r} after {time.time()-t:.2f}s")
    s.close()
raw(b'\x00\x01garbage'*100, 'garbage')
raw(b'GET / HTTP/1.1\r\nHost: x\r\n\r\n', 'HTTP/1.1')
raw(b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + b'\xff'*64, 'preface+garbage')
j = json.loads(d)
print("5. KV slots in use after the streams:", [s.get("kv_slots_in_use") for s in j.get("data", [])])
normal("gRPC garbage")

# 100 gRPC streams that open (HEADERS, no END_STREAM) and never send their message.
import struct, subprocess
def h2frame(t, flags, sid, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([t, flags]) + struct.pack(">I", sid) + payload
def literal(n, v):  # HPACK: a literal header field without indexing, new name
    n, v = n.encode(), v.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v
headers = b"".join(literal(k, v) for k, v in [(":method", "POST"), (":scheme", "http"),
    (":path", "/strata.v1.Strata/Generate"), (":authority", "x"),
    ("content-type", "application/grpc"), ("te", "trailers")])
stalled = []
for _ in range(100):
    s = socket.create_connection(("127.0.0.1", GP))
    s.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0, b"") + h2frame(1, 4, 1, headers))
    stalled.append(s)
time.sleep(2)
t = time.time()
r = subprocess.run([args.grpc_client, "--addr", f"127.0.0.1:{GP}", "--prompt", "1,2,3",
                    "--max-tokens", "4", "--deadline-ms", "20000"], capture_output=True, timeout=60)
print(f"6. 100 stalled gRPC streams: a real gRPC request exit {r.returncode} in {time.time() - t:.2f}s:",
      (r.stdout + r.stderr).decode(errors="replace").strip().splitlines()[-1])
for s in stalled:
    s.close()
normal("stalled gRPC streams")
