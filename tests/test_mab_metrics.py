"""Property tests of memlab.protocols.mab.metrics: ranges, perfect predictions, invariances, monotone recall, exact nearest names.

`memlab.protocols.mab.metrics` is imported lazily (the `mm` fixture), not at collection time: importing it registers two judges
in `memlab.judge.JUDGES`, and `tests/test_judge.py::test_judge_registry` asserts the exact registry of
`memlab.judge` imported alone. pytest collects every test module before running any test, so a top-level import
here would change the registry seen by that test.
"""
import importlib, json, math, random, string

import pytest
from hypothesis import assume, example, given, settings, strategies as st

from memlab.core import Query


@pytest.fixture(scope='module')
def mm():
    return importlib.import_module('memlab.protocols.mab.metrics')


ANSWER_TEXT = st.text(alphabet=string.ascii_letters + string.digits + ' ,.!?-\'', min_size=0, max_size=30)
OUTPUT_TEXT = st.text(alphabet=string.ascii_letters + string.digits + ' ,.!?:()\n-', max_size=80)
GOLDS = st.lists(ANSWER_TEXT, min_size=1, max_size=4)
NEEDLE = st.integers(10**6, 10**7 - 1).map(str)
WORD = st.text(alphabet=string.ascii_lowercase, min_size=3, max_size=8)
STRING_METRICS = ['mab_exact_match', 'mab_substring_exact_match', 'mab_token_f1', 'mab_rouge_l_f1', 'niah_recall',
                  'eventqa_accuracy', 'ttl_label_accuracy', 'ttl_label_accuracy_lenient', 'recsys_recall@5']
SETTINGS = settings(max_examples=120, deadline=None)


def _metric(mm, name): return mm.get_metric(name)


# ---------------------------------------------------------------- the METRICS contract

def test_every_registered_metric_keeps_the_contract(mm):
    "The same loop as tests/test_judge.py, now over memlab.judge's and this module's metrics together."
    assert set(STRING_METRICS) | {'summ_keypoint_f1_offline'} <= set(mm.METRICS)
    for name, f in mm.METRICS.items():
        v = f('Paris is in France', [['France'], 'Paris'])
        assert 0.0 <= v <= 1.0, name
        with pytest.raises(ValueError): f('x', [])


@SETTINGS
@given(pred=st.one_of(st.none(), OUTPUT_TEXT), golds=GOLDS)
def test_metrics_in_unit_interval(mm, pred, golds):
    for name in STRING_METRICS:
        v = _metric(mm, name)(pred, golds)
        assert 0.0 <= v <= 1.0, (name, v)


@SETTINGS
@given(pred=OUTPUT_TEXT, golds=st.lists(st.text(alphabet=string.ascii_letters + ' .', min_size=1, max_size=30), min_size=1, max_size=4))
def test_offline_summary_metric_in_unit_interval(mm, pred, golds):
    try: v = mm.summ_keypoint_f1_offline(pred, golds)
    except ValueError as e:
        assert 'content terms' in str(e)
        assert not any(mm.content_terms(g) for g in golds)
        return
    assert 0.0 <= v <= 1.0


# ---------------------------------------------------------------- perfect predictions

@SETTINGS
@given(gold=st.text(alphabet=string.ascii_letters + string.digits + ' ,.!?-\'', min_size=1, max_size=30), others=GOLDS)
def test_perfect_prediction_scores_one(mm, gold, others):
    assume(any(c.isalnum() for c in mm.normalize_mab(gold)))
    golds = others + [gold]
    for name in ('mab_exact_match', 'mab_substring_exact_match', 'mab_token_f1', 'mab_rouge_l_f1', 'eventqa_accuracy'):
        assert _metric(mm, name)(gold, golds) == pytest.approx(1.0), name
    assert mm.mab_exact_match(f'Answer: {gold}\nsome explanation follows', golds) == 1.0


@SETTINGS
@given(label=st.integers(0, 200), fmt=st.sampled_from(['{}', ' {} ', '{}.', 'Answer: {}', '{}\nbecause']))
def test_label_accuracy_official_formats(mm, label, fmt):
    out = fmt.format(label)
    assert mm.ttl_label_accuracy(out, [str(label)]) == 1.0
    assert mm.ttl_label_accuracy(f'label: {label}', [str(label)]) == 0.0        # official: strict EM
    assert mm.ttl_label_accuracy_lenient(f'Label: {label}', [str(label)]) == 1.0
    assert mm.ttl_label_accuracy_lenient(f'label: {label + 1}', [str(label)]) == 0.0


@SETTINGS
@given(needles=st.lists(NEEDLE, min_size=1, max_size=6), sep=st.sampled_from([' ', ', ', '\n', ' and ']))
def test_niah_all_needles_recalled(mm, needles, sep):
    assert mm.niah_recall('The numbers are ' + sep.join(needles) + '.', needles) == 1.0


# ---------------------------------------------------------------- invariances

