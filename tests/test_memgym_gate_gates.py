"""MemGym III's gates (issue 27 §2): the LLM gate over the wire to the loopback servers (log-probabilities on the OpenAI
wire, the parsed label on the Anthropic one), the heuristic and scikit-learn gates, the capped class weights, the online
`gated` strategy, and the honesty checks (a gate never reads labels, resolved, perturbation or source)."""
import dataclasses, math, subprocess, sys
import numpy as np
import pytest
from loopback import LoopbackServer, yes_probability
from memlab.protocols.memgym.gate.events import CompressionEvent
from memlab.protocols.memgym.gate.gates import (GATES, make_gate, LLMGate, HeuristicGate, SklearnGate, Gated, gate_prompt,
                                                capped_class_weights, training_curve, scrubbed, survival, FEATURES, feature_matrix, event_features,
                                                gate_effect)
from memlab.protocols.memgym.contract import MANAGERS, make_manager
import memlab.protocols.memgym.strategies  # noqa: F401  registers the strategies

def m(role, content): return {'role': role, 'content': content}

VALUES = ['config/settings.yaml', 'port 8431', 'user_id 77', 'src/app.py', 'Alice Smith']

def corpus(n=120, seed=0):
    "Hand-made events: the future uses some early values; the compression keeps some; SAFE iff every used value is kept (10% flipped)."
    rng = np.random.default_rng(seed); out, y = [], []
    for i in range(n):
        used = rng.choice(len(VALUES), size=rng.integers(1, 4), replace=False); keep = rng.random(len(VALUES)) < 0.6
        early = [m('user', f'Note: {v}.') for v in VALUES]
        before = [m('system', 'Solve the task.')] + early + [m('assistant', f'step {i}'), m('user', 'ok')]
        comp = [before[0]] + [e for e, k in zip(early, keep) if k] + before[-2:]
        fut = [{'name': 'use', 'arguments': {'value': VALUES[j]}} for j in used]
        ev = CompressionEvent(f'r{i}@1', f'toy/{i % 4}', 'toy', 'sliding-window', f't{i}', 1, before, comp, fut[0], fut,
                              forgotten=[x for x in before if x not in comp])
        safe = bool(all(keep[j] for j in used)); y.append(int(safe if rng.random() > 0.1 else not safe)); out.append(ev)
    return out, np.array(y)

def dirty(events):
    "The same events with every field a gate may not read filled in, differently per event."
    return [dataclasses.replace(e, labels={'outcome': i % 2, 'replay': 1 - i % 2}, resolved=bool(i % 3),
                                perturbation='summary_noise' if i % 2 else 'truncate_last_10', source=f'p{i}@1') for i, e in enumerate(events)]

def test_registries():
    assert {'constant', 'heuristic', 'sklearn', 'llm'} <= set(GATES) and 'gated' in MANAGERS
    assert make_gate({'name': 'heuristic', 'horizon': 1}).info() == dict(name='heuristic', label='offline heuristic (no LLM)', horizon=1)

def test_llm_gate_logprobs_over_the_openai_wire(tmp_path):
    ev, _ = corpus(12)
    with LoopbackServer('openai') as srv:
        g = make_gate({'name': 'llm', 'backend': {'name': 'openai', 'model': 'loop-model', 'base_url': srv.url, 'cache': False,
                                                   'max_attempts': 1}, 'top_logprobs': 5})
        p = g.score(ev)
        want = [yes_probability('\n\n' + gate_prompt(e)) for e in ev]     # the loopback's documented P(' Y') (no system message)
        assert np.allclose(p, want, atol=1e-12)
        assert len(set(np.round(want, 6))) > 1, 'all prompts gave one probability: the test would prove nothing'
        req = srv.requests[-1]
        assert (req['max_tokens'], req['temperature'], req['logprobs'], req['top_logprobs']) == (1, 0, True, 5)
        info = g.info()
        assert (info['n_calls'], info['n_logprobs'], info['n_fallback'], info['n_unparseable']) == (12, 12, 0, 0)
        assert srv.n_requests == 12 and info['input_tokens'] > 0 and info['output_tokens'] == 12 and info['seconds_per_call'] > 0
        g1 = LLMGate({'name': 'openai', 'model': 'loop-model', 'base_url': srv.url, 'cache': False, 'max_attempts': 1}, top_logprobs=1)
        assert np.allclose(g1.score(ev[:4]), want[:4], atol=1e-12)         # one label listed: the other bounded by the rest
        assert g1.info()['n_bounded'] == 4

