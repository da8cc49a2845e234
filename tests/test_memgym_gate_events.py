"""MemGym III compression events (issue 27 §1): extraction from MemGym II's stored steps (toy and dialogue runs) and MemGym I's
traces, Table 9's six perturbations (each changes what it claims and nothing else, seeded, the original untouched, None when it
cannot act), the repository's v2 serialization, and the grouped split / JSONL export that never leaks a group."""
import dataclasses, json, re
from pathlib import Path
import pytest
from memlab.runner import RunConfig, run, load_dataset
from memlab.store import ResultsStore
from memlab.protocols.memgym.contract import repair_tool_call_pairs
from memlab.protocols.memgym.envs.episode import evidence_messages
from memlab.protocols.memgym.protocol import memgym_dr_dataset, rebuild_context
from memlab.protocols.memgym.gate.events import (CompressionEvent, events_from_store, events_from_rollout, events_from_trace, PERTURBATIONS,
                                                 perturb, redaction_values, sentences, PATH_RE, serialize_v2, ACTION_JUDGMENT_TEMPLATE,
                                                 RESPONSE_PREFIX, grouped_split, export_jsonl, forgotten_messages)

PROMPTS = Path(__file__).resolve().parents[1] / '..' / 'shared' / 'docs' / 'protocol-prompts.md'


def _env_run(tmp, env, n, strategy, agent, step_limit):
    ds = {'kind': 'memgym-env', 'env': env, 'n': n, 'seed': 0, 'step_limit': step_limit, **({'task_args': {'pages': 6}} if env == 'toy-counter' else {})}
    cfg = RunConfig(name=env, section='memgym-envs', dataset=ds, policies=[{'name': 'memgym-agent', 'agent': agent}],
                    memories=[{'name': 'memgym-env', 'strategy': strategy}], conditions=[{'evidence': 'episode'}], max_steps=step_limit + 2,
                    judge={'name': 'memgym-env'})
    insts = load_dataset(ds)
    return run(cfg, insts, tmp / env, progress=False), {q.id: q for i in insts for q in i.queries}


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
    return _env_run(tmp_path_factory.mktemp('toy'), 'toy-counter', 2, {'name': 'llm-summarizing', 'max_size': 6, 'max_tokens': None},
                    {'name': 'offline-toy', 'window_tokens': 300}, 12)


@pytest.fixture(scope='module')
def dialogue(tmp_path_factory):
    return _env_run(tmp_path_factory.mktemp('dlg'), 'dialogue', 1, {'name': 'llm-summarizing', 'max_size': 8, 'max_tokens': None},
                    {'name': 'offline-dialogue'}, 40)


def _check_against_steps(st, events):
    "Each event equals what the stored steps hold: the view before, the view after, the next action, the future."
    by_id = {r.rollout_id: [s for s in r.trajectory.steps if s.kind == 'search'] for r in st.rollout_records()}
    expected = sum(sum(1 for s in steps[:-1] if s.meta['context'].get('was_compacted')) for steps in by_id.values())
    assert len(events) == expected > 0
    for e in events:
        rid, k = e.event_id.split('@'); k = int(k); steps = by_id[rid]
        assert steps[k].meta['context']['was_compacted'] and e.step == steps[k].meta['step']
        assert e.compressed == evidence_messages(steps[k].observation)
        assert e.context_before[:-2] == evidence_messages(steps[k - 1].observation) and e.context_before[-2]['role'] == 'assistant'
        assert e.context_before[-1]['content'] == steps[k].meta['observation']
        assert e.action == {k2: steps[k + 1].meta['action'][k2] for k2 in ('name', 'arguments')}
        assert e.future[0] == e.action and len(e.future) == len(steps) - k - 1
        assert e.resolved == (steps[-1].meta['reward'] >= 0.5)
        assert e.forgotten == forgotten_messages(e.context_before, e.compressed) and e.forgotten
        assert e.summary == steps[k].meta['context']['condensation_event']['summary_text'] and any(e.summary in (m['content'] or '') for m in e.compressed)


