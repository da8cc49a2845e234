"""SubtleMemory judge (seed 003): the repository's prompts verbatim, the exact-match bypass, reply parsing, the vote
over repeated runs, the offline judge, and the released excerpt rendered for every query.

- the prompt constants equal `../shared/docs/protocol-prompts.md` §F, and one rendered prompt equals a string written
  out here (a changed character fails);
- an answer equal to a reference (whitespace and case aside) is decided with no model call, in every run;
- replies are read as the repository reads them by default (no usable label is WRONG; `unparsed` only where its code
  raises); memlab's strict rule (`reply_rule='strict'`) keeps an unclear reply `unparsed`, never scored;
- the vote over runs is the repository's by default (tie: run 0; unparsed: WRONG), memlab's under `MEMLAB_VOTE`.
"""
import re
from pathlib import Path
import pandas as pd
import pytest
from memlab.core import Query, Score
from memlab.judge import JUDGES, JUDGE_RUN, make_judge, judge_many, scores_frame, judge_summary
from memlab.protocols.subtle.data import load_subtlememory, SUBTYPE_COLUMNS
from memlab.protocols.subtle.judge import (
    JUDGE_SYSTEM_PROMPT, JUDGE_USER_PROMPT, RELATION_TYPE_GUIDANCE, RELATION_SUBTYPE_GUIDANCE, RELATION_SUBTYPE_ALIASES,
    SOURCE_GUIDANCE, NO_MODEL, judge_messages, judge_user_prompt, relation_guidance_block, source_guidance_block,
    persona_context_block, reference_verdict, normalize_reference, parse_judge_reply, SubtleLLMJudge, SubtleOfflineJudge,
    majority_vote, run_accuracy, MEMLAB_VOTE)

SHARED = Path(__file__).resolve().parents[2] / 'shared'
DOC = SHARED / 'docs' / 'protocol-prompts.md'
EXCERPT = SHARED / 'fixtures' / 'subtlememory'

CONTRA = dict(incorrect_answers=['Friday', 'Saturday'], facts=['My flight leaves on Friday.', 'My flight leaves on Saturday.'],
              case='Two departure days for one flight.', relation_type='contradictory', relation_subtype='contradictory',
              topic='Travel', source='user-related', persona_str='{"name": "Amina Diallo"}')
Q = Query(id='q', question='When does my flight to the conference leave?',
          answers=['Unclear, needs clarification: I said both Friday and Saturday'], qtype='contradictory', meta=CONTRA)


def recorder(*replies):
    "A `complete` that records every call (with the judge run it was made for) and returns the replies in turn."
    it = iter(replies)
    def complete(messages):
        complete.calls.append((JUDGE_RUN.get(), messages))
        return next(it)
    complete.calls = []
    return complete


# ---------------------------------------------------------------- prompts

@pytest.mark.skipif(not DOC.exists(), reason='../shared/docs/protocol-prompts.md is absent')
def test_prompt_constants_equal_the_doc():
    doc = DOC.read_text(encoding='utf-8')
    sec = doc[doc.index('## F. SubtleMemory'):]
    assert 'llm_judge.system_prompt:\n' + JUDGE_SYSTEM_PROMPT + '\n\nllm_judge.user_prompt:\n' + JUDGE_USER_PROMPT + '\n\n(Note:' in sec
    for name, table in (('RELATION_TYPE_GUIDANCE', RELATION_TYPE_GUIDANCE), ('RELATION_SUBTYPE_GUIDANCE', RELATION_SUBTYPE_GUIDANCE),
                        ('SOURCE_GUIDANCE', SOURCE_GUIDANCE)):
        block = sec[sec.index(name + ':\n'):].split('\n', 1)[1]
        lines = re.findall(r'^ (\S+): "(.*)"$', block[:block.index('\n\n') if name == 'SOURCE_GUIDANCE' else len(block)], re.M)
        want = dict(lines[:len(table)])
        assert want == table, name
    assert 'aliases: a_user_vs_user, b_user_vs_non_user, c_non_user_vs_non_user -> non_persona_contradiction' in sec
    assert RELATION_SUBTYPE_ALIASES == dict.fromkeys(('a_user_vs_user', 'b_user_vs_non_user', 'c_non_user_vs_non_user'), 'non_persona_contradiction')


