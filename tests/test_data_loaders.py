"""LongMemEval and LoCoMo loaders (`memlab.data`) on the hand-written fixtures in tests/fixtures/.

The fixtures follow the released layouts and carry the quirks of `shared/docs/datasets.md` §1-2: `_abs` question
ids, `has_answer` only on turns of evidence sessions, an int answer, an `_oracle` file whose sessions are not in
date order, a repeated filler session id (LongMemEval issue #54); LoCoMo date keys without a session, category-5
items without `answer`, int answers, empty and malformed evidence strings, eleven sessions (numeric order).
Malformed copies of the fixtures must fail with a `RecordError` naming the file, the record (index and id) and the
field; the CLI must print one line `memlab: ...` and exit 2.
"""
import contextlib, copy, hashlib, io, json, os, re, subprocess, sys
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from memlab import data as D
from memlab.core import RecordError
from memlab.data import (ChecksumError, LME_DATE_FORMAT, LOCOMO_ABSTAIN_ANSWER, file_sha256, inspect_dataset,
                         load_locomo, load_longmemeval, parse_dia_ids, verify_sha256)
from memlab.cli import main
from memlab.memory import make_memory
from memlab.runner import check_instances

FX = Path(__file__).parent / 'fixtures'
LME_S, LME_O, LOCOMO = FX / 'longmemeval_s_cleaned.json', FX / 'longmemeval_oracle.json', FX / 'locomo10.json'
MEMLAB = str(Path(sys.executable).with_name('memlab'))


def raw(path): return json.loads(path.read_text())

def write(tmp_path, name, recs):
    p = tmp_path / name; p.write_text(json.dumps(recs)); return p

# ---------------------------------------------------------------- LongMemEval

def test_lme_s_round_trip():
    recs, insts = raw(LME_S), load_longmemeval(LME_S)
    assert [i.id for i in insts] == [r['question_id'] for r in recs]
    assert [len(i.sessions) for i in insts] == [len(r['haystack_session_ids']) for r in recs]
    assert sum(len(s.turns) for i in insts for s in i.sessions) == sum(len(x) for r in recs for x in r['haystack_sessions'])
    for r, inst in zip(recs, insts):
        (q,) = inst.queries
        assert inst.meta['layout'] == 's' and inst.meta['dataset'] == 'longmemeval'
        assert (q.id, q.question, q.qtype, q.date) == (r['question_id'], r['question'], r['question_type'], r['question_date'])
        assert q.answers == [str(r['answer'])] and all(isinstance(a, str) for a in q.answers)
        assert q.abstention == ('_abs' in r['question_id'])
        assert set(q.evidence) >= set(r['answer_session_ids'])
        # every session keeps its released date, id and turns
        by_id = {s.id: s for s in inst.sessions}
        for j, sid in enumerate(r['haystack_session_ids']):
            s = next(s for s in inst.sessions if s.meta['position'] == j)
            assert s.meta.get('source_id', s.id) == sid and s.date == r['haystack_dates'][j]
            assert [(t.role, t.content) for t in s.turns] == [(t['role'], t['content']) for t in r['haystack_sessions'][j]]
        assert len(by_id) == len(inst.sessions)
    check_instances(insts, str(LME_S))


def test_lme_quirks():
    insts = {i.id: i for i in load_longmemeval(LME_S)}
    assert insts['0a8b6c4d'].queries[0].answers == ['3']                      # the int answer
    assert [k for k, i in insts.items() if i.queries[0].abstention] == ['7f3a2c1e_abs']
    abs_q = insts['7f3a2c1e_abs'].queries[0]
    assert abs_q.qtype == 'single-session-user' and abs_q.meta['answer_kind'] == 'explanation'
    assert insts['3c9d7e55'].queries[0].meta['answer_kind'] == 'rubric'
    dup = insts['3c9d7e55']
    assert dup.meta['duplicate_sessions'] == ['sharegpt_Zr8TqVw_0#2']
    twins = [s for s in dup.sessions if s.meta.get('source_id', s.id) == 'sharegpt_Zr8TqVw_0']
    assert len(twins) == 2 and twins[0].turns == twins[1].turns and twins[0].date < twins[1].date


