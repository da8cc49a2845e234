"""The sandbox contract (memlab.sandbox): the local backend's files, snapshots, limits and escapes, and the docker backend where an engine runs.

Every escape test has its contrast (the same action from the host, or with isolation='none', succeeds), so it can fail."""
import os, socket, subprocess, sys, tempfile, threading, time
from pathlib import Path
import pytest
from memlab import sandbox as S
from memlab.sandbox import ExecResult, LocalSandbox, SANDBOXES, SandboxUnavailable, make_sandbox


def _local(**kw) -> LocalSandbox:
    "A created local sandbox, or the test skips saying why namespaces are unavailable here."
    try: return make_sandbox('local', **kw).create()
    except SandboxUnavailable as e: pytest.skip(str(e))


@pytest.fixture
def sb():
    s = _local(cpu_seconds=20, memory_mb=1024)
    yield s
    s.destroy()


@pytest.fixture
def unsafe():
    s = make_sandbox('local', isolation='none').create()
    yield s
    s.destroy()


def _host_procs(marker: bytes) -> list:
    "Host pids whose command line contains `marker`."
    found = []
    for c in Path('/proc').glob('[0-9]*/cmdline'):
        try:
            if marker in c.read_bytes(): found.append(int(c.parent.name))
        except OSError: pass
    return found


# --- the contract ---------------------------------------------------------------------------------

def test_registry_and_factory():
    assert {'local', 'docker'} <= set(SANDBOXES)
    assert isinstance(make_sandbox('local'), LocalSandbox)
    with pytest.raises(KeyError, match="unknown sandbox 'nope'"): make_sandbox('nope')
    with pytest.raises(ValueError, match='isolation'): make_sandbox('local', isolation='chroot')


def test_run_reads_output_and_exit_code(sb):
    r = sb.run('echo out; echo err >&2; exit 7')
    assert isinstance(r, ExecResult)
    assert (r.returncode, r.stdout, r.stderr, r.timed_out, r.killed_by) == (7, 'out\n', 'err\n', False, None)
    r = sb.run(['python', '-c', 'import sys; print(sys.stdin.read()[::-1])'], stdin='abc')
    assert r.stdout == 'cba\n'
    r = sb.run(['no-such-command-here'])
    assert r.returncode == 127 and 'cannot start the command' in r.stderr


def test_project_python_and_pytest_run_inside(sb):
    sb.write('t/test_one.py', 'def test_ok():\n    assert True\n\ndef test_bad():\n    assert 1 == 2\n')
    r = sb.run('python -m pytest -q -p no:cacheprovider t', timeout=120)
    assert r.returncode == 1 and '1 failed, 1 passed' in r.stdout
    assert sb.run(['python', '-c', 'import sys; print(sys.executable)']).stdout.strip() == sys.executable
    assert sb.listdir('t') == ['test_one.py']        # PYTHONDONTWRITEBYTECODE: no __pycache__


def test_write_read_listdir(sb):
    sb.write('a/b/c.txt', 'héllo')
    assert sb.read('a/b/c.txt') == 'héllo'
    assert sb.listdir() == ['a'] and sb.listdir('a') == ['b']
    assert sb.run('cat a/b/c.txt').stdout == 'héllo'
    sb.run('mkdir -p made && echo 1 > made/x')
    assert sb.read('made/x') == '1\n'
    assert sb.run('pwd', cwd='a/b').stdout.strip() == str(sb.root / 'a' / 'b')


def test_callers_environment_stays_out(sb, monkeypatch):
    monkeypatch.setenv('MEMLAB_TEST_SECRET', 'sk-not-for-the-sandbox')
    r = sb.run('env')
    assert 'sk-not-for-the-sandbox' not in r.stdout and f'HOME={sb.root}' in r.stdout
    extra = _local(env={'GIVEN': '1'})
    try: assert extra.run('echo $GIVEN').stdout == '1\n'
    finally: extra.destroy()


