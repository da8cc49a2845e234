"""What building a memory costs, and what happens when it cannot be built (issue 28: "keeps the LLM calls it makes
(extraction, updates) in memlab's usage and cost accounting"; "failures are recorded, not hidden").

The memory here stands in for mem0 / Graphiti / LangMem only in what the runner sees of them: `usage` grows by the calls
its construction made (two per session), and `add` can raise as a system does when its model server fails. The real
systems' own tests (tests/test_system_*.py) check that their `usage` counts every request the server saw.
- every rollout carries its unit's construction usage and sessions ingested; `construction_costs` counts each unit once;
- MemTrace-style windows (histories extending one another) count only each window's new sessions;
- a memory that cannot be built stores the unit's rollouts as `MemoryBuildError` errors with the calls made before the
  failure, the other units run, and `retry_errors` builds it again; serial offline runs, thread pools and the async path
  of model policies alike.
"""
import concurrent.futures as cf
import pytest
from loopback import LoopbackServer, Reply
from memlab.core import Usage
from memlab.memory import Memory, MEMORIES
from memlab.runner import RunConfig, ResultsStore, run, results_frame, construction_costs, PrefixMemories
from memlab.synth import make_benchmark

BENCH = make_benchmark(3, 4, 5, seed=2)          # 3 instances, 12 queries
FAILING: set = set()                              # session ids whose ingestion raises (a test sets it)


class ModelBuilt(Memory):
    "Stores sessions' text; each session 'costs' two model calls of 100 input and 10 output tokens; raises on FAILING ids."
    family, needs_llm = 'planar', True
    def __init__(self, k=3): super().__init__(k); self.reset()
    def reset(self): self.texts, self.usage = [], Usage()
    def add(self, s):
        if s.id in FAILING:
            self.usage = self.usage + Usage(calls=1, input_tokens=100)    # the call that failed was made
            raise ConnectionError(f'model server refused session {s.id}')
        self.usage = self.usage + Usage(calls=2, input_tokens=200, output_tokens=20)
        self.texts += [(t.content, s.id) for t in s.turns]
    def search(self, q, k=None):
        from memlab.core import Evidence
        qs = set(q.lower().split())
        hits = sorted(self.texts, key=lambda x: -len(qs & set(x[0].lower().split())))[:k or self.k]
        return [Evidence(text=t, session_id=sid, rank=i) for i, (t, sid) in enumerate(hits)]
    def snapshot(self):
        c = ModelBuilt(self.k); c.texts, c.usage = list(self.texts), self.usage; return c


@pytest.fixture(autouse=True)
def registered():
    MEMORIES.register('model-built-test')(ModelBuilt); FAILING.clear()
    yield
    MEMORIES.pop('model-built-test'); FAILING.clear()


def cfg(name='c', policies=None):
    return RunConfig(name=name, policies=policies or [{'name': 'offline-reader', 'tier': 'strong'}],
                     memories=[{'name': 'model-built-test', 'k': 3}, {'name': 'bm25', 'k': 3}])


def n_sessions(inst): return len(inst.sessions)


@pytest.mark.parametrize('threads', [False, True])
def test_rollouts_carry_their_units_construction_usage_and_costs_count_each_unit_once(tmp_path, threads):
    ex = cf.ThreadPoolExecutor(2) if threads else None
    try: st = run(cfg(), BENCH, tmp_path / 's', executor=ex, progress=False)
    finally:
        if ex: ex.shutdown()
    ro = st.rollout_records()
    built = [r for r in ro if r.memory.startswith('model-built-test')]
    sessions = {i.id: n_sessions(i) for i in BENCH}
    assert len(built) == sum(len(i.queries) for i in BENCH) and all(r.error is None for r in ro)
    for r in built:                                   # each rollout: its unit's calls, not the run's
        assert r.memory_usage.calls == 2 * sessions[r.instance_id] and r.timings['ingest_sessions'] == sessions[r.instance_id]
    assert all(r.memory_usage == Usage() for r in ro if r.memory == 'bm25[k=3]')
    cc = construction_costs(st)
    total = sum(sessions.values())
    assert cc.loc['model-built-test[k=3]', ['units', 'sessions', 'llm_calls', 'input_tokens']].tolist() == [3, total, 2 * total, 200 * total]
    assert cc.loc['model-built-test[k=3]', 'calls_per_session'] == 2.0 and cc.loc['bm25[k=3]', 'llm_calls'] == 0
    assert 'memory_usage' in results_frame(st).columns


