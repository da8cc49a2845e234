"""Write a LongMemEval_M-sized file in the layout of `longmemeval_m_cleaned.json` (issue 29): a JSON array of records
with question_id, question_type, question, answer, question_date, haystack_dates, haystack_session_ids,
haystack_sessions (lists of {role, content, has_answer?}) and answer_session_ids (shared/docs/datasets.md §1.2).

As in the real _m file, filler sessions are drawn from one shared pool, so the same session id carries the same
content in every record that draws it; each record adds its own `answer_...` evidence sessions (user turns carry
`has_answer`). Deterministic for a seed; the output is streamed (one record at a time; only the pool's serialized
sessions are held). Defaults: 500 records x 500 sessions of about 3,000 `memlab.core.count_tokens` tokens each
(about 1.5M tokens per record). Write to /tmp or build/ only; never commit the file.

    .venv/bin/python tests/benchmarks/make_longmemeval_m.py --out /tmp/lme_m/longmemeval_m_cleaned.json
"""
from __future__ import annotations
import argparse, datetime as dt, hashlib, json, os, random, sys, time
from pathlib import Path

TYPES = ('single-session-user', 'single-session-assistant', 'single-session-preference', 'temporal-reasoning',
         'knowledge-update', 'multi-session')
FMT = '%Y/%m/%d (%a) %H:%M'
_SYL = ('ka', 'lo', 'mi', 'ne', 'ru', 'sa', 'ti', 'vo', 'ze', 'po', 'da', 'fi', 'gu', 'he', 'jo', 'ba', 'co', 'wy')
_EXTRA = ('café', 'naïve', 'Zürich', '東京', 'données', '😀', 'jalapeño', 'Ελλάδα', '"quoted"', 'back\\slash', 'tab\there')


def _vocab(rng: random.Random, n: int=300) -> list[str]:
    words = {''.join(rng.choice(_SYL) for _ in range(rng.randint(1, 2))) for _ in range(n * 2)}
    return sorted(words)[:n]


def _text(rng: random.Random, vocab: list, n_tokens: int) -> str:
    "About `n_tokens` count_tokens tokens: words, with a punctuation mark closing each clause of 3-7 words (about 3.5 bytes a token, as the real _m file); one text in 20 holds a non-ASCII or escaped word."
    out, left = [], n_tokens
    while left > 1:
        k = min(left - 1, rng.randint(3, 7))
        out.append(' '.join(rng.choices(vocab, k=k)) + rng.choice('.?!,;'))
        left -= k + 1
    if out and rng.random() < 0.05: out.insert(rng.randrange(len(out)), rng.choice(_EXTRA))
    return ' '.join(out)


def _turns(rng: random.Random, vocab: list, tokens: int, evidence: bool=False) -> list[dict]:
    n = rng.randint(6, 14) & ~1                                   # an even number of turns, user first
    per = max(2, tokens // n)
    out = []
    for k in range(n):
        t = {'role': 'user' if k % 2 == 0 else 'assistant', 'content': _text(rng, vocab, rng.randint(per // 2, per * 3 // 2))}
        if evidence and k % 2 == 0: t['has_answer'] = k == 2 or (k == 0 and n == 2)
        out.append(t)
    return out


def _pool_id(seed: int, i: int) -> str:
    h = hashlib.sha256(f'{seed}:{i}'.encode()).hexdigest()
    kind = i % 3
    return f'sharegpt_{h[:7]}{i}_{i % 4}' if kind == 0 else f'ultrachat_{i}' if kind == 1 else f'{h[:8]}{i:x}_{i % 5 + 1}'   # unique by i


def make(out: Path, records: int=500, sessions: int=500, pool: int=25_000, session_tokens: int=3000, seed: int=0) -> dict:
    "Write the file; returns its size in bytes, the seconds taken and the pool size."
    t0 = time.perf_counter()
    rng = random.Random(seed)
    vocab = _vocab(rng)
    ids = [_pool_id(seed, i) for i in range(pool)]
    assert len(set(ids)) == pool, 'pool ids collide: change the seed'
    cache: dict[int, str] = {}                                   # pool index -> serialized turns (json text)
    def pool_session(i: int) -> str:
        if i not in cache: cache[i] = json.dumps(_turns(random.Random(f'{seed}/pool/{i}'), vocab, session_tokens), ensure_ascii=False)
        return cache[i]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + '.part')
    with open(tmp, 'w', encoding='utf-8') as f:
        f.write('[')
        for r in range(records):
            rr = random.Random(f'{seed}/record/{r}')
            qtype = TYPES[r % len(TYPES)]
            qid = f'{hashlib.sha256(f"{seed}/q/{r}".encode()).hexdigest()[:8]}' + ('_abs' if r % 17 == 5 else '')
            n_ev = 1 if qtype.startswith('single') else rr.randint(2, 3)
            picks = rr.sample(range(pool), sessions - n_ev)
            slots = sorted(rr.sample(range(sessions), n_ev))
            start = dt.datetime(2023, 1, 1) + dt.timedelta(days=rr.randint(0, 300))
            when = sorted(start + dt.timedelta(minutes=rr.randint(0, 60 * 24 * 120)) for _ in range(sessions))
            sids, bodies, it = [], [], iter(picks)
            for j in range(sessions):
                if j in slots:
                    k = slots.index(j)
                    sids.append(f'answer_{qid.removesuffix("_abs")}_{k + 1}' if n_ev > 1 else f'answer_{qid.removesuffix("_abs")}')
                    bodies.append(json.dumps(_turns(rr, vocab, session_tokens, evidence=True), ensure_ascii=False))
                else:
                    i = next(it); sids.append(ids[i]); bodies.append(pool_session(i))
            head = {'question_id': qid, 'question_type': qtype,
                    'question': _text(rr, vocab, 12).rstrip('.?!,;') + '?',
                    'answer': _text(rr, vocab, rr.randint(2, 8)) if r % 13 else rr.randint(1, 99),   # the released column mixes str and int
                    'question_date': (when[-1] + dt.timedelta(days=rr.randint(1, 30))).strftime(FMT),
                    'haystack_dates': [w.strftime(FMT) for w in when], 'haystack_session_ids': sids}
            f.write((',\n' if r else '\n') + json.dumps(head, ensure_ascii=False)[:-1])
            f.write(', "haystack_sessions": [' + ', '.join(bodies) + ']')
            f.write(', "answer_session_ids": ' + json.dumps([s for s in sids if 'answer' in s]) + '}')
        f.write('\n]\n')
    os.replace(tmp, out)
    return {'bytes': out.stat().st_size, 'seconds': time.perf_counter() - t0, 'pool_sessions_used': len(cache)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--records', type=int, default=500)
    ap.add_argument('--sessions', type=int, default=500, help='haystack sessions per record')
    ap.add_argument('--pool', type=int, default=25_000, help='shared filler sessions to draw from')
    ap.add_argument('--session-tokens', type=int, default=3000, help='count_tokens tokens per session (about)')
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--out', type=Path, default=Path('/tmp/lme_m/longmemeval_m_cleaned.json'))
    a = ap.parse_args(argv)
    if a.sessions > a.pool: ap.error('--sessions must not exceed --pool')
    r = make(a.out, a.records, a.sessions, a.pool, a.session_tokens, a.seed)
    print(f"{a.out}: {r['bytes']:,} bytes ({r['bytes'] / 2**30:.2f} GiB), {a.records} records x {a.sessions} sessions, "
          f"{r['pool_sessions_used']:,} pool sessions used, {r['seconds']:.1f} s")


if __name__ == '__main__': main()