@pytest.mark.parametrize('bad', ['../x', '/etc/passwd', 'a/../../x', '..'])
def test_paths_that_escape_are_refused(sb, bad):
    for call in (lambda: sb.read(bad), lambda: sb.write(bad, 'x'), lambda: sb.listdir(bad), lambda: sb.run('true', cwd=bad)):
        with pytest.raises(ValueError, match='escapes the sandbox'): call()


def test_symlinks_out_are_refused(sb):
    target = Path(tempfile.mkdtemp())
    try:
        (target / 'secret').write_text('s')
        os.symlink(target / 'secret', sb.root / 'leak'); os.symlink(target, sb.root / 'up')
        with pytest.raises(ValueError, match="'leak' escapes"): sb.read('leak')
        with pytest.raises(ValueError, match="'up/new' escapes"): sb.write('up/new', 'x')
        assert sorted(os.listdir(target)) == ['secret']
        os.symlink('a', sb.root / 'inner'); (sb.root / 'a').mkdir(); sb.write('inner/x', 'in')   # a symlink inside is fine
        assert sb.read('a/x') == 'in'
    finally:
        import shutil; shutil.rmtree(target)


def test_snapshot_and_restore(sb):
    sb.write('keep.txt', 'v1'); sb.write('d/sub.txt', 's1')
    sid = sb.snapshot()
    sb.write('keep.txt', 'v2'); sb.run('echo new > new.txt; rm d/sub.txt')
    sid2 = sb.snapshot()
    sb.restore(sid)
    assert (sb.read('keep.txt'), sb.read('d/sub.txt'), sb.listdir()) == ('v1', 's1', ['d', 'keep.txt'])
    sb.restore(sid2)
    assert sb.read('keep.txt') == 'v2' and 'new.txt' in sb.listdir() and sb.listdir('d') == []
    assert sb.run('cat keep.txt').stdout == 'v2'     # the command sees the restored tree
    for bad in ('snap-99', '../work', ''):
        with pytest.raises(KeyError, match='unknown snapshot'): sb.restore(bad)


def test_context_manager_destroys():
    with make_sandbox('local', isolation='none') as s:
        home = s.home; s.write('x', 'y')
        assert home.is_dir()
    assert not home.exists() and s.root is None
    with pytest.raises(RuntimeError, match='not created'): s.read('x')


# --- limits and escapes ---------------------------------------------------------------------------

def test_timeout_kills_the_whole_process_tree(sb):
    r = sb.run('sleep 876.5 & echo $! > bg.pid; (sleep 876.6 &); sleep 876.7', timeout=1)
    assert (r.timed_out, r.killed_by) == (True, 'timeout')
    assert sb.read('bg.pid').strip().isdigit()       # the command did start its background process
    assert _host_procs(b'876.') == []                 # and none of its three sleeps survives


def test_timeout_contrast_a_plain_child_kill_leaves_the_background(unsafe):
    "Without a pid namespace, a process that left the process group survives its command: the check above can fail."
    r = unsafe.run('(setsid sleep 765.4 &); sleep 30', timeout=1)
    try: assert r.timed_out and _host_procs(b'765.4') != []
    finally:
        for pid in _host_procs(b'765.4'): os.kill(pid, 9)


def test_writes_outside_fail_and_nothing_appears(sb, unsafe):
    here = Path(__file__).parent / f'.sandbox-escape-{os.getpid()}'
    home = Path.home() / f'.sandbox-escape-{os.getpid()}'
    tmp = Path(tempfile.gettempdir()) / f'.sandbox-escape-{os.getpid()}'
    try:
        for target in (here, home):
            r = sb.run(f'echo x > {target}')
            assert r.returncode != 0 and 'Read-only file system' in r.stderr, (target, r)
        r = sb.run(f'echo x > {tmp} && mkdir -p /dev/shm/x && touch /etc/memlab-escape; echo $?')
        assert (here.exists(), home.exists(), tmp.exists(), Path('/etc/memlab-escape').exists()) == (False,) * 4
        assert unsafe.run(f'echo x > {tmp}').returncode == 0 and tmp.exists()   # the contrast
    finally:
        for p in (here, home, tmp): p.unlink(missing_ok=True)


