"""MemGym's memory strategies (seed 004 §3.2, §4.1, appendix E; protocols.md §3.2; prompts protocol-prompts.md §A, §B).

Every strategy compacts first at the step its view passes the shared trigger (100 messages or 32K tokens by default,
here small limits on each side), keeps to its budget after a compaction, and records the forgotten positions; the
rolling LLM summary follows the repository's head/tail arithmetic and sends the verbatim prompt to its summarizer;
masking keeps error messages when selective; the pipeline reports per-stage statistics; retrieval notes bring back a
fact relevant to the question after it left the window; and on random tool-call histories every output is API-valid.
"""
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from memlab.core import Usage
from memlab.llm import ChatResponse, ToolCall, OpenAIBackend
from memlab.protocols.memgym.contract import MANAGERS, make_manager, api_valid, count_tokens
from memlab.protocols.memgym import strategies as S

NAMES = ['sliding-window', 'observation-masking', 'llm-summarizing', 'structured-summary', 'bm25-notes', 'dense-notes',
         'amem-notes', 'pipeline', 'memorybank-notes', 'lightmem-notes', 'simplemem-notes', 'adaptive-budget']
ROLLING = ['sliding-window', 'llm-summarizing', 'structured-summary', 'bm25-notes', 'dense-notes', 'amem-notes', 'memorybank-notes',
           'lightmem-notes', 'simplemem-notes', 'adaptive-budget']
EXTRA = {'observation-masking': {'attention_window': 3},
         'pipeline': {'stages': [{'name': 'observation-masking', 'attention_window': 3}, {'name': 'llm-summarizing'}]}}
DOC = Path(__file__).resolve().parents[2] / 'shared' / 'docs' / 'protocol-prompts.md'

SYS = {'role': 'system', 'content': 'You are a coding agent.'}
u = lambda t: {'role': 'user', 'content': t}
a = lambda t: {'role': 'assistant', 'content': t}
call = lambda *ids: {'role': 'assistant', 'content': '', 'tool_calls': [
    {'id': x, 'type': 'function', 'function': {'name': 'run', 'arguments': '{}'}} for x in ids]}
res = lambda x, t: {'role': 'tool', 'tool_call_id': x, 'content': t}

# plain turns, every message distinct and salient (a number in each)
H = [SYS] + [u(f'Item {i} weighs {i * 3} kg.') if i % 2 else a(f'Checked item {i}.') for i in range(1, 40)]
# tool-call blocks of 1-3 calls, results long enough that masking shortens them
HT = [SYS, u('Task: repair the build of project Orion.')]
for i in range(14):
    HT += [call(*[f'c{i}_{j}' for j in range(1 + i % 3)])]
    HT += [res(f'c{i}_{j}', f'Result {i}.{j}: ' + 'compiler output line ' * (3 + j)) for j in range(1 + i % 3)]
    HT.append(u(f'Observation {i} about module M{i}.'))


def make(name, **kw): return make_manager(name, **{**EXTRA.get(name, {}), **kw})


def run(m, h, **state):
    "One manage_context call per step over the growing history, as the harness calls it."
    m.reset(); m.set_episode_state(**state)
    return [m.manage_context(h[:k], h[k - 1], {'step': k}) for k in range(1, len(h) + 1)]


def compacted_steps(fs): return [k for k, f in enumerate(fs, 1) if f.metadata['was_compacted']]


def doc_prompt(name): return re.search(name + r' = """(.*?)"""', DOC.read_text(), re.S).group(1)


class FakeBackend:
    "A stand-in for a memlab backend (same `chat` signature and return values); records every call."
    model = 'fake-summarizer'
    def __init__(self, provider='openai', tool_args=None): self.provider, self.tool_args, self.calls = provider, tool_args, []
    def chat(self, messages, tools=None, tool_choice=None, **params):
        self.calls.append(dict(messages=messages, tools=tools, tool_choice=tool_choice, **params))
        tc = [ToolCall('t1', tools[0]['function']['name'], self.tool_args)] if tools and self.tool_args is not None else []
        r = ChatResponse(None if tc else f'SUMMARY {len(self.calls)}: items weighed', tc, input_tokens=700 + len(self.calls), output_tokens=40)
        return r, Usage(input_tokens=r.input_tokens, output_tokens=r.output_tokens, calls=1)


