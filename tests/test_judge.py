"Outside-in tests of memlab.judge: metrics, prompts verbatim, parsing, robustness, run aggregation."
import inspect, json, math, random, re, string
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from memlab.core import Query, Rollout, Score
from memlab.judge import (
    METRICS, JUDGES, OFFLINE_JUDGE_LABEL, A3_SYSTEM_PROMPT, A3_USER_TEMPLATE, LME_TEMPLATES, LME_ABSTENTION_TEMPLATE,
    LME_DEFAULT_TEMPLATE, LME_TEMPORAL_TEMPLATE, LME_KNOWLEDGE_UPDATE_TEMPLATE, LME_PREFERENCE_TEMPLATE,
    normalize_mab, normalize_locomo, exact_match, substring_exact_match, token_f1, locomo_f1, locomo_multihop_f1,
    locomo_score, rouge_l_f1, recall_all, all_recalled, get_metric, make_judge, Judge, OfflineJudge, LLMJudge,
    LongMemEvalJudge, parse_label_json, parse_yes_no, judge_many, scores_frame, aggregate_runs, judge_summary)

SHARED = Path(__file__).resolve().parents[2] / 'shared'
Q = Query(id='q1', question='What is my dog called?', answers=['Rex'], qtype='single-session-user')


def replying(*replies):
    "A `complete` callable that returns the replies in turn (raising those that are exceptions) and records messages."
    it = iter(replies)
    def complete(messages):
        complete.seen.append(messages)
        r = next(it)
        if isinstance(r, BaseException): raise r
        return r
    complete.seen = []
    return complete


def always(reply): return replying(*([reply] * 10_000))


# ---------------------------------------------------------------- normalizations and metrics

def test_normalizations_differ_on_and_and_commas():
    assert normalize_mab('Salt, and the Pepper!') == 'salt and pepper'
    assert normalize_locomo('Salt, and the Pepper!') == 'salt pepper'
    assert normalize_mab('an apple a day') == 'apple day'


def test_mab_metrics_hand_values():
    assert token_f1('the cat sat', 'cat sat down') == pytest.approx(0.8)
    assert token_f1('cat sat down', ['dog', 'the cat sat']) == pytest.approx(0.8)   # max over golds
    assert token_f1('no', 'no.') == 1.0 and token_f1('no', 'not at all') == 0.0
    assert token_f1('noanswer', 'noanswer given') == 0.0
    assert exact_match('  The  Answer. ', [['answer'], ['x']]) == 1.0
    assert exact_match('an answer here', 'answer') == 0.0
    assert substring_exact_match('an answer here', 'answer') == 1.0
    assert substring_exact_match(None, 'answer') == 0.0


def test_locomo_metrics_hand_values():
    assert locomo_f1('salt and pepper', 'salt pepper') == 1.0
    assert token_f1('salt and pepper', 'salt pepper') == pytest.approx(0.8)
    assert locomo_f1('She paints landscapes', 'painting landscape') == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    # multi-hop: gold parts Paris (0.0 best) and Rome (1.0) -> mean 0.5; split happens on raw commas
    assert locomo_multihop_f1('Rome', 'Paris, Rome') == pytest.approx(0.5)
    assert locomo_score('Rome', 'Paris, Rome', 1) == pytest.approx(0.5)
    assert locomo_score('Rome', 'Paris, Rome', 2) == pytest.approx(2 / 3)
    assert locomo_score('pottery', 'pottery; also painting', 3) == 1.0
    assert locomo_score('pottery', 'pottery; also painting', 4) < 1.0
    assert locomo_score('No information available.', 'whatever', 5) == 1.0
    assert locomo_score('Caroline realized self-care matters', 'x', 5) == 0.0
    with pytest.raises(ValueError, match='category'): locomo_score('a', 'a', 0)


def test_rouge_and_recall():
    assert rouge_l_f1('the cat sat on the mat', 'the cat lay on the mat') == pytest.approx(5 / 6)
    assert rouge_l_f1('running fast', 'runs fast') == 1.0  # use_stemmer=True
    pred = 'The numbers for worried-oval and breezy-mortal are 9545877 and 3554438.'
    assert recall_all(pred, ['3554438', '4077793', '9545877', '3258306']) == 0.5
    assert recall_all(pred.upper(), ['WORRIED-OVAL'.lower()]) == 1.0  # case-insensitive
    assert all_recalled(pred, ['3554438', '9545877']) == 1.0
    assert all_recalled(pred, ['3554438', '4077793']) == 0.0