def test_llm_gate_parsed_label_over_the_anthropic_wire():
    ev, _ = corpus(8)
    with LoopbackServer('anthropic') as srv:
        g = LLMGate({'name': 'anthropic', 'model': 'loop-model', 'base_url': srv.root, 'cache': False, 'max_attempts': 1})
        p = g.score(ev)
        assert p.tolist() == [float(yes_probability('\n\n' + gate_prompt(e)) >= 0.5) for e in ev]
        assert g.info()['n_fallback'] == 8 and g.info()['n_logprobs'] == 0
        assert 'logprobs' not in srv.requests[-1]

def test_llm_gate_unparseable_reply_is_nan_not_safe():
    ev, _ = corpus(2)
    with LoopbackServer('anthropic', responder=lambda kind, req: 'maybe') as srv:        # no log-probabilities, no label
        g = LLMGate({'name': 'anthropic', 'model': 'loop-model', 'base_url': srv.root, 'cache': False, 'max_attempts': 1})
        p = g.score(ev)
    assert np.isnan(p).all() and g.info()['n_unparseable'] == 2

def test_heuristic_gate_counts():
    before = [m('system', 's'), m('user', 'Use data/input.csv with seed 1234 for Bob Jones.'), m('assistant', 'ok'), m('user', 'done')]
    fut = [{'name': 'read', 'arguments': {'path': 'data/input.csv'}}, {'name': 'run', 'arguments': {'seed': 1234}}]
    kept = CompressionEvent('a@1', 'g', 'toy', 's', 't', 1, before, [before[0], m('user', '[Summary] data/input.csv, seed 1234.')], fut[0], fut)
    half = dataclasses.replace(kept, compressed=[before[0], m('user', '[Summary] data/input.csv.')])
    lost = dataclasses.replace(kept, compressed=[before[0], m('user', '[Summary] read a file.')])
    s = survival(half)
    assert s['paths'] == (1, 1) and s['numbers'] == (1, 0)
    g = HeuristicGate()
    assert g.score([kept, half, lost]).tolist() == [1.0, s['all'][1] / s['all'][0], 0.0]
    assert HeuristicGate(horizon=1).score([half]).tolist() == [1.0]        # only the first action: its path survives

def test_class_weights_are_balanced_and_capped():
    from sklearn.utils.class_weight import compute_class_weight
    y = np.array([0] * 88 + [1] * 12)                                     # the paper's corpus: ~88% HARMFUL
    raw = compute_class_weight('balanced', classes=np.array([0, 1]), y=y)
    w = capped_class_weights(y)
    assert w == {0: float(min(3.0, raw[0])), 1: 3.0} and raw[1] > 3.0 and abs(w[0] - 0.568) < 1e-3
    assert SklearnGate().fit(*corpus(60)).class_weight == capped_class_weights(corpus(60)[1])

def test_sklearn_gate_and_training_curve():
    ev, y = corpus(200)
    g = SklearnGate().fit(ev[:150], y[:150])
    from sklearn.metrics import roc_auc_score
    assert roc_auc_score(1 - y[150:], 1 - g.score(ev[150:])) > 0.75
    assert feature_matrix(ev[:3]).shape == (3, len(FEATURES))
    tc = training_curve(ev[:150], y[:150], ev[150:], y[150:], epochs=12)
    assert tc.epoch.tolist() == list(range(1, 13)) and tc.train_loss.iloc[-1] < tc.train_loss.iloc[0]
    with pytest.raises(ValueError, match='both labels'): SklearnGate().fit(ev[:4], [0] * 4)

def test_scrubbing_what_a_gate_may_not_read_leaves_scores_unchanged():
    ev, y = corpus(40)
    d = dirty(ev)
    sk = SklearnGate().fit(ev, y)
    gates = [HeuristicGate(), sk]
    with LoopbackServer('openai') as srv:
        gates.append(LLMGate({'name': 'openai', 'model': 'loop-model', 'base_url': srv.url, 'cache': False, 'max_attempts': 1}))
        for g in gates:
            a, b = g.score(d), g.score([scrubbed(e) for e in d])
            assert np.array_equal(a, b, equal_nan=True), g.name
            assert len(set(np.round(a, 9))) > 1, f'{g.name}: constant scores would make this check empty'
        # the repository's training prompt names the perturbation: that gate is not honest, and the check sees it
        leaky = LLMGate({'name': 'openai', 'model': 'loop-model', 'base_url': srv.url, 'cache': False, 'max_attempts': 1}, name_perturbation=True)
        assert not np.array_equal(leaky.score(d[:8]), leaky.score([scrubbed(e) for e in d[:8]]))

