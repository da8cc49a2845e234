"""MemoryAgentBench rows (`memlab.protocols.mab.data`): loader, chunking, memorize prompts, memory checkpoints, CLI.

Fixture: tests/fixtures/memoryagentbench.json, written by tests/fixtures/make_mab_fixtures.py in the released HF
layout (shared/docs/datasets.md §3.1), one row per source family of the four competencies. The parquet copy is
written into a temporary folder by the same script (`*.parquet` is git-ignored).
"""
import copy, hashlib, json, os, pickle, re, subprocess, sys, threading, warnings
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from memlab.protocols.mab import data as M
from memlab.core import RecordError
from memlab.data import ChecksumError, LOADERS, file_sha256
from memlab.protocols.mab.data import (CHUNK_TOKENIZER, COMPETENCY_OF, MEMORIZE_PROMPT, chunk_text_into_sentences, count_chunk_tokens, inspect_memoryagentbench, load_memoryagentbench,
                        memorize_message, pack_sentences, split_sentences)
from memlab.memory import MEMORIES, Memory, make_memory
from memlab.flat import BM25Memory
from memlab import checkpoint as C
from memlab.checkpoint import MemoryCheckpoint, built_memory
from memlab.runner import check_instances

FX = Path(__file__).parent / 'fixtures'
JSON = FX / 'memoryagentbench.json'
sys.path.insert(0, str(FX))
import make_mab_fixtures as mk  # noqa: E402
sys.path.remove(str(FX))
MEMLAB = str(Path(sys.executable).with_name('memlab'))


def rows(): return json.loads(JSON.read_text())

def write(tmp_path, recs, name='memoryagentbench.json'):
    p = tmp_path / name; p.write_text(json.dumps(recs)); return p

def dumps(insts): return [i.model_dump() for i in insts]

# ---------------------------------------------------------------- round trips

@pytest.fixture(scope='module')
def PARQUET(tmp_path_factory): return mk.write_parquet(tmp_path_factory.mktemp('mab') / 'memoryagentbench.parquet')


def test_fixture_is_current(tmp_path):
    "The committed JSON is what make_mab_fixtures.py writes (regenerate it after editing the script)."
    assert rows() == mk.ROWS and mk.write_json(tmp_path / 'x.json').read_bytes() == JSON.read_bytes()


def test_json_parquet_jsonl_round_trip(tmp_path, PARQUET):
    a = load_memoryagentbench(JSON)
    assert dumps(load_memoryagentbench(PARQUET)) == dumps(a)
    jl = tmp_path / 'mab.jsonl'; jl.write_text('\n'.join(json.dumps(r) for r in rows()) + '\n')
    assert dumps(load_memoryagentbench(jl)) == dumps(a)
    check_instances(a, str(JSON))


def test_rows_become_instances():
    recs, insts = rows(), load_memoryagentbench(JSON)
    assert [i.id for i in insts] == [f"{r['metadata']['source']}:{k}" for k, r in enumerate(recs)]
    for r, inst in zip(recs, insts):
        md = r['metadata']
        assert inst.meta['source'] == md['source'] and inst.meta['competency'] == COMPETENCY_OF(md['source'])
        assert inst.meta['dataset'] == 'memoryagentbench' and inst.meta['tokenizer'] == CHUNK_TOKENIZER
        # one query per question, in order, except the official single-query rule (one question, several answer lists)
        assert [q.question for q in inst.queries] == r['questions']
        dd = (lambda xs: list(dict.fromkeys(xs))) if M.source_family(md['source']).dedup_golds else list
        if len(r['questions']) > 1:
            assert [q.answers for q in inst.queries] == [dd(map(str, a)) for a in r['answers']]
        else:
            assert inst.queries[0].answers == dd(str(x) for a in r['answers'] for x in a)
        ids = md['question_ids'] or md['qa_pair_ids'] or md['uuid']
        assert [q.id for q in inst.queries] == ids
        # chunks: undated, ordered, one user turn each, concatenating back to the context's sentences
        assert all(s.date is None and len(s.turns) == 1 and s.turns[0].role == 'user' for s in inst.sessions)
        assert [s.meta['chunk'] for s in inst.sessions] == list(range(len(inst.sessions)))
        assert ' '.join(s.turns[0].content for s in inst.sessions) == ' '.join(split_sentences(r['context']))
        assert sum(s.meta['n_sentences'] for s in inst.sessions) == len(split_sentences(r['context']))
        assert inst.meta['n_chunks'] == len(inst.sessions) >= 1


