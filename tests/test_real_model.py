"""memlab against a real OpenAI-compatible server with a real (tiny) model: `make test-real-model` (skipped otherwise).

llama-cpp-python's server with `--chat_format chatml-function-calling`, serving SmolLM2-135M-Instruct (tests/real_server.py).
A few rollouts of each of the six section notebooks with backend=openai, and the CLI: tool calls reach the server and come back,
the judge runs, a re-run is served from the response cache (0 requests in the server's own access log), a server
killed mid-run leaves errors that `memlab resume --retry-errors` finishes, and the API key appears nowhere.
The model is tiny: answers are mostly wrong and some tool calls malformed; these tests check the harness, not the model.
"""
import json, os, subprocess, sys, time
from pathlib import Path
import numpy as np
import pandas as pd
import pytest
import yaml
from real_server import RealServer, configured, ALIAS
from memlab.runner import ResultsStore, results_frame

pytestmark = pytest.mark.skipif(configured() is not None, reason=str(configured()))

ROOT = Path(__file__).resolve().parents[1]
MEMLAB = str(Path(sys.executable).parent / 'memlab')
SECRET = 'sk-memlab-real-model-4f1c9e2a7b'
TIMEOUT, MAX_TOKENS = 300.0, 48          # a CPU server: about 4 s per call of a few hundred prompt tokens


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    return tmp_path_factory.mktemp('real')


@pytest.fixture(scope='module')
def server(work):
    with RealServer(work / 'server.log') as srv: yield srv


def env(work) -> dict:
    return os.environ | {'OPENAI_API_KEY': SECRET, 'MEMLAB_CACHE': str(work / 'cache.sqlite'), 'MEMLAB_PROGRESS': '0'}


def papermill(work, name, **params) -> Path:
    out, pf = work / f'{name}.ipynb', work / f'{name}.params.yaml'
    pf.write_text(yaml.safe_dump(params))
    r = subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(ROOT / 'nbs' / 'sections'),
                        str(ROOT / 'nbs' / 'sections' / f'{name}.ipynb'), str(out), '-f', str(pf), '--log-level', 'WARNING'],
                       env=env(work), capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def stores(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob('runs/*/manifest.json'))


def common(server, work, name):
    return dict(backend='openai', base_url=server.url, timeout=TIMEOUT, max_tokens=MAX_TOKENS, concurrency=2,
                out_root=str(work / name), n_resamples=50)


def test_walkthrough_with_a_real_model_and_judge(server, work):
    n0 = server.n_chat()
    papermill(work, 'walkthrough', **common(server, work, 'wt'), model=ALIAS, judge_model=ALIAS, n_instances=1,
              queries_per_instance=2, n_filler=2, k=3, window_tokens=600)
    (st,) = stores(work / 'wt')
    df = results_frame(st)
    assert len(df) == 4 and df['error'].isna().all(), df['error'].tolist()
    assert (df['policy_label'] == f'openai:{ALIAS}').all()
    sc = ResultsStore(st).scores()
    assert len(sc) == 4 and set(sc['judge']) == {'llm-a3'} and sc['raw'].notna().all()
    assert server.n_chat() - n0 >= 8                      # 4 answers and 4 verdicts reached the server


def test_tool_calls_round_trip_in_the_scale_ladder(server, work):
    "`items` is iterative: the model's search_memory calls go back to the server with the assistant turn ('' content)."
    papermill(work, 'scale_ladder', **common(server, work, 'sl'), models=[ALIAS], n_queries=2, pool_size=20, ladder=[0, 10],
              memories=['items'], k=3, max_steps=3, budgets={'B0': 1, 'B1': 2})
    (st,) = stores(work / 'sl')
    df = results_frame(st)
    assert len(df) == 4
    assert not df['error'].fillna('').str.contains('valid string|content').any(), df['error'].tolist()
    steps = [s for r in ResultsStore(st).rollout_records() for s in r.trajectory.steps]
    assert any(s.kind == 'search' and s.by == 'agent' for s in steps), 'the model never called search_memory'
    answered = [r for r in ResultsStore(st).rollout_records() if r.error is None and r.n_calls >= 1]
    assert answered, 'no rollout answered after a tool call (the second request of a tool-calling loop)'


def test_memoryagentbench_with_a_real_model(server, work):
    papermill(work, 'memoryagentbench', **common(server, work, 'mab'), models=[ALIAS], families=['ruler_qa1'],
              context_tokens=600, questions_per_context=2, agents=['bm25', 'items'], top_k=2, topk_ablation=[2],
              chunk_sizes=[512], context_lengths=[600], ablation_families=['ruler_qa1'])
    runs = stores(work / 'mab')
    assert runs
    df = results_frame(runs[0])
    assert len(df) >= 4 and not df['error'].fillna('').str.contains('valid string').any(), df['error'].tolist()


