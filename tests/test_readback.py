"""The provenance readback contract (`Memory.readback`, SubtleMemory's perfect-retrieval setting,
../shared/docs/protocols.md §2.2), for every registered memory: `readback(ids)` returns the stored units written
from those sessions, each labelled with its session, in write order, ranks 0..n-1, score 1.0; unknown ids read
back nothing; all ids read back every stored unit; a snapshot reads back the same and ignores later adds.
`check_round_trip` holds the assertions; `test_the_checker_catches_wrong_readbacks` shows each can fail.
"""
import inspect
import pytest
from memlab.core import Session, Turn, Evidence
from memlab.memory import MEMORIES, Memory, make_memory
import memlab.flat, memlab.planar, memlab.graph  # noqa: F401  (register their memories)
import memlab.runner  # noqa: F401  (imports every module that registers memories)
from memlab.systems.mem0 import Mem0Memory

# Registered memories allowed to lack readback or that cannot be built here, with the reason. Anything else that
# is registered must implement readback and pass the round trip.
SKIP = {
    'graphiti': 'registered only when graphiti-core is installed, and needs an LLM server: the same round trip runs against the '
                'loopback server in tests/test_system_graphiti.py',
    'langmem': 'registered only when langmem is installed, and needs an LLM server: the same round trip and snapshot checks run '
               'against the loopback server in tests/test_system_langmem.py',
    'mem0': 'registered only when mem0ai is installed, and needs an LLM server: the same round trip and snapshot checks run '
            'against the loopback server in tests/test_system_mem0.py (and test_mem0_receipts_with_a_fake here)',
    'memgym-context': "MemGym's context manager (family 'context-manager'), not a store: its summaries and notes are written from "
                      'several sessions at once (the condensation events record which), so it declares no per-session provenance and '
                      'a readback config with it is refused before any work (test_memgym_context_refuses_readback)',
    'memgym-env': "MemGym II's context-manager spec for interactive episodes: an environment feeds each episode, no session is "
                  'ingested, so there is nothing to read back (a readback config with it is refused like memgym-context)',
}
# The library's registry: memories registered by other test modules at import (e.g. test_mab_data's) are left out.
NAMES = sorted(n for n, c in MEMORIES.items() if c.__module__.split('.')[0] == 'memlab')

WORDS = {  # distinct words per session, so a unit's origin shows in its text
    's1': ('Beatrix', 'kayak', 'Lisbon'), 's2': ('Orbitex', 'violin', 'Nairobi'), 's3': ('Quentin', 'sourdough', 'Oslo'),
    's4': ('Zephyrine', 'telescope', 'Kyoto'),
}
SHARED = 'I water the basil plants every morning.'   # said in s1 and s3: merged by deduplicating memories

def session(sid, day, words=None, shared=False):
    a, b, c = words or WORDS[sid]
    turns = [Turn(role='user', content=f'My friend {a} lives in {c}. I bought a {b} last week.'),
             Turn(role='assistant', content=f'How is the {b} working out?'),
             Turn(role='user', content=f'The {b} from {c} is wonderful.' + (f' {SHARED}' if shared else ''))]
    return Session(id=sid, date=f'2023/05/{day:02d} (Tue) 10:00', turns=turns)

SESSIONS = [session('s1', 1, shared=True), session('s2', 2), session('s3', 3, shared=True), session('s4', 4)]
LATER = session('s5', 9, ('Wilhelmina', 'harpsichord', 'Quito'), shared=True)

def build(name, **kw):
    impl = MEMORIES[name]; ps = inspect.signature(impl).parameters
    if 'k' in ps: kw.setdefault('k', 3)
    if 'embedder' in ps: kw.setdefault('embedder', 'hash-embed')     # lexical stand-in: no torch needed
    if name == 'long-context': kw.setdefault('window_tokens', 10**6)  # nothing evicted (the eviction case is below)
    return make_memory(name, **kw)

