"""`suite uaq apply|undo --s S IN_DIR OUT_DIR`: UAQ on a Hugging Face safetensors checkpoint."""

from __future__ import annotations

import argparse
import sys


def cmd_uaq(args: argparse.Namespace) -> int:
    from suite.verl.hf_uaq import UAQError, transform

    try:
        transform(args.in_dir, args.out_dir, args.s, undo=args.op == "undo", verify_layers=args.verify_layers)
    except (UAQError, ValueError) as exc:
        print(f"suite uaq: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("uaq", help="UAQ invariant scaling of a Hugging Face checkpoint (apply / undo)")
    p.add_argument("op", choices=("apply", "undo"))
    p.add_argument("--s", type=float, required=True, help="UAQ scale (paper default 1.5)")
    p.add_argument("--verify-layers", type=int, default=2, help="blocks run in the invariance check after apply")
    p.add_argument("in_dir", help="input model directory (never modified)")
    p.add_argument("out_dir", help="new directory (absent or empty)")
    p.set_defaults(func=cmd_uaq)
