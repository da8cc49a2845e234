"Tests of memlab.protocols.memgym.codeqa: MemGym-CodeQA schemas, generator, prompts, evicted inputs, scoring, reasoner and verifier."
import json
from pathlib import Path

import pytest

from memlab.core import OFFLINE_LABEL, RecordError, count_tokens
from memlab.protocols.memgym.codeqa import (
    BUDGETS, PAPER_SOURCES, CodingQAInstance, DistractorFact, GroundingFact, QAPair, validate_codeqa, keep_rule,
    critical_memory_only, synth_codeqa, instance_tokens, without_distractors, format_repo_files, format_memory_files,
    CODING_QA_ANSWER_PROMPT, FACT_JUDGE_PROMPT, NOISE_JUDGE_PROMPT, EVICTED_ANSWER_QA_PROMPT, EVICTED_ANSWER_QA_PROMPT_MEMORY_ONLY,
    answer_prompt, fact_judge_prompt, noise_judge_prompt, parse_answer_reply, parse_fact_reply, parse_noise_reply,
    document_groups, clip_notes, evicted_prompt, carries, offline_fact_judge, offline_noise_judge, score_pair, score_instance,
    OfflineCodeQAReasoner, INSUFFICIENT, verify_pair, verify_all, table10, VERDICTS)

PROMPTS_DOC = Path(__file__).resolve().parents[2] / 'shared' / 'docs' / 'protocol-prompts.md'


@pytest.fixture(scope='module')
def pool():
    return synth_codeqa(12, seed=7)


def _fact(i, disc=False, rel='critical'):
    return dict(id=f'F{i}', content=f'fact {i}', category='debug_finding', discoverable=disc, relevance=rel)


GOOD = dict(instance_id='coding_qa__x', base_instance='x', task_prompt='t', memory_files={'a.md': 'fact 1. fact 2.'},
            grounding_facts=[_fact(1), _fact(2), _fact(3, True, 'helpful')], num_critical_facts=2, num_external_facts=2,
            qa_pairs=[dict(qa_id='Q1', question='q', gold_answer='fact 1', linked_fact_ids=['F1'], requires_memory=True)],
            distractors=[dict(id='D1', content='d', source='same_repo')])


# --- schemas --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('change,field', [
    (dict(task_prompt=7), 'task_prompt'),
    (dict(surprise=1), 'surprise'),
    (dict(memory_files=['a.md']), 'memory_files'),
    (dict(grounding_facts=[{**_fact(1), 'category': 'gossip'}]), 'grounding_facts.0.category'),
    (dict(grounding_facts=[{**_fact(1), 'relevance': 'vital'}]), 'grounding_facts.0.relevance'),
    (dict(grounding_facts=[{**_fact(1), 'discoverable': 'no'}]), 'grounding_facts.0.discoverable'),
    (dict(grounding_facts=[{k: v for k, v in _fact(1).items() if k != 'content'}]), 'grounding_facts.0.content'),
    (dict(distractors=[dict(id='D1', content='d', source='rumour')]), 'distractors.0.source'),
    (dict(qa_pairs=[dict(qa_id='Q1', question='q', gold_answer='a', difficulty='extreme')]), 'qa_pairs.0.difficulty'),
    (dict(qa_pairs=[dict(qa_id='Q1', question='q', gold_answer='a', linked_fact_ids=['F9'])]), 'qa_pairs.0.linked_fact_ids'),
    (dict(qa_pairs=[dict(qa_id='Q1', question='q', gold_answer='a', linked_fact_ids=['F1'], requires_memory=False)]), 'qa_pairs.0.requires_memory'),
    (dict(qa_pairs=[dict(qa_id='Q1', question='q', gold_answer='a', linked_fact_ids=['F1', 'F2'], requires_memory=True)]), 'qa_pairs.0.num_linked_facts'),
    (dict(distractors=[dict(id='D1', content='d', source='adversarial', target_qa_id='Q5')]), 'distractors.0.target_qa_id'),
    (dict(num_critical_facts=5), 'num_critical_facts'),
    (dict(num_external_facts=0), 'num_external_facts'),
    (dict(grounding_facts=[_fact(1), _fact(1)], num_critical_facts=2, num_external_facts=2), 'grounding_facts.1')])
