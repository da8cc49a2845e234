"""LongMemEval at full size, streamed (issue 29, third item).

A JSON array is parsed one record at a time (`memlab.files.iter_json_records`) with json.loads's values and messages;
`load_longmemeval` builds instances as records arrive and shares the turns of a pool session met again; the scale
ladder's pool is built from the data file parsed once. Counts and byte ratios only, never seconds.
"""
from __future__ import annotations
import json, random, sys, tracemalloc
from pathlib import Path
import pytest
import memlab.files as files
from memlab.files import RecordError, iter_json_records, read_json_records

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / 'tests' / 'fixtures'
sys.path.insert(0, str(ROOT / 'tests' / 'benchmarks'))
from make_longmemeval_m import make                                         # noqa: E402


@pytest.fixture(scope='module')
def lme_small(tmp_path_factory):
    "A LongMemEval_M-layout file of 12 records x 40 sessions of about 3,000 tokens drawn from a pool of 100 (about 5 MB)."
    p = tmp_path_factory.mktemp('lme') / 'longmemeval_m_cleaned.json'
    make(p, records=12, sessions=40, pool=100, session_tokens=3000, seed=3)
    return p


@pytest.fixture
def small_chunks(monkeypatch):
    "Read 4 KiB at a time, so records and UTF-8 characters straddle the chunks."
    monkeypatch.setattr(files, '_CHUNK', 4096)


# ------------------------------------------------------------------ the streaming reader: json.loads's records
@pytest.mark.parametrize('name', ['longmemeval_s_cleaned.json', 'longmemeval_oracle.json', 'locomo10.json', 'memoryagentbench.json'])
def test_fixtures_equal_json_loads(name, small_chunks):
    want = json.loads((FX / name).read_text(encoding='utf-8'))
    assert read_json_records(FX / name) == want
    assert json.dumps(read_json_records(FX / name)) == json.dumps(want)       # types too (1 vs 1.0 vs True)


def test_generated_file_equals_json_loads(lme_small, small_chunks):
    want = json.loads(lme_small.read_text(encoding='utf-8'))
    got = list(iter_json_records(lme_small))
    assert len(got) == 12 and json.dumps(got, ensure_ascii=False) == json.dumps(want, ensure_ascii=False)
    assert any(isinstance(r['answer'], int) for r in got)                    # the released column mixes str and int
    assert any('東京' in t['content'] for r in got for s in r['haystack_sessions'] for t in s)


def _value(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.35:
        return rng.choice([0, -7, 10**30, -2**70, 2.5, -0.0, 1e-300, 1.7976931348623157e308, True, False, None, '',
                           'a"b\\c\n\t', 'é 東京 😀 \u2028', 'x' * rng.randint(0, 90)])
    if r < 0.65: return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f'{rng.choice("abé東")}{k}': _value(rng, depth + 1) for k in range(rng.randint(0, 4))}


@pytest.mark.parametrize('chunk', [1, 3, 64, 1 << 25])
def test_random_documents_equal_json_loads(tmp_path, monkeypatch, chunk):
    "Unicode, nesting, big and small numbers, any indentation: the records and their types are json.loads's."
    monkeypatch.setattr(files, '_CHUNK', chunk)
    rng, p = random.Random(chunk), tmp_path / 'x.json'
    for _ in range(60):
        recs = [_value(rng) for _ in range(rng.randint(0, 5))]
        p.write_text(json.dumps(recs, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 0, 2])), encoding='utf-8')
        assert json.dumps(read_json_records(p)) == json.dumps(json.loads(p.read_text(encoding='utf-8')))


# ------------------------------------------------------------------ the same messages for bad input
BAD = ['[{"a": 1},\n {"a": 2}\n {"a": 3}]', '[1, 2', '[1,]', '[', '[{"a": 1,}]', '[{"a": "x\n"}]', '[1] 2', '[01]',
       '[{"a": 1}, {"a": "unterminated', '[\n\n  {"a": tru}]', '[{"a": "\\u12"}]', '  [1 2]', '[{"a" 1}]']

@pytest.mark.parametrize('text', BAD)
@pytest.mark.parametrize('chunk', [2, 1 << 25])
def test_bad_json_messages_are_json_loads(tmp_path, monkeypatch, text, chunk):
    monkeypatch.setattr(files, '_CHUNK', chunk)
    p = tmp_path / 'bad.json'; p.write_text(text)
    with pytest.raises(json.JSONDecodeError) as e: json.loads(text)
    want = f'{p}: not valid JSON: {e.value.msg} at line {e.value.lineno} column {e.value.colno}'
    with pytest.raises(RecordError) as got: read_json_records(p)
    assert str(got.value) == want


@pytest.mark.parametrize('text,want', [
    (b'[{"a": 1}, {"a": "caf\xc3\xa9 \xff"}]', 'not UTF-8 text (byte 24)'),
    (b'[{"a": 1}, {"a": 2, "b": {"c": 1, "c": 2}}]', "record 1: field 'b.c': duplicate key 'c' (a JSON object may not repeat a key)"),
    (b'[{"id": "q7", "a": 1, "a": 2}]', "record 0 (id='q7'): field 'a': duplicate key 'a' (a JSON object may not repeat a key)"),
    (b'[' * 100_000, 'not valid JSON: nested too deeply'),
    (b'[' + b'1' * 5000 + b']', 'not valid JSON: a number of 5000 digits (at most 4300)'),
    (b'  \n', 'empty file; expected a JSON array or JSONL records'),
    (b'{"question_id": "a"}', 'expected a JSON array of records (or JSONL, one record per line), got a JSON dict'),
])
def test_other_bad_input(tmp_path, small_chunks, text, want):
    p = tmp_path / 'bad.json'; p.write_bytes(text)
    with pytest.raises(RecordError) as e: read_json_records(p)
    assert str(e.value) == f'{p}: {want}'