def test_toy_run_events_are_the_stored_compactions(toy):
    st, qs = toy
    ev = events_from_store(st, qs)
    _check_against_steps(st, ev)
    assert {e.group for e in ev} == {'toy-counter/toy'} and {e.strategy for e in ev} == {'llm-summarizing'}
    e = ev[0]
    assert e.spec['strategy'] == {'name': 'llm-summarizing', 'max_size': 6, 'max_tokens': None} and e.spec['agent'] == {'name': 'offline-toy', 'window_tokens': 300}
    q = qs[st.rollout_records()[0].query_id]
    assert (e.spec['env'], e.spec['seed'], e.spec['options'], e.spec['step_limit'], e.spec['apply_to']) == ('toy-counter', q.meta['seed'], q.meta['options'], 12, 'agent')
    assert 'seed' not in events_from_store(st)[0].spec                                    # without the queries: what the store holds
    last = [s for s in st.rollout_records()[0].trajectory.steps if s.kind == 'search'][-1]
    assert last.meta['context']['was_compacted'] and not any(x.step == last.meta['step'] for x in ev)   # no action follows the last step


def test_dialogue_run_events(dialogue):
    st, qs = dialogue
    ev = events_from_store(st, qs)
    _check_against_steps(st, ev)
    dom = [s for s in st.rollout_records()[0].trajectory.steps if s.kind == 'search'][-1].meta['domain']
    assert {e.group for e in ev} == {f'dialogue/{dom}'} and dom


def test_an_empty_trajectory_gives_no_event_and_a_non_episode_is_refused(toy):
    st, _ = toy
    r = st.rollout_records()[0]
    assert events_from_store(st) and not events_from_rollout(r.model_copy(update={'trajectory': r.trajectory.model_copy(update={'steps': []})}))
    bad = r.model_copy(update={'trajectory': r.trajectory.model_copy(update={'steps': r.trajectory.steps[1:]})})
    with pytest.raises(ValueError, match='not the reset'): events_from_rollout(bad)


def test_memgym_i_trace_events(tmp_path):
    insts = memgym_dr_dataset(n=1, hops=[4], budget_tokens=10_000)
    cfg = RunConfig(name='dr', section='memgym', dataset={'kind': 'memgym-dr', 'n': 1, 'hops': [4], 'budget_tokens': 10_000},
                    policies=[{'name': 'memgym-answer'}],
                    memories=[{'name': 'memgym-context', 'strategy': {'name': s, 'max_size': 3, 'max_tokens': 2500}, 'trigger_size': 3, 'trigger_tokens': 2500}
                              for s in ('llm-summarizing', 'sliding-window')])
    st = run(cfg, insts, tmp_path / 's', progress=False)
    for r in st.rollout_records():
        trace = next(u.meta['trace'] for s in r.trajectory.steps for u in s.observation if u.meta.get('kind') == 'notes')
        ev = events_from_trace(r, insts[0], score=0.0)
        assert [e.step for e in ev] == [k for k, t in enumerate(trace) if t.get('was_compacted')] and ev
        for e in ev:
            assert e.action == {'name': 'answer', 'arguments': {'text': r.answer}} and e.future == [e.action] and e.resolved is False
            assert e.compressed == rebuild_context(insts[0], trace, e.step) and e.env == 'memgym-dr' and e.strategy == trace[0]['strategy']
            assert e.context_before[-1]['content'] == '\n\n'.join(t.content for t in insts[0].sessions[e.step].turns)
        assert events_from_trace(r, insts[0])[0].resolved is None


# ---- perturbations -------------------------------------------------------------------------------------------------------------

S = ('Read pkg/orders.py and tests/test_orders.py. The total was 240 for order A17. Tests failed twice.\n'
     'Next: fix discount in pricing.py. User is Dana Reyes. Budget 9 units.')
CALL = {'role': 'assistant', 'content': '', 'tool_calls': [{'id': 'call_9', 'type': 'function', 'function': {'name': 'read_file', 'arguments': '{"path": "x"}'}}]}