# ---- the trigger -------------------------------------------------------------------------------------------------

def test_the_trigger_fires_past_either_limit_whichever_first():
    h = [u(f'message {i}') for i in range(10)]                      # 2 tokens each
    assert S.compaction_trigger(h, 10, 20) is None
    assert S.compaction_trigger(h + [u('x')], 10, 100) == 'messages'
    assert S.compaction_trigger(h, 100, 19) == 'tokens'
    assert S.compaction_trigger(h, None, None) is None


@pytest.mark.parametrize('name', NAMES)
def test_compacts_first_just_past_the_message_trigger(name):
    fs = run(make(name, max_size=10, max_tokens=None), H[:20])
    assert compacted_steps(fs)[0] == 11                              # 11 messages > 10; never at steps 1-10


@pytest.mark.parametrize('name', NAMES)
def test_compacts_first_just_past_the_token_trigger(name):
    limit = count_tokens(H[:8])                                      # step 9 is the first past it
    fs = run(make(name, max_size=1000, max_tokens=limit), H[:14])
    assert compacted_steps(fs)[0] == 9
    assert S.compaction_trigger(H[:8], 1000, limit) is None and S.compaction_trigger(H[:9], 1000, limit) == 'tokens'


@pytest.mark.parametrize('name', NAMES)
def test_never_over_budget_after_a_compaction(name):
    max_size, max_tokens = 12, 160
    fs = run(make(name, max_size=max_size, max_tokens=max_tokens), HT, question='What broke the Orion build?')
    ks = compacted_steps(fs)
    assert len(ks) >= 3
    for k in ks:
        f = fs[k - 1]
        if name == 'observation-masking':        # masking rewrites, never drops: within the tokens, or all it can shorten masked
            shortenable = [m for m in f.content[1:S._last_block(f.content)] if m['role'] in ('user', 'tool')
                           and count_tokens(m) > count_tokens(S.PAPER_PLACEHOLDER)]
            assert f.metadata['tokens'] <= max_tokens or all(m['content'] == S.PAPER_PLACEHOLDER for m in shortenable), k
        else: assert f.metadata['tokens'] <= max_tokens and len(f.content) <= max_size, (k, f.metadata['tokens'])
        assert api_valid(f.content, pending_tool_ids=S.pending_tool_ids(HT[:k])) is None


@pytest.mark.parametrize('name', ROLLING)
def test_the_event_names_exactly_the_forgotten_messages(name):
    f = run(make(name, max_size=10), H[:11])[-1]
    ev = f.metadata['condensation_event']
    kept = [i for i, m in enumerate(H[:11]) if m in f.content]
    gone = [1, 2, 3, 4] if name in ('sliding-window', 'adaptive-budget') else [1, 2, 3, 4, 5]     # no summary slot: one more message kept
    assert ev['forgotten_indices'] == [i for i in range(11) if i not in kept] == gone
    assert ev['forgotten_count'] == len(gone) and ev['tokens_before'] == count_tokens(H[:11]) and ev['tokens_after'] == f.metadata['tokens']


def test_masking_and_pipeline_events_name_their_forgotten_messages():
    f = run(make('observation-masking', max_size=10), H[:11])[-1]
    masked = [i for i, m in enumerate(f.content) if m['content'] == S.PAPER_PLACEHOLDER]
    assert f.metadata['condensation_event']['forgotten_indices'] == masked == [1, 3, 5, 7]   # user turns outside the last 3
    f = run(make('pipeline', max_size=10), H[:11])[-1]
    assert f.metadata['condensation_event']['forgotten_indices'] == [1, 2, 3, 4, 5]          # the summarizing stage's


