"""Command line: list scenarios, write a trace bundle, print a scenario's labels.

python -m gpufleet.sim list
python -m gpufleet.sim bundle demo out/demo --duration 3600 [--seed 7] [--epoch]
python -m gpufleet.sim labels straggler_power_cap [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import sys

from gpufleet.sim.bundle import write_bundle
from gpufleet.sim.fleet import Fleet
from gpufleet.sim.scenario import ScenarioError, load_scenario, scenario_names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpufleet.sim", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="shipped scenarios and what they contain")
    b = sub.add_parser("bundle", help="simulate a scenario and write a trace bundle with labels.json")
    b.add_argument("scenario", help="shipped name or path to a YAML file")
    b.add_argument("out_dir")
    b.add_argument("--duration", type=float, default=None, help="seconds (default: the whole scenario)")
    b.add_argument("--seed", type=int, default=None)
    b.add_argument("--start", type=float, default=None, help="start time, epoch seconds")
    b.add_argument("--interval", type=float, default=None, help="sampling interval, s (0.1-30)")
    b.add_argument("--epoch", action="store_true", help="write times as epoch seconds, not RFC 3339")
    b.add_argument("--overwrite", action="store_true")
    lab = sub.add_parser("labels", help="print the ground truth of a scenario as JSON")
    lab.add_argument("scenario")
    lab.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            for name in scenario_names():
                desc = " ".join(load_scenario(name).description.split())
                print(f"{name}: {desc}")
        elif args.cmd == "bundle":
            info = write_bundle(
                args.scenario,
                args.out_dir,
                args.duration,
                seed=args.seed,
                start_time=args.start,
                sample_interval_s=args.interval,
                time_format="epoch" if args.epoch else "rfc3339",
                overwrite=args.overwrite,
            )
            print(
                f"{info.path}: {info.gpu_rows} GPU rows, {info.host_rows} host rows, "
                f"{len(info.labels.incidents)} labelled incidents"
            )
        else:
            print(json.dumps(Fleet.from_scenario(args.scenario, seed=args.seed).labels().to_dict(), indent=1))
    except (ScenarioError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
