"""The section notebooks run the real memory systems (issue 28: "each section notebook accepts these systems in its
`memories` parameter"): the walkthrough (`extra_memories`) and SubtleMemory (`memories`) with mem0 and Graphiti next to
bm25, `memory_model='scripted'` served by the loopback server, the answers by the offline reader; MemTrace, the scale
ladders and MemoryAgentBench (`agents`) likewise at tiny sizes.

One loopback server answers both systems' own prompts (mem0's extraction prompt, Graphiti's structured-output prompts)
with the scripted responders of tests/test_system_mem0.py and tests/test_system_graphiti.py, so their real extraction
paths run inside the section's kernel. The kernel is this interpreter (papermill's `python3` kernel runs
`sys.executable`), with a `sitecustomize` whose audit hook records every file opened for writing outside the test's
folder and every connection to a host other than 127.0.0.1 (refused). Checked: no error rows, the construction cost
table lists mem0 and Graphiti with LLM calls and sessions (bm25: 0 calls), the calls the table counts are the requests
the server saw, nothing written outside the folder, no other host. Skipped where mem0ai or graphiti-core is not
installed (the main venv); run with `.venv-systems/bin/python -m pytest tests/test_system_sections.py`.
"""
import json, os, re, sys, textwrap
from pathlib import Path
import pandas as pd
import pytest

pytest.importorskip('mem0', reason='mem0ai is not installed (pip install memlab[mem0])')
pytest.importorskip('graphiti_core', reason='graphiti-core is not installed (the graphiti extra)')
pytest.importorskip('kuzu', reason='kuzu is not installed (the graphiti extra)')

from loopback import LoopbackServer, Reply, _user_texts
from section_runner import papermill_section
from test_system_mem0 import mem0_responder
from test_system_graphiti import graphiti_responder, _block, _title
from memlab.memory import MEMORIES
from memlab.registry import load_plugins

load_plugins()
SYSTEMS = ('mem0', 'graphiti')

def summaries(u: str) -> Reply:
    "Graphiti's entity summaries (`SummarizedEntities`, asked when an episode is long enough): each entity's sentences of the messages."
    msgs = []
    for line in filter(str.strip, _block(u, 'MESSAGES').splitlines()):   # previous episodes (a JSON list), this one (a JSON string)
        try: v = json.loads(line)
        except ValueError: v = line
        msgs += [str(x) for x in v] if isinstance(v, list) else [str(v)]
    msgs = ' '.join(msgs)
    out = []
    for e in json.loads(_block(u, 'ENTITIES') or '[]'):
        said = [x for x in re.split(r'(?<=[.!?])\s+', msgs) if e.get('name') and e['name'] in x]
        if said: out.append({'name': e['name'], 'summary': ' '.join(said)[:240]})
    return Reply(content=json.dumps({'summaries': out}))

def resolutions(u: str) -> Reply:
    "Graphiti's entity dedupe (`NodeResolutions`, asked when an extracted name is close to a stored one): the same name is the same entity."
    existing = {e['name'].lower(): e['candidate_id'] for e in json.loads(_block(u, 'EXISTING ENTITIES') or '[]')}
    return Reply(content=json.dumps({'entity_resolutions': [{'id': e['id'], 'name': e['name'], 'duplicate_candidate_id': existing.get(e['name'].lower(), -1)}
                                                            for e in json.loads(_block(u, 'ENTITIES') or '[]')]}))

def responder(kind, req):
    "mem0's extraction prompt to mem0's scripted answer, Graphiti's to its (it fails loudly on a prompt it does not know)."
    msgs = req.get('messages') or [{}]
    if 'Your sole operation is ADD' in str(msgs[0].get('content', '')): return mem0_responder(kind, req)
    u = _user_texts(kind, req)[-1]
    if _title(u) == 'SummarizedEntities': return summaries(u)
    if _title(u) == 'NodeResolutions': return resolutions(u)
    return graphiti_responder(kind, req)

