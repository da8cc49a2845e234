"""Reading samples (issue 12, item 5): `memlab show` prints what a researcher needs to debug one rollout, `--failed`
selects exactly the rollouts a verdict did not find CORRECT or that errored, bad input is one line and exit 2, the
explorer's filters and views follow its controls, and the inspect_ai export reads back with inspect_ai's own reader."""
import json, re, sys

import pandas as pd
import pytest

from inproc import memlab_main
from memlab.core import Trajectory
from memlab.runner import ResultsStore, RunConfig, run, score
from memlab.samples import Explorer, evidence_id, to_inspect_logs, write_inspect_logs
from memlab.synth import make_benchmark

WEAK, STRONG = 'offline-reader[tier=weak]', 'offline-reader[tier=strong]'
ERROR = 'APITimeoutError: the model did not answer within 60 s'


@pytest.fixture(scope='module')
def store(tmp_path_factory):
    "Two reader tiers over BM25, offline-judged, plus one rollout that ended in an error after its first memory call."
    bench = make_benchmark(n_instances=2, queries_per_instance=3, n_filler=4, seed=3)
    cfg = RunConfig(name='samples', section='test', dataset={'kind': 'synthetic'}, memories=[{'name': 'bm25', 'k': 5}],
                    policies=[{'name': 'offline-reader', 'tier': 'weak'}, {'name': 'offline-reader', 'tier': 'strong'}])
    st = run(cfg, bench, tmp_path_factory.mktemp('samples') / 'store', progress=False)
    score(st, bench)
    r0 = next(r for r in st.rollout_records() if r.policy == WEAK)
    st.write_rollouts([r0.model_copy(update=dict(rollout_id='errored-1', sample=1, answer=None, error=ERROR,
                                                 trajectory=Trajectory(steps=r0.trajectory.steps[:1])))])
    return st


def rollout_ids(out: str) -> list[str]:
    return re.findall(r'^rollout   (\S+) ', out, re.M)


def test_show_prints_question_gold_evidence_and_verdict(store):
    sc = store.scores()
    rid = sc.loc[sc['label'] == 'WRONG', 'rollout_id'].iloc[0]
    rec = next(r for r in store.rollout_records() if r.rollout_id == rid)
    r = memlab_main(['show', store.root, '--query', rid, '--chars', 0])
    assert r['rc'] == 0, r['out']
    out = r['out']
    assert rollout_ids(out) == [rid], out
    assert f'question  {rec.question}' in out and f"gold      {' | '.join(rec.gold)}" in out and f'answer    {rec.answer}' in out
    raw = sc.loc[sc['rollout_id'] == rid, 'raw'].iloc[0]
    assert 'label     WRONG' in out and f'verdict   offline-match (offline, prompt ' in out and f'WRONG · raw: {raw}' in out
    for s in rec.trajectory.steps:
        if s.kind != 'search': continue
        assert repr(s.query) in out
        for e in s.observation:   # every unit: rank, evidence id, date, and (with --chars 0) its whole text on one line
            assert f'#{e.rank} {evidence_id(e)} · {e.date}' in out and ' '.join(e.text.split()) in out


def test_show_by_query_gives_every_system(store):
    q = store.rollout_records()[0].query_id
    ro = store.rollouts()
    out = memlab_main(['show', store.root, '--query', q, '--limit', 50])['out']
    assert sorted(rollout_ids(out)) == sorted(ro.loc[ro['query_id'] == q, 'rollout_id'])


def test_failed_selects_only_non_correct_or_errored(store):
    r = memlab_main(['show', store.root, '--failed', '--limit', 100])
    assert r['rc'] == 0, r['out']
    sc, ro = store.scores(), store.rollouts()
    expected = set(sc.loc[sc['label'] != 'CORRECT', 'rollout_id']) | set(ro.loc[ro['error'].notna(), 'rollout_id'])
    assert 'errored-1' in expected and len(expected) < len(ro)
    got = rollout_ids(r['out'])
    assert len(got) == len(set(got)) and set(got) == expected
    assert 'label     CORRECT' not in r['out']


def test_limit_caps_what_is_printed(store):
    out = memlab_main(['show', store.root, '--limit', 2])['out']
    assert len(rollout_ids(out)) == 2 and out.rstrip().endswith('--limit N shows more')


