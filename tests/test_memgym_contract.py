"""MemGym's tool-call repair invariant (seed 004 §3.2: no compression may produce an API-invalid message sequence), as a
property test: for any message sequence with tool calls and any compression of it (dropped messages, masked contents,
inserted summaries, or a registered strategy's manage_context), `repair_tool_call_pairs` yields a sequence with no
orphaned tool result and no unanswered tool call; both loopback servers accept every repaired sequence and refuse the
invalid ones with the real APIs' errors.
"""
import json, os
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from loopback import LoopbackServer, tool_sequence_error
from memlab.llm import to_anthropic
from memlab.protocols.memgym.contract import repair_tool_call_pairs, api_valid, MANAGERS, make_manager
import memlab.protocols.memgym.strategies  # noqa: F401  (registers every strategy the invariant is checked on)


@st.composite
def histories(draw, max_blocks=8):
    "A valid chat history: user turns, plain assistant replies, and assistant tool calls each followed by their results."
    out, n = [{'role': 'system', 'content': 'You are a research agent.'}], 0
    for b in range(draw(st.integers(1, max_blocks))):
        kind = draw(st.sampled_from(['user', 'assistant', 'tools']))
        if kind == 'user': out.append({'role': 'user', 'content': f'observation {b}'})
        elif kind == 'assistant': out.append({'role': 'assistant', 'content': f'thought {b}'})
        else:
            ids = [f'call_{n + i}' for i in range(draw(st.integers(1, 3)))]; n += len(ids)
            out.append({'role': 'assistant', 'content': draw(st.sampled_from(['', 'searching'])),
                        'tool_calls': [{'id': i, 'type': 'function', 'function': {'name': 'search', 'arguments': '{"q": "x"}'}} for i in ids]})
            out += [{'role': 'tool', 'tool_call_id': i, 'content': f'result of {i}'} for i in ids]
    return out


@st.composite
def compressed(draw):
    "A history and an arbitrary compression of it: messages dropped, contents masked, summaries inserted."
    h = draw(histories())
    keep = draw(st.lists(st.booleans(), min_size=len(h), max_size=len(h)))
    out = []
    for m, k in zip(h, keep):
        if not k: continue
        m = dict(m)
        if m['role'] in ('tool', 'user') and draw(st.booleans()): m['content'] = '<MASKED: observation too old>'
        out.append(m)
        if draw(st.integers(0, 9)) == 0: out.append({'role': 'user', 'content': '[Summary] what happened so far'})
    return h, out


@settings(max_examples=400, deadline=None)
@given(compressed())
def test_repair_leaves_no_orphan_result_and_no_unanswered_call(hc):
    h, c = hc
    assert api_valid(h) is None                                   # the generator writes valid histories
    r = repair_tool_call_pairs(c)
    assert api_valid(r) is None, (c, r)
    assert repair_tool_call_pairs(r) == r                         # idempotent: a valid sequence is left as it is
    assert [m for m in r if m['role'] == 'user'] == [m for m in c if m['role'] == 'user']   # only tool pairing changes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(max_blocks=14), st.sampled_from(sorted(MANAGERS)))
def test_every_registered_strategy_keeps_the_invariant(h, name):
    m = make_manager(name, **({'max_size': 4} if 'max_size' in MANAGERS[name].__init__.__code__.co_varnames else {}))
    m.reset()
    for k in range(1, len(h) + 1):
        f = m.manage_context(h[:k], h[k - 1], {'step': k})
        assert api_valid(f.content, pending_tool_ids=_pending(h[:k])) is None, (name, f.content)


def _pending(h):
    "Ids of the last assistant message's calls whose results have not all arrived yet (the history is cut mid-block)."
    i = max((j for j, m in enumerate(h) if m['role'] == 'assistant'), default=None)
    return [c['id'] for c in h[i].get('tool_calls') or []] if i is not None else []


@pytest.fixture(scope='module')
def servers():
    with LoopbackServer('openai') as o, LoopbackServer('anthropic') as a: yield o, a


def _send(srv, kind, messages):
    import urllib.request
    if kind == 'openai': body, path, hdr = {'model': 'm', 'messages': messages}, '/v1/chat/completions', {'Authorization': 'Bearer k'}
    else:
        conv = to_anthropic([m for m in messages if m['role'] != 'system'], None)
        body, path, hdr = {'model': 'm', 'max_tokens': 8, **conv}, '/v1/messages', {'x-api-key': 'k', 'anthropic-version': '2023-06-01'}
    req = urllib.request.Request(srv.root + path, data=json.dumps(body).encode(), headers={'Content-Type': 'application/json', **hdr})
    try:
        with urllib.request.urlopen(req, timeout=10) as r: return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(compressed())
def test_loopback_servers_accept_repaired_and_refuse_invalid_sequences(servers, hc):
    _, c = hc
    r = repair_tool_call_pairs(c)
    for srv, kind in zip(servers, ('openai', 'anthropic')):
        assert _send(srv, kind, r)[0] == 200
        if api_valid(c) is not None:
            status, err = _send(srv, kind, c)
            assert status == 400 and 'tool' in json.dumps(err), (kind, c, err)


def test_the_servers_errors_are_the_real_apis():
    call = {'role': 'assistant', 'content': '', 'tool_calls': [{'id': 'call_1', 'type': 'function', 'function': {'name': 's', 'arguments': '{}'}}]}
    assert "must be followed by tool messages responding to each 'tool_call_id'" in tool_sequence_error('openai', [{'role': 'user', 'content': 'q'}, call])
    assert "must be a response to a preceeding message with 'tool_calls'" in tool_sequence_error('openai', [{'role': 'tool', 'tool_call_id': 'x', 'content': 'r'}])
    conv = to_anthropic([{'role': 'user', 'content': 'q'}, call, {'role': 'user', 'content': 'go on'}], None)['messages']
    assert '`tool_use` ids were found without `tool_result` blocks immediately after' in tool_sequence_error('anthropic', conv)