def hand(**kw):
    d = dict(event_id='run1@9', group='coding/shop', env='coding', strategy='llm-summarizing', task_id='coding-0-0', step=9,
             context_before=[{'role': 'user', 'content': 'Fix the bug.'}] + [{'role': 'tool', 'content': f'old {i}'} for i in range(14)],
             compressed=[{'role': 'user', 'content': 'Fix the bug.'}, {'role': 'user', 'content': '[Summary] ' + S}]
                        + [{'role': 'tool', 'content': f'obs {i}'} for i in range(10)] + [CALL, {'role': 'tool', 'tool_call_id': 'call_9', 'content': 'src'}],
             action={'name': 'edit_file', 'arguments': {'path': 'pkg/pricing.py', 'old': 'x', 'new': 'y'}},
             future=[{'name': 'edit_file', 'arguments': {'path': 'pkg/pricing.py', 'old': 'x', 'new': 'y'}},
                     {'name': 'submit', 'arguments': {'order': 'A17', 'total': 240, 'note': 'apply code SAVE10 to pkg/orders.py now please'}}],
             summary=S, resolved=True, labels={'outcome': 1})
    d.update(kw); return CompressionEvent(**d)


def _only_summary_changed(e, p):
    assert p.compressed[0] == e.compressed[0] and p.compressed[2:] == e.compressed[2:]
    assert p.compressed[1]['content'] == '[Summary] ' + p.summary and p.summary != e.summary
    assert (p.context_before, p.action, p.future, p.group, p.step, p.task_id, p.resolved) == (e.context_before, e.action, e.future, e.group, e.step, e.task_id, e.resolved)


@pytest.mark.parametrize('name', sorted(PERTURBATIONS))
def test_each_perturbation_is_seeded_pure_and_marks_its_counterpart(name):
    e = hand(); snap = json.dumps(dataclasses.asdict(e), sort_keys=True)
    p = perturb(e, name, 3)
    assert p == perturb(e, name, 3) and p.compressed != e.compressed
    assert (p.perturbation, p.seed, p.source, p.event_id, p.labels, p.predicted) == (name, 3, 'run1@9', f'run1@9:{name}', {}, None)
    assert json.dumps(dataclasses.asdict(e), sort_keys=True) == snap                              # the original is unchanged
    assert p.forgotten == forgotten_messages(e.context_before, p.compressed)
    with pytest.raises(ValueError): perturb(p, name, 0)                                         # a counterpart is not perturbed again


def test_seeds_draw_differently():
    e = hand()
    assert len({perturb(e, 'aggressive_0.5', s).summary for s in range(5)}) == 5
    assert len({perturb(e, 'random_drop_0.2', s).summary for s in range(8)}) > 1


def test_aggressive_noises_half_the_summary_tokens_and_nothing_else():
    e = hand(); p = perturb(e, 'aggressive_0.5', 0)
    _only_summary_changed(e, p)
    a, b = e.summary.split(), p.summary.split()
    assert len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == round(0.5 * len(a))
    assert all(y == '_' or (y.isalpha() and len(y) == len(x)) for x, y in zip(a, b) if x != y)


def test_random_drop_removes_a_fifth_of_the_sentences_keeping_the_rest_in_order():
    e = hand(); p = perturb(e, 'random_drop_0.2', 0)
    _only_summary_changed(e, p)
    before, after = sentences(e.summary), sentences(p.summary)
    assert len(before) == 6 and len(after) == len(before) - round(0.2 * len(before))
    it = iter(before); assert all(s in it for s in after)                                           # a subsequence
    assert perturb(hand(summary='One sentence only', compressed=[{'role': 'user', 'content': 'T'}, {'role': 'user', 'content': '[Summary] One sentence only'}]),
                   'random_drop_0.2', 0) is None


def test_attr_delete_paths_removes_exactly_the_paths():
    e = hand(); p = perturb(e, 'attr_delete_paths', 0)
    _only_summary_changed(e, p)
    assert p.summary == e.summary.replace('pkg/orders.py', '').replace('tests/test_orders.py', '').replace('pricing.py', '')
    assert not PATH_RE.search(p.summary)
    assert perturb(hand(summary='No locator here.', compressed=[{'role': 'user', 'content': 'T'}, {'role': 'user', 'content': '[Summary] No locator here.'}]),
                   'attr_delete_paths', 0) is None


def test_redaction_removes_exactly_the_values_the_later_trajectory_uses():
    e = hand()
    assert set(redaction_values(e.future)) == {'pkg/pricing.py', 'A17', '240', 'SAVE10', 'pkg/orders.py'}   # 'x', 'y': too short; the long note: its entities
    p = perturb(e, 'summary_redaction', 0)
    _only_summary_changed(e, p)
    assert p.summary == S.replace('pkg/orders.py', '[REDACTED]').replace('240', '[REDACTED]').replace('A17', '[REDACTED]')
    assert '9 units' in p.summary and 'pricing.py' in p.summary                                     # not used later, or not the later value as a whole
    assert perturb(hand(future=[{'name': 'submit', 'arguments': {'total': 999}}]), 'summary_redaction', 0) is None


