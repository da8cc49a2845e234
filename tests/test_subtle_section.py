"""The SubtleMemory section with a model backend (issue 14, item 6): the notebook runs unchanged with backend=openai against
the loopback server; both answer prompts (v1 soft, v2 strong) and the official judge reach the server verbatim; the key
appears nowhere in what it writes. A bad parameter is one line naming it, before any work.
"""
import json, os
from pathlib import Path
import pandas as pd
from loopback import LoopbackServer
from section_runner import papermill_section

FAKE_KEY = 'sk-memlab-subtle-DO-NOT-LEAK-7c2e'


def papermill(out_nb: Path, env: dict, *params): return papermill_section('subtlememory', out_nb, env, *params)


def test_subtlememory_with_openai_backend_prompts_verbatim_and_no_key_leak(tmp_path):
    from memlab.core import Instance
    from memlab.protocols.subtle.answer import V1_CONCISE, V2_CONFLICT_AUDITOR
    from memlab.protocols.subtle.judge import JUDGE_SYSTEM_PROMPT, judge_messages
    from memlab.protocols.subtle.protocol import subtlememory_dataset
    out = tmp_path / 'out'
    env = {**os.environ, 'OPENAI_API_KEY': FAKE_KEY, 'MEMLAB_OUT': str(out), 'MEMLAB_CACHE': str(tmp_path / 'c.sqlite'), 'MEMLAB_PROGRESS': '0'}
    with LoopbackServer('openai') as srv:
        nb = tmp_path / 'subtle-openai.ipynb'
        p = papermill(nb, env, ('backend', 'openai'), ('models', ['loop-model']), ('base_url', srv.url), ('judge_model', 'loop-judge'),
                      ('judge_runs', 3), ('n_personas', 1), ('n_unrelated', 8), ('memories', ['bm25', 'items']), ('max_tokens', 256),
                      ('n_resamples', 200), ('run_name', 'loop'))
        assert p.returncode == 0, p.stderr[-3000:]
        reqs = [r for r in srv.requests if r and r.get('messages')]
    answers = [r for r in reqs if r['model'] == 'loop-model']
    judged = [r for r in reqs if r['model'] == 'loop-judge']
    head = lambda t: t.split('{context}')[0]
    v1 = [r for r in answers if r['messages'][0]['content'].startswith(head(V1_CONCISE))]
    v2 = [r for r in answers if r['messages'][0]['content'].startswith(head(V2_CONFLICT_AUDITOR))]
    inst = subtlememory_dataset(n_personas=1, n_unrelated=8)[0]
    n_q = len(inst.queries)
    assert len(v1) == len(v2) == n_q * 5                     # oracle + 2 memories x (perfect, default), per prompt
    tail = lambda t: t.split('{question}')[1]
    for r in v1 + v2:
        c = r['messages'][0]['content']
        assert r['temperature'] == 0 and r['max_tokens'] == 256 and (c.endswith(tail(V1_CONCISE)) or c.endswith(tail(V2_CONFLICT_AUDITOR)))
    assert any('# ORACLE CONTEXT TRANSCRIPT' in r['messages'][0]['content'] for r in v1)
    # the judge: the official system prompt as the repository sends it, the user prompt rendered for that query and answer
    assert judged and all(r['messages'][0]['content'] == JUDGE_SYSTEM_PROMPT and r['temperature'] == 0 for r in judged)
    q0 = inst.queries[0]
    users = {r['messages'][1]['content'] for r in judged}
    assert any(u.startswith(judge_messages(q0, 'X')[1]['content'].split('Generated answer:')[0]) for u in users)
    res = out / 'results' / 'subtlememory'
    ra = pd.read_csv(res / 'judge_runs.csv')
    assert ra['n_runs'].tolist() == [3]                        # three judge runs, majority vote
    t3 = pd.read_csv(res / 'table3_accuracy.csv')
    assert {'v1', 'v2'} <= set(t3['prompt'])
    outputs = json.dumps([c.get('outputs', []) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code'])
    assert 'openai:loop-model' in outputs and 'offline reader (no LLM)' not in outputs
    leaks = [str(f) for d in (out, tmp_path) for f in d.rglob('*') if f.is_file() and FAKE_KEY.encode() in f.read_bytes()]
    assert not leaks and FAKE_KEY not in p.stdout + p.stderr, leaks


def test_a_bad_parameter_is_one_line_before_any_work(tmp_path):
    env = {**os.environ, 'MEMLAB_OUT': str(tmp_path / 'out'), 'MEMLAB_PROGRESS': '0'}
    p = papermill(tmp_path / 'bad.ipynb', env, ('memories', ['bm25', 'bm52']))
    assert p.returncode != 0 and "subtlememory parameter memories: unknown memory 'bm52'" in p.stderr
    assert not (tmp_path / 'out').exists()