def test_home_is_hidden_but_the_interpreter_runs(sb, unsafe):
    secret = Path.home() / f'.memlab-sandbox-secret-{os.getpid()}'
    secret.write_text('s3cret')
    try:
        r = sb.run(f'cat {secret}')
        assert r.returncode != 0 and 's3cret' not in r.stdout
        assert unsafe.run(f'cat {secret}').stdout == 's3cret'     # the contrast
        assert sb.run(['python', '-c', 'import pytest, sys; print(sys.base_prefix)']).stdout.strip() == sys.base_prefix
    finally: secret.unlink()


def test_cannot_remount_writable_or_touch_devices(sb):
    assert sb.run('id -u').stdout == '1000\n'
    for cmd in ('mount -o remount,rw /', 'mount -o remount,bind,rw /usr',            # no capability over the mounts
                'unshare -rm mount -o remount,bind,rw /usr',                         # nor from a namespace of its own
                'unshare -rm sh -c "umount -l /usr && touch /usr/memlab-escape"'):
        r = sb.run(cmd)
        assert r.returncode != 0, (cmd, r)
    assert not Path('/usr/memlab-escape').exists()
    assert set(sb.run('ls /dev').stdout.split()) == {'fd', 'full', 'null', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'tty', 'urandom', 'zero'}
    r = sb.run('echo 1 > /proc/sys/vm/drop_caches')   # /proc is read-only (and /proc/sysrq-trigger with it)
    assert r.returncode != 0 and 'Read-only file system' in r.stderr
    assert sb.run('echo x > /dev/null && echo ok').stdout == 'ok\n'
    host = sum(1 for _ in Path('/proc').glob('[0-9]*'))
    seen = int(sb.run('ls /proc | grep -c "^[0-9]"').stdout)       # its own pid namespace: the host's processes are out of sight
    assert seen <= 5 < host, (seen, host)


def test_fork_bomb_ends_and_the_host_still_forks(sb):
    r = sb.run(['bash', '-c', ':(){ :|:& };:; sleep 30'], timeout=3)
    assert (r.timed_out, r.killed_by) == (True, 'timeout')
    assert subprocess.run(['true']).returncode == 0     # the host can still spawn a process
    assert _host_procs(b':(){') == []                  # and nothing of the bomb is left
    r = sb.run('for i in $(seq 20); do sleep 0.2 & done; wait; echo done', timeout=30)
    assert r.stdout == 'done\n'                         # the limit leaves room for ordinary work


def test_process_limit_is_enforced():
    spawn = ('import subprocess\nok = 0\nfor i in range(30):\n    try: subprocess.Popen(["sleep", "2"]); ok += 1\n'
             '    except OSError: pass\nprint(ok)')
    for max_procs, fits in ((10, lambda n: n < 10), (None, lambda n: n == 30)):     # None: the contrast
        s = _local(max_procs=max_procs)
        try:
            r = s.run(['python', '-c', spawn], timeout=30)
            assert fits(int(r.stdout)), (max_procs, r)
        finally: s.destroy()


def test_infinite_loop_is_killed_by_cpu_limit():
    s = _local(cpu_seconds=1)
    try:
        r = s.run(['python', '-c', 'while True: pass'], timeout=30)
        assert (r.killed_by, r.timed_out) == ('cpu', False) and r.returncode < 0
        r = s.run('while :; do :; done', timeout=30)
        assert r.killed_by == 'cpu'
    finally: s.destroy()
    s = _local(cpu_seconds=None)   # the contrast: without a CPU limit the timeout ends it
    try: assert s.run('while :; do :; done', timeout=1).killed_by == 'timeout'
    finally: s.destroy()