def n_stored(m: Memory) -> int:
    "How many units `m` holds (the chunks, passages or items readback can return)."
    if m.family == 'none': return 0
    for attr in ('n_units', 'items', 'chunks'):
        if hasattr(m, attr): v = getattr(m, attr); return v if isinstance(v, int) else len(v)
    pytest.fail(f'{m.name}: tell test_readback how to count its stored units')

def user_sentences(s: Session) -> list[str]:
    from memlab.planar import split_sentences
    return [x for t in s.turns if t.role == 'user' for x in split_sentences(t.content)]

def check_units(ev, allowed: set):
    assert all(isinstance(e, Evidence) for e in ev)
    assert [e.rank for e in ev] == list(range(len(ev))), [e.rank for e in ev]
    assert all(e.score == 1.0 for e in ev), [e.score for e in ev]
    assert {e.session_id for e in ev} <= allowed, ({e.session_id for e in ev}, allowed)

def check_round_trip(m: Memory, sessions, stores=True):
    "The readback contract on a memory that ingested `sessions` (kept whole: no eviction); `stores`: it keeps the content."
    ids = [s.id for s in sessions]; order = {sid: i for i, sid in enumerate(ids)}
    for s in sessions:
        ev = m.readback([s.id]); check_units(ev, {s.id})
        text = '\n'.join(e.text for e in ev)
        if stores:
            assert ev, (m.name, s.id)
            for x in user_sentences(s): assert x in text, (m.name, s.id, x)
            assert all(e.date == s.date for e in ev), (m.name, s.id)
        else: assert ev == []
        others = {w for sid, ws in WORDS.items() if sid != s.id for w in ws}
        assert not any(w in text for w in others), (m.name, s.id, text)
        assert m.readback(s.id) == ev                                   # one id given as a string
    assert m.readback(['no-such-session']) == [] and m.readback([]) == []
    everything = m.readback(ids); check_units(everything, set(ids))
    assert len(everything) == n_stored(m), (m.name, len(everything), n_stored(m))
    pos = [order[e.session_id] for e in everything]
    assert pos == sorted(pos), (m.name, pos)                             # write order
    assert m.readback(ids[::-1]) == everything                           # the order of the ids asked does not matter
    per = {(e.text, e.session_id) for s in sessions for e in m.readback([s.id])}
    assert {(e.text, e.session_id) for e in everything} <= per

@pytest.mark.parametrize('name', NAMES)
def test_every_registered_memory_supports_readback(name):
    if name in SKIP: pytest.skip(SKIP[name])
    assert build(name).supports_readback, f'{name!r} keeps no provenance: implement readback (or list it in SKIP, with the reason)'

@pytest.mark.parametrize('name', NAMES)
def test_readback_round_trip(name):
    if name in SKIP: pytest.skip(SKIP[name])
    m = build(name); m.add_all(SESSIONS)
    check_round_trip(m, SESSIONS, stores=m.family != 'none')

@pytest.mark.parametrize('name', NAMES)
def test_readback_of_a_snapshot_ignores_later_adds(name):
    if name in SKIP: pytest.skip(SKIP[name])
    m = build(name); m.add_all(SESSIONS)
    snap = m.snapshot()
    if snap is None: pytest.skip(f'{name}: no snapshot')
    ids = [s.id for s in SESSIONS]
    before = {sid: m.readback([sid]) for sid in ids} | {'all': m.readback(ids)}
    assert {sid: snap.readback([sid]) for sid in ids} | {'all': snap.readback(ids)} == before
    m.add(LATER)                                                          # repeats SHARED: merged into s1's item
    assert {sid: snap.readback([sid]) for sid in ids} | {'all': snap.readback(ids)} == before
    assert snap.readback([LATER.id]) == []
    later = m.readback([LATER.id])
    if m.family != 'none':
        assert later and {e.session_id for e in later} == {LATER.id}
        assert SHARED in '\n'.join(e.text for e in later) and 'Wilhelmina' in '\n'.join(e.text for e in later)

