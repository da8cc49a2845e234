"""Agent loops at the concurrency limit (issue 12, item 4): prints figures (this is not a timed test).

    .venv/bin/python tests/benchmarks/bench_agent_loops.py [--rollouts 2000] [--concurrency 64] [--latency 0.1] [--threads]
        [--no-cache] [--transport direct|aiohttp|httpx]

A grid of LLM-policy rollouts through `memlab.runner.run(...)` in one client process, against a loopback OpenAI
server (in its own process) that answers every request after `latency` seconds. The fake model calls
`search_memory` twice, then answers: 3 dependent model calls per rollout. The memory is BM25 exposed as an iterative
interface (the model decides when to search), k = 5, one history per 10 questions (`make_benchmark`).
Ideal wall time = rollouts x 3 x latency / concurrency.

1. Serial run (no executor): each rollout's loop is a coroutine on the backend's event loop, `concurrency` rollouts
   in flight (`run_units_async`). Printed: wall, ratio to the ideal (target <= 1.25x), client CPU, HTTP requests.
2. Resume of the finished store: rollouts run and HTTP requests (both 0).
3. The same grid into a new store: every call from the response cache (HTTP requests 0), all answers identical.
4. With `--threads`: the earlier way, units in a ThreadPoolExecutor of `concurrency` threads (sync client calls).
"""
import argparse, multiprocessing as mp, resource, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def three_calls(kind, req):
    "Fake model: search twice (queries derived from the question), then answer."
    from loopback import Reply, question_of, _tool_results
    q, n = question_of(kind, req), len(_tool_results(kind, req))
    if req.get('tools') and n < 2: return Reply(tool_calls=[('search_memory', {'query': q if n == 0 else q + ' details'})])
    return Reply(content=f'Answer: answer after {n} searches')


def serve(conn, latency):
    from loopback import LoopbackServer
    with LoopbackServer('openai', responder=three_calls, latency=latency) as srv:
        conn.send(srv.url)
        while (m := conn.recv()) in ('count', 'bodies'):
            conn.send((srv.n_requests, cpu()) if m == 'count' else [r for r in srv.requests if r])


