"""MemoryAgentBench latency benchmark (seed 001 §4.4.3, Table 4; Tables 12-13): prints figures (this is not a timed test).

    .venv/bin/python tests/benchmarks/bench_mab.py [--quick] [--minilm] [--families ruler_qa2 'longmemeval_s*']
        [--contexts 5] [--context-tokens 131072] [--queries 10] [--repeats 3] [--qe-budget 10]
        [--lengths 8192 16384 32768 65536 131072] [--scale-rounds 7] [--scale-budget 3] [--scale-family ruler_qa2]
        [--scale-chunk 512] [--gc] [--no-save] [--plot-only]

Seed 001 §4.4.3: "we randomly choose 5 examples from RULER-QA2 and LME (S*), and report the latency of various memory
agents" as Memory Construction (M.C.) and Query Execution (Q.E.) at chunk sizes 512 and 4096 (Table 4). Here the
contexts are memlab's seeded synthetic ones (`memlab.protocols.mab.synth.make_mab`), chunked by the loader's official chunker
(`memlab.protocols.mab.data.rows_to_instances`), and the agents are `memlab.protocols.mab.agents.mab_agents(k=10)`: offline memories, no LLM
anywhere, on a 2-core CPU shared with other processes (the load average is printed). The paper's numbers include
embedding models on GPUs and LLM calls; these do not, so only the shape (ratios, scaling) compares.

1. M.C. and Q.E. per agent and chunk size. M.C. = `make_memory(**spec)`, `add_all(chunks)` and the first search (every
   memory builds its index lazily on the first search after new sessions; that first search, with a fixed probe string,
   is counted as construction so that Q.E. is the steady-state cost). Every build is cold: the shared analysis store
   (`memlab.index.STORE`), the graph and item extraction caches and the embedders' query caches are cleared first; the
   process-wide stemmer cache and vocabulary stay warm (an untimed build of every context runs first). The garbage
   collector is off inside timed regions (as in `timeit`; `--gc` keeps it on). Median of `--repeats` builds per
   context, the builds of all contexts and both chunk sizes interleaved in shuffled rounds; mean over contexts. Q.E. =
   `run_loop(mab-reader strong, memory, query.view())` per question on the built memory: the first `--queries`
   questions of each context, round-robin over the contexts until `--qe-budget` seconds are spent per agent and chunk
   size (n: queries timed); mean ms per query, with the part spent in `memory.search` shown separately (the rest is the
   offline reader). A query that raises is counted and reported, not timed.
2. Embedding throughput on the 512-token chunks of one context: hash-embed (the lexical stand-in) and, with `--minilm`,
   all-MiniLM-L6-v2 (which reads only the first 256 word pieces of a chunk: its max_seq_length).
3. Linear scaling: M.C. per agent of one context at each of `--lengths` (`--scale-chunk` chunks), at least
   `--scale-rounds` rounds (more, up to 60, while the agent's builds take less than `--scale-budget` seconds in all),
   each building every length once in a shuffled order; medians. A least-squares line through the origin and an
   affine fit, both with R^2 against the mean, the log-log slope (1 = linear), and the ratio of M.C. per 1K tokens at
   the largest vs the smallest length (1 = linear) by the wall-time median, the fastest build and the median process
   CPU time. The curve goes to figures/memoryagentbench/construction_scaling.png and every M.C. measurement of
   sections 1 and 3 to results/memoryagentbench/bench_construction.csv (`--no-save` writes neither).
"""
import argparse, gc, os, random, statistics, sys, time
from contextlib import contextmanager
from pathlib import Path
import numpy as np, pandas as pd
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from memlab.protocols.mab.synth import make_mab
from memlab.protocols.mab.data import rows_to_instances, count_chunk_tokens, family_of, CHUNK_TOKENIZER, SENTENCE_SPLITTER
from memlab.memory import make_memory
from memlab.index import STORE, get_embedder, dense_available
from memlab.graph import GRAPH_CACHE
from memlab.planar import ITEM_CACHE
from memlab.agent import run_loop, POLICIES
from memlab.protocols.mab.agents import mab_agents   # also registers the 'mab-reader' policy

