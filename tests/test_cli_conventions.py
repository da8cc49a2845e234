"""The command line by convention: --version, help with an example per subcommand, bad input one line and exit 2,
`score` takes the judge's backend, and `--help` answers without importing the library's heavy modules."""
import subprocess, sys

import pytest

from small_store import small_config
import yaml

from inproc import memlab_main
from loopback import LoopbackServer
from memlab.runner import ResultsStore

COMMANDS = ['run', 'resume', 'score', 'score-hypotheses', 'check', 'report', 'show', 'export-inspect', 'estimate', 'reproduce', 'data inspect']

def test_version():
    import memlab
    r = memlab_main(['--version'])
    assert r['rc'] == 0 and r['out'].startswith(f'memlab {memlab.__version__} (') and r['out'].count('\n') == 1, r['out']

@pytest.mark.parametrize('cmd', COMMANDS)
def test_every_subcommand_has_help_with_an_example(cmd):
    r = memlab_main([*cmd.split(), '--help'])
    assert r['rc'] == 0 and 'example:\n  memlab ' + cmd.split()[0] in r['out'], r['out']
    args = [l for l in r['out'].split('options:')[1].splitlines() if l.startswith('  -') and '-h, --help' not in l]
    undocumented = [l for l in args if len(l.split()) < 2 or l.rstrip().endswith(l.split()[0])]
    assert not undocumented, undocumented

def test_help_imports_nothing_heavy():
    code = ('import sys\nfrom memlab.cli import main\ntry: main(["--help"])\nexcept SystemExit: pass\n'
            'print(sorted(m for m in ("pandas", "numpy", "memlab.runner", "openai", "nltk") if m in sys.modules))')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == '[]', r.stdout

@pytest.fixture(scope='module')
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('cli')
    assert memlab_main(['run', small_config(tmp, 'cli'), '--store', tmp / 's', '--score'])['rc'] == 0
    return tmp / 's'

@pytest.mark.parametrize('args,says', [
    (['score', '{s}', '--judge', 'nosuch'], "unknown judge 'nosuch'"),
    (['score', '{s}', '--judge', 'longmemeval'], 'this judge calls a model: pass --judge-model'),
    (['score', '{s}', '--judge', 'offline-match', '--judge-model', 'x'], "judge 'offline-match' calls no model"),
    (['report', '{s}/../no-such-store'], 'no such store'),
    (['report', '{s}/../no-such-store', '--retrieval'], 'no such store'),
    (['report', '{s}/rollouts', '--retrieval'], 'not a memlab store'),
    (['report', '{s}/rollouts'], 'not a memlab store'),
    (['show', '{s}', '--memory', 'bm99'], "no rollout of memory 'bm99'; memorys: bm25[k=12]"),
    (['reproduce', '--section', 'nosuch'], "no section notebook ['nosuch']"),
    (['data', 'inspect', 'nosuch', '{s}'], "unknown kind 'nosuch'"),
    (['score', '{s}', '--runs', '0'], 'must be a positive integer'),
    (['run', '{s}/../c.yaml', '--max-error-rate', '2'], 'must be a share between 0 and 1'),
])
def test_bad_input_is_one_line_and_exit_2(store, args, says):
    n = len(ResultsStore(store).scores())
    r = memlab_main([a.format(s=store) for a in args])
    assert r['rc'] == 2 and says in r['err'] and 'Traceback' not in r['out'], r['out']
    if not r['err'].startswith('usage:'): assert r['err'].count('\n') == 1, r['err']
    assert len(ResultsStore(store).scores()) == n

def test_score_takes_the_judge_backend(store, tmp_path, monkeypatch):
    monkeypatch.setenv('MEMLAB_CACHE', str(tmp_path / 'cache.sqlite'))
    with LoopbackServer('openai') as srv:
        r = memlab_main(['score', store, '--judge', 'longmemeval', '--judge-model', 'loop-judge', '--base-url', srv.url])
        assert r['rc'] == 0, r['out']
        assert srv.n_requests == 6
    passes = {(j['judge'], j['model']) for j in ResultsStore(store).manifest()['judges']}
    assert passes == {('offline-match', 'offline'), ('longmemeval', 'loop-judge')}
