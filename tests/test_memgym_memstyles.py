"""The strategies MemGym I left out (issue 26 §5): memlab's readings of MemoryBank, LightMem and SimpleMem as notes
strategies, the ported adaptive token budget, and the web structured-summary schema. Each strategy's contract (API-valid
output, compaction metadata, settings round trip), the behaviour that defines it, and a score on a small MemGym-DR run."""
import math
import pytest
from memlab.protocols.memgym.contract import MANAGERS, make_manager, api_valid, count_tokens
from memlab.protocols.memgym import strategies as S

NEW = ['memorybank-notes', 'lightmem-notes', 'simplemem-notes', 'adaptive-budget']
SYS = {'role': 'system', 'content': 'You are a research agent.'}
from test_memgym_strategies import u, a, call, res   # the message builders of the older strategies' tests
FILLER = [u(f'Weather report {i}: the sky over the harbor is grey and the wind blows east.') for i in range(14)]
HT = [SYS, u('Task: find what broke the Orion build.')]
for i in range(14):
    HT += [call(*[f'c{i}_{j}' for j in range(1 + i % 3)])]
    HT += [res(f'c{i}_{j}', f'Result {i}.{j}: module M{i} compiler output line ' * (2 + j)) for j in range(1 + i % 3)]
    HT.append(u(f'Observation {i} about module M{i}.'))


def run(m, h, **state):
    "One manage_context call per step over the growing history, as the harness calls it."
    m.reset(); m.set_episode_state(**state)
    return [m.manage_context(h[:k], h[k - 1], {'step': k}) for k in range(1, len(h) + 1)]


def compacted(fs): return [k for k, f in enumerate(fs, 1) if f.metadata['was_compacted']]

# ---- the contract ------------------------------------------------------------------------------------------------

def test_registered_listed_and_importable_from_strategies():
    t = S.list_strategies().set_index('name')
    assert set(NEW) <= set(t.index) and set(NEW) <= set(MANAGERS)
    for n in ['memorybank-notes', 'lightmem-notes', 'simplemem-notes']:
        assert t.loc[n, 'kind'] == 'retrieval' and t.loc[n, 'model'] == 'offline' and "memlab's reading" in t.loc[n, 'description']
    assert t.loc['adaptive-budget', 'kind'] == 'truncation' and "memlab's reading" in t.loc['adaptive-budget', 'description']
    assert (S.MemoryBankNotes, S.LightMemNotes, S.SimpleMemNotes, S.AdaptiveBudget) == tuple(MANAGERS.get_impl(n) for n in NEW)


@pytest.mark.parametrize('name', NEW)
def test_settings_round_trip(name):
    m = make_manager(name, max_size=20)
    assert make_manager(**m.info()).info() == m.info()


@pytest.mark.parametrize('name', NEW)
def test_api_valid_within_budget_and_compaction_metadata(name):
    max_size, max_tokens = 12, 200
    fs = run(make_manager(name, max_size=max_size, max_tokens=max_tokens), HT, question='What broke the Orion build in module M3?')
    ks = compacted(fs)
    assert len(ks) >= 3
    for k, f in enumerate(fs, 1):
        assert api_valid(f.content, pending_tool_ids=S.pending_tool_ids(HT[:k])) is None, (name, k)
        if S.compaction_trigger(HT[:k], max_size, max_tokens) is None: assert not f.metadata['was_compacted'], (name, k)
    for k in ks:
        md = fs[k - 1].metadata
        assert md['tokens'] <= max_tokens and len(fs[k - 1].content) <= max_size, (name, k, md['tokens'])
        assert md['strategy'] == name and md['original_tokens'] == count_tokens(HT[:k])
        assert md['compression_ratio'] == pytest.approx(md['original_tokens'] / md['tokens'])
        ev = md['condensation_event']
        assert ev['forgotten_indices'] and ev['forgotten_count'] == len(ev['forgotten_indices'])

# ---- MemoryBank --------------------------------------------------------------------------------------------------

def test_memorybank_retention_is_the_ebbinghaus_curve():
    assert S.retention(0, 1) == 1.0 and S.retention(2, 1) == pytest.approx(math.exp(-2))
    assert S.retention(3, 1) < 0.05 < S.retention(3, 2)


