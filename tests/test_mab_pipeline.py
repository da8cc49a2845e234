"""End to end over the three MemoryAgentBench modules: generate (`memlab.protocols.mab.synth`) -> write -> load (`memlab.protocols.mab.data`)
-> score (`memlab.protocols.mab.metrics`), for every synthetic family, with the metric the one table (`memlab.protocols.mab.data.SOURCE_FAMILIES`)
names for the loaded source.

A perfect prediction is the gold answer written as a model would write it for the family's metric; it must score 1
(x100 = 100), and a wrong prediction must score below 1. `memlab.protocols.mab.metrics` is imported lazily (the `mm` fixture):
importing it registers judges, and `tests/test_judge.py` asserts the registry of `memlab.judge` imported alone.
"""
import importlib, json, re

import pytest

from memlab.judge import make_judge
from memlab.protocols.mab.data import SOURCE_FAMILIES, family_of, load_memoryagentbench
from memlab.protocols.mab.synth import MAB_GENERATORS, generator_family, make_mab, recsys_entity2id, write_rows

FAMILIES = sorted(MAB_GENERATORS)


@pytest.fixture(scope='module')
def mm(): return importlib.import_module('memlab.protocols.mab.metrics')


def nq(name): return 1 if name == 'infbench_sum' else 3


@pytest.fixture(scope='module')
def loaded(tmp_path_factory):
    "name -> (row, loaded Instance, catalogue path or None): one 4K-token context per family, written and loaded back."
    out = {}
    for name in FAMILIES:
        (row,) = make_mab(name, n_contexts=1, questions_per_context=nq(name), context_tokens=4096, seed=0)
        d = tmp_path_factory.mktemp(re.sub(r'\W', '_', name))
        e2i = recsys_entity2id() if generator_family(name).metric == 'recsys_recall@5' else None
        p = write_rows([row], d / 'rows.json', entity2id=e2i)
        (inst,) = load_memoryagentbench(p, sha256=False)
        out[name] = (row, inst, d / 'entity2id.json' if e2i else None)
    return out


def test_every_family_metric_is_registered(mm):
    for f in SOURCE_FAMILIES:
        assert f.metric in (mm.JUDGES if f.offline else mm.METRICS), f
        if f.offline: assert f.offline in mm.JUDGES, f


@pytest.mark.parametrize('name', FAMILIES)
def test_loaded_golds_and_meta(name, loaded):
    row, inst, _ = loaded[name]
    md, fam = row['metadata'], family_of(row['metadata']['source'])
    assert fam == generator_family(name)                                  # the generated source maps to its family
    assert (inst.meta['source'], inst.meta['competency'], inst.meta['task']) == (md['source'], fam.competency, fam.name)
    assert inst.meta['chunk_size'] == fam.chunk_size and inst.meta['known_source']
    assert [q.question for q in inst.queries] == row['questions']
    for i, (q, golds) in enumerate(zip(inst.queries, row['answers'])):
        assert q.answers == (list(dict.fromkeys(golds)) if fam.dedup_golds else golds)
        assert q.meta['qa_pair_id'] == md['qa_pair_ids'][i]
        if md['question_ids']:                                            # LongMemEval: what its judge reads
            assert (q.id, q.qtype, q.date) == (md['question_ids'][i], md['question_types'][i], md['question_dates'][i])
            assert q.abstention == q.id.endswith('_abs')
        else: assert q.id == md['qa_pair_ids'][i] and q.qtype == md['source']
        if md['previous_events']: assert q.meta['previous_event'] == md['previous_events'][i]
        if md['keypoints']: assert q.meta['keypoints'] == md['keypoints'] == inst.meta['keypoints']
        else: assert 'keypoints' not in q.meta


def _catalogue(mm, path): return mm.MovieCatalogue.load(path) if path else None


def _predictions(mm, fam, q, cat):
    "(perfect, wrong) outputs for a query, written as a model answers the family's task."
    g = q.answers[0]
    if fam.metric == 'niah_recall': return 'The special magic numbers are: ' + ', '.join(q.answers) + '.', 'I found none.'
    if fam.metric == 'recsys_recall@5':
        names = [cat.name_of(x) for x in q.answers]
        others = [n for n in cat.names if n not in names][:5]
        lst = lambda ns: 'Here are my picks:\n' + '\n'.join(f'{j}. {n} (1999)' for j, n in enumerate(ns, 1))
        return lst(names), lst(others)
    if fam.metric == 'ttl_label_accuracy': return f'Answer: {g}', 'Answer: 9999'
    if fam.metric == 'longmemeval':
        return g, ('Zanzibar, definitely.' if q.abstention else 'I do not know.')
    if fam.metric == 'summ-f1-llm': return g, 'Nothing much happens in this book.'
    if fam.metric == 'eventqa_accuracy': return f'Answer: (4) {g}', f'Answer: (2) Nothing happens.\n{g}'   # parsed line only
    assert fam.metric == 'mab_substring_exact_match', fam                  # SubEM: the gold inside a longer reply
    return f'From the context, the answer is {g}, I believe.', 'Answer: nothing relevant'


