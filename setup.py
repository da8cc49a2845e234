"""Packaging for memlab: everything is read from settings.ini (nbdev 2 convention)."""
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']

def reqs(key):  # space-separated pins from settings.ini
    return cfg.get(key, '').split()

setuptools.setup(
    name=cfg['lib_name'], version=cfg['version'], description=cfg['description'],
    author=cfg['author'], author_email=cfg['author_email'], license='Apache-2.0',
    packages=setuptools.find_packages(include=['memlab', 'memlab.*']),
    include_package_data=True, python_requires='>=' + cfg['min_python'],
    install_requires=reqs('requirements'),
    extras_require={k.removesuffix('_requirements'): reqs(k) for k in cfg if k.endswith('_requirements')},  # dev, dense, inspect
    entry_points={'console_scripts': cfg.get('console_scripts', '').split(),
                  'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
                  'memlab.plugins': cfg.get('plugins', '').split()},
    zip_safe=False,
)