def test_metric_registry_by_exact_name():
    assert set(METRICS) >= {'exact_match', 'substring_exact_match', 'token_f1', 'locomo_f1', 'locomo_multihop_f1',
                            'rouge_l_f1', 'recall_all', 'all_recalled'}
    assert get_metric('token_f1') is token_f1
    for bad in ('f1', 'TOKEN_F1', 'token_f1 '):
        with pytest.raises(KeyError, match='registered'): get_metric(bad)
    for name, f in METRICS.items():
        v = f('Paris is in France', [['France'], 'Paris'])
        assert 0.0 <= v <= 1.0, name
        with pytest.raises(ValueError): f('x', [])


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=string.ascii_letters + ' ,.!', max_size=40), st.text(alphabet=string.ascii_letters + ' ,.!', max_size=40))
def test_f1_properties(a, b):
    for f in (token_f1, locomo_f1):
        v = f(a, b)
        assert 0.0 <= v <= 1.0
        assert v == pytest.approx(f(b, a))
    if normalize_mab(a) and normalize_mab(a) not in ('yes', 'no', 'noanswer'):
        assert token_f1(a, a) == 1.0
    assert exact_match(a, b) <= substring_exact_match(a, b)


# ---------------------------------------------------------------- prompts verbatim

def test_a3_prompt_shape():
    assert 'Return only one JSON object:\n{"label": "CORRECT"} or {"label": "WRONG"}' in A3_USER_TEMPLATE
    for ph in ('{question}', '{gold_answer}', '{generated_answer}'): assert A3_USER_TEMPLATE.count(ph) == 1
    assert A3_SYSTEM_PROMPT.startswith('You are a careful grader.')


@pytest.mark.skipif(not (SHARED / 'seeds').exists(), reason='shared seed texts not present')
def test_a3_prompt_verbatim_in_seed():
    seed = (SHARED / 'seeds' / '000_4eb2ae0810784d20.txt').read_text(encoding='utf-8')
    assert 'System prompt.\n' + A3_SYSTEM_PROMPT + '\nUser prompt template.\n' + A3_USER_TEMPLATE + '\nAggregation.' in seed


@pytest.mark.skipif(not (SHARED / 'docs' / 'datasets.md').exists(), reason='shared docs not present')
def test_longmemeval_templates_verbatim():
    doc = (SHARED / 'docs' / 'datasets.md').read_text(encoding='utf-8')
    sec = doc[doc.index('### 1.3'):doc.index('### 1.4')]
    default, temporal, ku, pref, abst = [json.loads('"' + m + '"') for m in re.findall(r'`"(.*?)"`', sec)]
    assert LME_DEFAULT_TEMPLATE == default
    assert LME_TEMPORAL_TEMPLATE == temporal              # the whole template: it repeats the two "If ..." sentences
    assert LME_KNOWLEDGE_UPDATE_TEMPLATE == ku
    assert LME_PREFERENCE_TEMPLATE == pref
    assert LME_ABSTENTION_TEMPLATE == abst
    assert 'off-by-one' in LME_TEMPORAL_TEMPLATE


@pytest.mark.skipif(not (SHARED / 'docs' / 'datasets.md').exists(), reason='shared docs not present')
def test_memos_graders_verbatim():
    "MemOS's LoCoMo grader text character by character (datasets.md §5.1, which prints it without the source indentation MemOS sends: tests/test_official_memos.py checks the bytes), and the LongMemEval variant's two differences (§5.2)."
    import textwrap
    from memlab.judge import MEMOS_SYSTEM_PROMPT, MEMOS_LOCOMO_TEMPLATE, MEMOS_LME_TEMPLATE
    doc = (SHARED / 'docs' / 'datasets.md').read_text(encoding='utf-8')
    sec = doc[doc.index('### 5.1'):doc.index('### 5.2')]
    assert textwrap.dedent(MEMOS_LOCOMO_TEMPLATE).strip() == re.search(r'```\n(.*?)\n```', sec, re.S)[1]
    assert f'System message: `"{MEMOS_SYSTEM_PROMPT}"`' in sec
    lme = doc[doc.index('### 5.2'):doc.index('## 6.')]
    assert 'Question: Where did I buy my new tennis racket from?` / `Gold answer: the sports store downtown' in lme
    assert 'Question: Where did I buy my new tennis racket from?\n    Gold answer: the sports store downtown' in MEMOS_LME_TEMPLATE
    assert '{golden_answer}' in MEMOS_LME_TEMPLATE and '{gold_answer}' not in MEMOS_LME_TEMPLATE


