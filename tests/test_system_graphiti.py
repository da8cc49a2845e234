"""The real Graphiti (`graphiti-core` on embedded Kuzu) as a memlab memory, end to end against the loopback server.

The loopback "model" answers Graphiti's own structured-output prompts (entity extraction, fact extraction, fact
dedupe/contradiction, temporal bounds) in the JSON its pydantic response models parse, so Graphiti's real pipeline
runs: nodes and facts are written, a restated fact gains the later episode, a contradicted fact is expired.
Skipped where graphiti-core / kuzu are not installed (the main venv); run with `.venv-systems/bin/python -m pytest`.
"""
import ast, json, os, re, socket
import pytest

pytest.importorskip('graphiti_core', reason='graphiti-core is not installed (the graphiti extra)')
pytest.importorskip('kuzu', reason='kuzu is not installed (the graphiti extra)')

from loopback import LoopbackServer, Reply, _user_texts
from memlab.core import Session, Turn, Usage
from memlab.memory import MEMORIES
from memlab.systems.graphiti import GraphitiMemory, GraphitiReplyError
from memlab.backends import run_async
from test_readback import SESSIONS, LATER, SHARED, check_round_trip

# ------------------------------------------------------------------ a fake model answering Graphiti's prompts
LIVES = re.compile(r'\b([A-Z]\w+) (?:now )?lives in ([A-Z]\w+)')

def _block(text, *tags):
    "The text between <TAG> and </TAG> (Graphiti's prompt sections)."
    for t in tags:
        m = re.search(rf'<{t}>\s*(.*?)\s*</{t}>', text, re.S)
        if m: return m.group(1)
    return ''

def _sentences(block):
    "User sentences of a CURRENT MESSAGE block ('role: content' lines)."
    out = []
    for line in block.splitlines():
        role, _, content = line.partition(': ')
        if role.strip().lower() == 'user': out += [s.strip() for s in re.split(r'(?<=[.!?])\s+', content) if s.strip()]
    return out

def _entities(sentence):
    "The fake model's entities: capitalised words after the first, and a lower-case noun after an article."
    ws, out = re.findall(r'[A-Za-z]+', sentence), []
    for i, w in enumerate(ws[1:], 1):
        if (w[0].isupper() and w != 'I') or (ws[i - 1].lower() in ('a', 'an', 'the') and w.islower()):
            if w not in out: out.append(w)
    return out

def _title(u):
    "The response model Graphiti asked for: the title of the JSON schema it appends to its last message."
    i = u.rfind('Respond with a JSON object in the following format:')
    return json.loads(u[i:].split('\n\n', 1)[1]).get('title') if i >= 0 else None

def graphiti_responder(kind, req, seen=None):
    "Answers Graphiti's prompts in the JSON its response models parse; `seen` collects the models asked for."
    u = _user_texts(kind, req)[-1]; title = _title(u)
    if seen is not None: seen.append(title)
    cur = _block(u, 'CURRENT MESSAGE', 'CURRENT_MESSAGE')
    if title == 'ExtractedEntities':
        names = list(dict.fromkeys(['user'] + [e for s in _sentences(cur) for e in _entities(s)]))
        return Reply(content=json.dumps({'extracted_entities': [{'name': n, 'entity_type_id': 0} for n in names]}))
    if title == 'ExtractedEdges':
        edges = []
        for s in _sentences(cur):
            es = _entities(s)
            if es:
                src, tgt = (es[0], es[1]) if len(es) > 1 else ('user', es[0])
                edges.append({'source_entity_name': src, 'target_entity_name': tgt, 'relation_type': 'MENTIONS', 'fact': s})
        return Reply(content='```json\n' + json.dumps({'edges': edges}) + '\n```')   # fenced, as small models do
    if title == 'EdgeDuplicate':
        existing = ast.literal_eval(_block(u, 'EXISTING FACTS') or '[]')
        old = existing + ast.literal_eval(_block(u, 'FACT INVALIDATION CANDIDATES') or '[]')
        new = _block(u, 'NEW FACT'); m = LIVES.search(new)
        dup = [f['idx'] for f in existing if f['fact'].strip().lower() == new.strip().lower()]
        gone = [f['idx'] for f in old if m and (o := LIVES.search(f['fact'])) and o.group(1) == m.group(1) and o.group(2) != m.group(2)]
        return Reply(content=json.dumps({'duplicate_facts': dup, 'contradicted_facts': gone}))
    if title == 'EdgeTimestamps':   # "If the fact is ongoing (present tense), set valid_at to REFERENCE TIME."
        ongoing = LIVES.search(_block(u, 'FACT')) is not None
        return Reply(content=json.dumps({'valid_at': _block(u, 'REFERENCE TIME') if ongoing else None, 'invalid_at': None}))
    return Reply(content=f'no scripted answer for {title}')   # an unknown prompt fails loudly (GraphitiReplyError)