@SETTINGS
@given(pred=OUTPUT_TEXT, golds=GOLDS, seed=st.integers(0, 10**6))
def test_gold_order_does_not_matter(mm, pred, golds, seed):
    shuffled = golds[:]; random.Random(seed).shuffle(shuffled)
    for name in STRING_METRICS:
        f = _metric(mm, name)
        assert f(pred, golds) == pytest.approx(f(pred, shuffled)), name


@SETTINGS
@given(pred=OUTPUT_TEXT, needles=st.lists(NEEDLE, min_size=1, max_size=6), extra=NEEDLE, where=st.booleans())
def test_niah_recall_monotone_in_the_prediction(mm, pred, needles, extra, where):
    more = f'{pred} {extra}' if where else f'{extra} {pred}'
    assert mm.niah_recall(more, needles) >= mm.niah_recall(pred, needles)
    assert mm.niah_recall(pred + ' ' + ' '.join(needles), needles) == 1.0


@SETTINGS
@given(needles=st.lists(NEEDLE, min_size=1, max_size=6, unique=True), k=st.integers(0, 6))
def test_niah_recall_is_the_found_fraction(mm, needles, k):
    k = min(k, len(needles))
    assert mm.niah_recall(' '.join(needles[:k]), needles) == pytest.approx(k / len(needles))


# ---------------------------------------------------------------- recommendation: exact nearest name

def brute_nearest(names, item):
    "argmin over (lowercased Levenshtein, name), by plain dynamic programming over every name."
    def lev(a, b):
        d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
        return d[len(a)][len(b)]
    return min((lev(item.lower(), n.lower()), n) for n in set(names))


NAME = st.text(alphabet=string.ascii_letters + ' é', min_size=1, max_size=10).map(lambda s: ' '.join(s.split())).filter(bool)


TIE_NAME = st.text(alphabet='abAB ', min_size=1, max_size=6).map(lambda s: ' '.join(s.split())).filter(bool)


@settings(max_examples=200, deadline=None)
@given(names=st.lists(NAME, min_size=1, max_size=25), item=st.text(alphabet=string.ascii_letters + ' é', max_size=12))
def test_nearest_name_is_the_exact_argmin(mm, names, item):
    cat = mm.MovieCatalogue(dict(enumerate(names)))
    name, d = cat.nearest(item)
    assert (d, name) == brute_nearest(names, item)


@settings(max_examples=300, deadline=None)
@given(names=st.lists(TIE_NAME, min_size=1, max_size=30), item=st.text(alphabet='abAB ', max_size=7))
@example(names=['ba', 'aaab'], item='ab')   # 'ba' (bound 0) is found first; 'aaab' (bound 2 = distance) wins the tie
def test_nearest_name_ties_go_alphabetically(mm, names, item):
    "Small alphabets give many equal distances: the tie-break must match the brute-force (distance, name) argmin."
    name, d = mm.MovieCatalogue(dict(enumerate(names))).nearest(item)
    assert (d, name) == brute_nearest(names, item)


@settings(max_examples=300, deadline=None)
@given(a=st.text(alphabet='ab ', max_size=10), b=st.text(alphabet='abé ', max_size=10), cutoff=st.integers(0, 6))
@example(a='a    aa', b='aaaaab  ', cutoff=5)   # distance 7; no row minimum exceeds 5, only the last cell does
def test_levenshtein_cutoff(mm, a, b, cutoff):
    full = mm.levenshtein(a, b)
    assert full == mm.levenshtein(b, a)
    assert mm.levenshtein(a, b, cutoff=cutoff) == min(full, cutoff + 1)


@SETTINGS
@given(words=st.lists(WORD, min_size=2, max_size=12, unique_by=str.lower), data=st.data())
def test_recsys_perfect_list_and_gold_order(mm, words, data):
    cat = mm.MovieCatalogue({i: w.capitalize() for i, w in enumerate(words)})
    gold_ids = data.draw(st.lists(st.integers(0, len(words) - 1), min_size=1, max_size=5, unique=True))
    gold_names = [cat.name_of(i) for i in gold_ids]
    year = data.draw(st.booleans())
    listed = [n + ' (1999)' for n in gold_names] if year else gold_names   # years are cleaned away before matching
    out = 'My picks:\n' + '\n'.join(f'{j + 1}. {n}' for j, n in enumerate(listed))
    golds = [str(i) for i in gold_ids]
    assert mm.recsys_recall_at_5(out, golds, catalogue=cat) == 1.0
    assert mm.recsys_recall_at_5(out, golds[::-1], catalogue=cat) == 1.0
    # pushing every gold past position 5 gives 0 when the five fillers are other catalogue names
    others = [n for n in cat.names if n not in gold_names]
    if len(others) >= 5:
        pushed = '1. ' + '\n'.join(others[:5]) + '\n' + '\n'.join(listed)
        assert mm.recsys_recall_at_5(pushed, golds, catalogue=cat) == 0.0