def _score(mm, fam, q, pred, cat):
    "The family's metric, looked up from the table by source; judged families use their offline stand-in."
    if fam.offline:
        s = make_judge(fam.offline).judge('r', q, pred)
        assert s.label in ('CORRECT', 'WRONG'), s.raw
        return s.score if fam.metric == 'summ-f1-llm' else float(s.correct)
    return mm.mab_metric(fam.prefix, catalogue=cat)(pred, q.answers)


@pytest.mark.parametrize('name', FAMILIES)
def test_gold_scores_100_wrong_scores_less(name, loaded, mm):
    row, inst, cat_path = loaded[name]
    fam, cat = family_of(inst.meta['source']), _catalogue(mm, cat_path)
    perfect, wrong = [], []
    for q in inst.queries:
        good, bad = _predictions(mm, fam, q, cat)
        perfect.append(_score(mm, fam, q, good, cat)); wrong.append(_score(mm, fam, q, bad, cat))
    assert perfect == pytest.approx([1.0] * len(perfect)), perfect
    assert mm.score_x100(perfect) == pytest.approx(100.0)
    assert all(w < 1.0 for w in wrong), wrong


def test_icl_official_strictness_after_loading(loaded, mm):
    "The official TTL metric is strict EM of the answer line: 'label: 12' scores 0 (the lenient diagnostic accepts it)."
    _, inst, _ = loaded['icl_banking77']
    q = inst.queries[0]; g = q.answers[0]
    assert mm.mab_metric(inst.meta['source'])(g, q.answers) == 1.0
    assert mm.mab_metric(inst.meta['source'])(f'label: {g}', q.answers) == 0.0
    assert mm.ttl_label_accuracy_lenient(f'label: {g}', q.answers) == 1.0


def test_llm_judges_get_what_they_read_from_the_loader(loaded, mm):
    "The LLM judges run on loaded queries: LongMemEval picks a template by qtype/_abs, the summary judge sees the keypoints."
    _, lme, _ = loaded['longmemeval_s*']
    def complete(messages):
        m = re.search(r'(?:Correct Answer|Rubric): (.*?)\n\nModel Response: (.*?)\n\nIs the model', messages[0]['content'], re.S)
        return 'yes' if m and m[2] in m[1].split(' | ') else 'no'
    judge = make_judge('longmemeval', complete=complete)
    assert [judge.judge('r', q, q.answers[0]).label for q in lme.queries] == ['CORRECT'] * len(lme.queries)
    assert [judge.judge('r', q, 'Nothing.').label for q in lme.queries] == ['WRONG'] * len(lme.queries)
    _, summ, _ = loaded['infbench_sum']
    q = summ.queries[0]
    fluency, recall, precision = mm.SummarizationJudge(complete=lambda m: '{}').prompts_for(q, q.answers[0])
    assert all(f'{i}. {kp}' in recall for i, kp in enumerate(q.meta['keypoints'], 1)) and q.answers[0] in precision


def test_niah_duplicate_needles_count_twice(tmp_path, mm):
    "A needle listed twice in a released NIAH-MQ row stays twice in query.answers, as the official ruler_recall counts it."
    row = {'context': 'One of the special magic numbers for calm-owl is: 1234567. '
                      'One of the special magic numbers for odd-fox is: 7654321. The sky is grey.',
           'questions': ['calm-owl, calm-owl, and odd-fox'], 'answers': [['1234567', '1234567', '7654321']],
           'metadata': {'source': 'ruler_niah_mq_448K'}}
    p = tmp_path / 'niah.json'; p.write_text(json.dumps([row]))
    (q,) = load_memoryagentbench(p, sha256=False)[0].queries
    assert q.answers == ['1234567', '1234567', '7654321']
    metric = mm.mab_metric('ruler_niah_mq_448K')
    assert metric('The numbers are 1234567.', q.answers) == pytest.approx(2 / 3)    # official: mean over the list
    assert metric('The numbers are 7654321.', q.answers) == pytest.approx(1 / 3)
