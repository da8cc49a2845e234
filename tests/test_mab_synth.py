"Tests of memlab.protocols.mab.synth: offline MemoryAgentBench-like generators (layout, determinism, length, answerability)."
import ast
import datetime as dt
import json
import re

import pytest

from memlab.core import count_tokens
from memlab.protocols.mab.data import COMPETENCIES
from memlab.protocols.mab.synth import (MAB_GENERATORS, generator_family, META_KEYS, make_mab, write_rows,
                              NIAH_NEEDLE, NIAH_ADJECTIVES, NIAH_NOUNS, INTENT_SETS, icl_labels, icl_label_of,
                              LME_FACTS, LME_TALLIES, LME_TR_SAY, LME_TR_ASK, LME_PREFERENCES, LME_TYPE_COUNTS,
                              EV_OBJECT_VERBS, EV_PERSON_VERBS, FC_HEADER, FC_RELATIONS, fc_facts, fc_answer, recsys_catalogue,
                              recsys_entity2id, movie_mention, INFBENCH_SUM_QUESTION)
from memlab.protocols.mab.metrics import MovieCatalogue, movie_name, recsys_recall
from memlab.synth import DATE_FMT

FAMILIES = sorted(MAB_GENERATORS)
SOURCE_RE = {   # the real sub-dataset names (datasets.md 3.1), with the synthetic size in place of the real one
    'ruler_qa1': r'ruler_qa1_\d+K', 'ruler_qa2': r'ruler_qa2_\d+K', 'ruler_niah_mq': r'ruler_niah_mq_\d+K',
    'longmemeval_s*': r'longmemeval_s\*', 'eventqa': r'eventqa_\d+',
    'icl_banking77': r'icl_banking77_\d+shot_balance', 'icl_clinic150': r'icl_clinic150_\d+shot_balance',
    'icl_nlu': r'icl_nlu_\d+shot_balance', 'icl_trec_coarse': r'icl_trec_coarse_\d+shot_balance',
    'icl_trec_fine': r'icl_trec_fine_\d+shot_balance', 'recsys_redial': r'recsys_redial_full',
    'infbench_sum': r'infbench_sum_eng_shots2', 'factconsolidation_sh': r'factconsolidation_sh_\d+k',
    'factconsolidation_mh': r'factconsolidation_mh_\d+k'}
USED_META = {   # metadata fields each real source fills (besides source and qa_pair_ids); the others are null
    'longmemeval_s*': {'question_ids', 'question_types', 'question_dates', 'haystack_sessions'},
    'eventqa': {'previous_events'}, 'infbench_sum': {'keypoints', 'demo'}}


def nq(name, n=10): return 1 if name == 'infbench_sum' else n


def rows_of(name, seed=0, tokens=8192, n_contexts=2, n=10, **kw):
    return make_mab(name, n_contexts=n_contexts, questions_per_context=nq(name, n), context_tokens=tokens, seed=seed, **kw)


_CACHE = {}
def cached(name, tokens=8192, n=10):
    "Rows shared by the answerability tests (generation is deterministic, so caching changes nothing)."
    key = (name, tokens, n)
    if key not in _CACHE: _CACHE[key] = rows_of(name, seed=5, tokens=tokens, n=n)
    return _CACHE[key]


# ----------------------------------------------------------------------------------------------- registry

def test_registry_covers_table1_families():
    assert set(MAB_GENERATORS) == set(SOURCE_RE)
    by = {c: sorted(f for f in MAB_GENERATORS if generator_family(f).competency == c) for c in COMPETENCIES}
    assert by['TTL'] == ['icl_banking77', 'icl_clinic150', 'icl_nlu', 'icl_trec_coarse', 'icl_trec_fine', 'recsys_redial']
    assert by['CR'] == ['factconsolidation_mh', 'factconsolidation_sh']
    assert by['LRU'] == ['infbench_sum']
    assert by['AR'] == ['eventqa', 'longmemeval_s*', 'ruler_niah_mq', 'ruler_qa1', 'ruler_qa2']
    with pytest.raises(KeyError, match='registered'): make_mab('no_such_family')


# ------------------------------------------------------------------------------------------- determinism

