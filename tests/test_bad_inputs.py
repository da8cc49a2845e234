"""Malformed inputs fail clearly (file, record, field named) and leave nothing written.

A valid instances file (3 synthetic users, `Instance.model_dump(mode='json')`) is broken in one way per case: a
query without `question`, `answers` of the wrong type (pydantic v2 does not coerce an int or a bare string to
`list[str]`, nor an int to `str`), a turn without `content`, duplicate instance ids, duplicate query ids in one
instance, evidence naming a session that is not in the history, invalid JSON, a JSONL file with a bad line, ...
Run configs are broken the same way: unknown memory / policy / judge / dataset kind, a wrong-typed field, an
unknown top-level field, invalid YAML.

For each, `memlab run CONFIG --store DIR` must exit non-zero, name the file, the record and the field, and DIR must
not exist afterwards; separately, the CLI should print one line `memlab: <message>` and exit 2 rather than a raw
traceback. The library path (`load_records`, `check_instances`, `RunConfig.load`) must raise `RecordError` with
the same information.

All CLI invocations run once in a module fixture, through `memlab.cli.main` in this process (tests/inproc.py).
"""
import copy, json, re

from inproc import memlab_main

import pytest
import yaml

from memlab.core import Instance, Query, RecordError, load_records, validate_record
from memlab.runner import RunConfig, check_instances, load_dataset
from memlab.synth import make_benchmark


GOOD = [i.model_dump(mode='json') for i in make_benchmark(n_instances=3, queries_per_instance=3, n_filler=2, seed=1)]
IDS = [i['id'] for i in GOOD]                                   # synthetic-1-0 .. synthetic-1-2

def rec(i: int) -> str:
    "Pattern naming record i: its index and its id."
    return rf"record {i}\b.*{re.escape(repr(IDS[i]))}"



# ------------------------------------------------------------------------------------------------ cases
def _del(path):
    def f(d):
        *head, last = path
        for k in head: d = d[k]
        del d[last]
    return f

def _set(path, value):
    def f(d):
        *head, last = path
        for k in head: d = d[k]
        d[last] = value
    return f

def _jsonl_bad_line(_):
    return '\n'.join([json.dumps(GOOD[0]), '{"id": "synthetic-1-1", "sessions": [oops', json.dumps(GOOD[2])]) + '\n'

def _jsonl_missing_field(_):
    d = copy.deepcopy(GOOD); del d[1]['queries'][0]['question']
    return '\n'.join(json.dumps(x) for x in d) + '\n'

# name: (suffix, mutate(data) or raw(data) -> str, required patterns besides the file path)
DATA_CASES = {
    'query-missing-question': ('.json', _del([1, 'queries', 0, 'question']), [rec(1), r"queries\.0\.question"]),
    'answers-int':            ('.json', _set([0, 'queries', 1, 'answers'], 42), [rec(0), r"queries\.1\.answers"]),
    'answers-bare-string':    ('.json', _set([2, 'queries', 0, 'answers'], 'Austin'), [rec(2), r"queries\.0\.answers"]),
    'answers-item-int':       ('.json', _set([2, 'queries', 2, 'answers'], ['Austin', 7]), [rec(2), r"queries\.2\.answers\.1"]),
    'instance-id-int':        ('.json', _set([1, 'id'], 17), [r"record 1\b", r"'id'"]),
    'turn-missing-content':   ('.json', _del([1, 'sessions', 2, 'turns', 3, 'content']),
                               [rec(1), r"sessions\.2\.turns\.3\.content"]),
    'record-not-object':      ('.json', _set([1], 'oops'), [r"record 1\b", r"<root>"]),
    'duplicate-instance-id':  ('.json', _set([2, 'id'], IDS[0]), [re.escape(repr(IDS[0])), r"'id'"]),
    'duplicate-query-id':     ('.json', lambda d: d[0]['queries'][2].__setitem__('id', d[0]['queries'][0]['id']),
                               [rec(0), r"queries\.2\.id", re.escape(GOOD[0]['queries'][0]['id'])]),
    'evidence-not-in-history': ('.json', _set([1, 'queries', 1, 'evidence'], ['no_such_session']),
                                [rec(1), r"queries\.1\.evidence", r"no_such_session"]),
    'invalid-json':           ('.json', lambda d: json.dumps(d)[:-25], [r"not valid JSON", r"line \d+ column \d+"]),
    'not-an-array':           ('.json', lambda d: json.dumps({'instances': d}), [r"JSON array"]),
    'jsonl-bad-line':         ('.jsonl', _jsonl_bad_line, [r"not valid JSON", r"(record 1\b|line 2\b)"]),
    'jsonl-missing-field':    ('.jsonl', _jsonl_missing_field, [rec(1), r"queries\.0\.question"]),
}
CHECK_INSTANCES_CASES = {'duplicate-query-id', 'evidence-not-in-history'}     # valid records, invalid together

