"""MemOS's graders (issue 23, items 1-3): memlab sends the bytes MemOS sends and reads replies as MemOS does, checked
against the official functions' outputs recorded by `tests/fixtures/official/record_memos.py` (MemOS @ be68e2fb)."""
import hashlib, json, re
from pathlib import Path
import pytest
from memlab.core import Query
import memlab.judge as J                 # names used as J.x, so that each test reports its own failure on older code
from memlab.judge import make_judge, parse_memos_locomo, parse_memos_lme

HERE = Path(__file__).parent / 'fixtures' / 'official'
JUDGE = dict(locomo='memos-locomo', lme='memos-lme')


def _fixture(name):
    p = HERE / name
    if not p.exists(): pytest.skip(f'{p} missing: run tests/fixtures/official/record_memos.py <scratch copy of MemOS evaluation/scripts>')
    return json.loads(p.read_text(encoding='utf-8'))


def _digest(messages):
    return hashlib.sha256((messages[0]['content'] + '\0' + messages[1]['content']).encode('utf-8')).hexdigest()[:16]


def _judge(grader, reply=''):
    return make_judge(JUDGE[grader], complete=lambda m: reply, model='m')


def test_fixture_provenance():
    "The fixtures name the repository, commit and functions they were recorded from."
    for name in ('memos_prompts.json', 'memos_replies.json'):
        d = _fixture(name)
        assert (d['source'], d['commit']) == ('MemTensor/MemOS', 'be68e2fb5370866bd5e2b188bb3d22bd13b49e09')
        assert d['function'] == dict(locomo='locomo_grader', lme='lme_grader')


def test_memos_texts_verbatim():
    "Item 1: the system prompts and templates are the official bytes (111 / 93 / 1,721 / 1,716 characters)."
    d = _fixture('memos_prompts.json')
    assert d['inputs'][0] == ['{question}', '{gold_answer}', '{response}'] and d['inputs'][1][1] == '{golden_answer}'
    loc, lme = d['full']['locomo'][0], d['full']['lme'][1]           # each placeholder filled with itself: the template
    assert [m['content'] for m in loc] == [getattr(J, 'MEMOS_LOCOMO_SYSTEM_PROMPT', J.MEMOS_SYSTEM_PROMPT), J.MEMOS_LOCOMO_TEMPLATE]
    assert [m['content'] for m in lme] == [getattr(J, 'MEMOS_LME_SYSTEM_PROMPT', J.MEMOS_SYSTEM_PROMPT), J.MEMOS_LME_TEMPLATE]
    assert [len(loc[0]['content']), len(lme[0]['content']), len(loc[1]['content']), len(lme[1]['content'])] == [111, 93, 1721, 1716]


@pytest.mark.parametrize('grader', ['locomo', 'lme'])
def test_memos_messages_as_sent(grader):
    "Items 1-2: the judge's messages on 3,000 generated (question, gold, answer) equal what the MemOS grader sends."
    d = _fixture('memos_prompts.json')
    j = _judge(grader)
    diff = []
    for i, ((q, gold, ans), want) in enumerate(zip(d['inputs'], d['outputs'][grader])):
        msgs = j.messages(Query(id=f'q{i}', question=q, answers=[gold]), ans)
        if i < len(d['full'][grader]): assert msgs == d['full'][grader][i], i
        if _digest(msgs) != want: diff.append(i)
    assert len(d['inputs']) == 3000
    assert not diff, f'{len(diff)} of {len(d["inputs"])} differ, e.g. {d["inputs"][diff[0]]}'


@pytest.mark.parametrize('grader', ['locomo', 'lme'])
def test_memos_replies_as_official(grader):
    "Item 3: on 5,000 generated replies the verdict is the grader's (CORRECT/WRONG), or unparsed naming the exception it raises."
    d = _fixture('memos_replies.json')
    parse = dict(locomo=parse_memos_locomo, lme=parse_memos_lme)[grader]
    want = [('CORRECT' if off else 'WRONG') if isinstance(off, bool) else 'unparsed' for off in d['outputs'][grader]]
    diff = [(r, off, got) for r, off, w in zip(d['inputs'], d['outputs'][grader], want) if (got := parse(r)) != w]
    assert len(d['inputs']) == 5000
    assert not diff, f'{len(diff)} of {len(d["inputs"])} labels differ, e.g. {diff[:3]}'
    for reply, off, w in zip(d['inputs'], d['outputs'][grader], want):   # unparsed replies name the official behaviour
        label, note = J.memos_verdict(grader, reply)
        if isinstance(off, bool): assert (label, note) == (w, None), reply
        else:
            assert label == 'unparsed' and re.search(rf'raises {off.removeprefix("exit:")}\b', note), (reply, off, note)
            assert off.startswith('exit:') == ('exit()' in note) == (grader == 'locomo'), (reply, off, note)


@pytest.mark.parametrize('grader', ['locomo', 'lme'])
def test_memos_judge_scores(grader):
    "The registered judges score those replies so: verdicts as the official, unparsed never correct, the official behaviour in raw."
    d = _fixture('memos_replies.json')
    q = Query(id='q', question='Q?', answers=['G'])
    n_unparsed = 0
    for reply, off in list(zip(d['inputs'], d['outputs'][grader]))[:1000]:
        s = _judge(grader, reply)('r', q, 'A')
        if isinstance(off, bool): assert (s.label, s.correct) == (('CORRECT', True) if off else ('WRONG', False)), reply
        else:
            n_unparsed += 1
            assert (s.label, s.correct) == ('unparsed', None), reply
            assert s.raw.endswith(']') and f'raises {off.removeprefix("exit:")}' in s.raw.rsplit('[official: ', 1)[1], s.raw
    assert n_unparsed > 100