def test_memgym_with_a_real_reasoner_summarizer_and_judge(server, work):
    "MemGym-DR (no filler, 3 hops): the real model summarizes past the trigger, answers the evicted prompt and judges it."
    n0 = server.n_chat()
    papermill(work, 'memgym', backend='openai', base_url=server.url, timeout=TIMEOUT, concurrency=2, out_root=str(work / 'mg'),
              n_resamples=50, models=[ALIAS], summarizer_model=ALIAS, judge_model=ALIAS, strategies=['none', 'llm-summarizing'],
              tracks=['dr'], dr_hops=[3], dr_budgets=[1000], n_dr=1, verify=False, max_tokens=400, answer_max_tokens=MAX_TOKENS)
    (st,) = stores(work / 'mg')
    df = results_frame(st)
    assert len(df) == 2 and df['error'].isna().all(), df['error'].tolist()
    assert (df['policy_label'] == f'openai:{ALIAS}').all()
    traces = [u.meta['trace'] for r in ResultsStore(st).rollout_records() for s in r.trajectory.steps for u in s.observation
              if u.meta.get('kind') == 'notes']
    events = [t['condensation_event'] for tr in traces for t in tr if t.get('condensation_event')]
    assert events and all(e['summarization_model'] == ALIAS and e['summarizer_completion_tokens'] > 0 for e in events), events
    sc = ResultsStore(st).scores()
    assert len(sc) == 2 and set(sc['judge']) == {'memgym-llm'} and set(sc['label']) <= {'CORRECT', 'WRONG', 'unparsed'}
    assert server.n_chat() - n0 >= 2 + 2 + len(events)      # answers, verdicts and summaries reached the server
    out = json.dumps([c.get('outputs', []) for c in json.loads((work / 'memgym.ipynb').read_text())['cells']])
    if (sc['label'] == 'unparsed').all():                  # the tiny model's verdicts are often not JSON: reported, not scored
        assert 'no answer was judged' in out and not list((work / 'mg').rglob('memory_gain.csv'))
    else: assert list((work / 'mg').rglob('memory_gain.csv'))



def test_memgym_envs_with_a_real_agent_and_summarizer(server, work):
    """MemGym II (the dialogue environment, two tasks): the real model acts through the tools, the summarizer compacts, the
    environment scores. The tiny model's tool calls are often malformed (answered by an error observation, a step spent) and
    llama.cpp's grammar-constrained tool call can run past the request timeout: such a call is the rollout's error, never a score."""
    n0 = server.n_chat()
    papermill(work, 'memgym_envs', backend='openai', base_url=server.url, timeout=120.0, concurrency=2, out_root=str(work / 'me'),
              n_resamples=50, models=[ALIAS], summarizer_model=ALIAS, strategies=['none', 'llm-summarizing'], envs=['dialogue'],
              n_tasks=2, env_settings={'dialogue': {'step_limit': 8, 'max_size': 6}}, ablation_envs=[], replay_envs=[], agent_max_tokens=MAX_TOKENS)
    (st,) = stores(work / 'me')
    recs = ResultsStore(st).rollout_records()
    assert len(recs) == 4 and all(r.error is None or r.error.startswith('LLMError') for r in recs), [r.error for r in recs]
    done = [r for r in recs if r.error is None]
    assert done, 'no episode finished'
    steps = [s for r in recs for s in r.trajectory.steps if s.kind == 'search']
    live = [s for s in steps if s.meta.get('by') == 'agent']
    assert len(live) >= 3 and all(s.usage.input_tokens > 0 for s in live)      # every live step was a model call (the reset is the harness's)
    events = [s.meta['context']['condensation_event'] for s in steps if s.meta['context'].get('condensation_event')]
    assert all(e['summarization_model'] == ALIAS for e in events), events
    sc = ResultsStore(st).scores()
    assert set(sc['judge']) == {'memgym-env'} and sorted(sc.loc[sc['label'] != 'error', 'rollout_id']) == sorted(r.rollout_id for r in done)
    assert set(sc['label']) <= {'CORRECT', 'WRONG', 'error'}
    assert server.n_chat() - n0 >= len(live) + len(events)
    assert list((work / 'me').rglob('table2_gyms.csv'))


def papermill_run(work, name, **params) -> subprocess.CompletedProcess:
    "`papermill` without asserting success: a tiny model's judge may leave a section nothing to score."
    out, pf = work / f'{name}.ipynb', work / f'{name}.params.yaml'
    pf.write_text(yaml.safe_dump(params))
    return subprocess.run([sys.executable, '-m', 'papermill', '-k', 'python3', '--cwd', str(ROOT / 'nbs' / 'sections'),
                           str(ROOT / 'nbs' / 'sections' / f'{name}.ipynb'), str(out), '-f', str(pf), '--log-level', 'WARNING'],
                          env=env(work), capture_output=True, text=True, timeout=1800)