def test_noise_changes_numbers_paths_and_outcomes_only():
    e = hand(); p = perturb(e, 'summary_noise', 0)
    _only_summary_changed(e, p)
    a, b = e.summary.split(), p.summary.split()
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if x == y: continue
        assert re.search(r'\d', x) or PATH_RE.search(x) or x.rstrip('.') in ('failed', 'passed'), (x, y)
    assert '240' not in p.summary and 'passed twice' in p.summary and 'pkg/orders.py' not in p.summary
    assert len(re.findall(r'\d+', p.summary)) == len(re.findall(r'\d+', e.summary))
    assert perturb(hand(summary='Nothing to alter here', compressed=[{'role': 'user', 'content': 'T'}, {'role': 'user', 'content': '[Summary] Nothing to alter here'}]),
                   'summary_noise', 0) is None


def test_truncate_last_10_drops_the_tail_and_stays_api_valid():
    e = hand(); p = perturb(e, 'truncate_last_10', 0)
    assert p.compressed == repair_tool_call_pairs(e.compressed[:-10]) == e.compressed[:2] and p.summary == e.summary
    e2 = hand(compressed=e.compressed[:1] + [CALL, {'role': 'tool', 'tool_call_id': 'call_9', 'content': 'src'}] + [{'role': 'tool', 'content': 'o'}] * 9)
    p2 = perturb(e2, 'truncate_last_10', 0)                    # the cut separates a call from its result: the call is stripped
    assert p2.compressed[1]['content'] == '(continued)' and 'tool_calls' not in p2.compressed[1] and len(p2.compressed) == 2
    short = hand(compressed=[{'role': 'user', 'content': 'T'}, {'role': 'user', 'content': '[Summary] s'}])
    assert perturb(short, 'truncate_last_10', 0).compressed == short.compressed[:1] and perturb(short, 'truncate_last_10', 0).summary == ''
    assert perturb(hand(compressed=[{'role': 'user', 'content': 'T'}]), 'truncate_last_10', 0) is None


def test_a_view_without_summary_is_perturbed_after_its_head():
    w = hand(summary='', strategy='sliding-window', compressed=[{'role': 'user', 'content': 'Fix the bug.'}, {'role': 'tool', 'content': 'total 240 for A17. tests failed.'}])
    for name in ('aggressive_0.5', 'summary_redaction', 'summary_noise'):
        p = perturb(w, name, 0)
        assert p.compressed[0] == w.compressed[0] and p.compressed[1]['content'] != w.compressed[1]['content'] and p.summary == ''
    assert perturb(w, 'attr_delete_paths', 0) is None


def test_toy_events_get_counterparts(toy):
    st, qs = toy
    ev = events_from_store(st, qs)
    got = {n: [perturb(e, n, 0) for e in ev] for n in PERTURBATIONS}
    assert all(p is None for p in got['attr_delete_paths'])                                        # the toy's summaries name no file
    assert all(p is not None and '[REDACTED]' in p.summary for p in got['summary_redaction'])      # the submitted number is in every summary
    assert all(p is not None for n in ('aggressive_0.5', 'random_drop_0.2', 'summary_noise', 'truncate_last_10') for p in got[n])


# ---- serialization and export --------------------------------------------------------------------------------------------------

def test_the_template_is_the_repository_text():
    if not PROMPTS.exists(): pytest.skip('protocol-prompts.md is not beside the repository')
    doc = PROMPTS.read_text()
    block = doc[doc.index('ACTION_JUDGMENT_TEMPLATE = ('):]
    block = block[:block.index('\n)') + 2]
    assert eval(block.partition('=')[2]) == ACTION_JUDGMENT_TEMPLATE
    assert 'RESPONSE_PREFIX = "\\n\\nAnswer:"' in doc and RESPONSE_PREFIX == '\n\nAnswer:'


