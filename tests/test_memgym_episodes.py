"""MemGym episodes through the runner (issue 15, item 1): every step of every strategy is in the stored rollout, and the
context the model saw at any step is rebuilt from the store and the instance alone, equal to what the strategy returned."""
import pytest
from memlab.runner import RunConfig, run, score, build_judge
from memlab.protocols.memgym.contract import MANAGERS
from memlab.protocols.memgym.protocol import (memgym_dr_dataset, memgym_codeqa_dataset, ManagedContext, rebuild_context, episode_frame,
                                              instance_frame, MemGymOfflineJudge, EPISODE_COLUMNS)

STRATEGIES = ['none', 'sliding-window', 'observation-masking', 'llm-summarizing', 'structured-summary', 'bm25-notes', 'dense-notes',
              'amem-notes', 'pipeline', 'ir-summarizing', 'ir-structured', 'memorybank-notes', 'lightmem-notes', 'simplemem-notes',
              'adaptive-budget', 'gated']


def _spec(name):
    return {'name': name} if name == 'none' else {'name': name, 'max_size': 3, 'max_tokens': 2500}


@pytest.fixture(scope='module')
def stored(tmp_path_factory):
    insts = memgym_dr_dataset(n=1, hops=[3, 5], budget_tokens=10_000) + memgym_codeqa_dataset(n=1, budget_tokens=10_000)
    mems = [{'name': 'memgym-context', 'strategy': _spec(s), 'trigger_size': 3, 'trigger_tokens': 2500} for s in STRATEGIES]
    out = {}
    for track, ii in (('dr', insts[:2]), ('codeqa', insts[2:])):
        spec = {'kind': f'memgym-{track}', 'n': 1, 'budget_tokens': 10_000, **({'hops': [3, 5]} if track == 'dr' else {})}
        cfg = RunConfig(name=f'ep-{track}', section='memgym', dataset=spec, policies=[{'name': 'memgym-answer'}], memories=mems,
                        judge={'name': 'memgym-offline'})
        st = run(cfg, ii, tmp_path_factory.mktemp(track) / 'store', progress=False)
        j = build_judge({'name': 'memgym-offline'}); score(st, ii, judge_obj=j)
        out[track] = (st, ii, j)
    return out


def test_the_registry_is_covered():
    assert set(STRATEGIES) == set(MANAGERS), set(MANAGERS) ^ set(STRATEGIES)


@pytest.mark.parametrize('track', ['dr', 'codeqa'])
def test_every_step_is_stored_and_its_context_rebuilt_exactly(stored, track):
    st, insts, j = stored[track]
    by_id = {i.id: i for i in insts}
    checked = 0
    for r in st.rollout_records():
        assert r.error is None, r.error
        inst = by_id[r.instance_id]
        trace = next(u.meta['trace'] for s in r.trajectory.steps for u in s.observation if u.meta.get('kind') == 'notes')
        assert [t['observation'] for t in trace] == [s.id for s in inst.sessions]
        name = trace[0]['strategy']
        assert name in STRATEGIES, name
        replay = ManagedContext(_spec(name), trigger_size=3, trigger_tokens=2500)
        for k, ses in enumerate(inst.sessions):
            replay.add(ses)
            assert rebuild_context(inst, trace, k) == replay.filtered, (name, k)
            assert trace[k]['tokens'] == replay.trace[k]['tokens'] and trace[k]['original_tokens'] == replay.trace[k]['original_tokens']
            checked += 1
    assert checked >= len(STRATEGIES) * len(insts) * 3


def test_compacting_strategies_store_what_they_wrote(stored):
    st, insts, j = stored['dr']
    ef = episode_frame(st, j, insts)
    wrote = ef[ef['strategy'].isin(['llm-summarizing', 'bm25-notes', 'amem-notes'])]
    assert (wrote['notes'].str.len() > 0).all()
    assert any(isinstance(ref, dict) for tr in wrote['trace'] for t in tr for ref in t['context'])   # a strategy-written message is stored as text
    assert (ef[ef['strategy'] == 'none']['notes'] == '').all()


class Unparsed(MemGymOfflineJudge):
    "A judge whose every reply is unparsed (as a tiny real model's verdicts often are)."
    def prompt_texts(self): return 'unparsed-judge-test'       # its own judge id: the offline judge's verdicts are not reused
    def _score(self, query, answer): return None


def test_a_run_whose_every_verdict_is_unparsed_gives_an_empty_frame_not_an_error(stored):
    "Found with the real model: the section failed with a KeyError when no answer was judged."
    st, insts, _ = stored['dr']
    j = Unparsed(); score(st, insts, judge_obj=j)
    ef = episode_frame(st, j, insts)
    assert ef.empty and list(ef.columns) == EPISODE_COLUMNS
    assert instance_frame(ef).empty
