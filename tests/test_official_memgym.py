"""MemGym (issue 23, items 3 and 7, and the remainder): memlab reads DR replies, fills the summarizers' (the SWE ones and the
DR track's own ir_summarizing / ir_structured) and CodeQA's prompts and computes CodeQA's metrics (answer similarity and
the report included) as the official code does, checked against the official functions' outputs recorded by
`tests/fixtures/official/record_memgym.py` (WujiangXu/MemGym @ 6139728b / ef6f6d8f / 36612b7c)."""
import hashlib, importlib.util, json, math
from collections import Counter
from pathlib import Path
import pytest
import memlab.protocols.memgym.official.dr as DR          # names used as DR.x, so each test reports its own failure on older code
import memlab.protocols.memgym.condensers.summarizing as S
import memlab.protocols.memgym.official.codeqa as OQ
import memlab.protocols.memgym.codeqa as CQ

HERE = Path(__file__).parent / 'fixtures' / 'official'


def _fixture(name):
    p = HERE / name
    if not p.exists(): pytest.skip(f'{p} missing: run tests/fixtures/official/record_memgym.py <scratch copy of MemGym src/memgym>')
    return json.loads(p.read_text(encoding='utf-8'))


def _recorder():
    spec = importlib.util.spec_from_file_location('record_memgym', HERE / 'record_memgym.py')
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m


def _sha(s): return hashlib.sha256(s.encode('utf-8')).hexdigest()[:16]


def _report(bad, n, what):
    assert not bad, f'{len(bad)} of {n} {what} differ from the official; first: {bad[:3]}'


def test_fixture_provenance():
    "The fixtures name the repository, the commits and the functions they were recorded from."
    for name, commit in (('memgym_dr.json', '6139728be6a64299645cf131f81ac289ec2bd546'),
                         ('memgym_dr_notes.json', '36612b7c546fa30dd3295a4f494ba6be560b480f'),
                         ('memgym_summarizer.json', 'ef6f6d8f2ffb301a7a789119989f710114ff6078'),
                         ('memgym_codeqa.json', '6139728be6a64299645cf131f81ac289ec2bd546'),
                         ('memgym_ir_summarizer.json', '6139728be6a64299645cf131f81ac289ec2bd546'),
                         ('memgym_codeqa_similarity.json', '6139728be6a64299645cf131f81ac289ec2bd546')):
        d = _fixture(name)
        assert (d['source'], d['commit']) == ('WujiangXu/MemGym', commit) and d['function'] and len(d['inputs']) == len(d['outputs'])


# ------------------------------------------------------------------ item 3: DR answers
def test_dr_answer_reaches_the_judge_as_official():
    "`{\"answer\": \" Paris \"}` reaches the official judge as ' Paris '; true, lists, numbers as str.format renders them; falsy answers score 0 unjudged."
    d = _fixture('memgym_dr.json')
    bad = []
    for (a, j), o in zip(d['inputs'], d['outputs']):
        if o['judged']: want = o['predicted']
        elif o['error']: continue                               # the official raises before judging: next test
        else: want = ''                                         # `if not predicted: score = 0.0`, no judge call
        got = DR.parse_answer(a)
        if got != want: bad.append((a, got, want))
    _report(bad, len(d['inputs']), 'answer replies')


def test_dr_answer_official_crashes_named():
    "A reply the official cannot read (JSON that is not an object, no reply) is named with the exception the official raises."
    d = _fixture('memgym_dr.json')
    bad, n = [], 0
    for (a, j), o in zip(d['inputs'], d['outputs']):
        want = o['error'] if (o['error'] and not o['judged']) else None
        n += want is not None
        got = DR.official_answer(a)[1]
        if got != want: bad.append((a, got, want))
    assert n > 100
    _report(bad, len(d['inputs']), 'answer replies (official exception)')


def _official_score(o):
    "The official's score as a float, or None where the official run or its report line raises."
    if o['error'] or o['report_error']: return None
    return {'True': 1.0, 'False': 0.0}.get(o['score'], None) if o['score'] in ('True', 'False') else float(o['score'])


