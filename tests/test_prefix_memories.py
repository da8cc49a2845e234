"""Memories grown along MemTrace's windows (issue 13, item 2): ingested once per user, snapshotted per window.

- for every harness memory, the snapshot served for a window searches exactly like a memory built from scratch on
  that window's prefix, and later windows never leak into an earlier window's snapshot;
- each window ingests only the sessions the previous window did not have;
- a memory without `snapshot()` (e.g. the Graphiti plugin) is built anew per window and never shared;
- a run over the windows stores the same answers with and without the growing memories.
"""
import tempfile
from pathlib import Path
import pytest
from memlab.memory import Memory, MEMORIES, make_memory
from memlab.runner import PrefixMemories, RunConfig, run, results_frame
import memlab.runner as R
import memlab.planar, memlab.graph  # noqa: F401
from memlab.protocols.memtrace.data import synth_halumem, write_halumem, load_halumem, window_instances

USER = load_halumem(write_halumem(synth_halumem(1, n_sessions=26, turns=10, seed=5), Path(tempfile.mkdtemp()) / 'u.jsonl'))[0]
INSTS, _ = window_instances(USER)
QUESTIONS = ["What is the user's home city?", 'job title now', 'Which gym?', 'favorite author', 'Music I dislike']
HARNESS = ['bm25', 'dense', 'hybrid', 'long-context', 'items', 'ppr-graph', 'entity-graph']

def spec(name): return {'name': name, **({'embedder': 'hash-embed'} if name in ('dense', 'hybrid') else {})}
def seen(mem): return [[(e.text, e.session_id, round(e.score, 9)) for e in mem.search(q)] for q in QUESTIONS]

@pytest.mark.parametrize('name', HARNESS)
def test_a_window_snapshot_searches_like_a_fresh_build(name):
    pm, snaps = PrefixMemories(), []
    for inst in INSTS:
        snap, reused, _ = pm.build(spec(name), inst.sessions)
        snaps.append((inst, snap, seen(snap), reused))
    for j, (inst, snap, first, reused) in enumerate(snaps):
        fresh = make_memory(**spec(name)); fresh.add_all(inst.sessions); fresh.prepare()
        assert seen(snap) == first == seen(fresh), (name, inst.id)          # unchanged by the later windows' sessions
        assert reused == (len(snaps[j - 1][0].sessions) if j else 0)         # only the new sessions were ingested
        assert all(e.session_id in {s.id for s in inst.sessions} for q in QUESTIONS for e in snap.search(q))

def test_memories_without_snapshots_are_built_anew():
    @MEMORIES.register('no-snapshot-test')
    class Counting(Memory):
        built = 0
        def __init__(self, k=3): super().__init__(k); Counting.built += 1; self.sessions = []
        def add(self, s): self.sessions.append(s.id)
        def search(self, q, k=None): return []
    try:
        pm = PrefixMemories()
        mems = [pm.build({'name': 'no-snapshot-test'}, i.sessions) for i in INSTS[:3]]
        assert Counting.built == 3 and [r for _, r, _ in mems] == [0, 0, 0]
        assert [m.sessions for m, _, _ in mems] == [[s.id for s in i.sessions] for i in INSTS[:3]]
    finally: MEMORIES.pop('no-snapshot-test')

def test_a_run_over_windows_is_the_same_with_and_without_growing_memories(tmp_path, monkeypatch):
    cfg = RunConfig(name='w', policies=[{'name': 'offline-reader', 'tier': 'strong'}],
                    memories=[{'name': 'bm25', 'k': 5}, {'name': 'items', 'k': 5}, {'name': 'long-context', 'window_tokens': 2048}])
    a = results_frame(run(cfg, INSTS, tmp_path / 'a', progress=False))
    class Never(PrefixMemories):
        def build(self, mspec, sessions):
            m = make_memory(**mspec); m.add_all(sessions); m.prepare(); return m, 0, m.usage
    monkeypatch.setattr(R, 'PREFIX_MEMORIES', Never())
    b = results_frame(run(cfg, INSTS, tmp_path / 'b', progress=False))
    key = ['rollout_id', 'answer']
    assert len(a) == sum(len(i.queries) for i in INSTS) * 3
    assert a[key].sort_values('rollout_id').reset_index(drop=True).equals(b[key].sort_values('rollout_id').reset_index(drop=True))


def test_growing_memories_do_not_outlive_the_run(tmp_path):
    cfg = RunConfig(name='w', policies=[{'name': 'offline-reader', 'tier': 'strong'}], memories=[{'name': 'bm25', 'k': 5}])
    run(cfg, INSTS[:2], tmp_path / 's', progress=False)
    assert R.PREFIX_MEMORIES._live == {}                # before: the last window's memory stayed alive in the process