def test_malformed_instance_is_refused_naming_the_field(change, field):
    with pytest.raises(RecordError, match=f"field '{field}"): validate_codeqa({**GOOD, **change})


def test_validate_accepts_dict_json_and_record():
    inst = validate_codeqa(GOOD)
    assert validate_codeqa(inst) == inst == validate_codeqa(inst.to_json()) == validate_codeqa(json.dumps(GOOD))
    with pytest.raises(RecordError, match='not JSON'): validate_codeqa('{oops')
    assert keep_rule(inst) and len(critical_memory_only(inst)) == 2
    assert not keep_rule(validate_codeqa({**GOOD, 'grounding_facts': [_fact(1), _fact(2, True), _fact(3, True, 'helpful')],
                                          'num_external_facts': 1}))


# --- generator ------------------------------------------------------------------------------------------------------

def test_generated_instances_validate_and_round_trip(pool):
    for inst in pool:
        assert validate_codeqa(inst.to_json()) == inst == CodingQAInstance.from_json(inst.to_json())
        assert CodingQAInstance.model_validate(json.loads(json.dumps(inst.model_dump()))) == inst


def test_seeded_and_independent_of_n(pool):
    again = synth_codeqa(12, seed=7)
    assert [i.to_json() for i in again] == [i.to_json() for i in pool]
    assert synth_codeqa(3, seed=7)[2] == pool[2]
    assert synth_codeqa(1, seed=8)[0].instance_id != pool[0].instance_id


def test_at_least_two_critical_memory_only_facts(pool):
    for inst in pool:
        assert len(critical_memory_only(inst)) >= 2 and keep_rule(inst)
        assert inst.num_external_facts == sum(not f.discoverable for f in inst.grounding_facts)


def test_discoverable_labels_match_the_repository_and_facts_are_in_the_documents(pool):
    for inst in pool:
        repo = format_repo_files(inst.repo_files) + '\n' + inst.repo_context
        docs = format_memory_files(inst.memory_files)
        for f in inst.grounding_facts:
            assert carries(f.content, repo) == f.discoverable, (inst.instance_id, f.id)
            assert carries(f.content, docs), (inst.instance_id, f.id)
        assert any(f.discoverable for f in inst.grounding_facts) and any(not f.discoverable for f in inst.grounding_facts)


@pytest.mark.parametrize('budget', BUDGETS)
def test_budgets_within_ten_percent(budget):
    (inst,) = synth_codeqa(1, budget_tokens=budget, seed=11)
    assert abs(instance_tokens(inst) - budget) <= 0.1 * budget and inst.target_tokens == budget
    (small,) = synth_codeqa(1, budget_tokens=10_000, seed=11)
    assert (inst.grounding_facts, inst.qa_pairs, inst.distractors, inst.patch) == (small.grounding_facts, small.qa_pairs, small.distractors, small.patch)


def test_budget_too_small_is_an_error():
    with pytest.raises(ValueError, match='more than 110% of budget_tokens'): synth_codeqa(1, budget_tokens=500)


def test_four_distractor_sources_each_verbatim_in_the_documents(pool):
    for inst in pool:
        assert set(PAPER_SOURCES) <= {d.source for d in inst.distractors}
        docs = format_memory_files(inst.memory_files)
        assert all(d.content in docs for d in inst.distractors)
        clean = format_memory_files(without_distractors(inst))
        assert not any(d.content in clean for d in inst.distractors)
        qids = {q.qa_id for q in inst.qa_pairs}
        assert all(d.target_qa_id is None or d.target_qa_id in qids for d in inst.distractors)


def test_memory_files_are_natural_documents_and_the_patch_fixes_the_bug(pool):
    for inst in pool:
        names = list(inst.memory_files)
        assert names[0].startswith('incident_report_') and names[1].startswith('debug_notes_') and names[2].startswith('review_comments_')
        assert inst.patch.startswith('diff --git a/') and '\n-' in inst.patch and '\n+' in inst.patch
        assert all(p in inst.repo_files for p in inst.referenced_files)
        for q in inst.qa_pairs:
            assert q.num_linked_facts == len(q.linked_fact_ids) and q.signal_tokens > 0


