"""MemGym III's labels (issue 27 §1): episode outcome by forking at the compaction, counterfactual replay, the LLM judge over
the forgotten content (through a real backend against the loopback server), and the corpus builder. Labels must come from
what the policy does on a view, never from a perturbation's name; tests assert counts, never seconds."""
import dataclasses, re
import pytest
from loopback import LoopbackServer, Reply, _user_texts
from memlab.protocols.memgym.envs.episode import memgym_env_dataset, run_episode
from memlab.protocols.memgym.gate.labels import (episode_events, fork_episode, replay_label, requery, outcome_label, judge_label,
                                                  construction_label, label_events, build_corpus, counterparts, JUDGE_PROMPT)

SUMM = {'name': 'llm-summarizing', 'max_size': 5, 'keep_first': 1, 'max_tokens': None}
TOY = {'name': 'offline-toy', 'window_tokens': 300}


def toy_events(n=3):
    out = []
    for inst in memgym_env_dataset('toy-counter', n=n, seed=3, step_limit=12, task_args={'pages': 6}):
        q = inst.queries[0]
        out += episode_events(run_episode(q, SUMM, TOY), q, SUMM, TOY)
    return out


def blank(e):
    "The event with its summary emptied (a view the toy's agent cannot answer from)."
    view = [{**m, 'content': '[Summary] '} if (m.get('content') or '').startswith('[Summary]') else m for m in e.compressed]
    return dataclasses.replace(e, event_id=e.event_id + ':blank', compressed=view, summary='', perturbation='summary_blank', source=e.event_id, labels={})


def test_fork_of_the_original_view_reproduces_the_parent():
    evs = toy_events()
    assert len(evs) >= 9 and all(e.resolved for e in evs)
    forks = [fork_episode(e, e.compressed) for e in evs]
    assert sum(f['resolved'] for f in forks) == len(evs)
    assert [f['live_steps'] for f in forks] == [len(e.future) for e in evs]      # the fork retraces the parent's remaining actions
    assert sum(fork_episode(e, blank(e).compressed)['resolved'] for e in evs) == 0   # the number lived only in the summary


def test_outcome_is_decided_by_the_fork_not_by_the_perturbation_name():
    e = toy_events(1)[0]
    c = blank(e)
    assert outcome_label(c) == 0
    renamed = dataclasses.replace(c, perturbation='truncate_last_10')             # the same view under another name: the same label
    assert outcome_label(renamed) == 0
    harmless = dataclasses.replace(e, event_id=e.event_id + ':x', perturbation='summary_redaction', source=e.event_id)   # the view unchanged
    assert outcome_label(harmless) == 1 and construction_label(harmless) == 0


def test_replay_compares_like_with_like_and_ignores_labels():
    evs = toy_events(1)
    last = evs[-1]
    assert last.action['name'] == 'submit'
    c = blank(last)
    assert replay_label(c, last) == 0 and c.predicted == {'name': 'submit', 'arguments': {'number': 0}}
    # what the policy sees never includes labels, outcome, perturbation name or source: scrubbing them changes nothing
    scrub = dataclasses.replace(c, labels={'outcome': 1, 'construction': 1}, resolved=True, perturbation=None, source='')
    assert requery(scrub) == requery(c)
    assert replay_label(last) == 1 and last.predicted == last.action


def test_judge_label_over_the_wire():
    seen = []
    def responder(kind, req):
        p = _user_texts(kind, req)[-1]; seen.append(p)
        kept = p.split('Summary the agent keeps in its place:')[1]
        return Reply(content='Y' if re.search(r'number is \d+', kept) else 'N')
    from memlab.llm import make_backend
    e = toy_events(1)[0]
    with LoopbackServer('openai', responder=responder) as srv:
        b = make_backend('openai', model='loop-model', base_url=srv.url, timeout=5, backoff=0.01, cache=False)
        got = [judge_label(e, b)[0], judge_label(blank(e), b)[0]]
        n = srv.n_requests
    assert got == [1, 0] and n == 2
    assert seen[0].startswith(JUDGE_PROMPT.split('\n')[0]) and 'page 1' in seen[0]   # memlab's prompt, with the forgotten page
    assert judge_label(e, None)[0] is None


