"""The MemTrace section with a model backend (issue 13, item 6): the notebook runs unchanged with backend=openai against
the loopback server, its questions rephrased by a model (leakage-checked), judged by the memtrace-llm rubric and rescored by a second judge (appendix D), and the key
appears nowhere in what it writes. A bad parameter is one line naming it, before any work.
"""
import json, os
from pathlib import Path
import pandas as pd
from loopback import LoopbackServer
from section_runner import papermill_section

FAKE_KEY = 'sk-memlab-memtrace-DO-NOT-LEAK-51ab'


def papermill(out_nb: Path, env: dict, *params): return papermill_section('memtrace', out_nb, env, *params)


def test_memtrace_with_openai_backend_two_judges_and_no_key_leak(tmp_path):
    out = tmp_path / 'out'
    env = {**os.environ, 'OPENAI_API_KEY': FAKE_KEY, 'MEMLAB_OUT': str(out), 'MEMLAB_CACHE': str(tmp_path / 'c.sqlite'), 'MEMLAB_PROGRESS': '0'}
    with LoopbackServer('openai') as srv:
        nb = tmp_path / 'memtrace-openai.ipynb'
        p = papermill(nb, env, ('backend', 'openai'), ('models', ['loop-model']), ('base_url', srv.url), ('judge_model', 'loop-judge'),
                      ('second_judge_model', 'loop-judge-2'), ('n_users', 1), ('n_sessions', 10), ('memories', ['bm25', 'items']),
                      ('rewrite_model', 'loop-writer'), ('n_reliability', 40), ('n_reach', 30), ('n_oracle', 5), ('n_resamples', 50), ('run_name', 'loop'))
        assert p.returncode == 0, p.stderr[-3000:]
        judged = [r for r in srv.requests if r and 'You grade the answers' in json.dumps(r.get('messages'))]
        assert judged and {r['model'] for r in judged} == {'loop-judge', 'loop-judge-2'}
        assert len([r for r in judged if r['model'] == 'loop-judge-2']) <= 40      # the second judge rescored the sample only
        asked = [r for r in srv.requests if r and r.get('model') == 'loop-writer']
        assert asked and all('Rewrite the question below' in r['messages'][0]['content'] for r in asked)
    res = out / 'results' / 'memtrace'
    agree = pd.read_csv(res / 'tableD_judge_agreement.csv')
    assert agree['dimension'].tolist() == ['Gist accuracy', 'Response type'] and (agree['n'] > 0).all()
    assert (agree['kappa'] == 1.0).all()                     # two copies of one deterministic fake judge agree
    manifest = json.loads((res / 'manifest.json').read_text())
    assert manifest['labels'] == ['openai:loop-model'] and {j['model'] for j in manifest['judges']} == {'loop-judge', 'loop-judge-2'}
    outputs = json.dumps([c.get('outputs', []) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code'])
    assert 'openai:loop-model' in outputs and 'offline reader (no LLM)' not in outputs
    leaks = [str(f) for d in (out, tmp_path) for f in d.rglob('*') if f.is_file() and FAKE_KEY.encode() in f.read_bytes()]
    assert not leaks and FAKE_KEY not in p.stdout + p.stderr, leaks


def test_a_bad_parameter_is_one_line_before_any_work(tmp_path):
    env = {**os.environ, 'MEMLAB_OUT': str(tmp_path / 'out'), 'MEMLAB_PROGRESS': '0'}
    p = papermill(tmp_path / 'bad.ipynb', env, ('memories', ['bm25', 'bm52']))
    assert p.returncode != 0 and "memtrace parameter memories: unknown memory 'bm52'" in p.stderr
    assert not (tmp_path / 'out').exists()