def test_recsys_bad_golds(mm):
    cat = mm.MovieCatalogue({0: 'Up', 1: 'Heat'})
    with pytest.raises(ValueError, match='not an entity id'): mm.recsys_recall_at_5('1. Up', ['Up'], catalogue=cat)
    with pytest.raises(ValueError, match='not in the catalogue'): mm.recsys_recall_at_5('1. Up', ['7'], catalogue=cat)
    with pytest.raises(ValueError, match='empty movie catalogue'): mm.MovieCatalogue({})


# ---------------------------------------------------------------- summarization

@SETTINGS
@given(words=st.lists(WORD, min_size=2, max_size=24, unique=True), n=st.integers(1, 6), seed=st.integers(0, 10**6))
def test_offline_summary_perfect_and_keypoint_order(mm, words, n, seed):
    words = [w for w in words if w not in mm._STOPWORDS]
    assume(len(words) >= 2)
    n = min(n, len(words))
    kps = [' '.join(words[i::n]).capitalize() + '.' for i in range(n)]
    assume(len({mm.content_terms(k) for k in kps}) == n and all(mm.content_terms(k) for k in kps))
    summary = ' '.join(kps)
    assert mm.summ_keypoint_f1_offline(summary, kps) == 1.0
    shuffled = kps[:]; random.Random(seed).shuffle(shuffled)
    other = ' '.join(shuffled[:max(1, n // 2)])
    assert mm.summ_keypoint_f1_offline(other, kps) == pytest.approx(mm.summ_keypoint_f1_offline(other, shuffled))
    assert mm.summ_keypoint_f1_offline('', kps) == 0.0


@SETTINGS
@given(n_kp=st.integers(0, 8), found=st.integers(0, 8), count=st.integers(0, 12), prec=st.integers(0, 12), flu=st.sampled_from([0, 1]))
def test_summarization_f1_range(mm, n_kp, found, count, prec, flu):
    found, prec = min(found, n_kp), min(prec, count)
    s = mm.summarization_f1(flu, found, n_kp, prec, count)
    assert 0.0 <= s['f1'] <= 1.0
    if flu == 0 or found == 0 or prec == 0: assert s['f1'] == 0.0
    if flu == 1 and n_kp and found == n_kp and count and prec == count: assert s['f1'] == 1.0


REPLY = st.one_of(st.text(max_size=40),
                  st.fixed_dictionaries({'fluency': st.one_of(st.integers(0, 1), st.text(max_size=3), st.none())}).map(json.dumps),
                  st.builds(lambda r: 'Reasoning. ' + json.dumps({'supported_key_points': [1], 'recall': r}), st.integers(0, 3)),
                  st.builds(lambda p, c: json.dumps({'precision': p, 'sentence_count': c}), st.integers(0, 5), st.integers(0, 5)))


@SETTINGS
@given(replies=st.lists(REPLY, min_size=3, max_size=3))
def test_llm_summary_judge_never_crashes(mm, replies):
    it = iter(replies)
    judge = mm.SummarizationJudge(complete=lambda messages: next(it))
    q = Query(id='s', question='Summarize.', answers=['Expert summary.'], meta={'keypoints': ['a b', 'c d', 'e f']})
    s = judge.judge('r', q, 'A summary.')
    assert s.label in ('CORRECT', 'WRONG', 'unparsed')
    assert (s.score is None) == (s.label == 'unparsed')
    # the official formula does not clip: a judge claiming more key points than exist can exceed 1
    if s.score is not None: assert s.score >= 0.0


# ---------------------------------------------------------------- the metric table and averages

def test_metric_table_names_are_registered(mm):
    "Every family of the one table (memlab.protocols.mab.data.SOURCE_FAMILIES) names a metric (or judge) this module registers."
    from memlab.protocols.mab.data import SOURCE_FAMILIES, family_of
    for f in SOURCE_FAMILIES:
        if f.offline: assert f.metric in mm.JUDGES and f.offline in mm.JUDGES, f
        else: assert f.metric in mm.METRICS and mm.mab_metric(f.prefix, catalogue=mm.MovieCatalogue({0: 'Up'})), f
    assert family_of('ruler_qa1_197K').metric == 'mab_substring_exact_match'
    assert family_of('recsys_redial_full').metric == 'recsys_recall@5'
    assert family_of('infbench_sum_eng_shots2').paper_metric == 'Model Based F1'
    assert not hasattr(mm, 'MAB_SOURCES') and not hasattr(mm, 'MAB_METRIC_OF')   # no second table


@SETTINGS
@given(values=st.lists(st.one_of(st.floats(0, 1), st.booleans(), st.none()), max_size=20))
def test_score_x100(mm, values):
    v = mm.score_x100(values)
    kept = [float(x) for x in values if x is not None]
    if not kept: assert math.isnan(v)
    else: assert 0.0 <= v <= 100.0 and v == pytest.approx(100 * sum(kept) / len(kept))
