"""MemTrace scoring (seed 002, issue 13 item 3): the (Gist, Verbatim, Response type) tuple in the harness's stores.

- scores labelled with MemTrace's response types are stored and read back by a process that never imported the
  MemTrace package (the plugin entry point registers the labels);
- judge summaries count those verdicts as judged (Gist is `correct`), unparsed replies are counted, never scored;
- Verbatim is the same whichever judge scores the response: it is computed, never asked of a model.
"""
import json, subprocess, sys, tempfile
from pathlib import Path
from memlab.core import Score, Rollout
from memlab.judge import scores_frame, judge_summary
from memlab.runner import ResultsStore
from memlab.protocols.memtrace.data import synth_halumem, write_halumem, load_halumem, window_instances
from memlab.protocols.memtrace.scoring import MemTraceOfflineJudge, MemTraceLLMJudge

U = load_halumem(write_halumem(synth_halumem(1, n_sessions=16, seed=2), Path(tempfile.mkdtemp()) / 'u.jsonl'))[0]
QS = [q for i in window_instances(U)[0] for q in i.queries]


def test_response_type_scores_round_trip_in_a_fresh_process(tmp_path):
    j = MemTraceOfflineJudge()
    scores = [j(f'r{i}', q, ans) for i, (q, ans) in enumerate(zip(QS[:30], ["I don't know", 'Denver', None] * 10))]
    assert {s.label for s in scores} >= {'abstention', 'hallucination'}
    st = ResultsStore(tmp_path / 's'); st.write_scores(scores)
    st.write_rollouts([Rollout(rollout_id=s.rollout_id, run_id='p', config_hash='h', section='memtrace', dataset='d', instance_id='i',
                               query_id='q', policy='p', policy_label='l', memory='m', memory_family='flat') for s in scores])
    code = f"from memlab.runner import ResultsStore; s = ResultsStore({str(tmp_path / 's')!r}).score_records(); print(sorted({{x.label for x in s}}))"
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.replace("'", '"')) == sorted({s.label for s in scores})


def test_summaries_count_verdicts_and_never_score_unparsed():
    replies = iter(['{"gist": 1, "response_type": "correct"}', 'no json here', '{"gist": 0, "response_type": "abstention"}'] * 10)
    j = MemTraceLLMJudge(lambda m: next(replies), model='fake')
    scores = [j(f'r{i}', q, 'Denver') for i, q in enumerate(QS[:30])]
    t = judge_summary(scores_frame(scores)).iloc[0]
    assert (t['n_unparsed'], round(t['accuracy'], 3)) == (10, 0.5)          # before: accuracy NaN (only CORRECT/WRONG counted)


def test_verbatim_does_not_depend_on_the_judge():
    off = MemTraceOfflineJudge()
    llm = MemTraceLLMJudge(lambda m: '{"gist": 1, "response_type": "correct"}', model='fake')
    for q in QS[:40]:
        ans = f"It is {q.answers[0].split()[0]} I think"
        assert off('r', q, ans).score == llm('r', q, ans).score