# ---- llm-summarizing ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('ratio,tail', [(0.75, 5), (0.5, 3)])
def test_head_tail_arithmetic_by_hand(ratio, tail):
    # max_size=10: target int(10 * ratio) = 7 (5); head 1 + summary 1 + tail 5 (3); forgotten = 11 - 1 - tail
    m = make('llm-summarizing', max_size=10, condensation_ratio=ratio)
    f = run(m, H[:11])[-1]
    assert len(f.content) == int(10 * ratio) == 2 + tail
    assert f.content[0] == SYS and f.content[2:] == H[11 - tail:11]
    assert f.content[1]['role'] == 'user' and f.content[1]['content'].startswith('[Summary] ')
    assert f.metadata['condensation_event']['forgotten_indices'] == list(range(1, 11 - tail))
    assert m.condensation_history() == [{'forgotten_events_start': 1, 'forgotten_events_end': 11 - tail,
                                         'summary': f.content[1]['content'][len('[Summary] '):], 'summary_offset': 1}]


def test_the_record_rebuilds_the_view_between_compactions():
    m = make('llm-summarizing', max_size=10)
    fs = run(m, H[:15])
    assert compacted_steps(fs) == [11, 15]
    view, pos = S.build_view(H[:13], m.records[:1])
    assert fs[12].content == view == [SYS, fs[10].content[1]] + H[6:13] and pos == [0, -1] + list(range(6, 13))
    assert m.records[1].forgotten_events_start == 6 and m.records[1].forgotten_events_end == 10


def test_rolling_summary_includes_the_previous_summary():
    fs = run(make('llm-summarizing', max_size=10), H[:15])
    first, second = fs[10].content[1]['content'], fs[14].content[1]['content']
    assert '- user: Item 1 weighs 3 kg.' in first and '- user: Item 7 weighs 21 kg.' not in first
    assert '- user: Item 1 weighs 3 kg.' in second and '- user: Item 7 weighs 21 kg.' in second
    assert fs[14].metadata['condensation_event']['forgotten_indices'] == [6, 7, 8, 9]        # not the old summary
    fake = FakeBackend()
    run(make('llm-summarizing', max_size=10, summarizer=fake), H[:15])
    assert '<PREVIOUS SUMMARY>\n\n</PREVIOUS SUMMARY>' in fake.calls[0]['messages'][0]['content']
    assert '<PREVIOUS SUMMARY>\nSUMMARY 1: items weighed\n</PREVIOUS SUMMARY>' in fake.calls[1]['messages'][0]['content']


def test_offline_summary_is_labelled_and_its_event_says_so():
    f = run(make('llm-summarizing', max_size=10), H[:11])[-1]
    assert f.content[1]['content'].startswith('[Summary] ' + S.OFFLINE_SUMMARY_LABEL)
    assert 'not an LLM summary' in S.OFFLINE_SUMMARY_LABEL
    ev = f.metadata['condensation_event']
    assert ev['summarization_model'] == 'offline-extractive' and ev['summarizer_prompt_tokens'] == 0


# a research question whose chain starts after salient distractors (numbers, other names)
Q = 'What is the establishment year of the alma mater of the mayor of Kasumys?'
EARLY = u('The mayor of Haskaemar is Praeos Marnabek. Haskaemar was founded in 1801. Marnilen has 4,000 people. '
          'The mayor of Kasumys is Kaseth Evrovask.')


def test_offline_summary_keeps_the_question_relevant_sentence_over_early_salient_ones():
    budget = count_tokens(S.OFFLINE_SUMMARY_LABEL) + 12
    plain = S.extractive_summary([EARLY], budget=budget)
    assert plain.splitlines()[1:] == ['- user: Haskaemar was founded in 1801.']              # salience, then order
    task = S.extractive_summary([EARLY], budget=budget, question=Q)
    assert task.splitlines() == [S.OFFLINE_SUMMARY_LABEL, '- The mayor of Kasumys is Kaseth Evrovask.']


