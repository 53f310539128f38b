"""`iattn lab copy|average|subspace|single-head|multi-head|all`."""

from __future__ import annotations

import json
import time
from pathlib import Path

from iattention import lab
from iattention.cli.args import check_out_folder, int_at_least, out_path
from iattention.lab.common import to_jsonable
from iattention.utils.atomic import write_json
from iattention.utils.outputs import claim_outputs, starts_with

EXPERIMENTS = ("copy", "subspace", "average", "single-head", "multi-head")


def _summary(name, r) -> str:
    if name == "copy":
        return (f"copy: max |alpha_j measured - 1/(1+sum e^-Delta)| = {r.max_abs_alpha_error:.2e}; "
                f"||c - v_j|| <= (1-alpha_j) max||v_i - v_j|| holds: {r.bound_holds}")
    if name == "subspace":
        i = len(r.angles) // 2
        return (f"subspace: orthogonal error {r.orthogonal_error:.2e}; tilted by {r.angles[i]*57.2958:.0f} deg: "
                f"{r.tilted_error[i]:.3f} (predicted {r.tilted_predicted[i]:.3f})")
    if name == "average":
        return (f"average: max |alpha_a - e^b/(2e^b+n-2)| = {r.max_abs_alpha_error:.2e}; ||c - m|| at beta="
                f"{r.betas[-1]}: {r.error[-1]:.2e} (exact {r.error_exact[-1]:.2e}, bound {r.bound[-1]:.2e})")
    if name == "single-head":
        s = r.stats
        return (f"single-head: Var(c) {s.var_all:.4f} (predicted {r.predicted_var:.4f}); given k_a^T q > 0 "
                f"({s.frac_pos:.1%} of samples): {s.var_pos:.4f}")
    d = r.default
    return (f"multi-head: Var(c) single {d.single.var_all:.4f}, two heads {d.multi.var_all:.4f} (all samples, "
            f"{d.reduction_all:.1f}x less), {d.multi.var_pos:.4f} given k_a^T q1 > 0 ({d.reduction_pos:.1f}x less "
            f"than single head given k_a^T q > 0); two identical heads: ratio {d.identical_ratio:.3f}")


def run_lab(which: str, out: str | None, seed: int = 0) -> dict:
    from iattention.lab import plots  # lazy: matplotlib, only when a figure is drawn

    runners = {
        "copy": (lambda: lab.run_copy(seed=seed), plots.plot_copy),
        "subspace": (lambda: lab.run_subspace(seed=seed), plots.plot_subspace),
        "average": (lambda: lab.run_average(seed=seed), plots.plot_average),
        "single-head": (lambda: lab.run_single_head(lab.VarianceSetting(seed=seed)), plots.plot_single_head),
        "multi-head": (lambda: lab.run_multi_head_sweep(lab.VarianceSetting(seed=seed)), plots.plot_multi_head),
    }
    results = {}
    names = EXPERIMENTS if which == "all" else (which,)
    if out:  # an older lab's folder (docs/lab: no list of what it wrote): NAME.png and NAME.json are ours where
        # NAME.json is a lab record
        claim_outputs(out, [f"{n}.{ext}" for n in names for ext in ("png", "json")],
                      lambda path: starts_with(path.with_suffix(".json"), b'{\n  "experiment": "'))
    for name in names:
        t0 = time.time()
        run, plot = runners[name]
        r = run()
        rec = {"experiment": name, "summary": _summary(name, r), "seconds": round(time.time() - t0, 2),
               "result": to_jsonable(r)}
        if out:
            folder = Path(out)
            rec["figure"] = str(plot(r, folder / f"{name}.png"))
            write_json(folder / f"{name}.json", rec)
        results[name] = rec
    return results


def cmd_lab(args) -> None:
    if args.out:
        check_out_folder(args.out)
    results = run_lab(args.experiment, args.out, args.seed)
    if args.json:
        print(json.dumps({k: {kk: v[kk] for kk in ("summary", "seconds", "figure") if kk in v}
                          | {"result": v["result"]} for k, v in results.items()}))
        return
    for rec in results.values():
        print(rec["summary"] + (f"  [{rec['figure']}]" if "figure" in rec else ""))


def register(sub) -> None:
    p = sub.add_parser("lab", help="attention mechanics experiments: prediction vs measurement",
                       description="Closed-form predictions vs measurements for single-query softmax attention: "
                                   "copy, subspace, average, single-head (variance), multi-head (variance "
                                   "reduction). See docs/lab.md.")
    p.add_argument("experiment", choices=(*EXPERIMENTS, "all"))
    p.add_argument("--out", type=out_path, help="folder for figures (PNG) and JSON records")
    p.add_argument("--json", action="store_true", help="print the full records as JSON")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.set_defaults(func=cmd_lab)