# --- prompts --------------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not PROMPTS_DOC.exists(), reason='protocol-prompts.md not beside the repository (../shared)')
def test_prompts_verbatim():
    text = PROMPTS_DOC.read_text()
    block = text[text.index("CODING_QA_ANSWER_PROMPT = '''"):text.index('(EVICTED_ANSWER_QA_PROMPT is the same')]
    ns = {}
    exec(block, ns)
    ours = dict(CODING_QA_ANSWER_PROMPT=CODING_QA_ANSWER_PROMPT, FACT_JUDGE_PROMPT=FACT_JUDGE_PROMPT, NOISE_JUDGE_PROMPT=NOISE_JUDGE_PROMPT,
                EVICTED_ANSWER_QA_PROMPT_MEMORY_ONLY=EVICTED_ANSWER_QA_PROMPT_MEMORY_ONLY)
    for k, v in ours.items(): assert ns[k] == v, k
    note = text[text.index('(EVICTED_ANSWER_QA_PROMPT is the same'):].split('\n')[0]
    assert 'your notes, repository source files, and the repository context' in note
    assert 'your notes, repository source files, and the repository context' in EVICTED_ANSWER_QA_PROMPT
    assert '## Repository Source Files\n{repo_files_text}\n\n## Repository Context\n{repo_context}' in EVICTED_ANSWER_QA_PROMPT


def test_evicted_prompt_differs_from_the_memory_only_one_as_described():
    derived = (EVICTED_ANSWER_QA_PROMPT_MEMORY_ONLY
               .replace('your notes and the repository structure.\n\n## Bug', 'your notes, repository source files, and the repository context.\n\n## Bug')
               .replace('## Repository Structure\n', '## Repository Source Files\n{repo_files_text}\n\n## Repository Context\n')
               .replace("Answer using your notes and the repository structure. If your notes don't\ncontain enough information, say \"insufficient information.\"",
                        "Answer using your notes, the repository source files, and the repository\ncontext. If your notes don't contain enough information, say \"insufficient\ninformation.\""))
    assert derived == EVICTED_ANSWER_QA_PROMPT


def test_builders_fill_every_slot(pool):
    inst = pool[0]
    qa = inst.qa_pairs[0]
    for p in (answer_prompt(inst, qa), evicted_prompt(inst, qa, 'n'), evicted_prompt(inst, qa, 'n', memory_only=False),
              fact_judge_prompt(inst.grounding_facts[0], 'a', qa.question), noise_judge_prompt(inst.distractors[0], 'a', qa.question)):
        assert '{' + 'question}' not in p and qa.question in p
    p = fact_judge_prompt(inst.grounding_facts[0], 'x' * 4000, 'q')
    assert 'x' * 3000 in p and 'x' * 3001 not in p


def test_parsers_return_none_when_unparsed():
    assert parse_answer_reply('{"answer": "a", "confidence": 0.5, "sources_used": ["f.md"]}') == dict(answer='a', confidence=0.5, sources_used=['f.md'])
    assert parse_answer_reply('```json\n{"answer": "a"}\n```')['answer'] == 'a'
    for bad in (None, '', 'plain text', '{"answer": null}', '{"answer": "a"} then {"answer": "b"}'): assert parse_answer_reply(bad) is None
    assert parse_fact_reply('{"contains_fact": false, "confidence": 1, "explanation": ""}') is False
    assert parse_fact_reply('{"contains_fact": "no"}') is None and parse_fact_reply('no') is None
    assert parse_noise_reply('I think {"misled": true}') is True and parse_noise_reply('{"misled": 1}') is None


# --- evicted protocol -----------------------------------------------------------------------------------------------

def test_grouping_rule(pool):
    inst = pool[0]
    for files in ({'a.md': 'a' * 20_000, 'b.md': 'b' * 100, 'c.md': 'c' * 14_000, 'd.md': 'd' * 14_000, 'e.md': 'e' * 10},
                  {f'f{k}.md': 'x' * 3000 for k in range(40)}, {'one.md': 'y' * 50_000}):
        groups = document_groups(inst.model_copy(update=dict(memory_files=files)))
        assert 1 <= len(groups) <= 3 and all(len(t) <= 15_000 for _, t in groups)
    groups = document_groups(inst.model_copy(update=dict(memory_files={'one.md': 'y' * 50_000, 'two.md': 'z' * 10})))
    assert groups[0][1] == '=== one.md ===\n' + 'y' * (15_000 - 15)       # a long file is cut, its tail never read
    assert groups[1][1] == '=== two.md ===\n' + 'z' * 10
    for b in (10_000, 100_000):
        (x,) = synth_codeqa(1, budget_tokens=b, seed=7)
        gs = document_groups(x)
        assert len(gs) <= 3 and all(len(t) <= 15_000 for _, t in gs)
        assert all(f.content in '\n'.join(t for _, t in gs) for f in x.grounding_facts)