def test_quirks():
    by = {i.meta['source']: i for i in load_memoryagentbench(JSON)}
    r = by['ruler_qa1_197K'].queries[0]
    assert r.answers == ['Veloria'] and r.meta['raw_answers'] == ['Veloria'] * 3 and r.qtype == 'ruler_qa1_197K'
    lme = by['longmemeval_s*']
    assert [q.abstention for q in lme.queries] == [False, True, False]
    assert [q.qtype for q in lme.queries] == ['single-session-user', 'single-session-user', 'knowledge-update']
    assert lme.queries[2].date == '2023/06/01 (Thu) 08:00' and lme.meta['n_haystack_sessions'] == 3
    assert lme.queries[0].meta['qa_pair_id'] == 'longmemeval_s*_no0'       # question_ids win, qa_pair_ids kept
    assert (lme.meta['task'], lme.meta['chunk_size']) == ('LME(S*)', 512)
    assert by['eventqa_full'].queries[0].meta['previous_event'] == '1. Debbie waited for her father.'
    assert by['eventqa_full'].meta['chunk_size'] == 4096
    det = by['detective_qa']
    assert len(det.queries) == 1 and det.meta['collapsed_answers'] and det.queries[0].answers == ['A', '(A) The gardener']
    assert det.queries[0].meta['raw_answers'] == [['A'], ['(A) The gardener']]
    summ = by['infbench_sum_eng_shots2']
    assert summ.meta['keypoints'][0] == 'Ada leaves to find her brother.' and summ.meta['demo'].startswith('Example')
    assert 'raw_answers' not in summ.queries[0].meta and summ.meta['collapsed_answers'] is False
    assert summ.queries[0].meta['keypoints'] == summ.meta['keypoints']          # the summarization judges read it here
    assert not any('keypoints' in q.meta for i in by.values() if i is not summ for q in i.queries)
    assert by['factconsolidation_mh_6k'].queries[0].id == 'factconsolidation_mh_6k_no0'   # old `uuid` field
    assert 'demo' not in by['ruler_qa1_197K'].meta                                        # an empty demo is dropped
    # abstention comes only from LongMemEval ids
    assert not any(q.abstention for i in by.values() if i.meta['template'] != 'longmemeval' for q in i.queries)


def test_metadata_forms(tmp_path):
    "Scalars, nulls, missing keys, ints, misaligned and repeated ids, unknown sources (official `_ensure_field_is_list`)."
    recs = rows()
    recs[5]['metadata']['question_types'] = 'summarization'          # a scalar -> [scalar]
    recs[5]['metadata']['qa_pair_ids'] = 'sum_0'
    for k in ('demo', 'keypoints', 'uuid', 'haystack_sessions'): recs[0]['metadata'].pop(k)   # missing keys
    recs[3]['answers'] = [[43], ['12'], [7.5]]                       # numbers cast with str()
    recs[3]['metadata']['question_dates'] = ['2024/01/01']            # one date for three questions: broadcast
    recs[4]['metadata']['qa_pair_ids'] = ['same', 'same']             # repeated id within a row
    recs[7]['metadata']['qa_pair_ids'] = ['only']                      # one id for three questions: not broadcast
    recs[1]['metadata']['question_types'] = ['a', 'b', 'c']            # longer than the questions
    recs[1]['questions'] = recs[1]['questions'][0]                     # a scalar question
    recs[1]['answers'] = recs[1]['answers'][0][0]                      # and a scalar answer
    recs[0]['metadata']['source'] = 'wikiqa_full'                      # a source no family knows
    recs[0]['metadata']['license'] = 'cc-by'                           # an unknown metadata field is kept
    by = {i.meta['source']: i for i in load_memoryagentbench(write(tmp_path, recs))}
    s = by['infbench_sum_eng_shots2']
    assert (s.queries[0].qtype, s.queries[0].id) == ('summarization', 'sum_0')
    icl = by['icl_banking77_5900shot_balance']
    assert [q.answers for q in icl.queries] == [['43'], ['12'], ['7.5']]
    assert icl.queries[0].meta['raw_answers'] == [43] and 'raw_answers' not in icl.queries[1].meta
    assert [q.date for q in icl.queries] == ['2024/01/01'] * 3 and icl.meta['misaligned_fields'] == ['question_dates']
    rec = by['recsys_redial_full']
    assert [q.id for q in rec.queries] == ['same', 'same#2'] and rec.meta['duplicate_query_ids'] == ['same#2']
    ev = by['eventqa_full']
    assert len(ev.queries) == 1 and ev.queries[0].answers == ['A truck turned the corner.']
    assert ev.queries[0].qtype == 'a' and ev.meta['misaligned_fields'] == ['qa_pair_ids', 'question_types', 'previous_events']
    assert [q.id for q in by['factconsolidation_sh_6k'].queries] == ['only', 'factconsolidation_sh_6k:7:q1', 'factconsolidation_sh_6k:7:q2']
    assert by['factconsolidation_sh_6k'].meta['misaligned_fields'] == ['qa_pair_ids']
    unk = by['wikiqa_full']
    assert (unk.meta['known_source'], unk.meta['competency'], unk.meta['chunk_size'], unk.meta['template']) == \
           (False, None, 4096, 'ruler_qa')
    assert unk.meta['metadata'] == {'license': 'cc-by'} and unk.queries[0].id == 'ruler_qa1_197K_no0'
    check_instances(list(by.values()), 'metadata forms')


