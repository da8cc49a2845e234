"""memlab's layout: the harness (every module outside `memlab.protocols`) knows no paper, and nothing imports in a circle.

The graph is read with `ast` from the installed sources, every `import` counted wherever it stands (a function-level
import is still a dependency). Protocol packages reach the harness through its registries and the `memlab.plugins`
entry points, never the other way round.
"""
import ast, graphlib
from pathlib import Path

import pytest

import memlab

PKG = Path(memlab.__file__).parent
PROTOCOLS = 'memlab.protocols'


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imports(path: Path, name: str, modules: set) -> set:
    "The memlab modules `path` imports (relative imports resolved; `from pkg import mod` counted as the module)."
    pkg = name if path.name == '__init__.py' else name.rpartition('.')[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import): targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                up = pkg.split('.')[:len(pkg.split('.')) - (node.level - 1)]
                base = '.'.join(up + ([base] if base else []))
            targets = [f'{base}.{a.name}' if f'{base}.{a.name}' in modules else base for a in node.names]
        else: continue
        for t in targets:
            while t and t not in modules: t = t.rpartition('.')[0]   # `import memlab.protocols.mab.data` -> that module
            if t and t != 'memlab' and t != name: out.add(t)
    return out


@pytest.fixture(scope='module')
def graph() -> dict:
    files = {module_name(p): p for p in PKG.rglob('*.py')}
    return {m: imports(p, m, set(files)) for m, p in files.items()}


def test_layout(graph):
    assert {'memlab.protocols.scale.ladder', 'memlab.protocols.mab.data', 'memlab.runner'} <= set(graph)
    flat = [m for m in graph if m.count('.') == 1 and any(k in m for k in ('mab', 'ladder', 'scale'))]
    assert not flat, f'paper modules outside memlab.protocols: {flat}'


def test_no_import_cycles(graph):
    try: graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e: pytest.fail(f'import cycle: {" -> ".join(e.args[1])}')


def test_harness_imports_no_protocol(graph):
    bad = sorted((m, t) for m, ts in graph.items() if not m.startswith(PROTOCOLS) for t in ts if t.startswith(PROTOCOLS))
    assert not bad, f'harness modules importing protocol modules: {bad}'


def test_the_checker_sees_cycles_and_protocol_imports(tmp_path):
    "The reader of the graph is not blind: a planted cycle and a planted harness->protocol import are found."
    pkg = tmp_path / 'memlab'; (pkg / 'protocols' / 'p').mkdir(parents=True)
    for f, text in {'__init__.py': '', 'a.py': 'from .b import x\n', 'b.py': 'def f():\n    import memlab.a\n',
                    'protocols/__init__.py': '', 'protocols/p/__init__.py': '', 'protocols/p/m.py': 'from memlab.a import y\n',
                    'c.py': 'from memlab.protocols.p import m\n'}.items():
        (pkg / f).write_text(text)
    global PKG
    old, PKG = PKG, pkg
    try:
        files = {module_name(p): p for p in pkg.rglob('*.py')}
        g = {m: imports(p, m, set(files)) for m, p in files.items()}
    finally: PKG = old
    assert g['memlab.a'] == {'memlab.b'} and g['memlab.b'] == {'memlab.a'} and g['memlab.c'] == {'memlab.protocols.p.m'}
    with pytest.raises(graphlib.CycleError): graphlib.TopologicalSorter(g).prepare()


# The runner's rooms (issue 24): the results store is the bottom; scoring reads the store; config and sections know no
# executor; the executor (memlab.runner) sits on top and re-exports their public names.
BELOW = {'memlab.store': {'memlab.runner', 'memlab.scoring', 'memlab.config', 'memlab.sections'},
         'memlab.scoring': {'memlab.runner', 'memlab.sections'},
         'memlab.config': {'memlab.runner', 'memlab.scoring', 'memlab.sections'},
         'memlab.sections': {'memlab.runner', 'memlab.scoring'}}


def reachable(graph: dict, start: str) -> set:
    "Every module `start` imports, directly or through others."
    seen, todo = set(), [start]
    while todo:
        for t in graph.get(todo.pop(), ()):
            if t not in seen: seen.add(t); todo.append(t)
    return seen


def layer_violations(graph: dict) -> list:
    "(low module, higher module it reaches) pairs: a lower room that imports, even indirectly, one above it."
    return sorted((low, m) for low, above in BELOW.items() if low in graph for m in reachable(graph, low) & above)


def test_runner_rooms_are_layered(graph):
    assert set(BELOW) <= set(graph), sorted(set(BELOW) - set(graph))
    assert {'memlab.store', 'memlab.scoring', 'memlab.config', 'memlab.sections'} <= graph['memlab.runner']
    assert not layer_violations(graph), f'a lower module imports one above it: {layer_violations(graph)}'


MAX_LINES = 600   # issue 24: "No module over 600 lines"


def long_modules(pkg: Path) -> dict:
    "Modules of `pkg` over MAX_LINES lines (nbdev's generated index `_modidx` aside)."
    return {module_name(p): n for p in sorted(pkg.rglob('*.py')) if p.name != '_modidx.py'
            and (n := len(p.read_text().splitlines())) > MAX_LINES}


def test_no_module_over_600_lines():
    assert not long_modules(PKG), long_modules(PKG)


def test_the_line_count_sees_a_long_module(tmp_path):
    (tmp_path / 'memlab').mkdir(); (tmp_path / 'memlab' / 'big.py').write_text('x = 1\n' * (MAX_LINES + 1))
    (tmp_path / 'memlab' / 'ok.py').write_text('x = 1\n' * MAX_LINES)
    global PKG
    old, PKG = PKG, tmp_path / 'memlab'
    try: assert long_modules(PKG) == {'memlab.big': MAX_LINES + 1}
    finally: PKG = old


def test_moved_names_are_one_object():
    "A split module re-exports what moved: one object under both names (a registry defined twice would split registrations)."
    import memlab.core, memlab.registry, memlab.files, memlab.llm, memlab.backends, memlab.judge, memlab.metrics
    import memlab.runner, memlab.store, memlab.config, memlab.scoring, memlab.sections
    assert memlab.core.Registry is memlab.registry.Registry and memlab.core.RecordError is memlab.files.RecordError
    assert memlab.llm.BACKENDS is memlab.backends.BACKENDS and memlab.judge.METRICS is memlab.metrics.METRICS
    assert memlab.runner.ResultsStore is memlab.store.ResultsStore and memlab.runner.RunConfig is memlab.config.RunConfig
    assert memlab.runner.DATASETS is memlab.config.DATASETS and memlab.runner.EVIDENCE is memlab.config.EVIDENCE
    assert memlab.runner.score is memlab.scoring.score and memlab.runner.SectionParams is memlab.sections.SectionParams
    import memlab.synth, memlab.vocab
    assert memlab.synth.SLOTS is memlab.vocab.SLOTS and memlab.synth.distinct_draws is memlab.vocab.distinct_draws


def test_the_checker_sees_a_store_that_imports_the_runner(graph):
    "A store that imported the executor (even inside a function, or through scoring) would be caught."
    for planted in ({'memlab.runner'}, {'memlab.scoring'}):
        g = dict(graph, **{'memlab.store': graph['memlab.store'] | planted})
        assert ('memlab.store', next(iter(planted))) in layer_violations(g)
        if planted == {'memlab.runner'}:
            with pytest.raises(graphlib.CycleError): graphlib.TopologicalSorter(g).prepare()   # runner imports the store
