"""Hostile input is refused before anything is written: one `RecordError` line naming file, record and field.

Cases reported by outside testing, at the library level (and through `memlab run` / `memlab data inspect` where the
library alone decides the outcome):

- YAML: duplicate mapping keys (block and JSON-style flow mappings) silently took the second value; an alias bomb
  ("billion laughs") expanded without bound. `memlab.core.load_yaml` refuses both (aliases are refused altogether).
- JSON: duplicate keys silently took the second value; a FIFO as the data file hung every loader; whole-file reads
  had no size bound; deep nesting and 5,000-digit numbers escaped as raw RecursionError / ValueError.
- Arguments of registered implementations were not type- or range-checked ('12', 12.7, .nan, 0 for `k`; an
  unknown reader tier; `n_instances: 1000000000`; a typo such as `n_instance`): `memlab.core.validate_args`.
- Dates: sessions in the right order but in mixed formats were "out of order" (strings compared); an unparseable
  date crashed mid-run: `memlab.core.parse_date`, `Session.parsed_date`, `check_dates`, `chronological`.
- Misleading messages: a session id "" or an instance without sessions was blamed on evidence ids.

The CLI cases run the real `memlab run` on each bad config or data file: one line, exit 2, no store written.
"""
import copy, datetime as dt, json, math, os, re, subprocess, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

import memlab.core as core
from memlab.core import Instance, Query, Session, Turn, RecordError, load_records, read_json_records, validate_record
from memlab.synth import make_benchmark

FX = Path(__file__).parent / 'fixtures'
MEMLAB = str(Path(sys.executable).with_name('memlab'))
ENV = dict(os.environ, MEMLAB_PROGRESS='0')
GOOD = [i.model_dump(mode='json') for i in make_benchmark(n_instances=2, queries_per_instance=2, n_filler=2, seed=1)]


def no_hang(fn, fifo: Path, timeout: float=10):
    "fn(), failing (not hanging) if it blocks: a reader stuck opening the FIFO is released by opening its write end."
    box = {}
    def target():
        try: box['ret'] = fn()
        except BaseException as e: box['exc'] = e
    t = threading.Thread(target=target, daemon=True); t.start(); t.join(timeout)
    if t.is_alive():
        try: os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError: pass
        t.join(5)
        pytest.fail(f'blocked on the FIFO {fifo} for {timeout} s')
    if 'exc' in box: raise box['exc']
    return box.get('ret')

@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / 'data.json'; os.mkfifo(p); return p


# ------------------------------------------------------------------------------------------------ YAML
@pytest.mark.parametrize('text,line,key', [
    ('name: a\npolicies: []\nname: b\n', 3, 'name'),                                   # block mapping
    ('name: a\nmemories: [{name: bm25, k: 12, k: 3}]\n', 2, 'k'),                      # JSON-style flow mapping
    ('name: a\ndataset:\n  kind: synthetic\n  params: {n_filler: 2}\n  kind: instances\n', 5, 'kind'),   # nested
    ('{"name": "a", "name": "b"}', 1, 'name'),                                          # JSON is YAML too
])
def test_yaml_duplicate_keys_refused(text, line, key):
    with pytest.raises(RecordError) as e: core.load_yaml(text, 'cfg.yaml')
    msg = str(e.value)
    assert msg.startswith('cfg.yaml: ') and f'line {line}' in msg and f"'{key}'" in msg and 'duplicate' in msg, msg
    assert '\n' not in msg

def test_yaml_duplicate_key_in_file_names_the_file(tmp_path):
    p = tmp_path / 'run.yaml'; p.write_text('name: a\nseed: 1\nseed: 2\n')
    with pytest.raises(RecordError, match=re.escape(str(p)) + r": line 3: .*duplicate key 'seed'"): core.load_yaml(p)

def test_yaml_same_key_in_different_mappings_is_fine():
    d = core.load_yaml('memories:\n- {name: bm25, k: 12}\n- {name: dense, k: 12}\n', 'cfg.yaml')
    assert d == {'memories': [{'name': 'bm25', 'k': 12}, {'name': 'dense', 'k': 12}]}

BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + ''.join(
    f'{c}: &{c} [{",".join([f"*{p}"] * 9)}]\n' for p, c in zip('abcdefgh', 'bcdefghi'))

def test_yaml_alias_bomb_is_refused_before_expansion():
    with pytest.raises(RecordError) as e: core.load_yaml(BOMB, 'bomb.yaml')
    assert re.search(r'bomb\.yaml: line 2: .*alias', str(e.value)), str(e.value)

def test_yaml_small_alias_refused_with_a_clear_message():
    with pytest.raises(RecordError, match=r"cfg\.yaml: line 3: .*alias '\*m'"):
        core.load_yaml('name: a\nm: &m {name: bm25}\nmemories: [*m]\n', 'cfg.yaml')

@pytest.mark.parametrize('text,pat', [
    ('[' * 20000, r'nested too deeply'),
    ('n: ' + '9' * 5000 + '\n', r'line 1'),
    ('a: [1, 2\n', r'not valid YAML'),
])
def test_yaml_other_hostile_text(text, pat):
    with pytest.raises(RecordError, match=r'cfg\.yaml: .*' + pat): core.load_yaml(text, 'cfg.yaml')

def test_yaml_fifo_refused(fifo):
    with pytest.raises(RecordError, match='not a regular file'): no_hang(lambda: core.load_yaml(fifo), fifo)


# ------------------------------------------------------------------------------------------------ JSON
def _dup_content(text: str) -> str:
    "The first turn's `content` key written twice (a JSON dump cannot hold a duplicate key, so edit the text)."
    return text.replace('"content": ', '"content": "first", "content": ', 1)

def test_json_duplicate_key_refused(tmp_path):
    p = tmp_path / 'inst.json'
    p.write_text(json.dumps(GOOD[:1]) [:-1] + ', ' + _dup_content(json.dumps(GOOD[1])) + ']')
    with pytest.raises(RecordError) as e: read_json_records(p)
    msg = str(e.value)
    assert msg.startswith(f'{p}: record 1 ') and repr(GOOD[1]['id']) in msg, msg
    assert "field 'sessions.0.turns.0.content'" in msg and "duplicate key 'content'" in msg, msg

def test_jsonl_duplicate_key_refused(tmp_path):
    p = tmp_path / 'inst.jsonl'
    p.write_text(json.dumps(GOOD[0]) + '\n' + json.dumps(GOOD[1]).replace('{"id": ', '{"id": "x", "id": ', 1) + '\n')
    with pytest.raises(RecordError, match=re.escape(str(p)) + r": line 2 \(record 1\b.*field 'id': duplicate key 'id'"):
        load_records(p, Instance)

def test_json_fifo_refused_by_every_loader(fifo):
    from memlab.data import load_longmemeval, load_locomo, inspect_dataset
    from memlab.protocols.mab.data import load_memoryagentbench
    for fn in (lambda: read_json_records(fifo), lambda: load_records(fifo, Instance), lambda: load_longmemeval(fifo),
               lambda: load_locomo(fifo), lambda: load_memoryagentbench(fifo), lambda: inspect_dataset('locomo', fifo)):
        with pytest.raises(RecordError, match=re.escape(str(fifo)) + r': not a regular file \(a FIFO\)'): no_hang(fn, fifo)

def test_check_regular_file(tmp_path):
    test_file = tmp_path / 'x.json'; test_file.write_text('[]')
    assert core.check_regular_file(test_file) == 2
    with pytest.raises(RecordError, match='not a regular file \\(a directory\\)'): core.check_regular_file(tmp_path)
    with pytest.raises(RecordError, match='cannot read: No such file'): core.check_regular_file(tmp_path / 'nope.json')

def test_file_size_bound(tmp_path, monkeypatch):
    p = tmp_path / 'big.json'; p.write_text(json.dumps(GOOD))
    with pytest.raises(RecordError, match=re.escape(str(p)) + r': .*larger than the limit of 100 bytes.*MEMLAB_MAX_FILE_BYTES'):
        read_json_records(p, max_bytes=100)
    monkeypatch.setenv('MEMLAB_MAX_FILE_BYTES', '100')
    with pytest.raises(RecordError, match='larger than the limit of 100 bytes'): load_records(p, Instance)
    from memlab.data import load_longmemeval
    with pytest.raises(RecordError, match='larger than the limit'): load_longmemeval(FX / 'longmemeval_s_cleaned.json')
    monkeypatch.setenv('MEMLAB_MAX_FILE_BYTES', str(10**9))
    assert len(load_records(p, Instance)) == 2