def test_a_prompt_without_metadata_renders_exactly():
    q = Query(id='q', question='Which city does my sister live in?', answers=['Porto', '  '], meta={'incorrect_answers': []})
    want = '''Label the generated answer as CORRECT or WRONG.

Grading rules:
- Mark CORRECT if the generated answer matches the meaning of any accepted correct answer.
- Accept paraphrases, summaries, longer explanations, and equivalent wording.
- Mark WRONG if the generated answer clearly agrees with any known incorrect answer.
- Mark WRONG if the generated answer contradicts the accepted correct answers, misses the key point, or makes an unsupported over-confident choice.
- Use the case description, facts, and relation type as supporting context, not as a replacement for the accepted correct answers.
- If the case is contradictory or nuanced, prefer balanced grading and do not reward answers that collapse unresolved tension into an unjustified single conclusion.
- Ignore style or tone differences; strictly mark CORRECT if all required facts are present, even if it lists conditional differences to clarify the answer.

Question:
Which city does my sister live in?

Accepted correct answers:
- Porto

Known incorrect answers:
(no explicit incorrect references provided)

Generated answer:
 She lives in {city}. 

Facts:
(no facts provided)

Case description:
(none)

Relation type:
(none)

Relation subtype:
(none)

Topic:
(none)

Source:
(none)

Additional judging guidance:




Return JSON only with exactly two keys: label and reason.
The reason must be one brief sentence explaining the key grading decision.
{"reason": "short reason", "label": "CORRECT"}
or
{"reason": "short reason", "label": "WRONG"}'''
    system, user = judge_messages(q, ' She lives in {city}. ')
    assert user == dict(role='user', content=want)
    assert system == dict(role='system', content=JUDGE_SYSTEM_PROMPT) and '{{"reason"' in system['content']   # sent unformatted, as the repository


@pytest.mark.parametrize('alias', ['a_user_vs_user', 'b_user_vs_non_user', 'c_non_user_vs_non_user'])
def test_contradiction_aliases_use_the_non_persona_text(alias):
    b = relation_guidance_block({**CONTRA, 'relation_subtype': alias})
    assert b.split('\n')[2] == f"- Relation subtype guidance (non_persona_contradiction): {RELATION_SUBTYPE_GUIDANCE['non_persona_contradiction']}"
    assert f'Relation subtype:\n{alias}\n' in judge_user_prompt(Query(id='q', question='?', answers=['x'], meta={**CONTRA, 'relation_subtype': alias}), 'y')


def test_guidance_keys_and_empty_cases():
    assert all(f'({k})' in relation_guidance_block({'relation_type': 'nuanced', 'relation_subtype': k}) for k in ('K=1', 'K>1', 'any_one', 'Temporal', 'Context'))
    assert '(default): No additional relation-subtype' in relation_guidance_block({'relation_type': 'nuanced', 'relation_subtype': 'temporal'})
    assert '- Relation type guidance (default)' in relation_guidance_block({'relation_subtype': 'K=1'})
    assert relation_guidance_block({'relation_type': ' ', 'relation_subtype': None}) == '' == source_guidance_block({})
    assert source_guidance_block({'relation_type': 'nuanced'}) == f"Source guidance (default): {SOURCE_GUIDANCE['default']}"
    assert source_guidance_block({'source': 'user-unrelated'}) == f"Source guidance (user-unrelated): {SOURCE_GUIDANCE['user-unrelated']}"
    assert set(SUBTYPE_COLUMNS) <= set(RELATION_SUBTYPE_GUIDANCE) | set(RELATION_SUBTYPE_ALIASES)


def test_persona_block_only_for_user_related():
    assert persona_context_block(CONTRA) == ('Persona context:\n{"name": "Amina Diallo"}\n'
                                             'Use only this provided persona context; do not use or infer any external persona profile.')
    for meta in ({**CONTRA, 'source': 'user-unrelated'}, {**CONTRA, 'source': None}, {**CONTRA, 'persona_str': '  '}, {**CONTRA, 'persona_str': None}):
        assert persona_context_block(meta) == ''
        assert 'Persona context:' not in judge_user_prompt(Query(id='q', question='?', answers=['x'], meta=meta), 'y')


# ---------------------------------------------------------------- bypass and parsing

def test_exact_match_bypass_makes_no_model_call_in_any_run():
    c = recorder(*['{"reason": "r", "label": "CORRECT"}'] * 10)
    j = make_judge('subtlememory-llm', complete=c, model='fake')
    items = [('r1', Q, '  UNCLEAR, needs clarification:\tI said both friday and saturday'), ('r2', Q, 'saturday '), ('r3', Q, None)]
    scores = judge_many(j, items, n_runs=3)
    assert c.calls == []
    assert [(s.rollout_id, s.label, s.correct) for s in scores] == [('r1', 'CORRECT', True)] * 3 + [('r2', 'WRONG', False)] * 3 + [('r3', 'WRONG', False)] * 3
    assert all(s.raw.startswith(NO_MODEL) for s in scores[:6])
    s = j('r4', Q, 'Friday.', run=1)                       # the repository's normaliser keeps punctuation: the model decides
    assert (s.label, len(c.calls), c.calls[0][0]) == ('CORRECT', 1, 1) and not s.raw.startswith(NO_MODEL)
    assert c.calls[0][1] == judge_messages(Q, 'Friday.')


