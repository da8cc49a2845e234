"""Memory per MemTrace window (issue 13, item 2): prints figures (this is not a timed test).

    .venv/bin/python tests/benchmarks/bench_memtrace_windows.py [--sessions 70] [--turns 120] [--memories bm25,items,...]

One HaluMem-like user (`synth_halumem`, about HaluMem-Medium's 70 sessions), its eight windows (`window_instances`).
Per memory, each from cold caches (the process-wide session analyses, graph extractions and items are cleared):
1. full: the whole history built once;
2. windows: the eight windows through `PrefixMemories` (ingested once, topped up and snapshotted per window), as the
   runner builds them; ratio to full (target <= 1.3x);
3. naive cold: eight memories built from scratch, caches cleared before each;
4. naive warm: eight fresh memories sharing the process's analysis caches (what memlab did before snapshots).
"""
import argparse, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def clear():
    import memlab.index as ix, memlab.graph as g, memlab.planar as p
    ix.STORE.clear(); g.GRAPH_CACHE.clear(); p.ITEM_CACHE.clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--sessions', type=int, default=70); ap.add_argument('--turns', type=int, default=120)
    ap.add_argument('--memories', default='bm25,hybrid,items,long-context,ppr-graph,entity-graph')
    a = ap.parse_args()
    from memlab.memory import make_memory
    from memlab.runner import PrefixMemories
    from memlab.protocols.memtrace.data import synth_halumem, write_halumem, load_halumem, window_instances
    import memlab.planar, memlab.graph  # noqa: F401  (register the planar and hierarchical memories)
    u = load_halumem(write_halumem(synth_halumem(1, n_sessions=a.sessions, turns=a.turns, seed=11), Path(tempfile.mkdtemp()) / 'u.jsonl'))[0]
    insts, _ = window_instances(u)
    ends = [len(i.sessions) for i in insts]
    print(f'one user: {len(u.sessions)} sessions, {sum(s.n_tokens for s in u.sessions):,} tokens; windows end after sessions {ends}')
    for name in a.memories.split(','):
        spec = {'name': name, **({'embedder': 'hash-embed'} if name in ('dense', 'hybrid') else {})}
        def timed(fn):
            clear(); t = time.perf_counter(); fn(); return time.perf_counter() - t
        def full(): m = make_memory(**spec); m.add_all(u.sessions); m.prepare()
        def windows():
            pm = PrefixMemories()
            for i in insts: pm.build(spec, i.sessions)
        def naive(cold):
            def go():
                for i in insts:
                    if cold: clear()
                    m = make_memory(**spec); m.add_all(i.sessions); m.prepare()
            return go
        tf, tw, tc, tn = (min(timed(f) for _ in range(3)) for f in (full, windows, naive(True), naive(False)))
        print(f'{name:>13}: full {tf:6.3f} s | 8 windows with snapshots {tw:6.3f} s = {tw / tf:4.2f}x (target <= 1.3x) | '
              f'8 rebuilds from scratch {tc:6.3f} s = {tc / tf:4.2f}x | 8 rebuilds, shared caches {tn:6.3f} s = {tn / tf:4.2f}x')


if __name__ == '__main__': main()