def test_errored_rollout_is_shown_with_its_error(store):
    out = memlab_main(['show', store.root, '--query', 'errored-1'])['out']
    assert rollout_ids(out) == ['errored-1']
    assert f'error     {ERROR}' in out and 'label     error' in out and 'answer    (none)' in out
    assert 'step 1 · memory call' in out and 'step 2' not in out


@pytest.mark.parametrize('args,says', [
    (['show', '{s}', '--query', 'nosuch'], "no rollout of query 'nosuch'"),
    (['show', '{s}/../no-such-store'], 'no such store'),
    (['show', '{s}', '--judge', 'nosuch'], "no verdicts by judge 'nosuch'"),
    (['export-inspect', '{s}/../no-such-store', '{s}/../logs'], 'no such store'),
    (['show', '{s}', '--chars', '-1'], 'must be a count (0 or more)'),
])
def test_bad_input_is_one_line_and_exit_2(store, args, says):
    r = memlab_main([a.format(s=store.root) for a in args])
    assert r['rc'] == 2 and says in r['err'] and 'Traceback' not in r['out'], r['out']
    if not r['err'].startswith('usage:'): assert r['err'].count('\n') == 1, r['err']


def test_explorer_filters_steps_and_compares(store):
    ex = Explorer(store)
    n = len(store.rollouts())
    assert ex.count.value == f'{n} of {n} rollouts'
    ex.policy.value = STRONG
    assert ex.rollout.options and all(f'· {STRONG} ·' in lab for lab, _ in ex.rollout.options)
    assert STRONG in ex.view.value and WEAK not in ex.view.value
    ex.policy.value, ex.label.value = WEAK, 'WRONG'
    sc = store.scores()
    wrong_weak = set(sc.loc[sc['label'] == 'WRONG', 'rollout_id']) & set(store.rollouts().query('policy == @WEAK')['rollout_id'])
    assert {rid for _, rid in ex.rollout.options} == wrong_weak and 'WRONG' in ex.view.value
    ex.label.value = 'error'
    assert [rid for _, rid in ex.rollout.options] == ['errored-1'] and ERROR in ex.view.value
    ex.label.value = '(all)'
    ex.rollout.value = next(rid for rid in wrong_weak)
    before = ex.view.value
    ex.next.click()
    assert ex.step.value == 2 and ex.view.value != before
    ex.system_a.value, ex.system_b.value = f'{WEAK} · bm25[k=5]', f'{STRONG} · bm25[k=5]'
    ex.differ.value = True
    assert ex.query.options, 'the tiers disagree on some query'
    i, q = ex.query.value
    ro = store.rollouts()
    for rid in ro.loc[(ro['instance_id'] == i) & (ro['query_id'] == q), 'rollout_id']: assert rid in ex.compare_view.value


def test_inspect_log_reads_back_with_inspect_ai(store, tmp_path):
    pytest.importorskip('inspect_ai', reason='the optional inspect_ai package (memlab[inspect]) is not installed')
    from inspect_ai.log import read_eval_log
    r = memlab_main(['export-inspect', store.root, tmp_path / 'logs'])
    assert r['rc'] == 0 and 'wrote 2 inspect_ai log(s)' in r['out'], r['out']
    logs = [read_eval_log(str(p)) for p in sorted((tmp_path / 'logs').glob('*.eval'))]
    assert sorted(l.eval.model for l in logs) == [STRONG, WEAK]
    recs = {r.rollout_id: r for r in store.rollout_records()}
    labels = store.scores().set_index('rollout_id')['label'].to_dict()
    seen = set()
    for log in logs:
        assert log.eval.task == 'samples' and log.eval.eval_set_id == store.manifest()['config_hash']
        judged = [s for s in log.samples if s.scores]
        acc = log.results.scores[0].metrics['accuracy'].value
        assert acc == pytest.approx(sum(s.scores['offline-match'].value == 'C' for s in judged) / len(judged))
        for s in log.samples:
            rec = recs[s.uuid]; seen.add(s.uuid)
            assert rec.policy == log.eval.model and (s.id, s.epoch) == (rec.query_id, rec.sample + 1)
            assert (s.input, s.target) == (rec.question, rec.gold)
            searches = [st for st in rec.trajectory.steps if st.kind == 'search']
            tools = [m for m in s.messages if m.role == 'tool']
            assert [m.role for m in s.messages][0] == 'user' and len(tools) == len(searches)
            for m, st in zip(tools, searches):
                assert all(e.text in m.text for e in st.observation)
            if rec.error:
                assert s.error.message == rec.error and not s.scores
            else:
                assert s.output.completion == rec.answer
                assert s.scores['offline-match'].value == {'CORRECT': 'C', 'WRONG': 'I'}[labels[s.uuid]]
    assert seen == set(recs)