def test_has_answer_only_in_meta_and_only_on_evidence_turns():
    pairs = [(r, inst) for path in (LME_S, LME_O) for r, inst in zip(raw(path), load_longmemeval(path))]
    n_flags = 0
    for r, inst in pairs:
        gold = set(inst.queries[0].evidence)
        for s in inst.sessions:
            released = r['haystack_sessions'][s.meta['position']]
            for t, rt in zip(s.turns, released):
                assert t.content == rt['content'] and 'has_answer' not in t.content
                assert t.meta.get('has_answer') == rt.get('has_answer')      # kept exactly where the file has it
                if 'has_answer' in t.meta:
                    n_flags += 1
                    assert s.id in gold, (inst.id, s.id)
            if s.id not in gold: assert all('has_answer' not in t.meta for t in s.turns)
    assert n_flags > 10
    # memories never show it: search results are built from role and content only
    inst = load_longmemeval(LME_S)[0]
    m = make_memory('bm25', k=50); m.add_all(inst.sessions)
    assert all('has_answer' not in e.text and 'True' not in e.text for e in m.search('degree Marine Biology'))


def test_sessions_are_sorted_by_date_for_every_layout():
    for path in (LME_S, LME_O):
        for inst in load_longmemeval(path):
            when = [datetime.strptime(s.date, LME_DATE_FORMAT) for s in inst.sessions]
            assert when == sorted(when)
            make_memory('bm25').add_all(inst.sessions)               # chronological ingestion check passes
    orc = load_longmemeval(LME_O)
    assert [i.meta['layout'] for i in orc] == ['oracle'] * 3
    assert [i.meta['input_sorted'] for i in orc] == [False, False, True]
    assert orc[1].session_ids() == ['answer_5e1f0b2a_1', 'answer_5e1f0b2a_2']
    assert all(set(i.session_ids()) == set(i.queries[0].evidence) for i in orc)     # evidence sessions only


def test_jsonl_and_layout_argument(tmp_path):
    recs = raw(LME_S)
    p = tmp_path / 'longmemeval_s_cleaned.jsonl'
    p.write_text('\n'.join(json.dumps(r) for r in recs) + '\n')
    dump = lambda insts: [i.model_dump(exclude={'meta': {'source'}}) for i in insts]
    assert dump(load_longmemeval(p)) == dump(load_longmemeval(LME_S))
    assert load_longmemeval(p)[0].meta['source'] == p.name
    q = write(tmp_path, 'my_history.json', recs)
    assert {i.meta['layout'] for i in load_longmemeval(q)} == {'unknown'}
    assert {i.meta['layout'] for i in load_longmemeval(q, layout='m')} == {'m'}

# ---------------------------------------------------------------- LoCoMo

def test_locomo_round_trip():
    recs, insts = raw(LOCOMO), load_locomo(LOCOMO)
    assert [i.id for i in insts] == ['conv-90', 'conv-91']
    assert [len(i.sessions) for i in insts] == [3, 11] and [len(i.queries) for i in insts] == [10, 6]
    for r, inst in zip(recs, insts):
        conv = r['conversation']
        nums = [s.meta['n'] for s in inst.sessions]
        assert nums == sorted(nums) and inst.session_ids() == [f"{r['sample_id']}:session_{n}" for n in nums]
        for s in inst.sessions:
            assert s.meta['date_time'] == conv[f"session_{s.meta['n']}_date_time"]
            released = conv[f"session_{s.meta['n']}"]
            assert [(t.role, t.meta['dia_id']) for t in s.turns] == [(t['speaker'], t['dia_id']) for t in released]
            assert all(t.content.startswith(rt['text']) for t, rt in zip(s.turns, released))
        assert inst.meta['speakers'] == [conv['speaker_a'], conv['speaker_b']]
        for q, qa in zip(inst.queries, r['qa']):
            assert q.meta['category'] == qa['category'] and q.abstention == (qa['category'] == 5)
            if qa['category'] != 5: assert q.answers == [str(qa['answer'])]
    check_instances(insts, str(LOCOMO))
    for inst in insts: make_memory('bm25').add_all(inst.sessions)


