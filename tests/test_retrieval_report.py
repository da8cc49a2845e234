"""Memory metrics that need no model (`memlab.retrieval`, `memlab report STORE --retrieval`) and the reader's ceiling line.

- reach (evidence recall of the memory's own search) and preservation (evidence recall under a gold-evidence setting,
  `readback`) match a hand count: a long-context window that evicted evidence sessions preserves < 1, bm25 keeps 1.0;
- a split history's units map back to their sessions; abstention questions are skipped and counted;
- the gold evidence is reloaded from the store's dataset spec and checked against the manifest's hash;
- `memlab report` prints the ceiling line first on a real-format file the offline reader reads badly (LoCoMo fixture,
  SubtleMemory excerpt) and not on a store whose gold-evidence accuracy is >= 0.90.
"""
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from inproc import memlab_main
from memlab.core import count_tokens
from memlab.memory import chunk_session
from memlab.retrieval import (is_gold, retrieval_report, memory_table, gold_ceiling, reader_ceiling_line, store_instances,
                              CEILING)
from memlab.runner import RunConfig, StoreError, load_dataset, results_frame, run, score

FIXTURES = Path(__file__).parent / 'fixtures'
EXCERPT = Path(__file__).resolve().parents[2] / 'shared' / 'fixtures' / 'subtlememory'
SPEC = {'kind': 'synthetic', 'params': {'n_instances': 3, 'queries_per_instance': 5, 'n_filler': 8, 'seed': 2}}
WINDOW, CHUNK = 600, 64
POLICY = [{'name': 'offline-reader', 'tier': 'strong'}]
BOTH = [{'evidence': 'search'}, {'evidence': 'readback'}]


def make_store(path, spec=SPEC, memories=None, conditions=BOTH, history=None, policies=POLICY):
    insts = load_dataset(spec)
    cfg = RunConfig(name=Path(path).name, section='test', dataset=spec, policies=policies, conditions=conditions,
                    memories=memories or [{'name': 'bm25', 'k': 3}, {'name': 'long-context', 'window_tokens': WINDOW, 'chunk_tokens': CHUNK}],
                    **({'history': history} if history else {}))
    st = run(cfg, insts, path, progress=False)
    score(st, insts)
    return st, insts


@pytest.fixture(scope='module')
def synth(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp('ret') / 'synth')


def kept(inst):
    "Sessions with a chunk left in the long-context window after FIFO eviction (a replay of the window by hand)."
    chunks = [(s.id, count_tokens(c)) for s in inst.sessions for c in chunk_session(s, CHUNK)]
    while sum(n for _, n in chunks) > WINDOW: chunks.pop(0)
    return {sid for sid, _ in chunks}


def answerable(insts):
    return [(i, q) for i in insts for q in i.queries if q.evidence and not q.abstention]


def test_reach_and_preservation_match_a_hand_count(synth):
    st, insts = synth
    t = retrieval_report(st)
    assert set(t['setting']) == {'search', 'readback'} and t.loc[t['setting'] == 'readback', 'gold'].all()
    qs = answerable(insts)
    n_abs = sum(q.abstention for i in insts for q in i.queries)
    assert n_abs > 0 and (t['n'] == len(qs)).all() and (t['skipped_abstention'] == n_abs).all()
    hand = sum(len(set(q.evidence) & kept(i)) / len(q.evidence) for i, q in qs) / len(qs)
    mt = memory_table(t).set_index('memory')
    lc = mt.loc[[m for m in mt.index if m.startswith('long-context')][0]]
    assert hand < 1                                       # the window evicted evidence sessions of some queries
    assert lc['preservation'] == pytest.approx(hand) and lc['reach'] == pytest.approx(hand)   # the window returns all it holds
    assert mt.loc['bm25[k=3]', 'preservation'] == 1.0 and lc['n_preservation'] == len(qs)
    # bm25's reach: by hand from each rollout's search step (top-3 units, their sessions)
    ro = st.rollouts()
    ev = {(i.id, q.id): set(q.evidence) for i, q in qs}
    recalls = []
    for r in ro[(ro['memory'] == 'bm25[k=3]') & ro['condition'].str.contains('search')].itertuples():
        if (r.instance_id, r.query_id) not in ev: continue
        got = {e['session_id'] for s in json.loads(r.trajectory)['steps'] if s['kind'] == 'search' for e in s['observation']}
        recalls.append(len(got & ev[(r.instance_id, r.query_id)]) / len(ev[(r.instance_id, r.query_id)]))
    assert len(recalls) == len(qs) and mt.loc['bm25[k=3]', 'reach'] == pytest.approx(sum(recalls) / len(recalls))


def test_split_units_count_as_their_sessions(tmp_path):
    st, insts = make_store(tmp_path / 'split', memories=[{'name': 'bm25', 'k': 3}], conditions=[{'evidence': 'readback'}],
                           history={'name': 'split', 'unit': 'message'})
    ro = st.rollouts()
    units = {e['session_id'] for t in ro['trajectory'] for s in json.loads(t)['steps'] for e in s.get('observation') or []}
    assert units and all('#' in u for u in units)         # the memory stored message units, not sessions
    t = retrieval_report(st)
    assert t['preservation'].tolist() == [1.0]


def test_gold_settings_are_flagged():
    import memlab.protocols.subtle.answer  # noqa: F401  (registers the oracle setting)
    assert is_gold('readback') and is_gold('subtlememory-oracle')
    assert not is_gold('search') and not is_gold('no-such-setting')


