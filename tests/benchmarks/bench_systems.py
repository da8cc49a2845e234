"""Construction throughput of the real memory systems (mem0, Graphiti, LangMem) against the loopback server answering
each package's own prompts after a fixed latency: seconds per session, LLM calls and input tokens per session, and the
ratio to an instant server. Run with the systems' virtualenv (`make test-systems` builds it):
    .venv-systems/bin/python tests/benchmarks/bench_systems.py [latency_seconds=0.1] [repeats=3]
A system whose package is not installed is skipped with the reason."""
import importlib.util, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loopback import LoopbackServer

latency = float(sys.argv[1]) if len(sys.argv) > 1 else 0.1
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def mem0_case():
    import test_system_mem0 as t, test_readback as rb
    return t.mem0_responder, lambda srv: t.build(srv, Path(tempfile.mkdtemp()) / 'c.db'), rb.SESSIONS

def graphiti_case():
    import test_system_graphiti as t
    return t.graphiti_responder, lambda srv: t.GraphitiMemory(llm=t._llm(srv)), t.SESSIONS

def langmem_case():
    import test_system_langmem as t
    return t.responder, lambda srv: t.memory(srv), t.tr.SESSIONS

CASES = {'mem0': ('mem0', mem0_case), 'graphiti': ('graphiti_core', graphiti_case), 'langmem': ('langmem', langmem_case)}

print(f'loopback latency {latency} s per reply, {repeats} repeats (median), sessions added one by one')
for name, (module, case) in CASES.items():
    if importlib.util.find_spec(module) is None: print(f'{name:>9}: skipped ({module} is not installed)'); continue
    responder, make, sessions = case()
    rows = {}
    for lat in (0.0, latency):
        runs = []
        for _ in range(repeats):
            with LoopbackServer('openai', responder=responder, latency=lat) as srv:
                m = make(srv); t0 = time.perf_counter(); m.add_all(sessions); runs.append((time.perf_counter() - t0, m.usage))
        dt, u = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        rows[lat] = dt / len(sessions)
        print(f'{name:>9} @ {lat:.2f} s: {rows[lat]:.3f} s/session, {u.calls / len(sessions):.2f} LLM calls/session, '
              f'{u.input_tokens / len(sessions):.0f} input tokens/session ({len(sessions)} sessions)')
    print(f'{name:>9}: {rows[latency] / rows[0.0]:.1f}x slower at {latency} s per reply than instant')

# Concurrency. Within one memory, sessions are added in order (a later session updates what an earlier one stored), so
# parallel adds means independent memories built at once: the runner's units in a thread pool (`run(executor=...)`) or
# the async path's builds. Four memories of the same sessions, one after another vs four threads; Graphiti also makes
# its own calls in parallel within an add (asyncio), bounded by the memlab backend's `concurrency`: 1 vs 8.
import concurrent.futures as cf

def _mem0_fresh(srv):
    import test_system_mem0 as t
    return t.build(srv, Path(tempfile.mkdtemp()) / 'c.db')   # its own cache: no memory reads another's replies

def _graphiti_with(concurrency):
    def make(srv):
        import test_system_graphiti as t
        return t.GraphitiMemory(llm=t._llm(srv, concurrency=concurrency))
    return make

n_mem = 4
print(f'\nparallel builds: {n_mem} memories at {latency} s per reply, sequential vs {n_mem} threads (median of {repeats})')
for name, (module, case) in CASES.items():
    if importlib.util.find_spec(module) is None: continue
    responder, make, sessions = case()
    if name == 'mem0': make = _mem0_fresh
    res = {}
    for workers in (1, n_mem):
        runs = []
        for _ in range(repeats):
            with LoopbackServer('openai', responder=responder, latency=latency) as srv:
                mems = [make(srv) for _ in range(n_mem)]
                t0 = time.perf_counter()
                with cf.ThreadPoolExecutor(workers) as ex: list(ex.map(lambda m: m.add_all(sessions), mems))
                runs.append(time.perf_counter() - t0)
        res[workers] = n_mem * len(sessions) / sorted(runs)[len(runs) // 2]
    print(f'{name:>9}: {res[1]:.2f} sessions/s sequential, {res[n_mem]:.2f} with {n_mem} threads ({res[n_mem] / res[1]:.1f}x)')

if importlib.util.find_spec('graphiti_core') is not None:
    import test_system_graphiti as tg
    res = {}
    for c in (1, 8):
        runs = []
        for _ in range(repeats):
            with LoopbackServer('openai', responder=tg.graphiti_responder, latency=latency) as srv:
                m = _graphiti_with(c)(srv); t0 = time.perf_counter(); m.add_all(tg.SESSIONS); runs.append(time.perf_counter() - t0)
        res[c] = sorted(runs)[len(runs) // 2] / len(tg.SESSIONS)
    print(f' graphiti: {res[1]:.3f} s/session with backend concurrency 1, {res[8]:.3f} with 8 ({res[1] / res[8]:.1f}x)')