def test_selection():
    ids = lambda s: [i.id for i in load_memoryagentbench(JSON, source=s)]
    assert ids('CR') == ids('Conflict_Resolution') == ['factconsolidation_sh_6k:7', 'factconsolidation_mh_6k:8']
    assert ids('AR') == ['ruler_qa1_197K:0', 'eventqa_full:1', 'longmemeval_s*:2']
    assert ids('LRU') == ['infbench_sum_eng_shots2:5', 'detective_qa:6']
    assert ids('TTL') == ['icl_banking77_5900shot_balance:3', 'recsys_redial_full:4']
    assert ids('longmemeval_s*') == ['longmemeval_s*:2'] and ids('FactCon-MH') == ['factconsolidation_mh_6k:8']
    assert len(ids(None)) == 9
    with pytest.raises(RecordError, match=re.escape("memoryagentbench.json: no row has metadata.source 'longmemeval_s';")):
        load_memoryagentbench(JSON, source='longmemeval_s')
    with pytest.raises(RecordError, match='no row has metadata.source'): load_memoryagentbench(JSON, source='∞Bench-QA')


def test_registry_and_sha256(monkeypatch, tmp_path):
    assert LOADERS.get_impl('memoryagentbench') is load_memoryagentbench
    good = file_sha256(JSON)
    assert len(load_memoryagentbench(JSON, sha256=good)) == 9
    with pytest.raises(ChecksumError, match=re.escape(f'{JSON}: sha256 {good} does not match')):
        load_memoryagentbench(JSON, sha256='ab' * 32)
    monkeypatch.setitem(M.KNOWN_SHA256, 'memoryagentbench.json', '0' * 64)
    with pytest.raises(ChecksumError): load_memoryagentbench(JSON)
    assert len(load_memoryagentbench(JSON, sha256=False)) == 9
    with pytest.raises(ValueError, match='chunk_size'): load_memoryagentbench(JSON, chunk_size=0)

# ---------------------------------------------------------------- malformed rows

def _set(path, value):
    def f(recs):
        obj = recs
        for k in path[:-1]: obj = obj[k]
        if value is KeyError: del obj[path[-1]]
        else: obj[path[-1]] = value
    return f

BAD = [
    (_set([3, 'answers'], [['43'], ['12']]), "row 3 (source=icl_banking77_5900shot_balance): field 'answers': 2 answer lists for 3 questions"),
    (_set([3, 'answers'], [['43']]), "row 3 (source=icl_banking77_5900shot_balance): field 'answers': 1 answer lists for 3 questions"),
    (_set([1, 'answers', 1], [None]), "row 1 (source=eventqa_full): field 'answers.1.0': expected a string or an integer or a number, got null"),
    (_set([1, 'answers', 0], [[['deep']]]), "row 1 (source=eventqa_full): field 'answers.0.0.0': expected a string or an integer or a number, got list"),
    (_set([1, 'answers', 0], []), "row 1 (source=eventqa_full): field 'answers.0': no acceptable answer"),
    (_set([1, 'answers', 0], [True]), "field 'answers.0.0': expected a string or an integer or a number, got bool"),
    (_set([5, 'metadata', 'source'], KeyError), "row 5: field 'metadata.source': missing"),
    (_set([5, 'metadata', 'source'], ''), "row 5: field 'metadata.source': empty"),
    (_set([5, 'metadata'], None), "row 5: field 'metadata': expected an object, got null"),
    (_set([6, 'questions'], []), "row 6 (source=detective_qa): field 'questions': no question"),
    (_set([6, 'questions'], [1]), "row 6 (source=detective_qa): field 'questions.0': expected a string, got int"),
    (_set([6, 'answers'], KeyError), "row 6 (source=detective_qa): field 'answers': missing"),
    (_set([0, 'context'], None), "row 0 (source=ruler_qa1_197K): field 'context': expected a string, got null"),
    (_set([0, 'context'], '\n '), "row 0 (source=ruler_qa1_197K): field 'context': empty"),
    (_set([2, 'metadata', 'question_ids'], ['a', 2, 'c']), "row 2 (source=longmemeval_s*): field 'metadata.question_ids.1': expected a string, got int"),
    (_set([3, 'metadata', 'question_types'], [5]), "row 3 (source=icl_banking77_5900shot_balance): field 'metadata.question_types.0': expected a string, got int"),
    (_set([5, 'metadata', 'keypoints'], ['ok', {'k': 1}]), "row 5 (source=infbench_sum_eng_shots2): field 'metadata.keypoints.1': expected a string, got dict"),
    (_set([2, 'metadata', 'haystack_sessions'], {'s': 1}), "row 2 (source=longmemeval_s*): field 'metadata.haystack_sessions': expected a list, got dict"),
]