def test_missing_inspect_ai_names_the_extra(store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'inspect_ai', None)      # as if the extra were not installed
    with pytest.raises(ImportError, match=re.escape("pip install 'memlab[inspect]'")): to_inspect_logs(store)
    with pytest.raises(ImportError, match='memlab.inspect'): write_inspect_logs(store, tmp_path / 'logs')
    r = memlab_main(['export-inspect', store.root, tmp_path / 'logs'])
    assert r['rc'] == 1 and r['err'].count('\n') == 1 and "pip install 'memlab[inspect]'" in r['err'], r['out']
    assert not (tmp_path / 'logs').exists()


def test_show_filters_by_policy_and_memory(store):
    "`--policy` / `--memory` keep exactly that system's rollouts (issue 25: show could not filter by them)."
    ro = store.rollouts()
    for args, keep in ((['--policy', WEAK], ro['policy'] == WEAK), (['--memory', 'bm25[k=5]', '--policy', STRONG], ro['policy'] == STRONG)):
        out = memlab_main(['show', store.root, *args, '--limit', 100])
        assert out['rc'] == 0, out['out']
        assert sorted(rollout_ids(out['out'])) == sorted(ro.loc[keep, 'rollout_id']), out['out']


def test_inspect_log_has_duration_and_tokens(store, tmp_path):
    "The export showed duration 0.0 s and no tokens: a log's duration is its rollouts' times, its usage their tokens."
    pytest.importorskip('inspect_ai', reason='the optional inspect_ai package (memlab[inspect]) is not installed')
    from memlab.core import Usage
    recs = [r for r in store.rollout_records() if r.policy == STRONG]
    st = ResultsStore(tmp_path / 'u')
    st.write_rollouts([r.model_copy(update=dict(usage=Usage(input_tokens=100, output_tokens=20, calls=2))) for r in recs])
    [log] = to_inspect_logs(st)
    secs = (pd.Timestamp(log.stats.completed_at) - pd.Timestamp(log.stats.started_at)).total_seconds()
    assert secs == pytest.approx(sum(r.timings['total_s'] for r in recs), abs=1e-3) and secs > 0
    u = log.stats.model_usage[STRONG]
    assert (u.input_tokens, u.output_tokens) == (100 * len(recs), 20 * len(recs))
    assert all(s.total_time == r.timings['total_s'] for s, r in zip(sorted(log.samples, key=lambda s: s.uuid), sorted(recs, key=lambda r: r.rollout_id)))


def test_long_context_evidence_names_its_first_session(tmp_path):
    "A long-context window's text starts at its first session: the header names first and last, not only the last's date."
    bench = make_benchmark(n_instances=1, queries_per_instance=2, n_filler=4, seed=3)
    cfg = RunConfig(name='lc', section='test', dataset={'kind': 'synthetic'}, memories=[{'name': 'long-context', 'window_tokens': 100000}],
                    policies=[{'name': 'offline-reader', 'tier': 'strong'}])
    st = run(cfg, bench, tmp_path / 'lc', progress=False)
    rec = st.rollout_records()[0]
    [ev] = [e for s in rec.trajectory.steps if s.kind == 'search' for e in s.observation][:1]
    ids = ev.meta['session_ids']
    assert len(ids) > 1 and ev.text.startswith('### Session 1:')
    out = memlab_main(['show', st.root, '--query', rec.rollout_id])['out']
    assert f'#0 window of {len(ids)} sessions {ids[0]} … {ids[-1]} · last session {ev.date}' in out, out