AGENTS, POLICY = mab_agents(k=10), ('mab-reader', dict(tier='strong'))   # seed 001's agents; the offline reader
PROBE = 'memory construction probe'   # the first search, which builds each memory's lazy index
MINILM = 'all-MiniLM-L6-v2'
FIG = ROOT / 'figures/memoryagentbench/construction_scaling.png'
CSV = ROOT / 'results/memoryagentbench/bench_construction.csv'
BENCH_LABEL = 'benchmark: construction and query time of offline memories (no LLM)'

def agent_specs(minilm: bool) -> list[tuple[str, dict]]:
    "(label, memory spec) of every agent: dense with hash-embed, plus dense with MiniLM when asked."
    out = []
    for s in AGENTS:
        if s['name'] == 'dense':
            out.append(('dense[hash-embed]', {**s, 'embedder': 'hash-embed'}))
            if minilm: out.append((f'dense[{MINILM}]', {**s, 'embedder': MINILM}))
        else: out.append((s['name'], dict(s)))
    return out

USED_EMBEDDERS = ['hash-embed']   # the embedders whose query caches `forget_queries` clears (main adds MiniLM)

def forget_queries():
    "Empty the embedders' query-embedding caches, so every question (and the probe) is encoded again."
    for name in USED_EMBEDDERS:
        q = get_embedder(name).__dict__.get('_qcache')
        if q is not None: q.clear()

def cold():
    "Forget every content-keyed analysis (chunks, terms, embeddings, graph and item extractions) and collect garbage."
    STORE.clear(); GRAPH_CACHE.clear(); ITEM_CACHE.clear(); forget_queries()
    gc.collect()

KEEP_GC = False   # --gc: leave the cyclic garbage collector on while timing (off by default, as in `timeit`)

@contextmanager
def no_gc():
    "Timed region: the cyclic garbage collector off (unless --gc), so its full collections do not land in one agent's time."
    was = gc.isenabled()
    if not KEEP_GC: gc.disable()
    try: yield
    finally:
        if was: gc.enable()

def construct(spec: dict, sessions: list) -> tuple:
    "A memory holding `sessions`, and the seconds of (add_all, first search, process CPU of both) from a cold store."
    cold()
    with no_gc():
        c0 = time.process_time(); t0 = time.perf_counter(); m = make_memory(**spec); m.add_all(sessions)
        t1 = time.perf_counter(); m.search(PROBE, m.k); t2 = time.perf_counter(); c1 = time.process_time()
    return m, t1 - t0, t2 - t1, c1 - c0

def measure_mc(spec: dict, # memory spec
               session_lists: list, # the chunk lists (contexts) to build from
               rounds: int, # cold builds of every list (at least)
               budget: float=0.0, # more rounds, up to 60, while the rounds take less than this many seconds in all
               seed: int=0 # shuffles the order of the lists in each round
              ) -> tuple:
    """Rounds of cold builds, interleaved: each round builds every list once, in a shuffled order, so a change in
    machine load (2 shared cores) hits every list alike. Returns the last memory of each list and, per list, the
    medians of M.C., add_all, first search and process CPU seconds, the fastest M.C. and the number of builds."""
    runs, mems, rng = [[] for _ in session_lists], [None] * len(session_lists), random.Random(seed)
    r, spent = 0, 0.0
    while r < rounds or (budget and r < 60 and spent * (r + 1) / r < budget):
        order = list(range(len(session_lists))); rng.shuffle(order)
        for i in order:
            mems[i], a, b, c = construct(spec, session_lists[i]); runs[i].append((a + b, a, b, c)); spent += a + b
        r += 1
    med = lambda r, j: statistics.median(x[j] for x in r)
    return mems, [dict(mc_s=med(r, 0), add_all_s=med(r, 1), first_search_s=med(r, 2), mc_cpu_s=med(r, 3),
                       mc_min_s=min(x[0] for x in r), repeats=len(r)) for r in runs]