@pytest.mark.parametrize('text,pat', [
    ('[' * 100000, r'nested too deeply'),
    ('[{"id": 1' + '0' * 5000 + '}]', r'not valid JSON'),
    ('{"a": 1}\n' + '[' * 100000 + '\n', r'line 2 \(record 1\)'),
])
def test_json_other_hostile_text(tmp_path, text, pat):
    p = tmp_path / 'x.jsonl'; p.write_text(text)
    with pytest.raises(RecordError, match=re.escape(str(p)) + r': .*' + pat): read_json_records(p)


# ------------------------------------------------------------------------------------------------ typed arguments
from memlab.memory import MEMORIES
from memlab.agent import POLICIES
import memlab.runner   # registers every policy, memory, judge and backend

@pytest.mark.parametrize('value,msg', [
    ('12', 'Input should be a valid integer'), (12.7, 'Input should be a valid integer'),
    (12.0, 'Input should be a valid integer'), (math.nan, 'Input should be a valid integer'),
    ('big', 'Input should be a valid integer'), (2.5, 'Input should be a valid integer'),
    (True, 'Input should be a valid integer'), (0, 'Input should be greater than or equal to 1'),
    (-3, 'Input should be greater than or equal to 1'),
])
def test_memory_k_is_a_positive_int(value, msg):
    with pytest.raises(RecordError) as e: core.validate_args(MEMORIES['bm25'], {'name': 'bm25', 'k': value}, 'memories.0', 'cfg.yaml')
    assert str(e.value) == f"cfg.yaml: field 'memories.0.k': {msg}", str(e.value)

@pytest.mark.parametrize('name,arg', [('long-context', 'window_tokens'), ('long-context', 'chunk_tokens'), ('bm25', 'chunk_tokens'),
                                      ('dense', 'k'), ('hybrid', 'k'), ('items', 'k'), ('ppr-graph', 'k'),
                                      ('entity-graph', 'chunk_tokens'), ('ppr-graph', 'window')])
def test_memory_sizes_are_positive(name, arg):
    with pytest.raises(RecordError, match=rf"x\.yaml: field 'memories\.1\.{arg}': Input should be greater than or equal to 1"):
        core.validate_args(MEMORIES[name], {'name': name, arg: 0}, 'memories.1', 'x.yaml')

def test_validate_args_returns_the_given_args():
    assert core.validate_args(MEMORIES['bm25'], {'name': 'bm25', 'k': 5, 'b': 1}, 'memories.0', 'x') == {'k': 5, 'b': 1.0}
    assert core.validate_args(MEMORIES['items'], {'name': 'items', 'roles': ['user', 'assistant']}, 'm', 'x') == {'roles': ['user', 'assistant']}

def test_unknown_argument_is_named_with_a_suggestion():
    from memlab.synth import make_benchmark
    with pytest.raises(RecordError, match=r"cfg\.yaml: field 'dataset\.params\.n_instance': unknown argument.*did you mean 'n_instances'"):
        core.validate_params(make_benchmark, {'n_instance': 3}, 'dataset.params', 'cfg.yaml')
    with pytest.raises(RecordError, match=r"field 'memories\.0\.kk': unknown argument of memory 'bm25'"):
        core.validate_args(MEMORIES['bm25'], {'name': 'bm25', 'kk': 3}, 'memories.0', 'cfg.yaml')

@pytest.mark.parametrize('name', ['offline-reader', 'mab-reader'])
def test_reader_tier_is_checked(name):
    with pytest.raises(RecordError, match=r"x\.yaml: field 'policies\.0\.tier': Input should be 'weak', 'medium' or 'strong'"):
        core.validate_args(POLICIES.get_impl(name), {'name': name, 'tier': 'expert'}, 'policies.0', 'x.yaml')
    assert core.validate_args(POLICIES.get_impl(name), {'name': name, 'tier': 'weak'}, 'policies.0', 'x.yaml') == {'tier': 'weak'}