def _same(x, y):
    return (x is None and y is None) or (x is not None and y is not None and (x == y or (math.isnan(x) and math.isnan(y))))


def test_dr_judge_score_as_official():
    "The official judge's score: `.get('score', 0.0)` of `_extract_json` (a reply without a score is 0.0, fences found anywhere)."
    d = _fixture('memgym_dr.json')
    bad, judged = [], 0
    for (a, j), o in zip(d['inputs'], d['outputs']):
        if not o['judged']: continue
        judged += 1
        want, got = _official_score(o), DR.parse_judge(j)
        if not _same(got, want): bad.append((j, got, want))
    assert judged > 1500
    _report(bad, judged, 'judge replies')


def test_dr_judge_strict_variant_kept():
    "memlab's own reading stays available: a score must be a number in [0, 1], else None."
    assert DR.parse_judge_strict('{"explanation": "no score"}') is None and DR.parse_judge_strict('{"score": 7}') is None
    assert DR.parse_judge_strict('{"score": 0.5}') == 0.5 and DR.parse_judge('{"explanation": "no score"}') == 0.0


def test_dr_judge_messages_as_official():
    "The judge call carries the client's system message when a response format is given."
    d = _fixture('memgym_dr.json')
    c = d['judge_call']
    assert c['roles'] == ['system', 'user'] and c['temperature'] == 0.0
    assert DR.judge_messages('P') == [{'role': 'system', 'content': c['system']}, {'role': 'user', 'content': 'P'}]


def test_dr_note_fact_recall_as_official():
    "The DR track's note metric, `_compute_note_fact_recall` (a fact found by its words and its intermediate answer counts twice)."
    from types import SimpleNamespace as NS
    import memlab.protocols.memgym.dr as D
    d = _fixture('memgym_dr_notes.json')
    bad = []
    for c, want in zip(d['inputs'], d['outputs']):
        inst = NS(grounding_facts=[NS(**f) for f in c['facts']], memory_required_facts=c['required'])
        got = D.note_fact_recall(c['notes'], inst)
        if got != pytest.approx(want): bad.append((c, got, want))
    assert sum(x > 0 for x in d['outputs']) > 200 and max(d['outputs']) > 1
    _report(bad, len(d['inputs']), 'note-recall cases')


# ------------------------------------------------------------------ item 7a: the summarizers' prompts
def test_summarizer_prompts_as_official():
    "The rolling summary's prompt as LLMSummarizingMemory fills it (previous summary and events as the official reads them)."
    d = _fixture('memgym_summarizer.json')
    assert d['instructions']['llm'] == S.SUMMARIZATION_PROMPT and d['instructions']['structured'] == S.STRUCTURED_SUMMARY_PROMPT
    bad = {'llm': [], 'structured': []}
    for case, o in zip(d['inputs'], d['outputs']):
        for key, instr, closing in (('llm', S.SUMMARIZATION_PROMPT, S.SUMMARIZATION_CLOSING), ('structured', S.STRUCTURED_SUMMARY_PROMPT, '')):
            p = S.summarization_prompt(case['events'], case['previous'], case['max_event_length'], instr, closing)
            if o[key] is None or _sha(p) != o[key]['sha']: bad[key].append((case['previous'], p[len(instr):][:300], (o[key] or {}).get('tail', '')[:300]))
    for key in bad: _report(bad[key], len(d['inputs']), f'{key} summarizer prompts')


def test_structured_tool_and_summary_as_official():
    "The create_state_summary tool (descriptions verbatim) and the summary text the structured strategy inserts."
    d = _fixture('memgym_summarizer.json')
    assert [S.summary_tool('repository')] == d['structured_tool']['tools']
    assert S.OFFICIAL_TOOL_CHOICE == d['structured_tool']['tool_choice']   # what memlab sends to OpenAI-style backends (Anthropic: 'any')
    bad = [(c['tool_args'], o['structured']['summary'][:80]) for c, o in zip(d['inputs'], d['outputs'])
           if '[Summary] ' + S.format_state_summary(json.loads(c['tool_args'])) != o['structured']['summary']]
    _report(bad, len(d['inputs']), 'structured summaries')