def _llm(srv, **kw):
    return dict(name='openai', model='loop-model', base_url=srv.url, timeout=5, backoff=0.01, **{'cache': False, **kw})

@pytest.fixture
def served():
    seen = []
    with LoopbackServer('openai', responder=lambda k, r: graphiti_responder(k, r, seen)) as srv: yield srv, seen

MOVED = Session(id='s6', date='2023/05/20 (Sat) 10:00', turns=[Turn(role='user', content='My friend Beatrix now lives in Oslo.')])

# ------------------------------------------------------------------ tests
def test_registered_with_its_version_and_configuration(served):
    srv, _ = served
    assert MEMORIES['graphiti'] is GraphitiMemory
    p = GraphitiMemory(llm=_llm(srv)).params()
    assert p['package'] == 'graphiti-core' and re.fullmatch(r'\d+\.\d+\.\d+.*', p['version']) and p['kuzu']
    assert p['llm'] == {'name': 'openai', 'model': 'loop-model'} and p['embedder'] == 'hash-embed'
    assert '127.0.0.1' not in json.dumps(p) and '/tmp' not in json.dumps(p)     # no URL, no path

def test_real_extraction_path_and_the_readback_contract(served):
    srv, seen = served
    m = GraphitiMemory(k=3, llm=_llm(srv)); m.add_all(SESSIONS)
    assert {'ExtractedEntities', 'ExtractedEdges', 'EdgeDuplicate', 'EdgeTimestamps'} <= set(seen), set(seen)
    assert seen.count('ExtractedEntities') == len(SESSIONS)                       # one episode per session
    counts = dict(calls=m.usage.calls, requests=srv.n_requests, per_session=m.calls_per_session, retries=m.backend.n_retries, asked=len(seen))
    assert m.usage.calls == srv.n_requests == sum(m.calls_per_session.values()) == len(seen), counts   # a retry (5 s timeout) shows in `retries`
    assert m.usage.input_tokens > 0 and all(n > 0 for n in m.calls_per_session.values())
    check_round_trip(m, SESSIONS)                                                 # test_readback's contract
    assert m.snapshot() is None                                                   # rebuilt, not copied
    with pytest.raises(ValueError, match="session 's1' was already added"): m.add(SESSIONS[0])
    assert m.usage.calls == srv.n_requests                                        # refused before any call

def test_a_restated_fact_is_merged_into_the_first_and_read_back_by_both(served):
    srv, _ = served
    m = GraphitiMemory(llm=_llm(srv)); m.add_all(SESSIONS)
    shared = [e for s in SESSIONS for e in m.readback([s.id]) if e.text == SHARED]
    assert [e.session_id for e in shared] == ['s1', 's3'] and len({e.meta['edge'] for e in shared}) == 1
    assert [e.session_id for e in m.readback(['s3', 's1']) if e.text == SHARED] == ['s1']   # once, first writer
    n = m.n_units; m.add(LATER)                                                    # repeats SHARED again
    assert 'Wilhelmina' in ' '.join(e.text for e in m.readback([LATER.id])) and SHARED in [e.text for e in m.readback([LATER.id])]
    assert m.n_units == n + 3                                                      # three new facts, the repeat merged

