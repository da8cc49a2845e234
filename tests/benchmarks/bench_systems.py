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
