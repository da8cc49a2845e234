"""The loopback's fake MemGym judge answers the CodeQA noise-judge prompt with a verdict that `parse_noise_reply` reads."""
from loopback import memgym_reply, judge_reply
from memlab.protocols.memgym import codeqa as CQ


def test_noise_judge_prompt_gets_a_parseable_verdict():
    inst = CQ.synth_codeqa(1, seed=2)[0]
    d, qa = inst.distractors[0], inst.qa_pairs[0]
    misled = CQ.noise_judge_prompt(d, f'As noted, {d.content}', qa.question)
    clean = CQ.noise_judge_prompt(d, 'insufficient information.', qa.question)
    assert CQ.parse_noise_reply(memgym_reply(misled)) is True
    assert CQ.parse_noise_reply(judge_reply(clean)) is False          # a verdict, not 'OK' (no verdict)
    assert CQ.parse_fact_reply(memgym_reply(CQ.fact_judge_prompt(inst.grounding_facts[0], inst.grounding_facts[0].content, qa.question))) is True


def test_llm_noise_judge_through_the_loopback_gives_verdicts():
    j = CQ.llm_noise_judge(judge_reply, 'loopback')
    for x in CQ.synth_codeqa(2, seed=3):
        for d in x.distractors:
            assert j(d, d.content, x.task_prompt) is True                       # the answer repeats the wrong claim
            assert j(d, 'insufficient information.', x.task_prompt) is False   # nothing of it
        s = CQ.score_instance(x, {q.qa_id: q.gold_answer for q in x.qa_pairs}, CQ.offline_fact_judge, j)
        assert s['unparsed_noise'] == 0 and s['noise_rejection'] is not None