def test_normaliser_is_the_repository_one():
    assert normalize_reference('  Two\n words\tHere ') == 'two words here' and normalize_reference(None) == ''
    assert reference_verdict('', ['x'], ['']) is None and reference_verdict('x', [' X '], None) == ('CORRECT', reference_verdict('x', ['x'])[1])
    assert reference_verdict('“Friday”', ['Unclear'], ['Friday']) is None


REPLIES = {   # reply -> (the repository's conclusion: the default rule, memlab's strict rule)
    '{"reason": "same meaning", "label": "CORRECT"}': ('CORRECT', 'CORRECT'),
    'Verdict follows.\n{"reason": "picks one side", "label": "wrong"}': ('WRONG', 'WRONG'),
    '```json\n{"label": "WRONG", "reason": "x"}\n```': ('WRONG', 'WRONG'),
    '{&#34;label&#34;: &#34;CORRECT&#34;}': ('WRONG', 'CORRECT'),
    'CORRECT': ('WRONG', 'unparsed'), '': ('WRONG', 'unparsed'), '{"reason": "no label"}': ('WRONG', 'unparsed'),
    '{"label": "PARTIAL"}': ('WRONG', 'unparsed'), '{"label": "CORRECT"}\nor\n{"label": "WRONG"}': ('CORRECT', 'unparsed'),
    '{"label": CORRECT}': ('WRONG', 'unparsed'), '["CORRECT"]': ('unparsed', 'unparsed'), '{"label": true}': ('unparsed', 'unparsed'),
}

@pytest.mark.parametrize('reply', list(REPLIES))
def test_reply_parsing(reply):
    official, strict = REPLIES[reply]
    assert (parse_judge_reply(reply)[0], parse_judge_reply(reply, 'strict')[0]) == (official, strict)
    for rule, want in (('official', official), ('strict', strict)):
        s = SubtleLLMJudge(lambda m: reply, model='fake', reply_rule=rule)('r', Q, 'It depends.')
        assert (s.label, s.correct) == (want, {'CORRECT': True, 'WRONG': False}.get(want)) and s.raw.startswith(reply)
        assert s.raw == reply or (rule == 'official' and want == 'unparsed' and 'the repository raises AttributeError' in s.raw)


def test_failed_call_is_error_and_unparsed_is_never_scored():
    def boom(m): raise TimeoutError('judge down')
    assert SubtleLLMJudge(boom)('r', Q, 'x').label == 'error'
    for rule, want in (('strict', (2, 0.5)), ('official', (0, 0.25))):    # 'no json': unparsed (memlab), WRONG (the repository)
        c = recorder('{"label": "CORRECT"}', 'no json', '{"label": "WRONG"}', 'no json')
        j = SubtleLLMJudge(c, model='fake', reply_rule=rule)
        t = judge_summary(scores_frame(j(f'r{i}', Q, 'It depends.') for i in range(4))).iloc[0]
        assert (t['n_unparsed'], t['accuracy']) == want


# ---------------------------------------------------------------- repeated runs

def _frame(rows):
    return scores_frame(Score(rollout_id=r, judge='subtlememory-llm', judge_model='m', prompt_hash='h', run=k, label=l,
                              correct={'CORRECT': True, 'WRONG': False}.get(l), raw='') for r, k, l in rows)

RUNS = _frame([('a', 0, 'WRONG'), ('a', 1, 'CORRECT'), ('a', 2, 'CORRECT'),
               ('b', 0, 'CORRECT'), ('b', 1, 'WRONG'),                      # two runs: a tie
               ('c', 0, 'unparsed'), ('c', 1, 'unparsed'), ('c', 2, 'error'),
               ('d', 0, 'WRONG'), ('d', 1, 'unparsed'), ('d', 2, 'CORRECT')])
COLS = ['label', 'correct', 'n_runs', 'n_judged', 'n_correct', 'n_unparsed', 'n_error']