# ---------------------------------------------------------------- judges

def test_judge_registry():
    "memlab.judge registers its three judges; other library modules may add theirs, tests never leave one behind."
    import memlab
    assert {'llm-a3', 'locomo', 'longmemeval', 'offline-match'} <= set(JUDGES)
    assert all(getattr(JUDGES[n], '__module__', '').startswith('memlab.') for n in JUDGES), sorted(JUDGES)
    assert isinstance(make_judge('offline-match'), OfflineJudge)
    assert isinstance(make_judge('llm-a3', complete=always('x')), LLMJudge)
    assert isinstance(make_judge('longmemeval', complete=always('x')), LongMemEvalJudge)
    with pytest.raises(KeyError, match=r"unknown judge 'gpt'.*llm-a3.*longmemeval.*offline-match"): make_judge('gpt')


def test_judge_needs_only_question_and_answer():
    for j in (make_judge('offline-match'), make_judge('llm-a3', complete=always('{"label": "WRONG"}')),
              make_judge('longmemeval', complete=always('no'))):
        assert list(inspect.signature(j.judge).parameters) == ['rollout_id', 'query', 'answer', 'run']
        assert isinstance(j, Judge)
    # secrets in evidence ids, meta and the id never reach the judge model
    q = Query(id='SECRET-ID', question='What is my dog called?', answers=['Rex'], evidence=['SECRET-EVIDENCE'],
              qtype='single-session-user', meta={'note': 'SECRET-META'})
    for name in ('llm-a3', 'longmemeval'):
        c = always('{"label": "CORRECT"} yes')
        s = make_judge(name, complete=c).judge('r1', q, 'Rex')
        assert s.correct is True and s.rollout_id == 'r1'
        text = json.dumps(c.seen)
        assert 'SECRET' not in text and 'What is my dog called?' in text and 'Rex' in text


def test_offline_judge_rules():
    j = make_judge('offline-match')
    assert j.model == 'offline' and j.label == OFFLINE_JUDGE_LABEL
    q = Query(id='q', question='How many?', answers=['1'])
    assert j.judge('r', q, 'There were 10.').label == 'WRONG'
    assert j.judge('r', q, 'Exactly 1.').label == 'CORRECT'
    s = j.judge('r', Q, 'It is Rex')
    assert OFFLINE_JUDGE_LABEL in s.raw and s.score == pytest.approx(token_f1('It is Rex', 'Rex'))
    s = j.judge('r', Q, None)
    assert (s.label, s.correct, s.raw) == ('WRONG', False, 'no answer')
    qa = Query(id='q_abs', question='Cat name?', answers=['No cat was mentioned.'], abstention=True)
    assert j.judge('r', qa, 'That was never mentioned.').label == 'CORRECT'
    assert j.judge('r', qa, 'Tom.').label == 'WRONG'
    qf = Query(id='qf', question='When did I sell my car?', answers=['bike'], meta={'false_premise': True})
    assert j.judge('r', qf, 'You never sold a car; you sold your bike.').label == 'CORRECT'
    assert j.judge('r', qf, 'You sold your bike.').label == 'WRONG'
    qf0 = Query(id='qf0', question='When did I sell my car?', meta={'false_premise': True})
    assert j.judge('r', qf0, 'You never had a car.').label == 'CORRECT'


