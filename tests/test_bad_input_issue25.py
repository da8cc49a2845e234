"""Issue 25, section 3 ("Bad input still mishandled") and two items of 3b: each case failed on the code before the fix.

The bad input rule: one line `memlab: <file>: <record>: field '<field>': ...`, exit 2, and nothing written, before any
work starts. Before the fix:
- `k: 100000000000000000000`: exit 1, a pyarrow OverflowError traceback, `manifest.json` left behind (every integer
  argument is now bounded by `memlab.registry.MAX_INT`, annotated or not; `seed`, `dataset.limit`, conditions too);
- synthetic `n_instances: 2, queries_per_instance: 20, n_filler: 10`: exit 1, a traceback ("no fact slot left") (now
  `memlab.synth.question_plan_problem`, run by `check_dataset_spec` with the config's file name); likewise a `start`
  that is no date, an empty `qtypes` and a `session_turns` range with low > high (strptime, modulo-by-zero and
  randrange tracebacks: now refused by the generators' annotations);
- `memlab data inspect halumem`: a user with no sessions, sessions out of time order, a session ending before it starts:
  exit 0, nothing reported;
- `memlab data inspect subtlememory`: a `case_id` no session carries: exit 0;
- SubtleMemory `personas: ['../../etc']` passed the section's first-cell check (refused only at load);
- MemTrace with a judge that never returns the rubric's JSON died in a table writer (`save_table needs the policy
  labels of the data`); now one RuntimeError line counting the unparsed verdicts;
- the SubtleMemory judge's output limit: none by default (the repository's), bounded and sent when given.
"""
import copy, json, re, shutil
from pathlib import Path

import pytest
import yaml

from inproc import memlab_main

FX = Path(__file__).parent / 'fixtures'
BASE = dict(name='issue25', section='reliability', policies=[{'name': 'offline-reader', 'tier': 'weak'}],
            memories=[{'name': 'bm25', 'k': 12}],
            dataset={'kind': 'synthetic', 'params': {'n_instances': 2, 'queries_per_instance': 2, 'n_filler': 2}})
HUGE = 10**20

def _one_line_exit_2(r: dict, *patterns: str):
    lines = r['out'].strip().splitlines()
    assert r['rc'] == 2 and len(lines) == 1 and lines[0].startswith('memlab: ') and 'Traceback' not in r['out'], r['out']
    for p in patterns: assert re.search(p, lines[0]), (p, lines[0])


