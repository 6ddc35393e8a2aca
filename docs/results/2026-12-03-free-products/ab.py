import statistics, time, torch, json
torch.set_num_threads(1)
from cloud.engine import TargetEngine, ForwardItem
from cloud.models import resolve_target
from cloud.invariance.free_products import PRIOR
from cloud.invariance.products import PackedLinear
e = TargetEngine(resolve_target(None), shapes="free")
packed = [m for m in e.model.modules() if isinstance(m, PackedLinear)]
measured = e.free_products
print(measured.describe())
seq = e.new_sequence(); e.forward(seq, list(range(100, 400)), last_only=True)
out = {}
for rows in (1, 2, 3, 4, 9, 16):
    t = {"prior": [], "measured": []}
    for rep in range(7):
        for name, choice in (("prior", PRIOR), ("measured", measured)):
            for m in packed: m.free = choice
            s = time.perf_counter()
            e.forward_batch([ForwardItem(seq, [500 + i for i in range(rows)])])
            t[name].append(1e3 * (time.perf_counter() - s))
            e.crop(seq, 300)
    out[rows] = {k: round(statistics.median(v), 1) for k, v in t.items()}
    print(rows, out[rows], flush=True)
json.dump({"cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip(), "threads": 1,
           "choice": measured.describe(), "ms_median_of_7": out}, open("/tmp/ab.json", "w"), indent=1)
