"""What `results_frame` gives a researcher reading samples: the question and gold answer of each rollout, and the
verdicts of the judge the notebook just used even when the store also holds an earlier judge prompt's verdicts."""
import pytest
from memlab.judge import OfflineJudge
from memlab.runner import ResultsStore, RunConfig, run, score, results_frame
from memlab.synth import make_benchmark


@pytest.fixture
def scored(tmp_path):
    bench = make_benchmark(n_instances=2, queries_per_instance=3, n_filler=4, seed=3)
    cfg = RunConfig(name='rf', section='test', dataset={'kind': 'synthetic'}, policies=[{'name': 'offline-reader', 'tier': 'strong'}],
                    memories=[{'name': 'bm25', 'k': 5}])
    st = run(cfg, bench, tmp_path / 'store', progress=False)
    score(st, bench)
    return st, bench


def test_question_and_gold_travel_with_each_rollout(scored):
    st, bench = scored
    qs = {(i.id, q.id): q for i in bench for q in i.queries}
    rf = results_frame(st)
    assert len(rf) == 6
    for r in rf.itertuples():
        q = qs[(r.instance_id, r.query_id)]
        assert r.question == q.question and r.gold == q.answers


class EarlierPrompt(OfflineJudge):
    "The offline judge as an earlier memlab version defined it (another prompt hash)."
    def prompt_texts(self): return dict(super().prompt_texts(), dates=None)


def test_the_judge_just_used_is_selected_among_earlier_prompts(scored):
    st, bench = scored
    old = EarlierPrompt(); assert old.prompt_hash != OfflineJudge().prompt_hash
    score(st, bench, judge_obj=old)             # the same store, judged by an earlier prompt of the same judge
    with pytest.raises(Exception, match='several judges'): results_frame(st)
    with pytest.raises(Exception, match='several judges'): results_frame(st, 'offline-match')   # the name alone is ambiguous
    now = OfflineJudge()
    rf = results_frame(st, now)
    assert len(rf) == 6 and set(rf['prompt_hash']) == {now.prompt_hash}
    assert set(results_frame(st, old)['prompt_hash']) == {old.prompt_hash}
