"""A loopback HTTP server speaking the OpenAI Chat Completions and Anthropic Messages wire protocols.

The real `openai` and `anthropic` SDKs talk to it over HTTP through `base_url`; a deterministic fake "model"
(`default_responder`) answers, and faults (429, 500, a hung reply, a truncated body) can be injected at a
seeded rate. Faults drawn only when asked for (`OPT_FAULTS`): '401' (a bad key); with `echo_auth=True` the
401 and 500 error bodies quote the request's Authorization / x-api-key header, as some proxies do. A 429 with
a long wait: `faults=('429',), retry_after=3600`. It listens on 127.0.0.1 only. Not a test module (pytest does not collect it); tests import it.

    with LoopbackServer('openai', latency=0.1) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key='sk-test')
    with LoopbackServer('anthropic') as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key='sk-ant-test')

Manual use: `python tests/loopback.py openai --port 8765 --latency 0.1`.
"""
from __future__ import annotations

import argparse, hashlib, json, math, random, re, socket, socketserver, sys, threading, time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

HOST = '127.0.0.1'
KINDS = ('openai', 'anthropic')
FAULTS = ('429', '500', 'timeout', 'truncated')
OPT_FAULTS = ('401',)          # never drawn by default: only when named in `faults`
ROUTES = {'openai': ('/v1/chat/completions', '/chat/completions'), 'anthropic': ('/v1/messages',)}


@dataclass
class Reply:
    "What the fake model says: text content and/or tool calls as (name, args)."
    content: Optional[str] = None
    tool_calls: list = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- reading requests
def _text(content: Any) -> str:
    "Text of a message content: a string, or a list of text parts/blocks (other block types ignored)."
    if content is None: return ''
    if isinstance(content, str): return content
    if isinstance(content, list):
        return '\n'.join(b.get('text', '') if isinstance(b, dict) else str(b) for b in content
                         if not isinstance(b, dict) or b.get('type') in ('text', 'input_text', None))
    return str(content)

def _system(kind: str, req: dict) -> str:
    if kind == 'anthropic': return _text(req.get('system'))
    return '\n'.join(_text(m.get('content')) for m in req.get('messages', []) if m.get('role') in ('system', 'developer'))

def _user_texts(kind: str, req: dict) -> list[str]:
    "Texts of the user messages (tool results excluded), in order."
    out = []
    for m in req.get('messages', []):
        if m.get('role') != 'user': continue
        c = m.get('content')
        if kind == 'anthropic' and isinstance(c, list) and c and all(
                isinstance(b, dict) and b.get('type') == 'tool_result' for b in c): continue
        t = _text(c)
        if t: out.append(t)
    return out

def _tool_results(kind: str, req: dict) -> list[str]:
    "Texts of the tool results in the conversation, in order."
    out = []
    for m in req.get('messages', []):
        if kind == 'openai' and m.get('role') == 'tool': out.append(_text(m.get('content')))
        if kind == 'anthropic' and m.get('role') == 'user' and isinstance(m.get('content'), list):
            out += [_text(b.get('content')) for b in m['content'] if isinstance(b, dict) and b.get('type') == 'tool_result']
    return out

def _tools(kind: str, req: dict) -> list[tuple[str, dict]]:
    "(name, JSON schema of the parameters) of each declared tool."
    out = []
    for t in req.get('tools') or []:
        if kind == 'openai':
            f = t.get('function') or t
            out.append((f.get('name', ''), f.get('parameters') or {}))
        else: out.append((t.get('name', ''), t.get('input_schema') or {}))
    return out

def question_of(kind: str, req: dict) -> str:
    "The question: the first user message's line starting with `Question:`, else that whole message."
    users = _user_texts(kind, req)
    first = users[0] if users else ''
    for line in first.split('\n'):
        if line.strip().startswith('Question:'): return line.strip()[len('Question:'):].strip()
    return first.strip()

_BLOCK = re.compile(r'^\[(\d+)\]\s*Session date:[ \t]*(.*)$', re.M)