@pytest.mark.parametrize('mutate,message', BAD)
def test_malformed_rows_name_file_row_field(tmp_path, mutate, message):
    recs = rows(); mutate(recs)
    p = write(tmp_path, recs)
    with pytest.raises(RecordError) as e: load_memoryagentbench(p)
    assert str(e.value).startswith(f'{p}: ') and message in str(e.value), str(e.value)


def test_unselected_rows_are_not_parsed(tmp_path):
    recs = rows(); recs[3]['answers'] = 'broken'; recs[3]['questions'] = None
    assert len(load_memoryagentbench(write(tmp_path, recs), source='CR')) == 2
    with pytest.raises(RecordError, match="row 3 "): load_memoryagentbench(write(tmp_path, recs))


def test_unreadable_files(tmp_path):
    with pytest.raises(RecordError, match='none.parquet: cannot read'): load_memoryagentbench(tmp_path / 'none.parquet')
    (tmp_path / 'x.parquet').write_bytes(b'PAR1 truncated')
    with pytest.raises(RecordError, match='x.parquet: not a readable parquet file'): load_memoryagentbench(tmp_path / 'x.parquet')
    (tmp_path / 'x.json').write_text('{"context": "a"}')
    with pytest.raises(RecordError, match='x.json: expected a JSON array'): load_memoryagentbench(tmp_path / 'x.json')
    (tmp_path / 'y.json').write_text('[1]')
    with pytest.raises(RecordError, match=r"y.json: row 0: field '<row>': expected an object, got int"):
        load_memoryagentbench(tmp_path / 'y.json')

# ---------------------------------------------------------------- chunking

def official_chunker(sentences, chunk_size, count):
    "utils/eval_other_utils.py::chunk_text_into_sentences after sentence splitting, transcribed (datasets.md §3.2)."
    text_chunks, cur, n = [], [], 0
    for s in sentences:
        m = count(s)
        if n + m > chunk_size:
            text_chunks.append(' '.join(cur)); cur, n = [s], m
        else: cur.append(s); n += m
    if cur: text_chunks.append(' '.join(cur))
    return text_chunks

sentence = st.text(alphabet='abc ', min_size=1, max_size=12).map(lambda s: s.strip() or 'x')

@settings(max_examples=300, deadline=None)
@given(st.lists(sentence, max_size=30), st.integers(1, 20))
def test_greedy_packing_properties(sents, size):
    count = len
    groups = pack_sentences(sents, size, count)
    assert [s for g in groups for s in g] == sents                      # order kept, nothing lost or repeated
    assert all(g for g in groups)                                       # no empty chunk by default
    for g in groups:                                                    # within the limit unless one over-long sentence
        assert sum(map(count, g)) <= size or len(g) == 1
    for g, nxt in zip(groups, groups[1:]):                              # greedy: the next sentence did not fit
        assert sum(map(count, g)) + count(nxt[0]) > size
    full = pack_sentences(sents, size, count, keep_empty_first=True)
    assert [' '.join(g) for g in full] == official_chunker(sents, size, count)
    assert full == ([[]] + groups if sents and count(sents[0]) > size else groups)


