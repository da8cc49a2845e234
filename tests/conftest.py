import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))   # tests import the loopback helpers as `loopback`

import pytest


@pytest.fixture
def iterative_bm25():
    "Registers 'bm25-iterative-test': BM25 exposed as an iterative interface, so a model decides when to search."
    from memlab.flat import BM25Memory
    from memlab.memory import MEMORIES
    class IterativeBM25(BM25Memory):
        family, single_pass = 'planar', False
    MEMORIES.register('bm25-iterative-test')(IterativeBM25)
    yield 'bm25-iterative-test'
    MEMORIES.pop('bm25-iterative-test')       # keep the global registry as the library defines it
