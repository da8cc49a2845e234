"""JupyterLab leaves the repository alone (issue 25).

1. Opening a notebook changes nothing: the kernel spec every notebook stores (nbdev_clean writes
   `{"name": "python3", "display_name": "python3"}`) is the installed spec, display name included, so JupyterLab's
   `_updateSpec` (which writes the running kernel's name, display name and language into the notebook) finds nothing to
   change. (JupyterLab 4.6 also writes the kernel's `language_info` once the kernel answers, which nbdev_clean strips
   from committed notebooks: that marks any committed notebook modified after its kernel starts, and is why sections are
   run from copies, below.)
2. A researcher runs sections in JupyterLab from copies: `make lab` copies the section notebooks into build/lab/
   (ignored by git) and starts JupyterLab there. Here a real `jupyter lab` serves a lab folder that `make lab-notebooks`
   made in a throwaway git repository laid out like this one; a section copy is run with a changed parameter over the
   kernel's websocket, as the browser does, and saved back through the contents API, as autosave does. The repository's
   `git status` must not change, and the copy must hold the new outputs.
"""
import json, os, re, shutil, signal, socket, subprocess, sys, time, uuid
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NOTEBOOKS = sorted(p for p in (ROOT / 'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)


def stored_kernelspecs() -> dict:
    "{kernelspec as stored: [notebooks storing it]} over every notebook under nbs/."
    out = {}
    for p in NOTEBOOKS:
        ks = json.loads(p.read_text())['metadata'].get('kernelspec')
        out.setdefault(json.dumps(ks, sort_keys=True), []).append(p.relative_to(ROOT).as_posix())
    return out


def test_notebooks_store_one_kernelspec():
    specs = stored_kernelspecs()
    assert len(specs) == 1, f'notebooks store {len(specs)} kernel specs: { {k: v[:3] for k, v in specs.items()} }'
    assert json.loads(next(iter(specs))) == {'display_name': 'python3', 'language': 'python', 'name': 'python3'}


def test_installed_kernelspec_is_the_stored_one():
    "JupyterLab rewrites a notebook's kernelspec on open when the installed spec's name, display name or language differ."
    ksm = pytest.importorskip('jupyter_client.kernelspec').KernelSpecManager()
    stored = json.loads(next(iter(stored_kernelspecs())))
    spec = ksm.get_kernel_spec(stored['name'])
    fix = ('install it as the notebooks store it: .venv/bin/python -m ipykernel install --sys-prefix '
           '--name python3 --display-name python3 (make lab does)')
    assert (stored['name'], spec.display_name, spec.language) == (stored['name'], stored['display_name'], stored['language']), fix
    assert Path(spec.argv[0]).parent.resolve() == BIN.resolve(), f'the kernel runs {spec.argv[0]}, not this environment: {fix}'


# --- a real JupyterLab on a lab folder made by `make lab-notebooks` ---------------------------------------------------

SECTION = 'walkthrough.ipynb'
CHANGED = {'n_instances': 2, 'queries_per_instance': 5, 'n_filler': 10, 'n_resamples': 100}   # small and fast
REPO_FILES = ['Makefile', 'settings.ini', '.gitignore', 'nbs/start_here.ipynb', 'nbs/sections']


def git(repo: Path, *args) -> str:
    return subprocess.run(['git', '-C', str(repo), *args], check=True, capture_output=True, text=True).stdout


def make_repo(dest: Path) -> Path:
    "A throwaway git repository with this project's Makefile, settings.ini, .gitignore and notebooks, committed."
    for f in REPO_FILES:
        src, out = ROOT / f, dest / f
        out.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree(src, out, ignore=shutil.ignore_patterns('.ipynb_checkpoints')) if src.is_dir() else shutil.copy2(src, out))
    git(dest, 'init', '-q')
    git(dest, 'add', '-A')
    git(dest, '-c', 'user.name=memlab-test', '-c', 'user.email=test@invalid', 'commit', '-qm', 'clone-like')
    return dest


def lab_notebooks(repo: Path) -> str:
    "`make lab-notebooks`, the copy step of `make lab`, in `repo`; its output."
    r = subprocess.run(['make', '-s', '-C', str(repo), 'lab-notebooks'], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


class Lab:
    "A `jupyter lab` on 127.0.0.1 serving `root`, driven through its REST API and a kernel websocket."
    def __init__(self, root: Path, home: Path):
        self.port, self.token = free_port(), uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if k not in ('MEMLAB_OUT', 'JUPYTER_PATH')}
        env.update(JUPYTER_CONFIG_DIR=str(home / 'config'), JUPYTER_RUNTIME_DIR=str(home / 'runtime'),
                   JUPYTER_DATA_DIR=str(home / 'data'))      # kernel specs still come from this environment's share/jupyter
        self.log = open(home / 'lab.log', 'w')
        self.proc = subprocess.Popen([str(BIN / 'jupyter-lab'), '--no-browser', '--ServerApp.ip=127.0.0.1',
                                      f'--ServerApp.port={self.port}', '--ServerApp.port_retries=0',
                                      f'--IdentityProvider.token={self.token}', f'--ServerApp.root_dir={root}',
                                      *(['--allow-root'] if os.geteuid() == 0 else [])],   # as `make lab` does
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(600):                      # up to a minute in 0.1 s steps
            if self.proc.poll() is not None: raise RuntimeError(f'jupyter lab exited {self.proc.returncode}: {self.logtext()}')
            try: self.api('GET', 'status'); break
            except OSError: time.sleep(0.1)
        else: raise RuntimeError(f'jupyter lab did not answer: {self.logtext()}')

    def logtext(self) -> str: return (Path(self.log.name).read_text())[-3000:]

    def api(self, method: str, path: str, body=None):
        import urllib.request
        req = urllib.request.Request(f'http://127.0.0.1:{self.port}/api/{path}', method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={'Authorization': f'token {self.token}', 'Content-Type': 'application/json'})
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
            return json.loads(data) if data else None

    def channels(self, kernel_id: str):
        import websocket
        return websocket.create_connection(f'ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}',
                                           header=[f'Authorization: token {self.token}'], timeout=600)

    def stop(self):
        try:
            for s in self.api('GET', 'sessions'): self.api('DELETE', f"sessions/{s['id']}")   # shuts its kernel down
        except OSError: pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try: self.proc.wait(30)
            except subprocess.TimeoutExpired: os.killpg(self.proc.pid, signal.SIGKILL); self.proc.wait()
        self.log.close()


def request(ws, msg_type: str, content: dict, session: str) -> str:
    "Send a shell request over the kernel websocket (the JSON protocol); its msg_id."
    mid = uuid.uuid4().hex
    ws.send(json.dumps({'header': {'msg_id': mid, 'username': 'test', 'session': session, 'msg_type': msg_type, 'version': '5.3'},
                        'parent_header': {}, 'metadata': {}, 'content': content, 'channel': 'shell', 'buffers': []}))
    return mid


def replies(ws, mid: str):
    "The messages answering `mid`, until the shell reply has come and the kernel is idle again."
    replied = idle = False
    while not (replied and idle):
        m = json.loads(ws.recv())
        if m.get('parent_header', {}).get('msg_id') != mid: continue
        replied |= m['channel'] == 'shell'
        idle |= m['msg_type'] == 'status' and m['content']['execution_state'] == 'idle'
        yield m


def execute(ws, code: str, session: str) -> tuple[int, list]:
    "Run one cell as JupyterLab does; (execution_count, nbformat outputs)."
    outputs, count = [], None
    for m in replies(ws, request(ws, 'execute_request', {'code': code, 'silent': False, 'store_history': True,
                                                           'user_expressions': {}, 'allow_stdin': False, 'stop_on_error': True}, session)):
        t, c = m['msg_type'], m['content']
        if t == 'stream':
            if outputs and outputs[-1]['output_type'] == 'stream' and outputs[-1]['name'] == c['name']: outputs[-1]['text'] += c['text']
            else: outputs.append({'output_type': 'stream', 'name': c['name'], 'text': c['text']})
        elif t in ('display_data', 'execute_result'):
            out = {'output_type': t, 'data': c['data'], 'metadata': c.get('metadata', {})}
            if t == 'execute_result': out['execution_count'] = c['execution_count']
            outputs.append(out)
        elif t == 'error': outputs.append({'output_type': 'error', 'ename': c['ename'], 'evalue': c['evalue'], 'traceback': c['traceback']})
        elif t == 'clear_output': outputs.clear()
        elif t == 'execute_reply': count = c['execution_count']
    return count, outputs


def set_parameters(src: str, values: dict) -> str:
    "The parameters cell with `values` assigned instead of its defaults, as a researcher edits it."
    for name, v in values.items():
        src, n = re.subn(rf'^{name}\s*=\s*[^#\n]*', f'{name} = {v!r}  ', src, count=1, flags=re.M)
        assert n == 1, f'no parameter {name}'
    return src


def on_disk(nb) -> list:
    "(source, outputs) of each cell of a notebook file or of a contents-API notebook, lines joined as nbformat reads them."
    import nbformat
    nb = nbformat.read(nb, as_version=4) if isinstance(nb, Path) else nbformat.from_dict(nb)
    return [(c.source, c.get('outputs')) for c in nb.cells]


def test_set_parameters():
    src = "n = 6            # users\nk = 12\n"
    assert set_parameters(src, {'n': 2}) == "n = 2  # users\nk = 12\n"
    with pytest.raises(AssertionError): set_parameters(src, {'m': 1})


def test_lab_runs_a_section_copy_and_git_stays_clean(tmp_path):
    pytest.importorskip('jupyterlab'); pytest.importorskip('websocket')
    if not (BIN / 'jupyter-lab').exists() or not shutil.which('make') or not shutil.which('git'):
        pytest.skip('jupyter-lab, make or git missing')
    repo = make_repo(tmp_path / 'repo')
    committed = (repo / 'nbs/sections' / SECTION).read_bytes()
    assert git(repo, 'status', '--porcelain') == ''
    out = lab_notebooks(repo)
    lab_dir = repo / 'build/lab'
    sections = repo / 'nbs/sections'
    expected = {'start_here.ipynb'} | {p.name for p in [*sections.glob('*.ipynb'), *sections.glob('*.full.yaml'), *sections.glob('*.paper.yaml')]}
    assert {p.name for p in lab_dir.iterdir()} == expected and out.count('copied') == len(expected), out
    assert git(repo, 'status', '--porcelain') == '', 'the lab copies are not ignored'

    lab = Lab(lab_dir, tmp_path)
    try:
        # the kernel spec the server offers is the one the notebooks store, so opening rewrites nothing
        specs = lab.api('GET', 'kernelspecs')
        nb = lab.api('GET', f'contents/{SECTION}')['content']
        stored = nb['metadata']['kernelspec']
        spec = specs['kernelspecs'][stored['name']]['spec']
        # JupyterLab's NotebookPanel._updateSpec writes {name, display_name, language} of the kernel it starts
        assert {'name': stored['name'], 'display_name': spec['display_name'], 'language': spec['language']} == stored
        assert {c['name'] for c in lab.api('GET', 'contents')['content']} == {p.name for p in lab_dir.iterdir()}
        import urllib.error                                 # the committed notebooks are out of the server's reach
        with pytest.raises(urllib.error.HTTPError) as e: lab.api('GET', f'contents/..%2F..%2Fnbs%2Fsections%2F{SECTION}')
        assert e.value.code in (403, 404), e.value.code

        session = lab.api('POST', 'sessions', {'path': SECTION, 'name': SECTION, 'type': 'notebook', 'kernel': {'name': stored['name']}})
        assert session['kernel']['name'] == 'python3'
        ws, sid = lab.channels(session['kernel']['id']), uuid.uuid4().hex
        try:
            info = next(m for m in replies(ws, request(ws, 'kernel_info_request', {}, sid)) if m['msg_type'] == 'kernel_info_reply')
            for cell in nb['cells']:                        # Run All, with the parameters changed
                if cell['cell_type'] != 'code': continue
                if 'parameters' in cell['metadata'].get('tags', []): cell['source'] = set_parameters(cell['source'], CHANGED)
                cell['execution_count'], cell['outputs'] = execute(ws, cell['source'], sid)
                errors = [o for o in cell['outputs'] if o['output_type'] == 'error']
                assert not errors, f"{errors[0]['ename']}: {errors[0]['evalue']}\n{cell['source'][:300]}"
        finally: ws.close()
        nb['metadata']['language_info'] = info['content']['language_info']   # what the frontend adds once the kernel runs
        lab.api('PUT', f'contents/{SECTION}', {'type': 'notebook', 'format': 'json', 'content': nb})   # autosave
        saved = lab.api('GET', f'contents/{SECTION}')['content']
    finally: lab.stop()

    assert git(repo, 'status', '--porcelain') == ''                                   # nothing make test compares moved
    assert (repo / 'nbs/sections' / SECTION).read_bytes() == committed
    code = [c for c in saved['cells'] if c['cell_type'] == 'code']
    assert [c['execution_count'] for c in code] == list(range(1, len(code) + 1))      # the copy holds this run
    assert sum(len(c['outputs']) for c in code) >= len(code) // 2
    assert on_disk(lab_dir / SECTION) == on_disk(saved)                                 # ... on disk
    manifests = list((repo / 'build/results/walkthrough/runs').glob('*/manifest.json'))
    assert len(manifests) == 1, manifests                                             # the run wrote under build/
    params = json.loads(manifests[0].read_text())['config']['dataset']['params']
    assert {k: params[k] for k in ('n_instances', 'queries_per_instance', 'n_filler')} == {k: CHANGED[k] for k in ('n_instances', 'queries_per_instance', 'n_filler')}

    again = lab_notebooks(repo)                                                       # make lab again: the copy is kept
    assert f'kept    build/lab/{SECTION}' in again and on_disk(lab_dir / SECTION) == on_disk(saved)