def test_memtrace_with_a_real_model_and_its_judge(server, work):
    "MemTrace (one user, two windows, bm25): the model answers, memtrace-llm judges; unparsed verdicts are counted, never scored."
    n0 = server.n_chat()
    r = papermill_run(work, 'memtrace', **common(server, work, 'mt'), models=[ALIAS], judge_model=ALIAS, n_users=1,
                      n_sessions=4, turns=4, n_updates=1, n_windows=2, anchored=False, memories=['bm25'], k=3,
                      caps={'static': 1, 'dynamic': 1, 'preference': 1, 'conflict': 1, 'boundary': 1}, n_reach=4, n_oracle=2)
    (st,) = stores(work / 'mt')
    df = results_frame(st)
    assert len(df) >= 4 and df['error'].isna().all(), df['error'].tolist()
    assert (df['policy_label'] == f'openai:{ALIAS}').all()
    sc = ResultsStore(st).scores()
    assert 'memtrace-llm' in set(sc['judge']) and set(sc['label']) <= {'CORRECT', 'WRONG', 'unparsed', 'error'}, sc['label'].value_counts()
    assert server.n_chat() - n0 >= len(df) * 2                 # every answer and every verdict reached the server
    parsed = sc[sc['judge'] == 'memtrace-llm']['label'].isin(['CORRECT', 'WRONG'])
    if parsed.any(): assert r.returncode == 0, r.stderr[-3000:]
    else:                                                      # nothing to score: one line saying so, not a traceback of save()
        assert r.returncode != 0 and 'no response has a verdict' in r.stderr and 'save_table' not in r.stderr, r.stderr[-3000:]


def test_subtlememory_with_a_real_model_and_the_official_judge(server, work):
    "SubtleMemory (one persona, oracle and default settings): prompt v1 answers, the official judge prompt judges."
    n0 = server.n_chat()
    r = papermill_run(work, 'subtlememory', **common(server, work, 'sm'), models=[ALIAS], judge_model=ALIAS, n_personas=1,
                      n_unrelated=2, turns=2, n_sets=1, memories=['bm25'], k=3, settings=['oracle', 'default'],
                      prompts=['v1'], judge_max_tokens=64)
    runs = stores(work / 'sm')
    assert runs, r.stderr[-3000:]
    df = pd.concat([results_frame(s) for s in runs])
    assert len(df) >= 2 and not df['error'].fillna('').str.contains('valid string|Connection').any(), df['error'].tolist()
    assert (df['policy_label'] == f'openai:{ALIAS}').all()
    sc = pd.concat([ResultsStore(s).scores() for s in runs])
    assert 'subtlememory-llm' in set(sc['judge']), set(sc['judge'])
    assert server.n_chat() - n0 >= len(df)
    assert r.returncode == 0 or 'Traceback' not in r.stderr.splitlines()[-1], r.stderr[-3000:]


def _config(work, server, name, seed) -> Path:
    cfg = dict(name=name, section='real', dataset={'kind': 'synthetic', 'params': {'n_instances': 1, 'queries_per_instance': 3,
                                                                                  'n_filler': 2, 'seed': seed}},
               policies=[{'name': 'llm', 'max_tokens': MAX_TOKENS, 'backend': {'name': 'openai', 'model': ALIAS, 'base_url': server.url,
                                                                               'timeout': TIMEOUT, 'concurrency': 2, 'max_attempts': 2,
                                                                               'retry_budget_s': 10}}],
               memories=[{'name': 'items', 'k': 3}], max_steps=2, judge={'name': 'offline-match'})
    p = work / f'{name}.yaml'; p.write_text(yaml.safe_dump(cfg)); return p


def memlab(work, *args, timeout=1200):
    return subprocess.run([MEMLAB, *map(str, args)], env=env(work), capture_output=True, text=True, timeout=timeout)