def test_chunking_real_text():
    text = ' '.join(f'Sentence number {i} talks about the harbour of Marn and its {i % 7} boats.' for i in range(200))
    sents = split_sentences(text)
    assert len(sents) == 200
    for size in (16, 50, 512, 4096):
        chunks = chunk_text_into_sentences(text, size)
        assert ' '.join(chunks) == ' '.join(sents)
        assert chunks == official_chunker(sents, size, count_chunk_tokens)
        assert all(sum(count_chunk_tokens(s) for s in split_sentences(c)) <= size for c in chunks)
    assert chunk_text_into_sentences(text) == [' '.join(sents)]
    long_first = 'word ' * 40 + 'end. Short one. Another short one.'
    assert chunk_text_into_sentences(long_first, 20)[0].startswith('word word')
    assert chunk_text_into_sentences(long_first, 20, keep_empty_first=True)[0] == ''


def test_empty_first_chunk_is_recorded(tmp_path):
    recs = rows(); recs[6]['context'] = 'word ' * 30 + 'end. Short one. Another one.'
    p = write(tmp_path, recs)
    det = load_memoryagentbench(p, source='detective_qa', chunk_size=10)[0]
    assert det.meta['empty_first_chunk'] == 'dropped' and det.sessions[0].turns[0].content.startswith('word')
    kept = load_memoryagentbench(p, source='detective_qa', chunk_size=10, keep_empty_first=True)[0]
    assert kept.meta['empty_first_chunk'] == 'kept' and kept.sessions[0].turns[0].content == ''
    assert len(kept.sessions) == len(det.sessions) + 1


def test_table15_sizes_and_override():
    by = {i.meta['source']: i for i in load_memoryagentbench(JSON)}
    assert {s: i.meta['chunk_size'] for s, i in by.items()} == {
        'ruler_qa1_197K': 512, 'eventqa_full': 4096, 'longmemeval_s*': 512, 'icl_banking77_5900shot_balance': 4096,
        'recsys_redial_full': 4096, 'infbench_sum_eng_shots2': 4096, 'detective_qa': 4096,
        'factconsolidation_sh_6k': 512, 'factconsolidation_mh_6k': 512}
    sh = by['factconsolidation_sh_6k']
    assert len(sh.sessions) == 2 and sh.meta['context_tokens'] > 512
    assert all(s.meta['n_tokens'] <= 512 for s in sh.sessions)
    small = load_memoryagentbench(JSON, source='factconsolidation_sh_6k', chunk_size=64)[0]
    assert len(small.sessions) > 8 and all(s.meta['chunk_size'] == 64 for s in small.sessions)
    assert all(s.meta['n_tokens'] <= 64 or s.meta['n_sentences'] == 1 for s in small.sessions)


def test_long_text_beats_nltk_regex_time_limit(monkeypatch):
    "nltk's per-regex ReDoS limit would stop Punkt on a long context; split_sentences raises it for its own call."
    redos = pytest.importorskip('nltk.redos')
    text = 'The lamp is lit. ' * 20000
    monkeypatch.setattr(redos, 'DEFAULT_TIMEOUT', 0.001)
    with pytest.raises(TimeoutError): M._punkt().tokenize(text)
    assert len(split_sentences(text)) == 20000
    assert redos.DEFAULT_TIMEOUT == 0.001                                # restored


def test_tokenizer_detection(monkeypatch, tmp_path):
    monkeypatch.setenv('TIKTOKEN_CACHE_DIR', str(tmp_path))
    assert M.tiktoken_cache_file() is None
    f = tmp_path / hashlib.sha1(M.O200K_URL.encode()).hexdigest(); f.write_bytes(b'not the encoding')
    assert M.tiktoken_cache_file() is None                              # wrong sha256: never used
    monkeypatch.setattr(M, 'O200K_SHA256', hashlib.sha256(b'not the encoding').hexdigest())
    assert M.tiktoken_cache_file() == f
    monkeypatch.setenv('TIKTOKEN_CACHE_DIR', '')
    assert M.tiktoken_cache_file() is None                              # tiktoken: empty dir disables the cache
    if CHUNK_TOKENIZER == M.PRETOKEN_TOKENIZER:
        assert count_chunk_tokens('Hello, world. 1234567') == 8         # 'Hello' ',' ' world' '.' ' ' '123' '456' '7'
        assert count_chunk_tokens('A   B\n\nC') == 5                   # 'A' '  ' ' B' '\n\n' 'C'

# ---------------------------------------------------------------- memorize prompts