def test_windows_count_only_their_new_sessions():
    "A history that extends the previous unit's tops its memory up: the unit pays for the new sessions only."
    pm, inst = PrefixMemories(), BENCH[0]
    _, done1, u1 = pm.build({'name': 'model-built-test'}, inst.sessions[:3])
    _, done2, u2 = pm.build({'name': 'model-built-test'}, inst.sessions[:5])
    assert (done1, u1.calls, done2, u2.calls) == (0, 6, 3, 4)


def test_a_memory_that_cannot_be_built_is_an_error_per_rollout_and_is_retried(tmp_path):
    FAILING.add(BENCH[1].sessions[2].id)
    st = run(cfg(), BENCH, tmp_path / 's', progress=False)
    ro = st.rollout_records()
    bad = [r for r in ro if r.instance_id == BENCH[1].id and r.memory.startswith('model-built-test')]
    assert len(bad) == len(BENCH[1].queries) and all(r.error.startswith("MemoryBuildError: memory 'model-built-test[k=3]' could not be built: ConnectionError: model server refused session") for r in bad)
    assert all(r.memory_usage.calls == 2 * 2 + 1 and r.answer is None and r.memory_family == 'planar' and r.k == 3 for r in bad)   # two sessions, then the failed call
    assert all(r.error is None for r in ro if r not in bad)          # the other units ran
    cc = construction_costs(st)
    assert cc.loc['model-built-test[k=3]', 'failed_units'] == 1 and cc.loc['bm25[k=3]', 'failed_units'] == 0
    FAILING.clear()                                                  # the server is back
    run(cfg(), BENCH, st.root, retry_errors=True, progress=False)
    again = {r.rollout_id: r for r in ResultsStore(st.root).rollout_records()}
    assert all(again[r.rollout_id].error is None and again[r.rollout_id].attempt == 1 for r in bad)
    assert len(again) == len(ro)


def answer(kind, req): return Reply(content='Answer: unknown')


def test_the_async_path_of_model_policies_records_the_same(tmp_path):
    FAILING.add(BENCH[0].sessions[1].id)
    with LoopbackServer('openai', responder=answer) as srv:
        pol = [{'name': 'llm', 'backend': {'name': 'openai', 'model': 'm', 'base_url': srv.url, 'cache': False, 'timeout': 5}}]
        st = run(cfg('a', pol), BENCH, tmp_path / 's', progress=False)
    ro = st.rollout_records()
    bad = [r for r in ro if r.error]
    assert {r.instance_id for r in bad} == {BENCH[0].id} and all('MemoryBuildError' in r.error for r in bad)
    assert all(r.memory_usage.calls == 3 for r in bad)
    ok = [r for r in ro if not r.error and r.memory.startswith('model-built-test')]
    assert ok and all(r.memory_usage.calls == 2 * n_sessions(next(i for i in BENCH if i.id == r.instance_id)) for r in ok)


def test_estimate_builds_no_model_built_memory_and_prices_its_construction():
    "`estimate` is a dry run: a memory built with a model is not built (bm25 stands in for its search); its construction is a row of its own."
    adds = []
    class Priced(ModelBuilt):
        construction_calls, construction_prompt_tokens = 2.0, 100
        def add(self, s): adds.append(s.id); super().add(s)
    MEMORIES.register('priced-test')(Priced)
    try:
        from memlab.runner import estimate
        pol = [{'name': 'llm', 'backend': {'name': 'openai', 'model': 'gpt-4o-mini', 'base_url': 'http://127.0.0.1:9/v1'}}]
        cfg = RunConfig(name='e', policies=pol, memories=[{'name': 'priced-test', 'k': 3}, {'name': 'bm25', 'k': 3}])
        est = estimate(cfg, BENCH)
        assert adds == []                                                   # nothing built: no model called
        row = est[est['policy'].str.startswith('construction')]
        n = sum(len(i.sessions) for i in BENCH)
        assert len(row) == 1 and row['model_calls'].iloc[0] == 2 * n and row['input_tokens'].iloc[0] > 2 * 100 * n
        answer = est[(est['memory'] == 'priced-test[k=3]') & ~est['policy'].str.startswith('construction')]
        assert len(answer) == 1 and answer['model_calls'].iloc[0] > 0       # the answer calls, searched through the stand-in
    finally: MEMORIES.pop('priced-test')