def episode(mgr, hist):
    mgr.reset(); return [mgr.manage_context(hist[:k], hist[k - 1], {'step': k // 2}) for k in range(2, len(hist) + 1, 2)]

HIST = [m('system', 'You fix bugs.'), m('user', 'The service reads config/settings.yaml on port 8431.')] + [
    x for k in range(9) for x in (m('assistant', f'look {k}'), m('user', f'saw item{k}'))]

@pytest.mark.parametrize('base', [{'name': 'sliding-window', 'max_size': 6}, {'name': 'observation-masking', 'max_size': 6, 'attention_window': 2}])
def test_gated_controls(base):
    none = [f.content for f in episode(make_manager('none'), HIST)]
    plain = [f.content for f in episode(make_manager(**base), HIST)]
    assert plain != none
    veto = episode(Gated(base, {'name': 'constant', 'p': 0.0}), HIST)
    assert [f.content for f in veto] == none and veto[-1].metadata['gate_accepted'] == 0
    assert veto[-1].metadata['gate_vetoed'] == sum(f.metadata['vetoed'] for f in veto) > 0
    acc = episode(Gated(base, {'name': 'constant', 'p': 1.0}), HIST)
    assert [f.content for f in acc] == plain and acc[-1].metadata['gate_vetoed'] == 0
    assert acc[-1].metadata['gate_accepted'] == sum(f.metadata['was_compacted'] for f in acc) > 0

def test_gated_heuristic_vetoes_a_compaction_that_drops_what_the_tail_uses():
    uses = HIST[:6] + [m('assistant', 'Open config/settings.yaml and check port 8431'), m('user', 'file opened')]
    idle = HIST[:6] + [m('assistant', 'look again'), m('user', 'nothing new')]
    mk = lambda: Gated({'name': 'sliding-window', 'max_size': 6}, {'name': 'heuristic'}, threshold=0.5)
    f1, f2 = episode(mk(), uses)[-1], episode(mk(), idle)[-1]
    assert (f1.metadata['vetoed'], f1.metadata['gate_p_safe'], f1.metadata['gate_vetoed']) == (True, 0.0, 1)
    assert f1.content == uses and f1.metadata['was_compacted'] is False
    assert (f2.metadata['vetoed'], f2.metadata['gate_p_safe'], f2.metadata['gate_accepted']) == (False, 1.0, 1)
    assert f2.metadata['compression_ratio'] > 1
    eff = gate_effect([f.metadata for f in episode(mk(), uses)] + [f.metadata for f in episode(mk(), idle)])
    assert (eff['n_candidates'], eff['n_accepted'], eff['n_vetoed']) == (2, 1, 1)
    assert eff['median_accepted_ratio'] == f2.metadata['compression_ratio'] == f2.metadata['candidate_ratio']
    assert f1.metadata['candidate_ratio'] > 1 and f1.metadata['compression_ratio'] == 1.0   # vetoed: the view stays whole

def test_sklearn_is_imported_lazily():
    code = 'import sys, memlab.protocols.memgym.gate.gates; print("sklearn" in sys.modules)'
    assert subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.strip() == 'False'


def test_heuristic_ranking_comes_from_what_this_trajectory_later_uses():
    """The heuristic's AUROC against episode-outcome labels (forks of each counterpart) comes from the values the event's own
    later trajectory uses: given another task's future it drops, and with no later action at all (horizon 0) it is chance.
    Measured on 8 dialogue tasks (281 events): 0.72 own future, 0.65 another task's, 0.63 the next action only, 0.50 none."""
    import dataclasses
    from memlab.protocols.memgym.gate.labels import build_corpus
    from memlab.protocols.memgym.gate.metrics import auroc
    evs, _, _ = build_corpus('dialogue', ('llm-summarizing',), n=8, seed=0, sources=('outcome',), progress=False)
    y = np.array([e.labels['outcome'] for e in evs])
    assert 0 < y.sum() < len(y)
    g = make_gate({'name': 'heuristic'})
    own = auroc(y, g.score(evs))
    tasks = sorted({e.task_id for e in evs}); fut = {}
    for e in evs: fut.setdefault(e.task_id, e.future)
    other = auroc(y, g.score([dataclasses.replace(e, future=fut[tasks[(tasks.index(e.task_id) + 1) % len(tasks)]]) for e in evs]))
    assert own > 0.65 and own > other + 0.03, (own, other)
    assert auroc(y, make_gate({'name': 'heuristic', 'horizon': 0}).score(evs)) == 0.5


def test_features_do_not_read_how_long_the_parent_episode_ran():
    """A failed episode runs to its step limit, so the length of an event's recorded future (and how many values it uses)
    tells the parent's outcome, which is the original event's label: the trained gate must not see it. Repeating the same
    future actions changes no feature."""
    ev, _ = corpus(20)
    for e in ev[:5]:
        longer = dataclasses.replace(e, future=list(e.future) * 3 + [{'name': 'respond', 'arguments': {}}] * 10)
        assert event_features(longer) == event_features(e), [k for k in FEATURES if event_features(longer)[k] != event_features(e)[k]]
