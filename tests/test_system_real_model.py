"""The real memory systems (mem0, Graphiti, LangMem: issue 28) against a REAL model: llama.cpp serving SmolLM2-135M on
127.0.0.1 (tests/real_server.py), in `make test-real-model`. Skipped without the server env or the packages.

Each memory adds short sessions of personal facts and searches, its LLM calls going through memlab's backend to the
model. The tiny model (8,192-token context) cannot do what these packages ask, so each test pins the exact observable
outcome per path, measured here: nothing may fail silently.
- mem0: its extraction prompt alone is ~12,650 tokens: each add raises mem0's `LLMError` (from memlab's) naming the model
  and the context size (HTTP 400 from the server); nothing is stored; a failure is not cached (a re-run asks again).
- Graphiti: its entity-extraction prompt (~3,800 tokens, ~100 s on 2 cores: one session only) reaches the model, which
  answers prose, not JSON: the add raises `GraphitiReplyError` naming the response model; no graph is written; the
  cached reply makes a re-run fail the same way with no request.
- LangMem: trustcall's insert path (tool_choice auto) reaches the model and stores whatever it extracted; its update path
  asks for tool_choice 'any' (memlab: 'required'), which llama-cpp-python's `chatml-function-calling` refuses (HTTP 500);
  trustcall catches the error, asks the model to "fix the validation error" and loops until LangGraph's recursion limit;
  the adapter raises the failed call's own `LangMemLLMError` (the server's URL and reason, how many calls failed) from
  langmem's `GraphRecursionError`.
Run: `MEMLAB_REAL_PYTHON=... MEMLAB_REAL_GGUF=... .venv-systems/bin/python -m pytest -v -s tests/test_system_real_model.py`
(`-s` shows seconds and calls per session).
"""
import importlib.util, json, os, re, time
import pytest
from real_server import RealServer, configured, ALIAS
from memlab.core import Session, Turn, Usage
import test_readback as rb

pytestmark = pytest.mark.skipif(configured() is not None, reason=str(configured()))

def needs(*mods):
    "Skip (before the server starts) when a package is not importable: the systems live only in .venv-systems."
    miss = [x for x in mods if importlib.util.find_spec(x) is None]
    return pytest.mark.skipif(bool(miss), reason=f"{', '.join(miss)} not installed (run under .venv-systems: make test-systems builds it)")

SESSIONS = [Session(id='a', date='2023/05/01 (Mon) 10:00',
                    turns=[Turn(role='user', content='My name is Ana. I live in Lisbon.'),
                           Turn(role='assistant', content='Nice to meet you, Ana.'),
                           Turn(role='user', content='I have a dog named Rex.')]),
            Session(id='b', date='2023/05/02 (Tue) 10:00',
                    turns=[Turn(role='user', content='I work as a nurse. My sister lives in Oslo.')])]
_STATUS = re.compile(r'"POST /v1/chat/completions HTTP/1\.[01]" (\d{3})')


@pytest.fixture(scope='module')
def work(tmp_path_factory): return tmp_path_factory.mktemp('sysreal')


@pytest.fixture(scope='module')
def server(work):
    with RealServer(work / 'server.log') as srv: yield srv


def statuses(srv) -> list[int]:
    "HTTP status of every chat request the server answered, in order (its access log)."
    return [int(s) for s in _STATUS.findall(srv.log.read_text())]


def llm(srv, cache, timeout=300.0) -> dict:
    return dict(name='openai', model=ALIAS, base_url=srv.url, cache=str(cache), timeout=timeout, max_attempts=1, params={'temperature': 0})


def spy(backend, seen: list, attr='chat'):
    "Record the request of every model call the memory makes (messages and options), passing it through unchanged."
    orig = getattr(backend, attr)
    if attr == 'achat':
        async def call(messages, **kw): seen.append(dict(messages=messages, **kw)); return await orig(messages=messages, **kw)
    else:
        def call(messages, **kw): seen.append(dict(messages=messages, **kw)); return orig(messages=messages, **kw)
    setattr(backend, attr, call)


def add_each(m, srv, name, sessions=SESSIONS) -> list:
    "Add each session: (session id, exception or None, server requests, seconds); prints the figures."
    out = []
    for s in sessions:
        n0, t = len(statuses(srv)), time.monotonic()
        try: m.add(s); err = None
        except Exception as e: err = e
        out.append((s.id, err, statuses(srv)[n0:], time.monotonic() - t))
        print(f'[{name}] session {s.id}: {out[-1][3]:.1f} s, {len(out[-1][2])} requests {out[-1][2]}, usage.calls={m.usage.calls}, '
              f'error={type(err).__name__ if err else None}', flush=True)
    return out