# ------------------------------------------------------------------ items 7b, 7c: CodeQA caps and metrics
@pytest.fixture
def filled(monkeypatch):
    "memlab's CodeQA prompt templates replaced by recorders: the values memlab fills, as the recorder digests them."
    rec = _recorder()
    seen = []
    for n in ('CODING_QA_ANSWER_PROMPT', 'EVICTED_ANSWER_QA_PROMPT', 'EVICTED_ANSWER_QA_PROMPT_MEMORY_ONLY', 'FACT_JUDGE_PROMPT', 'NOISE_JUDGE_PROMPT'):
        monkeypatch.setattr(OQ, n, rec.Template(n, seen))
    return rec, seen


def _judges(rec, seen):
    "The recorder's deterministic judges, reading the values memlab fills into the judge prompts."
    def fact(f, a, q):
        OQ.fact_judge_prompt(f, a, q); return rec.verdict('fact', seen[-1][1])
    def noise(dd, a, q):
        OQ.noise_judge_prompt(dd, a, q); return rec.verdict('noise', seen[-1][1])
    return fact, noise


def _memlab_run(rec, seen, inst, protocol):
    "The prompts memlab fills for one instance under `protocol` ('full', 'evicted', 'evicted_memory_only'), in the official's order."
    seen.clear()
    fact, noise = _judges(rec, seen)
    groups = OQ.document_groups(inst)
    notes = inst.notes[len(groups) - 1] if groups else ''
    answers = {}
    for q in inst.qa_pairs:
        if protocol == 'full': OQ.answer_prompt(inst, q)
        else: OQ.evicted_prompt(inst, q, notes, memory_only=protocol == 'evicted_memory_only', budget=None)
        answers[q.qa_id] = inst.answers[q.qa_id]
        for f in [f for f in inst.grounding_facts if f.id in q.linked_fact_ids]: fact(f, answers[q.qa_id], q.question)
    combined = ' '.join(answers[q.qa_id] for q in inst.qa_pairs)
    for f in inst.grounding_facts: fact(f, combined, inst.task_prompt)
    for dd in inst.distractors: noise(dd, combined, inst.task_prompt)
    return [[k, rec.digest(v)] for k, v in seen], answers


def test_codeqa_filled_values_as_official(filled):
    "Every value filled into CodeQA's answer and judge prompts, caps included (8,000 / 500,000 / 60,000 / 3,000 / 1,000 characters)."
    rec, seen = filled
    d = _fixture('memgym_codeqa.json')
    bad, n = [], 0
    for k, o in zip(d['inputs'], d['outputs']):
        inst = rec.codeqa_case(k)
        for protocol, key in (('full', 'full_filled'), ('evicted', 'evicted_filled'), ('evicted_memory_only', 'evicted_memory_only_filled')):
            want = [x for x in o[key] if x[0] != 'NOTE_TAKING_QA_PROMPT']
            got, _ = _memlab_run(rec, seen, inst, protocol)
            n += len(want)
            if got != want: bad.append((k, protocol, sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))))
    _report(bad, len(d['inputs']) * 3, 'instance runs (filled prompt values)')
    assert n > 500


def test_codeqa_ingest_groups_as_official():
    "The evicted protocol's document groups: names, lengths and texts."
    rec = _recorder()
    d = _fixture('memgym_codeqa.json')
    bad = [k for k, o in zip(d['inputs'], d['outputs'])
           if [[g, len(t), _sha(t)] for g, t in OQ.document_groups(rec.codeqa_case(k))] != o['groups']]
    _report(bad, len(d['inputs']), 'instances (ingest groups)')


METRICS = ('qa_accuracy', 'noise_rejection', 'fact_recall', 'critical_fact_recall', 'external_fact_recall', 'discoverable_fact_recall', 'category_breakdown')