def settle():
    "After the inputs are built: collect, then freeze every live object so the collections of `cold` stay short."
    gc.collect(); gc.freeze()

FAILURES = {}   # (family, agent label, chunk size) -> [failed queries, queries, first error]

def measure_qe(policy, pairs: list, # (instance, built memory) pairs
               n: int, # at most this many questions of each instance (its first ones)
               budget: float, # stop starting queries once this many seconds are spent on the pairs
               who: tuple # FAILURES key
              ) -> list[tuple]:
    """Per pair: mean ms per query of `run_loop` and of its memory searches, and the number of queries timed. Queries go
    round-robin over the pairs (the first question of each, then the second, ...), so a budget cut hits every context
    alike; a query that raises is counted in `FAILURES`, not timed."""
    acc, spent, f = [[0.0, 0.0, 0] for _ in pairs], 0.0, FAILURES.setdefault(who, [0, 0, None])
    forget_queries()
    for j in range(n):
        for (inst, m), c in zip(pairs, acc):
            if j >= len(inst.queries) or spent >= budget: continue
            q = inst.queries[j]; f[1] += 1; t = time.perf_counter()
            try:
                with no_gc(): r = run_loop(policy, m, q.view()); dt = time.perf_counter() - t
                c[0] += dt; c[1] += r.memory_s; c[2] += 1
            except Exception as e:
                f[0] += 1; f[2] = f[2] or f'query {q.id} ({q.question!r}): {type(e).__name__}: {e}'
            spent += time.perf_counter() - t
    return [(1000 * t / k, 1000 * ms / k, k) if k else (float('nan'), float('nan'), 0) for t, ms, k in acc]

def instances(family: str, n: int, tokens: int, chunk_sizes: tuple, questions: int, seed: int=0) -> tuple:
    "Per chunk size, the instances of `n` synthetic contexts of `family` (one per row), and the chunking seconds."
    kw = dict(n_contexts=n, context_tokens=tokens, seed=seed)
    if questions: kw['questions_per_context'] = questions
    rows = make_mab(family, **kw)
    out, secs = {}, {}
    for cs in chunk_sizes:
        t = time.perf_counter(); out[cs] = rows_to_instances(rows, '<bench>', chunk_size=cs); secs[cs] = time.perf_counter() - t
    return out, secs

