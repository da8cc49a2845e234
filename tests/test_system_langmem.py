"""LangMem for real (issue 28): `memlab.systems.langmem.LangMemMemory` runs langmem's memory store manager (trustcall
extraction: `Memory` inserts, `PatchDoc` updates, `RemoveDoc` deletes) over LangGraph's `InMemoryStore`, its model a memlab
backend talking to the loopback server. The responder answers langmem's own prompts in the tool-call format trustcall parses.
Skipped when langmem is not installed (run with `.venv-systems/bin/python -m pytest`).
"""
import json, os, re, socket
import pytest
pytest.importorskip('langmem', reason='langmem is not installed (the langmem extra): run under .venv-systems')
pytest.importorskip('langgraph', reason='langgraph is not installed (the langmem extra)')
from loopback import LoopbackServer, Reply
from memlab.core import Session, Turn, Usage
from memlab.llm import make_backend
from memlab.memory import MEMORIES
from memlab.systems.langmem import LangMemMemory, LangMemLLMError, openai_tool_choice
import test_readback as tr

_SESSION = re.compile(r'<session_[0-9a-f-]+>\n(.*?)\n</session_', re.S)
_INSTANCE = re.compile(r'<instance id=(\S+) schema_type="[^"]*">\n(.*?)\n</instance>', re.S)
_SENT = re.compile(r'[^.!?]+[.!?]')

def _user_sentences(convo: str) -> list[str]:
    "User sentences of langmem's `<session_...>` block (LangChain's pretty_repr: a header line, a blank line, the text)."
    out = []
    for block in re.split(r'=+ (?=\w+ Message =+)', convo):
        if not block.startswith('Human Message'): continue
        text = '\n'.join(l for l in block.split('\n')[1:] if not l.startswith('[Session date:'))   # langmem merges the date into the run
        out += [s.strip() for s in _SENT.findall(text)]
    return out

def _content(doc: str) -> str:
    try: d = json.loads(doc.replace("'", '"'))
    except ValueError: return doc
    return d.get('content', doc) if isinstance(d, dict) else doc

def responder(kind, req):
    "A scripted extractor: one `Memory` per new user sentence; a repeated one is a PatchDoc counting the repeats; 'I sold my X.' removes the memories naming X."
    tools = {t['function']['name'] for t in req.get('tools') or []}
    text = '\n'.join(m['content'] for m in req['messages'] if isinstance(m.get('content'), str))
    m = _SESSION.search(text)
    if not tools or 'Memory' not in tools or not m: return Reply(content='ok')
    existing = {i: _content(d) for i, d in _INSTANCE.findall(text)}
    calls = []
    for s in _user_sentences(m.group(1)):
        sold = re.match(r'I sold my (\w+)\.', s)
        if sold and 'RemoveDoc' in tools:
            calls += [('RemoveDoc', {'json_doc_id': i}) for i, c in existing.items() if sold.group(1) in c]
            continue
        same = [(i, c) for i, c in existing.items() if c.startswith(s)]
        if same and 'PatchDoc' in tools:
            i, c = same[0]; n = re.search(r'\(mentioned (\d+) times\)$', c)
            calls.append(('PatchDoc', {'json_doc_id': i, 'planned_edits': 'count the repeat',
                                       'patches': [{'op': 'replace', 'path': '/content', 'value': f'{s} (mentioned {int(n[1]) + 1 if n else 2} times)'}]}))
        else: calls.append(('Memory', {'content': s}))
    return Reply(tool_calls=calls) if calls else Reply(content='nothing to store')

def said(sid, day, *lines):
    return Session(id=sid, date=f'2023/05/{day:02d} (Tue) 10:00', turns=[Turn(role='user', content=l) for l in lines])

def memory(srv, cache=False, **kw):
    return LangMemMemory(k=kw.pop('k', 3), llm=make_backend('openai', model='scripted', base_url=srv.url, cache=cache, max_attempts=2,
                                                          backoff=0.01, retry_budget_s=2.0, timeout=5.0), **kw)

def test_tool_choice_mapping():
    assert openai_tool_choice('any') == 'required' and openai_tool_choice('PatchDoc')['function']['name'] == 'PatchDoc'

def test_registered_and_params():
    assert MEMORIES['langmem'] is LangMemMemory
    with LoopbackServer('openai', responder=responder) as srv:
        p = memory(srv).params()
    import importlib.metadata as md
    assert p['langmem'] == md.version('langmem') and p['llm'] == {'provider': 'openai', 'model': 'scripted'}
    assert p['embedder'].startswith('hash-embed') and srv.url not in json.dumps(p)

def local_only(monkeypatch) -> list:
    "Record every socket connect; a connect anywhere but 127.0.0.1 fails the test."
    seen, connect = [], socket.socket.connect
    def guarded(self, addr):
        seen.append(addr)
        if isinstance(addr, tuple) and addr[0] != '127.0.0.1': raise AssertionError(f'network access to {addr}')
        return connect(self, addr)
    monkeypatch.setattr(socket.socket, 'connect', guarded)
    return seen

