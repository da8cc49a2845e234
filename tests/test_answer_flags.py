"""Issue 25, item 3b: after the max-steps cap a model's tool call written as text (`functions.search_memory: {...}`) was
stored as its final answer and scored WRONG without a word, and answers kept a server's HTML escapes (`I don&#39;t`).
`runner.answer_flags` names such answers; the run summary and `memlab report` count them."""
import shutil

import pandas as pd
import pytest

from inproc import memlab_main
from small_store import small_config
from memlab.runner import ResultsStore, answer_flags

TOOL_TEXT = 'functions.search_memory: {"query": "where did I move"}'


@pytest.fixture(scope='module')
def flagged(tmp_path_factory):
    "The small store with two answers replaced: one tool-call text, one HTML-escaped (and one both)."
    tmp = tmp_path_factory.mktemp('flags')
    assert memlab_main(['run', small_config(tmp, 'flags'), '--store', tmp / 's', '--score'])['rc'] == 0
    st = ResultsStore(tmp / 's'); recs = st.rollout_records()
    bad = [TOOL_TEXT, "I don&#39;t know", '<tool_call>{"name": "search_memory", "arguments": {"query": "a &amp; b"}}</tool_call>']
    recs = [r.model_copy(update={'answer': a}) for r, a in zip(recs, bad)] + recs[len(bad):]
    shutil.rmtree(tmp / 's' / 'rollouts'); st.write_rollouts(recs)
    return tmp / 's'


@pytest.mark.parametrize('answer,flags', [
    (TOOL_TEXT, ['tool-call text']),
    ('{"name": "search_memory", "arguments": {"query": "x"}}', ['tool-call text']),
    ('search_memory({"query": "x"})', ['tool-call text']),
    ('<tool_call>\n{"name": "other"}\n</tool_call>', ['tool-call text']),
    ("I don&#39;t know", ['html-escaped']), ('Tom &amp; Jerry', ['html-escaped']), ('caf&#xe9;', ['html-escaped']),
    ('Biscuit', []), ('AT&T; R&D', []), ('&notanentity;', []), ('I searched my memory for it', []), ('', []), (None, [])])
def test_answer_flags(answer, flags):
    assert answer_flags(answer) == flags


def test_report_counts_answers_that_are_not_answers(flagged):
    r = memlab_main(['report', flagged])
    assert r['rc'] == 0, r['out']
    assert '3 of 6 answers are not plain answers (2 tool-call text, 2 html-escaped)' in r['out'], r['out']
    head = next(l for l in r['out'].splitlines() if ' mean ' in f' {l} ')
    assert {'n_tool_call_text', 'n_html_escaped', 'unparsed'} <= set(head.split()), head


def test_report_csv_has_the_counts(flagged, tmp_path):
    assert memlab_main(['report', flagged, '--csv', tmp_path / 'r.csv'])['rc'] == 0
    t = pd.read_csv(tmp_path / 'r.csv')
    assert (int(t['n_tool_call_text'].sum()), int(t['n_html_escaped'].sum())) == (2, 2)


def test_run_summary_counts_them(flagged):
    r = memlab_main(['resume', '--store', flagged])
    assert r['rc'] == 0 and 'flags: 3 of 6 answers are not plain answers (2 tool-call text, 2 html-escaped)' in r['out'], r['out']


def test_a_plain_store_has_no_flag_line(flagged, tmp_path):
    st = tmp_path / 's'; shutil.copytree(flagged, st)
    recs = ResultsStore(st).rollout_records(); shutil.rmtree(st / 'rollouts')
    ResultsStore(st).write_rollouts([r.model_copy(update={'answer': 'Utrecht'}) for r in recs])
    r = memlab_main(['report', st])
    assert r['rc'] == 0 and 'not plain answers' not in r['out'] and 'n_tool_call_text' not in r['out'], r['out']