def test_memorize_messages():
    by = {i.meta['source']: i for i in load_memoryagentbench(JSON)}
    s = by['factconsolidation_sh_6k'].sessions[1]
    m = memorize_message(s)
    assert m.startswith('Dialogue between User and Assistant  \\n<User> The following context is the facts I have learned: \n')
    assert m.endswith('\n <Assistant> I have learned the facts and I will answer the question you ask.')
    assert s.turns[0].content in m and s.turns[0].content not in MEMORIZE_PROMPT
    assert 'conversation between the user and the assistant' in memorize_message(by['longmemeval_s*'].sessions[0])
    assert memorize_message('x') == MEMORIZE_PROMPT.replace('{time_stamp}', '').replace('{context}', 'x')
    assert '2025-01-01 10:00:00\\n<User>' in memorize_message('x', source='eventqa_65536', time_stamp='2025-01-01 10:00:00')
    assert memorize_message('{context} {x}', template='ruler_qa').count('{context} {x}') == 1

# ---------------------------------------------------------------- checkpoints

@pytest.fixture
def sh(): return load_memoryagentbench(JSON, source='factconsolidation_sh_6k', chunk_size=64)[0]

@pytest.fixture
def count_add_all(monkeypatch):
    calls = []
    orig = BM25Memory.add_all
    monkeypatch.setattr(BM25Memory, 'add_all', lambda self, ss: (calls.append(len(ss)), orig(self, ss))[1])
    return calls

QUERIES = ('Where was Nimbus born?', 'What is the job of Tarn?', 'Which country is Quill a citizen of?')

def answers(mem): return [[(e.session_id, e.text, round(e.score, 9)) for e in mem.search(q)] for q in QUERIES]


def test_checkpoint_second_call_loads(tmp_path, sh, count_add_all):
    spec = {'name': 'bm25', 'k': 3}
    m1 = built_memory(spec, sh, tmp_path)
    assert count_add_all == [len(sh.sessions)]
    m2, status = MemoryCheckpoint(tmp_path).get_or_build(spec, sh.sessions)
    assert status == 'loaded' and count_add_all == [len(sh.sessions)]     # no second ingestion
    assert answers(m2) == answers(m1) and isinstance(m2, BM25Memory)
    assert [p.name for p in tmp_path.iterdir()] == [MemoryCheckpoint(tmp_path).path(spec, sh).name]   # no temporaries


def test_checkpoint_key(tmp_path, sh):
    ck = MemoryCheckpoint(tmp_path)
    p = ck.path({'name': 'bm25'}, sh)
    assert p.name.startswith('bm25-') and p.suffix == '.pkl'
    assert ck.path({'name': 'bm25', 'k': 5}, sh) != p                              # another spec
    assert ck.path({'name': 'bm25'}, sh, chunk_size=4096) != p                     # another chunk size
    other = load_memoryagentbench(JSON, source='factconsolidation_sh_6k', chunk_size=32)[0]
    assert ck.path({'name': 'bm25'}, other) != p                                   # another chunking
    edited = sh.model_copy(deep=True); edited.sessions[0].turns[0].content += ' More.'
    assert ck.path({'name': 'bm25'}, edited) != p                                  # another context
    assert ck.path({'name': 'bm25'}, sh.sessions) == p                             # Instance or its sessions


def corrupt_flip(p): b = bytearray(p.read_bytes()); b[-5] ^= 0x55; p.write_bytes(bytes(b))
def corrupt_truncate(p): p.write_bytes(p.read_bytes()[:-20])
def corrupt_magic(p): p.write_bytes(b'garbage' + p.read_bytes()[7:])
def corrupt_header(p):
    data = p.read_bytes(); nl = data.index(b'\n', len(C.CHECKPOINT_MAGIC))
    p.write_bytes(data[:len(C.CHECKPOINT_MAGIC)] + b'{not json' + data[nl:])

@pytest.mark.parametrize('corrupt,msg', [(corrupt_flip, 'sha256 mismatch'), (corrupt_truncate, 'sha256 mismatch'),
                                         (corrupt_magic, 'not a memlab memory checkpoint'), (corrupt_header, 'unreadable header')])
def test_corrupted_checkpoint_is_rebuilt(tmp_path, sh, count_add_all, corrupt, msg):
    spec = {'name': 'bm25', 'k': 3}
    m1 = built_memory(spec, sh, tmp_path)
    p = MemoryCheckpoint(tmp_path).path(spec, sh)
    corrupt(p)
    with pytest.raises(C.CheckpointError, match=msg): MemoryCheckpoint(tmp_path).load(spec, sh)
    with pytest.warns(UserWarning, match=msg):
        m2, status = MemoryCheckpoint(tmp_path).get_or_build(spec, sh)
    assert status == 'rebuilt' and len(count_add_all) == 2 and answers(m2) == answers(m1)
    assert MemoryCheckpoint(tmp_path).get_or_build(spec, sh)[1] == 'loaded' and len(count_add_all) == 2


