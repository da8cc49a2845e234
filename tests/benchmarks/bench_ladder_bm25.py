"""Ladder retrieval benchmark: memlab's BM25 memory over the shared session store vs rank_bm25 rebuilt per (query, scale).

    .venv/bin/python tests/benchmarks/bench_ladder_bm25.py [--queries 100] [--pool 1000] [--turns 10] [--k 12]

Prints figures only (this is not a timed test). Seed 000's scale ladder: for each query q, nested histories
s0..s4 = the evidence sessions E(q) plus the first N_irr = 0/100/200/300/400 sessions of a per-query shuffle of a
shared pool (here: the sessions of the other synthetic users, ~1,000 sessions of ~10 turns), sorted by date.

1. s4 only, store warm (every pool session already analysed, as after the first queries of a real ladder run):
   per (query, s4), the naive baseline chunks the history, tokenizes every chunk with memlab's `terms`, builds
   `rank_bm25.BM25Okapi` and queries it (exactly what memlab's BM25 memory did before the shared store), vs
   `make_memory('bm25')`, `add_all`, `search(question, k)`. Ratio of the times; identical top-k count (session,
   chunk and score compared exactly, in order).
2. The whole ladder s0..s4 for every query, memlab starting from an empty store (so its time includes analysing
   every pool session once) vs the naive baseline.
3. Offline rollouts per second at s4: one unit per query as the runner does it (build the memory, `add_all`,
   `run_loop(make_policy('offline-reader', tier='medium'), mem, query.view())`), with memlab's memory and with the
   naive one; and `run_loop` alone on a built memory.
4. Dense and hybrid at s4 (`--minilm` adds all-MiniLM-L6-v2 when the dense extra is installed; default: only
   `hash-embed`, the lexical stand-in): time to embed the whole pool once, then ms per (query, s4) with the store
   warm.
"""
import argparse, random, sys, time
from pathlib import Path
import numpy as np
from rank_bm25 import BM25Okapi
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from memlab.synth import make_benchmark
from memlab.memory import make_memory, chunk_session, terms, Memory
from memlab.index import STORE
from memlab.agent import run_loop, make_policy
import memlab.reader   # registers 'offline-reader'
from memlab.core import Evidence

LADDER = (0, 100, 200, 300, 400)

