"""The paper-size scale-ladder preset (issue 29): valid section parameters, seed 000's grid, about 1M tokens per query at s4.

`nbs/sections/scale_ladder.paper.yaml` must pass the section's own parameter check, ask for seed 000's 500 queries and
ladder 0..400, and its synthetic sessions must make s4 about 1M tokens per query (seed 000 Table 4: 1.03M); measured
here on the first 3 queries with the preset's turns and seed (a pool of 450 sessions: the size of its sessions, not their number, sets it) (Table 4's tokens per query).
"""
from pathlib import Path
import yaml
from memlab.protocols.scale.protocol import check_params
from memlab.protocols.scale.section import ladder_data
from memlab.protocols.scale.ladder import table4

PRESET = Path(__file__).resolve().parents[1] / 'nbs/sections/scale_ladder.paper.yaml'


def test_paper_preset_is_seed_000_size():
    p = yaml.safe_load(PRESET.read_text())
    check_params(**p)
    assert p['n_queries'] == 500 and p['ladder'] == [0, 100, 200, 300, 400] and p['pool_size'] >= p['ladder'][-1]
    d = ladder_data(p['dataset'], None, None, 3, 450, p['session_turns'], p['ladder'], p['seed'])   # a smaller pool: same sessions' size
    t4 = table4(d.instances, d.history).set_index('scale')
    assert 0.9e6 <= t4.loc['s4', 'tokens/query'] <= 1.1e6, t4
    assert t4.loc['s0', 'tokens/query'] < 1e4