def test_a_contradicted_fact_is_expired_and_no_longer_read_back(served):
    srv, seen = served
    m = GraphitiMemory(llm=_llm(srv)); m.add_all(SESSIONS[:2])
    lisbon = 'My friend Beatrix lives in Lisbon.'
    assert lisbon in [e.text for e in m.readback(['s1'])]
    n = m.n_units; m.add(MOVED)
    assert lisbon not in [e.text for e in m.readback(['s1'])]                     # expired by Graphiti's edge dedupe
    assert [e.text for e in m.readback(['s6'])] == ['My friend Beatrix now lives in Oslo.'] and m.n_units == n
    hits = {e.text: e for e in m.search('Where does Beatrix live?', k=5)}       # search keeps history, with its validity
    oslo = hits['My friend Beatrix now lives in Oslo.']
    assert hits[lisbon].meta['invalid_at'] == oslo.meta['valid_at'] == '2023-05-20T10:00:00+00:00' and hits[lisbon].meta['expired']
    assert oslo.meta['invalid_at'] is None and not oslo.meta['expired']
    assert 'EdgeDuplicate' in seen

def test_search_returns_stored_facts_with_scores_and_sessions(served):
    srv, _ = served
    m = GraphitiMemory(k=3, llm=_llm(srv)); m.add_all(SESSIONS)
    ev = m.search('Where does my friend Quentin live?')
    assert ev and ev[0].text == 'My friend Quentin lives in Oslo.' and ev[0].session_id == 's3' and ev[0].date == SESSIONS[2].date
    assert [e.rank for e in ev] == list(range(len(ev))) and len(ev) <= 3
    assert all(e.score > 0 for e in ev) and [e.score for e in ev] == sorted((e.score for e in ev), reverse=True)
    assert GraphitiMemory(llm=_llm(srv)).search('anything') == []

def test_a_second_run_with_the_same_cache_makes_no_request(served, tmp_path):
    srv, _ = served
    a = GraphitiMemory(llm=_llm(srv, cache=str(tmp_path / 'cache'))); a.add_all(SESSIONS)
    n = srv.n_requests; assert n > 0 and a.usage.calls == n and a.usage.cached == 0
    b = GraphitiMemory(llm=_llm(srv, cache=str(tmp_path / 'cache'))); b.add_all(SESSIONS)
    assert srv.n_requests == n                                                     # every call answered from the cache
    assert b.usage.calls == n and b.usage.cached == n
    assert [(e.text, e.session_id, e.meta['edge']) for e in b.readback([s.id for s in SESSIONS])] == \
           [(e.text, e.session_id, e.meta['edge']) for e in a.readback([s.id for s in SESSIONS])]   # same uuids: tie orders repeat

def test_an_unreachable_server_is_an_error_naming_the_url():
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]   # closed again: nothing listens
    url = f'http://127.0.0.1:{port}/v1'
    m = GraphitiMemory(llm=dict(name='openai', model='loop-model', base_url=url, timeout=2, max_attempts=2, backoff=0.01, cache=False))
    with pytest.raises(Exception) as e: m.add(SESSIONS[0])
    assert f'127.0.0.1:{port}' in str(e.value), str(e.value)

def test_an_unparseable_reply_is_an_error_naming_the_response_model():
    with LoopbackServer('openai', responder=lambda k, r: Reply(content='Sure, here you go.')) as srv:
        m = GraphitiMemory(llm=_llm(srv))
        with pytest.raises(GraphitiReplyError, match='ExtractedEntities: the reply is not a JSON object'): m.add(SESSIONS[0])
        assert srv.n_requests == 1                                                 # not retried by Graphiti's own 5-120 s retry

