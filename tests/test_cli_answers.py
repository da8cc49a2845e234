"""Commands that answer at once (issue 25, items 2 and 3b): a folder that is not a store is refused like `show` refuses it,
`data --help` names every registered format, `--version` names the commit, store and cache warnings are one line,
`report` counts unparsed verdicts in its table, `estimate` writes nothing, and `score` refuses a judge that cannot read
the store's questions before it makes a call."""
import subprocess, sys
from pathlib import Path

import pytest

from small_store import small_config
import yaml

from inproc import memlab_main
from memlab.runner import ResultsStore

FX = Path(__file__).parent / 'fixtures'
CLI = 'import sys\nfrom memlab.cli import main\nsys.argv[0] = "memlab"\nmain()\n'


def memlab(*args, cwd=None, env=None):
    "`memlab ARGS` in a fresh interpreter (warnings filters and logging as a console script starts them)."
    import os
    return subprocess.run([sys.executable, '-c', CLI, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=dict(os.environ, MEMLAB_PROGRESS='0', **(env or {})))


@pytest.fixture(scope='module')
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('answers')
    assert memlab_main(['run', small_config(tmp, 'cli'), '--store', tmp / 's', '--score'])['rc'] == 0
    return tmp / 's'


@pytest.mark.parametrize('cmd', ['report', 'show', 'check', 'export-inspect'])
def test_a_folder_that_is_not_a_store_is_exit_2(tmp_path, cmd):
    (tmp_path / 'notes.txt').write_text('not a store')
    r = memlab_main([cmd, tmp_path, *([tmp_path / 'logs'] if cmd == 'export-inspect' else [])])
    assert r['rc'] == 2 and r['err'].count('\n') == 1 and 'not a memlab store' in r['err'], (cmd, r['out'])


def test_data_help_names_every_registered_format():
    from memlab.core import load_plugins
    from memlab.data import INSPECTORS
    load_plugins()
    assert len(INSPECTORS) >= 5
    for args in (['data', '--help'], ['data', 'inspect', '--help']):
        r = memlab_main(args)
        missing = [k for k in INSPECTORS if k not in r['out'].lower()]
        assert r['rc'] == 0 and not missing, (args, missing, r['out'])


def test_version_names_the_commit():
    import memlab
    head = subprocess.run(['git', 'rev-parse', '--short=12', 'HEAD'], cwd=Path(memlab.__file__).parent, capture_output=True, text=True).stdout.strip()
    r = memlab_main(['--version'])
    assert r['rc'] == 0 and r['out'].startswith(f'memlab {memlab.__version__} (commit {head}'), r['out']


def test_store_warnings_are_one_line(store, tmp_path):
    import shutil
    s = tmp_path / 's'; shutil.copytree(store, s)
    (s / 'rollouts' / 'part-foreign.parquet').write_bytes(b'not parquet')
    r = memlab('report', s)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith('memlab: warning: ') and 'part-foreign.parquet' in lines[0], r.stderr


def test_cache_warnings_are_one_line_once():
    "A cache problem is logged and warned with the same text: the command prints it once, on one line."
    code = ('import logging, warnings\nfrom memlab.cli import one_line_warnings\nfrom memlab.cache import CacheWarning\n'
            'with one_line_warnings():\n'
            '    logging.getLogger("memlab.cache").warning("c.sqlite: damaged; set aside")\n'
            '    warnings.warn("c.sqlite: damaged; set aside", CacheWarning)\n'
            '    warnings.warn("second\\nline", UserWarning)\n')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.splitlines() == ['memlab: warning: c.sqlite: damaged; set aside', 'memlab: warning: second line'], r.stderr


def test_report_counts_unparsed_verdicts(store, tmp_path):
    "11 of 16 verdicts unparsed gave mean 1.0 with no word of them: the table and a line count them."
    import shutil
    from memlab.core import Score
    s = tmp_path / 's'; shutil.copytree(store, s)
    st = ResultsStore(s)
    sc = st.scores()
    rid = sc['rollout_id'].iloc[:4].tolist()
    st.write_scores([Score(rollout_id=r, judge='offline-match', judge_model='offline', prompt_hash=sc['prompt_hash'].iloc[0], run=1,
                           label='unparsed', correct=None, raw='{not json') for r in rid])
    r = memlab_main(['report', s])
    assert r['rc'] == 0, r['out']
    head = next(l for l in r['out'].splitlines() if ' mean ' in f' {l} ')
    assert 'unparsed' in head.split(), head
    assert '4 of 10 verdicts unparsed' in r['out'], r['out']


def test_estimate_writes_nothing(tmp_path):
    "A dry run: no response cache (nor anything else) appears in the working folder."
    cfg = dict(name='est', section='cli', dataset={'kind': 'synthetic', 'params': {'n_instances': 1, 'queries_per_instance': 2, 'n_filler': 3}},
               policies=[{'name': 'llm', 'backend': {'name': 'openai', 'model': 'gpt-4o-mini'}}], memories=[{'name': 'bm25', 'k': 5}])
    (tmp_path / 'settings.ini').write_text('[DEFAULT]\n')      # the working folder is a project root
    (tmp_path / 'c.yaml').write_text(yaml.safe_dump(cfg))
    before = sorted(p.name for p in tmp_path.iterdir())
    r = memlab('estimate', 'c.yaml', cwd=tmp_path, env={'OPENAI_API_KEY': 'sk-test'})
    assert r.returncode == 0 and 'model_calls' in r.stdout, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.fixture(scope='module')
def locomo_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('locomo')
    cfg = dict(name='lc', section='cli', dataset={'kind': 'locomo', 'path': str(FX / 'locomo10.json')},
               policies=[{'name': 'offline-reader', 'tier': 'strong'}], memories=[{'name': 'bm25', 'k': 5}])
    (tmp / 'c.yaml').write_text(yaml.safe_dump(cfg))
    assert memlab_main(['run', tmp / 'c.yaml', '--store', tmp / 's', '--score'])['rc'] == 0
    return tmp / 's'


def test_score_refuses_a_judge_that_cannot_read_the_questions(locomo_store):
    "LongMemEval's judge has no template for LoCoMo's question types: refused before any call (no server is even named)."
    n = len(ResultsStore(locomo_store).scores())
    r = memlab_main(['score', locomo_store, '--judge', 'longmemeval', '--judge-model', 'm', '--base-url', 'http://127.0.0.1:9/v1'])
    assert r['rc'] == 2 and r['err'].count('\n') == 1, r['out']
    assert "--judge longmemeval cannot judge 13 of 16 questions" in r['err'], r['err']
    assert len(ResultsStore(locomo_store).scores()) == n


def test_process_workers_warn_in_one_line():
    "`--executor processes`: a warning raised in a worker (a cache file set aside there) is one line too."
    code = ('import warnings\nfrom memlab.cli import make_executor\n'
            'ex, close = make_executor("processes", 1)\nex.submit(warnings.warn, "c.sqlite: damaged;\\n set aside", UserWarning).result()\nclose()\n')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr.splitlines() == ['memlab: warning: c.sqlite: damaged; set aside'], r.stderr


def test_score_hypotheses_refuses_a_judge_that_cannot_read_the_questions(tmp_path):
    import json
    from memlab.runner import load_dataset
    qs = [q.id for i in load_dataset({'kind': 'locomo', 'path': str(FX / 'locomo10.json')}) for q in i.queries]
    (tmp_path / 'h.jsonl').write_text(''.join(json.dumps({'question_id': q, 'hypothesis': 'no idea'}) + '\n' for q in qs))
    r = memlab_main(['score-hypotheses', 'locomo', FX / 'locomo10.json', tmp_path / 'h.jsonl', '--judge', 'longmemeval',
                     '--judge-model', 'm', '--base-url', 'http://127.0.0.1:9/v1'])
    assert r['rc'] == 2 and r['err'].count('\n') == 1 and '--judge longmemeval cannot judge 13 of 16 questions' in r['err'], r['out']