def test_offline_summary_follows_the_chain_and_puts_the_answer_to_its_search_first():
    ev = [u('=== Turn 1: Who is the mayor of Kasumys? ===\n\nThe mayor of Kasumys is Kaseth Evrovask. '
            'Kaseth Evrovask studied at Skaliane College. Lurnik Obel studied at Brisar College.'),
          u('=== Turn 2: Where did Kaseth Evrovask study? ===\n\nKaseth Evrovask studied at Tevumuld College.')]
    lines = S.extractive_summary(ev, question=Q).splitlines()
    assert lines[1:3] == ['- The mayor of Kasumys is Kaseth Evrovask.', '- Kaseth Evrovask studied at Tevumuld College.']
    assert lines[3] == '- Kaseth Evrovask studied at Skaliane College.'                          # the contradiction is kept, after
    assert not any('===' in l for l in lines)                                                    # headings are not sentences


@pytest.mark.parametrize('name', ['llm-summarizing', 'structured-summary'])
def test_the_summary_strategies_give_the_question_to_the_offline_summarizer(name):
    h = [SYS, EARLY] + FILLER
    kasumys = 'The mayor of Kasumys is Kaseth Evrovask.'
    first = lambda doc: next(l for l in doc.splitlines() if l.startswith('- '))
    assert kasumys in first(run(make(name, max_size=10), h, question=Q)[-1].content[1]['content'])
    assert 'Haskaemar' in first(run(make(name, max_size=10), h)[-1].content[1]['content'])      # without it: in order

def test_a_fake_backend_receives_the_verbatim_prompt_with_the_forgotten_events():
    fake = FakeBackend()
    fs = run(make('llm-summarizing', max_size=10, summarizer=fake), H[:11])
    (c,) = fake.calls
    (msg,) = c['messages']
    prompt = doc_prompt('SUMMARIZATION_PROMPT') if DOC.exists() else S.SUMMARIZATION_PROMPT
    events = ''.join(f'<EVENT id={i}>\n{H[1 + i]["content"]}\n</EVENT>\n' for i in range(5))
    assert msg == {'role': 'user', 'content': prompt + '\n\n<PREVIOUS SUMMARY>\n\n</PREVIOUS SUMMARY>\n\n\n' + events
                   + 'Now summarize the events using the rules above.'}
    assert c['temperature'] == 0.0 and c['max_tokens'] == int(32_000 * 0.75) // 4 - 3
    ev = fs[-1].metadata['condensation_event']
    assert (ev['summarization_model'], ev['summarizer_prompt_tokens'], ev['summarizer_completion_tokens']) == ('fake-summarizer', 701, 40)
    assert ev['summary_text'] == 'SUMMARY 1: items weighed' and fs[-1].content[1]['content'] == '[Summary] SUMMARY 1: items weighed'
    assert ev['summarization_time_seconds'] >= 0


def test_long_events_are_truncated_as_the_repository_does():
    assert S.truncate_event('a' * 6 + 'b' * 6, 6) == 'aaa\n\n[... truncated ...]\n\nbbb'
    p = S.summarization_prompt([u('x' * 50)], None, max_event_length=10)
    assert '<EVENT id=0>\nxxxxx\n\n[... truncated ...]\n\nxxxxx\n</EVENT>' in p


def test_a_summarizer_spec_builds_a_memlab_backend():
    b = S.make_summarizer({'name': 'openai', 'model': 'haiku-test', 'base_url': 'http://127.0.0.1:9/v1', 'cache': False})
    assert isinstance(b, OpenAIBackend) and b.model == 'haiku-test'
    assert S.make_summarizer(None) is None
    with pytest.raises(TypeError): S.make_summarizer('openai')