def test_serialize_v2_of_a_hand_made_event():
    e = CompressionEvent('r@3', 'g', 'toy-counter', 'llm-summarizing', 't', 3, [],
                         [{'role': 'user', 'content': 'Task.'}, {'role': 'user', 'content': '[Summary] n=100.'},
                          {'role': 'assistant', 'content': 'ok'}, {'role': 'tool', 'tool_call_id': 'c', 'content': 'page 3'}, {'role': 'user', 'content': 'more'}],
                         {'name': 'submit', 'arguments': {'number': 100}}, [])
    rec = '{"name":"submit","arguments":{"number":100}}'
    ask = ACTION_JUDGMENT_TEMPLATE.format(step=3, recorded=rec, perturbation='compression', predicted=rec)
    want = '\n\n'.join(['[User]\nTask.', '[Assistant]\nok', '[Tool]\npage 3', '[User]\n[Summary] n=100.', '[User]\nmore', '[User]\n' + ask]) + '\n\nAnswer:'
    assert serialize_v2(e) == want
    p = dataclasses.replace(e, perturbation='summary_noise', predicted={'name': 'submit', 'arguments': {'number': 7}})
    ask2 = ACTION_JUDGMENT_TEMPLATE.format(step=3, recorded=rec, perturbation='summary_noise', predicted='{"name":"submit","arguments":{"number":7}}')
    assert serialize_v2(p, name_perturbation=True).endswith('[User]\n' + ask2 + '\n\nAnswer:')
    assert 'summary_noise' not in serialize_v2(p)                                                  # neutral by default


def _many():
    return [hand(event_id=f'e{i}', group=f'coding/g{i % 7}', labels={'outcome': i % 2} if i % 5 else {}) for i in range(40)]


def test_grouped_split_never_leaks_and_is_seeded():
    ev = _many(); ev += [perturb(e, 'truncate_last_10', 0) for e in ev[:10]]
    for seed in range(6):
        tr, ho = grouped_split(ev, 0.3, seed)
        assert not ({e.group for e in tr} & {e.group for e in ho}) and len(tr) + len(ho) == len(ev) and tr and ho
        side = {e.event_id: 'eval' for e in ho}
        assert all(side.get(p.event_id) == side.get(p.source) for p in ev if p.source)           # a counterpart on its parent's side
        assert [e.event_id for e in grouped_split(ev, 0.3, seed)[1]] == [e.event_id for e in ho]
    assert len({tuple(e.event_id for e in grouped_split(ev, 0.3, s)[1]) for s in range(6)}) > 1
    assert grouped_split(ev[:1], 0.5, 0) == (ev[:1], [])


def test_export_jsonl_rows(tmp_path):
    ev = _many()
    c = export_jsonl(ev, tmp_path / 'x.jsonl', eval_fraction=0.3, seed=1)
    rows = [json.loads(l) for l in (tmp_path / 'x.jsonl').read_text().splitlines()]
    assert c['skipped'] == 8 and c['train'] + c['eval'] == len(rows) == 32 and c['eval'] > 0
    assert not ({r['group'] for r in rows if r['split'] == 'train'} & {r['group'] for r in rows if r['split'] == 'eval'})
    lab = {e.event_id: e.labels.get('outcome') for e in ev}
    assert all(r['completion'] == {1: ' Y', 0: ' N'}[lab[r['event_id']]] and r['prompt'] == serialize_v2(hand()) for r in rows)
    assert set(rows[0]) == {'prompt', 'completion', 'event_id', 'group', 'split'}
    assert export_jsonl(ev, tmp_path / 'y.jsonl', label_source='judge')['skipped'] == 40


def test_coding_run_groups_by_package_family(tmp_path):
    from memlab.protocols.memgym.envs.coding import build_repo
    st, qs = _env_run(tmp_path, 'coding', 1, {'name': 'llm-summarizing', 'max_size': 8, 'max_tokens': None}, {'name': 'offline-coder'}, 30)
    ev = events_from_store(st, qs)
    _check_against_steps(st, ev)
    q = next(iter(qs.values()))
    assert {e.group for e in ev} == {f"coding/{build_repo(q.meta['seed'], **q.meta['options'])['bug']['family']}"}
    assert {e.group for e in events_from_store(st)} == {e.group for e in ev}             # without the query: the family the reset step records
    assert all(len(e.spec['prefix_actions']) == e.step and e.spec['tools'] for e in ev)     # what a fork replays, from the store alone
    assert all(perturb(e, 'attr_delete_paths', 0) is not None for e in ev)                  # the summaries name files
