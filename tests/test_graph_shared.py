"""Graph memories built from structure shared across queries and scales, identical to a fresh build (issue 29).

A scale ladder's (query, scale) histories overlap in most of their sessions but are sorted by date, so one is not a
prefix of another. `ppr-graph` and `entity-graph` keep, per session content, a `SessionGraph` (extracted chunks,
passage-entity edges, co-occurrence pairs, in process-wide entity ids) and assemble a history's graph from those
with array operations. Checked here, on the ladder histories of several queries at every scale, built in a shuffled
order with warm caches:
- every matrix (B, C, A), the entity names and numbering equal those of the reference construction written below
  (the per-chunk loop memlab used before), and every search of both memories equals a fresh build's (caches cleared);
- co-occurrence pairs are computed once per distinct session, not once per history (the shared part);
- a checkpointed memory (its pieces dropped) searches the same, and grows further.
"""
import random
from unittest import mock

import numpy as np
import pytest
from scipy import sparse

import memlab.graph as G
from memlab.graph import GRAPH_CACHE, session_graph, sentence_entities, cooccurrence_pairs
from memlab.checkpoint import checkpoint_dumps
from memlab.memory import make_memory
from memlab.protocols.scale.section import ladder_data
import pickle


def reference_graph(chunks, window=5):
    "The graph as memlab built it from chunks before issue 29: one Python pass over every chunk's entities."
    vocab, surface, named = {}, [], []
    rows, cols, seqs, sents, off = [], [], [], [], 0
    for p, ch in enumerate(chunks):
        g = np.empty(len(ch['keys']), dtype=np.int64)
        for i, (key, sf, nm) in enumerate(zip(ch['keys'], ch['surf'], ch['named'])):
            e = vocab.get(key)
            if e is None: e = vocab[key] = len(surface); surface.append(sf); named.append(nm)
            elif nm and not named[e]: surface[e], named[e] = sf, True
            g[i] = e
        rows.append(np.full(len(g), p)); cols.append(g)
        seqs.append(g[ch['seq']]); sents.append(ch['sent'].astype(np.int64) + off)
        off += int(ch['sent'][-1]) + 1 if len(ch['sent']) else 0
    n_e, n_p = len(vocab), len(chunks)
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)
    B = sparse.csr_matrix((np.ones(len(cat(rows))), (cat(rows), cat(cols))), shape=(n_p, n_e)); B.sum_duplicates(); B.data[:] = 1.0
    pi, pj = cooccurrence_pairs(cat(seqs), cat(sents), window)
    C = sparse.coo_matrix((np.ones(len(pi)), (pi, pj)), shape=(n_e, n_e)).tocsr(); C = (C + C.T).tocsr()
    A = sparse.bmat([[C, B.T], [B, None]], format='csr')
    return dict(vocab=vocab, surface=surface, named=named, B=B, C=C, A=A)


def same_csr(x, y):
    return x.shape == y.shape and all(np.array_equal(getattr(x, a), getattr(y, a)) for a in ('indptr', 'indices', 'data'))


@pytest.fixture(scope='module')
def ladder():
    d = ladder_data('synthetic', None, None, 6, 300, 8, [0, 20, 40, 80], 3)
    units = [(i, c) for i in d.instances for c in d.history.conditions()]
    return d, units


def searches(mem, queries):
    return [[(e.session_id, e.meta.get('chunk'), e.score, e.text) for e in mem.search(q)] for q in queries]


def test_shared_build_equals_reference_and_fresh(ladder):
    d, units = ladder
    questions = [q.question for i in d.instances for q in i.queries] + ['Beatrix Lisbon', 'zzz qqq']
    order = list(range(len(units))); random.Random(0).shuffle(order)
    GRAPH_CACHE.clear()
    warm = {}
    for j in order:                                   # any order of arrival, caches warm from the histories before
        inst, cond = units[j]
        for name in ('ppr-graph', 'entity-graph'):
            m = make_memory(name); m.add_all(d.history(inst, cond)); warm[j, name] = m
    for j, (inst, cond) in enumerate(units):
        m = warm[j, 'ppr-graph']; g = m.graph(); ref = reference_graph(m.chunks)
        assert same_csr(g.B, ref['B']) and same_csr(g.C, ref['C']) and same_csr(g.A, ref['A']), j
        assert g.vocab == ref['vocab'] and list(g.surface) == ref['surface'] and g.named.tolist() == ref['named'], j
    for j, (inst, cond) in enumerate(units):
        GRAPH_CACHE.clear()
        for name in ('ppr-graph', 'entity-graph'):
            fresh = make_memory(name); fresh.add_all(d.history(inst, cond))
            assert searches(warm[j, name], questions) == searches(fresh, questions), (j, name)


def test_pairs_computed_once_per_session(ladder):
    d, units = ladder
    GRAPH_CACHE.clear()
    calls = []
    real = G.cooccurrence_pairs
    with mock.patch.object(G, 'cooccurrence_pairs', side_effect=lambda *a, **k: calls.append(1) or real(*a, **k)):
        for inst, cond in units:
            m = make_memory('ppr-graph'); m.add_all(d.history(inst, cond)); m.prepare()
    distinct = {G.session_key(s, G.EXTRACTOR, 128) for inst, cond in units for s in d.history(inst, cond)}
    assert len(units) > 10 and len(calls) == len(distinct) < sum(len(d.history(i, c)) for i, c in units)


def test_checkpointed_graph_memory_searches_the_same_and_grows(ladder):
    d, units = ladder
    inst, _ = units[0]
    hist = d.history(inst, {'scale': 's3'})
    for name in ('ppr-graph', 'entity-graph'):
        m = make_memory(name); m.add_all(hist[:-5])
        back = pickle.loads(checkpoint_dumps(m))
        assert back._pieces is None
        q = inst.queries[0].question
        assert searches(back, [q]) == searches(m, [q])
        back.add_all(hist[-5:]); full = make_memory(name); full.add_all(hist)
        assert searches(back, [q, 'Beatrix']) == searches(full, [q, 'Beatrix']), name