def test_locomo_quirks():
    a, b = load_locomo(LOCOMO)
    assert a.meta['orphan_dates'] == [4, 5] and 'orphan_dates' not in b.meta
    assert len(a.sessions) == 3                                   # no phantom sessions from date-only keys
    assert b.session_ids()[8:] == ['conv-91:session_9', 'conv-91:session_10', 'conv-91:session_11']
    qs = a.queries
    assert qs[1].answers == ['2022'] and b.queries[0].answers == ['3']       # int answers
    cat5 = [q for q in a.queries + b.queries if q.meta['category'] == 5]
    assert len(cat5) == 3 and all(q.abstention and q.qtype == 'adversarial' and q.answers == [LOCOMO_ABSTAIN_ANSWER] for q in cat5)
    assert [q.meta['adversarial_answer'] for q in cat5] == ['the cello', 'Yes', 'Miso']
    assert [q.meta.get('answer') for q in cat5] == [None, 'No', None]
    assert [q.qtype for q in qs[:8]] == ['temporal', 'temporal', 'multi-hop', 'open-domain', 'single-hop', 'single-hop',
                                         'single-hop', 'multi-hop']
    assert qs[3].evidence == [] and 'malformed_evidence' not in qs[3].meta         # empty evidence is not malformed
    assert qs[2].evidence == ['conv-90:session_1', 'conv-90:session_2']          # 'D1:1; D2:4'
    assert qs[7].evidence == ['conv-90:session_1', 'conv-90:session_2', 'conv-90:session_3']  # space-joined
    assert (qs[5].evidence, qs[5].meta['unparsed_evidence']) == ([], ['D'])
    assert (qs[6].evidence, qs[6].meta['unparsed_evidence']) == ([], ['D:2:2'])
    assert sum(len(q.meta.get('malformed_evidence', [])) for q in qs) == 4
    t = a.sessions[1].turns[3]
    assert t.meta['re-download'] is True and t.content.endswith(' and shared a photo of a medal on a table.')
    assert load_locomo(LOCOMO, captions=False)[0].sessions[1].turns[3].content == raw(LOCOMO)[0]['conversation']['session_2'][3]['text']


def test_locomo_session_dates_normalised():
    a = load_locomo(LOCOMO)[0]
    assert [s.date for s in a.sessions] == ['2023/03/12 (Sun) 16:05', '2023/04/02 (Sun) 09:20', '2023/04/21 (Fri) 19:45']


def test_locomo_dangling_evidence(tmp_path):
    recs = raw(LOCOMO); recs[0]['qa'][0]['evidence'] = ['D7:1', 'D2:1']
    q = load_locomo(write(tmp_path, 'locomo10.json', recs))[0].queries[0]
    assert q.evidence == ['conv-90:session_2'] and q.meta['dangling_evidence'] == ['D7:1']


@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 60)), min_size=1, max_size=5), st.sampled_from(['; ', ' ', ', ', ';']))
def test_parse_dia_ids_recovers_joined_ids(ids, sep):
    dia = [f'D{s}:{t}' for s, t in ids]
    assert parse_dia_ids(sep.join(dia)) == (dia, [])


@given(st.text(max_size=30))
def test_parse_dia_ids_never_crashes(s):
    good, bad = parse_dia_ids(s)
    assert all(re.fullmatch(r'D\d+:\d+', g) for g in good) and not any(re.fullmatch(r'D\d+:\d+', b) for b in bad)

# ---------------------------------------------------------------- malformed files

def _lme_case(edit):
    def make(tmp_path):
        recs = raw(LME_S); edit(recs); return write(tmp_path, 'longmemeval_s_cleaned.json', recs)
    return make

def _loc_case(edit):
    def make(tmp_path):
        recs = raw(LOCOMO); edit(recs); return write(tmp_path, 'locomo10.json', recs)
    return make

def _text_case(name, text):
    def make(tmp_path):
        p = tmp_path / name; p.write_text(text); return p
    return make

def _del(path):
    def edit(recs):
        *head, last = path
        obj = recs
        for k in head: obj = obj[k]
        del obj[last]
    return edit

def _set(path, value):
    def edit(recs):
        *head, last = path
        obj = recs
        for k in head: obj = obj[k]
        obj[last] = value
    return edit

