"""The small offline run config the CLI tests build their stores from (2 synthetic users, 3 questions each, bm25)."""
from pathlib import Path

import yaml


def small_config(tmp: Path, name: str) -> Path:
    "Write the config as `tmp/c.yaml` (run name and section `name`) and return its path."
    cfg = dict(name=name, section=name, dataset={'kind': 'synthetic', 'params': {'n_instances': 2, 'queries_per_instance': 3, 'n_filler': 5}},
               policies=[{'name': 'offline-reader', 'tier': 'strong'}], memories=[{'name': 'bm25', 'k': 12}])
    (tmp / 'c.yaml').write_text(yaml.safe_dump(cfg))
    return tmp / 'c.yaml'
