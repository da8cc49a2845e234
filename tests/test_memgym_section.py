"""The MemGym section with a model backend (issue 15, item 6): the notebook runs unchanged with backend=openai against the
loopback server; the reasoner, the LLM strategies' summarizer and the tracks' judges (the verifiers' too, issue 22) all
reach it with the repository's prompts verbatim; the key appears nowhere in what it writes. A bad parameter is one line naming it, before any work.
"""
import json, os, re
from pathlib import Path
import pandas as pd
from loopback import LoopbackServer, Reply, default_responder, _user_texts

_NOISE = re.compile(r'## Distractor \(INCORRECT information\)\n(.*?)\n\n## Agent.s Answer\n(.*?)\n\n## Question', re.S)


def responder(kind: str, req: dict) -> Reply:
    "The loopback's fake model, plus a noise judge (the CodeQA verifier's distractor check): misled when the answer carries most of the distractor's terms."
    m = _NOISE.search('\n\n'.join(_user_texts(kind, req)))
    if not m: return default_responder(kind, req)
    from memlab.memory import terms
    want, got = set(terms(m[1])), set(terms(m[2]))
    return Reply(content=json.dumps({'misled': bool(want) and len(want & got) >= 0.6 * len(want), 'confidence': 1.0, 'explanation': 'fake'}))
from section_runner import papermill_section

FAKE_KEY = 'sk-memlab-memgym-DO-NOT-LEAK-93d1'
from memlab.protocols.memgym.dr import ANSWER_JUDGE_PROMPT as _AJP
ANSWER_HEAD = _AJP.split('{')[0][:60]


def test_memgym_with_openai_backend_summarizer_and_judges_and_no_key_leak(tmp_path):
    from memlab.protocols.memgym.strategies import SUMMARIZATION_PROMPT
    from memlab.protocols.memgym.dr import ANSWER_JUDGE_PROMPT, EVICTED_ANSWER_PROMPT
    from memlab.protocols.memgym.codeqa import FACT_JUDGE_PROMPT, NOISE_JUDGE_PROMPT, EVICTED_ANSWER_QA_PROMPT_MEMORY_ONLY
    out = tmp_path / 'out'
    env = {**os.environ, 'OPENAI_API_KEY': FAKE_KEY, 'MEMLAB_OUT': str(out), 'MEMLAB_CACHE': str(tmp_path / 'c.sqlite'), 'MEMLAB_PROGRESS': '0'}
    with LoopbackServer('openai', responder=responder) as srv:
        nb = tmp_path / 'memgym-openai.ipynb'
        p = papermill_section('memgym', nb, env, ('backend', 'openai'), ('models', ['loop-model']), ('base_url', srv.url),
                              ('summarizer_model', 'loop-sum'), ('judge_model', 'loop-judge'), ('strategies', ['none', 'llm-summarizing']),
                              ('dr_hops', [3, 4]), ('dr_budgets', [20000]), ('n_dr', 2), ('codeqa_budgets', [10000]), ('n_codeqa', 2),
                              ('max_tokens', 4000), ('n_resamples', 200), ('run_name', 'loop'))
        assert p.returncode == 0, p.stderr[-3000:]
        reqs = [r for r in srv.requests if r and r.get('messages')]
    head = lambda t, n=60: t.split('{')[0][:n]
    by = lambda model: [m['content'] for r in reqs if r['model'] == model for m in r['messages'] if isinstance(m.get('content'), str)]
    assert any(c.startswith(head(SUMMARIZATION_PROMPT)) for c in by('loop-sum')), 'the summarizer was never called'
    answers = by('loop-model')
    assert any(c.startswith(head(EVICTED_ANSWER_PROMPT)) for c in answers) and any(c.startswith(head(EVICTED_ANSWER_QA_PROMPT_MEMORY_ONLY)) for c in answers)
    judged = by('loop-judge')
    assert any(c.startswith(head(ANSWER_JUDGE_PROMPT)) for c in judged) and any(c.startswith(head(FACT_JUDGE_PROMPT)) for c in judged)
    assert all(r['temperature'] == 0 for r in reqs if r['model'] in ('loop-model', 'loop-judge'))
    # the verifiers judge with the configured judge (issue 22): the summarizer first runs in the first track's run, after
    # every instance was verified, so the judge requests before it are the verifiers'
    first_run = next(i for i, r in enumerate(reqs) if r['model'] == 'loop-sum')
    verifier_judged = [r['messages'][-1]['content'] for r in reqs[:first_run] if r['model'] == 'loop-judge']   # the prompt (DR's follows a system line)
    assert verifier_judged and all(c.startswith((head(ANSWER_JUDGE_PROMPT), head(FACT_JUDGE_PROMPT), head(NOISE_JUDGE_PROMPT))) for c in verifier_judged)
    res = out / 'results' / 'memgym'
    yt = pd.read_csv(res / 'verifier_yield.csv')
    assert set(yt['judge']) == {'memgym-llm (loop-judge)'} and set(yt['track']) == {'dr', 'codeqa'}, yt.to_dict('records')
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