BASE_CFG = dict(name='bad-input', section='reliability', policies=[{'name': 'offline-reader', 'tier': 'weak'}],
                memories=[{'name': 'bm25', 'k': 12}])

# name: (config change (dict -> dict, or raw YAML text), patterns naming the bad thing, patterns naming the field)
CONFIG_CASES = {
    'unknown-memory':     (lambda c: dict(c, memories=[{'name': 'bm99', 'k': 12}]), [r"bm99"], [r"memories"]),
    'unknown-policy':     (lambda c: dict(c, policies=[{'name': 'gpt-99'}]), [r"gpt-99"], [r"policies"]),
    'unknown-memory-arg': (lambda c: dict(c, memories=[{'name': 'bm25', 'kk': 12}]), [r"kk"], [r"memories"]),
    'unknown-dataset-kind': (lambda c: dict(c, dataset={'kind': 'parquet-dump'}), [r"parquet-dump"], [r"dataset"]),
    'unknown-judge':      (lambda c: dict(c, judge={'name': 'no-such-judge'}), [r"no-such-judge"], [r"judge"]),
    'samples-not-int':    (lambda c: dict(c, samples='many'), [r"integer"], [r"'samples'"]),
    'memories-not-list':  (lambda c: dict(c, memories='bm25'), [r"valid list"], [r"'memories'"]),
    'unknown-top-field':  (lambda c: dict(c, colour='blue'), [r"[Ee]xtra"], [r"'colour'"]),
    'invalid-yaml':       ("name: bad-input\npolicies: [ {name: offline-reader\nmemories: x\n", [r"not valid YAML"],
                           [r"line \d+"]),
}


# ------------------------------------------------------------------------------------------------ fixture
def error_text(out: str) -> str:
    "The error message itself: a traceback's final exception (source lines of the frames could match anything)."
    lines = out.splitlines()
    tb = [i for i, l in enumerate(lines) if l.startswith('Traceback (most recent call last)')]
    if not tb: return out
    j = next((k for k in range(tb[-1] + 1, len(lines)) if lines[k] and not lines[k].startswith(' ')), len(lines))
    return '\n'.join(lines[j:])

@pytest.fixture(scope='module')
def cli(tmp_path_factory):
    "Write every broken file and config, run `memlab run` on each (concurrently), return the outcomes."
    root = tmp_path_factory.mktemp('bad')
    good = root / 'good.json'; good.write_text(json.dumps(GOOD))
    jobs = {}
    def job(key, cfg, cfg_path, data_path=None):
        cfg_path.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg))
        jobs[key] = dict(cfg=cfg_path, data=data_path, store=root / f'store-{key[1]}')
    for name, (suffix, change, *_ ) in DATA_CASES.items():
        p = root / f'{name}{suffix}'
        d = copy.deepcopy(GOOD); raw = change(d)
        p.write_text(raw if isinstance(raw, str) else json.dumps(d))
        job(('data', name), dict(BASE_CFG, dataset={'kind': 'instances', 'path': str(p)}), root / f'{name}.yaml', p)
    missing = root / 'no-such-file.json'
    job(('data', 'missing-file'), dict(BASE_CFG, dataset={'kind': 'instances', 'path': str(missing)}),
        root / 'missing-file.yaml', missing)
    for name, (change, *_ ) in CONFIG_CASES.items():
        base = dict(BASE_CFG, dataset={'kind': 'instances', 'path': str(good)})
        job(('config', name), change if isinstance(change, str) else change(base), root / f'cfg-{name}.yaml', good)
    job(('ok', 'valid'), dict(BASE_CFG, dataset={'kind': 'instances', 'path': str(good)}), root / 'valid.yaml', good)
    for k, j in jobs.items():                    # in this process: each case ends before any work (see tests/inproc.py)
        r = memlab_main(['run', j['cfg'], '--store', j['store']]); j.update(r, err=error_text(r['out']))
    return jobs


DATA_PARAMS = [pytest.param(n, id=n) for n in DATA_CASES]
CONFIG_PARAMS_RUN = [pytest.param(n, id=n) for n in CONFIG_CASES]
CONFIG_PARAMS_NAMES = CONFIG_PARAMS_RUN
ALL_BAD = [('data', n) for n in [*DATA_CASES, 'missing-file']] + [('config', n) for n in CONFIG_CASES]


