#!/usr/bin/env python3
"""serve_gpt against clients that misbehave, over real sockets on 127.0.0.1 (ctest -L serving).

usage: test_serve_abuse.py SERVE_GPT TRAIN_GPT SCRATCH_DIR

Each part runs its own server with small limits (--max-connections 32, timeouts of 1-2 s)
and stops by itself: idle sockets past the connection limit are answered 503 and /health
still answers; connections that send their header a byte at a time are closed after the
header timeout, and SIGTERM stops the server while they trickle; a second server on a taken
port exits 1 with one line; oversized headers and bodies, numbers past double's range, and
unknown paths and methods get JSON errors (generated sizes, fields and exponents); a client
that leaves a streamed or a non-streamed request has it cancelled, its blocks freed, as
/metrics and /v1/blocks show; SIGTERM under streaming load truncates no stream; a second
signal stops at once; a Host that is not this server's and an Origin not allowed are refused,
and --allow-origin lets one origin in with CORS; completion ids differ across restarts;
/metrics passes promtool's lint (or, without promtool, the rules it checks). The only time
bounds are liveness bounds (answered within 30 s), which tell a hang from progress.
"""
import atexit
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

SERVE, TRAIN, SCRATCH = sys.argv[1:4]
RUN = os.path.join(SCRATCH, "run")
failures = []
servers = []
atexit.register(lambda: [p.kill() for p in servers if p.poll() is None])  # never left behind
rng = random.Random(53)
LIVE = 30  # seconds: a liveness bound, far above any answer's time; past it the server hangs


def check(ok, what):
    print(f"{'ok' if ok else 'FAIL'}: {what}")
    if not ok:
        failures.append(what)


class Server:
    """serve_gpt on a free port (or a given one); the port is read from its first line."""

    def __init__(self, *flags, port=0):
        self.proc = subprocess.Popen([SERVE, RUN, "--port", str(port), *flags], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        servers.append(self.proc)
        line = self.proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            raise SystemExit(f"serve_gpt did not start: {line!r} {self.proc.stderr.read()}")
        self.port = int(m.group(1))
        self.proc.stdout.readline()  # the cache's line

    def request(self, method, path, body=None, headers=None, timeout=LIVE):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        c.close()
        return out

    def metrics_text(self):
        return self.request("GET", "/metrics")[2].decode()

    def metrics(self):
        values = {}
        for line in self.metrics_text().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def health(self):
        """/health's status, or the error that stopped it, within the liveness bound."""
        try:
            return self.request("GET", "/health", timeout=LIVE)[0]
        except OSError as e:
            return type(e).__name__

    def wait_idle(self):
        deadline = time.time() + LIVE
        while time.time() < deadline:
            m = self.metrics()
            if m["serve_running_sequences"] == 0 and m["serve_waiting_requests"] == 0:
                return m
            time.sleep(0.05)
        return m

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        try:
            out, err = self.proc.communicate(timeout=LIVE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            return "hung", out, err
        return self.proc.returncode, out, err


def read_answer(sock, timeout=LIVE):
    """One HTTP answer read off a raw socket: (status, headers, body); status None if the
    server closed without one."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            part = sock.recv(65536)
            if not part:
                break
            data += part
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/"):
            return None, {}, b""
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            part = sock.recv(65536)
            if not part:
                break
            body += part
        return int(lines[0].split()[1]), headers, body
    except (OSError, ValueError):
        return None, {}, b""


def json_error(body):
    """The OpenAI error object of a body, or {} if it is not one."""
    try:
        err = json.loads(body)["error"]
        return err if {"message", "type", "param", "code"} <= set(err) and err["message"] else {}
    except (ValueError, KeyError, TypeError):
        return {}


def closed_by_server(sock, timeout):
    """Whether the server closes the socket within timeout seconds (recv sees the end)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except OSError:
        return False


def part(name):
    """Runs a part; an exception in it is a failure of that part, and the others still run."""
    def wrap(f):
        try:
            f()
        except Exception as e:  # noqa: BLE001 - reported as the part's failure
            check(False, f"{name}: {type(e).__name__}: {e}")
        return f
    return wrap


# --- the model -----------------------------------------------------------------------------
subprocess.run(["rm", "-rf", RUN], check=True)
subprocess.run([TRAIN, "--recipe", "tiny", "--max-iters", "10", "--eval-interval", "10", "--eval-iters", "2",
                "--out", RUN], check=True, stdout=subprocess.DEVNULL)
config = json.load(open(os.path.join(RUN, "checkpoint", "config.json")))
block = config["block_size"]
LIMITS = ["--max-connections", "32", "--header-timeout", "2", "--body-timeout", "2", "--idle-timeout", "1"]


@part("idle sockets past the connection limit")
def _():
    s = Server(*LIMITS)
    extra = rng.randrange(4, 12)
    socks = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(32)]
    time.sleep(0.2)  # the server has accepted them (counted as open)
    late = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(extra)]
    answers = [read_answer(k) for k in late]
    check(all(a[0] == 503 and a[1].get("retry-after") == "1" and json_error(a[2]) for a in answers),
          f"{extra} sockets past 32 open: each answered 503 with Retry-After and a JSON error "
          f"({[a[0] for a in answers]})")
    health = s.health()
    check(health in (200, 503), f"/health still answers while 32 idle sockets are open ({health})")
    check(all(closed_by_server(k, LIVE) for k in socks), "the idle sockets are closed after the header timeout")
    check(s.health() == 200, "then /health answers 200")
    m = s.metrics()
    check(m["serve_rejected_connections_total"] >= extra and m["serve_open_connections"] <= 2,
          f"the metrics count {m['serve_rejected_connections_total']:.0f} rejected connections, "
          f"{m['serve_open_connections']:.0f} open")
    for k in socks + late:
        k.close()
    rc, _, _ = s.stop()
    check(rc == 0, f"then SIGTERM: exit 0 ({rc})")


