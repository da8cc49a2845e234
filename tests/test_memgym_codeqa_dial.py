"""The CodeQA difficulty dial (issue 26 section 5): seed 004's "composable post-hoc dial (prompt fuzzing, distractor scaling,
indirection, fact fragmentation)". Each knob does what it says, the knobs compose in any order, the dial is seeded, keeps
the budget and the generator's checks, and the default dataset is byte-identical."""
import itertools
import pytest
from memlab.protocols.memgym.generators.codeqa import (synth_codeqa, harden, dialled_codeqa, split_fact, instance_tokens,
                                                        DIAL_PRESETS, _label_errors, _record_names)
from memlab.protocols.memgym.official.codeqa import validate_codeqa, keep_rule, critical_memory_only, format_memory_files
from memlab.protocols.memgym.offline.codeqa import carries, offline_fact_judge, offline_noise_judge
from memlab.protocols.memgym.codeqa import score_instance
from memlab.protocols.memgym.protocol import memgym_codeqa_dataset, codeqa_instances


@pytest.fixture(scope='module')
def pool():
    return synth_codeqa(8, seed=0) + synth_codeqa(4, seed=5, phrasing='b')


def _docs(x): return format_memory_files(x.memory_files)


def _checks(x):
    validate_codeqa(x)
    assert keep_rule(x) and len(critical_memory_only(x)) >= 2
    assert not _label_errors(x), _label_errors(x)


def test_default_is_byte_identical():
    a, b = synth_codeqa(3, seed=2), dialled_codeqa(3, seed=2)
    assert [x.to_json() for x in a] == [x.to_json() for x in b]
    assert [x.to_json() for x in dialled_codeqa(3, seed=2, difficulty={})] == [x.to_json() for x in a]
    assert [i.model_dump_json() for i in memgym_codeqa_dataset(n=3, seed=2)] == [i.model_dump_json() for i in codeqa_instances(b, 10_000)]
    assert harden(a[0]).to_json() == a[0].to_json()


def test_input_unchanged(pool):
    x = pool[0]; before = x.to_json()
    harden(x, **DIAL_PRESETS['hard'])
    assert x.to_json() == before


@pytest.mark.parametrize('factor', [1.5, 2.0, 3.0])
def test_distractor_counts_scale(pool, factor):
    for x in pool:
        y = harden(x, distractors=factor)
        assert len(y.distractors) == round(len(x.distractors) * factor)
        assert y.distractors[:len(x.distractors)] == x.distractors
        by = lambda ds, s: sum(d.source == s for d in ds)
        assert by(y.distractors, 'same_repo') == by(x.distractors, 'same_repo')
        assert sum(by(y.distractors, s) for s in ('cross_instance', 'adversarial', 'same_function')) > \
            sum(by(x.distractors, s) for s in ('cross_instance', 'adversarial', 'same_function'))
        assert {(d.source, d.target_qa_id) for d in y.distractors} == {(d.source, d.target_qa_id) for d in x.distractors}
        assert len({d.content for d in y.distractors}) == len(y.distractors)
        assert all(d.content in _docs(y) for d in y.distractors)
        assert not any(carries(f.content, d.content) for f in y.grounding_facts for d in y.distractors)
        assert y.task_prompt == x.task_prompt and y.qa_pairs == x.qa_pairs and y.grounding_facts == x.grounding_facts
        _checks(y)


def test_distractor_factor_below_one_is_refused(pool):
    with pytest.raises(ValueError, match='must be >= 1.0'): harden(pool[0], distractors=0.5)


@pytest.mark.parametrize('level', [1, 2])
def test_fragmentation_splits_a_fact(pool, level):
    for x in pool:
        y = harden(x, fragment=level)
        gone = [f for f in critical_memory_only(x) if f.content in _docs(x) and f.content not in _docs(y)]
        assert len(gone) == level
        assert [f.content for f in y.grounding_facts] == [f.content for f in x.grounding_facts]
        for f in gone:
            parts = split_fact(f.content)
            assert len(parts) == 2 and all(p in _docs(y) for p in parts)
            assert carries(f.content, ' '.join(parts)) and not any(carries(f.content, p) for p in parts)
            homes = {n for n in _record_names(y) for p in parts if p in y.memory_files[n]}
            assert len(homes) == 2                          # two record files
        _checks(y)