# ------------------------------------------------------------------------------------------------ memlab run
RUN_CASES = {   # name: (config change, patterns of the one line)
    'k-huge':          (lambda c: dict(c, memories=[{'name': 'bm25', 'k': HUGE}]),
                        [r"field 'memories\.0\.k': Input should be less than or equal to 2147483647"]),
    'window-huge':     (lambda c: dict(c, memories=[{'name': 'long-context', 'window_tokens': HUGE}]), [r"field 'memories\.0\.window_tokens'"]),
    'k-huge-negative': (lambda c: dict(c, memories=[{'name': 'bm25', 'k': -HUGE}]), [r"field 'memories\.0\.k'"]),
    'seed-huge':       (lambda c: dict(c, seed=HUGE), [r"field 'seed': Input should be less than or equal to 2147483647"]),
    'condition-huge':  (lambda c: dict(c, conditions=[{'budget': HUGE}]), [r"field 'conditions\.0\.budget'"]),
    'limit-huge':      (lambda c: dict(c, dataset=dict(c['dataset'], limit=HUGE)), [r"field 'dataset\.limit'"]),
    'params-huge':     (lambda c: dict(c, dataset={'kind': 'synthetic', 'params': {'n_filler': HUGE}}), [r"field 'dataset\.params\.n_filler'"]),
    'history-arg-huge': (lambda c: dict(c, history={'name': 'split', 'unit': 'batch', 'n': HUGE}), [r"field 'history\.n': Input should be less"]),
    'synthetic-infeasible': (lambda c: dict(c, dataset={'kind': 'synthetic', 'params': {'n_instances': 2, 'queries_per_instance': 20, 'n_filler': 10}}),
                             [r"field 'dataset\.params\.queries_per_instance': 4 'knowledge-update' questions", r"at most 16 questions per history"]),
    'synthetic-no-sessions': (lambda c: dict(c, dataset={'kind': 'synthetic', 'params': {'queries_per_instance': 2, 'n_filler': 0, 'qtypes': ['abstention']}}),
                              [r"field 'dataset\.params\.queries_per_instance'.*no filler session"]),
    'synthetic-bad-start':   (lambda c: dict(c, dataset={'kind': 'synthetic', 'params': {'start': 'yesterday'}}),
                              [r"field 'dataset\.params\.start': Value error, 'yesterday' is not a date like"]),
    'synthetic-no-qtypes':   (lambda c: dict(c, dataset={'kind': 'synthetic', 'params': {'qtypes': []}}),
                              [r"field 'dataset\.params\.qtypes': Value error, name at least one question type"]),
    'synthetic-turns-range': (lambda c: dict(c, dataset={'kind': 'synthetic', 'params': {'session_turns': [5, 2]}}),
                              [r"field 'dataset\.params\.session_turns': .*a \(low, high\) range needs low <= high"]),
    'subtle-personas-escape': (lambda c: dict(c, dataset={'kind': 'subtlememory', 'personas': ['../../etc'], 'n_unrelated': 2}),
                               [r"field 'dataset\.personas\.0': String should match pattern"]),
}

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp('issue25'); out = {}
    for name, (change, _) in RUN_CASES.items():
        cfg = root / f'{name}.yaml'; cfg.write_text(yaml.safe_dump(change(copy.deepcopy(BASE))))
        store = root / f'store-{name}'
        out[name] = dict(memlab_main(['run', cfg, '--store', store]), cfg=cfg, store=store)
    return out

@pytest.mark.parametrize('name', list(RUN_CASES))
def test_run_refuses_before_any_work(runs, name):
    r = runs[name]
    _one_line_exit_2(r, re.escape(str(r['cfg'])) + ': ', *RUN_CASES[name][1])
    assert not r['store'].exists(), f"{r['store']} was written for a bad config"

def test_the_largest_bounded_values_still_run(tmp_path):
    "The bound is not a ban: k = MAX_INT and 16 questions per history (the most five types allow) run."
    from memlab.registry import MAX_INT
    cfg = tmp_path / 'ok.yaml'
    cfg.write_text(yaml.safe_dump(dict(BASE, memories=[{'name': 'bm25', 'k': MAX_INT}], seed=MAX_INT,
                                       dataset={'kind': 'synthetic', 'params': {'n_instances': 1, 'queries_per_instance': 16, 'n_filler': 1}})))
    r = memlab_main(['run', cfg, '--store', tmp_path / 'store'])
    assert r['rc'] == 0 and '16 rollouts' in r['out'], r['out']

def test_every_plan_the_check_accepts_is_built():
    "400 random question plans, three seeds each: a plan `question_plan_problem` accepts is built for every seed."
    import random
    from memlab.synth import QTYPES, make_history, question_plan_problem
    rng, accepted, refused = random.Random(0), 0, 0
    for t in range(400):
        qt = tuple(rng.choice(QTYPES) for _ in range(rng.randint(1, 6))); n = rng.randint(1, 25); ph = rng.choice('ab'); nf = rng.choice([0, 1, 3])
        if question_plan_problem(n, qt, ph, nf) is not None:
            refused += 1
            with pytest.raises(ValueError): make_history(n, n_filler=nf, seed=t, qtypes=qt, phrasing=ph)
            continue
        for seed in range(3): assert len(make_history(n, n_filler=nf, seed=7 * t + seed, qtypes=qt, phrasing=ph).queries) == n, (qt, n, ph, nf)
        accepted += 1
    assert accepted > 100 and refused > 100, (accepted, refused)


