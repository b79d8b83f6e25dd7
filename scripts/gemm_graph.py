"""A graph file for `strata run`: C = A·B for N×N F32 matrices in T×T tiles
(one `matmul`, then `matmul_acc` along k, per tile of C), with A = 0.5 and
B = 0.25 everywhere, so every element of C is N/8 (checked by the run).

    python3 scripts/gemm_graph.py N T OUT.json
    strata run --local 4 OUT.json            # and --no-device-cache to compare
"""

import json
import sys

if len(sys.argv) != 4 or int(sys.argv[1]) % int(sys.argv[2]) != 0:
    sys.exit(__doc__)
n, t, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
k = n // t
bufs = {"a": {"shape": [n, n], "dtype": "f32", "init": {"const": 0.5}},
        "b": {"shape": [n, n], "dtype": "f32", "init": {"const": 0.25}},
        "c": {"shape": [n, n], "dtype": "f32"}}
views = {}
for m in "abc":
    for i in range(k):
        for j in range(k):
            views[f"{m}{i}_{j}"] = {"buffer": m, "shape": [t, t], "strides": [n, 1], "offset": i * t * n + j * t}
tasks = []
for i in range(k):
    for j in range(k):
        for l in range(k):
            if l == 0:
                tasks.append({"callable": "matmul", "args": [{"view": f"a{i}_{l}", "tag": "input"}, {"view": f"b{l}_{j}", "tag": "input"}, {"view": f"c{i}_{j}", "tag": "output"}]})
            else:
                tasks.append({"callable": "matmul_acc", "args": [{"view": f"a{i}_{l}", "tag": "input"}, {"view": f"b{l}_{j}", "tag": "input"}, {"view": f"c{i}_{j}", "tag": "inout"}]})
graph = {
    "comment": f"C = A·B for {n}x{n} F32 in {t}x{t} tiles; every element of C is {n * 0.125}",
    "buffers": bufs,
    "views": views,
    "tasks": tasks,
    "outputs": [{"view": "c", "npy": f"gemm{n}_c.npy", "expect": {"const": n * 0.125}}],
}
with open(out, "w") as f:
    json.dump(graph, f)