def parse_evidence(text: str) -> list:
    "Evidence blocks `[<n>] Session date: <date>\\n<text...>` (blank-line separated) -> memlab Evidence objects."
    from memlab.core import Evidence
    heads = list(_BLOCK.finditer(text))
    out = []
    for i, h in enumerate(heads):
        body = text[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)].strip()
        n, date = int(h[1]), h[2].strip()
        out.append(Evidence(text=body, session_id=f'e{n}', rank=n - 1,
                            date=None if date.lower() in ('', 'none', 'null', 'unknown') else date))
    return out

def _norm(s: str) -> str: return ' '.join(re.findall(r'[a-z0-9]+', str(s).lower()))

def _contains(gold: str, generated: str) -> bool:
    "Normalized gold (lowercase alphanumeric words) occurs as whole words in the normalized generated answer."
    g = _norm(gold)
    return bool(g) and f' {g} ' in f' {_norm(generated)} '

_A3 = re.compile(r'Gold answer:[ \t]*\n?(.*?)\n[ \t]*\n[ \t]*Generated answer:[ \t]*\n?(.*?)(?:\n[ \t]*\n[ \t]*Return only|\Z)', re.S)
_LME = re.compile(r'Correct Answer:[ \t]*(.*?)\n[ \t]*\n[ \t]*Model Response:[ \t]*(.*?)(?:\n[ \t]*\n[ \t]*Is the model response correct|\Z)', re.S)

_MEMTRACE = re.compile(r'Reference answer:[ \t]*(.*?)\nResponse:[ \t]*(.*?)\n[ \t]*\nDefinitions:', re.S)

_SUBTLE_JUDGE = re.compile(r'Accepted correct answers:\n(.*?)\n\nKnown incorrect answers:\n.*?\n\nGenerated answer:\n(.*?)\n\nFacts:', re.S)
_SUBTLE_CONTEXT = re.compile(r'# CONTEXT\n(.*?)\n\n# INSTRUCTIONS', re.S)

def subtle_answer(prompt: str) -> str:
    "Fake SubtleMemory answer model: memlab's strong offline relation reader over the prompt's context."
    from memlab.core import Evidence
    from memlab.protocols.subtle.answer import relation_answer, evidence_sentences, RELATION_TIERS
    ctx = _SUBTLE_CONTEXT.search(prompt)[1]
    q = prompt.rsplit('Question:', 1)[1].split('\n')[0].strip()
    return relation_answer(q, evidence_sentences([Evidence(text=ctx, session_id='ctx', rank=0)]), RELATION_TIERS['strong'])

_MG_JUDGE = re.compile(r'Gold answer: (.*?)\nPredicted answer: (.*?)\nQuestion:', re.S)
_MG_FACT = re.compile(r'## Grounding Fact\n(.*?)\n\n## Agent.s Answer\n(.*?)\n\n## Question', re.S)
_MG_NOISE = re.compile(r'## Distractor \(INCORRECT information\)\n(.*?)\n\n## Agent.s Answer\n(.*?)\n\n## Question', re.S)

def memgym_reply(prompt: str) -> Optional[str]:
    "Fake MemGym model: the tracks' offline reasoners answer the evicted prompts; the answer, fact and noise judges grade by containment."
    if 'Earlier search results have been removed from your context' in prompt:
        from memlab.protocols.memgym.dr import OfflineDRReasoner
        return OfflineDRReasoner()(prompt.strip())
    if 'Earlier documents have been removed from your context' in prompt or 'You are a software engineer investigating a bug' in prompt:
        from memlab.protocols.memgym.codeqa import OfflineCodeQAReasoner
        return OfflineCodeQAReasoner()(prompt.strip())
    if (m := _MG_JUDGE.search(prompt)): return json.dumps({'score': float(_contains(m[1], m[2])), 'explanation': 'fake'})
    if (m := _MG_FACT.search(prompt)):
        from memlab.memory import terms
        want, got = set(terms(m[1])), set(terms(m[2]))
        return json.dumps({'contains_fact': bool(want) and len(want & got) >= 0.6 * len(want), 'confidence': 1.0, 'explanation': 'fake'})
    if (m := _MG_NOISE.search(prompt)):
        from memlab.memory import terms
        wrong, got = set(terms(m[1])), set(terms(m[2]))
        return json.dumps({'misled': bool(wrong) and len(wrong & got) >= 0.6 * len(wrong), 'confidence': 1.0, 'explanation': 'fake'})
    return None

