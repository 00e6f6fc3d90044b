#!/usr/bin/env python3
"""serve_gpt's connection handling, measured: a benchmark, not a test (it checks nothing).

usage: serve_goals.py --serve SERVE_GPT --checkpoint RUN_OR_CHECKPOINT [--idle 1000]
                      [--slow 100] [--clients 128] [--requests 2] [--step-ms 10]

Starts its own servers on free ports of 127.0.0.1 (each part needs a fresh one, and the
last is stopped with SIGTERM) and prints one table:

- /health's latency (a new connection each time) with no other connection open, and with
  --idle idle connections open (the server gets --max-connections above them);
- /health's latency while --slow connections send a header a byte at a time, and how long
  SIGTERM then takes to stop the server;
- --clients streaming clients at once, each sending --requests requests: how many were
  served and how many refused with 503, how fast the refusals came, and the time to the
  first token of the served ones.

Each row stands beside its goal (aim) and says whether this run met it; latencies are
printed side by side as ratios where there is a baseline; the machine's load moves them, so
compare rows of one run. `./workbook load --goals` runs it, and the course site's build runs
it for lesson 20's page (--out writes the table to a file as well).
"""
import argparse
import http.client
import json
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


class Server:
    def __init__(self, serve, checkpoint, *flags):
        self.proc = subprocess.Popen([serve, checkpoint, "--port", "0", *flags], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            self.proc.kill()
            sys.exit(f"serve_goals: serve_gpt did not start: {line.strip()} {self.proc.stderr.read().strip()[:200]}")
        self.port = int(m.group(1))
        self.proc.stdout.readline()

    def stop(self):
        start = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return float("inf")
        return time.perf_counter() - start


def health_times(port, n=200):
    """Seconds for each of n GET /health, each on a new connection; None for a failure."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            times.append(time.perf_counter() - start if ok else None)
        except OSError:
            times.append(None)
    return times


def ms(seconds):
    return f"{seconds * 1e3:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=100)
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--step-ms", type=int, default=10,
                        help="the streaming part's serve_gpt --step-ms: each step at least this long, "
                             "as a larger model's would be, so that the queue fills")
    parser.add_argument("--out", help="also write the table to this file")
    a = parser.parse_args()
    # this process holds --idle sockets at once: raise its soft limit on open files as far as
    # the hard one allows (as serve_gpt does for its own)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.idle + a.slow + a.clients + 64
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))
    rows = []  # (what, value, aim, met: True, False or None where there is no aim)

    # /health, alone and with idle connections open
    s = Server(a.serve, a.checkpoint, "--max-connections", str(a.idle + 64), "--header-timeout", "600")
    base = [t for t in health_times(s.port) if t is not None]
    idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(a.idle)]
    time.sleep(0.5)
    loaded = health_times(s.port)
    failed = sum(t is None for t in loaded)
    loaded = [t for t in loaded if t is not None]
    rows.append(("/health p50/p99 ms, alone", f"{ms(percentile(base, 0.5))} / {ms(percentile(base, 0.99))}",
                 "", None))
    rows.append((f"/health p50/p99 ms, {a.idle} idle",
                 f"{ms(percentile(loaded, 0.5))} / {ms(percentile(loaded, 0.99))}, {failed} failed",
                 "p99 <= 50", percentile(loaded, 0.99) <= 0.050 and failed == 0))
    for k in idle:
        k.close()
    s.stop()

    # /health with slow-loris connections, then SIGTERM
    s = Server(a.serve, a.checkpoint)
    stop = threading.Event()

    def trickle():
        try:
            k = socket.create_connection(("127.0.0.1", s.port))
            for byte in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 100000:
                if stop.is_set():
                    return
                k.sendall(bytes([byte]))
                time.sleep(1.0)
        except OSError:
            pass
    slow = [threading.Thread(target=trickle, daemon=True) for _ in range(a.slow)]
    for t in slow:
        t.start()
    time.sleep(1.0)
    times = health_times(s.port, 100)
    failed = sum(t is None for t in times)
    times = [t for t in times if t is not None]
    rows.append((f"/health p50/p99 ms, {a.slow} slow-loris",
                 f"{ms(percentile(times, 0.5))} / {ms(percentile(times, 0.99))}, {failed} failed",
                 "0 failed", failed == 0))
    # nothing is in flight, so the drain has nothing to wait for: the server should be gone
    # at once, not when the trickling headers time out
    exit_seconds = s.stop()
    rows.append((f"SIGTERM to exit, {a.slow} slow-loris", f"{exit_seconds:.2f} s",
                 "<= 1 s", exit_seconds <= 1.0))
    stop.set()

    # many streaming clients at once
    running, waiting = 16, 64
    s = Server(a.serve, a.checkpoint, "--step-ms", str(a.step_ms), "--max-running", str(running),
               "--max-waiting", str(waiting))
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    c.request("GET", "/health")
    context = json.loads(c.getresponse().read())["context"]
    c.close()
    served, refused, failures, gaps = [], [], [], []
    longest = 8 + (context - 15)  # the largest max_tokens a client asks for
    lock = threading.Lock()

    def client(i):
        for r in range(a.requests):
            start = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
                body = {"prompt": "ROMEO:", "max_tokens": 8 + (i * 7 + r) % (context - 14), "stream": True, "seed": i}
                conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
                res = conn.getresponse()
                if res.status == 503:
                    res.read()
                    with lock:
                        refused.append(time.perf_counter() - start)
                    continue
                first, last, between = None, None, []
                while True:
                    line = res.fp.readline()
                    if not line:
                        break
                    if line.startswith(b"data: [DONE]"):
                        break
                    if line.startswith(b"data: "):
                        now = time.perf_counter()
                        if first is None:
                            first = now - start
                        else:
                            between.append(now - last)
                        last = now
                conn.close()
                with lock:
                    served.append(first)
                    gaps.extend(between)
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    failures.append(type(e).__name__)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    firsts = [t for t in served if t is not None]
    rows.append((f"{a.clients} x {a.requests} streams: served/503/failed",
                 f"{len(served)} / {len(refused)} / {len(failures)}", "0 failed", not failures))
    rows.append(("  the 503s, p50/p99 ms", f"{ms(percentile(refused, 0.5))} / {ms(percentile(refused, 0.99))}"
                 if refused else "none refused", "p99 <= 100", percentile(refused, 0.99) <= 0.100 if refused else True))
    # The queue's bound: a request accepted into the queue waits for at most ceil(waiting /
    # running) requests ahead of it in its place, each at most `longest` tokens (and its
    # prompt's step), then gets its first token in the step after; a step is taken at its
    # measured 99th percentile.
    step = percentile(gaps, 0.99) if gaps else float("nan")
    bound = (-(-waiting // running) * (longest + 1) + 1) * step
    rows.append(("  first tokens, p50/p99 ms",
                 f"{ms(percentile(firsts, 0.5))} / {ms(percentile(firsts, 0.99))}",
                 f"p99 <= {bound * 1e3:.0f} *", bool(firsts) and percentile(firsts, 0.99) <= bound))
    s.stop()

    width = max(len(w) for w, _, _, _ in rows)
    aim_width = max(len("aim"), max(len(aim) for _, _, aim, _ in rows))
    value_width = max(len(value) for _, value, _, _ in rows)
    lines = [f"{'what':<{width}}  {'measured':<{value_width}}  {'aim':<{aim_width}}  met"]
    for what, value, aim, met in rows:
        verdict = "" if met is None else "yes" if met else "NO"
        lines.append(f"{what:<{width}}  {value:<{value_width}}  {aim:<{aim_width}}  {verdict}".rstrip())
    goals = [met for _, _, _, met in rows if met is not None]
    lines.append("")
    lines.append(f"{sum(goals)} of {len(goals)} goals met; the streams' engine paced at --step-ms {a.step_ms}.")
    lines.append(f"* the queue's bound: ceil({waiting} waiting / {running} running) requests of")
    lines.append(f"  at most {longest + 1} steps ahead of a queued one, a step taken at the")
    lines.append(f"  99th percentile between two streamed tokens ({ms(step)} ms)")
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