@pytest.mark.skipif(not DOC.exists(), reason='the shared prompt document is not next to the repository')
def test_prompts_are_the_documents_verbatim():
    assert S.SUMMARIZATION_PROMPT == doc_prompt('SUMMARIZATION_PROMPT')
    assert S.STRUCTURED_SUMMARY_PROMPT == doc_prompt('STRUCTURED_SUMMARY_PROMPT')
    desc = re.search(r'description "(.*?)"; all properties', DOC.read_text(), re.S).group(1)
    assert S.summary_tool('repository')['function']['description'] == desc


# ---- structured summary ------------------------------------------------------------------------------------------

def test_schemas_have_the_documented_fields():
    rep, req = S.SCHEMAS['repository']
    assert len(rep) == 18 and req == ['user_context', 'completed_tasks', 'pending_tasks'] and list(rep)[:3] == req
    assert len(S.SCHEMAS['paper-coding'][0]) == 17 and 'key_decisions' in S.SCHEMAS['paper-coding'][0]
    assert list(S.SCHEMAS['dialogue'][0]) == ['user_goal', 'user_constraints', 'decisions_made', 'tool_calls_executed',
                                              'information_gathered', 'outstanding_commitments', 'open_questions', 'next_action']
    for schema, (fields, required) in S.SCHEMAS.items():
        t = S.summary_tool(schema)['function']
        assert t['name'] == 'create_state_summary' and set(t['parameters']['properties']) == set(fields)
        assert all(p['type'] == 'string' for p in t['parameters']['properties'].values()) and t['parameters']['required'] == required


@pytest.mark.parametrize('provider,choice', [('openai', S.OFFICIAL_TOOL_CHOICE), ('anthropic', 'any')])
def test_structured_summary_forces_the_function_call(provider, choice):
    "The official's named function for OpenAI-style backends; Anthropic 'any' (providers.py sends {'type': choice}: no named tool)."
    args = {'current_objective': 'fix float repr', 'files_modified': 'card.py', 'blockers': 'none'}
    fake = FakeBackend(provider, tool_args=args)
    f = run(make('structured-summary', max_size=10, summarizer=fake, schema='paper-coding'), H[:11])[-1]
    (c,) = fake.calls
    assert c['tools'] == [S.summary_tool('paper-coding')] and c['tool_choice'] == choice
    assert c['messages'][0]['content'].startswith(S.STRUCTURED_SUMMARY_PROMPT + '\n\n<PREVIOUS SUMMARY>')
    assert c['messages'][0]['content'].endswith('</EVENT>\n')                                 # no closing line (§B)
    assert f.content[1]['content'] == '[Summary] ' + S.render_state(args, 'paper-coding')
    assert '**Current Objective**: fix float repr' in f.content[1]['content'] and 'Hypotheses' not in f.content[1]['content']



@pytest.mark.parametrize('provider,choice', [('openai', S.IR_TOOL_CHOICE), ('anthropic', 'any')])
def test_ir_structured_forces_the_named_function(provider, choice):
    "The DR track's ir_structured: create_research_summary named (OpenAI-style), its system line, the formatted call in the view."
    args = {'research_question': 'Who founded it?', 'bridge_connections': ['Kask founded Velmora'], 'candidate_answer': 'Oren Kask'}
    fake = FakeBackend(provider, tool_args=args)
    h = [u('Research question: Who founded it?')] + [u(f'=== Turn {k}: hop ===\n\nfact {k}') for k in range(1, 5)]
    f = run(make('ir-structured', max_size=3, summarizer=fake), h)[-1]
    (c,) = fake.calls
    assert c['tools'] == [S.IR_SUMMARY_TOOL] and c['tool_choice'] == choice and c['messages'][0]['content'] == S.IR_STRUCTURED_SYSTEM
    assert f.content[:2] == [h[0], u(S.IR_STATE_BLOCK + S.format_research_summary(args))] and f.content[2:] == h[3:]