def test_gold_evidence_comes_from_the_stores_dataset(tmp_path):
    spec = {'kind': 'instances', 'path': str(tmp_path / 'insts.jsonl')}
    insts = load_dataset(SPEC)[:1]
    Path(spec['path']).write_text(''.join(i.model_dump_json() + '\n' for i in insts))
    st, _ = make_store(tmp_path / 'inst', spec=spec, memories=[{'name': 'bm25', 'k': 3}])
    assert [i.id for i in store_instances(st)] == [insts[0].id]
    changed = insts[0].model_copy(update={'queries': insts[0].queries[:1]})
    Path(spec['path']).write_text(changed.model_dump_json() + '\n')
    with pytest.raises(StoreError, match='sha256 differs'): retrieval_report(st)
    r = memlab_main(['report', st.root, '--retrieval'])
    assert r['rc'] == 2 and 'sha256 differs' in r['err'] and r['err'].count('\n') == 1, r
    assert len(retrieval_report(st, instances=insts)) == 2


def test_report_retrieval_prints_and_writes_the_table(synth, tmp_path):
    st, _ = synth
    r = memlab_main(['report', st.root, '--retrieval', '--csv', tmp_path / 'r.csv'])
    assert r['rc'] == 0, r
    lines = r['out'].splitlines()
    assert lines[0].startswith('retrieval (no model)')
    head = lines[1].split()
    assert head[:3] == ['policy', 'memory', 'setting'] and {'recall_all@5', 'ndcg_any@5', 'reach', 'preservation'} <= set(head)
    csv = pd.read_csv(tmp_path / 'r.csv')
    want = retrieval_report(st)
    assert len(csv) == len(want) == 4 and set(csv['label']) == {'offline reader (no LLM)'}
    pd.testing.assert_series_equal(csv['evidence_recall'], want['evidence_recall'], check_exact=False, rtol=1e-9)
    assert 'ceiling' not in r['out']


def test_no_ceiling_line_where_gold_accuracy_is_high(synth):
    st, _ = synth
    fr = results_frame(st)
    gold = fr[(fr['cond_evidence'] == 'readback') & (fr['memory'] == 'bm25[k=3]')]
    assert gold['correct'].mean() >= CEILING              # the construction: the strong reader reads synthetic gold right
    assert gold_ceiling(fr)['ceiling'].iloc[0] == pytest.approx(gold['correct'].mean())
    assert reader_ceiling_line(fr) is None
    r = memlab_main(['report', st.root])
    assert r['rc'] == 0 and r['out'].startswith('policy labels:') and 'ceiling' not in r['out'], r['out']


def test_ceiling_line_on_locomo_real_format(tmp_path):
    spec = {'kind': 'locomo', 'path': str(FIXTURES / 'locomo10.json')}
    st, insts = make_store(tmp_path / 'lo', spec=spec, memories=[{'name': 'bm25', 'k': 5}])
    fr = results_frame(st)
    acc = fr[fr['cond_evidence'] == 'readback']['correct'].astype(float).mean()
    assert acc < CEILING
    line = reader_ceiling_line(fr)
    assert line == reader_ceiling_line(fr[fr['cond_evidence'] == 'readback'])   # the search rows play no part
    assert line.startswith(f'offline reader ceiling {acc:.2f} (gold evidence) < 0.90') and 'does not compare memories' in line
    r = memlab_main(['report', st.root])
    assert r['rc'] == 0 and r['out'].splitlines()[0] == line, r['out']
    assert reader_ceiling_line(fr[fr['cond_evidence'] == 'search']) is None     # no gold-evidence condition: nothing to say
    assert reader_ceiling_line(fr.assign(policy_label='gpt-4o-mini')) is None   # an LLM answer step is not the offline reader
    t = retrieval_report(st)                              # the memory metrics stay valid on the real file
    assert t.set_index('setting').loc['readback', 'preservation'] == 1.0 and 0 < t.set_index('setting').loc['search', 'reach'] <= 1


@pytest.mark.skipif(not EXCERPT.exists(), reason='../shared/fixtures/subtlememory is absent')
def test_ceiling_line_on_the_subtlememory_excerpt(tmp_path):
    import memlab.protocols.subtle.protocol  # noqa: F401  (registers the dataset, the oracle setting and the reader)
    spec = {'kind': 'subtlememory', 'source': 'released', 'path': str(EXCERPT)}
    st, insts = make_store(tmp_path / 'sm', spec=spec, memories=[{'name': 'none'}], conditions=[{'evidence': 'subtlememory-oracle'}],
                           policies=[{'name': 'subtlememory-reader', 'tier': 'strong'}])
    fr = results_frame(st)
    acc = fr['correct'].astype(float).mean()
    line = reader_ceiling_line(fr)
    assert acc < CEILING and line.startswith(f'offline reader ceiling {acc:.2f} (gold evidence)'), (acc, line)
    t = retrieval_report(st)                              # the oracle hands over exactly the target sessions
    assert t['preservation'].tolist() == [1.0] and t['n'].iloc[0] == sum(bool(q.evidence) and not q.abstention for i in insts for q in i.queries)


def test_a_weaker_tier_below_the_ceiling_does_not_speak_for_the_reader(synth):
    "The weak and medium tiers fail some question types by design: the reader's ceiling is the best its tiers reach."
    st, _ = synth
    fr = results_frame(st)
    weak = fr.assign(policy=fr['policy'] + '-weaker', correct=False)                 # a tier that reads nothing right
    assert reader_ceiling_line(weak) is not None                                       # alone, it is below the ceiling
    assert reader_ceiling_line(pd.concat([fr, weak], ignore_index=True)) is None       # beside a tier that reads gold right
