"""Serial runs of model policies keep the backend's concurrency in flight (issue 12, item 4): each rollout's loop is a
coroutine on the backend's event loop. Same records as one rollout at a time; resume, cache, retries and error records
unchanged; an interrupt keeps what finished. (Throughput is measured in tests/benchmarks/bench_agent_loops.py.)"""
import json, os, signal, subprocess, sys, threading, time
from pathlib import Path
import pytest
import yaml
from loopback import LoopbackServer, Reply, question_of, _tool_results
from memlab.runner import RunConfig, ResultsStore, run, results_frame, default_history
from memlab.synth import make_benchmark

ROOT = Path(__file__).resolve().parents[1]
MEMLAB = str(Path(sys.executable).parent / 'memlab')
BENCH = make_benchmark(4, 6, 6, seed=5)                   # 24 queries


pytestmark = pytest.mark.usefixtures('iterative_bm25')   # 'bm25-iterative-test' (conftest)


def two_searches(kind, req):
    "Fake model: search twice, then answer with the number of evidence blocks it saw."
    n = len(_tool_results(kind, req))
    if req.get('tools') and n < 2: return Reply(tool_calls=[('search_memory', {'query': question_of(kind, req) + ' x' * n})])
    return Reply(content=f'Answer: {n} results')


def config(url, name='loops', concurrency=8, cache=False, **backend):
    b = {'name': 'openai', 'model': 'loop-model', 'base_url': url, 'concurrency': concurrency, 'timeout': 5, 'backoff': 0.01,
         'cache': str(cache) if cache else False, **backend}
    return RunConfig(name=name, policies=[{'name': 'llm', 'backend': b}], memories=[{'name': 'bm25-iterative-test', 'k': 3}])


def records(store):
    "Rollouts without timings and usage latencies (which differ from run to run)."
    ro = ResultsStore(store).rollout_records()
    out = {}
    for r in ro:
        d = r.model_dump(exclude={'timings', 'usage'})
        for s in d['trajectory']['steps']: s.pop('memory_s'); s['usage'].pop('latency_s')
        out[r.rollout_id] = d
    return out


def test_serial_run_keeps_the_backend_concurrency_in_flight(tmp_path):
    with LoopbackServer('openai', responder=two_searches, latency=0.05) as srv:
        st = run(config(srv.url, concurrency=6), BENCH, tmp_path / 'a', progress=False)
        assert srv.max_in_flight == 6, srv.max_in_flight        # before: one rollout, one call at a time (1)
        df = results_frame(st)
        assert len(df) == 24 and df['error'].isna().all() and (df['n_calls'] == 2).all()
        assert srv.n_requests == 24 * 3


def test_same_records_as_one_rollout_at_a_time(tmp_path):
    with LoopbackServer('openai', responder=two_searches, latency=0.01) as srv:
        run(config(srv.url, concurrency=8), BENCH, tmp_path / 'many', progress=False)
        run(config(srv.url, concurrency=1), BENCH, tmp_path / 'one', progress=False)
    a, b = records(tmp_path / 'many'), records(tmp_path / 'one')
    assert a.keys() == b.keys() and len(a) == 24
    for k in a: assert a[k] == b[k], k


class CtrlCAt:
    "The default history, with Ctrl-C arriving as the n-th unit's memory is built (rollouts of earlier units in flight)."
    def __init__(self, n): self.n, self.seen = n, 0
    def info(self): return {'name': default_history.__qualname__}   # as the default history is recorded
    def __call__(self, inst, cond):
        self.seen += 1
        if self.seen == self.n: raise KeyboardInterrupt
        return default_history(inst, cond)


def test_interrupt_keeps_finished_rollouts_and_resume_completes(tmp_path):
    "Ctrl-C while model rollouts are in flight: finished ones are written, the rest cancelled; resume asks only for what is missing."
    cache = tmp_path / 'cache.sqlite'
    with LoopbackServer('openai', responder=two_searches, latency=0.05) as srv:
        cfg = config(srv.url, concurrency=4, cache=cache)
        with pytest.raises(KeyboardInterrupt): run(cfg, BENCH, tmp_path / 's', history=CtrlCAt(3), progress=False)
        kept = ResultsStore(tmp_path / 's').rollouts()
        assert 0 < len(kept) < 24 and kept['rollout_id'].is_unique and kept['error'].isna().all()
        n0 = srv.n_requests
        run(cfg, BENCH, tmp_path / 's', progress=False)     # resume: the same config into the same store
        ro = ResultsStore(tmp_path / 's').rollouts(history=True)
        assert len(ro) == ro['rollout_id'].nunique() == 24 and ro['error'].isna().all()
        assert srv.n_requests - n0 <= (24 - len(kept)) * 3   # finished rollouts are not asked again (cancelled ones' calls are cached)