def test_memorybank_forgets_an_unrecalled_note_and_keeps_a_recalled_one():
    h = [SYS, u('The vault code for project Falcon is 7319.'), u('The lighthouse keeper is called Marnabek.')] + FILLER * 3
    m = make_manager('memorybank-notes', max_size=8, k=1)
    fs = run(m, h, question='What is the vault code for project Falcon?')
    assert m.strength[1] >= 3 and 1 in m.notes                  # recalled at each compaction, so it stays
    assert 2 not in m.notes and 2 in m.faded                     # never recalled: it faded below the floor
    assert '7319' in fs[-1].content[1]['content'] and 'Marnabek' not in fs[-1].content[1]['content']
    assert fs[-1].metadata['notes_forgotten'] == len(m.faded) > 0


def test_memorybank_without_recall_forgets_both_and_a_low_floor_keeps_both():
    h = [SYS, u('The vault code for project Falcon is 7319.'), u('The lighthouse keeper is called Marnabek.')] + FILLER * 3
    m = make_manager('memorybank-notes', max_size=8, k=1)
    run(m, h, question='Who painted the harbor mural?')
    assert 1 not in m.notes and 2 not in m.notes
    m = make_manager('memorybank-notes', max_size=8, k=1, floor=0.0)
    run(m, h, question='Who painted the harbor mural?')
    assert 1 in m.notes and 2 in m.notes

# ---- LightMem ----------------------------------------------------------------------------------------------------

def test_lightmem_sensory_stage_drops_low_information_and_repeated_sentences():
    seen = set()
    assert S.sensory_filter('Ok. The Falcon vault code is 7319. Thanks!', seen) == ['The Falcon vault code is 7319.']
    assert S.sensory_filter('The Falcon vault code is 7319.', seen) == []


def test_lightmem_segments_follow_topic_changes():
    h = [SYS, u('The Falcon vault code is 7319.'), u('The Falcon vault opens at noon with the code.'),
         u('Rain is expected over the harbor tonight.'), u('The harbor rain will stop by morning.'),
         u('The Falcon vault alarm was reset by the Falcon guard.')]
    m = make_manager('lightmem-notes', max_size=100)
    run(m, h)
    assert [list(s.sentences) for s in m.segments] == [[1, 2], [3, 4], [5]]
    m = make_manager('lightmem-notes', max_size=100, topic_threshold=0.0)   # no threshold: one topic
    run(m, h)
    assert len(m.segments) == 1


def test_lightmem_retrieves_the_consolidated_topic_of_the_question():
    h = [SYS, u('The Falcon vault code is 7319.'), u('The Falcon vault opens at noon with the code.'),
         u('Rain is expected over the harbor tonight.'), u('The harbor rain will stop by morning.')] + FILLER
    m = make_manager('lightmem-notes', max_size=8, k=1)
    fs = run(m, h, question='When does the Falcon vault open?')
    f = fs[compacted(fs)[-1] - 1]
    block = f.content[1]['content']
    assert 'noon' in block and '7319' in block and 'Rain is expected' not in block
    assert f.metadata['topics'] >= 2 and f.metadata['segments'] >= 2

# ---- SimpleMem ---------------------------------------------------------------------------------------------------

def test_simplemem_facts_are_self_contained():
    fs = S.atomic_facts('Kaseth Evrovask is the mayor. He studied at Tevumuld College. Report of 2024-03-05: it rained yesterday.')
    assert fs[1] == 'Kaseth Evrovask studied at Tevumuld College.' and fs[2].endswith('it rained on 2024-03-04.')


def test_simplemem_deduplicates_a_repeated_fact():
    fact = 'The vault code for project Falcon is 7319.'
    h = [SYS, u(fact), a(f'Ok. {fact}'), u(f'Reminder. {fact}'), u('The Falcon vault opens at noon.')] + FILLER
    m = make_manager('simplemem-notes', max_size=8)
    fs = run(m, h, question='What is the vault code for project Falcon?')
    assert [n.text for n in m.notes.values() if '7319' in n.text] == [fact] and m.sources[1] == [1, 2, 3]
    assert fs[-1].content[1]['content'].count('7319') == 1 and fs[compacted(fs)[0] - 1].metadata['facts_merged'] == 2


def test_simplemem_a_more_complete_fact_replaces_the_one_it_contains():
    h = [SYS, u('The Falcon vault code is 7319.'), u('The Falcon vault code is 7319 since the audit in May.')] + FILLER
    m = make_manager('simplemem-notes', max_size=8)
    run(m, h, question='vault code')
    assert [n.text for n in m.notes.values() if '7319' in n.text] == ['The Falcon vault code is 7319 since the audit in May.']

# ---- adaptive budget ---------------------------------------------------------------------------------------------

def _episode(words, n):
    return [SYS, u('Task: repair the build.')] + [x for i in range(n) for x in (a(f'step {i}'), u(f'Output {i}: ' + 'log ' * words))]


