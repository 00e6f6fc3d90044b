#!/usr/bin/env python3
"""serve_gpt end to end, over real sockets on 127.0.0.1 (ctest -L serving).

usage: test_serve_gpt.py SERVE_GPT TRAIN_GPT SCRATCH_DIR [LOAD_GPT]

A tiny model is trained for a few steps with train_gpt, which also samples 20 characters
with the uncached forward pass; the server must give the same characters for the same
prompt, seed, temperature and top-k, and with --device gpu (the CUDA simulator in a build
without a GPU) the CPU's greedy characters and log-probabilities wherever the margins decide
them. Then, each on a fresh server: 16 clients at once get
the texts they get alone; every bad request is answered 400 (413 for a body over the limit)
with a JSON error naming the field, and the server goes on; a full queue answers 503 with
Retry-After; the OpenAI API's other fields work end to end (n samples equal to seeds
seed + i alone, a stop string cutting streamed and whole texts alike, log-probabilities at
temperature 0, chat, /v1/models); 200 clients that go away mid-stream leave the pool
whole; a few thousand random bodies leave the server alive; SIGTERM lets the running stream finish, refuses new
requests and exits 0. A request sent while another streams is answered before that stream
ends (it joins the running batch). load_gpt's levels receive what the server counts as
generated, and its bad input (another machine, no server, bad flags, a text the model cannot
read) gets one line.
"""
import atexit
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

SERVE, TRAIN, SCRATCH = sys.argv[1:4]
LOAD = sys.argv[4] if len(sys.argv) > 4 else None  # load_gpt, when built
RUN = os.path.join(SCRATCH, "run")
failures = []
servers = []
atexit.register(lambda: [p.kill() for p in servers if p.poll() is None])  # never left behind


def check(ok, what):
    if ok:
        print(f"ok: {what}")
    else:
        print(f"FAIL: {what}")
        failures.append(what)