def judge_reply(prompt: str) -> str:
    "Fake judge: MemGym's prompts, the SubtleMemory judge's JSON, seed-000 A.3 JSON label, LongMemEval yes/no, the MemTrace rubric's JSON, else 'OK'."
    if (r := memgym_reply(prompt)) is not None: return r
    m = _SUBTLE_JUDGE.search(prompt)
    if m:
        ok = any(_contains(a.removeprefix('- '), m[2]) for a in m[1].split('\n'))
        return json.dumps({'reason': 'fake', 'label': 'CORRECT' if ok else 'WRONG'})
    if _SUBTLE_CONTEXT.search(prompt) and prompt.rstrip().endswith('Answer:'): return subtle_answer(prompt)
    m = _MEMTRACE.search(prompt)
    if m:
        ok = any(_contains(g, m[2]) for g in m[1].split(' | '))
        abst = any(w in m[2].lower() for w in ("don't know", 'not mentioned', 'never mentioned', 'not provided'))
        return json.dumps({'gist': int(ok or abst and 'never mentioned' in m[1].lower()),
                           'response_type': 'abstention' if abst else 'correct' if ok else 'hallucination', 'reason': 'fake'})
    m = _A3.search(prompt)
    if m: return json.dumps({'label': 'CORRECT' if _contains(m[1], m[2]) else 'WRONG'})
    m = _LME.search(prompt)
    if m: return 'yes' if _contains(m[1], m[2]) else 'no'
    if prompt.endswith('\n\nAnswer:') and 'Answer Y if' in prompt:   # a Y/N judgment ending in the v2 response prefix
        return ' Y' if yes_probability(prompt) >= 0.5 else ' N'
    return 'OK'

def yes_probability(prompt: str) -> float:
    "The fake model's P(' Y') for a prompt: 0.05 + 0.9 * (the first 8 hex digits of its sha256 / 16**8), deterministic."
    return 0.05 + 0.9 * int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) / 16 ** 8

def _prompt_text(kind: str, req: dict) -> str: return '\n\n'.join([_system(kind, req)] + _user_texts(kind, req))

def openai_logprobs(req: dict, r: Reply) -> Optional[dict]:
    """`choices[0].logprobs` when the request asks `logprobs: true` (else None, as OpenAI): one entry, the reply's first token
    (its first whitespace-led word). Its `top_logprobs` (`top_logprobs` of the request, default 0) are ' Y' with log p and ' N'
    with log(1 - p), p = `yes_probability(prompt)`, then the first token itself with log 0.01 when it is neither."""
    if not req.get('logprobs'): return None
    first = (re.match(r'\s*\S+', r.content or '') or [''])[0] or ' '
    p = yes_probability(_prompt_text('openai', req))
    alts = {' Y': math.log(p), ' N': math.log(1 - p)}
    alts.setdefault(first, math.log(0.01))
    top = [{'token': t, 'logprob': lp, 'bytes': list(t.encode())} for t, lp in sorted(alts.items(), key=lambda x: -x[1])]
    return {'content': [{'token': first, 'logprob': alts[first], 'bytes': list(first.encode()),
                         'top_logprobs': top[:int(req.get('top_logprobs') or 0)]}], 'refusal': None}

