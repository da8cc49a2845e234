"""The coding environment (issue 26 §3, the SWE-Gym shape): the generator, the sandboxed tools, the harness verdict, and
the offline repair agent under no memory and memory with a small window, against the unbounded window and a control under
which memory cannot matter (outcomes identical). Counts, never seconds, are asserted; times are printed."""
import json, time

import pytest

from memlab.protocols.memgym.contract import make_manager
from memlab.protocols.memgym.envs.contract import ENVS, AGENTS, action_messages, make_action
from memlab.protocols.memgym.envs.episode import ENV_TASKS
from memlab.protocols.memgym.envs.coding import (BUG_KINDS, CodingEnv, OfflineCoder, build_repo, coding_tasks, mutations,
                                                 trim_output)
import memlab.protocols.memgym.strategies  # noqa: F401  (registers the strategies)

W = 1500                                              # the small window (tokens)
TRIGGER = dict(max_size=40, max_tokens=W)             # the memory strategies' trigger: 40 messages or the window's tokens
STEPS = 100                                           # the step ceiling (LimExc)
TASKS = dict(n=10, seed=1, files=3, distractors=1, helpers=2)   # seeded tasks, small repositories to keep pytest runs few (the section runs more)


def drive(task, strategy='none', window=None, max_steps=STEPS, **kw):
    "One episode through the policy loop: history -> manage_context -> act -> step; evaluate() when the ceiling truncates."
    env, agent, man = CodingEnv(cache_runs=True), OfflineCoder(window_tokens=window), make_manager(strategy, **kw)
    obs, info = env.reset(seed=task['seed'], options=task['options'])
    hist, t0, compactions, done, reward, reads = [{'role': 'user', 'content': obs}], time.perf_counter(), 0, False, 0.0, 0
    try:
        for k in range(1, max_steps + 1):
            fc = man.manage_context(hist, obs, {'step': k, 'info': info})
            compactions += bool(fc.metadata['was_compacted'])
            a = agent.act(fc.content, env.tools)
            obs, reward, done, _, info = env.step(a.action)
            reads += a.action['name'] == 'read_file'
            hist += action_messages(a.action, obs, k, a.metadata.get('reasoning', ''))
            if done: break
        if not done: reward = env.evaluate()
        return dict(reward=reward, steps=k, limexc=not done, messages=len(hist), compactions=compactions, reads=reads,
                    seconds=time.perf_counter() - t0, real_runs=env.runs['real'], cached_runs=env.runs['cached'])
    finally: env.close()


def test_registered():
    assert 'coding' in ENVS and 'offline-coder' in AGENTS and 'coding' in ENV_TASKS
    assert ENV_TASKS.get_impl('coding')(2, seed=3) == coding_tasks(2, seed=3)


def test_generator_is_seeded_and_options_hold_no_answer():
    tasks = coding_tasks(8, seed=2)
    assert [t['domain'] for t in tasks] == list(BUG_KINDS) * 2
    assert json.loads(json.dumps(tasks)) == tasks
    for t in tasks:
        spec = build_repo(t['seed'], **t['options'])
        assert spec == build_repo(t['seed'], **t['options'])
        text = json.dumps(t)
        assert spec['bug']['function'] not in text and spec['bug']['path'] not in text   # nothing in options points at the bug


def test_every_template_bug_is_repairable_by_a_generic_mutation():
    from memlab.protocols.memgym.envs.coding import _TEMPLATES, _render, _call
    import random
    for key, t in _TEMPLATES.items():
        good = _render(key, 'f')
        for kind, old, new in t['bugs']:
            calls = t['args'](random.Random(5))
            def same(m):
                try: return all(_call(m, 'f', a) == _call(good, 'f', a) for a in calls)
                except Exception: return False
            assert any(same(m) for _, _, m in mutations(good.replace(old, new, 1))), (key, kind)


def test_trim_output_is_bounded():
    out = trim_output('x' * 10_000, 1500)
    assert len(out) < 1600 and '8500 characters cut' in out