def test_llm_judge_parsing_cases():
    cases = {'{"label": "CORRECT"}': 'CORRECT', '```json\n{"label": "WRONG"}\n```': 'WRONG',
             'Reasoning: same dog.\n{"label": "correct"}\nThanks': 'CORRECT', ' {  "label" :"Wrong" } ': 'WRONG',
             'CORRECT': 'unparsed', '{"label": "CORRECT"} {"label": "WRONG"}': 'unparsed', '': 'unparsed',
             '{"label": "partially"}': 'unparsed', '{"verdict": "CORRECT"}': 'unparsed'}
    for reply, want in cases.items():
        assert parse_label_json(reply) == want, reply
        s = make_judge('llm-a3', complete=always(reply)).judge('r', Q, 'Rex')
        assert s.label == want and s.correct is {'CORRECT': True, 'WRONG': False}.get(want) and s.raw == reply


def test_llm_judge_exception_is_error_and_run_continues():
    c = replying(ConnectionError('boom'), '{"label": "CORRECT"}')
    scores = judge_many(make_judge('llm-a3', complete=c), [('r1', Q, 'Rex'), ('r2', Q, 'Rex')])
    assert [(s.label, s.correct) for s in scores] == [('error', None), ('CORRECT', True)]
    assert 'boom' in scores[0].raw


_VALID_CORRECT = re.compile(r'\{\s*"label"\s*:\s*["\']correct["\']\s*\}', re.I)


def _garbage(rng):
    "A reply that is not one well-formed CORRECT verdict (a label object disagreeing with itself counts as garbage)."
    if rng.random() < 0.1:  # two label objects that disagree: must be unparsed, not the first one's label
        return '{"label": "CORRECT"} ' + rng.choice(['{"label": "WRONG"}', "{'label': 'wrong'}", '{"label":"maybe"}'])
    kinds = [
        lambda: ''.join(rng.choice(string.printable) for _ in range(rng.randint(0, 60))),
        lambda: ''.join(rng.choice('{}[]":\' ,labelCORRECTWRONGcorrect') for _ in range(rng.randint(0, 40))),
        lambda: rng.choice(['CORRECT', 'correct', 'Correct!', 'The answer is CORRECT.', 'label: CORRECT', 'yes']),
        lambda: '{"label": "CORRECT' + rng.choice(['', '!', 'ISH', ' maybe', '"']),
        lambda: json.dumps({rng.choice(['Label', 'labels', 'verdict', 'result']): 'CORRECT'}),
        lambda: json.dumps({'label': rng.choice([None, 1, True, ['CORRECT'], {'x': 'CORRECT'}])}),
        lambda: '{"label": "' + ''.join(rng.choice(string.ascii_letters) for _ in range(rng.randint(0, 9))) + '"}',
    ]
    while True:
        g = rng.choice(kinds)()
        if not _VALID_CORRECT.search(g): return g


def test_fuzz_garbage_never_correct():
    rng = random.Random(0)
    replies = [_garbage(rng) for _ in range(200)]
    scores = judge_many(make_judge('llm-a3', complete=replying(*replies)), [(f'r{i}', Q, 'Rex') for i in range(200)])
    assert not [s for s in scores if s.label == 'CORRECT' or s.correct]
    assert {s.label for s in scores} <= {'WRONG', 'unparsed'}
    # the LongMemEval parse: anything without 'yes' is never CORRECT (officially 'yes' anywhere counts)
    lme_replies = [g for g in replies if 'yes' not in g.lower()]
    sc = judge_many(make_judge('longmemeval', complete=replying(*lme_replies)), [(f'r{i}', Q, 'Rex') for i in range(len(lme_replies))])
    assert len(sc) > 150 and not [s for s in sc if s.label == 'CORRECT' or s.correct]


def test_longmemeval_judge():
    c = always('Yes')
    j = make_judge('longmemeval', complete=c)
    assert j.params == {'temperature': 0.0, 'max_tokens': 10} and j.model == 'gpt-4o-2024-08-06'
    for qtype, tmpl in LME_TEMPLATES.items():
        q = Query(id='x', question='Q?', answers=['A'], qtype=qtype)
        assert j.judge('r', q, 'resp').correct is True
        assert c.seen[-1] == [{'role': 'user', 'content': tmpl.format('Q?', 'A', 'resp')}]
    for q in (Query(id='x_abs', question='Q?', answers=['E'], qtype='multi-session'),
              Query(id='x', question='Q?', answers=['E'], qtype='multi-session', abstention=True)):
        j.judge('r', q, 'resp')
        assert c.seen[-1][0]['content'] == LME_ABSTENTION_TEMPLATE.format('Q?', 'E', 'resp')
    assert [parse_yes_no(r) for r in ('no.', 'YES', '', '  ', 'unsure', None)] == \
        ['WRONG', 'CORRECT', 'unparsed', 'unparsed', 'unparsed', 'unparsed']