def test_errors_are_records_and_retry_errors_reruns_them(tmp_path):
    with LoopbackServer('openai', responder=two_searches, fault_rate=0.3, faults=('500',), max_faults_per_body=10**6, seed=3) as srv:
        cfg = config(srv.url, concurrency=8, max_attempts=1)
        st = run(cfg, BENCH, tmp_path / 'e', progress=False)
        df = results_frame(st)
        bad = df['error'].notna()
        assert 0 < bad.sum() < 24 and df.loc[bad, 'error'].str.contains('InternalServerError').all()
        tr = {r.rollout_id: r for r in ResultsStore(tmp_path / 'e').rollout_records()}
        assert any(tr[i].n_calls > 0 for i in df.loc[bad, 'rollout_id']), 'no errored rollout kept its finished searches'
        srv.fault_rate = 0.0
        run(cfg, BENCH, tmp_path / 'e', progress=False, retry_errors=True)
        df2 = results_frame(tmp_path / 'e')
        failed = dict(zip(df['rollout_id'], df['error'].notna().astype(int)))
        assert df2['error'].isna().all() and all(a == failed[r] for r, a in zip(df2['rollout_id'], df2['attempt']))


def test_sigint_from_the_cli(tmp_path):
    "`memlab run` with a model policy: Ctrl-C exits 130 keeping finished rollouts; `memlab resume` finishes the grid."
    gate, answered = threading.Event(), []
    def gated(kind, req):                                   # 8 calls answered, then the server holds every call: the
        with lock: answered.append(1); k = len(answered)    # interrupt lands mid-run however loaded the machine is
        if k > 8: gate.wait(120)
        return two_searches(kind, req)
    lock = threading.Lock()
    with LoopbackServer('openai', responder=gated) as srv:
        cfg = config(srv.url, concurrency=2, timeout=60).model_dump(mode='json')
        cfg['dataset'] = {'kind': 'synthetic', 'params': {'n_instances': 6, 'queries_per_instance': 6, 'n_filler': 6, 'seed': 5}}
        cfg['memories'] = [{'name': 'long-context', 'window_tokens': 400}]   # registered in every process (single pass: 1 call each)
        (tmp_path / 'c.yaml').write_text(yaml.safe_dump(cfg))
        env = os.environ | {'MEMLAB_PROGRESS': '0', 'OPENAI_API_KEY': 'sk-test-loops', 'MEMLAB_CACHE': str(tmp_path / 'c.sqlite')}
        store = tmp_path / 'store'
        p = subprocess.Popen([MEMLAB, 'run', str(tmp_path / 'c.yaml'), '--store', str(store)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(6000):                               # bounded polls (not seconds): both held calls have arrived
            if srv.n_requests >= 10 or p.poll() is not None: break
            time.sleep(0.05)
        try: p.send_signal(signal.SIGINT); _, err = p.communicate(timeout=120)
        finally: gate.set(); p.kill()
        assert p.returncode == 130, err
        kept = len(ResultsStore(store).rollouts()) if (store / 'rollouts').exists() else 0
        assert 0 < kept <= 8, kept                          # the answered calls' rollouts, none of the held ones
        r = subprocess.run([MEMLAB, 'resume', str(tmp_path / 'c.yaml'), '--store', str(store)],
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        ro = ResultsStore(store).rollouts(history=True)
        assert len(ro) == ro['rollout_id'].nunique() == 36


def test_transport_settings_resume_the_same_rollouts(tmp_path):
    "A longer timeout or another concurrency resumes the same run: same config hash and the same rollout ids (nothing re-run)."
    with LoopbackServer('openai', responder=two_searches) as srv:
        run(config(srv.url, concurrency=8), BENCH, tmp_path / 's', progress=False)
        n0 = srv.n_requests
        run(config(srv.url, concurrency=2, timeout=120, max_attempts=3), BENCH, tmp_path / 's', progress=False)
        assert srv.n_requests == n0                                 # before: every rollout had a new id and ran again
        assert len(ResultsStore(tmp_path / 's').rollouts(history=True)) == 24


def test_a_rollout_is_timed_from_when_it_starts_not_while_it_waits(tmp_path):
    "Rollouts queued behind `concurrency` slots: `timings.total_s` covers the rollout's own calls, not its wait for a slot."
    with LoopbackServer('openai', responder=two_searches, latency=0.05) as srv:
        run(config(srv.url, concurrency=1), BENCH[:1], tmp_path / "t", progress=False)
    for r in ResultsStore(tmp_path / 't').rollout_records():      # 6 rollouts of 3 calls x 50 ms, one at a time
        assert r.timings['total_s'] <= r.usage.latency_s + 0.25, (r.timings, r.usage.latency_s)   # before: up to 5 x 150 ms more


def test_a_run_leaves_the_garbage_collector_as_it_found_it(tmp_path):
    "A serial model run freezes the heap while it runs (`gc.freeze`), then unfreezes it; a caller's own freeze is left in place."
    import gc
    assert gc.get_freeze_count() == 0
    with LoopbackServer('openai', responder=two_searches) as srv:
        run(config(srv.url), BENCH[:1], tmp_path / 'a', progress=False)
        assert gc.get_freeze_count() == 0
        gc.freeze(); n = gc.get_freeze_count()
        try:
            run(config(srv.url), BENCH[:1], tmp_path / 'b', progress=False)
            assert 0 < gc.get_freeze_count() <= n                     # still frozen (less whatever was freed meanwhile)
        finally: gc.unfreeze()
