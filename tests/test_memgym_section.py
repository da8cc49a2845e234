"""The MemGym section with a model backend (issue 15, item 6): the notebook runs unchanged with backend=openai against the
loopback server; the reasoner, the LLM strategies' summarizer and the tracks' judges all reach it with the repository's
prompts verbatim; the key appears nowhere in what it writes. A bad parameter is one line naming it, before any work.
"""
import json, os
from pathlib import Path
import pandas as pd
from loopback import LoopbackServer
from section_runner import papermill_section

FAKE_KEY = 'sk-memlab-memgym-DO-NOT-LEAK-93d1'


def test_memgym_with_openai_backend_summarizer_and_judges_and_no_key_leak(tmp_path):
    from memlab.protocols.memgym.strategies import SUMMARIZATION_PROMPT
    from memlab.protocols.memgym.dr import ANSWER_JUDGE_PROMPT, EVICTED_ANSWER_PROMPT
    from memlab.protocols.memgym.codeqa import FACT_JUDGE_PROMPT, EVICTED_ANSWER_QA_PROMPT_MEMORY_ONLY
    out = tmp_path / 'out'
    env = {**os.environ, 'OPENAI_API_KEY': FAKE_KEY, 'MEMLAB_OUT': str(out), 'MEMLAB_CACHE': str(tmp_path / 'c.sqlite'), 'MEMLAB_PROGRESS': '0'}
    with LoopbackServer('openai') as srv:
        nb = tmp_path / 'memgym-openai.ipynb'
        p = papermill_section('memgym', nb, env, ('backend', 'openai'), ('models', ['loop-model']), ('base_url', srv.url),
                              ('summarizer_model', 'loop-sum'), ('judge_model', 'loop-judge'), ('strategies', ['none', 'llm-summarizing']),
                              ('dr_hops', [3, 4]), ('dr_budgets', [20000]), ('n_dr', 2), ('codeqa_budgets', [10000]), ('n_codeqa', 2),
                              ('max_tokens', 4000), ('n_resamples', 200), ('run_name', 'loop'))
        assert p.returncode == 0, p.stderr[-3000:]
        reqs = [r for r in srv.requests if r and r.get('messages')]
    head = lambda t, n=60: t.split('{')[0][:n]
    by = lambda model: [r['messages'][0]['content'] for r in reqs if r['model'] == model]
    assert any(c.startswith(head(SUMMARIZATION_PROMPT)) for c in by('loop-sum')), 'the summarizer was never called'
    answers = by('loop-model')
    assert any(c.startswith(head(EVICTED_ANSWER_PROMPT)) for c in answers) and any(c.startswith(head(EVICTED_ANSWER_QA_PROMPT_MEMORY_ONLY)) for c in answers)
    judged = by('loop-judge')
    assert any(c.startswith(head(ANSWER_JUDGE_PROMPT)) for c in judged) and any(c.startswith(head(FACT_JUDGE_PROMPT)) for c in judged)
    assert all(r['temperature'] == 0 for r in reqs if r['model'] in ('loop-model', 'loop-judge'))
    res = out / 'results' / 'memgym'
    mg = pd.read_csv(res / 'memory_gain.csv')
    assert set(mg['strategy']) == {'llm-summarizing'} and set(mg['track']) == {'dr', 'codeqa'} and set(mg['label']) == {'openai:loop-model'}
    outputs = json.dumps([c.get('outputs', []) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code'])
    assert 'offline reader (no LLM)' not in outputs
    leaks = [str(f) for d in (out, tmp_path) for f in d.rglob('*') if f.is_file() and FAKE_KEY.encode() in f.read_bytes()]
    assert not leaks and FAKE_KEY not in p.stdout + p.stderr, leaks


def test_a_bad_parameter_is_one_line_before_any_work(tmp_path):
    env = {**os.environ, 'MEMLAB_OUT': str(tmp_path / 'out'), 'MEMLAB_PROGRESS': '0'}
    p = papermill_section('memgym', tmp_path / 'bad.ipynb', env, ('strategies', ['bm25-notes', 'amem-notes']))
    assert p.returncode != 0 and "memgym parameter strategies: the None control 'none' is needed" in p.stderr
    assert not (tmp_path / 'out').exists()
