"""The offline reader never sees gold answers or evidence labels.

We permute every label a benchmark carries (gold answers, evidence ids, abstention flags, question types,
query ids, `has_answer` turn flags, and the session ids that mark evidence sessions) and check that the
reader's answers, memory queries and call counts are identical. A control shows the comparison is not
vacuous: changing the question text does change the outputs.
"""
import random
import pytest
from memlab.core import Instance, Query, Session, Turn
from memlab.synth import make_benchmark
from memlab.memory import make_memory
from memlab.agent import run_loop, make_policy
import memlab.agent
import memlab.reader  # noqa: F401  (registers the reader)

def outputs(bench, tier, memory='bm25', single_pass=None):
    out = []
    for inst in bench:
        mem = make_memory(memory) if memory == 'bm25' else make_memory(memory, window_tokens=2000)
        mem.add_all(inst.sessions)
        for q in inst.queries:
            r = run_loop(make_policy('offline-reader', tier=tier), mem, q.view(), single_pass=single_pass)
            out.append((r.answer, [s.query for s in r.trajectory.steps if s.kind == 'search'], r.n_calls))
    return out

def scramble(bench, seed=7):
    rng = random.Random(seed)
    answers = [q.answers for i in bench for q in i.queries]; rng.shuffle(answers)
    flags = [q.abstention for i in bench for q in i.queries]; rng.shuffle(flags)
    types = [q.qtype for i in bench for q in i.queries]; rng.shuffle(types)
    it = iter(range(10**6)); new = []
    for inst in bench:
        rename = {s.id: f'sess-{rng.getrandbits(40):010x}' for s in inst.sessions}
        ids = list(rename.values())
        sessions = [Session(id=rename[s.id], date=s.date, meta={'scrambled': True},
                            turns=[Turn(role=t.role, content=t.content, meta={'has_answer': rng.random() < .5}) for t in s.turns])
                    for s in inst.sessions]
        queries = []
        for q in inst.queries:
            n = next(it)
            queries.append(Query(id=f'x{n}' + ('_abs' if rng.random() < .5 else ''), question=q.question, date=q.date,
                                 answers=answers[n], evidence=rng.sample(ids, 2), qtype=types[n], abstention=flags[n],
                                 meta={'false_premise': rng.random() < .5}))
        new.append(Instance(id=inst.id + '-scrambled', sessions=sessions, queries=queries))
    return new

@pytest.mark.parametrize('tier', ['weak', 'medium', 'strong'])
@pytest.mark.parametrize('single_pass', [None, False])
def test_outputs_do_not_depend_on_labels(tier, single_pass):
    bench = make_benchmark(3, 10, 25, seed=11)
    assert outputs(bench, tier, single_pass=single_pass) == outputs(scramble(bench), tier, single_pass=single_pass)

def test_long_context_outputs_do_not_depend_on_labels():
    bench = make_benchmark(2, 10, 25, seed=12)
    assert outputs(bench, 'medium', 'long-context') == outputs(scramble(bench), 'medium', 'long-context')

def test_control_question_text_matters():
    bench = make_benchmark(2, 10, 25, seed=11)
    changed = [Instance(id=i.id, sessions=i.sessions,
                        queries=[q.model_copy(update={'question': q.question.replace('I', 'my friend', 1)}) for q in i.queries])
               for i in bench]
    assert outputs(bench, 'strong') != outputs(changed, 'strong')

def test_policy_receives_only_the_view():
    seen = []
    class Spy(memlab.agent.Policy):
        label = 'spy'
        def act(self, view, steps, can_search, sample=0):
            seen.append(view); return memlab.agent.Answer('x')
    bench = make_benchmark(1, 5, 5, seed=1)
    mem = make_memory('bm25'); mem.add_all(bench[0].sessions)
    for q in bench[0].queries: run_loop(Spy(), mem, q.view())
    assert seen and all(set(v.model_dump()) == {'question', 'date', 'task', 'inputs'} for v in seen)
    assert all(v.task is None and v.inputs == {} for v in seen)   # task and inputs are MemoryAgentBench's (test_mab_run)
    for q, v in zip(bench[0].queries, seen):
        assert q.id not in v.to_json() and not any(a in v.to_json() for a in q.answers if len(a) > 3 and a not in q.question)