def test_extraction_insert_update_delete_search_readback(tmp_path, monkeypatch):
    monkeypatch.setenv('HOME', str(tmp_path)); monkeypatch.chdir(tmp_path); seen = local_only(monkeypatch)
    ss = [said('a', 1, 'I adopted a dog named Rex.', 'I own a red kayak.'),
          said('b', 2, 'I sold my kayak.'),
          said('c', 3, 'I adopted a dog named Rex.', 'My sister lives in Oslo.')]
    with LoopbackServer('openai', responder=responder) as srv:
        m = memory(srv); m.add_all(ss)
        n_req = len(srv.requests)
    assert seen and {a[0] for a in seen if isinstance(a, tuple)} == {'127.0.0.1'}
    tools = [sorted(t['function']['name'] for t in r['tools']) for r in srv.requests]
    assert tools == [['Memory'], ['Memory', 'PatchDoc', 'RemoveDoc'], ['Memory', 'PatchDoc', 'RemoveDoc']], tools   # trustcall's insert, then update paths
    assert [r['tool_choice'] for r in srv.requests] == ['auto', 'required', 'required']   # trustcall: None (memlab's 'auto'), then 'any'
    replies = [responder('openai', r).tool_calls for r in srv.requests]
    assert [sorted(n for n, _ in c) for c in replies] == [['Memory', 'Memory'], ['RemoveDoc'], ['Memory', 'PatchDoc']]
    assert m.receipts['a'][1] and len(m.receipts['a'][1]) == 2              # two inserts
    assert m.receipts['b'][1] == []                                         # a delete writes no key
    texts = {e.text for e in m.readback(['a', 'b', 'c'])}
    assert texts == {'I adopted a dog named Rex. (mentioned 2 times)', 'My sister lives in Oslo.'}, texts   # kayak deleted, Rex updated
    assert m.n_units == 2
    ev = m.search('Where does my sister live? Oslo', k=1)
    assert [(e.text, e.session_id, e.date) for e in ev] == [('My sister lives in Oslo.', 'c', ss[2].date)]
    assert [e.session_id for e in m.readback(['c'])] == ['c', 'c']          # c updated Rex and inserted Oslo
    assert [e.session_id for e in m.readback(['a', 'c'])] == ['a', 'c']     # Rex once, first writer
    assert m.readback(['b']) == [] and m.readback('zzz') == []
    assert m.usage.calls == n_req and m.usage.calls >= len(ss) and m.usage.input_tokens > 0
    assert list(tmp_path.iterdir()) == []                                   # nothing written to HOME or the working directory

def test_readback_contract_and_cache(tmp_path):
    "test_readback's round trip on langmem; a second run over the same cache sends no request."
    cache = tmp_path / 'cache.sqlite'
    with LoopbackServer('openai', responder=responder) as srv:
        m = memory(srv, cache=str(cache)); m.add_all(tr.SESSIONS)
        first = len(srv.requests)
        tr.check_round_trip(m, tr.SESSIONS)
        m2 = memory(srv, cache=str(cache)); m2.add_all(tr.SESSIONS)
        assert len(srv.requests) == first and m2.usage.cached == m2.usage.calls == m.usage.calls > 0
    assert {e.text for e in m2.readback([s.id for s in tr.SESSIONS])} == {e.text for e in m.readback([s.id for s in tr.SESSIONS])}

def test_unreachable_server_is_an_error_naming_the_url():
    s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()
    url = f'http://127.0.0.1:{port}/v1'
    m = LangMemMemory(llm=make_backend('openai', model='scripted', base_url=url, cache=False, max_attempts=2, backoff=0.01,
                                      retry_budget_s=2.0, timeout=2.0))
    with pytest.raises(LangMemLLMError, match=re.escape(url)): m.add(said('a', 1, 'I adopted a dog named Rex.'))
    assert m.usage.calls == 0

def test_construction_cost_is_counted():
    "Every LLM call of the construction is counted (seconds: tests/benchmarks/bench_systems.py)."
    with LoopbackServer('openai', responder=responder) as srv:
        m = memory(srv); m.add_all(tr.SESSIONS)
    assert m.usage.calls == len(srv.requests) > 0

def test_a_run_config_names_langmem(tmp_path):
    "memlab's runner builds langmem from a run config (its `llm` as `make_backend` kwargs) and records its version."
    import pandas as pd
    from memlab.config import load_dataset
    from memlab.runner import run
    with LoopbackServer('openai', responder=responder) as srv:
        llm = dict(name='openai', model='scripted', base_url=srv.url, cache=False, max_attempts=2, backoff=0.01)
        cfg = dict(name='langmem', section='systems', dataset={'kind': 'synthetic', 'params': {'n_instances': 1, 'queries_per_instance': 2, 'n_filler': 2}},
                   policies=[{'name': 'offline-reader', 'tier': 'strong'}], memories=[{'name': 'langmem', 'k': 4, 'llm': llm}])
        store = run(cfg, load_dataset(cfg['dataset']), tmp_path / 's', progress=False)
        assert len(srv.requests) > 0
    ro = store.rollouts()
    assert len(ro) == 2 and ro['error'].isna().all(), ro.get('error')
    assert all(r.startswith('langmem') for r in ro['memory']), set(ro['memory'])