def slow_loris(port, stop, count):
    """count connections that send a request's header one byte every 0.3 s until `stop`."""
    header = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: " + b"a" * 4000
    closed = [False] * count

    def one(i):
        try:
            k = socket.create_connection(("127.0.0.1", port))
            for byte in header:
                if stop.is_set():
                    break
                k.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            closed[i] = True  # the server closed it
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]  # never outlive the test
    for t in threads:
        t.start()
    return threads, closed


def slow_loris_part(s, stop):
    count = rng.randrange(12, 24)
    threads, closed = slow_loris(s.port, stop, count)
    time.sleep(0.5)
    check(s.health() == 200, f"/health answers 200 while {count} connections trickle their headers")
    deadline = time.time() + LIVE
    while time.time() < deadline and not all(closed):
        time.sleep(0.2)
    check(all(closed), f"the trickling connections are closed after the header timeout ({sum(closed)} of {count})")
    m = s.metrics()
    check(m["serve_timeouts_total"] >= count, f"the metrics count the timeouts ({m['serve_timeouts_total']:.0f})")
    threads2, _ = slow_loris(s.port, stop, count)
    time.sleep(0.5)
    rc, out, _ = s.stop()
    stop.set()
    for t in threads + threads2:
        t.join()
    check(rc == 0 and "stopped" in out, f"SIGTERM while {count} connections trickle: exit 0 ({rc})")


@part("slow-loris headers")
def _():
    s = Server(*LIMITS)
    stop = threading.Event()
    try:
        slow_loris_part(s, stop)
    finally:
        stop.set()