def test_repeats_are_read_back_from_every_session_that_wrote_them():
    m = build('items'); m.add_all(SESSIONS)
    shared = [e for s in SESSIONS for e in m.readback([s.id]) if SHARED in e.text]
    assert [e.session_id for e in shared] == ['s1', 's3'] and len({e.meta['item'] for e in shared}) == 1
    assert [e.session_id for e in m.readback(['s3', 's1']) if SHARED in e.text] == ['s1']   # once, first writer

def test_long_context_reads_back_only_what_its_window_kept():
    m = build('long-context', window_tokens=60, chunk_tokens=16); m.add_all(SESSIONS)
    kept = {sid for sid, _, _ in m.chunks}
    assert m.evicted > 0 and 's1' not in kept and 's4' in kept
    assert m.readback(['s1']) == []                                       # evicted: read back nothing
    assert {e.text for e in m.readback(['s4'])} == {c for sid, _, c in m.chunks if sid == 's4'}
    ev = m.readback([s.id for s in SESSIONS])
    assert [e.text for e in ev] == [c for _, _, c in m.chunks] and len(ev) == len(m.chunks)
    check_units(ev, kept)

def test_base_memory_without_provenance_refuses():
    class Bare(Memory):
        def add(self, s): pass
    assert not Bare().supports_readback
    with pytest.raises(NotImplementedError, match='keeps no provenance'): Bare().readback(['s1'])

# ------------------------------------------------------------------ the checker's assertions can fail

class Wrong(memlab.flat.BM25Memory):
    "BM25 with a broken readback (`how` says how)."
    how = None
    def readback(self, session_ids):
        ids = [session_ids] if isinstance(session_ids, str) else list(session_ids)
        right = super().readback(ids)
        everything = super().readback([s.id for s in SESSIONS])
        if self.how == 'all': return everything                                        # ignores the ids
        if self.how == 'relabel': return [e.model_copy(update={'session_id': ids[0]}) for e in everything] if ids else []
        if self.how == 'ranks': return [e.model_copy(update={'rank': e.rank + 1}) for e in right]
        if self.how == 'scores': return [e.model_copy(update={'score': 0.5}) for e in right]
        if self.how == 'drop': return right[:-1] if len(ids) > 1 else right               # loses a unit
        if self.how == 'unknown': return right or everything[:1]                           # unknown id reads back something
        if self.how == 'reversed': return [e.model_copy(update={'rank': r}) for r, e in enumerate(right[::-1])]
        if self.how == 'empty': return []
        return right

@pytest.mark.parametrize('how', ['all', 'relabel', 'ranks', 'scores', 'drop', 'unknown', 'reversed', 'empty'])
def test_the_checker_catches_wrong_readbacks(how):
    m = Wrong(k=3, chunk_tokens=16); m.add_all(SESSIONS)
    Wrong.how = None; check_round_trip(m, SESSIONS)                       # the right readback passes
    try:
        Wrong.how = how
        with pytest.raises(AssertionError): check_round_trip(m, SESSIONS)
    finally: Wrong.how = None

# ------------------------------------------------------------------ Mem0's write receipts (mem0 is not installed here)