@pytest.mark.parametrize('name', FAMILIES)
def test_same_seed_same_rows_other_seed_other_rows(name):
    a, b, c = rows_of(name, seed=1), rows_of(name, seed=1), rows_of(name, seed=2)
    assert a == b and json.dumps(a) == json.dumps(b)
    assert a != c and a[0]['context'] != c[0]['context']
    if name != 'infbench_sum': assert a[0]['answers'] != c[0]['answers']
    assert a[0]['context'] != a[1]['context']                      # rows of one call differ too


# ------------------------------------------------------------------------------------------------ layout

@pytest.mark.parametrize('name', FAMILIES)
def test_released_layout(name, tmp_path):
    rows = rows_of(name, n_contexts=2)
    ids = []
    for row in rows:
        assert list(row) == ['context', 'questions', 'answers', 'metadata']
        assert isinstance(row['context'], str) and row['context']
        assert isinstance(row['questions'], list) and all(isinstance(q, str) and q for q in row['questions'])
        assert len(row['questions']) == len(row['answers']) == nq(name)
        assert all(isinstance(a, list) and a and all(isinstance(x, str) and x for x in a) for a in row['answers'])
        md = row['metadata']
        assert set(md) == set(META_KEYS)
        assert re.fullmatch(SOURCE_RE[name], md['source']), md['source']
        assert md['qa_pair_ids'] == [f"{md['source']}_no{i}" for i in range(len(ids), len(ids) + nq(name))]
        ids += md['qa_pair_ids']
        used = USED_META.get(name, set())
        for k in set(META_KEYS) - {'source', 'qa_pair_ids'}:
            assert (md[k] is not None) == (k in used), (name, k)
        for k in ('question_ids', 'question_types', 'question_dates', 'haystack_sessions', 'previous_events'):
            if md[k] is not None:
                assert isinstance(md[k], list) and len(md[k]) == len(row['questions'])
        if md['keypoints'] is not None: assert all(isinstance(k, str) for k in md['keypoints'])
        if md['demo'] is not None: assert isinstance(md['demo'], str)
    assert len(set(ids)) == len(ids)
    p = write_rows(rows, tmp_path / 'rows.json')                       # JSON round trip, as the HF JSON export
    assert json.loads(p.read_text(encoding='utf-8')) == rows
    p = write_rows(rows, tmp_path / 'rows.jsonl')
    assert [json.loads(l) for l in p.read_text(encoding='utf-8').splitlines()] == rows


def test_haystack_sessions_turns_have_the_struct_fields():
    md = cached('longmemeval_s*')[0]['metadata']
    for h in md['haystack_sessions']:
        for s in h:
            assert all(list(t) == ['content', 'has_answer', 'role'] and isinstance(t['has_answer'], bool) for t in s)


def test_recsys_catalogue_is_written_like_entity2id(tmp_path):
    rows = cached('recsys_redial')
    write_rows(rows, tmp_path / 'rows.json', entity2id=recsys_entity2id())
    e2i = json.loads((tmp_path / 'entity2id.json').read_text())
    assert all(isinstance(v, int) for v in e2i.values())
    names = {movie_name(k) for k in e2i}
    assert len(names) == len(e2i)                                    # names are unique once the year is dropped
    ids = set(e2i.values())
    assert all(int(g) in ids for r in rows for a in r['answers'] for g in a)


# ---------------------------------------------------------------------------------------- context length

@pytest.mark.parametrize('tokens', [8192, 32768])
@pytest.mark.parametrize('name', FAMILIES)
def test_context_length_within_tolerance(name, tokens):
    for row in make_mab(name, n_contexts=1, questions_per_context=nq(name, 10), context_tokens=tokens, seed=0):
        assert abs(count_tokens(row['context']) - tokens) <= 0.05 * tokens


@pytest.mark.parametrize('name', ['ruler_niah_mq', 'ruler_qa1', 'factconsolidation_sh', 'icl_banking77', 'eventqa'])
def test_too_small_context_is_an_error(name):
    with pytest.raises(ValueError, match='context_tokens'):
        make_mab(name, questions_per_context=400, context_tokens=1000)


# ---------------------------------------------------------------------------------------- answerability

NEEDLE_RE = re.compile(r'One of the special magic numbers for (\S+) is: (\S+)\.')