def tool_sequence_error(kind: str, messages: list) -> Optional[str]:
    "The error the real API returns for a message list whose tool calls and results do not pair up (None when they do)."
    if kind == 'openai':
        for i, m in enumerate(messages):
            if not isinstance(m, dict): continue
            if m.get('role') == 'tool':
                j = i - 1
                while j >= 0 and messages[j].get('role') == 'tool': j -= 1
                ids = [c.get('id') for c in (messages[j].get('tool_calls') or [])] if j >= 0 and messages[j].get('role') == 'assistant' else []
                if m.get('tool_call_id') not in ids:
                    return f"Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
            if m.get('role') == 'assistant' and m.get('tool_calls'):
                got, j = set(), i + 1
                while j < len(messages) and messages[j].get('role') == 'tool': got.add(messages[j].get('tool_call_id')); j += 1
                missing = [c.get('id') for c in m['tool_calls'] if c.get('id') not in got]
                if missing:
                    return ("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. "
                            f"The following tool_call_ids did not have response messages: {', '.join(missing)}")
        return None
    blocks = lambda m, t: [b for b in (m.get('content') if isinstance(m.get('content'), list) else []) if isinstance(b, dict) and b.get('type') == t]
    for i, m in enumerate(messages):
        if not isinstance(m, dict): continue
        uses = [b.get('id') for b in blocks(messages[i - 1], 'tool_use')] if i > 0 and messages[i - 1].get('role') == 'assistant' else []
        for b in blocks(m, 'tool_result'):
            if m.get('role') != 'user' or b.get('tool_use_id') not in uses:
                return (f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: {b.get('tool_use_id')}. "
                        "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.")
        if m.get('role') == 'assistant' and blocks(m, 'tool_use'):
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            answered = {b.get('tool_use_id') for b in blocks(nxt, 'tool_result')} if nxt and nxt.get('role') == 'user' else set()
            missing = [b.get('id') for b in blocks(m, 'tool_use') if b.get('id') not in answered]
            if missing:
                return (f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {', '.join(missing)}. "
                        "Each `tool_use` block must have a corresponding `tool_result` block in the next message.")
    return None

def default_responder(kind: str, req: dict) -> Reply:
    """Deterministic fake model. With tools and no tool result yet: call the search tool with the question.
    With tool results: answer from the last result's evidence blocks with memlab's strong offline reader.
    Without tools (a judge call): grade the A.3 / LongMemEval prompt by normalized containment, else 'OK'."""
    tools = _tools(kind, req)
    if tools:
        results = _tool_results(kind, req)
        question = question_of(kind, req)
        if not results:
            name, schema = next(((n, s) for n, s in tools if n == 'search_memory'), tools[0])
            props = (schema or {}).get('properties') or {}
            arg = 'query' if 'query' in props or not props else next(
                (k for k, v in props.items() if (v or {}).get('type') == 'string'), next(iter(props)))
            return Reply(tool_calls=[(name, {arg: question})])
        from memlab.reader import believe, read_question, read_units, TIERS
        ev = parse_evidence(results[-1])
        b = believe(read_question(question), read_units(ev), TIERS['strong'])
        return Reply(content=f"Answer: {b.answer if b.answer is not None else 'I don' + chr(39) + 't know'}")
    prompt = '\n\n'.join([_system(kind, req)] + _user_texts(kind, req))
    return Reply(content=judge_reply(prompt))


# ------------------------------------------------------------------------------------------------ wire formats
def _words(s: str) -> int: return len(str(s).split())

def _prompt_tokens(kind: str, req: dict) -> int:
    n = _words(_system(kind, req))
    for m in req.get('messages', []):
        c = m.get('content')
        if isinstance(c, list):
            for b in c:
                if isinstance(b, dict): n += _words(_text(b.get('content')) if b.get('type') == 'tool_result'
                                                    else b.get('text', '') or json.dumps(b.get('input', '')))
        else: n += _words(_text(c))
        for tc in m.get('tool_calls') or []: n += _words((tc.get('function') or {}).get('arguments', ''))
    if req.get('tools'): n += _words(json.dumps(req['tools']))
    return max(n, 1)

def _completion_tokens(r: Reply) -> int:
    return max(1, _words(r.content or '') + sum(_words(json.dumps(a)) + 1 for _, a in r.tool_calls))

def openai_completion(req: dict, r: Reply, rid: str, created: int) -> dict:
    "An OpenAI `chat.completion` object for a reply."
    msg: dict = {'role': 'assistant', 'content': r.content, 'refusal': None, 'annotations': []}
    if r.tool_calls:
        msg['tool_calls'] = [{'id': f'call_{rid}_{i}', 'type': 'function',
                              'function': {'name': n, 'arguments': json.dumps(a)}} for i, (n, a) in enumerate(r.tool_calls)]
    p, c = _prompt_tokens('openai', req), _completion_tokens(r)
    return {'id': f'chatcmpl-{rid}', 'object': 'chat.completion', 'created': created,
            'model': req.get('model') or 'loopback', 'system_fingerprint': 'fp_loopback', 'service_tier': 'default',
            'choices': [{'index': 0, 'message': msg, 'logprobs': openai_logprobs(req, r),
                         'finish_reason': 'tool_calls' if r.tool_calls else 'stop'}],
            'usage': {'prompt_tokens': p, 'completion_tokens': c, 'total_tokens': p + c}}