SITE = '''
import os, sys, json
_ALLOW = tuple(os.environ['AUDIT_ALLOW'].split(os.pathsep))
_LOG, _busy = os.environ['AUDIT_LOG'], []
def _log(kind, what):
    _busy.append(1)
    try:
        with open(_LOG, 'a') as f: f.write(json.dumps([kind, str(what)]) + '\\n')
    finally: _busy.pop()
def _hook(event, args):
    if _busy: return
    if event == 'open' and args[0] is not None and not isinstance(args[0], int):
        mode, flags = args[1] or '', args[2] or 0
        if any(c in str(mode) for c in 'wax+') or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            p = os.path.realpath(os.fsdecode(args[0]))
            if not p.startswith(_ALLOW): _log('write', p)
    elif event in ('os.mkdir', 'os.rename', 'os.remove', 'shutil.rmtree', 'sqlite3.connect'):
        p = args[1] if event == 'os.rename' else args[0]                     # rename: where it goes
        fd = {'os.mkdir': 2, 'os.remove': 1, 'os.rename': 3}.get(event)       # a path relative to a directory descriptor
        base = os.readlink(f'/proc/self/fd/{args[fd]}') if fd is not None and len(args) > fd and isinstance(args[fd], int) and args[fd] >= 0 else None
        if isinstance(p, (str, bytes, os.PathLike)) and os.fsdecode(p) != ':memory:':
            p = os.path.realpath(os.path.join(base, os.fsdecode(p)) if base else os.fsdecode(p))
            if not (p + os.sep).startswith(_ALLOW): _log(event, p)
    elif event == 'socket.connect' and isinstance(args[1], tuple) and args[1][0] not in ('127.0.0.1', 'localhost', '::1'):
        _log('connect', args[1]); raise OSError(f'network refused in test: {args[1]}')
    elif event == 'socket.getaddrinfo' and args[0] not in (None, '127.0.0.1', 'localhost', '::1', b'127.0.0.1', b'localhost'):
        _log('getaddrinfo', args[0]); raise OSError(f'name lookup refused in test: {args[0]}')
sys.addaudithook(_hook)
'''

@pytest.fixture
def sandbox(tmp_path):
    "(environment for the papermill run, its output folder, the audit log): every writable place under tmp_path."
    site, log = tmp_path / 'site', tmp_path / 'audit.jsonl'
    site.mkdir(); (site / 'sitecustomize.py').write_text(textwrap.dedent(SITE)); log.touch()
    dirs = {v: tmp_path / n for v, n in [('HOME', 'home'), ('TMPDIR', 'tmp'), ('XDG_CACHE_HOME', 'cache'), ('XDG_CONFIG_HOME', 'config'),
            ('XDG_DATA_HOME', 'data'), ('MPLCONFIGDIR', 'mpl'), ('IPYTHONDIR', 'ipython'), ('JUPYTER_RUNTIME_DIR', 'runtime'),
            ('JUPYTER_DATA_DIR', 'jdata'), ('HF_HOME', 'hf')]}
    for d in dirs.values(): d.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(('MEMLAB_', 'MEM0_', 'OPENAI_', 'ANTHROPIC_'))}
    env.update({k: str(v) for k, v in dirs.items()}, MEMLAB_OUT=str(tmp_path / 'out'), MEMLAB_CACHE=str(tmp_path / 'cache.sqlite'),
               MEMLAB_PROGRESS='0', PYTHONDONTWRITEBYTECODE='1', PYTHONPATH=os.pathsep.join([str(site), env.get('PYTHONPATH', '')]).rstrip(os.pathsep),
               AUDIT_ALLOW=os.pathsep.join([str(tmp_path.resolve()) + os.sep, '/dev/', '/proc/']), AUDIT_LOG=str(log),
               OPENAI_API_KEY='sk-loopback-unused')
    return env, tmp_path / 'out', log

def audited(log: Path) -> list:
    return [json.loads(l) for l in log.read_text().splitlines()]