LME_CASES = {
    'missing question': (_lme_case(_del([2, 'question'])), r"record 2 \(question_id=gpt4_5e1f0b2a\): field 'question': missing"),
    'missing question_id': (_lme_case(_del([1, 'question_id'])), r"record 1: field 'question_id': missing"),
    'answer list': (_lme_case(_set([0, 'answer'], ['x'])), r"record 0 \(question_id=7f3a2c1e\): field 'answer': expected a string or an integer or a number, got list"),
    'answer bool': (_lme_case(_set([1, 'answer'], True)), r"record 1 \(question_id=0a8b6c4d\): field 'answer': expected .*got bool"),
    'sessions not lists': (_lme_case(_set([3, 'haystack_sessions', 2], {'role': 'user'})),
                           r"record 3 \(question_id=7f3a2c1e_abs\): field 'haystack_sessions.2': expected a list, got dict"),
    'turn without content': (_lme_case(_del([4, 'haystack_sessions', 1, 0, 'content'])),
                             r"record 4 \(question_id=3c9d7e55\): field 'haystack_sessions.1.0.content': missing"),
    'bad role': (_lme_case(_set([0, 'haystack_sessions', 0, 0, 'role'], 'system')), r"field 'haystack_sessions.0.0.role': expected 'user' or 'assistant'"),
    'has_answer str': (_lme_case(_set([1, 'haystack_sessions', 0, 0, 'has_answer'], 'true')), r"field 'haystack_sessions.0.0.has_answer': expected a boolean, got str"),
    'bad date': (_lme_case(_set([2, 'haystack_dates', 3], '15 July 2023')), r"record 2 \(question_id=gpt4_5e1f0b2a\): field 'haystack_dates.3': '15 July 2023' does not match"),
    'bad question date': (_lme_case(_set([2, 'question_date'], 'soon')), r"field 'question_date': 'soon' does not match"),
    'length mismatch': (_lme_case(lambda r: r[0]['haystack_dates'].pop()), r"record 0 \(question_id=7f3a2c1e\): field 'haystack_dates': 3 dates for 4 haystack_session_ids"),
    'unknown type': (_lme_case(_set([0, 'question_type'], 'single-hop')), r"field 'question_type': unknown type 'single-hop'"),
    'evidence not in haystack': (_lme_case(_set([1, 'answer_session_ids'], ['answer_x'])), r"record 1 \(question_id=0a8b6c4d\): field 'answer_session_ids': \['answer_x'\] not among"),
    'duplicate question ids': (_lme_case(_set([4, 'question_id'], '0a8b6c4d')), r"record 4 \(question_id=0a8b6c4d\): field 'question_id': duplicate of record 1"),
    'record not an object': (_lme_case(_set([2], ['x'])), r"record 2: field '<record>': expected an object, got list"),
    'bad JSON': (_text_case('longmemeval_s_cleaned.json', '[{"question_id": "a",\n  "question": }]'), r"not valid JSON: .* at line 2 column"),
    'bad JSONL line': (_text_case('longmemeval_s_cleaned.jsonl', '{"question_id": "a"}\n{oops\n'), r"line 2 \(record 1\): not valid JSON"),
    'one object, not an array': (_text_case('longmemeval_s_cleaned.json', '{"question_id": "a"}'), r"expected a JSON array of records .*got a JSON dict"),
    'JSONL in a .json file': (_text_case('longmemeval_s_cleaned.json', '{"question_id": "a"}\n{"question_id": "b"}'), r"record 0 \(question_id=a\): field 'question_type': missing"),
    'not an array of records': (_text_case('longmemeval_s_cleaned.json', '[[1, 2]]'), r"record 0: field '<record>': expected an object, got list"),
    'empty file': (_text_case('longmemeval_s_cleaned.json', '  \n'), r"empty file"),
}