def test_majority_vote():
    mv = majority_vote(RUNS).set_index('rollout_id')                      # the repository's rule: run 0 breaks a tie, unparsed is WRONG
    assert mv[COLS].values.tolist() == [
        ['CORRECT', True, 3, 3, 2, 0, 0], ['CORRECT', True, 2, 2, 1, 0, 0], ['WRONG', False, 3, 2, 0, 2, 1], ['WRONG', False, 3, 3, 1, 1, 0]]
    mine = majority_vote(RUNS, **MEMLAB_VOTE).set_index('rollout_id')     # memlab's: a tie is WRONG, unparsed is no vote
    assert mine[COLS].values.tolist() == [
        ['CORRECT', True, 3, 3, 2, 0, 0], ['WRONG', False, 2, 2, 1, 0, 0], ['unparsed', None, 3, 0, 0, 2, 1], ['WRONG', False, 3, 2, 1, 1, 0]]
    assert MEMLAB_VOTE == dict(tie='WRONG', unparsed_as_wrong=False)
    with pytest.raises(ValueError, match='tie must be'): majority_vote(RUNS, tie='coin')


def test_run_accuracy():
    r = run_accuracy(RUNS).iloc[0]
    # unparsed counted WRONG (the repository): run 0: a W, b C, c W, d W -> 1/4; run 1: a C, b W, c W, d W -> 1/4; run 2: a C, d C (c: error) -> 1
    assert r['run_accuracies'] == (0.25, 0.25, 1.0) and r['n_runs'] == 3 and r['n_rollouts'] == 4
    assert r['accuracy_mean'] == pytest.approx(0.5) and r['accuracy_std'] == pytest.approx(pd.Series([0.25, 0.25, 1.0]).std(ddof=0))
    assert run_accuracy(RUNS, unparsed_as_wrong=False).iloc[0]['run_accuracies'] == (round(1 / 3, 6), 0.5, 1.0)   # unparsed left out
    one = run_accuracy(RUNS[RUNS['run'] == 0]).iloc[0]
    assert (one['n_runs'], one['accuracy_std']) == (1, 0.0)
    by = run_accuracy(RUNS.assign(rel=RUNS['rollout_id'].map({'a': 'nuanced', 'b': 'nuanced'}).fillna('contradictory')), by=['rel'])
    assert by.set_index('rel').loc['nuanced', 'run_accuracies'] == (0.5, 0.5, 1.0)


# ---------------------------------------------------------------- offline judge

@pytest.mark.parametrize('answer, want', [
    ('Friday', 'WRONG'), ('I think it is Friday.', 'WRONG'),
    ('Unclear — needs clarification first. The context says both Friday and Saturday.', 'CORRECT'),
    ('', 'WRONG'), ("I don't know", 'WRONG'), (None, 'WRONG')])
def test_offline_judge_contradictory(answer, want):
    s = make_judge('subtlememory-offline')('r', Q, answer)
    assert s.label == want and s.judge_model == 'offline'


def test_offline_judge_temporal_and_registry():
    t = Query(id='t', question='Which watch do I use now?', answers=['Polar'], meta=dict(incorrect_answers=['Garmin'], relation_subtype='Temporal'))
    j = SubtleOfflineJudge()
    assert [j('r', t, a).label for a in ('Now a Polar watch.', 'My Garmin watch.', 'Polar and Garmin', 'A watch.')] == ['CORRECT', 'WRONG', 'WRONG', 'WRONG']
    assert j('r', t, 'POLAR').raw.endswith(NO_MODEL + ': Generated answer exactly matches an accepted correct reference.')
    assert 'offline' in j.label and {'subtlememory-llm', 'subtlememory-offline'} <= set(JUDGES)
    assert j.prompt_hash != SubtleLLMJudge(lambda m: '').prompt_hash


# ---------------------------------------------------------------- the released excerpt

@pytest.mark.skipif(not EXCERPT.exists(), reason='../shared/fixtures/subtlememory is absent')
def test_every_excerpt_query_renders_with_persona_exactly_for_user_related():
    qs = [q for p in load_subtlememory(EXCERPT) for q in p.queries]
    assert qs and {q.meta['source'] for q in qs} == {'user-related', 'user-unrelated'}
    for q in qs:
        system, user = judge_messages(q, 'I am not sure.')
        assert system['content'] == JUDGE_SYSTEM_PROMPT and user['content'].startswith('Label the generated answer as CORRECT or WRONG.')
        assert ('\nPersona context:\n' in user['content']) == (q.meta['source'] == 'user-related'), q.id
        assert q.question in user['content'] and all(f'- {a.strip()}' in user['content'] for a in q.answers + q.meta['incorrect_answers'])
        assert f"Source guidance ({q.meta['source']}):" in user['content'] and 'Relation semantics guidance:' in user['content']