def anthropic_message(req: dict, r: Reply, rid: str) -> dict:
    "An Anthropic `message` object for a reply."
    content = ([{'type': 'text', 'text': r.content}] if r.content else []) + [
        {'type': 'tool_use', 'id': f'toolu_{rid}_{i}', 'name': n, 'input': a} for i, (n, a) in enumerate(r.tool_calls)]
    return {'id': f'msg_{rid}', 'type': 'message', 'role': 'assistant', 'model': req.get('model') or 'loopback',
            'content': content, 'stop_reason': 'tool_use' if r.tool_calls else 'end_turn', 'stop_sequence': None,
            'usage': {'input_tokens': _prompt_tokens('anthropic', req), 'output_tokens': _completion_tokens(r)}}

def error_body(kind: str, status: int, message: str) -> dict:
    "The provider's JSON error envelope."
    if kind == 'anthropic':
        t = {400: 'invalid_request_error', 401: 'authentication_error', 404: 'not_found_error',
             429: 'rate_limit_error'}.get(status, 'api_error')
        return {'type': 'error', 'error': {'type': t, 'message': message}}
    t, code = {400: ('invalid_request_error', None), 401: ('invalid_request_error', 'invalid_api_key'),
               404: ('invalid_request_error', 'unknown_url'),
               429: ('requests', 'rate_limit_exceeded')}.get(status, ('server_error', None))
    return {'error': {'message': message, 'type': t, 'param': None, 'code': code}}


# ------------------------------------------------------------------------------------------------------ server
class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False        # stop() must not wait for idle keep-alive connections
    request_queue_size = 256      # the default backlog (5) drops SYNs under 64 simultaneous connects
    allow_reuse_address = True

    def server_bind(self):        # skip HTTPServer's getfqdn (a reverse DNS lookup)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):   # client went away (timed out): not an error here
        if not isinstance(sys.exc_info()[1], OSError): super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'      # keep-alive, so the SDKs' connection pools reuse connections
    disable_nagle_algorithm = True     # headers and body go out in separate writes
    max_body = 64 * 2 ** 20
    server_version = 'loopback/1'
    sys_version = ''

    def setup(self):
        self.timeout = self.server.owner.idle_timeout     # bounds how long an idle keep-alive connection lives
        super().setup()
        self.server.owner._track(self.connection, True)

    def finish(self):
        try: super().finish()
        finally: self.server.owner._track(self.connection, False)

    def log_message(self, *args): pass

    def _send(self, status: int, body: bytes, headers: dict = {}, truncate: bool = False):
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        for k, v in headers.items(): self.send_header(k, v)
        self.end_headers()
        if truncate:
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
        else: self.wfile.write(body)

    def do_GET(self):
        self.server.owner._handle(self, None)

    def do_POST(self):
        n = int(self.headers.get('Content-Length') or 0)
        if n > self.max_body: self.close_connection = True; return self._send(413, b'{}')
        self.server.owner._handle(self, self.rfile.read(n) if n else b'')