def cpu(): r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(); ap.add_argument('--rollouts', type=int, default=2000)
    ap.add_argument('--concurrency', type=int, default=64); ap.add_argument('--latency', type=float, default=0.1)
    ap.add_argument('--threads', action='store_true', help='also time the thread-pool executor')
    ap.add_argument('--no-cache', action='store_true', help='also time the serial run without the response cache')
    ap.add_argument('--transport', default=None, help="the OpenAI backend's transport (default: its default, 'direct')")
    a = ap.parse_args()
    from memlab.flat import BM25Memory
    from memlab.memory import MEMORIES
    from memlab.runner import RunConfig, run, results_frame
    from memlab.synth import make_benchmark

    @MEMORIES.register('bm25-iterative-bench')
    class IterativeBM25(BM25Memory):
        "BM25 as an iterative interface: the model decides when to search."
        family, single_pass = 'planar', False

    bench = make_benchmark(a.rollouts // 10, 10, 5, seed=0)
    n = sum(len(i.queries) for i in bench)
    parent, child = mp.Pipe(); srv = mp.get_context('spawn').Process(target=serve, args=(child, a.latency), daemon=True); srv.start()
    url = parent.recv(); ideal = n * 3 * a.latency / a.concurrency
    def count(): parent.send('count'); return parent.recv()[0]
    def server_cpu(): parent.send('count'); return parent.recv()[1]
    try:
        with tempfile.TemporaryDirectory() as d:
            def cfg(name, cache):
                b = {'name': 'openai', 'model': 'bench', 'base_url': url, 'concurrency': a.concurrency, 'timeout': 30, 'cache': cache}
                if a.transport: b['transport'] = a.transport
                return RunConfig(name=name, policies=[{'name': 'llm', 'backend': b}], memories=[{'name': 'bm25-iterative-bench', 'k': 5}])
            def timed(name, cache, store, **kw):
                n0, c0, s0, t = count(), cpu(), server_cpu(), time.perf_counter()
                st = run(cfg(name, cache), bench, Path(d) / store, progress=False, **kw)
                timed.server_cpu = server_cpu() - s0
                return time.perf_counter() - t, cpu() - c0, count() - n0, st
            cache = str(Path(d) / 'responses.sqlite')
            w, c, nreq, st = timed('loops', cache, 'a')
            df = results_frame(st)
            assert len(df) == n and df['error'].isna().all() and (df['n_calls'] == 2).all(), 'rollouts did not complete as scripted'
            lat = df['usage'].map(lambda u: __import__('json').loads(u)['latency_s'] / 3).median()
            print(f"transport {a.transport or 'direct (default)'}")
            print(f'serial run (coroutines on the loop): {n} rollouts x 3 model calls, concurrency {a.concurrency}, latency '
                  f'{a.latency * 1000:.0f} ms: {w:.2f} s vs ideal {ideal:.2f} s = {w / ideal:.2f}x (target <= 1.25x); client CPU {c:.2f} s; '
                  f'HTTP requests {nreq}; server CPU {timed.server_cpu:.2f} s; median latency per call as recorded {lat * 1000:.0f} ms')
            parent.send('bodies'); bodies = parent.recv()[-n * 3:]
            from memlab.llm import OpenAIBackend
            b = OpenAIBackend('bench', base_url=url, concurrency=a.concurrency, timeout=30, cache=False, transport=a.transport)
            b.chat_many([dict(messages=[{'role': 'user', 'content': 'warm up'}])])
            calls = [dict(messages=r['messages'], tools=r.get('tools'), tool_choice=r.get('tool_choice'),
                          max_tokens=r.get('max_tokens'), temperature=r.get('temperature')) for r in bodies]
            c0, t = cpu(), time.perf_counter(); out = b.chat_many(calls); wb, cb = time.perf_counter() - t, cpu() - c0
            assert all(isinstance(o, tuple) for o in out)
            print(f'the same {len(calls)} requests as independent chat_many calls (no loop, no memory, no store, no cache): '
                  f'{wb:.2f} s = {wb / ideal:.2f}x of the ideal; client CPU {cb:.2f} s ({cb / len(calls) * 1000:.2f} ms per call; '
                  f'the run: {c / (3 * n) * 1000:.2f} ms per call)')
            w2, _, nreq2, st2 = timed('loops', cache, 'a')
            print(f'resume of the finished store: {w2:.2f} s, HTTP requests {nreq2}, rollouts {len(st2.rollouts())} (unchanged)')
            w3, _, nreq3, st3 = timed('loops', cache, 'b')
            same = results_frame(st3).set_index('rollout_id')['answer'].sort_index().equals(df.set_index('rollout_id')['answer'].sort_index())
            print(f'same grid into a new store: {w3:.2f} s, HTTP requests {nreq3} (response cache), answers identical: {same}')
            if a.no_cache:
                w5, c5, nreq5, _ = timed('nocache', False, 'd')
                print(f'serial run without the response cache: {w5:.2f} s = {w5 / ideal:.2f}x; client CPU {c5:.2f} s; HTTP requests {nreq5}')
            if a.threads:
                with ThreadPoolExecutor(a.concurrency) as ex:
                    w4, c4, nreq4, _ = timed('threads', str(Path(d) / 'responses-threads.sqlite'), 'c', executor=ex)
                print(f'units in {a.concurrency} threads (the earlier way): {w4:.2f} s = {w4 / ideal:.2f}x of the ideal; '
                      f'client CPU {c4:.2f} s; HTTP requests {nreq4}; coroutines / threads wall = {w / w4:.2f}')
    finally:
        parent.send('stop'); srv.join(10)


if __name__ == '__main__': main()