def test_niah_template_verbatim_keys_and_values():
    assert NIAH_NEEDLE == 'One of the special magic {type_needle_v} for {key} is: {value}.'
    adjs, nouns = set(NIAH_ADJECTIVES), set(NIAH_NOUNS)
    for row in cached('ruler_niah_mq'):
        found = NEEDLE_RE.findall(row['context'])
        assert len(found) == 4 * len(row['questions'])
        for key, value in found:
            adj, noun = key.split('-')
            assert adj in adjs and noun in nouns
            assert re.fullmatch(r'[1-9]\d{6}', value)
            assert NIAH_NEEDLE.format(type_needle_v='numbers', key=key, value=value) in row['context']
        needles = dict(found)
        assert len(needles) == len(found)                               # every key once
        for q, a in zip(row['questions'], row['answers']):
            keys = re.split(r', and |, ', q)
            assert len(keys) == 4 and q == ', '.join(keys[:3]) + ', and ' + keys[3]
            assert [needles[k] for k in keys] == a


def _ruler_docs(ctx):
    parts = re.split(r'\n\n(?=Document \d+:\n)', ctx)
    assert [p.split(':\n', 1)[0] for p in parts] == [f'Document {i}' for i in range(1, len(parts) + 1)]
    return [p.split(':\n', 1)[1] for p in parts]


def test_ruler_qa1_gold_passage_among_distractors():
    for row in cached('ruler_qa1'):
        docs = _ruler_docs(row['context'])
        assert len(docs) > 2 * len(row['questions'])                      # distractors outnumber gold passages
        for q, a in zip(row['questions'], row['answers']):
            town = re.search(r'(?:was|founded|does|is) ([A-Z][a-z]+)', q).group(1)
            gold = [d for d in docs if d.startswith(f'{town} is a town')]
            assert len(gold) == 1 and a[0] in gold[0] and len(a) == 3
            assert sum(bool(re.search(rf'\b{town}\b', d)) for d in docs) == 1   # no other passage names the town


def test_ruler_qa2_needs_two_passages():
    for row in cached('ruler_qa2'):
        docs = _ruler_docs(row['context'])
        for q, a in zip(row['questions'], row['answers']):
            title = re.search(r'(?:director|author) of (.+?)(?: born| study)?\?', q).group(1)
            work = [d for d in docs if d.startswith(title + ' is a')]
            assert len(work) == 1 and a[0] not in work[0]
            maker = re.search(r'(?:directed|written) by ([A-Z]\w+ [A-Z]\w+)', work[0]).group(1)
            person = [d for d in docs if d.startswith(f'{maker} is a')]
            assert len(person) == 1 and a[0] in person[0]


def _lme_sessions(row):
    flat = ast.literal_eval(row['context'])
    assert all(isinstance(h, str) and h.startswith('Chat Time: ') for h in flat[0::2])
    days = [dt.datetime.strptime(h[len('Chat Time: '):], DATE_FMT) for h in flat[0::2]]
    assert days == sorted(days)
    return list(zip(days, flat[1::2]))


def _user_says(sessions, text):
    "Sessions (day, index) where a user turn contains `text`."
    return [(d, i) for i, (d, s) in enumerate(sessions) for t in s if t['role'] == 'user' and text in t['content']]