def test_stale_checkpoint_is_rejected(tmp_path, sh):
    "A file whose header names another key (e.g. copied over by hand) is not used."
    spec_a, spec_b = {'name': 'bm25', 'k': 3}, {'name': 'bm25', 'k': 4}
    ck = MemoryCheckpoint(tmp_path)
    built_memory(spec_a, sh, tmp_path)
    ck.path(spec_a, sh).replace(ck.path(spec_b, sh))
    with pytest.raises(C.CheckpointError, match='key mismatch'): ck.load(spec_b, sh)


def test_interrupted_save_keeps_the_old_file(tmp_path, sh, monkeypatch):
    spec = {'name': 'bm25', 'k': 3}
    built_memory(spec, sh, tmp_path)
    p = MemoryCheckpoint(tmp_path).path(spec, sh); before = p.read_bytes()
    def boom(*a): raise OSError('disk full')
    monkeypatch.setattr(M.os, 'replace', boom)
    with pytest.raises(OSError, match='disk full'): MemoryCheckpoint(tmp_path).save(make_memory(**spec), spec, sh)
    assert p.read_bytes() == before and sorted(tmp_path.iterdir()) == [p]


@MEMORIES.register('test-mab-unpicklable')
class _Unpicklable(BM25Memory):
    "A BM25 memory holding a lock: cannot be pickled."
    def __init__(self, **kw): super().__init__(**kw); self.lock = threading.Lock()


def test_unpicklable_memory_is_built_not_saved(tmp_path, sh):
    with pytest.warns(UserWarning, match="'test-mab-unpicklable' cannot be checkpointed"):
        m, status = MemoryCheckpoint(tmp_path).get_or_build({'name': 'test-mab-unpicklable'}, sh)
    assert status == 'built' and m.search('Nimbus') and list(tmp_path.iterdir()) == []


SPECS = [{'name': 'bm25', 'k': 3}, {'name': 'dense', 'k': 3, 'embedder': 'hash-embed'},
         {'name': 'hybrid', 'k': 3, 'embedder': 'hash-embed'}, {'name': 'long-context'}, {'name': 'items', 'k': 3},
         {'name': 'ppr-graph', 'k': 3}, {'name': 'entity-graph', 'k': 3}]

def test_checkpoint_from_another_process(tmp_path, sh):
    """Checkpoints written by another process (whose term vocabulary numbers terms in another order) answer exactly as
    memories built here: TermBlocks are pickled as terms, derived indexes are dropped and rebuilt."""
    code = (f"import memlab.planar, memlab.graph\n"
            f"from memlab.protocols.mab.data import load_memoryagentbench\nfrom memlab.memory import make_memory\nfrom memlab.checkpoint import MemoryCheckpoint\n"
            f"rows = load_memoryagentbench({str(JSON)!r}, chunk_size=64)\n"
            f"make_memory('bm25').add_all(rows[0].sessions); make_memory('items').add_all(rows[1].sessions)\n"
            f"for spec in {SPECS!r}:\n"
            f"    m = make_memory(**spec); m.add_all(rows[7].sessions)\n"
            f"    m.search('Nimbus born')   # built indexes and caches exist when it is saved\n"
            f"    MemoryCheckpoint({str(tmp_path)!r}).save(m, spec, rows[7])\n")
    subprocess.run([sys.executable, '-c', code], check=True, cwd=Path(__file__).parent.parent, timeout=300)
    import memlab.planar, memlab.graph  # noqa: F401  (register the memories)
    for spec in SPECS:
        loaded, status = MemoryCheckpoint(tmp_path).get_or_build(spec, sh)
        fresh = make_memory(**spec); fresh.add_all(sh.sessions)
        assert status == 'loaded', spec
        assert answers(loaded) == answers(fresh), spec
        if hasattr(loaded, 'analyses'):                                # the store's identity entries are not saved
            assert all(a.fast == [] for a in loaded.analyses), spec


def test_naive_pickle_would_be_wrong(tmp_path, sh):
    "The premise of the custom pickler: a plain pickle of a BM25 memory is wrong in a process with another vocabulary."
    code = (f"import pickle\nfrom memlab.protocols.mab.data import load_memoryagentbench\nfrom memlab.memory import make_memory\n"
            f"rows = load_memoryagentbench({str(JSON)!r}, chunk_size=64)\n"
            f"make_memory('bm25').add_all(rows[0].sessions)\n"
            f"m = make_memory('bm25', k=3); m.add_all(rows[7].sessions)\n"
            f"open({str(tmp_path / 'plain.pkl')!r}, 'wb').write(pickle.dumps(m))\n")
    subprocess.run([sys.executable, '-c', code], check=True, cwd=Path(__file__).parent.parent, timeout=300)
    fresh = make_memory('bm25', k=3); fresh.add_all(sh.sessions)
    assert answers(pickle.loads((tmp_path / 'plain.pkl').read_bytes())) != answers(fresh)

