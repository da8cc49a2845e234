"""A real OpenAI-compatible server with a real model, for `make test-real-model` (not collected by pytest; tests import it).

llama-cpp-python's server (`python -m llama_cpp.server`, from its own virtualenv: `MEMLAB_REAL_PYTHON`) serving the
SmolLM2-135M-Instruct GGUF (`MEMLAB_REAL_GGUF`) with `--chat_format chatml-function-calling` (tool calls), on
127.0.0.1 only. Its access log (uvicorn) counts the chat requests it answered, so a cache re-run can be shown to make
none. `python tests/real_server.py` serves it in the foreground for manual use.
"""
from __future__ import annotations
import os, re, signal, socket, subprocess, sys, time, urllib.request
from pathlib import Path
from typing import Optional

HOST = '127.0.0.1'
ALIAS = 'smollm2'          # the model name requests use (`--model_alias`)
_CHAT = re.compile(r'"POST /v1/chat/completions HTTP/1\.[01]" (\d{3})')


def configured() -> Optional[str]:
    "None when a real server can be started here, else why not (tests skip with it)."
    py, gguf = os.environ.get('MEMLAB_REAL_PYTHON'), os.environ.get('MEMLAB_REAL_GGUF')
    if not py or not gguf: return 'no real model server configured: run `make test-real-model` (sets MEMLAB_REAL_PYTHON, MEMLAB_REAL_GGUF)'
    if not Path(py).exists(): return f'MEMLAB_REAL_PYTHON={py} does not exist'
    if not Path(gguf).exists(): return f'MEMLAB_REAL_GGUF={gguf} does not exist'
    return None


def free_port() -> int:
    with socket.socket() as s: s.bind((HOST, 0)); return s.getsockname()[1]


class RealServer:
    "llama_cpp.server as a subprocess; `url` for `base_url`; `n_chat()` counts answered chat requests in its log."
    def __init__(self, log: Path, port: Optional[int] = None, n_ctx: int = 8192):
        self.log, self.port, self.n_ctx, self.proc = Path(log), port or free_port(), n_ctx, None

    @property
    def url(self) -> str: return f'http://{HOST}:{self.port}/v1'

    def start(self, timeout: float = 120) -> 'RealServer':
        cmd = [os.environ['MEMLAB_REAL_PYTHON'], '-m', 'llama_cpp.server', '--model', os.environ['MEMLAB_REAL_GGUF'],
               '--model_alias', ALIAS, '--host', HOST, '--port', str(self.port), '--n_ctx', str(self.n_ctx),
               '--chat_format', 'chatml-function-calling']
        f = open(self.log, 'a')
        self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        f.close()
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            if self.proc.poll() is not None: raise RuntimeError(f'the model server exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}')
            try:
                with urllib.request.urlopen(f'{self.url}/models', timeout=2) as r:
                    if r.status == 200: return self
            except OSError: time.sleep(0.5)
        self.kill(); raise RuntimeError(f'the model server did not answer within {timeout:.0f} s')

    def n_chat(self) -> int:
        "Chat requests the server has answered (its access log lines), over every start."
        return len(_CHAT.findall(self.log.read_text())) if self.log.exists() else 0

    def kill(self):
        "SIGKILL, as a crashed server: no goodbye to clients in flight."
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL); self.proc.wait(30)

    def __enter__(self): return self.start()
    def __exit__(self, *exc): self.kill()


if __name__ == '__main__':
    why = configured()
    if why: sys.exit(why)
    srv = RealServer(Path('real-server.log'), port=int(sys.argv[1]) if len(sys.argv) > 1 else 8911).start()
    print(f'serving {ALIAS} at {srv.url} (log: real-server.log); Ctrl-C stops it')
    try: srv.proc.wait()
    except KeyboardInterrupt: srv.kill()
