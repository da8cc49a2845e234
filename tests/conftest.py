import signal, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))   # tests import the loopback helpers as `loopback`

# A shell starts a background job (`make test &`, nohup) with SIGINT ignored, and children inherit that: every Ctrl-C
# test then sees a run finish instead of stop. Python's own handler here means children start with the default again.
signal.signal(signal.SIGINT, signal.default_int_handler)

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