@pytest.mark.parametrize('params,pat', [
    ({'n_instances': 10**9}, r"field 'dataset\.params\.n_instances': Input should be less than or equal to 100000"),
    ({'n_instances': '1e9'}, r"field 'dataset\.params\.n_instances': Input should be a valid integer"),
    ({'n_instances': 1e9}, r"field 'dataset\.params\.n_instances': Input should be a valid integer"),
    ({'queries_per_instance': 0}, r"'dataset\.params\.queries_per_instance': Input should be greater than or equal to 1"),
    ({'n_filler': -1}, r"'dataset\.params\.n_filler': Input should be greater than or equal to 0"),
    ({'session_turns': [0, 4]}, r"'dataset\.params\.session_turns"),
    ({'distractor_rate': 1.5}, r"'dataset\.params\.distractor_rate': Input should be less than or equal to 1"),
])
def test_synthetic_params_are_bounded(params, pat):
    from memlab.synth import make_benchmark
    with pytest.raises(RecordError, match=r'cfg\.yaml: .*' + pat): core.validate_params(make_benchmark, params, 'dataset.params', 'cfg.yaml')

def test_synthetic_params_valid_ones_pass():
    from memlab.synth import make_benchmark, make_ladder_benchmark
    p = {'n_instances': 3, 'queries_per_instance': 4, 'n_filler': 0, 'session_turns': [2, 8], 'seed': 3}
    assert core.validate_params(make_benchmark, p, 'dataset.params', 'x') == p
    dump = lambda insts: [i.model_dump(mode='json') for i in insts]                     # explicit arguments, same data
    assert dump(make_benchmark(**p)) == dump(make_benchmark(3, 4, 0, seed=3, session_turns=(2, 8)))
    with pytest.raises(RecordError, match=r"'dataset\.params\.pool_size': Input should be less than or equal to"):
        core.validate_params(make_ladder_benchmark, {'pool_size': 10**12}, 'dataset.params', 'x')
    with pytest.raises(RecordError, match=r"'dataset\.params\.qtypes\.0'"):
        core.validate_params(make_ladder_benchmark, {'qtypes': ['preference']}, 'dataset.params', 'x')

def _registries():
    from memlab.judge import JUDGES
    from memlab.llm import BACKENDS
    from memlab.index import EMBEDDERS
    from memlab.protocols.mab.synth import MAB_GENERATORS
    return [MEMORIES, POLICIES, JUDGES, BACKENDS, EMBEDDERS, memlab.runner.DATASETS, MAB_GENERATORS]