def test_the_verifiers_judge_with_the_configured_judge(tmp_path, monkeypatch):
    "The judge the section builds from `judge_model` (memgym-llm) gives the verifiers judges whose calls reach the server; offline stays offline."
    from memlab.runner import build_judge
    from memlab.protocols.memgym import dr as DR, codeqa as CQ
    from memlab.protocols.memgym.protocol import dr_candidates
    monkeypatch.setenv('OPENAI_API_KEY', FAKE_KEY); monkeypatch.setenv('MEMLAB_CACHE', str(tmp_path / 'c.sqlite'))
    off = build_judge({'name': 'memgym-offline'}).verifier_judges()
    assert (off['dr'], off['fact'], off['noise']) == (DR.offline_answer_score, CQ.offline_fact_judge, CQ.offline_noise_judge)
    with LoopbackServer('openai', responder=responder) as srv:
        judge = build_judge({'name': 'memgym-llm', 'backend': {'name': 'openai', 'model': 'loop-judge', 'base_url': srv.url}})
        vj = judge.verifier_judges()
        calls = []
        def counted(gold, predicted, question):
            calls.append(predicted); return vj['dr'](gold, predicted, question)
        counted.label = vj['dr'].label
        kept, counts = DR.verify_all(dr_candidates(2, [3], 20000, 0), DR.OfflineDRReasoner(), counted)
        dr_reqs = [r for r in srv.requests if r and r.get('messages')]
        cq = CQ.synth_codeqa(1, budget_tokens=10000, seed=0)
        _, cq_counts = CQ.verify_all(cq, CQ.OfflineCodeQAReasoner(), vj['fact'], vj['noise'])
        cq_reqs = [r for r in srv.requests if r and r.get('messages')][len(dr_reqs):]
    assert calls and len(dr_reqs) == len(calls)                      # every DR verifier judgement is one request to the judge model
    assert all(r['model'] == 'loop-judge' and r['messages'][-1]['content'].startswith(ANSWER_HEAD) for r in dr_reqs)
    assert all(r['messages'][0] == {'role': 'system', 'content': DR.ANSWER_JUDGE_SYSTEM} for r in dr_reqs)   # the official client's system line
    assert counts['generated'] == 2 and all(k.verification['judge'] == 'memgym-llm (loop-judge)' for k in kept)
    heads = {r['messages'][0]['content'][:40] for r in cq_reqs}
    assert {CQ.FACT_JUDGE_PROMPT[:40], CQ.NOISE_JUDGE_PROMPT[:40]} <= heads and all(r['model'] == 'loop-judge' for r in cq_reqs)
    assert cq_counts['fact_judge'] == cq_counts['noise_judge'] == 'memgym-llm (loop-judge)'