def lme_questions(tokens: int) -> int:
    "Questions per LongMemEval(S*) context that fit `tokens` (its planted sessions take ~450 tokens per question)."
    return max(2, min(60, tokens // 900))

def section_table(a, specs, policy) -> list[dict]:
    print(f'\n1. M.C. and Q.E. per agent ({a.contexts} context(s) of ~{a.context_tokens // 1024}K tokens per family, '
          f'median of {a.repeats} cold builds per context, interleaved over contexts and chunk sizes ({MINILM}: 1 build of the first context), mean over contexts; '
          f'Q.E.: mean over n queries, the first {a.queries} questions of each context taken round-robin until '
          f'{a.qe_budget:g} s are spent per agent and chunk size, '
          f'policy {policy.name}, no LLM)')
    recs = []
    for fam in a.families:
        q = lme_questions(a.context_tokens) if fam.startswith('longmemeval') else None
        by_cs, secs = instances(fam, a.contexts, a.context_tokens, (512, 4096), q)
        ex = by_cs[512][0]
        print(f'\n{family_of(ex.meta["source"]).name} ({fam}): contexts of {np.mean([i.meta["context_tokens"] for i in by_cs[512]]):,.0f} tokens '
              f'({CHUNK_TOKENIZER}); chunks per context: 512 -> {np.mean([len(i.sessions) for i in by_cs[512]]):.1f}, '
              f'4096 -> {np.mean([len(i.sessions) for i in by_cs[4096]]):.1f}; chunking ({SENTENCE_SPLITTER} + token counts, '
              f'shared by every agent, not in M.C.): {secs[512] / a.contexts:.2f} s / {secs[4096] / a.contexts:.2f} s per context')
        lists = [(cs, inst) for cs in (512, 4096) for inst in by_cs[cs]]
        for label, spec in specs:   # untimed warm-up: imports, embedder load, stemmer cache, vocabulary
            for _, inst in lists: construct(spec, inst.sessions[:2] if MINILM in label else inst.sessions)   # MiniLM: load it
        settle()
        print(f'{"agent":23s} {"chunk":>5s} {"M.C. s/context":>14s} {"(add_all":>9s} {"+ 1st search)":>13s} '
              f'{"Q.E. ms/query":>13s} {"(memory":>8s} {"ms)":>3s} {"n":>4s}')
        for label, spec in specs:
            mine = [(cs, inst) for cs, inst in lists if MINILM not in label or inst is by_cs[cs][0]]   # MiniLM: first context only
            mems, res = measure_mc(spec, [inst.sessions for _, inst in mine], 1 if MINILM in label else a.repeats)
            for cs in (512, 4096):
                idx = [i for i, (c, _) in enumerate(mine) if c == cs]
                qe = measure_qe(policy, [(mine[i][1], mems[i]) for i in idx], a.queries, a.qe_budget, (fam, label, cs))
                for i, (e, em, k) in zip(idx, qe):
                    inst = mine[i][1]
                    recs.append(dict(section='table', family=fam, agent=label, chunk_size=cs, context_tokens=inst.meta['context_tokens'],
                                     n_chunks=len(inst.sessions), **res[i], qe_ms=e, qe_memory_ms=em, n_queries=k))
            del mems
            df = pd.DataFrame([x for x in recs if x['family'] == fam and x['agent'] == label])
            df['qe_tot'], df['qem_tot'] = df.qe_ms.fillna(0) * df.n_queries, df.qe_memory_ms.fillna(0) * df.n_queries
            g = df.groupby('chunk_size')
            for cs, r in g.mean(numeric_only=True).iterrows():
                n = g.n_queries.sum()[cs]; qe, qm = (g[c].sum()[cs] / n if n else float('nan') for c in ('qe_tot', 'qem_tot'))
                print(f'{label:23s} {cs:5d} {r.mc_s:14.4f} {r.add_all_s:9.4f} {r.first_search_s:13.4f} {qe:13.2f} {qm:8.2f} {n:4d}')
            mc = g.mc_s.mean(); print(f'{"":23s} M.C. 512/4096 = {mc[512] / mc[4096]:.2f}x')
        for (f_, label, cs), (nf, n, err) in FAILURES.items():
            if f_ == fam and nf: print(f'ERRORS: {label} at chunk {cs}: {nf}/{n} queries raised (not timed); first: {err}')
    return recs

def section_embedding(a):
    rows = make_mab(a.scale_family, n_contexts=1, context_tokens=a.context_tokens, seed=1)
    texts = [s.turns[0].content for s in rows_to_instances(rows, '<bench>', chunk_size=512)[0].sessions]
    toks = sum(map(count_chunk_tokens, texts))
    print(f'\n2. Embedding throughput on {len(texts)} chunks of <= 512 tokens ({toks / len(texts):.0f} tokens on average, '
          f'{CHUNK_TOKENIZER}), one encode call per pass')
    for name in ['hash-embed'] + ([MINILM] if a.minilm else []):
        t = time.perf_counter(); emb = get_embedder(name); emb.encode(texts[:2]); load = time.perf_counter() - t
        reps = 1 if name == MINILM else a.repeats
        ts = []
        for _ in range(reps):
            t = time.perf_counter(); v = emb.encode(texts); ts.append(time.perf_counter() - t)
        s = statistics.median(ts)
        note = ' (reads only the first 256 word pieces of each chunk)' if name == MINILM else ''
        print(f'{name}: {len(texts) / s:,.0f} chunks/s, {toks / s:,.0f} input tokens/s (median of {reps}; dim {v.shape[1]}; '
              f'load + first call {load:.2f} s){note}')

def fits(x: np.ndarray, y: np.ndarray) -> dict:
    "Least squares through the origin and affine, with R^2 (both against the mean), and the log-log slope."
    sst = float(((y - y.mean()) ** 2).sum())
    b0 = float((x * y).sum() / (x * x).sum())
    b1, a1 = np.polyfit(x, y, 1)
    return dict(slope0=b0, r2_0=1 - float(((y - b0 * x) ** 2).sum()) / sst, slope=float(b1), intercept=float(a1),
                r2=1 - float(((y - a1 - b1 * x) ** 2).sum()) / sst, loglog=float(np.polyfit(np.log(x), np.log(y), 1)[0]),
                ratio=float((y[-1] / x[-1]) / (y[0] / x[0])))

def section_scaling(a, specs) -> tuple:
    lengths = sorted(a.lengths)
    print(f'\n3. Linear scaling: M.C. of one {a.scale_family} context per length, chunk size {a.scale_chunk}, '
          f'median of >= {a.scale_rounds} rounds of cold builds (more, up to 60, while an agent\'s builds total < {a.scale_budget:g} s), '
          f'each round over every length in a shuffled order ({MINILM}: 1 round); '
          f'hi/lo by wall median, "min": by the fastest build, "cpu": by median process CPU time; fit0: through the origin; '
          f'aff: affine, "min": its R2 on the fastest builds; loglog: slope of log M.C. on log length')
    insts = []
    for L in lengths:
        q = lme_questions(L) if a.scale_family.startswith('longmemeval') else 10
        insts.append(instances(a.scale_family, 1, L, (a.scale_chunk,), q)[0][a.scale_chunk][0])
    x = np.array([i.meta['context_tokens'] for i in insts], float)
    print('context tokens: ' + ', '.join(f'{v:,.0f}' for v in x) + '; chunks: ' + ', '.join(str(len(i.sessions)) for i in insts))
    for label, spec in specs:   # untimed warm-up
        for inst in insts: construct(spec, inst.sessions[:2] if MINILM in label else inst.sessions)
    settle()
    recs, curves = [], {}
    print(f'{"agent":23s}' + ' '.join(f'{f"{L // 1024}K ms":>9s}' for L in lengths)
          + f' {"ms/1K lo":>8s} {"ms/1K hi":>8s} {"hi/lo":>6s} {"min":>5s} {"cpu":>5s} {"ms/1K fit0":>10s} {"R2 (0)":>7s} {"ms/1K aff":>9s} '
          f'{"icpt ms":>8s} {"R2 aff":>7s} {"min":>6s} {"loglog":>6s}')
    for label, spec in specs:
        _, res = measure_mc(spec, [inst.sessions for inst in insts], *((1, 0) if MINILM in label else (a.scale_rounds, a.scale_budget)))
        for inst, xi, r in zip(insts, x, res):
            recs.append(dict(section='scaling', family=a.scale_family, agent=label, chunk_size=a.scale_chunk, context_tokens=int(xi),
                             n_chunks=len(inst.sessions), **r))
        y, ymin, ycpu = (np.array([r[k] for r in res]) for k in ('mc_s', 'mc_min_s', 'mc_cpu_s'))
        f = fits(x, y); curves[label] = (x, y, f)
        print(f'{label:23s}' + ' '.join(f'{1000 * v:9.2f}' for v in y)
              + f' {1e6 * y[0] / x[0]:8.3f} {1e6 * y[-1] / x[-1]:8.3f} {f["ratio"]:6.2f} {fits(x, ymin)["ratio"]:5.2f} {fits(x, ycpu)["ratio"]:5.2f}'
                f' {1e6 * f["slope0"]:10.3f} {f["r2_0"]:7.4f} {1e6 * f["slope"]:9.3f} {1000 * f["intercept"]:8.2f} {f["r2"]:7.4f}'
                f' {fits(x, ymin)["r2"]:6.4f} {f["loglog"]:6.3f}')
    return recs, curves

def plot() -> Path:
    "The scaling figure from the saved CSV, in the one figure style (memlab.protocols.mab.figures.construction_scaling)."
    import matplotlib; matplotlib.use('Agg')
    from memlab.plots import save_figure
    from memlab.protocols.mab.figures import construction_scaling
    t = pd.read_csv(CSV)
    return save_figure(construction_scaling(t, sorted(t['label'].unique()) if 'label' in t else [BENCH_LABEL]), FIG)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--quick', action='store_true', help='a ~30 s run: 2 contexts of 32K, 5 queries, lengths 8K-64K, >= 9 rounds within 2 s per agent')
    ap.add_argument('--minilm', action='store_true', help=f'also time dense with {MINILM} (needs the dense extra)')
    ap.add_argument('--families', nargs='+', default=['ruler_qa2', 'longmemeval_s*'])
    ap.add_argument('--contexts', type=int, default=5); ap.add_argument('--context-tokens', type=int, default=131072)
    ap.add_argument('--queries', type=int, default=10); ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--qe-budget', type=float, default=10.0, help='seconds of Q.E. per family, agent and chunk size')
    ap.add_argument('--lengths', type=int, nargs='+', default=[8192, 16384, 32768, 65536, 131072])
    ap.add_argument('--scale-rounds', type=int, default=7); ap.add_argument('--scale-budget', type=float, default=3.0)
    ap.add_argument('--scale-family', default='ruler_qa2'); ap.add_argument('--scale-chunk', type=int, default=512)
    ap.add_argument('--no-save', action='store_true', help='write neither the figure nor the CSV')
    ap.add_argument('--gc', action='store_true', help='keep the garbage collector on while timing')
    ap.add_argument('--plot-only', action='store_true', help='redraw the figure from the saved CSV, measuring nothing')
    a = ap.parse_args()
    if a.plot_only: print(f'wrote {plot().relative_to(ROOT)} from {CSV.relative_to(ROOT)}'); return
    global KEEP_GC; KEEP_GC = a.gc
    if a.quick: a.contexts, a.context_tokens, a.queries, a.lengths, a.scale_rounds, a.scale_budget = 2, 32768, 5, [8192, 16384, 32768, 65536], 9, 2.0
    if a.minilm and not dense_available(): ap.error(f'--minilm: {MINILM} is not installed (the dense extra)')
    t0, load = time.perf_counter(), os.getloadavg()[0]
    policy = POLICIES.make(POLICY[0], **POLICY[1])
    specs = agent_specs(a.minilm)
    if a.minilm: USED_EMBEDDERS.append(MINILM)
    print(f'agents: {[l for l, _ in specs]}; policy: {policy.name} ({policy.label}); {os.cpu_count()} CPU cores (load average '
          f'{load:.2f} at start: other processes share them); tokenizer {CHUNK_TOKENIZER}, splitter {SENTENCE_SPLITTER}')
    recs = section_table(a, specs, policy)
    section_embedding(a)
    srecs, curves = section_scaling(a, specs)
    if not a.no_save:
        CSV.parent.mkdir(parents=True, exist_ok=True)
        from memlab.plots import save_table
        save_table(pd.DataFrame(recs + srecs).astype({'n_queries': 'Int64'}), CSV, [BENCH_LABEL])
        print(f'\nwrote {plot().relative_to(ROOT)} and {CSV.relative_to(ROOT)} ({len(recs) + len(srecs)} rows)')
    print(f'total {time.perf_counter() - t0:.0f} s; load average at the end {os.getloadavg()[0]:.2f}')

if __name__ == '__main__':
    main()