def test_snapshot_ignores_later_adds():
    "test_readback's snapshot check: the snapshot reads back the same after the memory ingests more; the memory merges the repeat."
    with LoopbackServer('openai', responder=responder) as srv:
        m = memory(srv); m.add_all(tr.SESSIONS)
        snap = m.snapshot(); ids = [s.id for s in tr.SESSIONS]
        before = {sid: m.readback([sid]) for sid in ids} | {'all': m.readback(ids)}
        assert {sid: snap.readback([sid]) for sid in ids} | {'all': snap.readback(ids)} == before
        m.add(tr.LATER)
        assert {sid: snap.readback([sid]) for sid in ids} | {'all': snap.readback(ids)} == before
        assert snap.readback([tr.LATER.id]) == [] and snap.n_units == 13 and m.n_units == 16
        later = m.readback([tr.LATER.id]); text = '\n'.join(e.text for e in later)
        assert {e.session_id for e in later} == {tr.LATER.id} and tr.SHARED in text and 'Wilhelmina' in text
        assert 'mentioned 3 times' in text and snap.search(tr.SHARED, k=1)[0].text == f'{tr.SHARED} (mentioned 2 times)'
        n = len(srv.requests); snap.add(tr.LATER); assert len(srv.requests) == n + 1 and snap.usage.calls == m.usage.calls

class _Reversed:
    "An executor that runs what is submitted to it in reverse order when the block ends (a thread pool's worst timing)."
    def __init__(self): self.jobs = []
    def __enter__(self): return self
    def submit(self, fn, *a, **kw):
        from concurrent.futures import Future
        f = Future(); self.jobs.append((f, fn, a, kw)); return f
    def __exit__(self, *exc):
        for f, fn, a, kw in reversed(self.jobs): f.set_result(fn(*a, **kw))

def test_thread_pool_timing_does_not_change_the_prompts(monkeypatch):
    "langmem puts new memories through a thread pool: with the pool's jobs run in reverse the adapter sends the same requests (issue 28's flaky cache test)."
    import langmem.knowledge.extraction as ex
    def requests(order):
        if order == 'reversed': monkeypatch.setattr(ex, 'get_executor_for_config', lambda config: _Reversed())
        with LoopbackServer('openai', responder=responder) as srv:
            m = memory(srv); m.add_all(tr.SESSIONS); m.add(tr.LATER)
        return [json.dumps(r, sort_keys=True) for r in srv.requests], {e.text for e in m.readback([s.id for s in tr.SESSIONS + [tr.LATER]])}
    forward, back = requests('forward'), requests('reversed')
    assert len(forward[0]) == len(back[0]) and forward[0] == back[0]
    assert forward[1] == back[1]

def test_memories_built_in_parallel_threads_send_what_they_send_alone(tmp_path):
    "Each add's uuid seed is its own context's: two memories built in two threads send the same requests as built alone, and a cached re-run sends none."
    import concurrent.futures as cf
    def texts(srv, start): return sorted(json.dumps(r, sort_keys=True) for r in srv.requests[start:])
    with LoopbackServer('openai', responder=responder, latency=0.02) as srv:
        memory(srv).add_all(tr.SESSIONS); alone = texts(srv, 0)
        n = len(srv.requests)
        mems = [memory(srv, cache=str(tmp_path / f'c{i}.sqlite')) for i in range(2)]
        with cf.ThreadPoolExecutor(2) as ex: list(ex.map(lambda m: m.add_all(tr.SESSIONS), mems))
        both = texts(srv, n)
        assert both == sorted(alone + alone)                       # each thread's prompts: exactly the lone memory's
        n = len(srv.requests)
        again = [memory(srv, cache=str(tmp_path / f'c{i}.sqlite')) for i in range(2)]
        with cf.ThreadPoolExecutor(2) as ex: list(ex.map(lambda m: m.add_all(tr.SESSIONS), again))
        assert len(srv.requests) == n and all(m.usage.cached == m.usage.calls > 0 for m in again)

def test_a_failing_update_call_is_reported_with_its_cause_not_as_a_recursion_error():
    "trustcall asks again after a failed call until LangGraph's recursion limit; the adapter raises the call's own error, naming the server."
    def refuse_required(kind, req):
        if req.get('tool_choice') == 'required': raise ValueError('tool_choice must be auto')   # the loopback answers HTTP 400
        return responder(kind, req)
    with LoopbackServer('openai', responder=refuse_required) as srv:
        m = memory(srv)
        m.add(said('a', 1, 'I adopted a dog named Rex.'))                 # the insert path: tool_choice auto
        with pytest.raises(LangMemLLMError, match=re.escape(srv.url) + r'.*model calls failed; langmem then raised GraphRecursionError'):
            m.add(said('b', 2, 'I own a red kayak.'))                     # the update path: 'required', refused
    assert [e.session_id for e in m.readback(['a', 'b'])] == ['a'] and m.usage.calls == 1
