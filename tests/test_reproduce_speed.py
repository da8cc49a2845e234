"""`make reproduce` in less time with the same numbers (issue 29, last item): repeated work done once, checked by counting
the work (never seconds) and by comparing outputs with what the slower path gives.

- The offline reader reads the same evidence units at every step, tier and memory that returns them: each distinct
  sentence's terms are computed once (`memlab.reader.sentence_terms`).
- `score` builds the judge's rollouts from trusted store rows without pydantic's per-row default lookups (pydantic 2.14
  inspects each default factory's signature in every `model_construct`), and reads the store's rollouts fewer times.
"""
import tempfile
from pathlib import Path

import pytest

import memlab.reader as reader
from memlab.core import Evidence, Rollout
from memlab.store import ResultsStore


def units():
    return [Evidence(text='user: I adopted a dog. His name is Rex.\nassistant: Nice! Rex is a good name.', session_id='a', rank=0,
                     date='2023/01/05'),
            Evidence(text='### Session 2:\nSession Date: 2023/02/01\nSession Content:\nuser: I adopted a dog. We walk daily.',
                     session_id='b', rank=1)]


def test_reader_analyses_each_sentence_once(monkeypatch):
    calls = []
    orig = reader.rterms
    monkeypatch.setattr(reader, 'rterms', lambda s: (calls.append(s), orig(s))[1])
    if hasattr(reader, 'sentence_terms'): reader.sentence_terms.cache_clear()
    first = reader.read_units(units())
    for _ in range(3): again = reader.read_units(units())       # read again at later steps and by other tiers
    distinct = {s.text for s in first}
    assert len(calls) == len(distinct) == 5                      # 'I adopted a dog.' is one sentence in two sessions
    assert [(s.text, s.role, s.date, s.order, s.terms) for s in again] == [(s.text, s.role, s.date, s.order, s.terms) for s in first]
    assert all(s.terms == frozenset(orig(s.text)) for s in first)


@pytest.fixture(scope='module')
def small_store():
    from memlab.synth import make_benchmark
    from memlab.config import RunConfig
    from memlab.runner import run
    tmp = Path(tempfile.mkdtemp())
    bench = make_benchmark(3, 6, 20, seed=0)
    cfg = RunConfig(name='speed', dataset={'kind': 'synthetic', 'params': {'n_instances': 3, 'queries_per_instance': 6, 'n_filler': 20}},
                    policies=[{'name': 'offline-reader', 'tier': 'strong'}],
                    memories=[{'name': 'bm25', 'k': 12}, {'name': 'long-context', 'window_tokens': 2000}])
    return run(cfg, bench, tmp / 'speed', progress=False), bench


def test_trusted_rollout_is_model_construct(small_store):
    from memlab.scoring import _trusted_rollout
    from memlab.store import _py
    st, _ = small_store
    cols = ['rollout_id', 'attempt', 'instance_id', 'query_id', 'answer', 'error']
    rows = list(st.rollouts(columns=cols)[cols].itertuples(index=False))
    assert len(rows) == 36
    for vals in rows:
        fast, slow = _trusted_rollout(cols, vals), Rollout.model_construct(**{k: _py(v) for k, v in zip(cols, vals)})
        assert fast.model_dump() == slow.model_dump()
        assert fast.model_fields_set == slow.model_fields_set
    a, b = _trusted_rollout(cols, rows[0]), _trusted_rollout(cols, rows[1])
    assert a.timings is not b.timings and a.trajectory is not b.trajectory   # fresh defaults, never shared between rollouts


def test_score_reads_less_and_skips_default_lookups(small_store, monkeypatch):
    from pydantic.fields import FieldInfo
    from memlab.scoring import score
    st, bench = small_store
    n = len(st.rollouts(columns=['rollout_id']))
    reads, lookups = [], []
    orig_ro, orig_gd = ResultsStore.rollouts, FieldInfo.get_default
    monkeypatch.setattr(ResultsStore, 'rollouts', lambda self, *a, **k: (reads.append(1), orig_ro(self, *a, **k))[1])
    monkeypatch.setattr(FieldInfo, 'get_default', lambda self, *a, **k: (lookups.append(1), orig_gd(self, *a, **k))[1])
    agg = score(st, bench)
    assert len(agg) == n == 36
    assert len(lookups) < n              # before: 13 defaults looked up per judged rollout (468 here)
    assert len(reads) <= 4               # before: 5 (each missing-run check read them twice)
    reads.clear()
    score(st, bench)                     # nothing left to judge: the check reads the rollouts once
    assert len(reads) == 2               # before: 3