def test_note_clipping_at_500_tokens(pool):
    notes = ' '.join(f'note {k}: the value is {k * 7}.' for k in range(400))
    clipped = clip_notes(notes)
    assert count_tokens(clipped) == 500 and notes.startswith(clipped)
    assert clip_notes('a short note') == 'a short note' and clip_notes('') == '' and count_tokens(clip_notes(notes, 10)) == 10
    inst, qa = pool[0], pool[0].qa_pairs[0]
    p = evicted_prompt(inst, qa, notes)
    kept = p.split('## Your Notes from Previous Documents\n')[1].split('\n\n## Repository Structure\n')[0]
    assert kept == clipped
    assert '(no notes taken)' in evicted_prompt(inst, qa, None)


# --- scoring --------------------------------------------------------------------------------------------------------

def _hand():
    facts = [GroundingFact(id=f'F{k}', content=f'fact {k}', category='constraint', discoverable=False, relevance='critical') for k in (1, 2, 3)]
    qas = [QAPair(qa_id=f'Q{k}', question=f'q{k}', gold_answer='', linked_fact_ids=['F1', 'F2', 'F3'], requires_memory=True, num_linked_facts=3) for k in (1, 2, 3)]
    ds = [DistractorFact(id=f'D{k}', content=f'wrong {k}', source='same_function') for k in range(1, 5)]
    return CodingQAInstance(instance_id='hand', base_instance='hand', task_prompt='t', grounding_facts=facts, qa_pairs=qas, distractors=ds,
                            num_critical_facts=3, num_external_facts=3)


def test_scoring_by_hand():
    inst = _hand()
    found = {'Q1': {'F1', 'F2'}, 'Q2': {'F3'}, 'Q3': {'F1', 'F2', 'F3'}}           # 2/3, 1/3, 3/3
    fj = lambda f, a, q: f.id in found[q.upper()]
    nj = lambda d, a, q: d.id == 'D3'
    r = score_instance(inst, {'Q1': 'x', 'Q2': 'y', 'Q3': 'z'}, fj, nj)
    assert [round(p['score'], 3) for p in r['qa_scores']] == [0.667, 0.333, 1.0]
    assert r['qa_accuracy'] == pytest.approx(2 / 3)                                   # 0.667 >= 0.5 counts, 0.333 does not
    assert r['noise_rejection'] == pytest.approx(0.75) and r['misled'] == ['D3']       # 1 - 1/4
    half = score_pair(inst, QAPair(qa_id='Q9', question='q1', gold_answer='', linked_fact_ids=['F1', 'F3'], num_linked_facts=2, requires_memory=True),
                      'x', fj)
    assert half['score'] == 0.5
    r = score_instance(inst, {'Q1': 'x', 'Q2': None, 'Q3': 'z'}, fj, lambda d, a, q: None)
    assert r['unscored_pairs'] == 1 and r['qa_accuracy'] == 1.0 and r['noise_rejection'] is None and r['unparsed_noise'] == 4
    with pytest.raises(ValueError, match='no answer for QA pairs'): score_instance(inst, {'Q1': 'x'}, fj, nj)


def test_offline_judges_separate_facts_from_near_misses(pool):
    assert offline_fact_judge.label == offline_noise_judge.label == OFFLINE_LABEL
    for inst in pool:
        fm = {f.id: f for f in inst.grounding_facts}
        for d in inst.distractors:
            assert offline_noise_judge(d, d.content, '') is True
            assert not any(offline_noise_judge(d, f.content, '') for f in inst.grounding_facts), (inst.instance_id, d.id)
            assert not any(offline_fact_judge(f, d.content, '') for f in inst.grounding_facts), (inst.instance_id, d.id)
        assert all(offline_fact_judge(f, f.content, '') for f in fm.values())
        assert offline_fact_judge(fm['F1'], INSUFFICIENT, '') is False and offline_fact_judge(fm['F1'], None, '') is None