@pytest.mark.parametrize('level', [1, 2])
def test_indirection_adds_a_linked_fact(pool, level):
    for x in pool:
        y = harden(x, indirection=level)
        assert len(y.grounding_facts) == len(x.grounding_facts) + level
        new = y.grounding_facts[len(x.grounding_facts):]
        assert all(not f.discoverable and f.content in _docs(y) for f in new)
        hidden = [f for f in critical_memory_only(x) if f.content not in _docs(y)]
        assert len(hidden) == level
        for f, a in zip(hidden, new):
            for q0, q1 in zip(x.qa_pairs, y.qa_pairs):
                assert (a.id in q1.linked_fact_ids) == (f.id in q0.linked_fact_ids)
                if f.id in q0.linked_fact_ids: assert q1.num_linked_facts == q0.num_linked_facts + 1 and q1.requires_synthesis
            assert carries(f.content, _docs(y))             # the value is still in the record, one hop away
        _checks(y)


def test_fuzz_changes_the_prompt_not_the_facts(pool):
    for x in pool:
        for level in (1, 2, 3):
            y = harden(x, fuzz=level, keep_budget=False)        # with the budget kept, filler lines may be cut for longer words
            assert {n: harden(x, fuzz=level).memory_files[n] for n in _record_names(x)} == {n: x.memory_files[n] for n in _record_names(x)}
            assert y.task_prompt != x.task_prompt
            assert sum(a.question != b.question for a, b in zip(x.qa_pairs, y.qa_pairs)) >= len(x.qa_pairs) // 2
            assert (y.grounding_facts, y.distractors, y.memory_files, y.repo_files) == (x.grounding_facts, x.distractors, x.memory_files, x.repo_files)
            assert [(q.linked_fact_ids, q.gold_answer) for q in y.qa_pairs] == [(q.linked_fact_ids, q.gold_answer) for q in x.qa_pairs]
        funcs = {x.base_instance.split('__')[1].split('.')[0]}
        assert not any(f in q.question for q in harden(x, fuzz=3).qa_pairs for f in funcs)


def test_gold_answers_still_score_full(pool):
    for x in pool:
        y = harden(x, **DIAL_PRESETS['hard'])
        r = score_instance(y, {q.qa_id: q.gold_answer for q in y.qa_pairs}, offline_fact_judge, offline_noise_judge)
        assert r['qa_accuracy'] == 1.0, r


def test_composable_in_any_order(pool):
    K = dict(fuzz=3, distractors=2.5, indirection=2, fragment=2)
    for x in pool[::3]:
        one = harden(x, **K)
        for perm in itertools.permutations(K):
            y = x
            for k in perm: y = harden(y, **{k: K[k]})
            assert y == one, perm


def test_deterministic_under_the_seed(pool):
    for x in pool[:4]:
        assert harden(x, seed=3, **DIAL_PRESETS['medium']).to_json() == harden(x, seed=3, **DIAL_PRESETS['medium']).to_json()
        assert harden(x, seed=3, **DIAL_PRESETS['medium']) != harden(x, seed=4, **DIAL_PRESETS['medium'])
    assert [i.to_json() for i in dialled_codeqa(2, seed=1, difficulty={'preset': 'hard'})] == \
        [i.to_json() for i in dialled_codeqa(2, seed=1, difficulty={'preset': 'hard'})]


@pytest.mark.parametrize('budget', [10_000, 50_000])
def test_the_budget_is_kept(budget):
    for x in synth_codeqa(3, budget_tokens=budget, seed=4):
        y = harden(x, **DIAL_PRESETS['hard'])
        assert instance_tokens(y) <= budget and y.target_tokens == budget
        assert instance_tokens(y) >= instance_tokens(x) - 60          # cut at a line: at most one line under
        assert instance_tokens(harden(x, keep_budget=False, **DIAL_PRESETS['hard'])) > instance_tokens(x)
        _checks(y)


def test_bad_difficulty_is_named():
    with pytest.raises(ValueError, match=r"unknown difficulty knobs \['noise'\]"): dialled_codeqa(1, difficulty={'noise': 1})
    with pytest.raises(ValueError, match='preset must be one of'): dialled_codeqa(1, difficulty={'preset': 'brutal'})
    with pytest.raises(ValueError, match='fuzz must be'): dialled_codeqa(1, difficulty={'fuzz': 7})
    with pytest.raises(ValueError, match='not an instance of synth_codeqa'):
        harden(synth_codeqa(1)[0].model_copy(update=dict(base_instance='x')), fuzz=1)


def test_the_dataset_takes_the_dial():
    from memlab.protocols.memgym.protocol import memgym_codeqa_dataset
    base, hard = memgym_codeqa_dataset(n=2, seed=1), memgym_codeqa_dataset(n=2, seed=1, difficulty={'preset': 'hard'})
    assert [i.model_dump() for i in base] == [i.model_dump() for i in memgym_codeqa_dataset(n=2, seed=1, difficulty=None)]
    assert [q.question for i in base for q in i.queries] != [q.question for i in hard for q in i.queries]
    import pytest
    with pytest.raises(ValueError, match='preset must be one of'): memgym_codeqa_dataset(n=1, difficulty={'preset': 'extreme'})
