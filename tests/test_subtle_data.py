"""SubtleMemory data (seed 003, issue 14 item 1): the released layout read unchanged, quirks counted, bad records refused.

- the real-format excerpt (`../shared/fixtures/subtlememory`) loads unchanged: sessions in `order`, one query per qa with
  the official id, every judge field kept;
- the fixture's quirks (sessions listed out of order, gaps in `order`, an instance with one qa) are read and counted;
- a broken record gets one line naming file, record and field, and exit 2 (`memlab data inspect subtlememory`).
"""
import json, shutil
from pathlib import Path
import pytest
from inproc import memlab_main
import memlab.protocols.subtle.data  # noqa: F401  (registers the loader and the inspector)
from memlab.protocols.subtle.data import load_subtlememory, summarize_subtlememory, SUBTYPE_COLUMNS

FX = Path(__file__).parent / 'fixtures' / 'subtlememory'
EXCERPT = Path(__file__).resolve().parents[2] / 'shared' / 'fixtures' / 'subtlememory'


@pytest.mark.skipif(not EXCERPT.exists(), reason='../shared/fixtures/subtlememory is absent')
def test_the_real_excerpt_loads_unchanged():
    (p,) = load_subtlememory(EXCERPT)
    raw_s = json.loads((EXCERPT / 'persona_7' / 'history_sessions.json').read_text())
    raw_i = json.loads((EXCERPT / 'persona_7' / 'bench_instances.json').read_text())
    want = sorted(raw_s, key=lambda s: (s['order'], s['timestamp']))
    assert [s.id for s in p.sessions] == [s['session_id'] for s in want]
    assert [[(t.role, t.content) for t in s.turns] for s in p.sessions] == [[(m['role'], m['content']) for m in s['history']] for s in want]
    qs = [(i, k, qa) for i in raw_i for k, qa in enumerate(i['qas'])]
    assert [q.id for q in p.queries] == [f"persona_7__{i['case_id']}__{i['instance_id']}_qa{k}" for i, k, _ in qs]
    for q, (i, k, qa) in zip(p.queries, qs):
        assert (q.question, q.answers, q.meta['incorrect_answers'], q.evidence) == (qa['query'], qa['correct_answers'], qa['incorrect_answers'], i['session_ids'])
        assert (q.meta['relation_subtype'], q.meta['facts'], q.meta['persona_str']) == (i['relation_subtype'], i['facts'], i['persona_str'])
        assert q.meta['column'] == SUBTYPE_COLUMNS[i['relation_subtype']]


def test_fixture_quirks_are_read_and_counted():
    (p,) = load_subtlememory(FX)
    v = dict(zip(*summarize_subtlememory([p])[['name', 'value']].values.T))
    assert v['instances with other than three qas'] == 1 and v['sessions listed out of order'] > 0 and v['gaps in session order'] > 0
    assert [s.meta['order'] for s in p.sessions] == sorted(s.meta['order'] for s in p.sessions)


CASES = {
    'unknown relation type': ('bench_instances.json', lambda d: d[0].update(relation_type='orthogonal'), "record 0 (instance_id={iid}): field 'relation_type'"),
    'target session not in the history': ('bench_instances.json', lambda d: d[0]['session_ids'].append('no-such-session'),
                                          "field 'session_ids': ['no-such-session'] not among"),
    'qa without correct answers': ('bench_instances.json', lambda d: d[0]['qas'][0].update(correct_answers=[]), "field 'qas.0.correct_answers': empty"),
    'timestamp not ISO': ('history_sessions.json', lambda d: d[0].update(timestamp='yesterday'), "field 'timestamp': 'yesterday' is not ISO 8601"),
    'role unknown': ('history_sessions.json', lambda d: d[0]['history'][0].update(role='bot'), "field 'history.0.role'"),
}

@pytest.mark.parametrize('name', CASES)
def test_a_broken_record_is_one_line_and_exit_2(name, tmp_path):
    file, change, want = CASES[name]
    d = tmp_path / 'persona_0'; shutil.copytree(FX / 'persona_0', d)
    data = json.loads((d / file).read_text()); iid = data[0].get('instance_id'); change(data)
    (d / file).write_text(json.dumps(data))
    before = sorted(p.name for p in tmp_path.rglob('*'))
    r = memlab_main(['data', 'inspect', 'subtlememory', tmp_path])
    assert r['rc'] == 2, r['out']
    assert len(r['err'].strip().splitlines()) == 1 and file in r['err'] and want.format(iid=iid) in r['err'], r['err']
    assert sorted(p.name for p in tmp_path.rglob('*')) == before                           # nothing written