def test_longmemeval_questions_answerable_from_history():
    row = cached('longmemeval_s*', tokens=32768, n=60)[0]
    md = row['metadata']
    sessions = _lme_sessions(row)
    assert 'has_answer' not in row['context']
    assert {t: md['question_types'].count(t) for t in LME_TYPE_COUNTS} == {
        'knowledge-update': 9, 'multi-session': 15, 'single-session-assistant': 6,
        'single-session-preference': 6, 'single-session-user': 9, 'temporal-reasoning': 15}
    assert all(d == md['question_dates'][0] for d in md['question_dates'])
    assert dt.datetime.strptime(md['question_dates'][0], DATE_FMT) > sessions[-1][0]
    checked = set()
    for q, a, qt, qid, hay in zip(row['questions'], row['answers'], md['question_types'], md['question_ids'],
                                  md['haystack_sessions']):
        gold_turns = [t['content'] for s in hay for t in s if t['has_answer']]
        if qid.endswith('_abs'):
            assert not gold_turns
            f, key = next((f, k) for f in LME_FACTS.values() for k in f.keys if q == f.ask.format(k=k))
            assert not any(f.say.format(k=key, v=v) in row['context'] for v in f.values)   # never stated
            checked.add('abstention'); continue
        assert gold_turns                                                # the haystack marks the evidence turns
        if qt in ('single-session-user', 'knowledge-update', 'single-session-assistant'):
            assert all(a[0] in t for t in gold_turns[-1:]) and a[0] in row['context']
        if qt == 'knowledge-update':                                     # the old value first, the update later
            f, key = next((f, k) for f in LME_FACTS.values() if f.update for k in f.keys if q == f.ask_update.format(k=k))
            olds = [v for v in f.values if _user_says(sessions, f.say.format(k=key, v=v))]
            news = _user_says(sessions, f.update.format(k=key, v=a[0]))
            assert len(olds) == 1 and olds[0] != a[0] and len(news) == 1
            assert _user_says(sessions, f.say.format(k=key, v=olds[0]))[0][1] < news[0][1]
        if qt == 'temporal-reasoning':                                   # the session date of "Today I visited ..."
            key = re.fullmatch(LME_TR_ASK.replace('{k}', '(.+)').replace('?', r'\?'), q).group(1)
            (day, _), = _user_says(sessions, LME_TR_SAY.format(k=key))
            assert day.strftime('%Y/%m/%d') == a[0]
        if qt == 'multi-session':                                        # the count of first-person statements
            say, key = next((say, k) for keys, say, ask in LME_TALLIES.values() for k in keys if q == ask.format(k=k))
            stem = say.split('{v}')[0].format(k=key)
            n = sum(t['content'].count(stem) for _, s in sessions for t in s if t['role'] == 'user')
            assert str(n) == a[0] and len(gold_turns) == n
        if qt == 'single-session-preference':
            say, _, rubric, vals = next(p for p in LME_PREFERENCES.values() if p[1] == q)
            v = next(v for v in vals if rubric.format(v=v) == a[0])
            assert _user_says(sessions, say.format(v=v))
        checked.add(qt)
    assert checked == set(LME_TYPE_COUNTS) | {'abstention'}


def _parse_eventqa(q):
    prev = re.search(r'occurred:\n\n(.*?)\n\n\nBelow', q, re.S).group(1)
    opts = ast.literal_eval(re.search(r'events:\n\n(\[.*\])\n\n ', q, re.S).group(1))
    return [re.sub(r'^\d+\. ', '', l) for l in prev.split('\n')], opts


def test_eventqa_next_event_among_six():
    verbs = '|'.join(EV_OBJECT_VERBS + EV_PERSON_VERBS)
    for row in cached('eventqa'):
        ctx = row['context']
        for q, a, pe in zip(row['questions'], row['answers'], row['metadata']['previous_events']):
            assert q.startswith('These are the events that have already occurred:\n\n1. ')
            prev, opts = _parse_eventqa(q)
            assert len(opts) == 6 and len(set(opts)) == 6 and a[0] in opts and 1 <= len(prev) <= 5
            assert pe == '\n'.join(f'{i}. {e}' for i, e in enumerate(prev, 1))
            assert [o for o in opts if o in ctx] == a                     # distractors never happen
            who = a[0].split()[0]
            assert all(o.startswith(who + ' ') for o in opts) and all(e.startswith(who + ' ') for e in prev)
            where = [ctx.index(e) for e in prev]
            assert where == sorted(where) and ctx.index(a[0]) > where[-1]
            between = ctx[where[-1] + 1:ctx.index(a[0])]                  # the answer is the very next event of `who`
            assert not re.search(rf'(?:^|[.] ){who} (?:{verbs}) ', between)


@pytest.mark.parametrize('name', sorted(INTENT_SETS))
def test_icl_label_sets_consistent(name):
    fam = f'icl_{name}'
    n_labels = {'banking77': 77, 'clinic150': 151, 'nlu': 68, 'trec_coarse': 6, 'trec_fine': 50}[name]
    assert len(icl_labels(name)) == INTENT_SETS[name].n_labels == n_labels
    assert sorted(icl_labels(name).values()) == list(range(n_labels))
    for row in cached(fam):
        ex = row['context'].split('\n\n')
        assert all(re.fullmatch(r'[^\n]+\nLabel: \d+', e) for e in ex)
        pairs = [e.rsplit('\nLabel: ', 1) for e in ex]
        assert row['metadata']['source'] == f'icl_{name}_{len(ex)}shot_balance'
        labels = [int(n) for _, n in pairs]
        assert set(labels) == set(range(n_labels))                        # every label shown, balanced
        counts = [labels.count(n) for n in set(labels)]
        assert max(counts) - min(counts) <= 1
        assert all(icl_label_of(name, s) == int(n) for s, n in pairs)      # one key, one label
        sents = {s for s, _ in pairs}
        for q, a in zip(row['questions'], row['answers']):
            assert q not in sents and re.fullmatch(r'\d+', a[0])
            assert icl_label_of(name, q) == int(a[0])