def test_every_registered_default_passes_its_own_annotations():
    "The annotations agree with the defaults: validating every default argument raises nothing."
    import inspect
    n = 0
    for reg in _registries():
        for name, impl in reg.items():
            ps = inspect.signature(impl).parameters.values()
            spec = {p.name: p.default for p in ps if p.default is not p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
            core.validate_params(impl, spec, f'{reg.kind}.{name}', 'defaults', partial=True); n += 1
    assert n > 30


# ------------------------------------------------------------------------------------------------ dates
@pytest.mark.parametrize('text,when', [
    ('2023/05/30 (Tue) 23:40', dt.datetime(2023, 5, 30, 23, 40)),          # LongMemEval and the synthetic generator
    ('1:56 pm on 8 May, 2023', dt.datetime(2023, 5, 8, 13, 56)),           # LoCoMo
    ('10:04 AM on 21 Sept, 2023'.replace('Sept', 'Sep'), dt.datetime(2023, 9, 21, 10, 4)),
    ('2023-05-08T10:00:00+02:00', dt.datetime(2023, 5, 8, 10, 0)),        # ISO 8601 (kept naive)
    ('2023-05-08T10:00:00Z', dt.datetime(2023, 5, 8, 10, 0)), ('2023-05-08', dt.datetime(2023, 5, 8)),
])
def test_parse_date_in_core(text, when):
    assert core.parse_date(text) == when
    assert Session(id='s', date=text).parsed_date == when and Query(id='q', question='?', date=text).parsed_date == when

def test_mixed_formats_in_the_right_order_are_chronological():
    from memlab.memory import chronological, make_memory
    ss = [Session(id='a', date='2023/05/30 (Tue) 23:40', turns=[Turn(role='user', content='I adopted a dog named Rex.')]),
          Session(id='b', date='2023-06-01T10:00:00', turns=[Turn(role='user', content='I moved to Lisbon.')]),
          Session(id='c', date='1:56 pm on 8 June, 2023', turns=[Turn(role='user', content='I bought a red car.')])]
    assert chronological(ss) == ss
    for name in ('bm25', 'long-context', 'items', 'entity-graph'): make_memory(name).add_all(ss)
    with pytest.raises(ValueError, match="session 'b'.*ingest chronologically"): chronological([ss[0], ss[2], ss[1]])

def test_unparseable_date_is_a_record_error():
    from memlab.memory import chronological
    bad = [Session(id='a', date='2023/05/30 (Tue) 23:40'), Session(id='b', date='last Tuesday')]
    with pytest.raises(RecordError, match=r"session 'b': field 'date': cannot parse 'last Tuesday'"): chronological(bad)

def test_check_dates_names_file_record_and_field():
    insts = [Instance.model_validate(copy.deepcopy(g)) for g in GOOD]
    assert core.check_dates(insts, 'x.json') is insts
    insts[1].sessions[2].date = 'sometime in May'
    with pytest.raises(RecordError, match=rf"x\.json: record 1 \(id='{GOOD[1]['id']}'\): field 'sessions\.2\.date': cannot parse 'sometime in May'"):
        core.check_dates(insts, 'x.json')
    insts = [Instance.model_validate(copy.deepcopy(g)) for g in GOOD]; insts[0].queries[1].date = '31/02/2023'
    with pytest.raises(RecordError, match=r"record 0 .*field 'queries\.1\.date': cannot parse '31/02/2023'"): core.check_dates(insts, 'x.json')

def test_check_dates_ordered():
    insts = [Instance.model_validate(copy.deepcopy(g)) for g in GOOD]
    s = insts[0].sessions; s[1], s[2] = s[2], s[1]
    core.check_dates(insts, 'x.json')
    with pytest.raises(RecordError, match=r"record 0 .*field 'sessions\.2\.date': .*before the previous session"):
        core.check_dates(insts, 'x.json', ordered=True)

def test_fixture_dates_parse():
    from memlab.data import load_longmemeval, load_locomo
    from memlab.protocols.mab.data import load_memoryagentbench
    for insts in (load_longmemeval(FX / 'longmemeval_s_cleaned.json'), load_longmemeval(FX / 'longmemeval_oracle.json'),
                  load_locomo(FX / 'locomo10.json'), load_memoryagentbench(FX / 'memoryagentbench.json'),
                  make_benchmark(2, 3, 4, seed=0)):
        core.check_dates(insts, 'fixture', ordered=True)


# ------------------------------------------------------------------------------------------------ precise messages
def test_empty_session_id_is_named():
    d = copy.deepcopy(GOOD[0]); d['sessions'][1]['id'] = ''
    with pytest.raises(RecordError, match=r"x\.json: record 0 .*field 'sessions\.1\.id': String should have at least 1 character"):
        validate_record(Instance, d, 'x.json', 0)

def test_instance_without_sessions_is_named():
    d = copy.deepcopy(GOOD[1]); d['sessions'] = []
    inst = validate_record(Instance, d, 'x.json', 1)      # a record on its own may have no sessions...
    with pytest.raises(RecordError) as e: core.check_histories([Instance.model_validate(GOOD[0]), inst], 'x.json')
    msg = str(e.value)                                     # ...but a run needs a history: said so, not blamed on evidence
    assert re.search(r"x\.json: record 1 .*field 'sessions': empty", msg) and 'evidence' not in msg.split('sessions')[0], msg


# ------------------------------------------------------------------------------------------------ CLI
BASE = dict(name='hostile', section='reliability', policies=[{'name': 'offline-reader', 'tier': 'weak'}],
            memories=[{'name': 'bm25', 'k': 12}])

def _mixed_dates(data):
    "The same instants, written in LongMemEval, ISO 8601 and LoCoMo formats in turn (order unchanged)."
    fmts = [lambda d: d.strftime('%Y/%m/%d (%a) %H:%M'), lambda d: d.isoformat(), lambda d: d.strftime('%I:%M %p on %d %B, %Y')]
    for inst in data:
        for j, s in enumerate(inst['sessions']): s['date'] = fmts[j % 3](dt.datetime.strptime(s['date'], '%Y/%m/%d (%a) %H:%M'))
    return data

def _bad_date(data): data[1]['sessions'][2]['date'] = 'sometime in May'; return data
def _no_sessions(data): data[1]['sessions'] = []; return data
def _empty_sid(data): data[0]['sessions'][1]['id'] = ''; return data

# name: (instances data change or raw text, config change or raw YAML, expected exit code, patterns, wired already)
CLI_CASES = {
    'json-duplicate-key': (lambda d: json.dumps(d[:1])[:-1] + ', ' + _dup_content(json.dumps(d[1])) + ']', None, 2,
                           [r"record 1\b", r"sessions\.0\.turns\.0\.content", r"duplicate key 'content'"], True),
    'fifo-data-file':     ('FIFO', None, 2, [r'not a regular file \(a FIFO\)'], True),
    'empty-session-id':   (_empty_sid, None, 2, [r"record 0\b", r"sessions\.1\.id"], True),
    'mixed-date-formats': (_mixed_dates, None, 0, [r'4 rollouts'], True),
    'unparseable-date':   (_bad_date, None, 2, [r"record 1\b", r"sessions\.2\.date", r"sometime in May"], False),
    'no-sessions':        (_no_sessions, None, 2, [r"record 1\b", r"field 'sessions': empty"], False),
    'yaml-duplicate-key': (None, 'name: hostile\npolicies: [{name: offline-reader}]\nmemories: [{name: bm25, k: 12, k: 3}]\n', 2,
                           [r'line 3', r"duplicate key 'k'"], False),
    'yaml-alias':         (None, 'name: &n hostile\nsection: *n\npolicies: [{name: offline-reader}]\nmemories: [{name: bm25}]\n', 2,
                           [r'line 2', r"alias '\*n'"], False),
    'k-string':           (None, lambda c: dict(c, memories=[{'name': 'bm25', 'k': '12'}]), 2,
                           [r"field 'memories\.0\.k': Input should be a valid integer"], False),
    'k-zero':             (None, lambda c: dict(c, memories=[{'name': 'bm25', 'k': 0}]), 2,
                           [r"field 'memories\.0\.k': Input should be greater than or equal to 1"], False),
    'tier-unknown':       (None, lambda c: dict(c, policies=[{'name': 'offline-reader', 'tier': 'expert'}]), 2,
                           [r"field 'policies\.0\.tier'"], False),
    'synthetic-typo':     (None, lambda c: dict(c, dataset={'kind': 'synthetic', 'params': {'n_instance': 2}}), 2,
                           [r"field 'dataset\.params\.n_instance'"], False),
    # the rest of the 45 configs tried from outside: ranges, empty lists, unsafe names, sizes, an alias bomb
    'k-negative':         (None, lambda c: dict(c, memories=[{'name': 'bm25', 'k': -1}]), 2, [r"field 'memories\.0\.k'"], False),
    'k-nan':              (None, lambda c: dict(c, memories=[{'name': 'bm25', 'k': float('nan')}]), 2, [r"field 'memories\.0\.k'"], False),
    'k-float':            (None, lambda c: dict(c, memories=[{'name': 'bm25', 'k': 12.7}]), 2, [r"field 'memories\.0\.k'"], False),
    'window-not-int':     (None, lambda c: dict(c, memories=[{'name': 'long-context', 'window_tokens': 'big'}]), 2,
                           [r"field 'memories\.0\.window_tokens'"], False),
    'samples-zero':       (None, lambda c: dict(c, samples=0), 2, [r"field 'samples'"], False),
    'samples-negative':   (None, lambda c: dict(c, samples=-3), 2, [r"field 'samples'"], False),
    'judge-runs-zero':    (None, lambda c: dict(c, judge_runs=0), 2, [r"field 'judge_runs'"], False),
    'policies-empty':     (None, lambda c: dict(c, policies=[]), 2, [r"field 'policies'"], False),
    'conditions-empty':   (None, lambda c: dict(c, conditions=[]), 2, [r"field 'conditions'"], False),
    'name-escapes':       (None, lambda c: dict(c, name='../../../../escape-run'), 2, [r"field 'name'.*not a safe folder name"], False),
    'name-empty':         (None, lambda c: dict(c, name=''), 2, [r"field 'name'"], False),
    'data-empty':         (lambda d: [], None, 2, [r'no instances|empty'], False),
    'n-instances-float':  (None, lambda c: dict(c, dataset={'kind': 'synthetic', 'params': {'n_instances': 2.5}}), 2,
                           [r"field 'dataset\.params\.n_instances'"], False),
    'n-instances-huge':   (None, lambda c: dict(c, dataset={'kind': 'synthetic', 'params': {'n_instances': 10**9}}), 2,
                           [r"field 'dataset\.params\.n_instances'"], False),
    'yaml-alias-bomb':    (None, 'a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n'
                           'c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n'
                           'name: bomb\npolicies: [{name: offline-reader}]\nmemories: [{name: bm25}]\n', 2, [r'alias'], False),
}

def _run(args, timeout=60):
    try: r = subprocess.run([MEMLAB, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=timeout)
    except subprocess.TimeoutExpired: return dict(rc=None, out='timed out', err='timed out')
    return dict(rc=r.returncode, out=r.stdout + r.stderr, err=r.stderr)

@pytest.fixture(scope='module')
def cli(tmp_path_factory):
    root = tmp_path_factory.mktemp('hostile'); jobs = {}
    for name, (data, cfg, *_ ) in CLI_CASES.items():
        path = root / f'{name}.json'
        if data == 'FIFO': os.mkfifo(path)
        else:
            raw = data(copy.deepcopy(GOOD)) if callable(data) else None
            path.write_text(raw if isinstance(raw, str) else json.dumps(raw if raw is not None else GOOD))
        base = dict(BASE, dataset={'kind': 'instances', 'path': str(path)})
        text = cfg + f'dataset: {{kind: instances, path: {json.dumps(str(path))}}}\n' if isinstance(cfg, str) else \
            yaml.safe_dump(cfg(base) if cfg else base)
        (root / f'{name}.yaml').write_text(text)
        jobs[name] = dict(cfg=root / f'{name}.yaml', data=path, store=root / f'store-{name}')
    fifo = root / 'inspect.json'; os.mkfifo(fifo)
    with ThreadPoolExecutor(2) as ex:            # the FIFO cases in real processes (a hang cannot stall the tests)
        futs = {'fifo-data-file': ex.submit(_run, ['run', jobs['fifo-data-file']['cfg'], '--store', jobs['fifo-data-file']['store']], 30),
                'inspect-fifo': ex.submit(_run, ['data', 'inspect', 'longmemeval', fifo], 30)}
        for n, j in jobs.items():                # the others through the same `memlab` entry point, in this process
            if n != 'fifo-data-file': j.update(_main(['run', j['cfg'], '--store', j['store']]))
        jobs['fifo-data-file'].update(futs['fifo-data-file'].result())
        jobs['inspect-fifo'] = dict(futs['inspect-fifo'].result(), data=fifo, store=root / 'none')
    return jobs

from inproc import memlab_main as _main

@pytest.mark.parametrize('name', list(CLI_CASES))
def test_cli(cli, name):
    j, (_, _, rc, pats, _) = cli[name], CLI_CASES[name]
    assert j['rc'] == rc, j['out']
    if rc == 2:
        lines = j['out'].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith('memlab: ') and 'Traceback' not in j['out'], j['out']
        assert not j['store'].exists(), f'{j["store"]} was written for a bad input'
    for p in pats: assert re.search(p, j['out']), (p, j['out'])

def test_cli_inspect_fifo(cli):
    j = cli['inspect-fifo']
    assert j['rc'] == 2 and re.search(re.escape(str(j['data'])) + r': not a regular file', j['out']), j['out']
