"""The web environment (issue 26 §3, the WebArena shape): a site on 127.0.0.1 only, gone after close; the verdict read
from the site's database; seeded tasks; the offline agent's outcomes with and without memory, and the control."""
import json, socket, time
import pytest
from memlab.protocols.memgym.contract import make_manager, api_valid
from memlab.protocols.memgym.envs.contract import ENVS, AGENTS, action_messages, make_action
from memlab.protocols.memgym.envs.web import WebEnv, OfflineWebAgent, web_tasks, parse_page

def run_episode(env, task, manager, agent):
    "The loop `envs.episode` runs: history -> manage_context -> act -> step, the history grown by `action_messages`."
    obs, info = env.reset(seed=task['seed'], options=task['options']); manager.reset(); agent.reset()
    history, k, r, done = [{'role': 'user', 'content': obs}], 0, 0.0, False
    while not done:
        k += 1
        f = manager.manage_context(history, obs, {'step': k, 'info': info})
        a = agent.act(f.content, env.tools)
        obs, r, term, trunc, info = env.step(a.action); done = term or trunc
        history += action_messages(a.action, obs, k)
    assert api_valid(history) is None
    return dict(reward=r, steps=k, truncated=trunc, messages=len(history), **env.outcome())

@pytest.fixture
def env():
    e = ENVS.make('web'); yield e; e.close()

def test_registered():
    assert ENVS.get_impl('web') is WebEnv and AGENTS.get_impl('offline-web') is OfflineWebAgent
    assert [t['function']['name'] for t in WebEnv.tools] == ['click', 'type', 'goto', 'done']

def test_server_binds_loopback_only_and_is_gone_after_close():
    e = WebEnv(); e.reset(seed=1, options={'app': 'tracker'})
    host, port = e.server.address
    assert host == '127.0.0.1' and e.server.httpd.socket.getsockname()[0] == '127.0.0.1'
    socket.create_connection(('127.0.0.1', port), timeout=2).close()          # it serves while open
    thread = e.server.thread
    e.close()
    assert e.server is None and not thread.is_alive()
    with pytest.raises(ConnectionRefusedError): socket.create_connection(('127.0.0.1', port), timeout=2)

def test_goto_refuses_other_origins(env):
    env.reset(seed=2, options={'app': 'mail'})
    for url in ('http://example.com/mail/list', 'http://localhost:1/mail/list', 'file:///etc/passwd'):
        obs, r, term, trunc, info = env.step(make_action('goto', url=url))
        assert obs.startswith('Refused') and info['url'] == '/mail/list?page=1'
    obs, *_ = env.step(make_action('goto', url=env.server.base + '/mail/list?page=2'))   # its own origin is fine
    assert parse_page(obs)[0] == '/mail/list?page=2'

def test_verdict_is_the_database_not_the_claim(env):
    env.reset(seed=3, options={'app': 'payments'})
    obs, r, term, trunc, _ = env.step(make_action('done'))
    assert (r, term) == (0.0, True) and env.outcome()['missed'] == 6          # claiming done does nothing
    targets = [i['id'] for i in env.db['items'] if i['match']]
    for iid in targets: env.site.act(iid, {'op': 'act', 'value': env.db['value']})
    assert env.evaluate() == 1.0
    env.site.act(targets[0], {'op': 'act', 'value': env.db['value']})
    assert env.outcome()['duplicates'] == 1 and env.evaluate() == 0.0        # a double refund fails
    env.reset(seed=3, options={'app': 'payments'})
    for iid in targets: env.site.act(iid, {'op': 'act', 'value': 'DR-000000'})
    assert env.outcome()['wrong_value'] == 6 and env.evaluate() == 0.0
    env.reset(seed=3, options={'app': 'payments'})
    for iid in targets: env.site.act(iid, {'op': 'act', 'value': env.db['value']})
    env.site.act(env.db['items'][0]['id'], {'op': 'act', 'value': env.db['value']})
    assert env.outcome()['wrong_items'] == 1 and env.evaluate() == 0.0