def check_costs(out: Path, section: str, srv, systems=SYSTEMS):
    "The construction cost table: each system built with calls and sessions, bm25 with none; the calls it counts are the server's requests."
    cc = pd.read_csv(out / 'results' / section / 'construction_costs.csv').set_index('memory')
    row = {m: next(i for i in cc.index if i.split('[')[0] == m) for m in ('bm25', *systems)}
    for m in systems:
        assert cc.loc[row[m], 'llm_calls'] > 0 and cc.loc[row[m], 'sessions'] > 0 and cc.loc[row[m], 'failed_units'] == 0, cc
        assert f'scripted@127.0.0.1:{srv.port}' in row[m]                       # the memory's model is named in its label
    assert cc.loc[row['bm25'], 'llm_calls'] == 0 and cc.loc[row['bm25'], 'input_tokens'] == 0
    mem0_calls = sum('Your sole operation is ADD' in str((r.get('messages') or [{}])[0].get('content', '')) for r in srv.requests)
    sent = {m: cc.loc[row[m], 'llm_calls'] - cc.loc[row[m], 'cached_calls'] for m in systems}   # a rebuild (no snapshot) reads the cache
    assert sent['mem0'] == mem0_calls > 0 and sum(sent.values()) == srv.n_requests, (sent, mem0_calls, srv.n_requests)
    return cc

def check_clean(log: Path, srv):
    bad = audited(log)
    assert bad == [], bad[:10]                                                   # no write outside tmp_path, no other host
    assert srv.n_requests > 0 and all(h.get('host', '').startswith('127.0.0.1:') for h in srv.headers)

def errors(out: Path, section: str) -> int:
    from memlab.store import ResultsStore
    stores = [ResultsStore(p) for p in (out / 'results' / section / 'runs').iterdir()]
    return sum(int(s.rollouts(columns=['error'])['error'].notna().sum()) for s in stores)

def report(cc, label):
    print(f'\n{label}:\n' + cc[['units', 'sessions', 'llm_calls', 'input_tokens', 'output_tokens', 'ingest_s', 's_per_session',
                               'calls_per_session']].round(3).to_string())


