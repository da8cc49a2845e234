"settings.ini and environment.yml must pin exactly the same packages and versions (conda can't run here)."
from configparser import ConfigParser
from pathlib import Path
import re
import yaml

ROOT = Path(__file__).resolve().parents[1]

def _norm(pin: str) -> tuple[str, str]:
    m = re.fullmatch(r'([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.\-+]+)', pin.strip())
    assert m, f'not an exact pin: {pin!r}'
    return m.group(1).lower().replace('_', '-'), m.group(2)

def settings_pins() -> dict:
    cfg = ConfigParser(delimiters=['=']); cfg.read(ROOT / 'settings.ini')
    d = cfg['DEFAULT']
    keys = [k for k in d if k == 'requirements' or k.endswith('_requirements')]   # core and every extra (dev, dense, inspect, ...)
    assert {'requirements', 'dev_requirements'} <= set(keys), keys
    pins = [p for k in keys for p in d.get(k, '').split()]
    out = dict(_norm(p) for p in pins)
    assert len(out) == len(pins), 'a package is pinned twice in settings.ini'
    return out

def env_pins() -> dict:
    env = yaml.safe_load((ROOT / 'environment.yml').read_text())
    pip = next(d['pip'] for d in env['dependencies'] if isinstance(d, dict) and 'pip' in d)
    pins = [p for p in pip if not p.startswith('-e')]
    out = dict(_norm(p) for p in pins)
    assert len(out) == len(pins), 'a package is listed twice in environment.yml'
    return out

def test_every_requirement_is_an_exact_pin():
    assert settings_pins(), 'settings.ini pins nothing'

def test_environment_yml_matches_settings_ini():
    s, e = settings_pins(), env_pins()
    only_s = {k: v for k, v in s.items() if k not in e}
    only_e = {k: v for k, v in e.items() if k not in s}
    differ = {k: (s[k], e[k]) for k in s.keys() & e.keys() if s[k] != e[k]}
    assert not (only_s or only_e or differ), f'only in settings.ini: {only_s}; only in environment.yml: {only_e}; versions differ: {differ}'

def test_python_version_agrees():
    cfg = ConfigParser(delimiters=['=']); cfg.read(ROOT / 'settings.ini')
    env = yaml.safe_load((ROOT / 'environment.yml').read_text())
    py = next(d for d in env['dependencies'] if isinstance(d, str) and d.startswith('python'))
    assert py.split('=')[-1] == cfg['DEFAULT']['min_python']
