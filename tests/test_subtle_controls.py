"""Issue 22, item 6: a SubtleMemory finding with its mechanism and the control under which it must vanish.

Finding: preservation (R_pres) fails in the long-context memory and not in the stores. Mechanism: its FIFO window evicts
the early variant sessions. Control: the same memory with a window that holds the whole history preserves everything
(R_pres = 1), as BM25 does; so the loss is eviction, not the reader or the format of the units read back.
"""
from pathlib import Path
import pandas as pd
import pytest
from memlab.runner import run, score, build_judge
from memlab.protocols.subtle.protocol import subtlememory_dataset, run_configs, query_frame
from memlab.protocols.subtle.waterfall import waterfall

JUDGE = {'name': 'subtlememory-offline'}
SMALL, WHOLE = 2000, 10**6          # tokens: a window that evicts, and one that holds every persona's history


@pytest.fixture(scope='module')
def r_pres(tmp_path_factory):
    kw = dict(n_personas=2, n_unrelated=30)
    insts = subtlememory_dataset(**kw)
    assert max(sum(s.n_tokens for s in i.sessions) for i in insts) < WHOLE
    j, frames, tmp = build_judge(JUDGE), [], tmp_path_factory.mktemp('subtle-controls')
    mems = [{'name': 'long-context', 'window_tokens': SMALL}, {'name': 'long-context', 'window_tokens': WHOLE}, {'name': 'bm25', 'k': 20}]
    for key, c in run_configs({'kind': 'subtlememory', **kw}, [{'name': 'subtlememory-reader', 'tier': 'strong'}], mems,
                              ['oracle', 'perfect', 'default'], JUDGE).items():
        st = run(c, insts, tmp / key, progress=False); score(st, insts, judge_obj=j); frames.append(query_frame(st, j, insts))
    wf = waterfall(pd.concat(frames, ignore_index=True), n_resamples=50)
    ov = wf[wf['scope'] == 'overall'].set_index('memory')
    assert (ov['n_oracle'] >= 10).all(), ov['n_oracle']      # enough answers correct under oracle for the ratio to mean something
    return ov['r_pres']


def test_long_context_loses_preservation_by_eviction(r_pres):
    assert r_pres[f'long-context[window_tokens={SMALL}]'] < 0.9, r_pres


def test_the_loss_vanishes_with_a_window_that_holds_the_history(r_pres):
    assert r_pres[f'long-context[window_tokens={WHOLE}]'] == 1.0 and r_pres['bm25[k=20]'] == 1.0, r_pres