def test_codeqa_metrics_as_official(filled):
    "`aggregate_scores`' metrics on generated episodes (LLM scoring with the recorder's judge): memlab's `official_metrics`."
    rec, seen = filled
    d = _fixture('memgym_codeqa.json')
    bad = []
    for k, o in zip(d['inputs'], d['outputs']):
        inst = rec.codeqa_case(k)
        for key in ('full_llm', 'evicted'):
            fact, noise = _judges(rec, seen)
            got = CQ.official_metrics(inst, inst.answers, fact, noise)
            want = o[key]
            diff = [m for m in METRICS if not (got[m] == pytest.approx(want[m]))]
            if [[q, s] for q, s in got['qa_scores']] != [[q, pytest.approx(s)] for q, s in want['qa_scores']]: diff.append('qa_scores')
            if diff: bad.append((k, key, diff))
    _report(bad, 2 * len(d['inputs']), 'instance metrics')


def test_codeqa_memlab_scores_agree_where_all_parse(filled):
    "memlab's own `score_instance` gives the official qa_accuracy and noise_rejection when every reply parses."
    rec, seen = filled
    d = _fixture('memgym_codeqa.json')
    bad = []
    for k, o in zip(d['inputs'], d['outputs']):
        inst = rec.codeqa_case(k)
        fact, noise = _judges(rec, seen)
        r = CQ.score_instance(inst, inst.answers, fact, noise)
        if (r['qa_accuracy'], r['noise_rejection']) != (pytest.approx(o['full_llm']['qa_accuracy']), pytest.approx(o['full_llm']['noise_rejection'])):
            bad.append((k, r['qa_accuracy'], o['full_llm']['qa_accuracy']))
    _report(bad, len(d['inputs']), 'instances (score_instance)')


def test_codeqa_keyword_metrics_as_official():
    "The repository's keyword scoring (`score_fact_recall_keyword` 40%, `score_noise_rejection_keyword` 30% of distractor-unique terms)."
    rec = _recorder()
    d = _fixture('memgym_codeqa.json')
    bad = []
    for k, o in zip(d['inputs'], d['outputs']):
        inst = rec.codeqa_case(k)
        got, want = CQ.keyword_metrics(inst, inst.answers), o['full_keyword']
        diff = [m for m in METRICS if not (got[m] == pytest.approx(want[m]))]
        if diff: bad.append((k, diff))
    _report(bad, len(d['inputs']), 'instances (keyword metrics)')


# ------------------------------------------------------------------ remainder, item 1: the DR track's ir_summarizing / ir_structured
class _Scripted:
    "A memlab summarizer backend answering with a case's scripted replies, as memlab's OpenAI backend would parse them."
    model, provider = 'scripted', 'openai'
    def __init__(self, replies): self.replies, self.calls = list(replies), []
    def chat(self, messages, tools=None, tool_choice=None, **params):
        from memlab.core import Usage
        from memlab.llm import ChatResponse, ToolCall
        from memlab.backends import MalformedReply
        self.calls.append(dict(messages=messages, tools=tools, tool_choice=tool_choice, **params))
        rep = self.replies.pop(0)
        if rep.get('raise'): raise RuntimeError('scripted summarizer error')
        if 'tool' in rep:
            try: args = json.loads(rep['tool'])
            except json.JSONDecodeError as e: raise MalformedReply('tool arguments are not JSON') from e   # providers.py's parse
            r = ChatResponse(None, [ToolCall('t1', 'create_research_summary', args)], 0, 0)
        else: r = ChatResponse(rep['content'], [], 0, 0)
        return r, Usage()