def test_adaptive_target_shrinks_with_long_observations_between_floor_and_target():
    assert S.adaptive_target([100], 1000) == 1000 and S.adaptive_target([400], 1000) == 500 and S.adaptive_target([10_000], 1000) == 250
    cfg = dict(max_size=1000, max_tokens=3000)
    first = lambda fs: fs[compacted(fs)[0] - 1]
    short = first(run(make_manager('adaptive-budget', **cfg), _episode(40, 80)))
    long_ = first(run(make_manager('adaptive-budget', **cfg), _episode(400, 12)))
    window = first(run(make_manager('sliding-window', **cfg), _episode(400, 12)))
    assert short.metadata['token_target'] == 2250 and 562 <= long_.metadata['token_target'] < 2250
    assert long_.metadata['tokens'] < window.metadata['tokens']     # a smaller tail than the fixed target keeps


def test_adaptive_budget_without_a_token_trigger_is_a_sliding_window():
    h = [SYS] + [u(f'Item {i} weighs {i * 3} kg.') if i % 2 else a(f'Checked item {i}.') for i in range(1, 30)]
    ad = run(make_manager('adaptive-budget', max_size=10, max_tokens=None), h)
    sw = run(make_manager('sliding-window', max_size=10, max_tokens=None), h)
    assert [f.content for f in ad] == [f.content for f in sw] and compacted(ad) == compacted(sw)

# ---- the web schema ----------------------------------------------------------------------------------------------

def test_web_schema_has_14_fields_and_works_offline():
    fields, required = S.SCHEMAS['web']
    assert len(fields) == 14 and set(required) <= set(fields)
    tool = S.summary_tool('web')['function']
    assert set(tool['parameters']['properties']) == set(fields) and tool['parameters']['required'] == required
    h = [SYS, u('Task: buy the blue kettle.')] + [x for i in range(10) for x in (a(f'click link {i}'), u(f'Page {i}: price of kettle {i} is {i * 4} dollars. Error: item {i} out of stock.'))]
    f = run(make_manager('structured-summary', schema='web', max_size=8), h)[-1]
    text = f.content[1]['content']
    assert '**Errors**' in text and '**Task Goal**' in text and api_valid(f.content) is None

# ---- a small MemGym-DR run ---------------------------------------------------------------------------------------

def test_each_new_strategy_scores_on_a_small_dr_run(tmp_path):
    from memlab.runner import RunConfig, run as run_cfg, score, build_judge
    from memlab.protocols.memgym.protocol import memgym_dr_dataset, episode_frame, MemGymParams
    names = ['none', 'bm25-notes'] + NEW
    insts = memgym_dr_dataset(n=1, hops=[3, 5], budget_tokens=20_000)
    P = MemGymParams(strategies=names, tracks=['dr'])
    cfg = RunConfig(name='memstyles-dr', section='memgym', dataset={'kind': 'memgym-dr', 'n': 1, 'hops': [3, 5], 'budget_tokens': 20_000},
                    policies=P.policies(), memories=P.memory_specs(), judge=P.judge_spec())
    st = run_cfg(cfg, insts, tmp_path / 'store', progress=False)
    j = build_judge(P.judge_spec()); score(st, insts, judge_obj=j)
    ef = episode_frame(st, j, insts)
    got = ef.groupby('strategy')['score'].agg(['count', 'mean'])
    assert set(got.index) == set(names), got
    assert (got['count'] == len(insts)).all() and got['mean'].between(0, 1).all(), got
    wrote = ef[ef['strategy'].isin(['memorybank-notes', 'lightmem-notes', 'simplemem-notes'])]
    assert (wrote['notes'].str.len() > 0).all()                      # each wrote its notes block into the episode

# ---- the invariant on random histories ---------------------------------------------------------------------------

from hypothesis import given, settings, strategies as st, HealthCheck


from test_memgym_strategies import histories   # the same valid histories as the older strategies' property test


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.sampled_from(NEW), st.sampled_from([None, 60, 200]), st.sampled_from([1, 2]))
def test_every_new_strategy_is_api_valid_at_every_step(h, name, max_tokens, keep_first):
    m = make_manager(name, max_size=4, max_tokens=max_tokens, keep_first=keep_first)
    for k, f in enumerate(run(m, h, question='value of Module3'), 1):
        assert api_valid(f.content, pending_tool_ids=S.pending_tool_ids(h[:k])) is None, (name, f.content)
        if f.metadata['was_compacted']: assert f.metadata['condensation_event']['forgotten_indices'], (name, k)
        if S.compaction_trigger(h[:k], 4, max_tokens) is None: assert not f.metadata['was_compacted'], (name, k)