def test_structured_summary_offline_fills_fields_and_rolls():
    h = [SYS, u('Fix the float repr in card.py for issue 7.'), call('c1'),
         res('c1', 'FAILED test_format: AssertionError: 0.1 != 0.10000000000000001'), a('Tests: 11 of 12 pass.')] + H[1:12]
    fs = run(make('structured-summary', max_size=10), h)
    doc = fs[10].content[1]['content']
    assert doc.startswith('[Summary] ' + S.OFFLINE_STATE_LABEL) and 'not an LLM summary' in S.OFFLINE_STATE_LABEL
    assert '**Error Messages**: - FAILED test_format: AssertionError' in doc
    assert '**Files Modified**: - Fix the float repr in card.py for issue 7.' in doc
    later = next(f for f in fs[11:] if f.metadata['was_compacted']).content[1]['content']
    assert '- FAILED test_format: AssertionError' in later                                    # the previous fields survive


# ---- observation masking -----------------------------------------------------------------------------------------

def test_selective_masking_keeps_error_messages():
    h = [SYS, u('Fix it.'), call('c1'), res('c1', 'Traceback (most recent call last):\n  ...\nKeyError: x'),
         call('c2'), res('c2', 'FAILED tests/test_a.py::test_b'), call('c3'), res('c3', 'plain listing of files')]
    h += [u(f'observation {i}') for i in range(5)]
    sel = make('observation-masking', max_size=10, attention_window=3).manage_context(h, h[-1]).content
    assert sel[3] == h[3] and sel[5] == h[5]                                                   # errors stay visible
    assert sel[7] == dict(h[7], content='<MASKED: observation too old>') and sel[7]['tool_call_id'] == 'c3'
    assert sel[1]['content'] == sel[8]['content'] == S.PAPER_PLACEHOLDER and sel[-3:] == h[-3:]
    non = make('observation-masking', max_size=10, attention_window=3, selective=False, placeholder=S.REPOSITORY_PLACEHOLDER)
    out = non.manage_context(h, h[-1]).content
    assert out[3]['content'] == out[5]['content'] == '<MASKED>' and api_valid(out) is None


def test_masking_goes_into_the_window_only_to_meet_the_token_budget():
    h = [SYS] + [res_ for i in range(6) for res_ in (call(f'c{i}'), res(f'c{i}', f'Result {i}: ' + 'output ' * 20))]
    loose = make('observation-masking', max_size=5, max_tokens=None, attention_window=6).manage_context(h, h[-1])
    assert [i for i, m in enumerate(loose.content) if m['content'] == S.PAPER_PLACEHOLDER] == [2, 4, 6]
    tight = make('observation-masking', max_size=5, max_tokens=70, attention_window=6).manage_context(h, h[-1])
    assert [i for i, m in enumerate(tight.content) if m['content'] == S.PAPER_PLACEHOLDER] == [2, 4, 6, 8, 10]
    assert tight.metadata['tokens'] <= 70 and tight.content[12] == h[12]                     # the last block stays


# ---- pipeline ----------------------------------------------------------------------------------------------------

def test_pipeline_reports_per_stage_statistics():
    p = make_manager('pipeline', stages=[{'name': 'observation-masking', 'attention_window': 4}, {'name': 'sliding-window'}], max_size=12)
    assert [s['max_size'] for s in p.stages] == [12, 12]
    fs = run(p, HT)
    st12 = [f.metadata['stages'] for f in fs]
    for k, (f, stats) in enumerate(zip(fs, st12), 1):
        assert [s['strategy'] for s in stats] == ['observation-masking', 'sliding-window']
        assert stats[0]['tokens_in'] == count_tokens(HT[:k]) and stats[1]['tokens_in'] == stats[0]['tokens_out']
        assert f.metadata['tokens'] == stats[1]['tokens_out']
        assert f.metadata['was_compacted'] == any(s['was_compacted'] for s in stats)
    assert any(s[0]['was_compacted'] and not s[1]['was_compacted'] for s in st12)             # masking alone compacted
    assert any(s[1]['was_compacted'] for s in st12)
    with pytest.raises(ValueError, match='at most one rolling stage'):
        make_manager('pipeline', stages=[{'name': 'bm25-notes'}, {'name': 'llm-summarizing'}])