# --- reasoner and verifier ------------------------------------------------------------------------------------------

def test_offline_reasoner_answers_with_the_documents_and_not_without(pool):
    reason = OfflineCodeQAReasoner()
    assert reason.label == OFFLINE_LABEL
    for inst in pool:
        fm = {f.id: f for f in inst.grounding_facts}
        for q in inst.qa_pairs:
            if not q.requires_memory: continue
            with_docs = parse_answer_reply(reason(answer_prompt(inst, q, without_distractors(inst))))
            no_docs = parse_answer_reply(reason(answer_prompt(inst, q, {})))
            assert score_pair(inst, q, with_docs['answer'], offline_fact_judge)['score'] >= 0.5, (inst.instance_id, q.qa_id)
            assert score_pair(inst, q, no_docs['answer'], offline_fact_judge)['score'] < 0.5, (inst.instance_id, q.qa_id)
            assert with_docs['sources_used'] and all(s in inst.memory_files or s in inst.repo_files for s in with_docs['sources_used'])
    off = QAPair(qa_id='Qx', question='What colour is the office kettle?', gold_answer='')
    assert json.loads(reason(answer_prompt(pool[0], off)))['answer'] == INSUFFICIENT
    p = answer_prompt(pool[0], pool[0].qa_pairs[0])
    assert reason(p) == OfflineCodeQAReasoner().reason(p)


def test_verifier_counts(pool):
    kept, counts = verify_all(pool, OfflineCodeQAReasoner())
    n = sum(len(x.qa_pairs) for x in pool)
    v = counts['verdicts']
    assert counts['pairs_checked'] == n == sum(v.values()) and set(v) == set(VERDICTS)
    for c in ('solvability', 'distractor_confusion', 'question_leakage'):
        assert counts['checks'][c]['passed'] + counts['checks'][c]['failed'] + counts['checks'][c]['unscored'] == n
    assert counts['checks']['solvability']['failed'] == v['broken']
    assert v['confusable'] + v['confusable_and_leaky'] <= counts['checks']['distractor_confusion']['failed']
    assert v['valid'] == counts['pairs_kept'] > 0 and counts['instances_kept'] == len(kept) > 0
    easy = [r for r in counts['results'] if not r['requires_memory']]
    assert easy and all(r['verdict'] == 'leaky' for r in easy)                  # docstring questions are answered from the repository
    for k in kept:
        assert all(q.requires_memory for q in k.qa_pairs) and validate_codeqa(k) == k
    t = table10(counts)
    assert t.index[0] == 'Valid (passes all three checks)' and 'Instance-level: kept' in t.index
    assert counts['reasoner'] == OFFLINE_LABEL


def test_verdicts_of_stub_reasoners(pool):
    inst = pool[0]
    qa = next(q for q in inst.qa_pairs if q.requires_memory)
    fm = {f.id: f for f in inst.grounding_facts}
    gold = ' '.join(fm[x].content for x in qa.linked_fact_ids)
    oracle = lambda p: json.dumps(dict(answer=gold if 'Developer Documents\n===' in p else INSUFFICIENT))
    assert verify_pair(inst, qa, oracle, offline_fact_judge, offline_noise_judge)['verdict'] == 'valid'
    always = lambda p: json.dumps(dict(answer=gold))
    assert verify_pair(inst, qa, always, offline_fact_judge, offline_noise_judge)['verdict'] == 'leaky'
    d = inst.distractors[-1]
    gullible = lambda p: json.dumps(dict(answer=gold + ' ' + d.content if 'Developer Documents\n===' in p else INSUFFICIENT))
    r = verify_pair(inst, qa, gullible, offline_fact_judge, offline_noise_judge)
    assert r['verdict'] == 'confusable' and d.id in r['distractor_misled']
    assert verify_pair(inst, qa, lambda p: json.dumps(dict(answer=INSUFFICIENT)), offline_fact_judge, offline_noise_judge)['verdict'] == 'broken'
    assert verify_pair(inst, qa, lambda p: 'not json', offline_fact_judge, offline_noise_judge)['verdict'] == 'unscored'