def test_tools_errors_are_observations_and_the_verdict_reads_the_sandbox():
    env = CodingEnv()
    t = coding_tasks(1, seed=4)[0]
    obs, info = env.reset(seed=t['seed'], options=t['options'])
    try:
        assert obs.startswith('Issue:') and info['domain'] == t['domain']
        run = env.step(make_action('run_tests'))[0]
        assert 'FAILED tests/test_summary.py::' in run and run.rstrip().endswith('[exit code 1]')
        assert env.step(make_action('read_file', path='pkg/nothing.py'))[0].startswith('error')
        assert env.step(make_action('read_file', path='/etc/passwd'))[0].startswith('error')
        assert env.step(make_action('edit_file', path='pkg/summary.py', old='', new='x'))[0].startswith('error')
        assert env.step(make_action('run_tests', target='$(touch x)'))[0].startswith('error')
        assert env.step(make_action('search', pattern='('))[0].startswith('error: bad pattern')
        assert env.step(make_action('edit_file', path='pkg/summary.py'))[0].startswith('error: bad arguments')
        assert env.evaluate() == 0.0
        sid = env.snapshot()
        b = env.spec['bug']                      # the harness's own record of the bug, used here to repair by hand
        assert env.step(make_action('edit_file', path=b['path'], old=b['buggy'], new=b['correct']))[0].startswith('Edited')
        assert env.evaluate() == 1.0             # the files decide, whatever an agent says
        obs, r, done, trunc, _ = env.step(make_action('submit'))
        assert (r, done, trunc) == (1.0, True, False)
        env.restore(sid)
        assert env.evaluate() == 0.0
        assert env.runs['real'] == 5 and env.runs['cached'] == 0   # the run above + four verdicts, cache off by default
    finally: env.close()
    assert env.box is None


def test_the_agent_never_sees_env_internals():
    "The agent acts on messages only: the same context gives the same action, whatever environment made it."
    ctx = [{'role': 'user', 'content': 'Issue: a wrong figure.'}]
    a1 = OfflineCoder(window_tokens=None).act(ctx, [])
    a2 = OfflineCoder(window_tokens=None).act(list(ctx), [])
    assert a1.action == a2.action == make_action('list_files', path='.')
    ctx += action_messages(a1.action, 'README.md\npkg/a.py', 1, a1.metadata['reasoning'])
    assert OfflineCoder().act(ctx, []).action == make_action('run_tests', target='')


@pytest.fixture(scope='module')
def outcomes():
    tasks = coding_tasks(**TASKS)
    conds = {'none/unbounded': ('none', None, {}),
             'none/small': ('none', W, {}),
             'llm-summarizing/small': ('llm-summarizing', W, TRIGGER),
             'observation-masking/small': ('observation-masking', W, dict(TRIGGER, attention_window=10, selective=False)),
             'never-triggered/small': ('llm-summarizing', W, dict(max_size=10**6, max_tokens=None))}
    out = {c: [drive(t, s, w, **kw) for t in tasks] for c, (s, w, kw) in conds.items()}
    print()
    for c, rs in out.items():
        secs, real = sum(r['seconds'] for r in rs), sum(r['real_runs'] for r in rs)
        print(f"{c:<27} solved {sum(r['reward'] == 1.0 for r in rs):>2}/{len(rs)}  LimExc {sum(r['limexc'] for r in rs):>2}  "
              f"steps/episode {sum(r['steps'] for r in rs) / len(rs):5.1f}  file reads {sum(r['reads'] for r in rs):>4}  compacted episodes {sum(r['compactions'] > 0 for r in rs):>2}  "
              f"pytest runs {real} real + {sum(r['cached_runs'] for r in rs)} cached  {secs / sum(r['steps'] for r in rs):.3f} s/step")
    return out


def test_unbounded_agent_solves_tasks_long_enough_to_cross_the_trigger(outcomes):
    rs = outcomes['none/unbounded']
    assert sum(r['reward'] == 1.0 for r in rs) == len(rs) and not any(r['limexc'] for r in rs)
    assert sum(r['messages'] > TRIGGER['max_size'] for r in rs) >= len(rs) // 2


def test_small_window_without_memory_loses_a_task_the_unbounded_one_solves(outcomes):
    lost = [i for i, (a, b) in enumerate(zip(outcomes['none/small'], outcomes['none/unbounded'])) if a['reward'] < b['reward']]
    assert lost and all(outcomes['none/small'][i]['limexc'] for i in lost)   # lost at the step ceiling (LimExc)


def test_small_window_re_reads_what_left_it(outcomes):
    "Files that left the window are read again: more reads per task than with the unbounded window, on a task both solve."
    both = [i for i, (a, b) in enumerate(zip(outcomes['none/small'], outcomes['none/unbounded'])) if a['reward'] == b['reward'] == 1.0]
    assert any(outcomes['none/small'][i]['reads'] > outcomes['none/unbounded'][i]['reads'] for i in both) or \
           sum(r['reads'] for r in outcomes['none/small']) > sum(r['reads'] for r in outcomes['none/unbounded'])


def test_control_a_trigger_never_reached_gives_identical_outcomes(outcomes):
    key = lambda rs: [(r['reward'], r['steps'], r['limexc'], r['messages']) for r in rs]
    assert key(outcomes['never-triggered/small']) == key(outcomes['none/small'])
    assert not any(r['compactions'] for r in outcomes['never-triggered/small'])


def test_memory_strategies_compact_on_long_episodes(outcomes):
    for c in ('llm-summarizing/small', 'observation-masking/small'):
        assert sum(r['compactions'] > 0 for r in outcomes[c]) >= 1, c
