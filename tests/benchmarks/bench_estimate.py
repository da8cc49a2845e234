"""How long `estimate` takes before a run: an offline config (no model: nothing to simulate) against the same grid with
a model policy (the offline reader is replayed through every memory to count calls and tokens). Prints seconds and the
ratio. Usage: python tests/benchmarks/bench_estimate.py [n_instances]"""
import sys, time
from memlab.runner import RunConfig, estimate, load_dataset

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
data = {'kind': 'synthetic', 'params': {'n_instances': n, 'queries_per_instance': 10, 'n_filler': 60, 'seed': 0}}
mems = [{'name': 'bm25', 'k': 12}, {'name': 'long-context', 'window_tokens': 4000}]
offline = RunConfig(name='b', dataset=data, policies=[{'name': 'offline-reader', 'tier': 'strong'}], memories=mems)
model = RunConfig(name='b', dataset=data, memories=mems, judge={'name': 'llm-a3', 'backend': {'name': 'openai', 'model': 'gpt-4o-mini'}},
                  policies=[{'name': 'llm', 'backend': {'name': 'openai', 'model': 'gpt-4o-mini'}}])
insts = load_dataset(data)
print(f'{n} histories, {sum(len(i.queries) for i in insts)} questions, {len(mems)} memories')
for name, cfg in (('offline policies', offline), ('model policy + model judge', model)):
    t = time.perf_counter(); e = estimate(cfg, insts); s = time.perf_counter() - t
    print(f'{name:>28}: {s:6.2f} s  ({int(e["model_calls"].sum())} model calls, ${e["cost_usd"].sum():.2f})')
    if name.startswith('offline'): base = s
print(f'ratio (model / offline): {s / base:.0f}x')