def _ir_run(case, key):
    "memlab's IR manager on a case: its calls and, per observation, (block sha or None, observations kept, notes sha)."
    from memlab.protocols.memgym.contract import make_manager
    name, replies = {'llm': ('ir-summarizing', 'llm_replies'), 'structured': ('ir-structured', 'structured_replies')}[key]
    fake = _Scripted(case[replies])
    m = make_manager(name, max_size=case['max_size'], keep_first=case['keep_first'], condensation_ratio=case['condensation_ratio'], summarizer=fake)
    m.reset(); m.set_episode_state(question=case['question'])
    h, steps = [{'role': 'user', 'content': 'Research question: ' + case['question']}], []
    for o in case['observations']:
        h.append({'role': 'user', 'content': o})
        f = m.manage_context(list(h), h[-1], {'step': len(h) - 1})
        view = f.content[1:]
        block = view[0]['content'] if m.summary else None
        steps.append(dict(block=None if block is None else _sha(block), kept=len(view) - (block is not None), notes=_sha(m.notes_text(f.content)),
                          condensations=f.metadata['condensations']))
    calls = [dict(system=c['messages'][0]['content'], roles=[x['role'] for x in c['messages']], prompt=_sha(c['messages'][1]['content']),
                  temperature=c['temperature'], max_tokens=c['max_tokens'], tools=c['tools'] is not None) for c in fake.calls]
    return calls, steps, fake.calls


def test_ir_summarizer_tool_and_prompt_as_official():
    "The IR prompt and the create_research_summary tool are the repository's, and memlab names the function as it does (OpenAI-style)."
    d = _fixture('memgym_ir_summarizer.json')
    assert (d['source'], d['commit']) == ('WujiangXu/MemGym', '6139728be6a64299645cf131f81ac289ec2bd546') and len(d['inputs']) == len(d['outputs'])
    assert S.IR_SUMMARIZATION_PROMPT == d['prompt']
    assert [S.IR_SUMMARY_TOOL] == d['structured_tool']['tools'] and S.IR_TOOL_CHOICE == d['structured_tool']['tool_choice']


@pytest.mark.parametrize('key', ['llm', 'structured'])
def test_ir_summarizers_as_official(key):
    "Every summarizer call (system line, prompt, temperature, max_tokens) and every step's view and notes, as the official IR managers'."
    rec = _recorder()
    d = _fixture('memgym_ir_summarizer.json')
    bad, n_calls, n_blocks = [], 0, 0
    for k, o in zip(d['inputs'], d['outputs']):
        calls, steps, raw = _ir_run(rec.ir_case(k), key)
        want_calls = [{x: c[x] for x in ('system', 'roles', 'prompt', 'temperature', 'max_tokens', 'tools')} for c in o[key]['calls']]
        want_steps = [{x: s[x] for x in ('block', 'kept', 'notes', 'condensations')} for s in o[key]['steps']]
        n_calls += len(want_calls); n_blocks += sum(s['block'] is not None for s in want_steps)
        if calls != want_calls or steps != want_steps:
            full = [c.get('full') for c in o[key]['calls']]
            bad.append((k, sum(a != b for a, b in zip(calls, want_calls)) + abs(len(calls) - len(want_calls)),
                        sum(a != b for a, b in zip(steps, want_steps)), full[:1], [c['messages'][1]['content'] for c in raw][:1]))
    assert n_calls > 300 and n_blocks > 400
    _report(bad, len(d['inputs']), f'{key} IR histories')


# ------------------------------------------------------------------ remainder, item 2: score_answer_similarity, format_report
def test_codeqa_answer_similarity_as_official():
    "score.py `score_answer_similarity` on generated (candidate, gold) pairs: memlab's `answer_similarity`."
    rec = _recorder()
    d = _fixture('memgym_codeqa_similarity.json')
    bad = [(k, got, want) for k, want in zip(d['inputs'], d['outputs']) if (got := CQ.answer_similarity(*rec.similarity_case(k))) != pytest.approx(want)]
    assert sum(x > 0 for x in d['outputs']) > 500 and sum(x == 0 for x in d['outputs']) > 100
    _report(bad, len(d['inputs']), 'similarity pairs')


def test_codeqa_report_as_official():
    "score.py `format_report` on generated lists of instance results: memlab's `official_report`, character for character."
    rec = _recorder()
    d = _fixture('memgym_codeqa_similarity.json')
    bad = [k for k, want in enumerate(d['reports']) if CQ.official_report(rec.report_case(k)) != want]
    assert any('Category Breakdown' in r for r in d['reports']) and 'No results to report.' in d['reports']
    _report(bad, len(d['reports']), 'reports')