@part("a slow body, an idle kept-alive connection, Expect: 100-continue")
def _():
    s = Server(*LIMITS)
    body = json.dumps({"prompt": "ROMEO:", "max_tokens": 2}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n").encode()
    k = socket.create_connection(("127.0.0.1", s.port))
    cut = rng.randrange(0, len(body))
    k.sendall(head + b"\r\n" + body[:cut])  # and the rest never comes
    check(closed_by_server(k, LIVE), f"a body stopped after {cut} of {len(body)} bytes: closed after the body timeout")
    k.close()
    k = socket.create_connection(("127.0.0.1", s.port))
    k.sendall(head + b"\r\n" + body)
    status, headers, _ = read_answer(k)
    check(status == 200 and headers.get("connection", "").lower() != "close", f"a kept-alive request: 200 ({status})")
    check(closed_by_server(k, LIVE), "then, with no next request, the connection is closed after the idle timeout")
    k.close()
    k = socket.create_connection(("127.0.0.1", s.port))
    k.sendall(head + b"Expect: 100-continue\r\n\r\n")
    k.settimeout(LIVE)
    interim = k.recv(4096)
    k.sendall(body)
    status, _, answer = read_answer(k)
    k.close()
    check(interim.startswith(b"HTTP/1.1 100") and status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 2,
          f"Expect: 100-continue gets 100, then the body is read and answered 200 ({interim[:20]!r}, {status})")
    m = s.metrics()
    check(m["serve_timeouts_total"] == 2, f"the metrics count the two timeouts ({m['serve_timeouts_total']:.0f})")
    s.stop()


@part("a taken port")
def _():
    s = Server()
    p = subprocess.run([SERVE, RUN, "--port", str(s.port)], capture_output=True, text=True, timeout=LIVE)
    lines = p.stderr.strip().splitlines()
    check(p.returncode == 1 and len(lines) == 1 and lines[0].startswith("serve_gpt: cannot listen on"),
          f"a second server on port {s.port}: exit 1 and one line ({p.returncode}: {p.stderr.strip()[:120]})")
    check(s.health() == 200, "the first server still serves")
    s.stop()


@part("oversized and out-of-range input")
def _():
    s = Server(*LIMITS)
    for _ in range(4):  # headers past the 16 KiB limit, as one header or many
        size = rng.randrange(16 * 1024 + 1, 200 * 1024)
        many = rng.random() < 0.5
        pad = "".join(f"X-{i}: {'b' * 90}\r\n" for i in range(size // 96)) if many else f"X-Pad: {'a' * size}\r\n"
        k = socket.create_connection(("127.0.0.1", s.port))
        try:
            k.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\n{pad}\r\n".encode())
        except OSError:
            pass
        status, _, body = read_answer(k)
        k.close()
        check(status in (400, 431) and json_error(body).get("param") == "header",
              f"a header of {size} bytes ({'many lines' if many else 'one line'}): 431 with a JSON error ({status})")
    for _ in range(3):  # bodies past 64 KiB
        size = rng.randrange(64 * 1024 + 1, 2 * 1024 * 1024)
        status, _, body = s.request("POST", "/v1/completions", b"x" * size)
        check(status == 413 and json_error(body).get("param") == "body",
              f"a body of {size} bytes: 413 with a JSON error naming body ({status})")
    for _ in range(12):  # numbers past double's range, in any field
        field = rng.choice(["max_tokens", "temperature", "top_k", "seed", "prompt"])
        number = f"{rng.choice(['', '-'])}{rng.randrange(1, 10)}e{rng.randrange(309, 5000)}"
        raw = f'{{"prompt": "ROMEO:", "{field}": {number}}}'.replace('"prompt": "ROMEO:", "prompt"', '"prompt"')
        status, _, body = s.request("POST", "/v1/completions", raw.encode())
        check(status == 400 and json_error(body), f"{raw}: 400 with a JSON error ({status}: {body[:80]!r})")
    status, _, body = s.request("POST", "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2, "seed": 2 ** 64 - 1})
    check(status == 200, f"seed 2^64 - 1 is a seed ({status}: {body[:80]!r})")
    for method, path in [("GET", "/v1/model"), ("POST", "/v1/chat"), ("GET", "/" + "z" * rng.randrange(1, 40))]:
        status, _, body = s.request(method, path)
        check(status == 404 and json_error(body), f"{method} {path[:20]}: 404 with a JSON error ({status})")
    for method, path in [("GET", "/v1/completions"), ("PUT", "/v1/completions"), ("POST", "/health"), ("DELETE", "/metrics")]:
        status, headers, body = s.request(method, path)
        check(status == 405 and json_error(body) and "allow" in headers,
              f"{method} {path}: 405 with Allow ({headers.get('allow')}) and a JSON error ({status})")
    check(s.health() == 200, "after them the server still serves")
    rc, _, err = s.stop()
    check(rc == 0 and err == "", f"and stops cleanly, nothing on stderr ({rc}: {err[:100]!r})")


def leave(port, stream, after):
    """A request for the whole context, abandoned `after` seconds in."""
    k = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": "ROMEO:", "max_tokens": block - 6, "stream": stream}).encode()
    k.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(after)
    k.close()


@part("clients that leave")
def _():
    s = Server("--step-ms", "40")
    for stream in (False, True):
        for _ in range(2):
            before = s.metrics()
            leave(s.port, stream, rng.uniform(0.15, 0.5))
            m = s.wait_idle()
            blocks = json.loads(s.request("GET", "/v1/blocks")[2])
            kind = "streamed" if stream else "non-streamed"
            check(m["serve_disconnects_total"] == before["serve_disconnects_total"] + 1,
                  f"a {kind} client that leaves is counted as a disconnect "
                  f"({before['serve_disconnects_total']:.0f} -> {m['serve_disconnects_total']:.0f})")
            made = m["serve_tokens_total"] - before["serve_tokens_total"]
            check(made < block - 6, f"its sequence ended early: {made:.0f} of {block - 6} tokens computed")
            check(m["serve_kv_blocks_free"] == m["serve_kv_blocks_capacity"] and
                  blocks["free"] == blocks["num_blocks"] and blocks["sequences"] == [],
                  f"its blocks are back in the pool ({blocks['free']} of {blocks['num_blocks']} free)")
    s.stop()


def stream_events(port, fields, result, i):
    """A streamed request; result[i] = (status, events) or the error that ended it."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=LIVE)
        c.request("POST", "/v1/completions", body=json.dumps(dict(fields, stream=True)).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read().decode()
        result[i] = (r.status, [e[len("data: "):] for e in body.split("\n\n") if e.startswith("data: ")])
    except (OSError, http.client.HTTPException) as e:
        result[i] = (type(e).__name__, [])


@part("SIGTERM under load")
def _():
    s = Server("--step-ms", "10", "--max-running", "8", "--max-waiting", "8")
    n = 24
    result = [None] * n
    wanted = [rng.randrange(8, block - 6) for _ in range(n)]
    threads = [threading.Thread(target=stream_events, args=(s.port, {"prompt": "ROMEO:", "max_tokens": wanted[i],
                                                                       "seed": i}, result, i)) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(0.1, 0.4))
    rc, out, _ = s.stop()
    for t in threads:
        t.join()
    whole = [r for r, w in zip(result, wanted) if r[0] == 200 and len(r[1]) == w + 1 and r[1][-1] == "[DONE]"]
    refused = [r for r in result if r[0] in (503, "ConnectionRefusedError")]
    truncated = [(r[0], len(r[1])) for r in result if r not in whole and r not in refused]
    check(rc == 0 and not truncated and whole,
          f"SIGTERM under {n} streams: exit 0 ({rc}), {len(whole)} whole, {len(refused)} refused, "
          f"{len(truncated)} truncated {truncated[:4]}")


@part("a second signal")
def _():
    s = Server("--step-ms", "50")
    result = [None]
    t = threading.Thread(target=stream_events, args=(s.port, {"prompt": "ROMEO:", "max_tokens": block - 6}, result, 0))
    t.start()
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    sig = rng.choice([signal.SIGINT, signal.SIGTERM])
    rc, _, err = s.stop(sig)
    t.join()
    lines = err.strip().splitlines()
    check(rc not in (0, "hung") and len(lines) == 1 and lines[0].startswith("serve_gpt: "),
          f"a second signal ({sig.name}) during a {block - 6}-token stream stops at once: exit {rc}, "
          f"{err.strip()[:100]!r}")


@part("Host and Origin")
def _():
    s = Server("--allow-origin", "http://good.example:8080")
    for host in ["evil.example", f"evil.example:{s.port}", f"127.0.0.1.nip.io:{s.port}", f"localhost:{s.port + 1}"]:
        status, headers, body = s.request("GET", "/health", headers={"Host": host})
        check(status == 400 and json_error(body).get("param") == "Host", f"Host: {host}: 400 naming Host ({status})")
    for host in [f"127.0.0.1:{s.port}", f"localhost:{s.port}", f"LOCALHOST:{s.port}"]:
        check(s.request("GET", "/health", headers={"Host": host})[0] == 200, f"Host: {host}: 200")
    status, headers, body = s.request("POST", "/v1/completions", b'{"prompt": "a", "max_tokens": 1}',
                                      headers={"Origin": "http://evil.example", "Content-Type": "text/plain"})
    check(status == 403 and json_error(body).get("param") == "Origin" and "access-control-allow-origin" not in headers,
          f"a text/plain POST from another origin: 403, no CORS header ({status})")
    status, headers, _ = s.request("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1},
                                   headers={"Origin": "http://good.example:8080"})
    check(status == 200 and headers.get("access-control-allow-origin") == "http://good.example:8080",
          f"the allowed origin gets 200 and its own CORS header ({status}, {headers.get('access-control-allow-origin')})")
    status, headers, _ = s.request("OPTIONS", "/v1/completions", headers={
        "Origin": "http://good.example:8080", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    check(status == 204 and "POST" in headers.get("access-control-allow-methods", "") and
          headers.get("access-control-allow-origin") == "http://good.example:8080",
          f"its preflight is answered 204 with the methods ({status})")
    status, headers, _ = s.request("GET", "/health")
    check("access-control-allow-origin" not in headers, "a request without Origin gets no CORS header")
    s.stop()


@part("completion ids across restarts")
def _():
    ids = []
    for _ in range(2):
        s = Server()
        for _ in range(2):
            ids.append(json.loads(s.request("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1})[2])["id"])
        s.stop()
    check(len(set(ids)) == 4 and all(re.fullmatch(r"cmpl-[0-9a-f]{24}", i) for i in ids),
          f"four completions on two servers have four ids of 96 random bits ({ids})")


def lint(text):
    """What promtool's `check metrics` lints, for a machine without it: each family has HELP
    and TYPE, counters (and only they) end in _total, a histogram's le buckets rise, their
    counts never fall and +Inf equals _count."""
    problems, types, helps, samples = [], {}, set(), []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helps.add(line.split()[2])
        elif line.startswith("# TYPE "):
            types[line.split()[2]] = line.split()[3]
        elif line:
            name, value = line.rsplit(" ", 1)
            samples.append((name, float(value)))
    for name, kind in types.items():
        if name not in helps:
            problems.append(f"{name}: no HELP")
        if (kind == "counter") != name.endswith("_total"):
            problems.append(f"{name}: a {kind} {'without' if kind == 'counter' else 'with'} _total")
    for name, kind in types.items():
        if kind != "histogram":
            continue
        buckets = [(n, v) for n, v in samples if n.startswith(name + "_bucket{")]
        bounds = [float(re.search(r'le="([^"]+)"', n).group(1)) for n, _ in buckets]
        counts = [v for _, v in buckets]
        total = dict(samples).get(name + "_count")
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds) or bounds[-1] != float("inf"):
            problems.append(f"{name}: le not increasing to +Inf")
        if counts != sorted(counts) or counts[-1] != total:
            problems.append(f"{name}: bucket counts not cumulative")
    for name, _ in samples:
        family = re.sub(r"(_bucket|_sum|_count)?(\{.*)?$", "", name)
        if family not in types and re.sub(r"\{.*$", "", name) not in types:
            problems.append(f"{name}: no TYPE")
    return problems


@part("/metrics lint")
def _():
    s = Server()
    for i in range(3):
        s.request("POST", "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 4, "seed": i})
    s.request("GET", "/nothing")
    text = s.metrics_text()
    s.stop()
    problems = lint(text)
    check(not problems, f"/metrics keeps the rules of Prometheus's lint ({problems[:3]})")
    check(re.search(r"_sum \d+\.\d{6,}", text) is not None, "a histogram's _sum is printed with full precision")
    check('le="60"' in text, "the histograms' buckets reach 60 s")
    for family in ["serve_queue_time_seconds", "serve_request_duration_seconds", "serve_open_connections",
                   "serve_rejected_connections_total"]:
        check(f"# TYPE {family} " in text, f"/metrics has {family}")
    promtool = shutil.which("promtool")
    if promtool:
        p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=LIVE)
        check(p.returncode == 0, f"promtool check metrics: exit {p.returncode} {p.stdout.strip()[:200]}{p.stderr.strip()[:200]}")
    else:
        print("promtool not installed: its rules were checked above")


@part("bad limits")
def _():
    for args, what in [(["--max-connections", "0"], "no connections"),
                       (["--max-connections", str(10 ** 6)], "more connections than file descriptors"),
                       (["--header-timeout", "0"], "a zero header timeout"),
                       (["--idle-timeout", "-1"], "a negative idle timeout"),
                       (["--allow-origin"], "--allow-origin without an origin"),
                       (["--allow-origin", ""], "an empty origin")]:
        p = subprocess.run([SERVE, RUN, "--port", "0", *args], capture_output=True, text=True, timeout=LIVE)
        lines = p.stderr.strip().splitlines()
        check(p.returncode != 0 and len(lines) == 1 and lines[0].startswith("serve_gpt: "),
              f"{what}: one line and a non-zero exit ({p.returncode}: {p.stderr.strip()[:100]})")


if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("all passed")