# ---- retrieval notes ---------------------------------------------------------------------------------------------

FACT = res('c1', 'The vault code for project Falcon is 7319.')
FILLER = [u(f'Weather report {i}: the sky over the harbor is grey and the wind blows east.') for i in range(16)]
HN = [SYS, u('Find the vault code.'), call('c1'), FACT] + FILLER


@pytest.mark.parametrize('name', ['bm25-notes', 'dense-notes', 'amem-notes'])
def test_notes_bring_back_a_fact_relevant_to_the_question(name):
    fs = run(make(name, max_size=10), HN, question='What is the vault code for project Falcon?')
    assert len(compacted_steps(fs)) >= 2
    f = fs[-1]
    assert FACT not in f.content and f.content[1]['content'].startswith('[Notes] ')
    assert '#3 tool: The vault code for project Falcon is 7319.' in f.content[1]['content']
    assert api_valid(f.content) is None


@pytest.mark.parametrize('name', ['bm25-notes', 'dense-notes', 'amem-notes'])
def test_without_a_question_the_current_observation_is_the_query(name):
    h = HN + [u('Some other thing 1.'), u('Some other thing 2.'), u('Remind me: the vault code of Falcon?')]   # step 23 compacts
    f = run(make(name, max_size=10), h)[-1]
    assert f.metadata['was_compacted'] and '7319' in f.content[1]['content']


def test_a_window_alone_forgets_the_fact():
    f = run(make('sliding-window', max_size=10), HN)[-1]
    assert not any('7319' in S.content_text(m) for m in f.content)


def test_amem_links_notes_and_evolves_their_context():
    m = make('amem-notes', max_size=10)
    h = [SYS, u('Falcon vault code is 7319.'), a('The Falcon vault needs the code at noon.'), u('Lunch is at the canteen.')] + FILLER
    fs = run(m, h, question='When does the Falcon vault need its code?')
    assert m.notes[1].links == [2] and m.notes[2].links == [1] and m.notes[3].links == []
    assert m.notes[1].context == 'later note #2 shares falcon, vault, code' and m.notes[2].context == ''
    m2 = make('amem-notes', max_size=10, k=1)
    fs = run(m2, h, question='When does the Falcon vault need its code?')
    notes = fs[-1].content[1]['content']                                                      # top-1 plus its linked note
    assert '#2 assistant: The Falcon vault needs the code at noon.' in notes and '#1 user: Falcon vault code is 7319.' in notes
    fs = run(make('bm25-notes', max_size=10, k=1), h, question='When does the Falcon vault need its code?')
    assert '#1 user' not in fs[-1].content[1]['content']                                      # BM25 top-1 has no links



TURN = ('=== Turn 1: Who is the mayor of Kasumys? ===\n\n--- Kasumys ---\n\nThe mayor of Kasumys is Kaseth Evrovask.\n\n'
        '--- Haskaemar ---\n\nThe mayor of Haskaemar is Praeos Marnabek.\n\n')


@pytest.mark.parametrize('name', ['bm25-notes', 'dense-notes', 'amem-notes'])
def test_notes_are_taken_per_paragraph(name):
    m = make(name, max_size=10)
    f = run(m, [SYS, u(TURN)] + FILLER, question='Who is the mayor of Kasumys?')[-1]
    assert [(n.id, n.text) for n in m.notes.values()][:3] == [('1.1', 'The mayor of Kasumys is Kaseth Evrovask.'),
                                                              ('1.2', 'The mayor of Haskaemar is Praeos Marnabek.'), (2, FILLER[0]['content'])]
    assert m.notes['1.1'].search == 'Who is the mayor of Kasumys?' and m.notes[2].search == ''
    assert '- #1.1 user: The mayor of Kasumys is Kaseth Evrovask.' in f.content[1]['content']   # the document, not the turn's header