LOC_CASES = {
    'session not a list': (_loc_case(_set([1, 'conversation', 'session_2'], {'speaker': 'Kofi'})),
                           r"record 1 \(sample_id=conv-91\): field 'conversation.session_2': expected a list, got dict"),
    'missing conversation': (_loc_case(_del([0, 'conversation'])), r"record 0 \(sample_id=conv-90\): field 'conversation': missing"),
    'missing sample_id': (_loc_case(_del([1, 'sample_id'])), r"record 1: field 'sample_id': missing"),
    'missing answer (category 1-4)': (_loc_case(_del([0, 'qa', 4, 'answer'])), r"record 0 \(sample_id=conv-90\): field 'qa.4.answer': missing"),
    'category 5 with no answer at all': (_loc_case(_del([0, 'qa', 8, 'adversarial_answer'])), r"field 'qa.8.adversarial_answer': missing"),
    'category out of range': (_loc_case(_set([1, 'qa', 0, 'category'], 6)), r"record 1 \(sample_id=conv-91\): field 'qa.0.category': expected 1-5, got 6"),
    'category as str': (_loc_case(_set([1, 'qa', 0, 'category'], '4')), r"field 'qa.0.category': expected an integer, got str"),
    'evidence not a list': (_loc_case(_set([0, 'qa', 0, 'evidence'], 'D2:1')), r"field 'qa.0.evidence': expected a list, got str"),
    'turn without text': (_loc_case(_del([0, 'conversation', 'session_3', 1, 'text'])), r"field 'conversation.session_3.1.text': missing"),
    'session without a date': (_loc_case(_del([1, 'conversation', 'session_11_date_time'])), r"field 'conversation.session_11_date_time': missing"),
    'unparseable date': (_loc_case(_set([0, 'conversation', 'session_1_date_time'], 'March 12')), r"field 'conversation.session_1_date_time': 'March 12' does not match"),
    'duplicate sample ids': (_loc_case(_set([1, 'sample_id'], 'conv-90')), r"record 1 \(sample_id=conv-90\): field 'sample_id': duplicate of record 0"),
    'bad JSON': (_text_case('locomo10.json', '[{"sample_id": "conv-1", }]'), r"locomo10.json: not valid JSON"),
}


@pytest.mark.parametrize('case', list(LME_CASES))
def test_lme_malformed(tmp_path, case):
    make, pattern = LME_CASES[case]
    p = make(tmp_path)
    with pytest.raises(RecordError) as e: load_longmemeval(p)
    msg = str(e.value)
    assert msg.startswith(f'{p}: ') and re.search(pattern, msg), msg


@pytest.mark.parametrize('case', list(LOC_CASES))
def test_locomo_malformed(tmp_path, case):
    make, pattern = LOC_CASES[case]
    p = make(tmp_path)
    with pytest.raises(RecordError) as e: load_locomo(p)
    msg = str(e.value)
    assert msg.startswith(f'{p}: ') and re.search(pattern, msg), msg

# ---------------------------------------------------------------- sha256

def test_sha256(monkeypatch, tmp_path):
    good = hashlib.sha256(LOCOMO.read_bytes()).hexdigest()
    assert file_sha256(LOCOMO) == good and verify_sha256(LOCOMO, good.upper()) == good
    with pytest.raises(ChecksumError, match=re.escape(f'{LOCOMO}: sha256 {good} does not match the recorded ' + 'ab' * 32)):
        load_locomo(LOCOMO, sha256='ab' * 32)
    assert len(load_locomo(LOCOMO, sha256=good)) == 2
    # a recorded value for the file name is checked by default; False skips the check
    monkeypatch.setitem(D.KNOWN_SHA256, 'locomo10.json', '0' * 64)
    with pytest.raises(ChecksumError, match='locomo10.json: sha256'): load_locomo(LOCOMO)
    with pytest.raises(ChecksumError, match='locomo10.json: sha256'): inspect_dataset('locomo', LOCOMO)
    assert len(load_locomo(LOCOMO, sha256=False)) == 2
    with pytest.raises(RecordError, match='cannot read'): file_sha256(tmp_path / 'missing.json')


def test_known_sha256_is_empty():
    assert D.KNOWN_SHA256 == {}      # datasets.md records no sha256 for these files

# ---------------------------------------------------------------- summaries and the CLI