def served_run(sandbox, tmp_path, section: str, *params, systems=SYSTEMS):
    "papermill-run a section against the loopback (the systems built with its scripted model): no error rows, costs counted, nothing leaked; (output folder, cost table)."
    env, out, log = sandbox
    with LoopbackServer('openai', responder=responder) as srv:
        r = papermill_section(section, tmp_path / f'{section}.ipynb', env, *params, ('memory_model', 'scripted'), ('base_url', srv.url), timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        assert errors(out, section) == 0
        cc = check_costs(out, section, srv, systems)
        check_clean(log, srv)
    return out, cc


def test_walkthrough_runs_mem0_and_graphiti_next_to_bm25(sandbox, tmp_path):
    out, cc = served_run(sandbox, tmp_path, 'walkthrough', ('n_instances', 1), ('queries_per_instance', 5), ('n_filler', 4),
                         ('n_resamples', 50), ('extra_memories', ['mem0', 'graphiti']))
    acc = pd.read_csv(out / 'results' / 'walkthrough' / 'accuracy.csv')
    assert {m.split('[')[0] for m in acc['memory']} == {'bm25', 'long-context', 'mem0', 'graphiti'} and (acc['n'] == 5).all()
    mc = pd.read_csv(out / 'results' / 'walkthrough' / 'mcnemar.csv')
    assert (mc['system_a'] == 'bm25[k=12]').all() and len(mc) == 3                  # each other memory against bm25
    report(cc, f'walkthrough construction')


def test_subtlememory_runs_mem0_and_graphiti_next_to_bm25(sandbox, tmp_path):
    out, cc = served_run(sandbox, tmp_path, 'subtlememory', ('n_personas', 1), ('n_unrelated', 3), ('turns', 2), ('tiers', ['strong']),
                         ('memories', ['bm25', 'mem0', 'graphiti']), ('k', 5), ('n_resamples', 50))
    wf = pd.read_csv(out / 'results' / 'subtlememory' / 'waterfall.csv')
    assert {'mem0', 'graphiti'} <= {m.split('[')[0] for m in wf['memory']}          # both in the perfect-retrieval waterfall
    report(cc, f'subtlememory construction')


OTHERS = {   # the other sections at tiny sizes (one system each where the section's run is slow)
    'memtrace': ([('n_users', 1), ('n_sessions', 8), ('memories', ['bm25', 'mem0', 'graphiti']), ('tiers', ['strong']), ('n_reach', 20),
                  ('n_oracle', 5), ('n_resamples', 50)], SYSTEMS),
    'scale_ladder': ([('memories', ['bm25', 'mem0']), ('tiers', ['strong']), ('ladder', [0, 4]), ('n_queries', 4), ('pool_size', 10),
                      ('n_resamples', 20)], ('mem0',)),
    'memoryagentbench': ([('agents', ['bm25', 'mem0']), ('families', ['ruler_qa1']), ('ablation_families', ['ruler_qa1']), ('topk_ablation', [2]),
                          ('chunk_sizes', [512]), ('context_lengths', [2000]), ('context_tokens', 2000), ('questions_per_context', 3),
                          ('n_resamples', 50)], ('mem0',)),
}

@pytest.mark.parametrize('section', list(OTHERS))
def test_the_other_sections_accept_the_systems(section, sandbox, tmp_path):
    "MemTrace (a memory per window: mem0 snapshotted, Graphiti rebuilt), the scale ladders and MemoryAgentBench with a system next to bm25."
    params, systems = OTHERS[section]
    out, cc = served_run(sandbox, tmp_path, section, *params, systems=systems)
    if section == 'memtrace':   # mem0 is snapshotted per window: it ingests the user's sessions once; Graphiti has no snapshot
        mem0 = next(i for i in cc.index if i.startswith('mem0'))
        assert cc.loc[mem0, 'sessions'] == 8 and cc.loc[mem0, 'units'] == 8
    report(cc, f'{section} construction')


def test_a_system_without_memory_model_stops_the_walkthrough_before_any_work(sandbox, tmp_path):
    env, out, log = sandbox
    r = papermill_section('walkthrough', tmp_path / 'wt.ipynb', env, ('extra_memories', ['mem0']), timeout=300)
    assert r.returncode != 0
    assert "extra_memories: 'mem0' builds its memory with a model: set memory_model" in r.stderr, r.stderr[-2000:]
    assert not out.exists()                                                      # nothing written
    r = papermill_section('walkthrough', tmp_path / 'wt2.ipynb', env, ('extra_memories', ['mem9']), timeout=300)
    assert r.returncode != 0 and 'extra_memories: must be a list of registered memories' in r.stderr and not out.exists()


@pytest.mark.parametrize('memories', [['mem0'], ['bm25', 'graphiti']])
def test_param_classes_refuse_a_system_without_memory_model(memories, monkeypatch, tmp_path):
    "SubtleMemory, MemTrace, the scale ladders and MemoryAgentBench: one line naming memories (agents) and memory_model, before any work."
    from memlab.protocols.subtle.protocol import check_params as subtle
    from memlab.protocols.memtrace.protocol import check_params as memtrace
    from memlab.protocols.scale.protocol import check_params as scale
    from memlab.protocols.mab.section import MABSection
    assert all(MEMORIES[m].needs_llm for m in SYSTEMS)
    name = [m for m in memories if m in SYSTEMS][0]
    out = tmp_path / 'out'
    for check, param in [(subtle, 'memories'), (memtrace, 'memories'), (scale, 'memories'),
                         (lambda **kw: MABSection(agents=kw['memories'], out_root=str(out)), 'agents')]:
        with pytest.raises(ValueError) as e: check(memories=memories)
        msg = str(e.value)
        assert f"parameter {param}: {name!r} builds its memory with a model: set memory_model" in msg and '\n' not in msg, msg
    assert not out.exists()                                                      # MemoryAgentBench: refused before its folders
    P = subtle(memories=memories, memory_model='m', base_url='http://127.0.0.1:9/v1')
    spec = next(s for s in P.memory_specs() if s['name'] == name)
    assert spec['llm'] == {'name': 'openai', 'model': 'm', 'base_url': 'http://127.0.0.1:9/v1', 'concurrency': 8, 'timeout': 60.0}