# ---------------------------------------------------------------- summary and CLI

def test_inspect_summary(PARQUET):
    s = inspect_memoryagentbench(PARQUET).set_index('source')
    assert list(s.index) == [r['metadata']['source'] for r in rows()]
    assert s.loc['longmemeval_s*', ['competency', 'task', 'rows', 'contexts', 'questions', 'abstention']].tolist() == \
           ['AR', 'LME(S*)', 1, 1, 3, 1]
    sh = load_memoryagentbench(JSON, source='factconsolidation_sh_6k')[0]
    assert s.loc['factconsolidation_sh_6k', ['tokens_min', 'tokens_max', 'chunk_size', 'chunks']].tolist() == \
           [sh.meta['context_tokens'], sh.meta['context_tokens'], 512, 2]
    assert int(s['questions'].sum()) == sum(len(i.queries) for i in load_memoryagentbench(JSON)) == 18
    q = inspect_memoryagentbench(JSON, chunk_size=64).attrs
    assert q['tokenizer'] == CHUNK_TOKENIZER and q['quirks']['rows with one query over several answer lists'] == 1
    assert inspect_memoryagentbench(JSON, source='CR', chunk_size=64)['chunks'].tolist() == [
        len(load_memoryagentbench(JSON, source='factconsolidation_sh_6k', chunk_size=64)[0].sessions)] * 2


from test_data_loaders import cli  # noqa: E402  (the in-process CLI runner: exit code, stdout, stderr)


def test_cli_inspect(tmp_path, PARQUET):
    code, out, err = cli('data', 'inspect', 'memoryagentbench', PARQUET)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f'{PARQUET}: memoryagentbench' and f'sha256 {file_sha256(PARQUET)}' in lines[1]
    assert f'tokens counted with {CHUNK_TOKENIZER}' in lines[2]
    assert re.search(r'factconsolidation_sh_6k\s+CR\s+FactCon-SH\s+1\s+1\s+3\s+0\s+\d+\s+\d+\s+\d+\s+512\s+2$', out, re.M)
    assert lines[-1].startswith('quirks: unknown sources 0;')
    code, out, _ = cli('data', 'inspect', 'memoryagentbench', JSON, '-o', 'source=TTL', '-o', 'chunk_size=16')
    assert code == 0 and 'recsys_redial_full' in out and 'eventqa_full' not in out and re.search(r'\s16\s+\d+$', out, re.M)
    code, _, err = cli('data', 'inspect', 'locomo', FX / 'locomo10.json', '-o', 'source=CR')
    assert code == 2 and err.startswith('memlab: -o source: locomo files take no options')
    code, _, err = cli('data', 'inspect', 'memoryagentbench', JSON, '-o', 'layout=s')
    assert code == 2 and err.startswith('memlab: -o layout: memoryagentbench files take -o source=..., -o chunk_size=...')
    code, _, err = cli('data', 'inspect', 'memoryagentbench', JSON, '-o', 'source=nothing')
    assert code == 2 and "no row has metadata.source 'nothing'" in err
    code, _, err = cli('data', 'inspect', 'memoryagentbench', JSON, '-o', 'chunk_size=0')
    assert code == 2 and "field 'option.chunk_size': Input should be greater than or equal to 1" in err
    code, _, err = cli('data', 'inspect', 'memoryagentbench', JSON, '--sha256', '1' * 64)
    assert code == 2 and err.startswith(f'memlab: {JSON}: sha256')


def test_cli_bad_file_exits_2(tmp_path):
    recs = rows(); recs[7]['answers'][1] = {'x': 1}
    bad = write(tmp_path, recs)
    env = dict(os.environ, MEMLAB_PROGRESS='0')
    r = subprocess.run([MEMLAB, 'data', 'inspect', 'memoryagentbench', str(bad)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stdout == ''
    assert r.stderr == (f"memlab: {bad}: row 7 (source=factconsolidation_sh_6k): field 'answers.1': "
                        "expected a string or an integer or a number, got dict\n")
    ok = subprocess.run([MEMLAB, 'data', 'inspect', 'memoryagentbench', str(JSON)], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0 and 'infbench_sum_eng_shots2' in ok.stdout