def test_inspect_counts():
    s = inspect_dataset('locomo', LOCOMO)
    v = {(a, b): c for a, b, c in s.itertuples(index=False)}
    assert v[('total', 'records')] == 2 and v[('total', 'sessions')] == 14 and v[('total', 'turns')] == 33
    assert v[('total', 'questions')] == 16 and v[('total', 'abstention questions')] == 3
    assert [v[('questions by type', f'{n} (category {c})')] for c, n in
            [(1, 'multi-hop'), (2, 'temporal'), (3, 'open-domain'), (4, 'single-hop'), (5, 'adversarial')]] == [4, 3, 2, 4, 3]
    toks = sum(s_.n_tokens for i in load_locomo(LOCOMO) for s_ in i.sessions)
    assert v[('total', 'tokens')] == toks > 0
    s = inspect_dataset('longmemeval', LME_O)
    assert s.attrs['layout'] == 'oracle' and s.attrs['sha256'] == file_sha256(LME_O)
    v = {(a, b): c for a, b, c in s.itertuples(index=False)}
    assert v[('abstention by type', 'single-session-user')] == 1 and v[('quirks', 'records with unsorted session dates')] == 2


def cli(*args):
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: main([str(a) for a in args])
        except SystemExit as e: code = e.code
    return code, out.getvalue(), err.getvalue()


def test_cli_inspect_in_process(tmp_path):
    code, out, _ = cli('data', 'inspect', 'longmemeval', LME_S)
    assert code == 0
    assert out.splitlines()[0] == f'{LME_S}: longmemeval (layout s)'
    assert f'sha256 {file_sha256(LME_S)}' in out
    assert re.search(r'total\s+records\s+5\b', out) and re.search(r'questions by type\s+knowledge-update\s+1\b', out)
    assert re.search(r'quirks\s+repeated session ids \(renamed\)\s+1\b', out)
    code, out, _ = cli('data', 'inspect', 'longmemeval', LME_S, '-o', 'layout=m')
    assert out.splitlines()[0].endswith('(layout m)')
    code, _, err = cli('data', 'inspect', 'locomo', LOCOMO, '-o', 'layout=s')
    assert code == 2 and err.strip() == 'memlab: -o layout: locomo files take no options'
    code, _, err = cli('data', 'inspect', 'longmemeval', LME_S, '-o', 'layout=x')
    assert code == 2 and "field 'option.layout'" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli('data', 'inspect', 'locomo', LOCOMO, '--sha256', '1' * 64)
    assert code == 2 and err.strip().startswith(f'memlab: {LOCOMO}: sha256') and len(err.strip().splitlines()) == 1
    code, _, err = cli('data', 'inspect', 'locomo', tmp_path / 'none.json')
    assert code == 2 and 'none.json: cannot read' in err


def test_cli_subprocess(tmp_path):
    env = dict(os.environ, MEMLAB_PROGRESS='0')
    ok = subprocess.run([MEMLAB, 'data', 'inspect', 'locomo', str(LOCOMO)], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert re.search(r'questions by type\s+adversarial \(category 5\)\s+3\b', ok.stdout)
    assert re.search(r'quirks\s+date keys without a session\s+2\b', ok.stdout)
    recs = raw(LOCOMO); recs[1]['qa'][2]['evidence'] = 'D2:1'
    bad = write(tmp_path, 'locomo10.json', recs)
    r = subprocess.run([MEMLAB, 'data', 'inspect', 'locomo', str(bad)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stdout == ''
    assert r.stderr == f"memlab: {bad}: record 1 (sample_id=conv-91): field 'qa.2.evidence': expected a list, got str\n"


def test_locomo_evidence_naming_a_missing_turn_is_reported(tmp_path):
    "Released LoCoMo evidence names turns that do not exist (conv-42 D10:19, conv-47 D4:36, conv-50 D30:05): counted and listed."
    from memlab.data import inspect_dataset
    data = json.loads(LOCOMO.read_text())
    qa = data[0]['qa'][0]; qa['evidence'] = ['D1:99']
    p = tmp_path / 'locomo10.json'; p.write_text(json.dumps(data))
    t = inspect_dataset('locomo', p)
    v = dict(zip(t['name'], t['value']))
    assert v['evidence dia ids naming no turn of their session'] == 1
    row = t[t['section'] == 'evidence naming no turn']
    assert row['name'].tolist() == [f"{data[0]['sample_id']}:q0"] and row['value'].tolist() == ['D1:99']