@needs('mem0')
def test_mem0_with_the_real_model(server, work):
    "mem0's extraction call reaches the model and is refused for its length: an error naming the model and the context, nothing stored."
    from memlab.systems.mem0 import Mem0Memory
    from memlab.backends import LLMError
    from mem0.exceptions import LLMError as Mem0LLMError
    m = Mem0Memory(llm=llm(server, work / 'mem0.db'), k=3, max_tokens=256); seen = []; spy(m.backend, seen)
    res = add_each(m, server, 'mem0')
    assert len(seen) == 2                                                          # one extraction call per add
    assert all('Your sole operation is ADD' in c['messages'][0]['content'] for c in seen)   # mem0's additive extraction prompt
    for sid, err, st, _ in res:
        assert st == [400], st                                                     # it reached the model server, which refused it
        assert isinstance(err, Mem0LLMError) and isinstance(err.__cause__, LLMError), repr(err)   # mem0's, raised from memlab's
        msg = str(err)
        assert msg.startswith('LLM extraction failed: ') and f'openai:{ALIAS}' in msg, msg   # mem0 re-raises, memlab names the model
        n = int(re.search(r'you requested (\d+) tokens \((\d+) in the messages', msg).group(2))
        assert 'maximum context length is 8192 tokens' in msg and n > 8192, msg
    assert m.usage == Usage() and m.n_units == 0 and m.receipts == {} and m.search('Where does Ana live?') == []
    m2 = Mem0Memory(llm=llm(server, work / 'mem0.db'), k=3, max_tokens=256)         # a refused call is not cached
    n0 = len(statuses(server))
    with pytest.raises(Mem0LLMError, match='maximum context length'): m2.add(SESSIONS[0])
    assert statuses(server)[n0:] == [400]


def _title(text: str):
    "The response model Graphiti asked for (the JSON schema it appends to its prompt)."
    i = text.rfind('Respond with a JSON object in the following format:')
    return json.loads(text[i:].split('\n\n', 1)[1]).get('title') if i >= 0 else None


@needs('graphiti_core', 'kuzu')
def test_graphiti_with_the_real_model(server, work):
    "Graphiti's entity extraction reaches the model; a reply that is not JSON is an error naming the response model; no graph written."
    from memlab.systems.graphiti import GraphitiMemory, GraphitiReplyError
    m = GraphitiMemory(llm=llm(server, work / 'graphiti.db'), k=3); seen = []; spy(m.backend, seen, 'achat')
    res = add_each(m, server, 'graphiti', SESSIONS[:1])      # one session: its first prompt alone is ~100 s of CPU prefill
    titles = [_title(c['messages'][-1]['content']) for c in seen]
    assert titles[0] == 'ExtractedEntities', titles
    stored = [sid for sid, err, _, _ in res if err is None]
    for sid, err, st, _ in res:
        if err is None: continue                                                   # the model answered valid JSON: see below
        assert isinstance(err, GraphitiReplyError) and str(err).startswith('ExtractedEntities: the reply is not a JSON object'), repr(err)
        assert st == [200] and sid not in m.receipts                               # one call, answered; the add stopped there
    assert m.usage.calls == len(seen) == sum(len(st) for _, _, st, _ in res) and m.usage.input_tokens > 0 and m.usage.cached == 0
    if stored:                                                                     # later prompts ran too, and what was written reads back
        assert {'ExtractedEdges'} <= set(titles) and all(m.calls_per_session[s] >= 2 for s in stored)
        for s in stored: rb.check_units(m.readback([s]), {s})
    else:
        assert m.n_units == 0 and m.receipts == {} and m.search('Where does Ana live?') == []
    n0 = len(statuses(server))                                                     # the same adds from the cache: no request
    m2 = GraphitiMemory(llm=llm(server, work / 'graphiti.db'), k=3)
    for sid, err, _, _ in res:
        s = next(x for x in SESSIONS if x.id == sid)
        if err is None: m2.add(s)
        else:
            with pytest.raises(GraphitiReplyError, match=re.escape(str(err)[:60])): m2.add(s)
    assert statuses(server)[n0:] == [] and m2.usage.calls == m.usage.calls == m2.usage.cached