class Server:
    """serve_gpt on a free port; the port is read from its first line."""

    def __init__(self, *flags):
        self.proc = subprocess.Popen([SERVE, RUN, "--port", "0", *flags], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        servers.append(self.proc)
        line = self.first_line = self.proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            raise SystemExit(f"serve_gpt did not start: {line!r} {self.proc.stdout.read()}")
        self.port = int(m.group(1))
        self.proc.stdout.readline()  # the cache's line

    def request(self, method, path, body=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        out = (r.status, dict(r.getheaders()), r.read())
        c.close()
        return out

    def complete(self, **fields):
        status, headers, body = self.request("POST", "/v1/completions", fields)
        return status, headers, json.loads(body)

    def stream(self, **fields):
        """The streamed text, and whether it came as text/event-stream, its last event said
        finish_reason "length" and [DONE] closed it."""
        status, headers, body = self.request("POST", "/v1/completions", dict(fields, stream=True))
        if status != 200:
            return status, None, False
        events = [e[len("data: "):] for e in body.decode().split("\n\n") if e.startswith("data: ")]
        done = events and events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        last_reason = chunks[-1]["choices"][0]["finish_reason"] if chunks else None
        event_stream = headers.get("Content-Type", "").startswith("text/event-stream")
        return status, text, bool(done) and last_reason == "length" and event_stream

    def metrics(self):
        _, _, body = self.request("GET", "/metrics")
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def healthy(self):
        try:
            return self.request("GET", "/health", timeout=10)[0] == 200
        except OSError:
            return False

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return self.proc.returncode, out


# --- the model, and the uncached path's sample to compare with -------------------------
subprocess.run(["rm", "-rf", RUN], check=True)
subprocess.run([TRAIN, "--recipe", "tiny", "--max-iters", "30", "--eval-interval", "30", "--eval-iters", "2",
                "--sample", "20", "--prompt", "ROMEO:", "--top-k", "5", "--temperature", "0.8", "--seed", "7",
                "--out", RUN], check=True, stdout=subprocess.DEVNULL)
with open(os.path.join(RUN, "sample.txt")) as f:
    sample = f.read()[len("ROMEO:"):len("ROMEO:") + 20]
config = json.load(open(os.path.join(RUN, "checkpoint", "config.json")))
block, vocab = config["block_size"], config["vocab_size"]

# --- completions, streamed and not, against train_gpt's sample ---------------------------
s = Server()
check(s.request("GET", "/health")[0] == 200, "GET /health answers 200 while serving")
status, _, reply = s.complete(prompt="ROMEO:", max_tokens=20, seed=7, temperature=0.8, top_k=5)
check(status == 200 and reply["choices"][0]["text"] == sample,
      f"the completion equals train_gpt's uncached sample: {reply['choices'][0]['text']!r} vs {sample!r}")
check(reply["usage"] == {"prompt_tokens": 6, "completion_tokens": 20, "total_tokens": 26}, "usage counts the tokens")
status, text, closed = s.stream(prompt="ROMEO:", max_tokens=20, seed=7, temperature=0.8, top_k=5)
check(status == 200 and text == sample and closed, "the streamed events (text/event-stream) spell the same text and end with [DONE]")
_, _, greedy = s.complete(prompt="ROMEO:", max_tokens=10, temperature=0)
_, _, top1 = s.complete(prompt="ROMEO:", max_tokens=10, top_k=1, seed=99)
check(greedy["choices"][0]["text"] == top1["choices"][0]["text"], "temperature 0 is greedy (top-k 1)")

# --- --device gpu: the whole step on the GPU (in a build without one, the CUDA simulator) -----
# The same greedy characters as the CPU's wherever the CPU's margin between its most likely
# character and the runner-up is over 0.01: the two steps' logits differ by rounding only,
# float32 sums in other orders, which for this model (2 layers, C 32, weights below 1) is
# under 1e-4 (2γ_n of the LM head's Σ|terms| with n ≈ 700 terms on the path, u = 2^-24;
# tests/cuda/test_paged_engine_gpu.cpp derives it), so 0.01 leaves a factor of 100.
_, _, cpu_lp = s.complete(prompt="ROMEO:", max_tokens=12, temperature=0, logprobs=2)
g = Server("--device", "gpu")
check(" on gpu" in g.first_line, f"the first line names the device: {g.first_line.strip()!r}")
status, _, gpu_lp = g.complete(prompt="ROMEO:", max_tokens=12, temperature=0, logprobs=2)
cl, gl = cpu_lp["choices"][0]["logprobs"], gpu_lp["choices"][0]["logprobs"] if status == 200 else None
same, compared = status == 200, 0
for k, (tok, top) in enumerate(zip(cl["tokens"], cl["top_logprobs"])):
    ranked = sorted(top.values(), reverse=True)
    if len(ranked) > 1 and ranked[0] - ranked[1] <= 0.01:
        break  # decided by less than the rounding could move: the texts may part here
    same = same and gl["tokens"][k] == tok and abs(gl["token_logprobs"][k] - cl["token_logprobs"][k]) <= 1e-3
    compared += 1
check(same and compared > 0, f"--device gpu gives the CPU's greedy characters and log-probabilities (within 1e-3) "
      f"where the margins decide them ({compared} of {len(cl['tokens'])})")
status, text, closed = g.stream(prompt="JULIET:", max_tokens=6, seed=3)
check(status == 200 and closed and len(text) == 6, "--device gpu streams a completion to [DONE]")
code, out = g.stop()
check(code == 0, f"--device gpu drains and exits 0 on SIGTERM ({code})")

# --- 16 clients at once get what they get alone --------------------------------------------
requests = [dict(prompt=p, max_tokens=10 + i % 8, seed=i, temperature=0.9, top_k=8)
            for i, p in enumerate(["ROMEO:", "JULIET:\n", "a", "the king ", "\n", "First Citizen:"] * 3)][:16]
alone = [s.complete(**r)[2]["choices"][0]["text"] for r in requests]
together = [None] * len(requests)


def client(i):
    together[i] = s.stream(**requests[i])


threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
for t in threads:
    t.start()
for t in threads:
    t.join()
check(all(t[0] == 200 and t[2] for t in together), "16 concurrent streams all end with [DONE]")
check([t[1] for t in together] == alone, "16 concurrent clients get the texts they get alone")
m = s.metrics()
check(m["serve_kv_blocks_free"] == m["serve_kv_blocks_capacity"] and m["serve_running_sequences"] == 0,
      "after them the pool is whole and nothing runs")

# --- automatic prefix caching: a prompt's full blocks (16 positions) found again ------------
# A prompt of 19 characters fills one block of 16; sent twice, the second finds that block in
# the cache (one hit) and gives the same greedy text as the first, which computed it.
prompt20 = "KING HENRY VI: What"  # 19 characters: one full block and 3 positions of the next
before = s.metrics()
first = s.complete(prompt=prompt20, max_tokens=4, temperature=0)[2]["choices"][0]["text"]
middle = s.metrics()
second = s.complete(prompt=prompt20, max_tokens=4, temperature=0)[2]["choices"][0]["text"]
after = s.metrics()
check(after["serve_prefix_cache_hits_total"] - middle["serve_prefix_cache_hits_total"] == 1 and
      after["serve_prefix_cache_queries_total"] - middle["serve_prefix_cache_queries_total"] == 1 and
      first == second,
      "the same prompt again: its one full block found in the prefix cache (/metrics), the same text")

# --- the OpenAI API's other fields: n, stop, logprobs, chat, models ---------------------------
# n samples of one prompt are forked from one computed prompt; sample i draws with seed + i,
# so it gives the text of a request of that seed alone.
status, _, many = s.complete(prompt="ROMEO:", max_tokens=12, seed=40, n=3, temperature=0.9)
alone = [s.complete(prompt="ROMEO:", max_tokens=12, seed=40 + i, temperature=0.9)[2]["choices"][0]["text"]
         for i in range(3)]
check(status == 200 and [c["text"] for c in many["choices"]] == alone and
      many["usage"] == {"prompt_tokens": 6, "completion_tokens": 36, "total_tokens": 42},
      "n 3: the texts of seeds 40, 41, 42 alone, the prompt counted once")
# a stop string: the text before its first appearance, found by hand in the text without it
whole = s.complete(prompt="ROMEO:", max_tokens=20, seed=7)[2]["choices"][0]["text"]
stop = next((whole[i:i + 2] for i in range(len(whole) - 1) if whole[i:i + 2].strip()), whole[:2])
_, _, cut = s.complete(prompt="ROMEO:", max_tokens=20, seed=7, stop=[stop])
check(cut["choices"][0]["text"] == whole[:whole.find(stop)] and cut["choices"][0]["finish_reason"] == "stop",
      f"stop {stop!r}: the text before it, finish_reason stop")
status, text, _ = s.stream(prompt="ROMEO:", max_tokens=20, seed=7, stop=[stop])
check(status == 200 and text == whole[:whole.find(stop)], "streamed, the same text: nothing past the stop is sent")
# logprobs at temperature 0: the sampled character is the most likely one, its log-probability
# the first alternative's, and the alternatives' probabilities add up to at most 1
_, _, lp = s.complete(prompt="ROMEO:", max_tokens=8, temperature=0, logprobs=5)
l = lp["choices"][0]["logprobs"]
check(len(l["tokens"]) == 8 and all(max(t, key=t.get) == tok and abs(t[tok] - x) < 1e-12
                                    for tok, x, t in zip(l["tokens"], l["token_logprobs"], l["top_logprobs"])) and
      all(sum(2.718281828459045 ** v for v in t.values()) <= 1 + 1e-9 for t in l["top_logprobs"]),
      "logprobs 5 at temperature 0: each character is its own most likely alternative")
# chat: the template's prompt, and a reply that never holds the blank line that ends a turn
status, _, raw = s.request("POST", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "seed": 5})
chat = json.loads(raw)
check(status == 200 and chat["object"] == "chat.completion" and
      chat["usage"]["prompt_tokens"] == len("USER:\nHi\n\nASSISTANT:\n") and
      "\n\n" not in chat["choices"][0]["message"]["content"],
      "chat: the template's 21 characters in, an assistant's reply out")
status, _, raw = s.request("GET", "/v1/models")
listed = json.loads(raw)
check(status == 200 and [m["id"] for m in listed["data"]] == ["attention-from-scratch"], "GET /v1/models")
status, _, raw = s.request("GET", "/v1/models/gpt-4")
check(status == 404 and json.loads(raw)["error"]["code"] == "model_not_found", "GET /v1/models/gpt-4: 404 model_not_found")

# --- bad input: 400 naming the field, and the server goes on --------------------------------
bad = [
    (b"{", None, 400), (b"[1, 2]", None, 400), (b"\"ROMEO\"", None, 400), (b"", None, 400),
    ({"prompt": 5}, "prompt", 400), ({"prompt": "ROMEO\u20ac"}, "prompt", 400),
    ({"prompt": "a" * (block + 1)}, "prompt", 400),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens", 400), ({"prompt": "a", "max_tokens": -3}, "max_tokens", 400),
    ({"prompt": "a", "max_tokens": 1.5}, "max_tokens", 400), ({"prompt": "a", "max_tokens": "9"}, "max_tokens", 400),
    ({"prompt": "a", "max_tokens": 10 ** 12}, "max_tokens", 400),
    ({"prompt": "a" * (block - 2), "max_tokens": 4}, "max_tokens", 400),
    ({"prompt": "a", "temperature": -1}, "temperature", 400), ({"prompt": "a", "temperature": "hot"}, "temperature", 400),
    ({"prompt": "a", "top_k": vocab + 1}, "top_k", 400), ({"prompt": "a", "top_k": -2}, "top_k", 400),
    ({"prompt": "a", "seed": -1}, "seed", 400), ({"prompt": "a", "seed": "x"}, "seed", 400),
    ({"prompt": "a", "stream": "yes"}, "stream", 400), ({"prompt": "a", "n": 0}, "n", 400),
    ({"prompt": "a", "model": 3}, "model", 400),
    ({"prompt": "a" * 70000}, "body", 413),
]
for body, field, code in bad:
    status, _, raw = s.request("POST", "/v1/completions", body)
    try:
        err = json.loads(raw)["error"]
    except (ValueError, KeyError):
        err = {}
    shown = body if isinstance(body, bytes) else json.dumps(body)[:60]
    check(status == code and err.get("param") == field and err.get("message"),
          f"{shown}: {code} naming {field} ({status}: {err.get('message', raw[:80])})")
check(s.healthy() and s.complete(prompt="ROMEO:", max_tokens=3)[0] == 200, "after the bad requests the server still serves")
rc, out = s.stop()
check(rc == 0, f"SIGTERM on an idle server: exit 0 ({rc})")

# --- a full queue: 503 with Retry-After ------------------------------------------------------
s = Server("--max-running", "1", "--max-waiting", "1", "--step-ms", "40")
results = []


def slow(i):
    results.append(s.request("POST", "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 20, "seed": i}))


first = threading.Thread(target=slow, args=(0,))
first.start()
time.sleep(0.3)  # the first is in the batch, decoding at 40 ms a step
second = threading.Thread(target=slow, args=(1,))
second.start()
time.sleep(0.3)  # the second waits in the queue
status, headers, raw = s.request("POST", "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 20})
check(status == 503 and headers.get("Retry-After") == "1" and json.loads(raw)["error"]["message"],
      f"a third request while one runs and one waits: 503 with Retry-After ({status})")
first.join()
second.join()
check([r[0] for r in results] == [200, 200], "the running and the queued request are answered 200")
m = s.metrics()
check(m.get('serve_responses_total{code="503"}') == 1, "the metrics count the 503")
s.stop()

# --- 200 clients that go away mid-stream -----------------------------------------------------
s = Server("--max-running", "16", "--step-ms", "20")
left_statuses = []


def leave_early(i):
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "ROMEO:", "max_tokens": 26, "seed": i,
                                                            "stream": True}).encode())
    r = c.getresponse()
    left_statuses.append(r.status)
    r.fp.readline()  # the first event's line
    c.sock.close()  # gone, mid-stream
    c.close()


for start in range(0, 200, 20):
    batch = [threading.Thread(target=leave_early, args=(i,)) for i in range(start, start + 20)]
    for t in batch:
        t.start()
    for t in batch:
        t.join()
check(left_statuses == [200] * 200, f"200 streams started (200 OK) before their clients left ({sorted(set(left_statuses))})")
deadline = time.time() + 20
while time.time() < deadline:
    m = s.metrics()
    if m["serve_running_sequences"] == 0 and m["serve_waiting_requests"] == 0:
        break
    time.sleep(0.1)
check(m["serve_kv_blocks_free"] == m["serve_kv_blocks_capacity"] and m["serve_running_sequences"] == 0,
      f"after 200 disconnects the pool is whole ({m['serve_kv_blocks_free']:.0f} of {m['serve_kv_blocks_capacity']:.0f} free)")
check(m["serve_disconnects_total"] == 200, f"all 200 were ended early, not run to the end ({m['serve_disconnects_total']:.0f})")
check(m["serve_tokens_total"] < 200 * 26, f"and their tokens were not all computed ({m['serve_tokens_total']:.0f} of 5200)")
s.stop()

# --- fuzz: random bodies, bounded in count and time -------------------------------------------
s = Server("--max-running", "8")
rng = random.Random(20)
fields = ["prompt", "max_tokens", "temperature", "top_k", "seed", "stream", "model", "n", "", "prompt\u0000"]
values = [0, 1, -1, 2 ** 31, 2 ** 63, -2 ** 63, 1e308, -0.0, 0.5, "", "ROMEO:", "\u20ac", "a" * 40, None, True,
          False, [], {}, [1, "a"], {"a": 1}]
counts = {}
started = time.time()
for i in range(3000):
    kind = rng.random()
    if kind < 0.3:
        body = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
    elif kind < 0.9:
        obj = {rng.choice(fields): rng.choice(values) for _ in range(rng.randrange(0, 5))}
        obj.setdefault("max_tokens", rng.choice([1, 2, 3]))
        body = json.dumps(obj).encode()
    else:
        valid = json.dumps({"prompt": "ROMEO:", "max_tokens": 2}).encode()
        cut = rng.randrange(len(valid))
        body = valid[:cut] + bytes([rng.getrandbits(8)]) + valid[cut + 1:]
    status, _, raw = s.request("POST", "/v1/completions", body)
    counts[status] = counts.get(status, 0) + 1
    if status not in (200, 400, 404):  # 404: a model other than the one served
        check(False, f"fuzz body {body[:80]!r}: status {status}")
        break
    if status in (400, 404) and "error" not in json.loads(raw):
        check(False, f"fuzz body {body[:80]!r}: a 400 without a JSON error")
        break
    if time.time() - started > 120:
        break
print(f"fuzz: {sum(counts.values())} bodies in {time.time() - started:.1f} s: {counts}")
check(sum(counts.values()) >= 1000 and counts.get(200, 0) > 0 and counts.get(400, 0) > 0,
      "fuzz: at least 1000 bodies, some served and some refused")
check(s.healthy(), "after the fuzz run the server is alive")
s.stop()

# --- SIGTERM drains -------------------------------------------------------------------------
s = Server("--step-ms", "30")
got = {}


def long_stream():
    got["stream"] = s.stream(prompt="ROMEO:", max_tokens=25, seed=3)


t = threading.Thread(target=long_stream)
t.start()
time.sleep(0.3)  # a few tokens in
s.proc.send_signal(signal.SIGTERM)
time.sleep(0.2)
try:
    status = s.request("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}, timeout=10)[0]
except OSError:
    status = "refused"
check(status == 503, f"while draining a new request gets 503 ({status})")
t.join()
check(got["stream"][0] == 200 and got["stream"][2] and len(got["stream"][1]) == 25,
      "the stream running at SIGTERM finished, all 25 tokens and [DONE]")
try:
    out, _ = s.proc.communicate(timeout=30)
except subprocess.TimeoutExpired:
    s.proc.kill()
    out, _ = s.proc.communicate()
check(s.proc.returncode == 0 and "stopped" in out, f"then serve_gpt exits 0 ({s.proc.returncode})")

# --- a request sent while another streams joins the batch (continuous batching) ----------------
# Paced at 5 ms a step, the long stream takes block - 5 steps (over 100 ms); the short
# request, sent at its first token, must be answered in a step or two, long before it ends.
s = Server("--step-ms", "5")
order = []
long_tokens = block - len("ROMEO:") + 1  # the whole context


def long_one():
    status, text, closed = s.stream(prompt="ROMEO:", max_tokens=long_tokens, seed=5)
    order.append("long" if status == 200 and closed and len(text) == long_tokens else f"long failed ({status})")


long_thread = threading.Thread(target=long_one)
long_thread.start()
for _ in range(200):  # until the long one is decoding
    if s.metrics()["serve_tokens_total"] >= 1:
        break
    time.sleep(0.005)
status = s.complete(prompt="a", max_tokens=2)[0]
order.append("short")
long_thread.join()
check(status == 200 and order == ["short", "long"],
      f"a request sent while a {long_tokens}-token stream runs is answered before the stream ends ({order})")
s.stop()

# --- load_gpt: many streamed clients, counted against the server's own count -------------------
if LOAD:
    s = Server()
    url = f"http://127.0.0.1:{s.port}"
    p = subprocess.run([LOAD, url, "--clients", "1,4", "--requests", "8", "--max-tokens", "4:12",
                        "--prompt-chars", "4:10", "--seconds", "120"],
                       capture_output=True, text=True, timeout=300)
    rows = [line.split() for line in p.stdout.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+\s", line)]
    server_tokens = s.metrics()["serve_tokens_total"]
    check(p.returncode == 0 and [r[0] for r in rows] == ["1", "4"] and all(r[1] == "8" for r in rows),
          f"load_gpt: a row for 1 and for 4 clients, 8 requests each ({p.returncode}: {p.stderr.strip()[-200:]})")
    check(rows and rows[0][2] == rows[1][2] and int(rows[0][2]) + int(rows[1][2]) == server_tokens,
          f"load_gpt: both levels received the same tokens, and together what the server counts "
          f"generated ({[r[2] for r in rows]} against {server_tokens:.0f})")
    check(all(8 * 4 <= int(r[2]) <= 8 * 12 for r in rows), "load_gpt: 4 to 12 tokens a request")
    p = subprocess.run([LOAD, url, "--clients", "3", "--requests", "7", "--max-tokens", "2:4", "--rounds"],
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0 and re.search(r"^\s+3\s+7\s", p.stdout, re.M) is not None,
          f"load_gpt --rounds: 3 clients answer 7 requests in rounds ({p.returncode}: {p.stderr.strip()[-200:]})")
    bad_text = os.path.join(SCRATCH, "not_the_vocabulary.txt")
    with open(bad_text, "w") as f:
        f.write("\u00e9\u00e8" * 200)
    free_port = s.port  # taken now; a closed one below
    s.stop()
    for args, what in [(["http://example.com:80"], "a server on another machine"),
                       ([f"http://127.0.0.1:{free_port}"], "no server at the address"),
                       ([url, "--clients", "0"], "no clients"),
                       ([url, "--max-tokens", "9:3"], "a backwards range"),
                       ([url, "--bogus"], "an unknown flag")]:
        p = subprocess.run([LOAD, *args], capture_output=True, text=True, timeout=30)
        lines = p.stderr.strip().splitlines()
        check(p.returncode != 0 and len(lines) == 1 and lines[0].startswith("load_gpt: "),
              f"load_gpt, {what}: one line and a non-zero exit ({p.returncode}: {p.stderr.strip()[:100]})")
    s = Server()
    p = subprocess.run([LOAD, f"http://127.0.0.1:{s.port}", "--text", bad_text, "--requests", "2"],
                       capture_output=True, text=True, timeout=30)
    lines = p.stderr.strip().splitlines()
    check(p.returncode != 0 and lines and "vocabulary" in lines[-1] and lines[-1].startswith("load_gpt: "),
          f"load_gpt, a text outside the model's vocabulary: one line naming it ({p.stderr.strip()[-120:]})")
    s.stop()

# --- bad flags and checkpoints: one line, non-zero ---------------------------------------------
for args, what in [([os.path.join(SCRATCH, "nothing")], "a missing checkpoint"),
                   ([RUN, "--port", "70000"], "a port out of range"),
                   ([RUN, "--max-running", "8", "--step-tokens", "4"], "step tokens below max running"),
                   ([RUN, "--device", "tpu"], "a device that is neither cpu nor gpu"),
                   ([RUN, "--bogus"], "an unknown flag")]:
    p = subprocess.run([SERVE, *args], capture_output=True, text=True, timeout=30)
    lines = p.stderr.strip().splitlines()
    check(p.returncode != 0 and len(lines) == 1 and lines[0].startswith("serve_gpt: "),
          f"{what}: one line and a non-zero exit ({p.returncode}: {p.stderr.strip()[:100]})")

if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("all passed")