# ------------------------------------------------------------------------------------------------ memlab data inspect
def _halumem(tmp_path, change) -> Path:
    recs = [json.loads(l) for l in (FX / 'halumem_medium.jsonl').read_text().splitlines()]
    change(recs); p = tmp_path / 'HaluMem-Medium.jsonl'
    p.write_text('\n'.join(json.dumps(r) for r in recs) + '\n'); return p

def _swap_starts(rs): s = rs[0]['sessions']; s[1]['start_time'], s[2]['start_time'] = s[2]['start_time'], s[1]['start_time']
def _reorder(rs): s = rs[0]['sessions']; s[1], s[2] = s[2], s[1]
def _invert(rs): s = rs[1]['sessions'][3]; s['start_time'], s['end_time'] = s['end_time'], s['start_time']

@pytest.mark.parametrize('change,pats', [
    (lambda rs: rs[1].update(sessions=[]), [r"record 1 \(uuid=[^)]+\): field 'sessions': the user has no sessions"]),
    (_swap_starts, [r"record 0 \(uuid=[^)]+\): field 'sessions\.1\.end_time': .* is before the session's start_time"]),
    (_reorder, [r"record 0 \(uuid=[^)]+\): field 'sessions\.2\.start_time': .* is before session 1's start_time"]),
    (_invert, [r"record 1 \(uuid=[^)]+\): field 'sessions\.3\.end_time'"]),
], ids=['no-sessions', 'start-times-swapped', 'sessions-reordered', 'end-before-start'])
def test_inspect_halumem_refuses(tmp_path, change, pats):
    p = _halumem(tmp_path, change)
    _one_line_exit_2(memlab_main(['data', 'inspect', 'halumem', p]), re.escape(str(p)) + ': ', *pats)

def test_inspect_halumem_long_number_names_the_limit(tmp_path):
    "A 6,000-digit number: one line naming its size, without Python's advice to call sys.set_int_max_str_digits()."
    p = tmp_path / 'HaluMem-Medium.jsonl'
    p.write_text((FX / 'halumem_medium.jsonl').read_text().replace('"index": 1', '"index": ' + '9' * 6000, 1))
    r = memlab_main(['data', 'inspect', 'halumem', p])
    _one_line_exit_2(r, r'6000 digits')
    assert 'set_int_max_str_digits' not in r['out'], r['out']

def test_inspect_subtlememory_case_id_pointing_at_nothing(tmp_path):
    shutil.copytree(FX / 'subtlememory' / 'persona_0', tmp_path / 'persona_0')
    bi = tmp_path / 'persona_0' / 'bench_instances.json'; recs = json.loads(bi.read_text())
    recs[3]['case_id'] = 'no-such-case'; bi.write_text(json.dumps(recs))
    _one_line_exit_2(memlab_main(['data', 'inspect', 'subtlememory', tmp_path]),
                     re.escape(str(bi)) + rf": record 3 \(instance_id={re.escape(recs[3]['instance_id'])}\): field 'case_id': 'no-such-case' is the case_id of no session")
    assert memlab_main(['data', 'inspect', 'subtlememory', FX / 'subtlememory'])['rc'] == 0   # the unbroken fixture


# ------------------------------------------------------------------------------------------------ section parameters
@pytest.mark.parametrize('personas,pat', [(['../../etc'], r"subtlememory parameter personas\.0: String should match pattern"),
                                          (['persona_0/../..'], r"subtlememory parameter personas\.0"),
                                          (['persona_7'], r"personas: \['persona_7'\] not in the data \(it has \['persona_0', 'persona_1'\]\)")])
def test_subtle_first_cell_refuses_personas(personas, pat):
    from memlab.protocols.subtle.protocol import check_params
    with pytest.raises(ValueError, match=pat): check_params(personas=personas)