class FakeMem0:
    """Stands in for mem0's `Memory`: one memory per user message, keyed by its first word; `add` answers with mem0's
    receipts, {'results': [{'id', 'memory', 'event'}]} (a plain list with `as_list`, as older versions)."""
    def __init__(self, as_list=False): self.rows, self.n, self.as_list = {}, 0, as_list
    def add(self, messages, user_id=None, infer=True, metadata=None):
        out = []
        for msg in (x for x in messages if x['role'] == 'user'):
            w = msg['content'].split(); forget = w[0] == 'forget'; key = w[forget].lower()
            hit = next((r for r in self.rows.values() if r['key'] == key), None)
            if forget and hit: del self.rows[hit['id']]; out.append(dict(id=hit['id'], memory=hit['memory'], event='DELETE'))
            elif forget: continue
            elif hit and hit['memory'] == msg['content']: out.append(dict(id=hit['id'], memory=hit['memory'], event='NONE'))
            elif hit:
                out.append(dict(id=hit['id'], memory=msg['content'], event='UPDATE', previous_memory=hit['memory']))
                hit['memory'] = msg['content']
            else:
                self.n += 1; i = f'mem-{self.n}'
                self.rows[i] = dict(id=i, key=key, memory=msg['content'], metadata=dict(metadata or {}))
                out.append(dict(id=i, memory=msg['content'], event='ADD'))
        return out if self.as_list else {'results': out, 'relations': []}
    def get(self, memory_id):
        r = self.rows.get(memory_id); return None if r is None else dict(r)
    def delete_all(self, user_id=None): self.rows.clear()
    def search(self, query, user_id=None, limit=100): return {'results': list(self.rows.values())[:limit]}

def fake_mem0(**kw) -> Mem0Memory:
    m = Mem0Memory.__new__(Mem0Memory); Memory.__init__(m, k=12)
    m.infer, m.user_id, m._cfg, m._m = True, 'memlab', {}, FakeMem0(**kw); m.reset()
    return m

def said(sid, day, *lines):
    return Session(id=sid, date=f'2023/05/{day:02d} (Tue) 10:00',
                   turns=[t for x in lines for t in (Turn(role='user', content=x), Turn(role='assistant', content='Noted.'))])

@pytest.mark.parametrize('as_list', [False, True])
def test_mem0_receipts_with_a_fake(as_list):
    ss = [said('a', 1, 'Coffee every morning.', 'Rex is my dog.'), said('b', 2, 'Coffee every morning.', 'Tea at night.'),
          said('c', 3, 'Rex turned twelve.', 'forget tea'), said('d', 4, 'Coffee every morning.')]
    m = fake_mem0(as_list=as_list); m.add_all(ss)
    assert m.supports_readback
    assert m.receipts == {'a': (ss[0].date, ['mem-1', 'mem-2']), 'b': (ss[1].date, ['mem-3']), 'c': (ss[2].date, ['mem-2']),
                          'd': (ss[3].date, [])}                                   # NONE and DELETE wrote nothing
    ev = m.readback(['a'])
    assert [(e.text, e.session_id, e.date, e.rank, e.score, e.meta) for e in ev] == [
        ('Coffee every morning.', 'a', ss[0].date, 0, 1.0, {'memory_id': 'mem-1'}),
        ('Rex turned twelve.', 'a', ss[0].date, 1, 1.0, {'memory_id': 'mem-2'})]      # as Mem0 holds it now
    assert m.readback(['b']) == [] and m.readback(['d']) == [] and m.readback(['zzz']) == []   # 'b''s memory was deleted
    assert [(e.text, e.session_id) for e in m.readback('c')] == [('Rex turned twelve.', 'c')]
    assert [(e.session_id, e.meta['memory_id']) for e in m.readback(['c', 'b', 'a'])] == [('a', 'mem-1'), ('a', 'mem-2')]
    m.reset(); assert m.receipts == {} and m.readback(['a']) == [] and m._m.rows == {}


def test_memgym_context_refuses_readback():
    "The SKIP entry's claim: the runner refuses the readback setting with a memgym-context memory before any work."
    from memlab.protocols.memgym.protocol import ManagedContext
    from memlab.runner import RunConfig, validate_config
    from memlab.core import RecordError
    assert not ManagedContext().supports_readback
    cfg = RunConfig(name='rb', dataset={'kind': 'memgym-dr', 'n': 1, 'hops': [3], 'budget_tokens': 1000}, policies=[{'name': 'memgym-answer'}],
                    memories=[{'name': 'memgym-context'}], conditions=[{'evidence': 'readback'}], judge={'name': 'memgym-offline'})
    with pytest.raises((RecordError, ValueError), match='keeps no provenance'): validate_config(cfg)