@needs('langmem', 'langgraph')
def test_langmem_with_the_real_model(server, work):
    "trustcall's insert path reaches the model and stores what it extracted; its update path is refused by the server: the call's own error, from LangGraph's recursion limit."
    from langgraph.errors import GraphRecursionError
    from memlab.systems.langmem import LangMemMemory, LangMemLLMError
    m = LangMemMemory(llm=llm(server, work / 'langmem.db'), k=3, max_tokens=256); seen = []; spy(m.backend, seen)
    (a, err_a, st_a, _), (b, err_b, st_b, _) = add_each(m, server, 'langmem')
    assert err_a is None and st_a == [200] and len(seen) >= 1                      # the insert path: one call
    assert [t['function']['name'] for t in seen[0]['tools']] == ['Memory'] and seen[0]['tool_choice'] is None
    assert m.usage.calls == 1 and m.usage.input_tokens > 0
    ev = m.readback(['a']); n_a = len(ev)
    assert n_a == m.n_units and n_a == len(m.receipts['a'][1])                     # whatever the model extracted, read back as a's
    rb.check_units(ev, {'a'})
    if n_a:                                                                        # memories exist: trustcall's update path, tool_choice 'any'
        assert isinstance(err_b, LangMemLLMError) and isinstance(err_b.__cause__, GraphRecursionError), repr(err_b)
        assert server.url in str(err_b) and 'model calls failed; langmem then raised GraphRecursionError' in str(err_b), str(err_b)
        fast = m.backend.max_consecutive_failures                                  # then memlab fails fast (BackendDown), no request
        assert set(st_b) == {500} and len(st_b) == min(len(seen) - 1, fast), (st_b, len(seen))   # the server refused each one
        print(f'[langmem] session b: {len(seen) - 1} update calls, {len(st_b)} refused by the server (HTTP 500), the rest failed fast')
        assert all(c['tool_choice'] == 'required' for c in seen[1:])
        assert 'b' not in m.receipts and m.usage.calls == 1 and m.n_units == n_a   # nothing written, failed calls not counted
        assert m.search('Where does Ana live?', k=3) and all(e.session_id == 'a' for e in m.search('Ana', k=3))
    else:                                                                          # nothing stored: b takes the insert path again
        assert err_b is None and st_b == [200] and m.usage.calls == 2
    n0 = len(statuses(server))                                                     # the answered call again, from the cache
    m2 = LangMemMemory(llm=llm(server, work / 'langmem.db'), k=3, max_tokens=256); m2.add(SESSIONS[0])
    assert statuses(server)[n0:] == [] and m2.usage.cached == m2.usage.calls == 1
    assert [e.text for e in m2.readback(['a'])] == [e.text for e in ev]


@needs('mem0')
@pytest.mark.skipif(not os.environ.get('MEMLAB_REAL_MEM0_16K'), reason='mem0 at n_ctx 16384 takes ~5-10 min of CPU per session: set MEMLAB_REAL_MEM0_16K=1')
def test_mem0_with_a_16k_context(work):
    "With llama.cpp's context at 16,384 (past SmolLM2's 8,192 training context) mem0's extraction completes: what it extracted is stored and read back."
    from memlab.systems.mem0 import Mem0Memory, _reply_facts
    with RealServer(work / 'server16k.log', n_ctx=16384) as srv:
        m = Mem0Memory(llm=llm(srv, work / 'mem0-16k.db', timeout=1800.0), k=3, max_tokens=256); seen = []   # 630 s measured under load
        orig = m.backend.chat
        def chat(messages, **kw): r, u = orig(messages=messages, **kw); seen.append(r.content or ''); return r, u
        m.backend.chat = chat
        (sid, err, st, sec), = add_each(m, srv, 'mem0-16k', SESSIONS[:1])
    assert err is None and st == [200] and m.usage.calls == 1 and m.usage.input_tokens > 8192, (err, st, m.usage)
    facts = _reply_facts(seen[0])                                                  # what the model extracted, as mem0 parses it
    assert m.n_units == len(set(facts)) == len(m.readback(['a'])), (seen, m.n_units)   # {} from SmolLM2: nothing, and no error
    print(f'[mem0-16k] reply {seen[0]!r}: {len(facts)} facts, {m.n_units} memories, {sec:.0f} s, {m.usage.input_tokens} prompt tokens')