def make_ladder(n_queries, pool_size, turns, seed):
    "Per query: its evidence sessions and a shuffled pool of other users' sessions (nested prefixes are the scales)."
    per = 8
    n_inst = -(-n_queries // per)
    n_filler = max(10, pool_size // max(n_inst - 1, 1) - per)
    insts = make_benchmark(n_inst, per, n_filler, seed=seed, session_turns=turns)
    rng, cases = random.Random(seed), []
    for i, inst in enumerate(insts):
        pool = [s for j, other in enumerate(insts) if j != i for s in other.sessions]
        by_id = {s.id: s for s in inst.sessions}
        for q in inst.queries:
            order = pool[:]; rng.shuffle(order)
            cases.append((q, [by_id[e] for e in q.evidence if e in by_id], order))
    return insts, cases[:n_queries]

def history(evidence, order, n_irr):
    return sorted(evidence + order[:n_irr], key=lambda s: s.date or '')

def naive_topk(sessions, question, k):
    "rank_bm25 built from scratch over the history's chunks (memlab's BM25 memory before the shared store)."
    units = [(s.id, i, c) for s in sessions for i, c in enumerate(chunk_session(s, 128))]
    if not units: return []
    bm = BM25Okapi([terms(c) or ['_empty_'] for _, _, c in units])
    sc = bm.get_scores(terms(question))
    return [(units[j][0], units[j][1], float(sc[j])) for j in np.argsort(-sc, kind='stable')[:k]]

def memlab_topk(sessions, question, k):
    m = make_memory('bm25', k=k); m.add_all(sessions)
    return [(e.session_id, e.meta['chunk'], e.score) for e in m.search(question, k)]

class NaiveBM25Memory(Memory):
    "The pre-store BM25 memory: rank_bm25 rebuilt on the first search after new sessions."
    family, single_pass = 'flat', True
    def __init__(self, k=12): super().__init__(k=k); self.units, self.toks, self._bm = [], [], None
    def add(self, s):
        for i, c in enumerate(chunk_session(s, 128)): self.units.append((s.id, s.date, c, i)); self.toks.append(terms(c) or ['_empty_'])
        self._bm = None
    def search(self, query, k=None):
        k = k or self.k
        if not self.units: return []
        if self._bm is None: self._bm = BM25Okapi(self.toks)
        sc = self._bm.get_scores(terms(query))
        return [Evidence(text=self.units[j][2], session_id=self.units[j][0], date=self.units[j][1], rank=r,
                         score=float(sc[j]), meta={'chunk': self.units[j][3]}) for r, j in enumerate(np.argsort(-sc, kind='stable')[:k])]

def run_side(fn, cases, hs, k):
    w, c = time.perf_counter(), time.process_time()
    out = [fn(h, q.question, k) for (q, _, _), h in zip(cases, hs)]
    return np.array([time.perf_counter() - w, time.process_time() - c]), out

def compare(cases, n_irr, k, bracket=True):
    """Naive and memlab top-k for every query at one scale: (naive, memlab) x (wall, process CPU) seconds, identical count.
    Histories are built beforehand. memlab runs before and after the naive pass and its two times are averaged, so a
    drift in machine load (these machines are shared) affects both sides alike."""
    hs = [history(ev, order, n_irr) for _, ev, order in cases]
    t1, got = run_side(memlab_topk, cases, hs, k) if bracket else (None, None)
    tn, ref = run_side(naive_topk, cases, hs, k)
    t2, got2 = run_side(memlab_topk, cases, hs, k)
    tm = t2 if t1 is None else (t1 + t2) / 2
    same = sum(r == g for r, g in zip(ref, got2)) if got is None else sum(r == g == g2 for r, g, g2 in zip(ref, got, got2))
    return np.stack([tn, tm]), same

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--queries', type=int, default=100); ap.add_argument('--pool', type=int, default=1000)
    ap.add_argument('--turns', type=int, default=10); ap.add_argument('--k', type=int, default=12)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--minilm', action='store_true', help='also time dense/hybrid with all-MiniLM-L6-v2')
    a = ap.parse_args()
    insts, cases = make_ladder(a.queries, a.pool, a.turns, a.seed)
    pool = {s.id for inst in insts for s in inst.sessions}
    h4 = [history(ev, order, LADDER[-1]) for _, ev, order in cases]
    print(f'{len(cases)} queries; pool {len(pool)} sessions of {a.turns} turns '
          f'(~{np.mean([s.n_tokens for inst in insts for s in inst.sessions]):.0f} tokens); '
          f's4: {np.mean([len(h) for h in h4]):.1f} sessions, '
          f'{np.mean([sum(len(chunk_session(s, 128)) for s in h) for h in h4]):.0f} chunks per query; k = {a.k}')
    for s in (s for inst in insts for s in inst.sessions):   # warm the stemmer cache for both sides
        for c in chunk_session(s, 128): terms(c)

    # 1. s4, warm store
    STORE.clear()
    for h in h4: STORE.analyse_many(h)
    (tn, tm), same = compare(cases, LADDER[-1], a.k)
    n = len(cases)
    print(f'\n1. s4, store warm: naive rank_bm25 {1000 * tn[0] / n:.2f} ms per query, memlab {1000 * tm[0] / n:.3f} ms: '
          f'{tn[0] / tm[0]:.1f}x faster (process CPU: {tn[1] / tm[1]:.1f}x); '
          f'identical top-{a.k} (session, chunk, score, order): {same}/{n}')

    # 2. whole ladder s0..s4, memlab from an empty store
    STORE.clear()
    T, same, n = np.zeros((2, 2)), 0, 0
    for n_irr in LADDER:      # memlab first at each scale (no bracketing), so its store really starts empty
        t, sm = compare(cases, n_irr, a.k, bracket=False); T += t; same += sm; n += len(cases)
    st = STORE.stats
    print(f'2. ladder s0..s4 ({n} (query, scale) pairs), memlab from an empty store: naive {T[0, 0]:.2f} s, memlab {T[1, 0]:.2f} s: '
          f'{T[0, 0] / T[1, 0]:.1f}x faster (process CPU: {T[0, 1] / T[1, 1]:.1f}x); identical top-{a.k}: {same}/{n}; '
          f'store: {st["analysed"]} sessions analysed, {st["fast_hits"] + st["hits"]} reused')

    # 3. offline rollouts per second at s4
    pol = make_policy('offline-reader', tier='medium')
    for name, mk in (('memlab bm25', lambda: make_memory('bm25', k=a.k)), ('naive rank_bm25', lambda: NaiveBM25Memory(k=a.k))):
        t, mems = time.perf_counter(), []
        for (q, _, _), h in zip(cases, h4):
            m = mk(); m.add_all(h); run_loop(pol, m, q.view()); mems.append(m)
        tu = time.perf_counter() - t
        t = time.perf_counter()
        for (q, _, _), m in zip(cases, mems): run_loop(pol, m, q.view())
        tl = time.perf_counter() - t
        print(f'3. offline rollouts at s4 with {name}: {len(cases) / tu:.1f}/s per unit (build + add_all + run_loop), '
              f'{len(cases) / tl:.1f}/s for run_loop on a built memory')

    # 4. dense and hybrid
    embedders = ['hash-embed'] + (['all-MiniLM-L6-v2'] if a.minilm else [])
    for emb in embedders:
        n0, t = STORE.stats['embedded'], time.perf_counter()
        for h in h4: m = make_memory('dense', embedder=emb); m.add_all(h); m.index()
        te, ne = time.perf_counter() - t, STORE.stats['embedded'] - n0
        print(f'4. {emb}: embedding the s4 histories\' {ne} distinct chunks once: {te:.1f} s ({ne / te:.0f} chunks/s)')
        for name in ('dense', 'hybrid'):
            t = time.perf_counter()
            for (q, _, _), h in zip(cases, h4): m = make_memory(name, k=a.k, embedder=emb); m.add_all(h); m.search(q.question)
            print(f'   {name}: {1000 * (time.perf_counter() - t) / len(cases):.2f} ms per (query, s4), store warm'
                  + (' (incl. encoding the query)' if name == 'dense' else ''))

if __name__ == '__main__':
    main()
