"""A researcher's memory system plugs in by being installed: a throwaway distribution (a `*.dist-info` with an
`entry_points.txt` in the group `memlab.plugins`, on sys.path) registers a memory that a run config then names, and
`memlab run` uses it with no edit to memlab."""
import os, subprocess, sys, textwrap
from pathlib import Path
import pandas as pd
import yaml

PLUGIN = textwrap.dedent('''
    from memlab.memory import MEMORIES, Memory
    from memlab.core import Evidence

    @MEMORIES.register('plugin-recent')
    class RecentMemory(Memory):
        "The k most recent turns, whatever the query."
        family, single_pass = 'flat', True
        def __init__(self, k: int=12): super().__init__(k=k); self.reset()
        def reset(self): self.turns = []
        def add(self, session): self.turns += [(session.id, session.date, t.content) for t in session.turns]
        def search(self, query, k=None):
            hits = self.turns[-(k or self.k):][::-1]
            return [Evidence(text=t, session_id=s, date=d, rank=r) for r, (s, d, t) in enumerate(hits)]
''')

def install(site: Path):
    (site / 'my_memlab_plugin.py').write_text(PLUGIN)
    info = site / 'my_memlab_plugin-0.1.dist-info'; info.mkdir()
    (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: my-memlab-plugin\nVersion: 0.1\n')
    (info / 'entry_points.txt').write_text('[memlab.plugins]\nrecent = my_memlab_plugin\n')

def test_installed_plugin_memory_runs_from_a_config(tmp_path):
    site = tmp_path / 'site'; site.mkdir(); install(site)
    cfg = dict(name='plugin', section='plugins', dataset={'kind': 'synthetic', 'params': {'n_instances': 2, 'queries_per_instance': 3, 'n_filler': 5}},
               policies=[{'name': 'offline-reader', 'tier': 'strong'}], memories=[{'name': 'plugin-recent', 'k': 12}])
    (tmp_path / 'c.yaml').write_text(yaml.safe_dump(cfg))
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(site), os.environ.get('PYTHONPATH', '')]), 'MEMLAB_PROGRESS': '0'}
    memlab = str(Path(sys.executable).with_name('memlab'))
    r = subprocess.run([memlab, 'run', tmp_path / 'c.yaml', '--store', tmp_path / 's'], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ro = pd.concat([pd.read_parquet(f) for f in (tmp_path / 's' / 'rollouts').glob('part-*.parquet')])
    assert len(ro) == 6 and set(ro['memory']) == {'plugin-recent[k=12]'} and ro['error'].isna().all()
    env.pop('PYTHONPATH')                                             # not installed: the config names an unknown memory
    r = subprocess.run([memlab, 'run', tmp_path / 'c.yaml', '--store', tmp_path / 't'], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "unknown memory 'plugin-recent'" in r.stderr and not (tmp_path / 't').exists()

def test_plugin_names_are_found_and_listed_without_loading_plugins_first(tmp_path):
    "Issue 24: nothing loads plugins up front; a lookup's miss loads them until the name is found, a listing loads them all."
    site = tmp_path / 'site'; site.mkdir(); install(site)
    code = textwrap.dedent('''
        import sys
        from memlab.memory import MEMORIES
        print('my_memlab_plugin' in sys.modules, 'bm25' in MEMORIES, 'my_memlab_plugin' in sys.modules)
        print(MEMORIES.get_impl('plugin-recent').__name__, 'plugin-recent' in sorted(MEMORIES))
        try: MEMORIES.get_impl('no-such-memory')
        except KeyError as e: print('plugin-recent' in str(e), 'bm25' in str(e))
    ''')
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(site), os.environ.get('PYTHONPATH', '')])}
    r = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ['False', 'True', 'False', 'RecentMemory', 'True', 'True', 'True'], r.stdout
