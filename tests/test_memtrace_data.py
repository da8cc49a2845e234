"""MemTrace data (seed 002, issue 13 item 1): HaluMem loading, knowledge points, memory windows and probes.

- the real-format excerpt (`../shared/fixtures/halumem`) loads unchanged and yields KPs of every substantive kind;
- a broken HaluMem record gets one line naming file, record and field, and exit 2 (`memlab data inspect halumem`);
- windows are chronological, at most eight, end at the full history, and are anchored around an update;
- a KP is probed only at windows after its first appearance, with its memory age; a dynamic KP's Current gold
  switches at its update; template questions give no answer token away (the paper's leakage audit).
"""
import collections, copy, json
from pathlib import Path
import pytest
from inproc import memlab_main
from memlab.protocols.memtrace.data import (load_halumem, knowledge_points, make_windows, window_instances, synth_halumem,
                                            write_halumem, gold_leaks, KP_GROUPS, SUBSTANTIVE, summarize_halumem)

FX = Path(__file__).parent / 'fixtures'
SHARED = Path(__file__).resolve().parents[2] / 'shared' / 'fixtures' / 'halumem' / 'halumem_user_excerpt.jsonl'


@pytest.mark.skipif(not SHARED.exists(), reason='../shared/fixtures/halumem is absent')
def test_the_real_excerpt_loads_unchanged():
    raw = json.loads(SHARED.read_text().splitlines()[0])
    (u,) = load_halumem(SHARED)
    assert [s.meta['start_time'] for s in u.sessions] == [s['start_time'] for s in raw['sessions']]
    assert [len(s.turns) for s in u.sessions] == [len(s['dialogue']) for s in raw['sessions']]
    assert sum(len(s.meta['memory_points']) for s in u.sessions) == sum(len(s['memory_points']) for s in raw['sessions'])
    assert len(u.queries) == sum(len(s.get('questions', [])) for s in raw['sessions']) and u.meta['name'] == 'Sarah Garcia'
    v = dict(zip(*summarize_halumem([u])[['name', 'value']].values.T))
    assert v['interference points with reference fields'] == 2 and v['evidence memory types in brackets ("[Persona Memory]")'] == 3
    kps = knowledge_points(u, caps={g: None for g in KP_GROUPS})
    n = collections.Counter(k.group for k in kps)
    assert all(n[g] > 0 for g in KP_GROUPS), n
    d = {k.attribute: k for k in kps if k.group == 'dynamic'}
    assert (d['job title'].earlier, d['job title'].value, d['job title'].first_session, d['job title'].changed_session) == ('manager', 'senior manager', 1, 3)


def _break(change):
    rec = json.loads((FX / 'halumem_medium.jsonl').read_text().splitlines()[1]); change(rec); return rec

CASES = {
    'is_update not a True/False string': (lambda r: r['sessions'][2]['memory_points'][0].update(is_update='yes'),
                                          "record 1 (uuid={uid}): field 'sessions.2.memory_points.0.is_update'"),
    'timestamp in another format': (lambda r: r['sessions'][0].update(start_time='2025-01-06 09:00'),
                                     "field 'sessions.0.start_time': '2025-01-06 09:00' does not match"),
    'unknown memory type': (lambda r: r['sessions'][1]['memory_points'][0].update(memory_type='Fact'),
                            "field 'sessions.1.memory_points.0.memory_type': expected one of"),
    'unknown question type': (lambda r: next(s for s in r['sessions'] if s.get('questions'))['questions'][0].update(question_type='Trivia'),
                              "questions.0.question_type': expected one of"),
    'missing uuid': (lambda r: r.pop('uuid'), "record 1: field 'uuid': missing"),
    'generated QA session in a Medium file': (lambda r: r['sessions'][3].update(is_generated_qa_session=True),
                                              "field 'sessions.3.is_generated_qa_session': a generated QA session in a Medium file"),
}

@pytest.mark.parametrize('name', CASES)
def test_a_broken_record_is_one_line_and_exit_2(name, tmp_path):
    change, want = CASES[name]
    lines = (FX / 'halumem_medium.jsonl').read_text().splitlines()
    uid = json.loads(lines[1])['uuid']
    p = tmp_path / 'HaluMem-medium.jsonl'
    p.write_text(lines[0] + '\n' + json.dumps(_break(change)) + '\n')
    r = memlab_main(['data', 'inspect', 'halumem', p])
    assert r['rc'] == 2, r['out']
    assert len(r['err'].strip().splitlines()) == 1 and str(p) in r['err'] and want.format(uid=uid) in r['err'], r['err']
    assert sorted(f.name for f in tmp_path.iterdir()) == ['HaluMem-medium.jsonl']      # nothing written


USERS = load_halumem(write_halumem(synth_halumem(4, n_sessions=30, seed=7), Path(__import__('tempfile').mkdtemp()) / 'u.jsonl'))

@pytest.mark.parametrize('u', USERS, ids=lambda u: u.meta['name'])
def test_windows_and_probes(u):
    insts, kps = window_instances(u)
    wins = make_windows(len(u.sessions), kps)
    ends = [w.end for w in wins]
    assert len(wins) == 8 and ends == sorted(set(ends)) and ends[-1] == len(u.sessions) - 1
    assert ends[0] == min(k.first_session for k in kps)
    pre, post = [w for w in wins if w.anchor == 'pre-update'], [w for w in wins if w.anchor == 'post-update']
    assert len(pre) == len(post) == 1 and post[0].end == pre[0].end + 1
    assert any(k.changed_session == post[0].end for k in kps if k.group == 'dynamic')
    first = {k.id: k.first_session for k in kps}
    for inst in insts:
        end = inst.meta['window_end']
        assert len(inst.sessions) == end + 1
        for q in inst.queries:
            assert first[q.meta['kp']] <= end and q.meta['age'] == end - first[q.meta['kp']]   # probed only after it appears
    seen = {(q.meta['kp'], q.meta['window']) for i in insts for q in i.queries}
    assert seen == {(k.id, w.name) for k in kps for w in wins if k.first_session <= w.end}  # and at every such window
    by = collections.defaultdict(set)
    for i in insts:
        for q in i.queries: by[q.meta['kp_group']].add(q.qtype)
    assert all(by[g] == {'current', 'historical', 'trajectory'} for g in SUBSTANTIVE)
    assert by['conflict'] == by['boundary'] == {'current', 'historical'}


@pytest.mark.parametrize('u', USERS, ids=lambda u: u.meta['name'])
def test_dynamic_golds_follow_the_update_and_templates_do_not_leak(u):
    insts, kps = window_instances(u)
    for inst in insts:
        end = inst.meta['window_end']
        for q in inst.queries:
            k = next(k for k in kps if k.id == q.meta['kp'])
            if k.group == 'dynamic' and q.qtype == 'current':
                assert q.answers == [k.value if end >= k.changed_session else k.earlier]
            if k.group in SUBSTANTIVE: assert not gold_leaks(q.question, q.meta['canonical'], f'{k.subject} {k.attribute}'), q.question
            assert k.group != 'boundary' or (q.abstention and q.evidence == [])