def test_subtle_released_personas_are_checked_in_the_first_cell():
    from memlab.protocols.subtle.protocol import check_params
    with pytest.raises(ValueError, match=r"personas: \['persona_1'\] not in the data \(it has \['persona_0'\]\)"):
        check_params(dataset='released', data_path=str(FX / 'subtlememory'), personas=['persona_1'])
    assert check_params(dataset='released', data_path=str(FX / 'subtlememory'), personas=['persona_0']).personas == ['persona_0']


# ------------------------------------------------------------------------------------------------ 3b: model judges
def test_memtrace_unparsed_judge_is_one_line(tmp_path, monkeypatch):
    "Every verdict unparsed (a small model that never writes the rubric's JSON): one RuntimeError line, not a table writer's ValueError."
    import memlab.protocols.memtrace.section as S
    from memlab.protocols.memtrace.protocol import check_params
    from memlab.protocols.memtrace.scoring import MemTraceLLMJudge
    p = check_params(n_users=1, n_sessions=10, memories=['bm25'], tiers=['strong'], n_reach=30, n_oracle=5, n_resamples=50)
    data_spec, insts, probes = S.load_windows(p)
    monkeypatch.setattr(S, 'build_judge', lambda spec: MemTraceLLMJudge(complete=lambda m: 'Sure, that is correct!', model='smollm2'))
    with pytest.raises(RuntimeError) as e: S.run_scored(p, S.run_config(p, data_spec), insts, probes, tmp_path / 'runs', progress=False)
    msg = str(e.value)
    assert '\n' not in msg and re.search(rf"no response has a verdict \(0 errors, {len(probes)} unparsed verdicts of judge memtrace-llm \(smollm2\)\)", msg), msg
    assert 'memlab show' in msg and '--failed' in msg

def test_subtle_judge_output_limit():
    "None by default (llm_judge.py sends none), sent with every request when given, refused unless a positive bounded int."
    from memlab.core import RecordError
    from memlab.config import RunConfig
    from memlab.protocols.subtle.judge import SubtleLLMJudge
    from memlab.protocols.subtle.data import load_subtlememory
    q = next(q for q in load_subtlememory(FX / 'subtlememory')[0].queries if q.qtype == 'contradictory')
    sent = []
    def complete(messages, **params): sent.append(params); return '{"reason": "r", "label": "WRONG"}'
    complete.takes_params = True
    SubtleLLMJudge(complete)('r1', q, 'I could not say.'); SubtleLLMJudge(complete, max_tokens=256)('r2', q, 'I could not say.')
    assert sent == [{'temperature': 0.0}, {'temperature': 0.0, 'max_tokens': 256}], sent
    cfg = dict(BASE, judge={'name': 'subtlememory-llm', 'max_tokens': HUGE, 'backend': {'name': 'openai', 'model': 'm', 'base_url': 'http://127.0.0.1:9/v1'}})
    with pytest.raises(RecordError, match=r"field 'judge\.max_tokens': Input should be less than or equal to 2147483647"): RunConfig.load(cfg)
    with pytest.raises(RecordError, match=r"field 'judge\.max_tokens': Input should be greater than or equal to 1"):
        RunConfig.load(dict(cfg, judge=dict(cfg['judge'], max_tokens=0)))
    assert RunConfig.load(dict(cfg, judge=dict(cfg['judge'], max_tokens=512))).judge['max_tokens'] == 512


def test_section_integer_parameters_are_bounded():
    "PosInt / NonNegInt (memlab.core) carry the registry's bound, so every section parameter typed with them refuses 10**20 in one line."
    from memlab.protocols.memtrace.protocol import check_params
    with pytest.raises(ValueError) as e: check_params(n_sessions=10**20)
    assert len(str(e.value).splitlines()) == 1 and 'n_sessions' in str(e.value) and '2147483647' in str(e.value), str(e.value)
