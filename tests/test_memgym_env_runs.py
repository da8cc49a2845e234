"""MemGym II episodes in memlab's store (issue 26 §1): a finished run re-runs nothing; an environment that fails mid-episode
leaves an error with the steps it finished, never a score, and `retry_errors` re-runs it; every stored step holds what the
agent saw (the filtered context), so the context at any step is read back without re-running anything."""
import json
from memlab.runner import run, score, load_dataset, RunConfig
from memlab.store import ResultsStore
from memlab.protocols.memgym.envs.contract import ENVS
from memlab.protocols.memgym.envs.episode import Counter, ENV_TASKS, OFFLINE_AGENTS, evidence_messages

CALLS = {'reset': 0, 'fail': True}


@ENVS.register('flaky-counter')
class FlakyCounter(Counter):
    "The toy, whose third step fails once per process while `CALLS['fail']` is set (a crashed tool, a lost sandbox)."
    def reset(self, seed=None, options=None):
        CALLS['reset'] += 1; return super().reset(seed, options)
    def step(self, action):
        if CALLS['fail'] and self.k == 2 and self.secret % 2: raise RuntimeError('the sandbox went away')
        return super().step(action)


ENV_TASKS.register('flaky-counter')(ENV_TASKS.get_impl('toy-counter'))
OFFLINE_AGENTS['flaky-counter'] = 'offline-toy'


def cfg():
    ds = {'kind': 'memgym-env', 'env': 'flaky-counter', 'n': 6, 'seed': 0, 'step_limit': 12, 'task_args': {'pages': 6}}
    return RunConfig(name='flaky', section='memgym-envs', dataset=ds, policies=[{'name': 'memgym-agent', 'agent': {'name': 'offline-toy', 'window_tokens': 300}}],
                     memories=[{'name': 'memgym-env', 'strategy': {'name': 'llm-summarizing', 'max_size': 6, 'max_tokens': None}}],
                     conditions=[{'evidence': 'episode'}], max_steps=14, judge={'name': 'memgym-env'}), ds


def test_errors_stay_errors_resume_runs_nothing_and_retry_finishes(tmp_path):
    c, ds = cfg(); insts = load_dataset(ds); CALLS.update(reset=0, fail=True)
    st = run(c, insts, tmp_path / 's', progress=False)
    ro = st.rollouts()
    bad = ro[ro['error'].notna()]
    assert len(bad) == 3 and all('the sandbox went away' in e for e in bad['error'])          # odd secrets fail at their third step
    failed = [r for r in st.rollout_records() if r.error]
    assert all(len([s for s in r.trajectory.steps if s.kind == 'search']) == 3 for r in failed)   # reset and two steps kept
    score(st, insts)
    sc = st.scores()
    assert (sc['label'] == 'error').sum() == 3 and sc.loc[sc['label'] == 'error', 'score'].isna().all()   # an error is never scored
    n = CALLS['reset']; run(c, insts, tmp_path / 's', progress=False)
    assert CALLS['reset'] == n                                                                # resumed: nothing re-run
    CALLS['fail'] = False
    run(c, insts, tmp_path / 's', progress=False, retry_errors=True); score(st, insts)
    assert CALLS['reset'] == n + 3 and st.rollouts()['error'].isna().all()
    assert st.scores()['label'].value_counts().to_dict() == {'CORRECT': 6}


def test_each_step_holds_the_context_the_agent_saw(tmp_path):
    c, ds = cfg(); insts = load_dataset(ds); CALLS.update(fail=False)
    st = run(c, insts, tmp_path / 's', progress=False)
    r = ResultsStore(tmp_path / 's').rollout_records()[0]
    steps = [s for s in r.trajectory.steps if s.kind == 'search']
    compacted = [k for k, s in enumerate(steps) if s.meta['context'].get('was_compacted')]
    assert compacted
    k = compacted[0]; ctx = evidence_messages(steps[k].observation)
    assert ctx[1]['content'].startswith('[Summary]') and steps[k].meta['context']['tokens'] > 0
    ev = steps[k].meta['context']['condensation_event']
    assert ev['summary_text'] in ctx[1]['content'] and ev['forgotten_count'] == len(ev['forgotten_indices']) > 0
    assert json.loads(steps[k + 1].query)['name'] in ('peek', 'submit')                       # the action taken on that context