def test_icl_label_prefix_is_a_parameter():
    row = make_mab('icl_trec_coarse', questions_per_context=3, context_tokens=2048, label_prefix='label:')[0]
    assert all(e.split('\n')[1].startswith('label: ') for e in row['context'].split('\n\n'))


CATALOGUE = MovieCatalogue.from_entity2id(recsys_entity2id())


def test_recsys_gold_movies_recommended_in_context():
    cat = {i: (t, y) for i, t, y, _ in recsys_catalogue()}
    cluster = {i: c for i, _, _, c in recsys_catalogue()}
    for row in cached('recsys_redial'):
        dialogs = row['context'].split('\n\n')
        assert all(d.startswith('User: ') for d in dialogs)
        for q, a in zip(row['questions'], row['answers']):
            liked = re.findall(r'liked (.+?) and (.+?)\. What', q)[0]
            gold = [movie_mention(*cat[int(g)]) for g in a]
            assert 1 <= len(a) <= 3 and not any(g in q for g in gold)
            assert len({cluster[int(g)] for g in a}) == 1                   # one taste
            assert any(any(l in d for l in liked) and
                       all(any(x.startswith('System: ') and g in x for x in d.split('\n')) for g in gold) for d in dialogs)
            oracle = 'The recommendations are:\n' + '\n'.join(f'{i}.{cat[int(g)][0]}' for i, g in enumerate(a, 1))
            assert recsys_recall(oracle, a, CATALOGUE) == 1.0
            assert recsys_recall('1.' + '\n2.'.join(liked), a, CATALOGUE) == 0.0


def test_infbench_sum_keypoints_in_story_in_order():
    for row in cached('infbench_sum'):
        md = row['metadata']
        assert row['questions'] == [INFBENCH_SUM_QUESTION]
        where = [row['context'].index(k) for k in md['keypoints']]
        assert where == sorted(where) and len(md['keypoints']) == 15
        assert all(k in row['answers'][0][0] for k in md['keypoints'])
        assert md['demo'].count('[Book]') == 2 and md['demo'].count('[Summary]') == 2
    with pytest.raises(ValueError, match='one question'):
        make_mab('infbench_sum', questions_per_context=5)


# --------------------------------------------------------------------------------------- CR semantics

@pytest.mark.parametrize('name', ['factconsolidation_sh', 'factconsolidation_mh'])
def test_factconsolidation_newest_serial_wins(name):
    n_conflict = n_total = 0
    for row in cached(name, tokens=8192, n=40):
        ctx = row['context']
        lines = ctx.split('\n')
        assert lines[0] == FC_HEADER
        assert [l.split('. ', 1)[0] for l in lines[1:]] == [str(i) for i in range(len(lines) - 1)]
        facts = fc_facts(ctx)
        assert len(facts) == len(lines) - 1                               # every line is a parsed fact
        for q, a in zip(row['questions'], row['answers']):
            assert fc_answer(ctx, q) == {a[0]}                            # the newest serial's object, uniquely
            stale = fc_answer(ctx, q, newest=False)
            n_total += 1
            if stale != {a[0]}:
                n_conflict += 1
                assert a[0] not in stale and stale                       # the older conflicting fact is there too
    assert 0.5 * n_total <= n_conflict <= n_total


def test_factconsolidation_sh_override_order_explicit():
    row = cached('factconsolidation_sh', tokens=8192, n=40)[0]
    by_key = {}
    for serial, rel, s, o in fc_facts(row['context']): by_key.setdefault((rel, s), []).append((serial, o))
    edited = 0
    for q, a in zip(row['questions'], row['answers']):
        (rel, s), = [(r, m['s']) for r, f in FC_RELATIONS.items()
                     if (m := re.fullmatch(re.escape(f.ask).replace(re.escape('{s}'), '(?P<s>.+)'), q)) and (r, m['s']) in by_key]
        versions = by_key[(rel, s)]
        assert versions == sorted(versions) and versions[-1][1] == a[0]   # largest serial = gold
        if len(versions) > 1:
            edited += 1
            assert all(o != a[0] for _, o in versions[:-1])
            assert FC_RELATIONS[rel].fact.format(s=s, o=versions[0][1]) in row['context']
    assert edited >= 10