CHAIN = [SYS, u('The mayor of Kasumys is Kaseth Evrovask.\n\nThe mayor of Haskaemar is Praeos Marnabek.\n\nThe mayor of Marnilen is Tarum Orvykel.'),
         u('Kaseth Evrovask studied at Tevumuld College.\n\nLurnik Obel studied at Brisar College.'), u('Tevumuld College is located in Orvane.')] + FILLER
CHAIN_Q = 'What is the home city of the alma mater of the mayor of Kasumys?'


def shown(name, **kw):
    "Ids of the notes in the last notes block of a run over CHAIN."
    return re.findall(r'^- #(\S+) ', run(make(name, max_size=10, k=2, **kw), CHAIN, question=CHAIN_Q)[-1].content[1]['content'], re.M)


@pytest.mark.parametrize('name', ['bm25-notes', 'dense-notes'])
def test_flat_retrieval_misses_a_bridge_fact_that_shares_no_word_with_the_question(name):
    ids = shown(name)
    assert '1.1' in ids and '2.1' not in ids and '3' not in ids


def test_amem_follows_links_to_the_bridge_facts_flat_retrieval_misses():
    assert '2.1' not in shown('amem-notes', depth=0)
    one, two = shown('amem-notes', depth=1), shown('amem-notes', depth=2)
    assert one[:2] == ['1.1', '2.1'] and '3' not in one                      # the linked note right after the one retrieved
    assert two[:3] == ['1.1', '2.1', '3']                                    # and, one link further, the next hop

# ---- listing, settings, the invariant ----------------------------------------------------------------------------

def test_list_strategies_shows_every_strategy():
    t = S.list_strategies().set_index('name')
    assert set(NAMES) | {'none'} <= set(t.index)
    assert t.loc['observation-masking', 'kind'] == 'masking' and t.loc['bm25-notes', 'kind'] == 'retrieval'
    assert t.loc['llm-summarizing', 'model'].startswith('LLM') and t.loc['sliding-window', 'model'] == 'offline'
    assert "placeholder='<MASKED: observation too old>'" in t.loc['observation-masking', 'settings']
    assert 'max_event_length=20000' in t.loc['llm-summarizing', 'settings']


@pytest.mark.parametrize('name', NAMES)
def test_settings_round_trip(name):
    m = make(name, max_size=20)
    assert make_manager(**m.info()).info() == m.info()


@st.composite
def histories(draw):
    "A valid history: user turns, assistant replies, and tool-call blocks with their results."
    out, n = [SYS], 0
    for b in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(['user', 'assistant', 'tools']))
        if kind == 'user': out.append(u(f'Observation {b}: value {b * 11} for Module{b}. ' + 'text ' * draw(st.integers(0, 30))))
        elif kind == 'assistant': out.append(a(f'thought {b}'))
        else:
            ids = [f'call_{n + i}' for i in range(draw(st.integers(1, 3)))]; n += len(ids)
            out.append(call(*ids))
            out += [res(i, f'Result of {i}: ' + 'line ' * draw(st.integers(0, 30))) for i in ids]
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.sampled_from(NAMES), st.sampled_from([None, 60, 200]), st.sampled_from([1, 2]))
def test_every_strategy_output_is_api_valid_at_every_step(h, name, max_tokens, keep_first):
    # keep_first=2 pins the first assistant turn, whose tool results may be forgotten: only the repair keeps that valid
    m = make(name, max_size=4, max_tokens=max_tokens, **({} if name == 'pipeline' else {'keep_first': keep_first}))
    for k, f in enumerate(run(m, h, question='value of Module3'), 1):
        assert api_valid(f.content, pending_tool_ids=S.pending_tool_ids(h[:k])) is None, (name, f.content)
        if f.metadata['was_compacted']: assert f.metadata['condensation_event']['forgotten_indices'], (name, k)
        if S.compaction_trigger(h[:k], 4, max_tokens) is None: assert not f.metadata['was_compacted'], (name, k)