# ------------------------------------------------------------------------------------------------ CLI
def test_valid_input_runs(cli):
    "The unbroken file and config run: the failures below come from the breakage alone."
    j = cli[('ok', 'valid')]
    assert j['rc'] == 0, j['out']
    assert (j['store'] / 'manifest.json').exists() and '9 rollouts' in j['out']

@pytest.mark.parametrize('name', DATA_PARAMS)
def test_cli_bad_instances(cli, name):
    "Non-zero exit, the file, the record and the field named in the error, and no store folder."
    j = cli[('data', name)]
    assert j['rc'] != 0, j['out']
    assert not j['store'].exists(), f'{j["store"]} was written for a bad input'
    assert str(j['data']) in j['err'], j['err']
    for pat in DATA_CASES[name][2]: assert re.search(pat, j['err']), (pat, j['err'])

def test_cli_missing_instances_file(cli):
    j = cli[('data', 'missing-file')]
    assert j['rc'] != 0 and not j['store'].exists()
    assert str(j['data']) in j['err'], j['err']

@pytest.mark.parametrize('name', CONFIG_PARAMS_RUN)
def test_cli_bad_config_fails_and_writes_nothing(cli, name):
    "Non-zero exit, the offending name/value in the error, and no store folder."
    j = cli[('config', name)]
    assert j['rc'] != 0, j['out']
    assert not j['store'].exists(), f'{j["store"]} was written for a bad config'
    for pat in CONFIG_CASES[name][1]: assert re.search(pat, j['err']), (pat, j['err'])

@pytest.mark.parametrize('name', CONFIG_PARAMS_NAMES)
def test_cli_bad_config_names_file_and_field(cli, name):
    "The error names the config file and the field holding the bad value."
    j = cli[('config', name)]
    assert str(j['cfg']) in j['err'], j['err']
    for pat in CONFIG_CASES[name][2]: assert re.search(pat, j['err']), (pat, j['err'])

@pytest.mark.parametrize('key', [pytest.param(k, id=f'{k[0]}-{k[1]}') for k in ALL_BAD])
def test_cli_error_is_one_line(cli, key):
    "`memlab: <message>` on one line, exit status 2, no traceback."
    j = cli[key]
    lines = j['out'].strip().splitlines()
    assert 'Traceback' not in j['out'] and j['rc'] == 2 and len(lines) == 1 and lines[0].startswith('memlab: '), j['out']


# ------------------------------------------------------------------------------------------------ library
@pytest.fixture(scope='module')
def files(cli): return {name: cli[('data', name)]['data'] for name in DATA_CASES}

@pytest.mark.parametrize('name', [p for p in DATA_PARAMS if p.values[0] not in CHECK_INSTANCES_CASES])
def test_load_records_raises_record_error(files, name):
    with pytest.raises(RecordError) as e: load_records(files[name], Instance)
    msg = str(e.value)
    assert str(files[name]) in msg, msg
    for pat in DATA_CASES[name][2]: assert re.search(pat, msg), (pat, msg)

@pytest.mark.parametrize('name', sorted(CHECK_INSTANCES_CASES))
def test_check_instances_raises_record_error(files, name):
    insts = load_records(files[name], Instance)                 # each record is valid on its own
    with pytest.raises(RecordError) as e: check_instances(insts, str(files[name]))
    msg = str(e.value)
    assert str(files[name]) in msg, msg
    for pat in DATA_CASES[name][2]: assert re.search(pat, msg), (pat, msg)
    with pytest.raises(RecordError, match=re.escape(str(files[name]))):    # and load_dataset runs the check
        load_dataset({'kind': 'instances', 'path': str(files[name])})

@pytest.mark.parametrize('name', ['samples-not-int', 'memories-not-list', 'unknown-top-field', 'invalid-yaml'])
def test_runconfig_load_raises_record_error(cli, name):
    path = cli[('config', name)]['cfg']
    with pytest.raises(RecordError) as e: RunConfig.load(path)
    msg = str(e.value)
    assert str(path) in msg, msg
    for pat in CONFIG_CASES[name][1] + CONFIG_CASES[name][2]: assert re.search(pat, msg), (pat, msg)

@pytest.mark.parametrize('answers', [42, 'Austin', ['Austin', 7], [None], {'a': 'b'}])
def test_wrong_answer_types_are_not_coerced(answers):
    "The broken `answers` above truly fail: pydantic v2 does not coerce them to list[str]."
    q = dict(GOOD[0]['queries'][0], answers=answers)
    with pytest.raises(RecordError, match=r"x\.json: record 0 .*field 'answers"): validate_record(Query, q, 'x.json', 0)