def test_factconsolidation_mh_chains_two_facts():
    row = cached('factconsolidation_mh', tokens=8192, n=40)[0]
    for q, a in zip(row['questions'], row['answers']):
        nps = [f.np for f in FC_RELATIONS.values() if f.np]               # a chained noun phrase is the subject
        assert any(re.search(re.escape(np).replace(re.escape('{s}'), '.+'), q) for np in nps)
        assert a[0] not in q and len(fc_answer(row['context'], q)) == 1


# ------------------------------------------------------------------------------------------- loader

def test_the_mab_loader_reads_synthetic_rows(tmp_path):
    mab = pytest.importorskip('memlab.protocols.mab.data')
    rows = [r for name in FAMILIES for r in make_mab(name, n_contexts=1, questions_per_context=nq(name, 3),
                                                      context_tokens=4096, seed=0)]
    p = write_rows(rows, tmp_path / 'synthetic.json', entity2id=recsys_entity2id())
    insts = mab.load_memoryagentbench(p, sha256=False)
    assert len(insts) == len(rows)
    assert [len(i.queries) for i in insts] == [len(r['questions']) for r in rows]


# ------------------------------------------------------------------------- issue 22: second phrasing sets

PHRASED_B = ('icl_banking77', 'icl_clinic150', 'icl_nlu', 'icl_trec_coarse', 'icl_trec_fine', 'recsys_redial', 'infbench_sum')


@pytest.mark.parametrize('name', PHRASED_B)
def test_phrasing_a_is_the_default_and_b_is_other_text(name):
    "phrasing='a' is the default output; 'b' shares no example/dialogue/event sentence with 'a' (the same seed)."
    a, b = rows_of(name, n_contexts=1), rows_of(name, n_contexts=1, phrasing='b')
    assert rows_of(name, n_contexts=1, phrasing='a') == a
    if name == 'infbench_sum':                                                 # the key points (the narrative filler is shared)
        ka, kb = a[0]['metadata']['keypoints'], b[0]['metadata']['keypoints']
        assert not set(ka) & set(kb) and not [k for k in kb if k in a[0]['context']]
    else:
        split = lambda r: {l.split(': ', 1)[-1] for d in r['context'].split('\n\n') for l in d.split('\n') if 'Label' not in l}
        assert not split(a[0]) & split(b[0]), sorted(split(a[0]) & split(b[0]))[:10]
        assert not set(a[0]['questions']) & set(b[0]['questions'])
    with pytest.raises(ValueError, match='unknown phrasing'): rows_of(name, n_contexts=1, phrasing='c')


@pytest.mark.parametrize('name', sorted(INTENT_SETS))
def test_icl_phrasing_b_same_labels(name):
    "Phrasing 'b' keeps the label inventory: every example and question maps to its own label by the 'b' keys."
    for row in rows_of(f'icl_{name}', seed=5, phrasing='b'):
        pairs = [e.rsplit('\nLabel: ', 1) for e in row['context'].split('\n\n')]
        assert {int(n) for _, n in pairs} == set(range(INTENT_SETS[name].n_labels))
        assert all(icl_label_of(name, s, 'b') == int(n) for s, n in pairs)
        assert all(icl_label_of(name, q, 'b') == int(a[0]) for q, a in zip(row['questions'], row['answers']))


def test_recsys_phrasing_b_gold_in_context():
    cat = {i: (t, y) for i, t, y, _ in recsys_catalogue()}
    for row in rows_of('recsys_redial', seed=5, phrasing='b'):
        dialogs = row['context'].split('\n\n')
        assert all(d.startswith('Seeker: ') for d in dialogs)
        for q, a in zip(row['questions'], row['answers']):
            gold = [movie_mention(*cat[int(g)]) for g in a]
            assert any(all(any(x.startswith('Recommender: ') and g in x for x in d.split('\n')) for g in gold) for d in dialogs)