def test_label_events_counts_and_needs_the_original():
    e = toy_events(1)[0]
    evs = [e] + counterparts(e, seed=0)
    rep = label_events(evs, ('outcome', 'replay', 'construction'), progress=False)
    counts = rep['counts'].set_index(['perturbation', 'source'])
    assert int(counts[['SAFE', 'HARMFUL', 'none']].to_numpy().sum()) == 3 * len(evs)
    assert counts.loc[('original', 'outcome'), 'SAFE'] == 1
    with pytest.raises(KeyError, match='is not among the events'):
        label_events(evs[1:], ('replay',), progress=False)
    with pytest.raises(ValueError, match='unknown label sources'):
        label_events(evs, ('gold',), progress=False)


def test_dialogue_corpus_outcome_labels_are_not_construction_labels():
    events, frame, rep = build_corpus('dialogue', n=3, seed=0, progress=False, sources=('outcome', 'replay', 'construction'))
    orig = frame[frame.perturbation == 'original']
    cp = frame[frame.perturbation != 'original']
    assert len(orig) > 0 and len(cp) > len(orig)
    assert (orig.label_outcome == 1).all() and (cp.label_construction == 0).all()
    assert (cp.label_outcome == 1).sum() > 0                     # a counterpart that removed nothing the agent uses stays SAFE
    assert (cp.label_outcome == 0).sum() > 0                     # and some are HARMFUL by what the fork did
    assert 0 < (frame.label_outcome == frame.label_construction).mean() < 1
    assert set(rep['seconds']) == {'outcome', 'replay', 'construction'}


def web_events(n=2):
    from memlab.protocols.memgym.gate.labels import env_setup, strategy_spec
    st, spec, out = env_setup('web'), strategy_spec('llm-summarizing', 'web'), []
    for inst in memgym_env_dataset('web', n=n, seed=0, step_limit=st['step_limit'], env_args=st['env_args']):
        q = inst.queries[0]
        out += episode_events(run_episode(q, spec, st['agent']), q, spec, st['agent'])
    return out


def test_web_fork_of_the_original_view_keeps_the_summary_rolling():
    "Before `adopt_view` the fresh manager forgot the view's summary at its next compaction: forks of the original view failed where the parent succeeded."
    evs = web_events()
    assert len(evs) >= 8 and all(e.resolved for e in evs)
    assert sum(fork_episode(e, e.compressed)['resolved'] for e in evs) == len(evs)


def test_events_of_a_stored_run_fork_back_to_their_parents_outcome(tmp_path):
    """Events read from a runner's store (not only from an in-process `run_episode`) carry what a fork replays: forking each
    original compressed view re-creates the parent's outcome; forking a view with its summary blanked does not, for some."""
    from test_memgym_gate_events import _env_run
    from memlab.protocols.memgym.gate.events import events_from_store
    st, qs = _env_run(tmp_path, 'dialogue', 3, {'name': 'llm-summarizing', 'max_size': 10, 'max_tokens': 200, 'summary_tokens': 80},
                      {'name': 'offline-dialogue', 'window_tokens': 300}, 40)
    evs = events_from_store(st, qs)
    assert evs and all(e.spec.get('prefix_actions') is not None for e in evs)
    assert [fork_episode(e, e.compressed)['resolved'] for e in evs] == [e.resolved for e in evs]
    blank = [fork_episode(e, [m if not str(m.get('content', '')).startswith('[Summary]') else {**m, 'content': '[Summary] '} for m in e.compressed])['resolved']
             for e in evs]
    assert any(e.resolved and not b for e, b in zip(evs, blank)), blank