def test_memory_hog_fails():
    hog = ['python', '-c', "b = bytearray(2 * 1024**3); print('allocated', len(b))"]
    s = _local(memory_mb=256)
    try:
        r = s.run(hog)
        assert r.returncode != 0 and 'allocated' not in r.stdout and r.killed_by == 'memory'
    finally: s.destroy()
    s = _local(memory_mb=None)   # the contrast: without the limit it allocates (zero pages, untouched)
    try: assert s.run(hog).stdout == f'allocated {2 * 1024**3}\n'
    finally: s.destroy()


def test_file_size_limit_caps_output():
    s = _local(file_mb=1)
    try:
        r = s.run('head -c 5000000 /dev/zero > big; ls -l big | cut -d" " -f5; yes | head -c 3000000')
        assert r.returncode != 0 and (s.root / 'big').stat().st_size <= 1 << 20
        assert len(r.stdout) <= s.max_output + 100
    finally: s.destroy()


def test_socket_to_a_host_server_fails_but_works_from_the_host(sb, unsafe):
    srv = socket.create_server(('127.0.0.1', 0)); port = srv.getsockname()[1]
    accepted = []
    def serve():
        while True:
            try: c, _ = srv.accept()
            except OSError: return
            accepted.append(1); c.close()
    threading.Thread(target=serve, daemon=True).start()
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')"
    try:
        socket.create_connection(('127.0.0.1', port), timeout=3).close()      # the host reaches the server
        r = sb.run(['python', '-c', code])
        assert r.returncode == 1 and 'connected' not in r.stdout and 'unreachable' in r.stderr
        assert unsafe.run(['python', '-c', code]).stdout == 'connected\n'   # the contrast
        time.sleep(0.2)
        assert len(accepted) == 2
    finally: srv.close()


def test_refuses_when_namespaces_are_unavailable(monkeypatch):
    monkeypatch.setattr(S, '_PROBE', {})
    monkeypatch.setattr(S.shutil, 'which', lambda name: None)
    with pytest.raises(SandboxUnavailable, match='unshare command .* is not installed') as e:
        make_sandbox('local').create()
    assert '\n' not in str(e.value)
    s = make_sandbox('local', isolation='none').create()      # only an explicit, unsafe choice runs without
    s.destroy()


def test_refuses_as_root_without_a_pids_cgroup(monkeypatch):
    monkeypatch.setattr(S, '_PROBE', {})
    monkeypatch.setattr(S.os, 'geteuid', lambda: 0)
    monkeypatch.setattr(S, '_pids_cgroup_root', lambda: None)
    with pytest.raises(SandboxUnavailable, match='RLIMIT_NPROC does not apply'): make_sandbox('local').create()


# --- docker ---------------------------------------------------------------------------------------

@pytest.fixture
def dock():
    try: s = make_sandbox('docker', image=os.environ.get('MEMLAB_SANDBOX_IMAGE', 'python:3.11-slim')).create()
    except SandboxUnavailable as e: pytest.skip(str(e))
    yield s
    s.destroy()


def test_docker_unavailable_is_one_line(monkeypatch):
    monkeypatch.setenv('DOCKER_HOST', 'unix:///nonexistent/docker.sock')
    with pytest.raises(SandboxUnavailable) as e: make_sandbox('docker').create()
    assert "Docker's engine is not reachable" in str(e.value) and "backend='local'" in str(e.value)
    assert '\n' not in str(e.value)


def test_docker_run_files_snapshot(dock):
    r = dock.run('echo out; echo err >&2; exit 3')
    assert (r.returncode, r.stdout, r.stderr) == (3, 'out\n', 'err\n')
    dock.write('a/b.txt', 'v1')
    assert dock.read('a/b.txt') == 'v1' and dock.listdir() == ['a']
    assert dock.run(['cat', 'b.txt'], cwd='a').stdout == 'v1'
    sid = dock.snapshot()
    dock.write('a/b.txt', 'v2'); dock.run('touch new.txt')
    dock.restore(sid)
    assert dock.read('a/b.txt') == 'v1' and 'new.txt' not in dock.listdir()
    with pytest.raises(ValueError, match='escapes'): dock.read('../etc/passwd')


