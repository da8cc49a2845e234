"""A released-size SubtleMemory persona through five memories x three settings, offline (issue 14, item 7): prints figures
(this is not a timed test).

    .venv/bin/python tests/benchmarks/bench_subtle_settings.py [--unrelated 126] [--turns 68] [--sets 5] [--embedder hash-embed]

One synthetic persona at the release's size (236 sessions, about 210K tokens, 165 queries; the release: 236 sessions,
212K tokens, 150 queries), the section's five memories (top-k 20), the strong offline reader, the offline judge. Printed:
the wall time of each run (oracle; perfect + default), the seconds spent ingesting (per memory: the unit that built it,
and the snapshot the second setting got), answering (the rollouts' policy and memory time) and judging, and the
sessions each memory ingested: ingestion happens once per memory and persona, never once per setting.
"""
import argparse, collections, json, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--unrelated', type=int, default=126); ap.add_argument('--turns', type=int, default=68)
    ap.add_argument('--sets', type=int, default=5); ap.add_argument('--embedder', default='hash-embed')
    ap.add_argument('--tier', default='strong')
    a = ap.parse_args()
    import pandas as pd
    from memlab.memory import Memory
    from memlab.runner import run, score, build_judge
    from memlab.protocols.subtle.protocol import subtlememory_dataset, run_configs, query_frame, check_params, SUBTLE_PARAMS
    ingested = collections.Counter()
    orig = Memory.add_all
    def counting(self, sessions):                      # every memory's ingestion goes through Memory.add_all or its override
        sessions = list(sessions); ingested[self.name] += len(sessions); return orig(self, sessions)
    Memory.add_all = counting
    import memlab.flat
    memlab.flat.FlatMemory.add_all, flat_add = (lambda self, s: (ingested.__setitem__(self.name, ingested[self.name] + len(list(s))),
                                                                 flat_add(self, s))[1]), memlab.flat.FlatMemory.add_all
    t0 = time.perf_counter()
    insts = subtlememory_dataset(n_personas=1, n_unrelated=a.unrelated, turns=a.turns, n_sets=a.sets)
    p = insts[0]
    print(f'persona: {len(p.sessions)} sessions, {sum(s.n_tokens for s in p.sessions):,} tokens, {len(p.queries)} queries '
          f'(generated and loaded in {time.perf_counter() - t0:.1f} s)')
    P = check_params(**{**SUBTLE_PARAMS, 'embedder': a.embedder})
    spec = dict(kind='subtlememory', n_personas=1, n_unrelated=a.unrelated, turns=a.turns, n_sets=a.sets)
    cfgs = run_configs(spec, [{'name': 'subtlememory-reader', 'tier': a.tier}], P.memory_specs(), ['oracle', 'perfect', 'default'],
                       {'name': 'subtlememory-offline'})
    j, tmp, frames, rows = build_judge({'name': 'subtlememory-offline'}), Path(tempfile.mkdtemp()), [], []
    wall = time.perf_counter()
    for key, c in cfgs.items():
        t = time.perf_counter(); st = run(c, insts, tmp / key, progress=False); t_run = time.perf_counter() - t
        t = time.perf_counter(); score(st, insts, judge_obj=j); t_judge = time.perf_counter() - t
        frames.append(query_frame(st, j, insts))
        ro = st.rollouts(columns=['memory', 'condition', 'timings'])
        tm = ro.join(pd.json_normalize(ro['timings'].map(lambda x: json.loads(x) if isinstance(x, str) else x).tolist()))
        units = tm.groupby(['memory', 'condition'])['ingest_s'].first()
        rows.append(dict(run=key, rollouts=len(tm), run_s=t_run, ingest_s=units.sum(), answer_s=tm['policy_s'].sum() + tm['memory_s'].sum(),
                         judge_s=t_judge))
        if key == 'memory':
            print('ingestion per memory and setting (s):'); print(units.unstack().round(3).to_string())
    wall = time.perf_counter() - wall
    r = pd.DataFrame(rows); print(r.round(2).to_string(index=False))
    ing, ans = r['ingest_s'].sum(), r['answer_s'].sum()
    print(f'wall {wall:.1f} s for {int(r["rollouts"].sum())} rollouts; ingestion {ing:.1f} s ({ing / wall:.0%}), answering {ans:.1f} s '
          f'({ans / wall:.0%}), judging {r["judge_s"].sum():.1f} s ({r["judge_s"].sum() / wall:.0%})')
    print('sessions ingested per memory:', dict(ingested), f'(the persona has {len(p.sessions)}: once per memory, not once per setting)')
    fr = pd.concat(frames, ignore_index=True)
    print(fr.pivot_table(index='memory', columns='setting', values='correct', aggfunc='mean').round(3).to_string())


if __name__ == '__main__':
    main()
