"""Foundation II benchmarks: prints figures (this is not a timed test).

    .venv/bin/python tests/benchmarks/bench_foundation2.py [--calls 2000] [--concurrency 64] [--latency 0.1]

1. Throughput: N calls through memlab's OpenAIBackend (real openai SDK over HTTP, response cache on), first as one
   `chat_many` batch (coroutines on the background loop, C at a time), then through `chat` from C threads, against a loopback server (in its own process) answering after `latency` seconds, compared with the
   ideal calls x latency / C. Both transports in one client process (the default, aiohttp on the background event
   loop, and the SDK's sync httpx client), then the default split over 2 client processes (C/2 threads each).
   The client's CPU time is printed: on 2 cores shared with the server, CPU is what limits the sync transport.
2. Cache: the same N calls again with the response cache; HTTP requests are counted at the server.
3. Statistics: 1,000 task-level bootstrap resamples of 10,000 rollouts in 2,000 tasks, for 30 cells.
"""
import argparse, multiprocessing as mp, resource, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import numpy as np, pandas as pd
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def serve(conn, latency):
    from loopback import LoopbackServer
    with LoopbackServer('openai', latency=latency) as srv:
        conn.send(srv.url)
        while conn.recv() == 'count': conn.send(srv.n_requests)

def calls(backend, n, conc, tag='run', many=False):
    msgs = [[{'role': 'user', 'content': f'benchmark request {tag} {i}'}] for i in range(n)]
    t = time.perf_counter()
    if many: out = backend.chat_many([dict(messages=m) for m in msgs])
    else:
        with ThreadPoolExecutor(conc) as ex: out = list(ex.map(backend.chat, msgs))
    assert all(isinstance(r, tuple) for r in out), 'a call failed'
    return time.perf_counter() - t

def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime

def _client(url, n, conc, tag, cache, transport, many, ready, go, out):
    from memlab.llm import OpenAIBackend
    b = OpenAIBackend('bench-model', base_url=url, concurrency=conc, cache=cache, timeout=30, transport=transport)
    calls(b, 32, conc, tag=f'warm-{tag}', many=many); ready.put(1); go.wait()
    c = cpu(); w = calls(b, n, conc, tag=tag, many=many); out.put((w, cpu() - c))

def clients(url, n, conc, procs, cache, tag, count, transport='aiohttp', many=False):
    "Wall time, client CPU and HTTP requests of n calls at total concurrency conc split over `procs` processes."
    ctx = mp.get_context('spawn'); ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    ps = [ctx.Process(target=_client, args=(url, n // procs, conc // procs, f'{tag}{i}', cache, transport, many, ready, go, out)) for i in range(procs)]
    for p in ps: p.start()
    for _ in ps: ready.get()
    n0 = count(); t = time.perf_counter(); go.set()
    res = [out.get() for _ in ps]; wall = time.perf_counter() - t
    for p in ps: p.join()
    return wall, sum(c for _, c in res), count() - n0

def main():
    ap = argparse.ArgumentParser(); ap.add_argument('--calls', type=int, default=2000)
    ap.add_argument('--concurrency', type=int, default=64); ap.add_argument('--latency', type=float, default=0.1)
    a = ap.parse_args()
    from memlab.stats import bootstrap_table
    parent, child = mp.Pipe(); srv = mp.get_context('spawn').Process(target=serve, args=(child, a.latency), daemon=True); srv.start()
    url = parent.recv(); ideal = a.calls * a.latency / a.concurrency
    def count(): parent.send('count'); return parent.recv()
    try:
        with tempfile.TemporaryDirectory() as d:
            cache = str(Path(d) / 'responses.sqlite')
            for procs, transport, many in ((1, 'aiohttp', True), (1, 'aiohttp', False), (1, 'httpx', False), (2, 'aiohttp', False)):
                w, c, nreq = clients(url, a.calls, a.concurrency, procs, cache, f'p{procs}-{transport}-{many}-', count, transport, many)
                how = 'chat_many (coroutines on the loop)' if many else f'chat from {a.concurrency // procs} threads'
                print(f'throughput, {how}, transport {transport}, {procs} client process(es): {a.calls} calls, total concurrency {a.concurrency}, latency '
                      f'{a.latency * 1000:.0f} ms: {w:.2f} s vs ideal {ideal:.2f} s = {w / ideal:.2f}x (target <= 1.25x); '
                      f'client CPU {c:.2f} s; HTTP requests {nreq}')
            w, _, nreq = clients(url, a.calls, a.concurrency, 1, cache, 'p1-aiohttp-True-', count, many=True)
            print(f'cache: the same {a.calls} calls again: {w:.2f} s, HTTP requests at the server: {nreq}')
    finally:
        parent.send('stop'); srv.join(10)
    rng = np.random.default_rng(0)
    df = pd.DataFrame({'cell': np.repeat(np.arange(30), 10_000), 'task': np.tile(np.repeat(np.arange(2000), 5), 30),
                       'v': rng.integers(0, 2, 300_000)})
    t = time.perf_counter(); tab = bootstrap_table(df, 'v', by='cell', group='task', n_resamples=1000); ts = time.perf_counter() - t
    print(f'statistics: 1,000 resamples x 30 cells of 10,000 rollouts in 2,000 tasks: {ts:.2f} s (target < 2 s); {len(tab)} rows')

if __name__ == '__main__': main()