def test_special_files_and_jsonl_as_before(tmp_path):
    import os
    os.mkfifo(tmp_path / 'pipe.json')
    with pytest.raises(RecordError, match=r'pipe.json: not a regular file \(a FIFO\)'): list(iter_json_records(tmp_path / 'pipe.json'))
    (tmp_path / 'a.jsonl').write_text('{"x": 1}\n\n{"x": 2}\n'); (tmp_path / 'a.json').write_text('{"x": 1}\n{"x": 2}\n')
    assert read_json_records(tmp_path / 'a.jsonl') == read_json_records(tmp_path / 'a.json') == [{'x': 1}, {'x': 2}]


def test_size_bound_only_when_asked(tmp_path, monkeypatch):
    "A streamed array needs no size bound: none applies unless `max_bytes` or $MEMLAB_MAX_FILE_BYTES asks for one."
    p = tmp_path / 'x.json'; p.write_text(json.dumps([{'x': 'y' * 200}]))
    monkeypatch.setattr(files, 'MAX_FILE_BYTES', 100)                      # the whole-file bound no longer applies to an array
    monkeypatch.delenv('MEMLAB_MAX_FILE_BYTES', raising=False)
    assert len(read_json_records(p)) == 1
    with pytest.raises(RecordError, match='larger than the limit of 100 bytes'): read_json_records(p, max_bytes=100)
    monkeypatch.setenv('MEMLAB_MAX_FILE_BYTES', '100')
    with pytest.raises(RecordError, match='larger than the limit of 100 bytes'): read_json_records(p)


# ------------------------------------------------------------------ streamed: one record at a time
def test_records_arrive_before_the_file_is_read(lme_small, small_chunks, monkeypatch):
    read = []
    more = files._Text.more
    def counting(self, n=None):
        before = self.nbytes; ok = more(self, n); read.append(self.nbytes - before); return ok
    monkeypatch.setattr(files._Text, 'more', counting)
    it = iter_json_records(lme_small)
    first = next(it)
    assert first['question_id'] and sum(read) < lme_small.stat().st_size / 4, (sum(read), lme_small.stat().st_size)
    assert sum(1 for _ in it) == 11 and sum(read) == lme_small.stat().st_size


def _peak(fn) -> int:
    tracemalloc.start()
    try: out = fn(); return tracemalloc.get_traced_memory()[1], out
    finally: tracemalloc.stop()


def test_loader_holds_no_raw_record_list(lme_small, monkeypatch):
    "Read whole, a file costs its bytes, its text and its records (about 3x its size); streamed, the loaded instances and one record."
    from memlab.data import load_longmemeval
    monkeypatch.setattr(files, '_CHUNK', 1 << 16)
    size = lme_small.stat().st_size
    whole, _ = _peak(lambda: json.loads(lme_small.read_bytes().decode()))
    peak, insts = _peak(lambda: load_longmemeval(lme_small))
    assert len(insts) == 12 and whole > 3 * size, (whole, size)
    assert peak < 1.5 * size and 3 * peak < whole, (peak, size, whole)      # one record's text at a time, the pool's turns once


def test_pool_sessions_share_turns(lme_small):
    from memlab.data import load_longmemeval, summarize
    from memlab.core import count_tokens
    insts = load_longmemeval(lme_small)
    sessions = [s for i in insts for s in i.sessions]
    ids = {s.meta.get('source_id', s.id) for s in sessions}
    turn_objects = {id(t) for s in sessions for t in s.turns}
    by_id = {}
    for s in sessions: by_id.setdefault(s.meta.get('source_id', s.id), len(s.turns))
    assert len(sessions) == 12 * 40 and len(ids) < len(sessions)
    assert len(turn_objects) == sum(by_id.values())                         # one Turn object per turn of each distinct session
    v = dict(zip(*[summarize(insts)[k] for k in ('name', 'value')]))
    assert v['tokens'] == sum(count_tokens(t.content) for s in sessions for t in s.turns)   # counted once per object, summed per use


# ------------------------------------------------------------------ the ladder pool: the data file parsed once
def test_ladder_pool_parsed_once(lme_small, monkeypatch):
    from memlab.protocols.scale.section import ladder_data
    from memlab.protocols.scale.ladder import pool_from_instances
    from memlab.data import load_longmemeval
    calls = []
    real = files._array_records
    monkeypatch.setattr(files, '_array_records', lambda t, path: (calls.append(path), (yield from real(t, path)))[1])
    data = ladder_data('longmemeval', str(lme_small), None, n_queries=5, ladder=(0, 5, 10), seed=0)
    assert len(calls) == 1, calls
    assert len(data.instances) == 5
    assert len(data.history.pool) == len(pool_from_instances(load_longmemeval(lme_small)))   # every haystack, as before
    assert data.history_spec['pool'] == {'kind': 'longmemeval', 'path': str(lme_small)}        # the spec still rebuilds it