def test_first_person_reads_each_sentence_once():
    import re
    def before(s, asked=frozenset()):             # first_person as it was: every pattern searched on every call
        other = [m for m in reader._MY_OTHER.finditer(s.text) if not set(reader.rterms(m[0])) & asked]
        return s.role == 'user' and bool(reader._FIRST.search(s.text) or (reader._MY.search(s.text) and not other))
    texts = ['I adopted a dog.', 'My coworker adopted a dog.', 'My time was 98 minutes.', 'My younger sister adopted a dog and I helped.',
             'Our neighbour adopted a cat.', 'We renamed the cat.', 'my sister and I went to Oslo.', 'The weather was nice.']
    asks = [frozenset(), frozenset(reader.rterms('my sister')), frozenset(reader.rterms('coworker dog'))]
    sents = [reader.Sentence(t, role, None, 0, frozenset(reader.rterms(t))) for t in texts for role in ('user', 'assistant')]
    assert [reader.first_person(s, a) for s in sents for a in asks] == [before(s, a) for s in sents for a in asks]
    reader._person_marks.cache_clear()                              # before: no such cache, every call searched every pattern
    for a in asks * 3: [reader.first_person(s, a) for s in sents]
    assert reader._person_marks.cache_info().misses == len(texts)   # each distinct sentence's patterns searched once


def _aggregate_before(scores_df):
    "aggregate_runs as it was: three Python lambdas per (judge, rollout) group."
    import pandas as pd
    from memlab.judge import _verdicts
    d, _ = _verdicts(scores_df)
    g = d.groupby(['judge', 'judge_model', 'prompt_hash', 'rollout_id'], sort=True)
    out = pd.DataFrame({'correct': g['o'].mean(), 'n_runs': g['run'].nunique(), 'n_judged': g['judged'].sum(),
                        'n_unparsed': g['label'].agg(lambda s: int((s == 'unparsed').sum())),
                        'n_error': g['label'].agg(lambda s: int((s == 'error').sum())),
                        'score': g['score'].agg(lambda s: pd.to_numeric(s, errors='coerce').mean()),
                        'correct_parsed_only': g['c'].mean()})
    return out.astype({'n_judged': int}).reset_index()


def test_aggregate_runs_vectorized_is_the_same():
    import numpy as np, pandas as pd
    from memlab.judge import aggregate_runs
    rng = np.random.default_rng(0)
    rows = []
    for j in ('llm-a3', 'longmemeval'):
        for r in range(300):
            for run in range(int(rng.integers(1, 12))):          # 1 to 11 runs: sums of up to 11 graded scores
                lab = rng.choice(['CORRECT', 'WRONG', 'unparsed', 'error'], p=[0.5, 0.3, 0.1, 0.1])
                sc = rng.choice([None, float(rng.random()), 'n/a', int(rng.integers(0, 5))], p=[0.2, 0.6, 0.1, 0.1])
                rows.append(dict(judge=j, judge_model='m', prompt_hash='h', rollout_id=f'r{r:03d}', run=run, label=lab,
                                 correct={'CORRECT': True, 'WRONG': False}.get(lab), score=sc))
    df = pd.DataFrame(rows)
    new, old = aggregate_runs(df), _aggregate_before(df)
    pd.testing.assert_frame_equal(new, old, check_exact=True)
    assert new['score'].isna().any() and new['n_unparsed'].gt(0).any() and new['n_runs'].max() == 11
    pd.testing.assert_frame_equal(aggregate_runs(df.iloc[:0]), _aggregate_before(df.iloc[:0]), check_dtype=False)


def test_aggregate_runs_runs_no_python_per_rollout(monkeypatch):
    import pandas as pd
    from pandas.core.groupby.generic import SeriesGroupBy
    from memlab.judge import aggregate_runs
    df = pd.DataFrame(dict(judge='llm-a3', judge_model='m', prompt_hash='h', rollout_id=[f'r{i}' for i in range(500)], run=0,
                           label='CORRECT', correct=True, score=1.0))
    calls = []
    orig = SeriesGroupBy.aggregate
    monkeypatch.setattr(SeriesGroupBy, 'aggregate', lambda self, *a, **k: (calls.append(a[:1]), orig(self, *a, **k))[1])
    monkeypatch.setattr(SeriesGroupBy, 'agg', SeriesGroupBy.aggregate)
    out = aggregate_runs(df)
    assert len(out) == 500 and out['score'].eq(1.0).all()
    assert not [c for c in calls if c and callable(c[0])]     # before: three per-group lambdas (1,500 Python calls here)


def test_dcg_computed_once_per_relevance_pattern():
    import math
    from memlab import judge
    before = lambda rel: float(rel[0] + sum(r / math.log2(i + 1) for i, r in enumerate(rel[1:], start=1))) if rel else 0.0
    pats = [[], [1], [0, 1], [0, 0, 1, 1, 0], [1] * 10, [0, 1, 0, 1, 0, 0, 0, 1, 0, 1]]
    assert [judge._dcg(p) for p in pats] == [before(p) for p in pats]
    judge._dcg_of.cache_clear()                                       # before: no cache, a sum per rollout and cut-off
    for _ in range(50): judge.retrieval_scores(['a', 'b', 'c', 'd'], ['b', 'd'])
    assert judge._dcg_of.cache_info().misses == 5                    # (0,), (0, 1, 0), (0, 1, 0, 1) at @1, @3, @5 = @10; ideals (1,), (1, 1)