def test_nothing_is_written_outside_its_temporary_directory(served, tmp_path, monkeypatch):
    srv, _ = served
    home, cwd, tmp = tmp_path / 'home', tmp_path / 'cwd', tmp_path / 'tmp'
    for d in (home, cwd, tmp): d.mkdir()
    monkeypatch.setenv('HOME', str(home)); monkeypatch.chdir(cwd); monkeypatch.setenv('TMPDIR', str(tmp))
    import tempfile; monkeypatch.setattr(tempfile, 'tempdir', None)
    m = GraphitiMemory(llm=_llm(srv)); m.add_all(SESSIONS[:2]); m.search('Beatrix')
    assert os.listdir(home) == [] and os.listdir(cwd) == []
    own = m._dir; assert os.listdir(tmp) == [os.path.basename(own)]
    m.reset(); assert not os.path.exists(own) and m.readback(['s1']) == [] and m.usage == Usage()
    del m; import gc; gc.collect()
    assert os.listdir(tmp) == [] and os.environ.get('GRAPHITI_TELEMETRY_ENABLED') == 'false'
    monkeypatch.setattr('memlab.systems.graphiti.KUZU_MAX_DB_SIZE', 3)        # Kuzu refuses: the memory cannot open
    with pytest.raises(RuntimeError): GraphitiMemory(llm=_llm(srv))
    assert os.listdir(tmp) == []                                                  # and leaves no directory behind

def test_many_memories_stay_open_at_once(served):
    "Kuzu's default reservation (8 TiB of address space per database) failed at the ~15th open memory: bounded now."
    srv, _ = served
    ms = [GraphitiMemory(llm=_llm(srv)) for _ in range(24)]
    ms[-1].add(SESSIONS[0])
    assert len({m._dir for m in ms}) == 24 and ms[-1].n_units == 4 and all(os.path.isdir(m._dir) for m in ms)
    dirs = [m._dir for m in ms]; del ms; import gc; gc.collect()
    assert not any(os.path.exists(d) for d in dirs)                              # closed and deleted when collected

def test_construction_cost_is_counted(served):
    "Every LLM call of the construction is counted, per session (seconds: tests/benchmarks/bench_systems.py)."
    srv, _ = served
    m = GraphitiMemory(llm=_llm(srv)); m.add_all(SESSIONS)
    assert m.usage.calls == srv.n_requests and len(m.calls_per_session) == len(SESSIONS)

def test_completion_order_of_concurrent_calls_does_not_change_the_prompts(monkeypatch):
    "Graphiti runs its LLM calls and searches with `semaphore_gather`: with every gather finishing its tasks in reverse, one at a time, the adapter sends the same requests and reads back the same facts and uuids (issue 28's load test)."
    import sys
    async def reversed_gather(*coros, max_coroutines=None):
        out = [None] * len(coros)
        for i in reversed(range(len(coros))): out[i] = await coros[i]
        return out
    def run(order):
        if order == 'reversed':
            for name, mod in list(sys.modules.items()):
                if name.startswith('graphiti_core') and hasattr(mod, 'semaphore_gather'): monkeypatch.setattr(mod, 'semaphore_gather', reversed_gather)
        with LoopbackServer('openai', responder=lambda k, r: graphiti_responder(k, r)) as srv:
            m = GraphitiMemory(k=3, llm=_llm(srv)); m.add_all(SESSIONS); m.add(MOVED)
            reqs = [json.dumps(r, sort_keys=True) for r in srv.requests]
            return reqs, [(e.text, e.session_id, e.meta['edge']) for e in m.readback([s.id for s in SESSIONS + [MOVED]])]
    forward, back = run('forward'), run('reversed')
    assert len(forward[0]) == len(back[0]) > 0 and sorted(forward[0]) == sorted(back[0])   # the same prompts (sent in another order)
    assert forward[1] == back[1] and forward[1]