def test_forms_over_http(env):
    obs, _ = env.reset(seed=4, options={'app': 'mail'})
    assert env.db['value'] not in obs                                          # the value is on the source page only
    t = next(i for i in env.db['items'] if i['match'])
    env.step(make_action('goto', url=f"/mail/item/{t['id']}"))
    env.step(make_action('type', id=2, text='someone@x.test'))
    obs, *_ = env.step(make_action('click', id=3))                            # the button posts the form
    assert env.db['actions'] == [{'id': t['id'], 'value': 'someone@x.test'}]
    assert f"status 'Done: Forward on {t['id']} (To = someone@x.test).'" in obs
    obs, *_ = env.step(make_action('type', id=1, text='x'))
    assert 'not a textbox' in obs

def test_tasks_seeded_and_jsonable():
    ts = web_tasks(9, seed=5)
    assert json.loads(json.dumps(ts)) == ts and web_tasks(9, seed=5) == ts and web_tasks(9, seed=6) != ts
    assert {t['domain'] for t in ts} == {'mail', 'tracker', 'payments'}
    assert all(set(t['options']) == {'app', 'n_items', 'n_match', 'per_page'} for t in ts)   # nothing of the answer

def test_agent_acts_on_what_its_context_shows(env):
    obs, _ = env.reset(seed=4, options={'app': 'mail'})
    ag = OfflineWebAgent()
    first = [i for i in env.db['items'][1:6] if i['match']]                   # page 1's targets
    assert first
    ctx = [{'role': 'user', 'content': obs}]
    ctx += action_messages(make_action('goto', url='/mail/list?page=1'), env.observation(), 1)
    ctx += action_messages(make_action('goto', url='/x'), f"URL: /x\nstatus 'Done: Forward on {env.db['items'][0]['id']} (To = a@b.test).'", 2)
    ctx += action_messages(make_action('goto', url='/mail/list?page=1'), env.observation(), 3)
    links = {n['id']: n['name'] for n in parse_page(env.observation())[1] if n['role'] == 'link'}
    a = ag.act(ctx, env.tools).action                                          # value known: the first target of page 1
    assert a['name'] == 'click' and links[a['arguments']['id']].endswith(first[0]['id'])
    ctx[4]['content'] += '\n' + '\n'.join(f"status 'Done: Forward on {i['id']} (To = a@b.test).'" for i in first)
    a = ag.act(ctx, env.tools).action                                          # all handled on page 1: next page
    assert links[a['arguments']['id']] == 'Next'

def test_deterministic(env):
    t = web_tasks(1, seed=9)[0]
    a = run_episode(env, t, make_manager('none'), OfflineWebAgent(2_500))
    b = run_episode(env, t, make_manager('none'), OfflineWebAgent(2_500))
    assert a == b

W = 2_500
CONDITIONS = {'none, unbounded': ('none', {}, None), f'none, window {W}': ('none', {}, W),
              f'llm-summarizing, window {W}': ('llm-summarizing', dict(max_size=20, max_tokens=None, summary_tokens=1_200), W),
              f'structured-summary, window {W}': ('structured-summary', dict(max_size=20, max_tokens=None, summary_tokens=1_200), W),
              'control: trigger never reached': ('llm-summarizing', dict(max_size=10_000, max_tokens=None), W)}

def test_memory_matters_offline_and_the_control(env, capsys):
    tasks, res = web_tasks(21, seed=0), {}
    for c, (m, kw, w) in CONDITIONS.items():
        t0 = time.perf_counter()
        res[c] = [run_episode(env, t, make_manager(m, **kw), AGENTS.make('offline-web', window_tokens=w)) for t in tasks]
        steps = [x['steps'] for x in res[c]]
        with capsys.disabled():
            print(f"\n{c:34s} solved {sum(x['reward'] for x in res[c]):2.0f}/{len(tasks)}  truncated {sum(x['truncated'] for x in res[c]):2d}  "
                  f"steps mean {sum(steps) / len(steps):4.1f} max {max(steps)}  duplicates {sum(x['duplicates'] for x in res[c])}  "
                  f"{1000 * (time.perf_counter() - t0) / sum(steps):.1f} ms/step", end='')
    none_inf, none_w, ctrl = res['none, unbounded'], res[f'none, window {W}'], res['control: trigger never reached']
    assert min(x['messages'] for x in none_inf) > 20                          # every episode crosses a 20-message trigger
    assert any(a['reward'] == 1 and b['reward'] == 0 for a, b in zip(none_inf, none_w))   # the window loses what the unbounded reader solves
    assert ctrl == none_w                                                     # no compaction: identical outcomes, step for step
