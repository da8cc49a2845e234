"""One calendar day, many spellings (issue 12, item 1): the offline reader and the offline judge treat `2023/07/02`,
`2 July 2023` and `July 2nd, 2023` as the same date, as LoCoMo's and LongMemEval's answers and questions mix them."""
import pytest
from memlab.agent import run_loop
from memlab.core import Instance, Query, Session, Turn
from memlab.judge import make_judge
from memlab.memory import make_memory
from memlab.reader import OfflineReader

SESSIONS = [Session(id='D1', date='10:00 am on 1 July, 2023', turns=[Turn(role='user', content='Caroline: I ordered a lamp for the study.')]),
            Session(id='D2', date='10:00 am on 2 July, 2023', turns=[Turn(role='user', content='Caroline: I ordered a rug for the hallway.')]),
            Session(id='D3', date='9:00 am on 9 July, 2023', turns=[Turn(role='user', content='Caroline: I finally moved house on 5 July 2023.')])]


def answer(question: str) -> str:
    mem = make_memory('long-context', window_tokens=2000); mem.add_all(SESSIONS)
    return run_loop(OfflineReader('strong'), mem, Query(id='q', question=question).view()).answer


@pytest.mark.parametrize('day', ['1 July 2023', '2023/07/01', 'July 1st, 2023'])
def test_the_reader_reads_the_day_the_question_names(day):
    assert 'lamp' in answer(f'What did Caroline order on {day}?')   # before: the latest order (the rug), whatever the day


def test_a_date_said_in_the_text_is_the_answer_not_the_session_date():
    a = answer('When did Caroline move house?')
    judge = make_judge('offline-match')
    q = Query(id='q', question='When did Caroline move house?', answers=['5 July 2023'])
    assert a == '2023/07/05' and judge.judge('r', q, a).label == 'CORRECT'    # before: 2023/07/09, the session's day
