"""The Python parts of runners/gpu_check.sh: the environment probe and the final report.

    python -m runners.gpu_check_report env WORK_DIR
    python -m runners.gpu_check_report summary WORK_DIR OUT_DIR --tests-rc N [--flashinfer-rc N] --seconds S

``env`` writes WORK_DIR/env.json (Python, torch, CUDA, device, whether flashinfer imports)
and prints 1 or 0 (flashinfer usable). ``summary`` gathers the step outputs left in
WORK_DIR (gpu.txt, decode*.json, policies.json, flashinfer_jit.rc) into one
OUT_DIR/gpu_check.json and prints the headline figures.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
from pathlib import Path


def probe_env() -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "flashinfer": importlib.util.find_spec("flashinfer") is not None}
    if env["flashinfer"]:
        try:
            import flashinfer

            env["flashinfer_version"] = flashinfer.__version__
        except Exception as exc:  # present but broken: recorded, and the FlashInfer steps skip
            env["flashinfer_error"] = f"{type(exc).__name__}: {exc}"
            env["flashinfer"] = False
    return env


def summarize(work: Path, tests_rc: int, flashinfer_rc: int | None, seconds: int) -> dict:
    def load(name):
        path = work / name
        return json.loads(path.read_text()) if path.is_file() else None

    def text(name):
        path = work / name
        return path.read_text().strip() if path.is_file() else None

    fig = {"env": load("env.json"), "gpu": text("gpu.txt"), "seconds": seconds, "tests_rc": tests_rc,
           "tests_flashinfer_rc": flashinfer_rc, "flashinfer_jit_rc": text("flashinfer_jit.rc"),
           "policies": load("policies.json"), "policies_nocache": load("policies_nocache.json")}
    for name in ("decode", "decode_flashinfer"):
        dec = fig[name] = load(f"{name}.json")
        if dec:
            fig[f"{name}_roofline_fraction"] = {str(r["batch"]): r["fraction"] for r in dec["rows"]}
    return fig


def headline(fig: dict) -> list[str]:
    frac = fig.get("decode_roofline_fraction") or {}
    fmt = lambda x: "-" if x is None else f"{x:.3f}"
    lines = [f"tests rc {fig['tests_rc']}, flashinfer tests rc {fig['tests_flashinfer_rc']}, "
             f"flashinfer build rc {fig['flashinfer_jit_rc']}; {fig['seconds']} s",
             f"decode fraction of the HBM roofline (torch attention): batch 64 {fmt(frac.get('64'))}, "
             f"batch 256 {fmt(frac.get('256'))}"]
    fi = fig.get("decode_flashinfer_roofline_fraction")
    if fi:
        lines.append(f"decode fraction of the HBM roofline (FlashInfer): batch 64 {fmt(fi.get('64'))}, "
                     f"batch 256 {fmt(fi.get('256'))}")
    for key, what in (("policies", "PRM cache on"), ("policies_nocache", "PRM cache off")):
        rows = fig.get(key) or []
        if rows:
            lines.append(f"policies, {what}:")
        for r in rows:
            ratio, mk = r.get("ratio_to_nonspec"), r.get("makespan_ratio")
            lines.append(f"  {r['policy']:<8} {r.get('output_tok_s', float('nan')):>9.1f} output tok/s, x nonspec "
                         f"{'-' if ratio is None else f'{ratio:.2f}'}, makespan x {'-' if mk is None else f'{mk:.2f}'}, "
                         f"PRM tok/logical {r.get('prm_tokens_per_logical_token', float('nan')):.2f}")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env")
    e.add_argument("work", type=Path)
    s = sub.add_parser("summary")
    s.add_argument("work", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--tests-rc", type=int, required=True)
    s.add_argument("--flashinfer-rc", type=int, default=None)
    s.add_argument("--seconds", type=int, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "env":
        env = probe_env()
        (args.work / "env.json").write_text(json.dumps(env, indent=1))
        print(int(env["flashinfer"]))
        return
    fig = summarize(args.work, args.tests_rc, args.flashinfer_rc, args.seconds)
    (args.out / "gpu_check.json").write_text(json.dumps(fig, indent=1))
    print("== summary (" + str(args.out / "gpu_check.json") + ")")
    print("\n".join(headline(fig)))


if __name__ == "__main__":
    main()