class LoopbackServer:
    "Loopback OpenAI / Anthropic API server with a fake model and seeded fault injection (see module docstring)."
    def __init__(self, kind: str, # 'openai' | 'anthropic'
                 responder: Optional[Callable[[str, dict], Reply]] = None, # (kind, request json) -> Reply
                 latency: float = 0.0, # seconds slept before answering each request
                 fault_rate: float = 0.0, # fraction of requests that get an injected fault
                 faults=FAULTS, # which faults to draw from
                 retry_after: float = 0.05, # seconds put in Retry-After (and retry-after-ms) on 429
                 hang: float = 3.0, # 'timeout' fault: seconds slept before answering normally
                 seed: int = 0,
                 port: int = 0, # 0: any free port
                 max_faults_per_body: int = 3, # after this many faults for one request body the next attempt passes
                 idle_timeout: float = 30.0, # seconds an idle keep-alive connection is kept open
                 echo_auth: bool = False, # 401 and 500 bodies quote the request's Authorization / x-api-key header
                 strict: bool = True): # reject what strict OpenAI-compatible servers reject (llama-cpp-python: a null message content)
        if kind not in KINDS: raise ValueError(f'kind must be one of {KINDS}, not {kind!r}')
        faults = tuple(faults)
        bad = [f for f in faults if f not in FAULTS + OPT_FAULTS]
        if bad or (fault_rate > 0 and not faults): raise ValueError(f'faults must be a non-empty subset of {FAULTS + OPT_FAULTS}; got {faults}')
        if not 0 <= fault_rate <= 1: raise ValueError('fault_rate must be in [0, 1]')
        self.kind, self.responder = kind, responder or default_responder
        self.latency, self.fault_rate, self.faults = float(latency), float(fault_rate), faults
        self.retry_after, self.hang, self.seed, self.port = float(retry_after), float(hang), seed, port
        self.max_faults_per_body, self.idle_timeout, self.echo_auth, self.strict = max_faults_per_body, idle_timeout, echo_auth, strict
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: set = set()
        self._attempts: dict = {}      # body digest -> (attempts, consecutive faults)
        self._n = 0
        self.in_flight = self.max_in_flight = 0   # requests being handled now; the most at any time
        self.n_faults = {f: 0 for f in FAULTS + tuple(f for f in faults if f in OPT_FAULTS)}
        self.log: list = []            # (path, status) per request
        self.fault_log: list = []      # (path, fault kind or None) per request
        self.requests: list = []       # parsed JSON body per request (None when not JSON)
        self.headers: list = []        # request headers (dict, lower-case names) per request
        self.bodies: list = []         # raw request bodies (bytes) per request
        self._server = self._thread = None

    # -- lifecycle
    def start(self) -> 'LoopbackServer':
        if self._server is not None: return self
        self._stop.clear()
        self._server = _Server((HOST, self.port), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={'poll_interval': 0.05},
                                        name=f'loopback-{self.kind}-{self.port}', daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server is None: return
        self._stop.set()                       # cuts latency / hang sleeps short
        self._server.shutdown(); self._server.server_close()
        with self._lock: conns = list(self._conns)
        for c in conns:                        # ends the handler threads of open keep-alive connections
            try: c.shutdown(socket.SHUT_RDWR)
            except OSError: pass
        self._thread.join(5)
        self._server = self._thread = None

    def __enter__(self): return self.start()
    def __exit__(self, *exc): self.stop()

    @property
    def root(self) -> str: return f'http://{HOST}:{self.port}'
    @property
    def url(self) -> str:
        "The SDK `base_url`: `<root>/v1` for openai, `<root>` for anthropic (its SDK adds `/v1/messages`)."
        return self.root + '/v1' if self.kind == 'openai' else self.root
    @property
    def n_requests(self) -> int:
        with self._lock: return self._n

    def _track(self, conn, add: bool):
        with self._lock: (self._conns.add if add else self._conns.discard)(conn)

    # -- faults
    def _draw_fault(self, body: bytes) -> Optional[str]:
        "Deterministic in (seed, body, attempt number for that body); never more than max_faults_per_body in a row."
        if self.fault_rate <= 0: return None
        key = hashlib.sha256(body).hexdigest()
        with self._lock:
            attempt, streak = self._attempts.get(key, (0, 0))
            rng = random.Random(f'{self.seed}:{key}:{attempt}')
            fault = (self.faults[rng.randrange(len(self.faults))]
                     if rng.random() < self.fault_rate and streak < self.max_faults_per_body else None)
            self._attempts[key] = (attempt + 1, streak + 1 if fault else 0)
            if fault: self.n_faults[fault] += 1
        return fault

    # -- one request
    def _handle(self, h: _Handler, body: Optional[bytes]):
        with self._lock: self.in_flight += 1; self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try: self._respond(h, body)
        finally:
            with self._lock: self.in_flight -= 1

    def _respond(self, h: _Handler, body: Optional[bytes]):
        path = h.path.split('?', 1)[0]
        with self._lock: self._n += 1; n = self._n
        rid = f'{self.seed:x}{n:06x}'
        hdrs = {'x-request-id': f'req_{rid}'} if self.kind == 'openai' else {'request-id': f'req_{rid}'}
        def send(status, obj, extra={}, truncate=False, fault=None):
            with self._lock: self.log.append((path, status)); self.fault_log.append((path, fault))
            h._send(status, json.dumps(obj).encode(), {**hdrs, **extra}, truncate)
        try: req = json.loads(body) if body else None
        except ValueError: req = None
        with self._lock:
            self.requests.append(req); self.headers.append({k.lower(): v for k, v in h.headers.items()}); self.bodies.append(body)
        if body is None or path not in ROUTES[self.kind]:
            return send(404, error_body(self.kind, 404, f'Unknown request URL: {h.command} {path}'))
        if not isinstance(req, dict):
            return send(400, error_body(self.kind, 400, 'request body is not a JSON object'))
        if req.get('stream'):
            return send(400, error_body(self.kind, 400, 'loopback server does not implement streaming'))
        bad = [i for i, m in enumerate(req.get('messages') or []) if isinstance(m, dict) and not isinstance(m.get('content'), (str, list))]
        if self.strict and self.kind == 'openai' and bad:   # llama-cpp-python's server: HTTP 500, pydantic's message
            return send(500, error_body(self.kind, 500, f'messages.{bad[0]}.content: Input should be a valid string'))
        if (err := tool_sequence_error(self.kind, [m for m in req.get('messages') or [] if isinstance(m, dict)])):
            return send(400, error_body(self.kind, 400, err))       # as the real APIs refuse an unpaired tool call or result
        if self.latency > 0: self._stop.wait(self.latency)
        fault = self._draw_fault(body)
        if fault == '429':
            return send(429, error_body(self.kind, 429, 'Rate limit reached (injected by loopback server)'),
                        {'Retry-After': f'{self.retry_after:g}', 'retry-after-ms': f'{self.retry_after * 1000:g}'}, fault=fault)
        auth = h.headers.get('Authorization') or h.headers.get('x-api-key') or ''
        echo = f' (received credentials: {auth})' if self.echo_auth else ''
        if fault == '401':
            return send(401, error_body(self.kind, 401, f'Incorrect API key provided (injected by loopback server){echo}'), fault=fault)
        if fault == '500':
            return send(500, error_body(self.kind, 500, f'The server had an error (injected by loopback server){echo}'), fault=fault)
        if fault == 'timeout': self._stop.wait(self.hang)
        try: reply = self.responder(self.kind, req)
        except Exception as e:     # a responder bug: 400 so SDKs do not retry it, with the reason
            return send(400, error_body(self.kind, 400, f'loopback responder failed: {type(e).__name__}: {e}'))
        if isinstance(reply, str): reply = Reply(content=reply)
        obj = (openai_completion(req, reply, rid, int(time.time())) if self.kind == 'openai'
               else anthropic_message(req, reply, rid))
        send(200, obj, truncate=fault == 'truncated', fault=fault)


def main(argv=None):
    p = argparse.ArgumentParser(description='Loopback OpenAI / Anthropic API server (127.0.0.1 only).')
    p.add_argument('kind', choices=KINDS)
    p.add_argument('--port', type=int, default=8765)
    p.add_argument('--latency', type=float, default=0.0)
    p.add_argument('--fault-rate', type=float, default=0.0)
    p.add_argument('--faults', default=','.join(FAULTS), help='comma-separated subset of ' + ','.join(FAULTS + OPT_FAULTS))
    p.add_argument('--echo-auth', action='store_true', help="401/500 bodies quote the request's credentials")
    p.add_argument('--retry-after', type=float, default=0.05)
    p.add_argument('--hang', type=float, default=3.0)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--duration', type=float, default=3600.0, help='stop after this many seconds')
    a = p.parse_args(argv)
    srv = LoopbackServer(a.kind, latency=a.latency, fault_rate=a.fault_rate, faults=[f for f in a.faults.split(',') if f],
                         retry_after=a.retry_after, hang=a.hang, seed=a.seed, port=a.port,
                         echo_auth=a.echo_auth)
    with srv:
        print(f'{a.kind} loopback server at base_url={srv.url} (stops after {a.duration:g}s; Ctrl-C to stop)', flush=True)
        try: srv._stop.wait(a.duration)
        except KeyboardInterrupt: pass
        print(f'{srv.n_requests} requests, faults {srv.n_faults}', flush=True)

if __name__ == '__main__': main()