def test_prompt_hashes_identify_prompts():
    a, b = make_judge('llm-a3', complete=always('')), make_judge('llm-a3', complete=always(''), model='gpt-4o')
    assert a.prompt_hash == b.prompt_hash and a.model != b.model
    assert len({a.prompt_hash, make_judge('longmemeval', complete=always('')).prompt_hash,
                make_judge('offline-match').prompt_hash}) == 3


# ---------------------------------------------------------------- aggregation

def test_n_runs_averaging():
    c = replying(*['{"label": "CORRECT"}', '{"label": "WRONG"}', '{"label": "CORRECT"}'] * 2)
    qb = Query(id='qb', question='B?', answers=['b'])
    scores = judge_many(make_judge('llm-a3', complete=c), [('a', Q, 'Rex'), ('b', qb, 'b')], n_runs=3)
    assert [(s.rollout_id, s.run) for s in scores] == [('a', 0), ('a', 1), ('a', 2), ('b', 0), ('b', 1), ('b', 2)]
    agg = aggregate_runs(scores_frame(scores)).set_index('rollout_id')
    assert agg.loc['a', 'correct'] == pytest.approx(2 / 3) and agg.loc['b', 'correct'] == pytest.approx(2 / 3)
    assert (agg['n_runs'] == 3).all() and (agg['n_judged'] == 3).all()
    summ = judge_summary(scores_frame(scores))
    # per run: run0 2/2, run1 0/2, run2 2/2 -> mean 2/3
    assert summ.loc[0, 'accuracy'] == pytest.approx(2 / 3) and summ.loc[0, 'n_runs'] == 3


def test_unparsed_and_errors_never_counted_correct():
    replies = ['{"label": "WRONG"}', 'garbage', RuntimeError('x'), 'garbage', RuntimeError('y'), '']
    scores = judge_many(make_judge('llm-a3', complete=replying(*replies)), [('a', Q, 'Rex'), ('b', Q, 'Rex')], n_runs=3)
    agg = aggregate_runs(scores_frame(scores)).set_index('rollout_id')
    assert agg.loc['a', 'correct'] == 0.0                      # one WRONG judged; garbage and error excluded
    assert (agg.loc['a', 'n_unparsed'], agg.loc['a', 'n_error'], agg.loc['a', 'n_judged']) == (1, 1, 1)
    assert math.isnan(agg.loc['b', 'correct'])                 # nothing judged: NaN, not 0 or 1
    assert (agg.loc['b', 'n_unparsed'], agg.loc['b', 'n_error']) == (2, 1)
    summ = judge_summary(scores_frame(scores))
    assert (summ.loc[0, 'n_unparsed'], summ.loc[0, 'n_error'], summ.loc[0, 'n_scores']) == (3, 2, 6)
    assert not (summ['accuracy'] > 0).any()


def test_judge_many_with_rollouts():
    base = dict(run_id='x', config_hash='h', section='s', dataset='d', instance_id='i', query_id='q1', policy='p',
                policy_label='offline', memory='m', memory_family='flat')
    ok, err = Rollout(rollout_id='ok', answer='Rex', **base), Rollout(rollout_id='bad', error='crash', **base)
    c = always('{"label": "CORRECT"}')
    scores = judge_many(make_judge('llm-a3', complete=c), [(ok, Q), (err, Q)], n_runs=2)
    assert [(s.rollout_id, s.label) for s in scores] == [('ok', 'CORRECT')] * 2 + [('bad', 'error')] * 2
    assert len(c.seen) == 2                                    # the errored rollout never reaches the judge
    assert all(isinstance(s, Score) for s in scores)
    with pytest.raises(ValueError, match='items'): judge_many(make_judge('offline-match'), [('only-id',)])