def test_docker_timeout_and_network(dock):
    r = dock.run('sleep 30', timeout=1)
    assert r.timed_out and r.killed_by == 'timeout'
    r = dock.run(['python', '-c', "import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)"])
    assert r.returncode != 0


class _FakeContainer:
    "A stand-in for a docker container whose file system is the host's (its workdir is a host temp dir): it checks DockerSandbox's glue, not Docker."
    def __init__(self, client, workdir):
        self.client, self.workdir, self.short_id, self.removed = client, workdir, f'c{len(client.started)}', False
    def exec_run(self, cmd, workdir=None, demux=False):
        p = subprocess.run(cmd, cwd=workdir or self.workdir, capture_output=True)
        out = (p.stdout or None, p.stderr or None) if demux else p.stdout + p.stderr
        return type('R', (), dict(exit_code=p.returncode, output=out))
    def put_archive(self, path, data):
        import io, tarfile
        tarfile.open(fileobj=io.BytesIO(data)).extractall(path, filter='data'); return True
    def get_archive(self, path):
        import io, tarfile
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode='w') as tf: tf.add(path, arcname=os.path.basename(path))
        return iter([buf.getvalue()]), {}
    def commit(self, repository, tag):
        import shutil
        iid = f'sha256:{repository}:{tag}'; shutil.copytree(self.workdir, self.client.store / tag)
        self.client.images_made[iid] = self.client.store / tag
        return type('I', (), dict(id=iid))
    def remove(self, force=False): self.removed = True


class _FakeClient:
    def __init__(self, store):
        self.store, self.started, self.images_made, self.removed_images = store, [], {}, []
        self.containers = type('C', (), dict(run=lambda _, *a, **kw: self._run(*a, **kw)))()
        self.images = type('M', (), dict(remove=lambda _, iid, force=False: self.removed_images.append(iid)))()
    def _run(self, image, command, detach, working_dir, **kw):
        import shutil
        if image in self.images_made:
            shutil.rmtree(working_dir); shutil.copytree(self.images_made[image], working_dir)
        else: os.makedirs(working_dir, exist_ok=True)
        self.started.append((image, command, kw)); return _FakeContainer(self, working_dir)


def test_docker_glue_with_a_fake_engine(tmp_path):
    (tmp_path / 'images').mkdir()
    client = _FakeClient(tmp_path / 'images')
    d = make_sandbox('docker', workdir=str(tmp_path / 'sandbox'), memory_mb=512, client=client).create()
    image, command, kw = client.started[0]
    assert (image, command, kw['network_disabled'], kw['mem_limit'], kw['pids_limit']) == ('python:3.11-slim', ['sleep', 'infinity'], True, '512m', 256)
    r = d.run('echo out; echo err >&2; exit 3')
    assert (r.returncode, r.stdout, r.stderr, r.timed_out) == (3, 'out\n', 'err\n', False)
    d.write('a/b.txt', 'v1')
    assert (d.read('a/b.txt'), d.listdir(), d.run(['cat', 'b.txt'], cwd='a').stdout) == ('v1', ['a'], 'v1')
    sid = d.snapshot()
    d.write('a/b.txt', 'v2'); d.run('touch new.txt')
    d.restore(sid)
    assert d.read('a/b.txt') == 'v1' and d.listdir() == ['a'] and client.started[-1][0] == sid
    with pytest.raises(KeyError, match='unknown snapshot'): d.restore('sha256:nope')
    r = d.run('sleep 5', timeout=1)
    assert (r.timed_out, r.killed_by, r.returncode) == (True, 'timeout', 124)
    os.symlink('/etc', tmp_path / 'sandbox' / 'up')
    with pytest.raises(ValueError, match="'up/passwd' escapes"): d.read('up/passwd')
    with pytest.raises(ValueError, match='escapes'): d.write('../x', 'y')
    d.destroy()
    assert d.container is None and client.removed_images == [sid]