def test_cli_run_cache_and_judge(server, work):
    cfg = _config(work, server, 'cli', seed=11)
    r = memlab(work, 'run', cfg, '--store', work / 'cli-a'); assert r.returncode == 0, r.stderr
    a = results_frame(work / 'cli-a'); assert len(a) == 3
    n = server.n_chat()
    r = memlab(work, 'run', cfg, '--store', work / 'cli-b', '--no-preflight'); assert r.returncode == 0, r.stderr
    assert server.n_chat() == n, 'the re-run asked the server again'     # every call from the response cache
    r = memlab(work, 'run', cfg, '--store', work / 'cli-c'); assert r.returncode == 0, r.stderr
    assert server.n_chat() == n + 1                                      # with the preflight: its one probe, nothing else
    b = results_frame(work / 'cli-b')
    assert dict(zip(a['rollout_id'], a['answer'])) == dict(zip(b['rollout_id'], b['answer']))
    r = memlab(work, 'score', work / 'cli-a', '--judge', 'llm-a3', '--judge-model', ALIAS, '--base-url', server.url)
    assert r.returncode == 0, r.stderr
    sc = ResultsStore(work / 'cli-a').scores()
    assert set(sc['judge']) >= {'llm-a3'} and server.n_chat() > n
    r = memlab(work, 'report', work / 'cli-a', '--judge', 'llm-a3'); assert r.returncode == 0, r.stderr


def test_server_killed_mid_run_then_resume_retry_errors(work):
    srv = RealServer(work / 'server-kill.log').start()
    try:
        cfg = _config(work, srv, 'kill', seed=12)
        p = subprocess.Popen([MEMLAB, 'run', str(cfg), '--store', str(work / 'kill')], env=env(work),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t = time.monotonic()
        while srv.n_chat() < 1 and time.monotonic() - t < 600: time.sleep(0.2)
        srv.kill()                                           # the server dies with requests in flight
        _, err = p.communicate(timeout=600)
        df = results_frame(work / 'kill')
        assert len(df) == 3 and df['error'].notna().any(), (p.returncode, err[-2000:])   # stored as errors, not wrong answers
        assert memlab(work, 'score', work / 'kill').returncode == 0
        sc = ResultsStore(work / 'kill').scores()
        assert set(sc.loc[sc['rollout_id'].isin(df.loc[df['error'].notna(), 'rollout_id']), 'label']) == {'error'}   # never WRONG
        srv = RealServer(work / 'server-kill.log', port=srv.port).start()
        r = memlab(work, 'resume', cfg, '--store', work / 'kill', '--retry-errors')
        assert r.returncode in (0, 1), r.stderr            # 1: errors left above --max-error-rate (the tiny model's own)
        df = results_frame(work / 'kill')
        conn = df['error'].fillna('').str.contains('Connection|connect|BackendDown|consecutive')
        assert not conn.any(), df['error'].tolist()          # every rollout the dead server failed was re-run
        assert (df['attempt'] >= 1).any()
    finally: srv.kill()


def test_the_key_appears_nowhere(work):
    "Runs above used OPENAI_API_KEY=SECRET: not in stores, the cache, notebook outputs or logs."
    hits = [p for p in work.rglob('*') if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not hits, hits


def test_memgym_gate_llm_gate_and_judge_read_a_real_server(server, work, monkeypatch):
    """MemGym III: the LLM gate asks the real model Y/N on the v2 prompt of a few compression events and reads P(SAFE) from
    llama.cpp's token log-probabilities (the tiny model may put neither label among its top alternatives: then the parsed
    reply, or NaN, counted); the judge label over the forgotten content is a verdict or None with the reply kept."""
    monkeypatch.setenv('OPENAI_API_KEY', SECRET); monkeypatch.setenv('MEMLAB_CACHE', str(work / 'gate-cache.sqlite'))
    from memlab.llm import make_backend
    from memlab.protocols.memgym.gate.labels import build_corpus, judge_label
    from memlab.protocols.memgym.gate.gates import LLMGate
    evs, _, _ = build_corpus('dialogue', ('llm-summarizing',), n=1, seed=0, sources=('outcome',), progress=False)
    evs = sorted(evs, key=lambda e: sum(len(str(m.get('content', ''))) for m in e.compressed))[:4]   # the shortest prompts: CPU seconds
    n0 = server.n_chat()
    spec = dict(name='openai', model=ALIAS, base_url=server.url, timeout=TIMEOUT)
    gate = LLMGate(spec, top_logprobs=20)
    p = gate.score(evs)
    info = gate.info()
    assert info['n_calls'] == 4 and server.n_chat() - n0 == 4
    assert info['n_logprobs'] + info['n_bounded'] + info['n_fallback'] + info['n_unparseable'] == 4
    assert info['n_logprobs'] + info['n_bounded'] >= 1, info              # llama.cpp returned log-probabilities carrying a label
    ok = p[~np.isnan(p)]
    assert len(ok) >= 1 and ((ok >= 0) & (ok <= 1)).all() and info['input_tokens'] > 0
    assert LLMGate(spec).score(evs).tolist() == pytest.approx(p.tolist(), nan_ok=True) and server.n_chat() - n0 == 4   # cached
    lab, why = judge_label(evs[0], make_backend(**spec), max_tokens=4)
    assert lab in (0, 1, None) and why and server.n_chat() - n0 == 5
    assert SECRET not in json.dumps(info) + why
