"""What the other core's work costs the cloud's forwards on this machine.

Usage (from the repository root, the venv's python):
    python docs/results/2026-12-07-colocation-zen5-epyc/neighbour_load.py [REPEATS]

Loads the default target as the cloud does (``--shapes auto``), pinned to the cloud's core of
``core_split``, one torch thread; prefills 225 tokens, then times 40 one-row decode forwards (the
median) while the edge's core is, in turn: idle; running the q2_k drafter flat out with llama.cpp (one
thread, n_ctx 4096, greedy, as the edge drafts); copying two 512 MiB arrays back and forth (memory
traffic only); spinning a Python loop (no memory traffic). REPEATS rounds (default 4) in that order.
"""
import os
import statistics
import subprocess
import sys
import time

from sim.experiment.processes import core_split

EDGE, CLOUD = core_split()
os.sched_setaffinity(0, CLOUD)
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402  (after the thread count is set)

from cloud.engine import TargetEngine  # noqa: E402
from cloud.models import resolve_target  # noqa: E402
from sim.fixtures.drafter_ladder import drafter_rung  # noqa: E402

torch.set_num_threads(1)
NEIGHBOURS = {
    "idle": None,
    "drafter": """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=4096, n_threads=1, n_threads_batch=1, verbose=False)
p = llm.tokenize(b"Write a short story about a lighthouse keeper.")
while True:
    llm.reset(); llm.eval(p); tok = p[-1]
    for i in range(300):
        llm.eval([tok]); tok = int(llm.scores[llm.n_tokens - 1].argmax())
""",
    "memory": "import numpy as np\na = np.ones(64 << 20); b = np.empty_like(a)\nwhile True: np.copyto(b, a)",
    "spin": "x = 0\nwhile True: x += 1",
}


def one_row_ms(engine: TargetEngine, forwards: int = 40) -> float:
    seq = engine.new_sequence()
    engine.forward(seq, list(range(100, 325)), last_only=True)
    times = []
    for i in range(forwards):
        started = time.perf_counter()
        engine.forward(seq, [1000 + i])
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    engine = TargetEngine(resolve_target(None), shapes="auto")
    one_row_ms(engine, 10)  # warm
    results: dict[str, list[float]] = {name: [] for name in NEIGHBOURS}
    for _ in range(repeats):
        for name, code in NEIGHBOURS.items():
            neighbour = None
            if code:
                neighbour = subprocess.Popen([sys.executable, "-c", code, drafter_rung("q2_k").path],
                                             preexec_fn=lambda: os.sched_setaffinity(0, EDGE))
                time.sleep(4)  # (loaded, running)
            try:
                results[name].append(one_row_ms(engine))
            finally:
                if neighbour:
                    neighbour.kill()
                    neighbour.wait()
            print(f"{name:8s} one-row forward {results[name][-1]:.1f} ms", flush=True)
    idle = statistics.median(results["idle"])
    for name, times in results.items():
        print(f"{name:8s} median {statistics.median(times):5.1f} ms ({min(times):.1f}-{max(times):.1f}), "
              f"{statistics.median(times) / idle:.2f} of idle")


if __name__ == "__main__":
    main()
